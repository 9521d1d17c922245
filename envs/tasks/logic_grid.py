"""Logic grid (zebra-like) puzzles with a unique solution, checked by brute force.

``H`` houses in a row, each with one person; every person has a different value of each attribute
(name, pet, drink, house colour). Clues relate values (same house, not same house, house number,
directly left of, next to, somewhere left of). The generator adds true clues that cut the candidate
set until exactly one full assignment remains, then drops clues that are redundant, so the solution
is unique (the tests re-count it by brute force). Difficulty: 1 = 2 houses × 2 attributes,
2 = 3 houses × 2–3 attributes, 3 = 4 houses × 3 attributes.

The question asks for one value (``Who owns the fish?``, ``What does Alice drink?``), so a weak model
can guess among ``H`` options. Kinds: ``"direct"`` when one clue states the answer outright (the LLM
can read it off), ``"deduction"`` otherwise. The ``constraint_checker`` tool tests the candidate
answer (the latest non-tool message naming an option) against the clues (is any assignment satisfying every clue compatible with it?) and names a
clue it contradicts when one clue, or a pair, suffices; with ``H`` options a check-and-revise loop
converges by elimination.

Verifier / answer extraction: the value named on the last ``Answer:``/``####`` line (the earliest
option mentioned there); without such a marker, the option mentioned last in the text. Matching is
case-insensitive on whole words. Score 1 if it is the solution's value, else 0.
"""

from __future__ import annotations

import functools
import itertools
import json
import random
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from envs.tasks.base import Split, Task, ToolFn, ToolResult, Verdict
from envs.tasks.common import Draw, candidates, latest_candidate, sample_distinct, tool_result
from envs.tasks.extract import extract_marked

ATTRIBUTES: dict[str, list[str]] = {
    "name": ["Alice", "Bob", "Carol", "Dave", "Emma", "Finn", "Grace", "Hugo"],
    "pet": ["cat", "dog", "fish", "bird", "rabbit", "horse"],
    "drink": ["tea", "coffee", "milk", "juice", "water"],
    "color": ["red", "green", "blue", "yellow", "white"],
}
_HEADINGS = {"name": "Names", "pet": "Pets", "drink": "Drinks", "color": "House colors"}
_NOUNS = {"name": "name", "pet": "pet", "drink": "drink", "color": "house color"}
# level -> (houses, possible numbers of attributes besides the name)
LEVELS: dict[int, tuple[int, tuple[int, ...]]] = {1: (2, (1,)), 2: (3, (1, 2)), 3: (4, (2,))}
_CLUE_WEIGHTS = {"same": 3.0, "not_same": 1.0, "at": 1.5, "not_at": 1.0, "left": 1.0, "next": 1.5, "before": 1.0}


def subject(attr: str, value: str) -> str:
    """Noun phrase for the person with ``value``: ``Alice``, ``the cat owner``…"""
    return {
        "name": value,
        "pet": f"the {value} owner",
        "drink": f"the person who drinks {value}",
        "color": f"the person in the {value} house",
    }[attr]


def predicate(attr: str, value: str, negated: bool = False) -> str:
    """Verb phrase saying a person has (or has not) ``value``: ``owns the cat``…"""
    if negated:
        return {
            "name": f"is not {value}",
            "pet": f"does not own the {value}",
            "drink": f"does not drink {value}",
            "color": f"does not live in the {value} house",
        }[attr]
    return {
        "name": f"is {value}",
        "pet": f"owns the {value}",
        "drink": f"drinks {value}",
        "color": f"lives in the {value} house",
    }[attr]


def _cap(s: str) -> str:
    return s[0].upper() + s[1:]


def clue_text(clue: Mapping[str, Any]) -> str:
    """The English sentence of a clue dict (``{"type", "a": [attr, value], "b" | "house"}``)."""
    (aa, av), t = clue["a"], clue["type"]
    if t in ("at", "not_at"):
        verb = "lives" if t == "at" else "does not live"
        return f"{_cap(subject(aa, av))} {verb} in house {clue['house'] + 1}."
    ba, bv = clue["b"]
    if t in ("same", "not_same"):
        if ba == "name":  # "Bob owns the cat", not "The cat owner is Bob"
            (aa, av), (ba, bv) = (ba, bv), (aa, av)
        return f"{_cap(subject(aa, av))} {predicate(ba, bv, t == 'not_same')}."
    rel = {"left": "lives directly left of", "next": "lives next to", "before": "lives somewhere left of"}[t]
    return f"{_cap(subject(aa, av))} {rel} {subject(ba, bv)}."


