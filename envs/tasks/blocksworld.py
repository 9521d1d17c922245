"""Blocksworld planning: move blocks one at a time from an initial arrangement to a goal arrangement.

5–6 blocks (letters), stacks on an unlimited table. A move takes a *clear* block (nothing on it) and
puts it on the table or on another clear block. Instances are drawn with a given optimal plan length
(breadth-first search, :func:`bfs_plan`): difficulty 1 = 5–6 blocks, 1 move; 2 = 5–6 blocks, 2 moves;
3 = 5–6 blocks, 3–4 moves (calibrated to SmolLM2: docs/protocol.md; with fewer blocks there are too
few distinct instances once renamed copies count as one). Kinds by optimal length: ``"one_move"``,
``"short"`` (2–3), ``"long"`` (4+); hidden from tools and conductors. No instance starts at its goal
(an empty plan would make any text correct).

Plan syntax (parsed leniently, case-insensitive, one or more moves per line)::

    move A from B to table        # canonical form; "to"/"onto"/"on", "the", "block" allowed
    move A to C                   # "from" may be omitted
    put A on the table            # put/place/stack X on/onto Y
    move(A, B, table)  /  A -> C  # function or arrow style

If the text has a fenced code block, only the last one is read; otherwise, if it has a ``Plan:``
line, only what follows it; otherwise the whole text. Every recognised move counts, in order.

Verifier: score 1 iff at least one move was found, every move is legal (a stated ``from`` must be
right) and the final arrangement equals the goal; else 0, with the first illegal step or the unmet
goal in the reason. The one tool, ``plan_validator``, simulates the candidate plan a worker wrote (the latest non-tool
message with a move in it) from the initial state stated in the prompt, and reports the first illegal
step or what the goal still lacks. It never plans: with an empty transcript it has nothing to check, so
a tool-only conductor solves nothing. A simulator is exact, so its PASS is the verifier's verdict; what
the team needs from the LLM is a plan worth simulating.
"""

from __future__ import annotations

import itertools
import random
import re
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from envs.tasks.base import Split, Task, ToolFn, ToolResult, Verdict
from envs.tasks.common import Draw, latest_candidate, sample_distinct, tool_result

TABLE = "table"
LETTERS = "ABCDEFGH"
State = tuple[tuple[str, ...], ...]  # stacks, bottom to top, sorted (canonical)
Move = tuple[str, str | None, str]  # (block, from or None, to)
# level -> (block counts, min optimal moves, max optimal moves)
LEVELS: dict[int, tuple[tuple[int, ...], int, int]] = {1: ((5, 6), 1, 1), 2: ((5, 6), 2, 2), 3: ((5, 6), 3, 4)}


def canonical(stacks: Sequence[Sequence[str]]) -> State:
    return tuple(sorted(tuple(s) for s in stacks if s))


def supports(state: State) -> dict[str, str]:
    """``{block: what it is on}`` (a block or ``"table"``)."""
    return {b: (s[i - 1] if i else TABLE) for s in state for i, b in enumerate(s)}


def describe(state: State) -> str:
    """``A is on the table. B is on A.`` — stack by stack, bottom to top."""
    on = supports(state)
    return " ".join(f"{b} is on {'the table' if on[b] == TABLE else on[b]}." for s in state for b in s)


def render_move(m: Move) -> str:
    b, src, dst = m
    return f"move {b} from {src} to {dst}" if src else f"move {b} to {dst}"


def apply_move(state: State, m: Move) -> tuple[State | None, str]:
    """The next state, or None and why the move is illegal."""
    b, src, dst = m
    on = supports(state)
    if b not in on:
        return None, f"{b} is not a block (blocks: {', '.join(sorted(on))})"
    if dst != TABLE and dst not in on:
        return None, f"{dst} is not a block or the table"
    above = {v: k for k, v in on.items()}
    if b in above:
        return None, f"{b} cannot be moved: {above[b]} is on top of it"
    if src is not None and src != on[b]:
        return None, f"{b} is on {'the table' if on[b] == TABLE else on[b]}, not on {src}"
    if dst == b:
        return None, f"{b} cannot be put on itself"
    if dst == on[b]:
        return None, f"{b} is already on {'the table' if dst == TABLE else dst}"
    if dst != TABLE and dst in above:
        return None, f"{dst} is not clear: {above[dst]} is on top of it"
    stacks = [list(s) for s in state]
    for s in stacks:
        if s and s[-1] == b:
            s.pop()
    if dst == TABLE:
        stacks.append([b])
    else:
        next(s for s in stacks if s and s[-1] == dst).append(b)
    return canonical(stacks), ""


def legal_moves(state: State) -> list[Move]:
    tops = [s[-1] for s in state]
    on = supports(state)
    moves: list[Move] = []
    for b in tops:
        if on[b] != TABLE:
            moves.append((b, on[b], TABLE))
        moves.extend((b, on[b], d) for d in tops if d != b)
    return moves


