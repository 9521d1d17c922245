"""Command-line options derived from config dataclasses: a default is written once, in the dataclass, and ``--help``
shows it.

A command has one root config (a dataclass of a job, possibly holding others: ``orchestra finetune`` holds a
``TeamTRConfig`` and an ``LLMTeamConfig``). The command lists the fields it exposes as :class:`Opt` (a dotted path in
the root config, and a flag name where it differs from the field's); everything else comes from the dataclass:

* the type from the annotation: ``int``/``float``/``str``, ``X | None``, ``Literal[...]`` (choices), ``tuple[X, ...]``
  (``nargs="+"``), ``bool`` (a flag that flips the default: ``--no-cache`` for ``use_cache = True``);
* the default from the root config's default instance (or a preset of it), shown in the help as ``(default: …)``;
* the help from the field's one-line doc: the comment on its line, or the comment block just above it.

The parsed defaults are wrapped (:class:`Unset`), so :func:`given` returns only what was typed on the command line:
a config file can sit between the dataclass defaults and the flags (``orchestra finetune --config``), and
:func:`build` applies the flags to any preset (``orchestra experiment chain --smoke``).

Why not tyro or simple-parsing: both derive flag names from field paths and own the parser. orchestra's flags are
short user-facing names that predate this mechanism (``--stages`` for ``trainer.num_stages``, ``--no-cache``,
``--quiet``), one parser often fills several nested configs, and the argparse tree (sub-commands, argument groups,
descriptions) stays as it is; keeping the flags with either library would take a per-field annotation in every config
of the lower layers, which must not know about the command line. This module is the whole mechanism (stdlib only).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import inspect
import io
import re
import textwrap
import tokenize
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

PREFIX = "config:"  # argparse dest of a config-backed option: PREFIX + dotted path


class ConfigError(ValueError):
    """A bad value for a config (from a flag or a config file); the message names the field."""


class Unset:
    """The default of a config-backed option: the flag was not given (its value is the config's)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __repr__(self) -> str:
        return f"Unset({self.value!r})"


@dataclass(frozen=True)
class Command:
    """One ``orchestra`` command: its line in ``orchestra --help``, what adds its options (given its parser and the
    epilog), and its handler (the parsed namespace → exit code)."""

    help: str
    build: Callable[[argparse.ArgumentParser, str], None]
    run: Callable[[argparse.Namespace], int]


@dataclass(frozen=True)
class Opt:
    """One config field exposed as a flag. Only ``path`` is needed; the rest overrides what the dataclass says."""

    path: str  # dotted path of the field in the command's root config, e.g. "trainer.num_stages"
    flag: str | None = None  # the flag; None = "--" + the field name with "-" for "_"
    help: str | None = None  # None = the field's doc comment
    choices: Sequence[Any] | None = None  # None = a Literal's values (if the field is one)
    type: Callable[[str], Any] | None = None  # parse one value; None = from the annotation (needed for unions)
    nargs: str | None = None  # None = "+" for tuples and lists, one value otherwise
    action: Literal["append"] | None = None  # "append": repeat the flag, one value each (a list / tuple field)
    metavar: str | None = None  # None = the flag's name in capitals
    also: tuple[str, ...] = ()  # more paths set to the same value (one --seed for two configs); same default
    required: bool = False  # the flag must be given (also implied by a field without a default)
    positional: bool = False  # a positional argument (named after the field) instead of a flag


# ----------------------------------------------------------------------------------------------------------------
# reading a dataclass: its fields' docs and types


def _class_source(cls: type) -> list[str]:
    try:
        return textwrap.dedent(inspect.getsource(cls)).splitlines()
    except (OSError, TypeError):
        return []


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """{field name: its one-line doc} of a dataclass (and its dataclass bases): the comment on the field's line, else
    the block of comment lines right above it."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        lines = _class_source(klass)
        comments: dict[int, str] = {}  # 0-based line → comment text
        try:
            for tok in tokenize.generate_tokens(io.StringIO("\n".join(lines) + "\n").readline):
                if tok.type == tokenize.COMMENT:
                    comments[tok.start[0] - 1] = tok.string.lstrip("#").strip()
        except (tokenize.TokenError, IndentationError):
            continue
        names = {f.name for f in dataclasses.fields(klass)}
        for i, line in enumerate(lines):
            m = re.match(r"^    (\w+)\s*:", line)
            if m is None or m.group(1) not in names or m.group(1) in docs and klass is not cls:
                continue
            name = m.group(1)
            end = i  # a declaration may continue on the next lines (a long default): its comment is on its last line
            while end + 1 < len(lines) and lines[end + 1].startswith("        ") and end not in comments:
                end += 1
            if end in comments and not lines[end].lstrip().startswith("#"):
                docs[name] = comments[end]
                continue
            above: list[str] = []
            j = i - 1
            while j >= 0 and lines[j].lstrip().startswith("#"):
                above.insert(0, comments.get(j, ""))
                j -= 1
            if above:
                docs[name] = " ".join(above)
    return docs


class Required:
    """The "value" of a field without a default: its flag is required."""

    def __repr__(self) -> str:
        return "required"


REQUIRED = Required()


def _field_value(obj: Any, name: str) -> Any:
    """The value of field ``name`` of a dataclass instance, or its default if ``obj`` is the class itself."""
    if not isinstance(obj, type):
        return getattr(obj, name)
    f = {f.name: f for f in dataclasses.fields(obj)}[name]
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return REQUIRED


def _resolve(root: Any, path: str) -> tuple[type, str, Any]:
    """(dataclass owning the field, field name, its value in ``root``) of a dotted path; ``root`` is the command's
    default config, or its class when it has required fields (their value is :data:`REQUIRED`)."""
    obj, parts = root, path.split(".")
    for i, part in enumerate(parts):
        cls = obj if isinstance(obj, type) else type(obj)
        if not dataclasses.is_dataclass(cls) or part not in {f.name for f in dataclasses.fields(cls)}:
            raise AttributeError(f"{cls.__name__} has no field {part!r} (option path {path!r})")
        if i == len(parts) - 1:
            return cls, part, _field_value(obj, part)
        obj = _field_value(obj, part)
    raise AttributeError(path)


def value_at(root: Any, path: str) -> Any:
    """The value of a dotted field path in ``root``."""
    return _resolve(root, path)[2]


def _hint(cls: type, name: str) -> Any:
    return typing.get_type_hints(cls)[name]


def _strip_none(tp: Any) -> tuple[Any, bool]:
    args = typing.get_args(tp)
    if (typing.get_origin(tp) in (typing.Union, types.UnionType)) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return (rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]), True  # noqa: UP007
    return tp, False


def _scalar(tp: Any, where: str) -> tuple[Callable[[str], Any], list[Any] | None]:
    """(parse function, choices) of a scalar annotation."""
    if typing.get_origin(tp) is Literal:
        values = list(typing.get_args(tp))
        return type(values[0]), values
    if tp in (int, float, str):
        return tp, None
    raise TypeError(f"{where}: cannot derive a command-line type from {tp!r}; give Opt(type=...)")


# ----------------------------------------------------------------------------------------------------------------
# building the parser


def format_default(value: Any) -> str:
    """How a default reads in ``--help``."""
    if isinstance(value, tuple | list):
        return " ".join(str(v) for v in value) if value else "none"
    if value is None:
        return "none"
    return str(value)


def _help(doc: str, value: Any, name: str, is_flag: bool) -> str:
    shown = f"{name}={value}" if is_flag else format_default(value)
    return f"{doc} (default: {shown})".replace("%", "%%")


def add_options(parser: Any, root: Any, opts: Iterable[str | Opt]) -> None:
    """Add one argument per option to ``parser`` (an ``ArgumentParser`` or an argument group), its type, choices,
    default and help taken from the field of ``root`` (the command's default config, or its class) at the option's
    path."""
    for item in opts:
        opt = item if isinstance(item, Opt) else Opt(item)
        cls, name, value = _resolve(root, opt.path)
        for other in opt.also:
            if _resolve(root, other)[2] != value:
                raise ValueError(f"option {opt.path}: {other} has another default ({_resolve(root, other)[2]!r})")
        flag = opt.flag or "--" + name.replace("_", "-")
        doc = opt.help or field_docs(cls).get(name) or name.replace("_", " ")
        required = opt.required or value is REQUIRED
        dest = PREFIX + "|".join((opt.path, *opt.also))
        kw: dict[str, Any] = {"dest": dest, "default": None if required else Unset(value)}
        tp, _optional = _strip_none(_hint(cls, name))
        if tp is bool:
            kw.update(action="store_const", const=not value)
            parser.add_argument(flag, help=_help(doc, value, name, True), **kw)
            continue
        origin = typing.get_origin(tp)
        many = origin in (tuple, list)
        where = f"{cls.__name__}.{name}"
        if opt.type is not None:
            parse, choices = opt.type, None
        else:
            parse, choices = _scalar(typing.get_args(tp)[0] if many else tp, where)
        if opt.action == "append":
            kw["action"] = "append"
            kw["default"] = None  # argparse appends to a copy of the default: a wrapper would not do
        elif opt.nargs is not None or many:
            kw["nargs"] = opt.nargs or "+"
        kw["choices"] = opt.choices if opt.choices is not None else choices
        kw["metavar"] = opt.metavar or (None if kw["choices"] else flag.lstrip("-").replace("-", "_").upper())
        if opt.positional:
            kw.pop("dest")
            kw["metavar"] = opt.metavar or name
            parser.add_argument(dest, type=parse, help=doc.replace("%", "%%"), **kw)
            continue
        text = f"{doc} (required)".replace("%", "%%") if required else _help(doc, value, name, False)
        parser.add_argument(flag, type=parse, help=text, required=required, **kw)


def config_actions(parser: argparse.ArgumentParser) -> list[tuple[argparse.Action, tuple[str, ...]]]:
    """(action, its dotted paths) of every config-backed option of ``parser`` (for checks and tests)."""
    return [(a, tuple(a.dest[len(PREFIX) :].split("|"))) for a in parser._actions if a.dest.startswith(PREFIX)]


# ----------------------------------------------------------------------------------------------------------------
# from the parsed namespace to a config


def given(ns: argparse.Namespace) -> dict[str, Any]:
    """{dotted path: value} of the config-backed options given on the command line (the others are left out)."""
    out: dict[str, Any] = {}
    for dest, value in vars(ns).items():
        if dest.startswith(PREFIX) and value is not None and not isinstance(value, Unset):
            for path in dest[len(PREFIX) :].split("|"):
                out[path] = value
    return out


def _coerce(cls: type, name: str, value: Any) -> Any:
    """Lists from argparse or YAML become tuples where the field is a tuple."""
    tp, _ = _strip_none(_hint(cls, name))
    if isinstance(value, list) and typing.get_origin(tp) is tuple:
        return tuple(value)
    return value


def replace_paths(root: Any, updates: Mapping[str, Any], where: str = "") -> Any:
    """``root`` with the dotted paths of ``updates`` replaced (nested ``dataclasses.replace``; the configs'
    own checks run). An unknown field is a ValueError naming ``where`` and the known fields."""
    if not updates:
        return root
    if not dataclasses.is_dataclass(root) or isinstance(root, type):
        raise ValueError(f"{where.rstrip('.')}: {type(root).__name__} has no fields to set ({sorted(updates)})")
    heads: dict[str, dict[str, Any]] = {}
    direct: dict[str, Any] = {}
    names = {f.name for f in dataclasses.fields(root)}
    for path, value in updates.items():
        head, _, rest = path.partition(".")
        if head not in names:
            raise ValueError(
                f"{where}{head}: unknown field of {type(root).__name__} (known: {', '.join(sorted(names))})"
            )
        if rest:
            heads.setdefault(head, {})[rest] = value
        else:
            direct[head] = _coerce(type(root), head, value)
    for head, sub in heads.items():
        direct[head] = replace_paths(getattr(root, head), sub, f"{where}{head}.")
    return dataclasses.replace(root, **direct)


def build(base: Any, ns: argparse.Namespace, *layers: Mapping[str, Any]) -> Any:
    """The command's config: ``base`` (a default or a preset; a class with required fields is constructed from the
    given ones), then each layer (e.g. a config file's paths), then the options given on the command line."""
    updates: dict[str, Any] = {}
    for layer in (*layers, given(ns)):
        updates.update(layer)
    try:
        if isinstance(base, type):
            required = [f.name for f in dataclasses.fields(base) if _field_value(base, f.name) is REQUIRED]
            missing = [name for name in required if name not in updates]
            if missing:
                raise ValueError(f"{base.__name__}: missing {', '.join(missing)}")
            base = base(**{name: _coerce(base, name, updates.pop(name)) for name in required})
        return replace_paths(base, updates)
    except (ValueError, TypeError) as e:  # a config's own check (the message names the field), or a bad type
        raise ConfigError(str(e)) from e


def flatten(mapping: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings (a YAML/JSON config file) → {dotted path: value} for :func:`build`; a nested config field
    given as a mapping is replaced field by field."""
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


__all__ = [
    "Command",
    "ConfigError",
    "Opt",
    "Unset",
    "add_options",
    "build",
    "config_actions",
    "field_docs",
    "flatten",
    "format_default",
    "given",
    "replace_paths",
    "value_at",
]
