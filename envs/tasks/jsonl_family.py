"""A user's own question/answer data as a task family.

File format: one JSON object per line, ``{"question": str, "answer": str | number}`` plus optional
``"id"`` (str/int, unique), ``"difficulty"`` (int), ``"split"`` (``"train"``/``"test"``, overrides
the hash split) and any other fields (kept in ``metadata["extra"]``). Blank lines are skipped. Any
other problem raises :class:`JsonlFormatError` naming the file and the 1-based line number.

Split: by the hash of the question text (:func:`envs.tasks.base.split_of`), so a question lands in the
same split whatever the seed, unless the line says ``"split"``.

Checker (``kind`` tells which applies):

* ``"numeric"`` — the answer parses as a number (``12``, ``-3.5``, ``$1,200``, ``45%``): the number
  extracted from the reply by :mod:`envs.tasks.extract` (``#### N``, ``Answer: N``, number after the
  last ``=``, last number) must be within ``max(abs_tol, rel_tol * |answer|)`` of it.
* ``"text"`` — otherwise: the text after the last ``####``/``Answer:`` marker, or else the reply's last
  non-empty line, must equal the answer after normalisation (lower case, punctuation and the articles
  a/an/the removed, whitespace collapsed).

Tools: the ``calculator`` (re-checks arithmetic the reply wrote; see :mod:`envs.tasks.calculator`).
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from envs.tasks.base import Split, Task, ToolFn, Verdict, split_of
from envs.tasks.calculator import calculator
from envs.tasks.common import content_id, stable_rng
from envs.tasks.extract import extract_marked, extract_number_with_rule, parse_number


class JsonlFormatError(ValueError):
    """A line of the data file is not a valid item; the message names the file and line."""


def normalize_text(s: str) -> str:
    """Lower case, drop punctuation and articles, collapse whitespace (SQuAD-style)."""
    s = s.lower().translate(str.maketrans("", "", string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def _numeric_answer(answer: str) -> bool:
    return parse_number(answer.strip()) is not None


def check_answer(task: Task, text: str) -> Verdict:
    """The JSONL checker (rules in the module docstring); reads only the task, so it also verifies
    stored tasks without the data file."""
    meta = task.metadata
    if meta.get("kind") == "numeric":
        want = parse_number(task.answer)
        got, rule = extract_number_with_rule(text)
        if got is None or want is None:
            return Verdict(0.0, "no number found in the answer", None)
        g = parse_number(got)
        assert g is not None
        tol = max(float(meta.get("abs_tol", 1e-9)), float(meta.get("rel_tol", 1e-6)) * abs(float(want)))
        if abs(float(g) - float(want)) <= tol:
            return Verdict(1.0, f"correct: {got} (rule {rule!r})", got)
        return Verdict(0.0, f"wrong: read {got} (rule {rule!r}), expected {task.answer}", got)
    seg = extract_marked(text)
    if seg is None:
        lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
        seg = lines[-1] if lines else None
    if seg is None:
        return Verdict(0.0, "empty answer", None)
    if normalize_text(seg) == normalize_text(task.answer):
        return Verdict(1.0, f"correct: {seg!r}", seg)
    return Verdict(0.0, f"wrong: {seg!r}, expected {task.answer!r}", seg)


class JsonlFamily:
    """Tasks loaded from a JSONL file of ``{"question", "answer"}`` lines (see the module docstring)."""

    def __init__(
        self,
        path: str | Path,
        name: str = "jsonl",
        test_fraction: float = 0.2,
        rel_tol: float = 1e-6,
        abs_tol: float = 1e-9,
    ) -> None:
        self.path = Path(path)
        self.name = name
        self.test_fraction = test_fraction
        self.rel_tol, self.abs_tol = rel_tol, abs_tol
        self.items = self._load()
        self.difficulties: tuple[int, ...] = tuple(sorted({int(it["difficulty"]) for it in self.items})) or (1,)

    def _load(self) -> list[dict[str, Any]]:
        try:
            raw = self.path.read_text(encoding="utf-8")
        except OSError as e:
            raise JsonlFormatError(f"{self.path}: cannot read: {e}") from e
        items: list[dict[str, Any]] = []
        ids: dict[str, int] = {}
        for lineno, line in enumerate(raw.splitlines(), 1):
            if not line.strip():
                continue
            where = f"{self.path}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise JsonlFormatError(f"{where}: invalid JSON: {e.msg} (column {e.colno})") from e
            if not isinstance(obj, dict):
                raise JsonlFormatError(f"{where}: expected a JSON object, got {type(obj).__name__}")
            q, a = obj.get("question"), obj.get("answer")
            if not isinstance(q, str) or not q.strip():
                raise JsonlFormatError(f"{where}: 'question' must be a non-empty string")
            if isinstance(a, bool) or not isinstance(a, (str, int, float)) or (isinstance(a, str) and not a.strip()):
                raise JsonlFormatError(f"{where}: 'answer' must be a non-empty string or a number")
            item_id = obj.get("id", None)
            if item_id is not None and (isinstance(item_id, bool) or not isinstance(item_id, (str, int))):
                raise JsonlFormatError(f"{where}: 'id' must be a string or an integer")
            if item_id is not None:
                if str(item_id) in ids:
                    raise JsonlFormatError(f"{where}: duplicate id {item_id!r} (first on line {ids[str(item_id)]})")
                ids[str(item_id)] = lineno
            diff = obj.get("difficulty", 1)
            if isinstance(diff, bool) or not isinstance(diff, int):
                raise JsonlFormatError(f"{where}: 'difficulty' must be an integer")
            split = obj.get("split")
            if split is not None and split not in ("train", "test"):
                raise JsonlFormatError(f"{where}: 'split' must be 'train' or 'test', got {split!r}")
            answer = str(a)
            items.append(
                {
                    "line": lineno,
                    "id": None if item_id is None else str(item_id),
                    "question": q,
                    "answer": answer,
                    "difficulty": diff,
                    "split": split or split_of(f"{self.name}|{q.strip()}", self.test_fraction),
                    "extra": {
                        k: v for k, v in obj.items() if k not in ("question", "answer", "id", "difficulty", "split")
                    },
                }
            )
        return items

    def _task(self, it: Mapping[str, Any], seed: int) -> Task:
        numeric = _numeric_answer(it["answer"])
        meta = {
            "kind": "numeric" if numeric else "text",
            "source": "jsonl",
            "path": str(self.path),
            "line": it["line"],
            "rel_tol": self.rel_tol,
            "abs_tol": self.abs_tol,
            "extra": it["extra"],
        }
        tid = f"{self.name}-{it['id']}" if it["id"] is not None else content_id(self.name, it["question"])
        return Task(tid, self.name, it["split"], it["question"], it["answer"], it["difficulty"], seed, meta)

    def generate(self, split: Split, n: int, seed: int, difficulty: int | None = None) -> list[Task]:
        """``n`` items of ``split`` (and ``difficulty`` if given) in a seeded shuffle; ValueError if the
        file has fewer."""
        pool = [
            it for it in self.items if it["split"] == split and (difficulty is None or it["difficulty"] == difficulty)
        ]
        if n > len(pool):
            raise ValueError(
                f"{self.path}: only {len(pool)} {split} items (difficulty={difficulty}) in the file, {n} requested"
            )
        order = list(range(len(pool)))
        stable_rng(self.name, split, seed, difficulty).shuffle(order)
        return [self._task(pool[i], seed) for i in order[:n]]

    def verify(self, task: Task, text: str) -> Verdict:
        return check_answer(task, text)

    def tools(self) -> Mapping[str, ToolFn]:
        return {"calculator": calculator}
