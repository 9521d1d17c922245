"""Unforgeable test verdicts for code tasks: what crosses the sandbox boundary, and who decides.

Anything the harness knows inside the candidate's process (an fd number, a nonce, a captured function) the candidate
can find by frame inspection or gc, and ``==`` there would call the candidate's own ``__eq__``. So nothing in that
process is trusted: the expected values never enter it, it sends back *plain data* only (exact builtin types, size-
and depth-capped: :func:`make_plain_encoder`), on a private channel, and the verdict is taken outside it by a strict
decoder (:func:`make_plain_decoder`) and :func:`same_value`. Forging a pass then means writing the right value,
which is solving the test.

- ``code_synthesis`` (:func:`envs.tasks.code_synthesis.run_tests`): the candidate's process runs :func:`call_each`
  and writes one record per test to an unnamed file; the parent reads it with :func:`read_channel` (complete lines
  only; undecodable lines ignored; a test reported twice fails) and compares.
- assert-style tests (:func:`envs.tasks.user_data.run_asserts`): an assert holds its expected value, so the asserts
  run in a separate *test process* (:func:`run_checks`) that calls the candidate's functions through proxies over
  two pipes; the candidate's process (:func:`serve_calls`) answers with plain values. Only the test process writes
  verdicts, on a channel the candidate has no descriptor of.

The functions that run inside the sandbox are copied there as source (:func:`harness_source`), so they use builtins,
:mod:`json`, :mod:`os` and each other only. ``docs/sandbox.md`` has the whole story and what it does not cover.
"""

from __future__ import annotations

import functools
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO

from envs.tasks.sandbox import SandboxResult

MAX_VALUE_CHARS = 1_000_000  # one encoded value (a return value, or one message between two sandboxed processes)
MAX_DEPTH = 32  # nesting of lists/tuples/dicts/sets in one value


class NotPlain(ValueError):
    """A value outside the plain-data grammar (see :func:`make_plain_encoder`)."""


def make_plain_encoder(limit: int, max_depth: int) -> Callable[[object], str]:
    """An encoder of *plain data* into one line of JSON: ``None``, ``bool``, ``int``, ``float``, ``str`` and
    ``list`` as themselves, ``tuple``/``set``/``frozenset``/``dict``/``bytes`` and non-finite floats as one-key
    objects (``{"tuple": [...]}``, ``{"dict": [[k, v], ...]}``, ``{"bytes": "hex"}``, ``{"float": "nan"}``).
    Only *exact* builtin types pass (``type(x) is int``: an ``int`` or ``str`` subclass, or any object with its
    own ``__eq__``, raises :class:`NotPlain`), at most ``limit`` characters and ``max_depth`` levels. It runs no
    code of the value's (no ``__repr__``, ``__iter__``, ``__eq__``: only C-level type checks, iteration of exact
    builtin containers and ``int``/``float``/``str`` formatting), and every function it uses is bound when this
    factory runs, so a candidate that patches ``builtins`` or ``json`` afterwards changes nothing. This source
    is also copied into the sandboxed harnesses, so it uses builtins and :mod:`json` only."""
    import json as _json

    t_none, t_bool, t_int, t_float, t_str, t_bytes = type(None), bool, int, float, str, bytes
    t_list, t_tuple, t_set, t_frozenset, t_dict = list, tuple, set, frozenset, dict
    type_of, length, append, items, join = type, len, list.append, dict.items, str.join
    int_repr, float_repr, hex_of, bit_length = int.__repr__, float.__repr__, bytes.hex, int.bit_length
    quote = _json.encoder.encode_basestring_ascii  # the C function where _json is built
    name_of = type.__dict__["__name__"].__get__  # a metaclass cannot fake the name shown in the error
    reject, too_long, inf = NotPlain, ValueError, float("inf")

    def encode(value: object) -> str:
        parts: list[str] = []
        left = [limit]

        def put(s: str) -> None:
            left[0] -= length(s)
            if left[0] < 0:
                raise reject(f"larger than {limit} characters")
            append(parts, s)

        def walk(x: Any, depth: int) -> None:
            t = type_of(x)
            if t is t_none:
                put("null")
            elif t is t_bool:
                put("true" if x else "false")
            elif t is t_int:
                if bit_length(x) > 3.33 * left[0] + 4:
                    raise reject(f"larger than {limit} characters")
                try:
                    put(int_repr(x))
                except too_long:  # past sys.get_int_max_str_digits()
                    raise reject("an int with too many digits") from None
            elif t is t_float:
                put(
                    float_repr(x)
                    if x - x == 0.0
                    else '{"float":"%s"}' % ("nan" if x != x else "inf" if x == inf else "-inf")
                )
            elif t is t_str or t is t_bytes:
                if length(x) > left[0]:
                    raise reject(f"larger than {limit} characters")
                put(quote(x) if t is t_str else '{"bytes":"' + hex_of(x) + '"}')
            elif depth >= max_depth:
                raise reject(f"nested deeper than {max_depth}")
            elif t is t_list or t is t_tuple or t is t_set or t is t_frozenset:  # `is`: no metaclass __eq__ runs
                put("[" if t is t_list else '{"' + name_of(t) + '":[')
                first = True
                for e in x:
                    if not first:
                        put(",")
                    first = False
                    walk(e, depth + 1)
                put("]" if t is t_list else "]}")
            elif t is t_dict:
                put('{"dict":[')
                first = True
                for k, v in items(x):
                    put("[" if first else ",[")
                    first = False
                    walk(k, depth + 1)
                    put(",")
                    walk(v, depth + 1)
                    put("]")
                put("]}")
            else:
                raise reject(f"a {name_of(t)} is not plain data")

        walk(value, 0)
        return join("", parts)

    return encode