@functools.lru_cache(maxsize=16)
def assignment_space(houses: int, n_attrs: int) -> np.ndarray:
    """Every full assignment as ``pos[n, attr, value] = house`` (int8, shape ``(H!^A, A, H)``)."""
    perms = np.array(list(itertools.permutations(range(houses))), dtype=np.int8)
    idx = np.array(list(itertools.product(range(len(perms)), repeat=n_attrs)), dtype=np.int64)
    space = perms[idx]
    space.setflags(write=False)
    return space


def holds(
    clue: Mapping[str, Any], pos: np.ndarray, attrs: Sequence[str], values: Mapping[str, Sequence[str]]
) -> np.ndarray:
    """Boolean mask: which assignments in ``pos`` (shape ``(N, A, H)``) satisfy ``clue``."""

    def house(ref: Sequence[str]) -> np.ndarray:
        a = attrs.index(ref[0])
        return pos[:, a, list(values[ref[0]]).index(ref[1])].astype(np.int16)

    ha, t = house(clue["a"]), clue["type"]
    if t == "at":
        return ha == clue["house"]
    if t == "not_at":
        return ha != clue["house"]
    hb = house(clue["b"])
    result: np.ndarray = {
        "same": lambda: ha == hb,
        "not_same": lambda: ha != hb,
        "left": lambda: ha + 1 == hb,
        "next": lambda: np.abs(ha - hb) == 1,
        "before": lambda: ha < hb,
    }[t]()
    return result


def _random_clue(rng: random.Random, attrs: list[str], sol: dict[str, list[str]]) -> dict[str, Any] | None:
    """A random clue that is true of the solution ``sol[attr][house]`` (None: resample)."""
    houses = len(sol["name"])
    t = rng.choices(list(_CLUE_WEIGHTS), weights=list(_CLUE_WEIGHTS.values()))[0]
    aa = rng.choice(attrs)
    h = rng.randrange(houses)
    a = [aa, sol[aa][h]]
    if t == "at":
        return {"type": t, "a": a, "house": h}
    if t == "not_at":
        return {"type": t, "a": a, "house": rng.choice([k for k in range(houses) if k != h])}
    if t in ("same", "not_same"):
        ba = rng.choice([x for x in attrs if x != aa])
        hb = h if t == "same" else rng.choice([k for k in range(houses) if k != h])
        return {"type": t, "a": a, "b": [ba, sol[ba][hb]]}
    targets = {"left": [h + 1], "next": [h - 1, h + 1], "before": list(range(h + 1, houses))}[t]
    targets = [k for k in targets if 0 <= k < houses]
    if not targets:
        return None
    ba = rng.choice(attrs)
    return {"type": t, "a": a, "b": [ba, sol[ba][rng.choice(targets)]]}


def question_text(subj: Sequence[str], target: str) -> str:
    sa, sv = subj
    if target == "name":
        return f"Who {predicate(sa, sv)}?"
    return {
        "pet": f"Which pet does {subject(sa, sv)} own?",
        "drink": f"What does {subject(sa, sv)} drink?",
        "color": f"What color is the house of {subject(sa, sv)}?",
    }[target]


def statement(subj: Sequence[str], target: str, value: str) -> str:
    """``Bob owns the fish`` for subject (pet, fish), target name, value Bob."""
    if target == "name":
        return f"{_cap(subject('name', value))} {predicate(subj[0], subj[1])}"
    return f"{_cap(subject(subj[0], subj[1]))} {predicate(target, value)}"


def extract_option(text: str, options: Sequence[str]) -> str | None:
    """The option named by ``text`` (rules in the module docstring), with its canonical spelling."""

    def hits(s: str) -> list[tuple[int, str]]:
        found = []
        for opt in options:
            for m in re.finditer(rf"\b{re.escape(opt)}\b", s, re.IGNORECASE):
                found.append((m.start(), opt))
        return sorted(found)

    seg = extract_marked(text)
    if seg:
        in_seg = hits(seg)
        if in_seg:
            return in_seg[0][1]
    everywhere = hits(text)
    return everywhere[-1][1] if everywhere else None