def bfs_plan(init: State, goal: State, max_moves: int | None = None) -> list[Move] | None:
    """A shortest plan (breadth-first; ≤ 1546 states for 5 blocks), or None if none within ``max_moves``."""
    parent: dict[State, tuple[State, Move] | None] = {init: None}
    frontier = deque([(init, 0)])
    while frontier:
        s, d = frontier.popleft()
        if s == goal:
            plan: list[Move] = []
            while (p := parent[s]) is not None:
                s, m = p
                plan.append(m)
            return plan[::-1]
        if max_moves is not None and d >= max_moves:
            continue
        for m in legal_moves(s):
            nxt, _ = apply_move(s, m)
            if nxt is not None and nxt not in parent:
                parent[nxt] = (s, m)
                frontier.append((nxt, d + 1))
    return None


def random_state(rng: random.Random, blocks: Sequence[str]) -> State:
    """Blocks in random order, each starting a new stack or landing on a random existing stack."""
    stacks: list[list[str]] = []
    for b in rng.sample(list(blocks), len(blocks)):
        if stacks and rng.random() < 0.6:
            rng.choice(stacks).append(b)
        else:
            stacks.append([b])
    return canonical(stacks)


_OBJ = r"(?:the\s+)?(?:top\s+of\s+)?(?:the\s+)?(?:block\s+)?([A-Za-z]+)"
_MOVE_RES = [
    re.compile(r"\bmove\s*\(\s*([A-Za-z]+)\s*,\s*([A-Za-z]+)\s*(?:,\s*([A-Za-z]+)\s*)?\)", re.IGNORECASE),
    re.compile(rf"\bmove\s+{_OBJ}\s+from\s+{_OBJ}\s+(?:to|onto|on)\s+{_OBJ}", re.IGNORECASE),
    re.compile(rf"\b(?:move|put|place|stack)\s+{_OBJ}\s+(?:to|onto|on)\s+{_OBJ}", re.IGNORECASE),
    re.compile(r"\b([A-Za-z]+)\s*(?:->|→)\s*([A-Za-z]+)", re.IGNORECASE),
]


def _plan_region(text: str) -> str:
    fences = re.findall(r"```[^\n]*\n(.*?)(?:```|$)", text, re.DOTALL)
    if fences:
        return str(fences[-1])
    m = re.search(r"^\s*\**plan\**\s*:", text, re.IGNORECASE | re.MULTILINE)
    return text[m.end() :] if m else text


def parse_plan(text: str, blocks: Sequence[str]) -> list[Move]:
    """The moves in ``text`` (syntax in the module docstring); words that are not blocks or the table
    make the match be skipped, so prose like "move on to" is ignored."""
    names = {b.lower(): b for b in blocks} | {TABLE: TABLE}
    found: list[tuple[int, Move]] = []
    taken: list[tuple[int, int]] = []
    for rx in _MOVE_RES:
        for m in rx.finditer(_plan_region(text)):
            if any(s < m.end() and m.start() < e for s, e in taken):
                continue
            groups = [g for g in m.groups() if g is not None]
            objs = [names.get(g.lower()) for g in groups]
            if any(o is None for o in objs) or objs[0] == TABLE:
                continue
            b = str(objs[0])
            src, dst = (objs[1], objs[2]) if len(objs) == 3 else (None, objs[1])
            taken.append((m.start(), m.end()))
            found.append((m.start(), (b, src, str(dst))))
    return [mv for _, mv in sorted(found)]


def simulate(init: State, moves: Sequence[Move]) -> tuple[State, int | None, str]:
    """Run ``moves``: the last legal state, the 1-based number of the first illegal step (or None)
    and why it is illegal."""
    state = init
    for k, m in enumerate(moves, 1):
        nxt, why = apply_move(state, m)
        if nxt is None:
            return state, k, why
        state = nxt
    return state, None, ""


def unmet_goal(state: State, goal: State) -> list[str]:
    """Goal facts that ``state`` lacks, as sentences (``A should be on B but is on the table``)."""
    now, want = supports(state), supports(goal)
    out = []
    for b in sorted(want):
        if now[b] != want[b]:
            w = "the table" if want[b] == TABLE else want[b]
            n = "the table" if now[b] == TABLE else now[b]
            out.append(f"{b} should be on {w} but is on {n}")
    return out


def canonical_instance(init: State, goal: State) -> str:
    """The instance with its blocks renamed to A, B, C… in the way that gives the smallest text: the
    same for every relabelling of the letters (≤ 5! = 120 renamings), so renamed copies share a split."""
    blocks = sorted({b for s in init for b in s})
    best = None
    for perm in itertools.permutations(LETTERS[: len(blocks)]):
        ren = dict(zip(blocks, perm, strict=True))
        text = repr((canonical([[ren[b] for b in s] for s in init]), canonical([[ren[b] for b in s] for s in goal])))
        best = text if best is None or text < best else best
    return str(best)