def make_plain_decoder(limit: int, max_depth: int) -> Callable[[str], object]:
    """The strict inverse of :func:`make_plain_encoder`: anything outside its grammar (a JSON object that is not
    exactly one known tag, ``NaN`` literals, an unhashable set element or dict key, duplicate keys, too long or
    too deep) raises :class:`NotPlain`; the result is built of exact builtin types only. Like the encoder, it
    binds what it uses when the factory runs. Also copied into the sandboxed harnesses."""
    import json as _json

    class Tagged(list):  # the key/value pairs of one JSON object
        pass

    def no_constant(name: str) -> object:
        raise reject(f"{name} is not plain data")

    raw = _json.JSONDecoder(object_pairs_hook=Tagged, parse_constant=no_constant).raw_decode
    type_of, length, t_list, t_tuple, t_set, t_frozenset = type, len, list, tuple, set, frozenset
    t_bool, t_int, t_float, t_str, fromhex, hex_of = bool, int, float, str, bytes.fromhex, bytes.hex
    reject, errors = NotPlain, (ValueError, TypeError, RecursionError)  # JSON syntax, unhashable, too deep
    specials = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf")}

    def build(x: Any, depth: int) -> object:
        t = type_of(x)
        if x is None or t is t_bool or t is t_int or t is t_float or t is t_str:
            return x
        if depth >= max_depth:
            raise reject(f"nested deeper than {max_depth}")
        if t is t_list:
            return [build(e, depth + 1) for e in x]
        if t is not Tagged or length(x) != 1:
            raise reject("not a plain-data object")
        tag, v = x[0]
        if tag == "float" and type_of(v) is t_str and v in specials:
            return specials[v]
        if tag == "bytes" and type_of(v) is t_str and hex_of(fromhex(v)) == v:
            return fromhex(v)
        if type_of(v) is not t_list:
            raise reject("not a plain-data object")
        if tag == "tuple":
            return t_tuple([build(e, depth + 1) for e in v])
        if tag in ("set", "frozenset"):
            s = t_frozenset([build(e, depth + 1) for e in v])
            if length(s) != length(v):
                raise reject("repeated set element")
            return s if tag == "frozenset" else t_set(s)
        if tag == "dict":
            d = {}
            for p in v:
                if type_of(p) is not t_list or length(p) != 2:
                    raise reject("not a plain-data dict")
                d[build(p[0], depth + 1)] = build(p[1], depth + 1)
            if length(d) != length(v):
                raise reject("repeated dict key")
            return d
        raise reject(f"unknown tag {tag!r}")

    def decode(text: str) -> object:
        if length(text) > limit:
            raise reject(f"larger than {limit} characters")
        try:
            value, end = raw(text)
            if end != length(text):
                raise reject("extra data after the value")
            return build(value, 0)
        except errors as e:
            raise reject(t_str(e)[:200]) from None

    return decode