HIDDEN = ("kind", "solution")  # the full assignment, and whether a clue states the answer (needs the answer)


class LogicGridFamily:
    """Zebra-like puzzles with unique solutions (see the module docstring)."""

    name = "logic_grid"
    difficulties: tuple[int, ...] = (1, 2, 3)

    def __init__(self, test_fraction: float = 0.2) -> None:
        self.test_fraction = test_fraction

    def _draw(self, rng: random.Random, level: int) -> Draw:
        houses, others = LEVELS[level]
        attrs = ["name", *rng.sample(["pet", "drink", "color"], rng.choice(others))]
        values = {a: sorted(rng.sample(ATTRIBUTES[a], houses)) for a in attrs}  # listed order
        sol = {a: rng.sample(values[a], houses) for a in attrs}  # sol[attr][house]
        space = assignment_space(houses, len(attrs))
        alive = np.ones(len(space), dtype=bool)
        clues: list[dict[str, Any]] = []
        masks: list[np.ndarray] = []
        while alive.sum() > 1:
            clue = _random_clue(rng, attrs, sol)
            if clue is None or clue in clues:
                continue
            m = holds(clue, space, attrs, values)
            if (alive & m).sum() < alive.sum():
                clues.append(clue)
                masks.append(m)
                alive &= m
        keep = list(range(len(clues)))
        for i in rng.sample(range(len(clues)), len(clues)):  # drop redundant clues, random order
            others_ = [j for j in keep if j != i]
            if others_ and np.logical_and.reduce([masks[j] for j in others_]).sum() == 1:
                keep = others_
        clues = [clues[j] for j in keep]
        subj_attr = rng.choice(attrs)
        target = rng.choice([a for a in attrs if a != subj_attr])
        h = rng.randrange(houses)
        subj = [subj_attr, sol[subj_attr][h]]
        answer = sol[target][h]
        direct = any(
            c["type"] == "same" and sorted([tuple(c["a"]), tuple(c["b"])]) == sorted([tuple(subj), (target, answer)])
            for c in clues
        )
        texts = [clue_text(c) for c in clues]
        nouns = [_NOUNS[a] for a in attrs]
        has = ", ".join(nouns[:-1]) + f" and {nouns[-1]}" if len(nouns) > 1 else nouns[0]
        lines = [
            f"There are {houses} houses in a row, numbered 1 to {houses} from left to right. One person lives in "
            f"each house. Each person has a different {has}. 'Left of' means in a house with a lower number.",
            *[f"{_HEADINGS[a]}: {', '.join(values[a])}." for a in attrs],
            "Clues:",
            *[f"{i}. {t}" for i, t in enumerate(texts, 1)],
            f"Question: {question_text(subj, target)}",
        ]
        prompt = "\n".join(lines)
        meta = {
            "kind": "direct" if direct else "deduction",
            "houses": houses,
            "attributes": attrs,
            "values": values,
            "clues": clues,
            "clue_texts": texts,
            "question": {"subject": subj, "target": target},
            "options": values[target],
            "solution": sol,
        }

        def make(task_id: str, split: Split, seed: int) -> Task:
            return Task(task_id, self.name, split, prompt, answer, level, seed, meta, HIDDEN)

        return f"logic|{canonical_puzzle(meta)}", level, make

    def generate(self, split: Split, n: int, seed: int, difficulty: int | None = None) -> list[Task]:
        """``n`` distinct puzzles of ``split`` (split by the puzzle text)."""
        return sample_distinct(self.name, split, n, seed, difficulty, self.difficulties, self._draw, self.test_fraction)

    def verify(self, task: Task, text: str) -> Verdict:
        """Score 1 iff the extracted option is the solution's value."""
        got = extract_option(text, task.metadata["options"])
        if got is None:
            return Verdict(0.0, f"no option found (options: {', '.join(task.metadata['options'])})", None)
        if got == task.answer:
            return Verdict(1.0, f"correct: {got}", got)
        return Verdict(0.0, f"wrong: {got}, expected {task.answer}", got)

    def tools(self) -> Mapping[str, ToolFn]:
        """``constraint_checker``: tests the latest candidate answer against the clues."""
        return {"constraint_checker": constraint_checker}


