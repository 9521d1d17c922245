"""The catalogue of functions for :mod:`envs.tasks.code_synthesis`.

Each :class:`Spec` is a signature, a docstring template, a reference body and a generator of random
arguments (plus fixed edge cases, which are where weak models fail: ``factorial(0)``, empty lists).
Parameterised specs (``add_k`` with ``k``, ``fizzbuzz`` with its two divisors, ``caesar`` with its
shift…) multiply the number of distinct prompts, so train and test splits stay disjoint by content.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

N_TESTS = 6
Args = list[Any]


@dataclass(frozen=True)
class Spec:
    """A function to synthesise. ``doc``/``ref`` are ``str.format`` templates over ``params``."""

    id: str
    level: int
    kind: str
    signature: str
    doc: str
    ref: str  # body of the reference solution (indented 4 spaces)
    gen: Callable[[random.Random], Args]  # one random argument list
    params: Callable[[random.Random], dict[str, Any]] = lambda rng: {}
    edges: tuple[tuple[Any, ...], ...] = ()


def _ints(lo: int, hi: int, n: int = 1) -> Callable[[random.Random], Args]:
    return lambda rng: [rng.randint(lo, hi) for _ in range(n)]


def _list(lo: int, hi: int, min_len: int = 0, max_len: int = 7) -> Callable[[random.Random], Args]:
    return lambda rng: [[rng.randint(lo, hi) for _ in range(rng.randint(min_len, max_len))]]


_WORDS = ["apple", "banana", "level", "robot", "kayak", "sun", "moon", "data", "noon", "python", "tree", "radar"]


def _word(rng: random.Random) -> Args:
    return [rng.choice(_WORDS) if rng.random() < 0.6 else "".join(rng.choices("abcdeiou", k=rng.randint(0, 7)))]


def _sentence(rng: random.Random) -> Args:
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 4)))]


def _runs(rng: random.Random) -> Args:
    return ["".join(rng.choice("abc") * rng.randint(1, 4) for _ in range(rng.randint(0, 4)))]


def _pal(rng: random.Random) -> Args:
    half = "".join(rng.choices("abc", k=rng.randint(0, 3)))
    if rng.random() < 0.5:
        return [half + rng.choice(["", "a", "x"]) + half[::-1]]
    return [half + "xy" + half]


_PAIRS = [(2, 3), (2, 5), (2, 7), (3, 4), (3, 5), (3, 7), (4, 5), (5, 6), (5, 7), (4, 7), (3, 8), (6, 7)]
_PRIME = "    if n < 2:\n        return False\n    for d in range(2, int(n ** 0.5) + 1):\n        if n % d == 0:\n            return False\n    return True"

SPECS: list[Spec] = [
    # --- level 1: one-liners
    Spec(
        "add",
        1,
        "numeric",
        "def add(a: int, b: int) -> int:",
        "Return the sum of a and b.",
        "    return a + b",
        _ints(-50, 50, 2),
    ),
    Spec(
        "is_even",
        1,
        "numeric",
        "def is_even(n: int) -> bool:",
        "Return True if n is even, otherwise False.",
        "    return n % 2 == 0",
        _ints(-20, 50),
        edges=((0,),),
    ),
    Spec(
        "max_of_list",
        1,
        "list",
        "def max_of_list(xs: list[int]) -> int:",
        "Return the largest number in the non-empty list xs.",
        "    return max(xs)",
        _list(-50, 50, 1),
        edges=(([-3, -7],),),
    ),
    Spec(
        "reverse_string",
        1,
        "string",
        "def reverse_string(s: str) -> str:",
        "Return s reversed.",
        "    return s[::-1]",
        _word,
        edges=(("",),),
    ),
    Spec(
        "square",
        1,
        "numeric",
        "def square(n: int) -> int:",
        "Return n multiplied by itself.",
        "    return n * n",
        _ints(-30, 30),
    ),
    Spec(
        "abs_diff",
        1,
        "numeric",
        "def abs_diff(a: int, b: int) -> int:",
        "Return the absolute difference between a and b.",
        "    return abs(a - b)",
        _ints(-30, 30, 2),
    ),
    Spec(
        "last_element",
        1,
        "list",
        "def last_element(xs: list[int]) -> int:",
        "Return the last element of the non-empty list xs.",
        "    return xs[-1]",
        _list(-9, 99, 1),
    ),
    Spec(
        "min_of_three",
        1,
        "numeric",
        "def min_of_three(a: int, b: int, c: int) -> int:",
        "Return the smallest of a, b and c.",
        "    return min(a, b, c)",
        _ints(-20, 20, 3),
    ),
    Spec(
        "add_k",
        1,
        "numeric",
        "def add_k(x: int) -> int:",
        "Return x plus {k}.",
        "    return x + {k}",
        _ints(-50, 50),
        lambda r: {"k": r.randint(2, 20)},
    ),
    Spec(
        "multiply",
        1,
        "numeric",
        "def multiply(x: int) -> int:",
        "Return x multiplied by {k}.",
        "    return x * {k}",
        _ints(-20, 20),
        lambda r: {"k": r.randint(2, 12)},
    ),
    Spec(
        "is_multiple",
        1,
        "numeric",
        "def is_multiple(n: int) -> bool:",
        "Return True if n is divisible by {k}, otherwise False.",
        "    return n % {k} == 0",
        _ints(0, 60),
        lambda r: {"k": r.randint(2, 12)},
        ((0,),),
    ),
    Spec(
        "is_greater",
        1,
        "numeric",
        "def is_greater(x: int) -> bool:",
        "Return True if x is greater than {k}, otherwise False.",
        "    return x > {k}",
        _ints(-20, 40),
        lambda r: {"k": r.randint(-10, 30)},
    ),
    # --- level 2: small loops and conditions
    Spec(
        "count_vowels",
        2,
        "string",
        "def count_vowels(s: str) -> int:",
        "Return the number of vowels (a, e, i, o, u, upper or lower case) in s.",
        '    return sum(1 for c in s.lower() if c in "aeiou")',
        _sentence,
        edges=(("",), ("AEIOU xyz",)),
    ),
    Spec(
        "sum_of_evens",
        2,
        "list",
        "def sum_of_evens(xs: list[int]) -> int:",
        "Return the sum of the even numbers in xs (0 if there are none).",
        "    return sum(x for x in xs if x % 2 == 0)",
        _list(-20, 30),
        edges=(([],), ([1, 3],)),
    ),
    Spec(
        "fizzbuzz",
        2,
        "string",
        "def fizzbuzz(n: int) -> str:",
        "Return 'FizzBuzz' if n is divisible by both {a} and {b}, 'Fizz' if only by {a}, 'Buzz' if only by {b}, otherwise n as a string.",
        '    if n % {a} == 0 and n % {b} == 0:\n        return "FizzBuzz"\n    if n % {a} == 0:\n        return "Fizz"\n    if n % {b} == 0:\n        return "Buzz"\n    return str(n)',
        _ints(1, 60),
        lambda r: dict(zip("ab", r.choice(_PAIRS), strict=True)),
        ((1,),),
    ),
    Spec(
        "factorial",
        2,
        "numeric",
        "def factorial(n: int) -> int:",
        "Return n! (the product 1 * 2 * ... * n); factorial(0) is 1.",
        "    result = 1\n    for i in range(2, n + 1):\n        result *= i\n    return result",
        _ints(1, 12),
        edges=((0,), (1,)),
    ),
    Spec(
        "is_palindrome",
        2,
        "string",
        "def is_palindrome(s: str) -> bool:",
        "Return True if s reads the same forwards and backwards, otherwise False.",
        "    return s == s[::-1]",
        _pal,
        edges=(("",), ("ab",)),
    ),
    Spec(
        "count_letter",
        2,
        "string",
        "def count_letter(s: str) -> int:",
        "Return how many times the lower-case letter '{c}' appears in s.",
        '    return s.count("{c}")',
        _sentence,
        lambda r: {"c": r.choice(string.ascii_lowercase)},
    ),
    Spec(
        "clamp",
        2,
        "numeric",
        "def clamp(x: int) -> int:",
        "Return {lo} if x is less than {lo}, {hi} if x is greater than {hi}, otherwise x.",
        "    return max({lo}, min({hi}, x))",
        _ints(-30, 40),
        lambda r: {"lo": r.randint(-10, 0), "hi": r.randint(5, 20)},
    ),
    Spec(
        "remove_duplicates",
        2,
        "list",
        "def remove_duplicates(xs: list[int]) -> list[int]:",
        "Return the elements of xs without repeats, keeping the first occurrence of each, in order.",
        "    out = []\n    for x in xs:\n        if x not in out:\n            out.append(x)\n    return out",
        _list(0, 5, 0, 8),
        edges=(([],),),
    ),
    Spec(
        "count_greater",
        2,
        "list",
        "def count_greater(xs: list[int]) -> int:",
        "Return how many numbers in xs are greater than {k}.",
        "    return sum(1 for x in xs if x > {k})",
        _list(-10, 30),
        lambda r: {"k": r.randint(0, 20)},
        (([],),),
    ),
    Spec(
        "capitalize_words",
        2,
        "string",
        "def capitalize_words(s: str) -> str:",
        "Return s with the first letter of every word in upper case (words are separated by single spaces).",
        '    return " ".join(w[:1].upper() + w[1:] for w in s.split(" "))',
        _sentence,
    ),
    # --- level 3: small algorithms
    Spec(
        "is_prime",
        3,
        "numeric",
        "def is_prime(n: int) -> bool:",
        "Return True if n is a prime number, otherwise False.",
        _PRIME,
        _ints(3, 100),
        edges=((0,), (1,), (2,), (91,)),
    ),
    Spec(
        "fibonacci",
        3,
        "numeric",
        "def fibonacci(n: int) -> int:",
        "Return the n-th Fibonacci number, where fibonacci(0) is 0 and fibonacci(1) is 1.",
        "    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a",
        _ints(2, 25),
        edges=((0,), (1,)),
    ),
    Spec(
        "run_length_encode",
        3,
        "string",
        "def run_length_encode(s: str) -> str:",
        "Return the run-length encoding of s: each run of a repeated character becomes the character followed by the run length, e.g. 'aaab' becomes 'a3b1'.",
        '    out = ""\n    i = 0\n    while i < len(s):\n        j = i\n        while j < len(s) and s[j] == s[i]:\n            j += 1\n        out += s[i] + str(j - i)\n        i = j\n    return out',
        _runs,
        edges=(("",),),
    ),
    Spec(
        "digit_sum",
        3,
        "numeric",
        "def digit_sum(n: int) -> int:",
        "Return the sum of the decimal digits of the non-negative integer n.",
        "    return sum(int(d) for d in str(n))",
        _ints(10, 99999),
        edges=((0,),),
    ),
    Spec(
        "second_largest",
        3,
        "list",
        "def second_largest(xs: list[int]) -> int:",
        "Return the second largest distinct value in xs (xs has at least two distinct values).",
        "    return sorted(set(xs))[-2]",
        lambda r: [[r.randint(0, 9) for _ in range(r.randint(2, 6))] + [10, 10]],
        edges=(([5, 5, 1],),),
    ),
    Spec(
        "caesar",
        3,
        "string",
        "def caesar(s: str) -> str:",
        "Shift every lower-case letter of s forward by {k} places in the alphabet, wrapping around from z to a; leave other characters unchanged.",
        '    out = ""\n    for c in s:\n        if "a" <= c <= "z":\n            c = chr((ord(c) - ord("a") + {k}) % 26 + ord("a"))\n        out += c\n    return out',
        _sentence,
        lambda r: {"k": r.randint(1, 25)},
        (("xyz!",),),
    ),
    Spec(
        "gcd",
        3,
        "numeric",
        "def gcd(a: int, b: int) -> int:",
        "Return the greatest common divisor of the positive integers a and b.",
        "    while b:\n        a, b = b, a % b\n    return a",
        lambda r: [r.randint(1, 12) * (g := r.randint(1, 9)), r.randint(1, 12) * g],
        edges=((7, 7), (1, 9)),
    ),
    Spec(
        "flatten",
        3,
        "list",
        "def flatten(xss: list[list[int]]) -> list[int]:",
        "Return all elements of the lists in xss, in order, as one list.",
        "    return [x for xs in xss for x in xs]",
        lambda r: [[[r.randint(0, 9) for _ in range(r.randint(0, 3))] for _ in range(r.randint(0, 4))]],
        edges=(([],),),
    ),
    Spec(
        "longest_word",
        3,
        "string",
        "def longest_word(s: str) -> str:",
        "Return the longest word in s (words are separated by spaces); if several are longest, return the first.",
        "    best = ''\n    for w in s.split():\n        if len(w) > len(best):\n            best = w\n    return best",
        _sentence,
    ),
    Spec(
        "collatz_steps",
        3,
        "numeric",
        "def collatz_steps(n: int) -> int:",
        "Return how many steps the rule 'n becomes n // 2 if n is even, else 3 * n + 1' takes to reach 1 from n (n >= 1).",
        "    steps = 0\n    while n != 1:\n        n = n // 2 if n % 2 == 0 else 3 * n + 1\n        steps += 1\n    return steps",
        _ints(2, 60),
        edges=((1,),),
    ),
    Spec(
        "to_binary",
        3,
        "string",
        "def to_binary(n: int) -> str:",
        "Return the binary representation of the non-negative integer n as a string, without a '0b' prefix.",
        "    return bin(n)[2:]",
        _ints(1, 300),
        edges=((0,),),
    ),
    Spec(
        "sum_multiples",
        3,
        "numeric",
        "def sum_multiples(n: int) -> int:",
        "Return the sum of all numbers from 1 to n - 1 that are divisible by {a} or {b}.",
        "    return sum(i for i in range(1, n) if i % {a} == 0 or i % {b} == 0)",
        _ints(1, 60),
        lambda r: dict(zip("ab", r.choice(_PAIRS), strict=True)),
        ((1,),),
    ),
    Spec(
        "rotate_left",
        3,
        "list",
        "def rotate_left(xs: list[int]) -> list[int]:",
        "Return xs rotated left by {k} places (elements taken from the front go to the back, cyclically); an empty list stays empty.",
        "    if not xs:\n        return []\n    k = {k} % len(xs)\n    return xs[k:] + xs[:k]",
        _list(0, 9, 1, 6),
        lambda r: {"k": r.randint(1, 6)},
        (([],),),
    ),
]
SPEC_BY_ID = {s.id: s for s in SPECS}


def function_name(spec: Spec) -> str:
    return spec.signature.split("(", 1)[0].removeprefix("def ")


def reference_source(spec: Spec, params: Mapping[str, Any]) -> str:
    doc = spec.doc.format(**params)
    return f'{spec.signature}\n    """{doc}"""\n{spec.ref.format(**params)}\n'