def same_value(got: object, want: object) -> bool:
    """The verdict on one returned value (both plain data, see :func:`make_plain_decoder`): Python's ``==``,
    except that a ``bool`` only matches a ``bool`` (at any depth: ``1`` is not ``True``, ``[0]`` is not
    ``[False]``) and containers must be of the same type (a tuple is not a list, as with ``==``). ``int`` and
    ``float`` compare by value (``2.0`` matches ``2``), as an ``assert f(x) == 2`` would."""
    if type(got) is bool or type(want) is bool:
        return type(got) is type(want) and got == want
    if type(got) in (int, float) and type(want) in (int, float):
        return got == want
    if type(got) is not type(want):
        return False
    if isinstance(got, list | tuple) and isinstance(want, list | tuple):
        return len(got) == len(want) and all(same_value(g, w) for g, w in zip(got, want, strict=True))
    if isinstance(got, dict) and isinstance(want, dict):
        return got.keys() == want.keys() and all(same_value(got[k], want[k]) for k in want)
    return got == want


@functools.lru_cache(maxsize=8)
def harness_source(*functions: Callable[..., Any]) -> str:
    """The codec (and ``functions``) as source to put at the top of a sandboxed harness: the same code the
    parent uses, with the names it needs."""
    import inspect

    parts = ["from __future__ import annotations\nimport json, os\n", inspect.getsource(NotPlain)]
    parts += [inspect.getsource(f) for f in (make_plain_encoder, make_plain_decoder, *functions)]
    return "\n".join(parts)


def describe_exception(
    e: BaseException, _type: Any = type, _str: Any = str, _name: Any = type.__dict__["__name__"].__get__
) -> str:
    """One line about an exception the candidate raised (its ``__str__`` is the candidate's code; the builtins
    it uses are bound at definition, before the candidate's code runs)."""
    name = _name(_type(e))
    try:
        text = _str(e)
    except BaseException:  # a hostile __str__
        text = "?"
    return (name + ": " + text)[:300] if text else name


def line_sender(fd: int) -> Callable[[str], None]:
    """Write one line (ASCII, as the plain-data encoder makes it) to ``fd``, all of it."""
    write = os.write

    def send(text: str) -> None:
        data = (text + "\n").encode("ascii")
        while data:
            data = data[write(fd, data) :]

    return send


def line_receiver(fd: int, limit: int) -> Callable[[], str | None]:
    """Read the next line from ``fd``; None at EOF. A line longer than ``limit`` comes back as ``""`` (unreadable)
    and the stream carries on at the next line."""
    read, buf, skip = os.read, bytearray(), [False]

    def recv() -> str | None:
        while True:
            i = buf.find(b"\n")
            if i >= 0:
                line = bytes(buf[:i])
                del buf[: i + 1]
                if skip[0]:
                    skip[0] = False
                    return ""
                return line.decode("ascii", "replace")
            if len(buf) > limit:
                buf.clear()
                skip[0] = True
            chunk = read(fd, 1 << 16)
            if not chunk:
                return None
            buf.extend(chunk)

    return recv


def call_each(fd: int, code: str, name: str, calls_text: str, limit: int, max_depth: int) -> None:
    """The harness, run in the candidate's process: load ``code``, call ``name`` on each argument list and
    write one record per call to ``fd``: ``["r", i, value]``, ``["e", i, exception]``, ``["n", i, why the value is
    not plain data]``, or once ``["load_error", why]`` / ``["missing"]``. Everything it needs is bound before the
    candidate's code runs."""
    encode = make_plain_encoder(limit, max_depth)
    calls = make_plain_decoder(limit * 64, max_depth + 2)(calls_text)
    send, t_list, t_str, enum, is_callable = line_sender(fd), list, str, enumerate, callable
    run, comp, describe, reject, base = exec, compile, describe_exception, NotPlain, BaseException
    assert type(calls) is t_list
    ns: dict[str, Any] = {"__name__": "__candidate__"}
    try:
        run(comp(code, "<candidate>", "exec", dont_inherit=True), ns)
    except base as e:
        send(encode(["load_error", describe(e)]))
        return
    fn = ns.get(name)
    if not is_callable(fn):
        send(encode(["missing"]))
        return
    for i, args in enum(calls):
        try:
            r = fn(*args)
        except base as e:
            send(encode(["e", i, describe(e)]))
            continue
        try:
            line = f'["r",{i},{encode(r)}]'  # the value alone is held to the limits
        except reject as why:
            line = encode(["n", i, t_str(why)])
        send(line)