def _moves(n: int) -> str:
    return "the 1 move is" if n == 1 else f"all {n} moves are"


def _state(meta: Mapping[str, Any], key: str) -> State:
    return canonical(meta[key])


HIDDEN = ("kind", "optimal_moves")  # functions of the optimal plan; blocks, init and goal are in the prompt


class BlocksworldFamily:
    """Blocksworld planning with a plan validator (see the module docstring)."""

    name = "blocksworld"
    difficulties: tuple[int, ...] = (1, 2, 3)

    def __init__(self, test_fraction: float = 0.2) -> None:
        self.test_fraction = test_fraction

    def _draw(self, rng: random.Random, level: int) -> Draw:
        counts, lo, hi = LEVELS[level]
        while True:
            blocks = sorted(rng.sample(LETTERS, rng.choice(counts)))
            init, goal = random_state(rng, blocks), random_state(rng, blocks)
            plan = bfs_plan(init, goal, hi)
            if plan is not None and lo <= len(plan) <= hi:
                break
        kind = "one_move" if len(plan) == 1 else "short" if len(plan) <= 3 else "long"
        prompt = (
            f"Blocks world. Blocks: {', '.join(blocks)}.\n"
            "Rules: move one block at a time. Only a block with nothing on top of it can be moved, and only "
            "onto the table or onto a block with nothing on top of it.\n"
            f"Initial state: {describe(init)}\n"
            f"Goal: {describe(goal)}\n"
            "Give the plan as one move per line: move X from Y to Z (Y and Z are a block or the table)."
        )
        answer = "\n".join(render_move(m) for m in plan)
        meta = {
            "kind": kind,
            "blocks": blocks,
            "init": [list(s) for s in init],
            "goal": [list(s) for s in goal],
            "optimal_moves": len(plan),
        }
        key = f"blocks|{canonical_instance(init, goal)}"  # renamed blocks are the same instance

        def make(task_id: str, split: Split, seed: int) -> Task:
            return Task(task_id, self.name, split, prompt, answer, level, seed, meta, HIDDEN)

        return key, level, make

    def generate(self, split: Split, n: int, seed: int, difficulty: int | None = None) -> list[Task]:
        """``n`` distinct instances of ``split`` (split by initial + goal arrangement)."""
        return sample_distinct(self.name, split, n, seed, difficulty, self.difficulties, self._draw, self.test_fraction)

    def verify(self, task: Task, text: str) -> Verdict:
        """1 iff the parsed plan is legal and reaches the goal (see the module docstring)."""
        meta = task.metadata
        moves = parse_plan(text, meta["blocks"])
        if not moves:
            return Verdict(0.0, "no moves found (write lines like 'move A from B to table')", None)
        extracted = "\n".join(render_move(m) for m in moves)
        goal = _state(meta, "goal")
        final, bad, why = simulate(_state(meta, "init"), moves)
        if bad is not None:
            return Verdict(0.0, f"step {bad} ({render_move(moves[bad - 1])}) is illegal: {why}", extracted)
        unmet = unmet_goal(final, goal)
        if unmet:
            return Verdict(0.0, f"goal not reached after {len(moves)} moves: {unmet[0]}", extracted)
        return Verdict(1.0, f"valid plan of {len(moves)} moves reaching the goal", extracted)

    def tools(self) -> Mapping[str, ToolFn]:
        return {"plan_validator": plan_validator}


def plan_validator(task: Task, transcript: Sequence[Mapping[str, Any]]) -> ToolResult:
    """Simulate the latest candidate plan: PASS (restating the plan), FAIL at the first illegal step
    or with the unmet goal facts, N/A when no move can be read."""
    meta = task.metadata
    cand = latest_candidate(transcript, lambda t: bool(parse_plan(t, meta["blocks"])))
    moves = parse_plan(cand, meta["blocks"]) if cand is not None else []
    if not moves:
        return tool_result("n/a", "No moves found. Write one move per line: move X from Y to Z.")
    final, bad, why = simulate(_state(meta, "init"), moves)
    if bad is not None:
        return tool_result(
            "fail",
            # "(A from B to C)" without the verb, so the FAIL message itself never parses as a plan
            f"Step {bad} ({render_move(moves[bad - 1]).removeprefix('move ')}) is illegal: {why}.",
            f"State before step {bad}: {describe(final)}",
        )
    unmet = unmet_goal(final, _state(meta, "goal"))
    if unmet:
        return tool_result(
            "fail",
            f"{_moves(len(moves)).capitalize()} legal, but the goal is not reached: {'; '.join(unmet[:2])}.",
            f"State after the plan: {describe(final)}",
        )
    plan = "\n".join(render_move(m) for m in moves)
    return tool_result(
        "pass", f"The plan is legal and reaches the goal in {len(moves)} move{'s' if len(moves) > 1 else ''}:", plan
    )
