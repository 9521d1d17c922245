"""Robust answer extraction shared by the verifiers and the tools.

A 135M model rarely follows a format exactly (see ``docs/smollm2.md``): it writes GSM8K
style ``… 4 + 6 = 10 apples. #### 10``, or ``Answer: 10``, or just rambles and ends on a number. The
rules below are part of every verifier's documented behaviour, so they are deliberately simple and
ordered from most to least explicit:

Numbers (:func:`extract_number`), first rule that finds a number wins:

1. ``#### N`` — the last ``####`` marker;
2. ``Answer: N`` — the last ``answer:`` / ``answer is`` / ``answer =`` marker (any case, markdown
   ``**`` ignored);
   in both marker rules the number is read from the rest of the marker's line: the number right after
   its last ``=`` if it has one (``Answer: 4 + 6 = 10`` → 10), else its first number;
3. the number right after the last ``=`` in the text (``4 + 6 = 10 apples`` → 10);
4. the last number in the text.

Numbers may carry a sign, a ``$``, thousands commas and decimals (``-$1,200.50`` → ``-1200.5``).

Text answers (:func:`extract_marked`): the rest of the line after the last ``####`` or ``Answer:``
marker, stripped of markdown and trailing punctuation; ``None`` when there is no marker (callers then
apply their own fallback, documented there).
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from fractions import Fraction

# A number not glued to a preceding word/number (so the "-" in "10-3" is not a sign).
_NUM = r"(?<![\w.])[-−]?\$?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\d,])|(?<![\w.])[-−]?\$?\d+(?:\.\d+)?"
NUMBER_RE = re.compile(_NUM)
_HASH_RE = re.compile(r"####[ \t]*([^\n]*)")
_ANSWER_RE = re.compile(r"answer\s*(?:is\s*[:=]?|:|=)[ \t]*([^\n]*)", re.IGNORECASE)


def parse_number(token: str) -> Fraction | None:
    """Exact value of a number token (``"$1,200"`` → 1200, ``"2.50"`` → 5/2); None if it is not one."""
    t = token.strip().replace("−", "-").replace("$", "").replace(",", "")
    t = t.rstrip("%").rstrip(".")
    if not t:
        return None
    try:
        return Fraction(Decimal(t))
    except (InvalidOperation, ValueError):
        pass
    try:
        return Fraction(t)  # "3/4"
    except (ValueError, ZeroDivisionError):
        return None


def format_number(value: Fraction) -> str:
    """Canonical text of a number: ``12``, ``2.5``, ``-0.125``; non-terminating decimals to 6 places."""
    if value.denominator == 1:
        return str(value.numerator)
    d = value.denominator
    while d % 2 == 0:
        d //= 2
    while d % 5 == 0:
        d //= 5
    # a terminating decimal prints exactly; others to 6 places
    text = format(Decimal(value.numerator) / Decimal(value.denominator), "f") if d == 1 else f"{float(value):.6f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _clean(text: str) -> str:
    return text.replace("**", "").replace("__", "")


def _number_in_segment(segment: str) -> str | None:
    """The number a marker line states: after its last ``=`` if any, else its first number."""
    if "=" in segment:
        m = NUMBER_RE.search(segment.rsplit("=", 1)[1])
        if m:
            return m.group(0)
    m = NUMBER_RE.search(segment)
    return m.group(0) if m else None


def extract_number_with_rule(text: str) -> tuple[str | None, str]:
    """The answer number (canonical text) and the rule that found it ("####", "answer", "=", "last")."""
    text = _clean(text)
    for rule, regex in (("####", _HASH_RE), ("answer", _ANSWER_RE)):
        matches = list(regex.finditer(text))
        for m in reversed(matches):  # the last marker that states a number
            tok = _number_in_segment(m.group(1))
            if tok is not None:
                return _canonical(tok), rule
    if "=" in text:
        after = NUMBER_RE.search(text.rsplit("=", 1)[1])
        if after is not None:
            return _canonical(after.group(0)), "="
    nums = NUMBER_RE.findall(text)
    if nums:
        return _canonical(nums[-1]), "last"
    return None, "none"


def extract_number(text: str) -> str | None:
    """The answer number of ``text`` by the rules in the module docstring (canonical text), or None."""
    return extract_number_with_rule(text)[0]


def _canonical(token: str) -> str:
    v = parse_number(token)
    return format_number(v) if v is not None else token


def extract_marked(text: str) -> str | None:
    """Rest of the line after the last ``####`` or ``Answer:`` marker (``####`` wins), or None."""
    text = _clean(text)
    for regex in (_HASH_RE, _ANSWER_RE):
        matches = [m for m in regex.finditer(text) if m.group(1).strip()]
        if matches:
            return matches[-1].group(1).strip().strip("`'\"").rstrip(".!").strip()
    return None


def numbers_equal(a: str | Fraction, b: str | Fraction) -> bool:
    """Exact equality of two numbers given as text or fractions (``"12.0"`` equals ``"12"``)."""
    fa = parse_number(a) if isinstance(a, str) else a
    fb = parse_number(b) if isinstance(b, str) else b
    return fa is not None and fb is not None and fa == fb