@dataclass(frozen=True)
class Report:
    """What one test's channel said: ``value`` (a return value, plain data), or ``error`` (the exception it
    raised, or with ``not_plain`` why its return value is not plain data), or ``repeated`` (more than one record
    claimed this test: it fails)."""

    value: object = None
    error: str | None = None
    not_plain: bool = False
    repeated: bool = False


def read_channel(data: bytes, total: int) -> tuple[dict[int, Report], str | None]:
    """The per-test reports (by index, ``0 <= i < total``) and the load error (``"missing"`` when the function
    is not defined) from a harness channel. Rules: only complete lines count (a run killed mid-write loses only
    its last record); a line that does not decode as plain data or has an unknown shape is ignored (it cannot
    claim anything); a test reported more than once fails (``repeated``); a load error fails every test."""
    decode = make_plain_decoder(MAX_VALUE_CHARS + 64, MAX_DEPTH + 1)
    reports: dict[int, Report] = {}
    load_error = None
    for raw in data.split(b"\n")[:-1]:
        try:
            rec = decode(raw.decode("ascii"))
        except (NotPlain, UnicodeDecodeError):
            continue
        if type(rec) is not list or not rec:
            continue
        if len(rec) == 3 and rec[0] in ("r", "e", "n") and type(rec[1]) is int and 0 <= rec[1] < total:
            i = rec[1]
            if i in reports:
                reports[i] = Report(repeated=True)
            elif rec[0] == "r":
                reports[i] = Report(value=rec[2])
            else:
                reports[i] = Report(error=str(rec[2])[:300], not_plain=rec[0] == "n")
        elif rec == ["missing"] and load_error is None:
            load_error = "missing"
        elif len(rec) == 2 and rec[0] == "load_error" and load_error is None:
            load_error = str(rec[1])[:300]
    return reports, load_error


def channel_file() -> tuple[BinaryIO, int]:
    """An unnamed temporary file (nobody can open it by path) and a duplicate of its descriptor to hand to the
    harness (``run_python(pass_fds=...)`` closes that one once the child has started)."""
    f = tempfile.TemporaryFile()  # noqa: SIM115  (the caller closes it)
    return f, os.dup(f.fileno())


def read_back(f: BinaryIO, total: int) -> bytes:
    """What the harness wrote, capped (a candidate writing garbage cannot make this process read gigabytes)."""
    f.seek(0)
    return f.read((total + 2) * (MAX_VALUE_CHARS + 80))


def why_unfinished(res: SandboxResult) -> str:
    """Why a sandboxed run left tests without a result: the limit that stopped it, its last stderr line, or
    ``"no result"`` (it exited early)."""
    err = res.stderr.strip()
    return res.killed_reason or ("crashed: " + err.splitlines()[-1] if err else "no result")


def serve_calls(rfd: int, wfd: int, setup: str, code: str, limit: int, max_depth: int) -> None:
    """The candidate process: run ``setup`` and ``code``, send ``["ready", names of the callables they define]``
    (or ``["load_error", why]``), then answer each ``["call", name, args, kwargs]`` with ``["v", value]``,
    ``["n", why the value is not plain data]`` or ``["raise", exception type, message]`` until the test process
    hangs up. Everything it needs is bound before the candidate's code runs."""
    encode, decode = make_plain_encoder(limit, max_depth), make_plain_decoder(limit + 64, max_depth + 3)
    send, recv = line_sender(wfd), line_receiver(rfd, limit + 64)
    run, comp, describe, reject, base, done = exec, compile, describe_exception, NotPlain, BaseException, os._exit
    t_str, t_list, type_of, is_callable, name_of = str, list, type, callable, type.__dict__["__name__"].__get__
    ns: dict[str, Any] = {"__name__": "__candidate__"}
    try:
        run(comp(setup, "<setup>", "exec", dont_inherit=True), ns)
        run(comp(code, "<candidate>", "exec", dont_inherit=True), ns)
        names = [k for k, v in t_list(ns.items()) if type_of(k) is t_str and is_callable(v)]
        hello = encode(["ready", names])
    except reject:
        hello = encode(["ready", []])
    except base as e:
        send(encode(["load_error", describe(e)]))
        return
    send(hello)
    while True:
        line = recv()
        if line is None:
            done(0)  # the test process is finished: do not wait for the candidate's threads
        request: Any = decode(line)  # ["call", name, args, kwargs] from the test process (ours)
        _, name, args, kwargs = request
        try:
            r = ns[name](*args, **kwargs)
        except base as e:
            text, kind = describe(e), name_of(type_of(e))
            send(encode(["raise", kind, text[len(kind) + 2 :] if text.startswith(kind + ": ") else ""]))
            continue
        try:
            reply = f'["v",{encode(r)}]'  # the value alone is held to the limits
        except reject as why:
            reply = encode(["n", t_str(why)])
        send(reply)


