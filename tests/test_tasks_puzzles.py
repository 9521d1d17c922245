"""Logic grid puzzles (unique solutions by an independent brute force, the constraint checker) and
Blocksworld (BFS reference plans, the plan validator, lenient plan parsing). No LLM."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from envs.tasks.base import Task
from envs.tasks.blocksworld import (
    LEVELS,
    BlocksworldFamily,
    bfs_plan,
    canonical,
    parse_plan,
    plan_validator,
    render_move,
)
from envs.tasks.logic_grid import LogicGridFamily, constraint_checker, count_solutions


def _msg(worker: str, text: str, verdict: str | None = None) -> dict[str, object]:
    return {"worker": worker, "text": text, "verdict": verdict}


# ------------------------------------------------------------------ logic grid


def _clue_ok(clue: Mapping[str, Any], house: Mapping[tuple[str, str], int]) -> bool:
    """Independent re-implementation of the clue semantics (houses 0-based)."""
    ha = house[tuple(clue["a"])]
    t = clue["type"]
    if t in ("at", "not_at"):
        return (ha == clue["house"]) == (t == "at")
    hb = house[tuple(clue["b"])]
    return {
        "same": ha == hb,
        "not_same": ha != hb,
        "left": ha + 1 == hb,
        "next": abs(ha - hb) == 1,
        "before": ha < hb,
    }[t]


def brute_force_solutions(meta: Mapping[str, Any]) -> list[dict[str, list[str]]]:
    """Every assignment (value order per house) satisfying all clues, by plain enumeration."""
    attrs: Sequence[str] = meta["attributes"]
    values = meta["values"]
    found = []
    for perms in itertools.product(*(itertools.permutations(values[a]) for a in attrs)):
        house = {(a, v): h for a, p in zip(attrs, perms, strict=True) for h, v in enumerate(p)}
        if all(_clue_ok(c, house) for c in meta["clues"]):
            found.append({a: list(p) for a, p in zip(attrs, perms, strict=True)})
    return found


@pytest.mark.parametrize("difficulty", [1, 2, 3])
def test_logic_puzzles_have_exactly_one_solution(difficulty: int) -> None:
    tasks = LogicGridFamily().generate("train", 6 if difficulty < 3 else 3, seed=11, difficulty=difficulty)
    houses = {1: 2, 2: 3, 3: 4}[difficulty]
    for t in tasks:
        meta = t.metadata
        assert meta["houses"] == houses and 2 <= len(meta["attributes"]) <= 3
        sols = brute_force_solutions(meta)
        assert len(sols) == 1, f"{t.id}: {len(sols)} solutions"
        assert sols[0] == meta["solution"]
        assert count_solutions(meta) == 1
        subj_attr, subj_val = meta["question"]["subject"]
        h = meta["solution"][subj_attr].index(subj_val)
        assert t.answer == meta["solution"][meta["question"]["target"]][h]
        assert t.answer in meta["options"] and len(meta["options"]) == houses
        for i, text in enumerate(meta["clue_texts"], 1):
            assert f"{i}. {text}" in t.prompt


def test_logic_kinds_both_occur() -> None:
    kinds = {t.metadata["kind"] for t in LogicGridFamily().generate("train", 30, seed=2)}
    assert kinds == {"direct", "deduction"}


def _wrong_options(t: Task) -> list[str]:
    return [o for o in t.metadata["options"] if o != t.answer]


def test_logic_verifier_formats() -> None:
    fam = LogicGridFamily()
    for t in fam.generate("train", 8, seed=4):
        a, w = t.answer, _wrong_options(t)[0]
        for good in (
            f"Answer: {a}",
            f"#### {a}",
            f"I reason a lot about {w}.\nAnswer: {a.lower()}.",
            f"So it must be {a}.",
        ):
            assert fam.verify(t, good).correct, good
        for bad in (f"Answer: {w}", f"{a} is tempting, but it is {w}.", "I do not know."):
            assert not fam.verify(t, bad).correct, bad
        assert fam.verify(t, "no idea").extracted is None


def test_constraint_checker_converges_by_elimination() -> None:
    for t in LogicGridFamily().generate("train", 8, seed=9, difficulty=3):
        assert constraint_checker(t, []).verdict == "n/a"
        assert constraint_checker(t, [_msg("solver", "hmm")]).verdict == "n/a"
        transcript: list[dict[str, object]] = []
        for w in _wrong_options(t):
            transcript.append(_msg("solver", f"Answer: {w}"))
            r = constraint_checker(t, transcript)
            assert r.verdict == "fail" and r.text.startswith("FAIL\n")
            assert "contradicts" in r.text or "impossible" in r.text
            assert f"Ruled out so far: {w}" in r.text or f", {w}." in r.text
            transcript.append(_msg("constraint_checker", r.text, r.verdict))
        transcript.append(_msg("solver", f"Answer: {t.answer}"))
        ok = constraint_checker(t, transcript)
        assert ok.verdict == "pass" and ok.text.endswith(f"Answer: {t.answer}")
        assert LogicGridFamily().verify(t, ok.text).correct


def test_constraint_checker_names_a_directly_contradicted_clue() -> None:
    for t in LogicGridFamily().generate("train", 20, seed=3):
        if t.metadata["kind"] != "direct":
            continue
        r = constraint_checker(t, [_msg("solver", f"Answer: {_wrong_options(t)[0]}")])
        assert r.verdict == "fail" and "clue" in r.text
        return
    pytest.fail("no direct puzzle drawn")


# ------------------------------------------------------------------ blocksworld


def _bw(t: Task) -> tuple[Any, Any]:
    return canonical(t.metadata["init"]), canonical(t.metadata["goal"])


@pytest.mark.parametrize("difficulty", [1, 2, 3])
def test_blocksworld_reference_plans_are_optimal_and_valid(difficulty: int) -> None:
    fam = BlocksworldFamily()
    counts, lo, hi = LEVELS[difficulty]
    for t in fam.generate("train", 6, seed=5, difficulty=difficulty):
        init, goal = _bw(t)
        assert init != goal and len(t.metadata["blocks"]) in counts
        plan = parse_plan(t.answer, t.metadata["blocks"])
        assert lo <= len(plan) == t.metadata["optimal_moves"] <= hi
        assert bfs_plan(init, goal, max_moves=len(plan) - 1) is None, "BFS plan must be shortest"
        assert fam.verify(t, t.answer).correct
        r = plan_validator(t, [_msg("planner", t.answer)])
        assert r.verdict == "pass" and fam.verify(t, r.text).correct
        kind = t.metadata["kind"]
        assert kind == ("one_move" if len(plan) == 1 else "short" if len(plan) <= 3 else "long")


def test_blocksworld_broken_plan_is_rejected_at_the_right_step() -> None:
    fam = BlocksworldFamily()
    for t in fam.generate("train", 8, seed=6, difficulty=3):
        moves = t.answer.splitlines()
        first_block = moves[0].split()[1]
        # repeating the first move is illegal at step 2 (the block already left its support)
        broken = "\n".join([moves[0], moves[0], *moves[1:]])
        v = fam.verify(t, broken)
        assert v.score == 0.0 and v.reason.startswith("step 2 ") and first_block in v.reason
        r = plan_validator(t, [_msg("planner", broken)])
        assert r.verdict == "fail" and r.text.startswith(f"FAIL\nStep 2 ({first_block} from ")
        assert fam.verify(t, r.text).extracted is None, "a FAIL message is not itself a plan"
        short = "\n".join(moves[:-1])
        v2 = fam.verify(t, short)
        assert v2.score == 0.0 and "goal not reached" in v2.reason
        r2 = plan_validator(t, [_msg("planner", short)])
        assert r2.verdict == "fail" and "goal is not reached" in r2.text and "should be on" in r2.text
        assert plan_validator(t, [_msg("planner", "I would move things around")]).verdict == "n/a"
        assert fam.verify(t, "").extracted is None


def test_blocksworld_plan_parsing_is_lenient() -> None:
    blocks = ["A", "B", "C"]
    text = (
        "Plan:\n1. Move block A onto the table\n2) put B on top of C\n- move(C, table, A)\n* D -> table\nmove on to B"
    )
    assert parse_plan(text, blocks) == [("A", None, "table"), ("B", None, "C"), ("C", "table", "A")]
    fenced = "I think: move A to B.\n```\nmove a from b to table\nstack C on A\n```\nthanks"
    assert parse_plan(fenced, blocks) == [("A", "B", "table"), ("C", None, "A")]
    assert render_move(("A", "B", "table")) == "move A from B to table"


def test_blocksworld_lenient_answer_still_verifies() -> None:
    fam = BlocksworldFamily()
    for t in fam.generate("train", 5, seed=8, difficulty=2):
        chatty = "Let me think.\nPlan:\n" + "\n".join(
            f"{i}. Put {line.split()[1]} on the {line.split()[-1]}" if line.endswith("table") else f"{i}. {line}."
            for i, line in enumerate(t.answer.splitlines(), 1)
        )
        assert fam.verify(t, chatty).correct, chatty


def test_renamed_blocks_share_a_key_and_a_split() -> None:
    from envs.tasks.blocksworld import canonical_instance

    init, goal = canonical([["A", "B"], ["C"]]), canonical([["C", "B", "A"]])
    renamed = canonical([["D", "A"], ["F"]]), canonical([["F", "A", "D"]])
    assert canonical_instance(init, goal) == canonical_instance(*renamed)
    other = canonical([["A"], ["B"], ["C"]]), goal
    assert canonical_instance(*other) != canonical_instance(init, goal)


def test_renamed_logic_puzzles_share_a_key() -> None:
    import json

    from envs.tasks.logic_grid import canonical_puzzle

    t = LogicGridFamily().generate("train", 1, seed=3)[0]
    meta = json.loads(json.dumps(dict(t.metadata)))
    names = meta["values"]["name"]
    fresh = ["Zed", "Yara", "Xavi", "Wren"][: len(names)]
    swap = dict(zip(names, sorted(fresh), strict=True))  # order-preserving: the listed (sorted) order is unchanged

    def rename(x):  # type: ignore[no-untyped-def]
        if isinstance(x, list) and len(x) == 2 and x[0] == "name" and x[1] in swap:
            return ["name", swap[x[1]]]
        if isinstance(x, dict):
            return {k: rename(v) for k, v in x.items()}
        if isinstance(x, list):
            return [rename(v) for v in x]
        return x

    renamed = {**meta, "clues": rename(meta["clues"]), "question": rename(meta["question"])}
    renamed["values"] = {**meta["values"], "name": sorted(fresh)}
    assert canonical_puzzle(renamed) == canonical_puzzle(meta)
    changed = {
        **meta,
        "question": {
            **meta["question"],
            "target": "name" if meta["question"]["target"] != "name" else meta["attributes"][1],
        },
    }
    assert canonical_puzzle(changed) != canonical_puzzle(meta)