def canonical_puzzle(meta: Mapping[str, Any]) -> str:
    """The puzzle with every value replaced by its attribute and rank in the listed (sorted) values: renaming
    people, pets, drinks or colours gives the same key, so renamed copies share a split. Clue order counts."""
    rank = {(a, v): f"{a}{i}" for a in meta["attributes"] for i, v in enumerate(meta["values"][a])}

    def ref(x: Any) -> Any:
        if isinstance(x, list) and len(x) == 2 and all(isinstance(v, str) for v in x) and (x[0], x[1]) in rank:
            return rank[(x[0], x[1])]
        if isinstance(x, dict):
            return {k: ref(v) for k, v in sorted(x.items())}
        if isinstance(x, list):
            return [ref(v) for v in x]
        return x

    return json.dumps(
        {"houses": meta["houses"], "clues": ref(meta["clues"]), "question": ref(meta["question"])}, sort_keys=True
    )


def count_solutions(meta: Mapping[str, Any]) -> int:
    """Brute force: how many full assignments satisfy every clue of a puzzle's metadata."""
    attrs, values = meta["attributes"], meta["values"]
    space = assignment_space(meta["houses"], len(attrs))
    ok = np.ones(len(space), dtype=bool)
    for c in meta["clues"]:
        ok &= holds(c, space, attrs, values)
    return int(ok.sum())


def _consistent(meta: Mapping[str, Any], space: np.ndarray, option: str) -> bool:
    """Is some assignment satisfying every clue compatible with ``option`` as the answer?"""
    attrs, values = meta["attributes"], meta["values"]
    subj, target = meta["question"]["subject"], meta["question"]["target"]
    hyp = space[holds({"type": "same", "a": subj, "b": [target, option]}, space, attrs, values)]
    return bool(np.logical_and.reduce([holds(c, hyp, attrs, values) for c in meta["clues"]]).any())


def constraint_checker(task: Task, transcript: Sequence[Mapping[str, Any]]) -> ToolResult:
    """PASS iff some assignment satisfying all clues gives the candidate answer (the solution is
    unique, so PASS means correct); FAIL names the clue (or pair of clues) the answer contradicts."""
    meta = task.metadata
    options = list(meta["options"])
    cand = latest_candidate(transcript, lambda t: extract_option(t, options) is not None)
    if cand is None:
        return tool_result("n/a", f"No answer to check yet. The answer must be one of: {', '.join(options)}.")
    got = extract_option(cand, options)
    assert got is not None
    attrs, values = meta["attributes"], meta["values"]
    subj, target = meta["question"]["subject"], meta["question"]["target"]
    space = assignment_space(meta["houses"], len(attrs))
    hyp = space[holds({"type": "same", "a": subj, "b": [target, got]}, space, attrs, values)]
    sats = [holds(c, hyp, attrs, values) for c in meta["clues"]]
    said = f"'{statement(subj, target, got)}'"
    if _consistent(meta, space, got):
        return tool_result("pass", f"{said} is consistent with all clues.", f"Answer: {got}")
    ruled = []  # earlier candidates the clues exclude (computed from the clues, as for this one)
    for text in candidates(transcript):
        opt = extract_option(text, options)
        if opt is not None and opt not in ruled and not _consistent(meta, space, opt):
            ruled.append(opt)
    tail = f"Ruled out so far: {', '.join(ruled)}." if ruled else ""
    texts = meta["clue_texts"]
    for i, s in enumerate(sats):
        if not s.any():
            return tool_result("fail", f"{said} contradicts clue {i + 1}: {texts[i]}", tail)
    for i, j in itertools.combinations(range(len(sats)), 2):
        if not (sats[i] & sats[j]).any():
            return tool_result("fail", f"{said} contradicts clues {i + 1} and {j + 1} together.", tail)
    return tool_result("fail", f"{said} is impossible: no arrangement satisfies all the clues.", tail)