def run_checks(
    rfd: int,
    wfd: int,
    out: int,
    setup: str,
    tests: list[str],
    entry: str | None,
    helpers: list[str],
    limit: int,
    max_depth: int,
) -> None:
    """The test process: run ``setup``, bind a proxy for ``entry`` and for each of ``helpers`` that the candidate
    defines and the setup does not bind (see :func:`envs.tasks.user_data.helper_names`), then run each test and write ``["r", i,
    True]`` or ``["e", i, why]`` to ``out``. When the candidate's process ends it stops: the remaining tests did
    not finish."""
    import builtins

    encode, decode = make_plain_encoder(limit + 64, max_depth + 3), make_plain_decoder(limit + 64, max_depth + 1)
    send, recv, report = line_sender(wfd), line_receiver(rfd, limit + 64), line_sender(out)
    errors = {k: v for k, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, Exception)}

    def candidate_gone() -> None:
        os._exit(0)

    def proxy(name: str) -> Callable[..., object]:
        def call(*args: object, **kwargs: object) -> object:
            try:
                text = encode(["call", name, list(args), kwargs])
            except NotPlain as why:
                raise TypeError(f"{name}() was called with an argument that is not plain data: {why}") from None
            try:
                send(text)
            except OSError:
                candidate_gone()
            line = recv()
            if line is None:
                candidate_gone()
            try:
                reply = decode(line or "")
            except NotPlain as why:
                raise TypeError(f"{name}() returned a value that is not plain data: {why}") from None
            if type(reply) is list and len(reply) == 2 and reply[0] == "v":
                return reply[1]
            if type(reply) is list and len(reply) == 2 and reply[0] == "n":
                raise TypeError(f"{name}() returned a value that is not plain data: {str(reply[1])[:200]}")
            if type(reply) is list and len(reply) == 3 and type(reply[1]) is str and type(reply[2]) is str:
                kind, message = reply[1], reply[2][:300]
                if reply[0] == "raise" and kind in errors:
                    raise errors[kind](message)  # a builtin exception: a test may expect it (`except ValueError`)
                raise RuntimeError((f"{kind}: {message}" if message else kind)[:300])
            raise TypeError(f"{name}() sent an unreadable reply")

        call.__name__ = call.__qualname__ = name
        return call

    hello = recv()
    if hello is None:
        report(encode(["load_error", "the code's process ended while loading (an exit in its body, or a limit)"]))
        return
    try:
        first = decode(hello)
    except NotPlain:
        first = None
    if type(first) is list and len(first) == 2 and first[0] == "load_error":
        report(encode(["load_error", str(first[1])[:300]]))
        return
    if not (type(first) is list and len(first) == 2 and first[0] == "ready" and type(first[1]) is list):
        report(encode(["load_error", "the code's process sent an unreadable greeting"]))
        return
    defined = {n for n in first[1] if type(n) is str}
    ns: dict[str, Any] = {"__name__": "__test__"}
    try:
        exec(compile(setup, "<setup>", "exec", dont_inherit=True), ns)
    except BaseException as e:
        report(encode(["load_error", "the test setup fails: " + describe_exception(e)]))
        return
    for n in helpers:  # only where the setup did not bind the name: a reference helper of the setup stays ours
        if n in defined and n not in ns:
            ns[n] = proxy(n)
    if entry is not None and entry in defined:  # the function under test is always the candidate's
        ns[entry] = proxy(entry)
    for i, t in enumerate(tests):
        try:
            exec(compile(t, f"<test {i + 1}>", "exec", dont_inherit=True), ns)
        except AssertionError:
            report(encode(["e", i, "assertion failed"]))
        except BaseException as e:
            report(encode(["e", i, describe_exception(e)]))
        else:
            report(encode(["r", i, True]))
