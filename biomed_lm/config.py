"""Typed configuration: dataclasses filled from an optional YAML file, then from the command line.

Every entry script declares its arguments as dataclasses and calls :func:`parse_config`. The
precedence is: dataclass defaults < ``--config file.yaml`` < command-line flags. Unknown YAML keys
are an error that names the file and the key, so a typo can never be silently ignored.

Every value is then checked against its field's annotation, whether it came from the YAML file or
a flag (YAML values never pass through argparse's conversion, so they are checked as they are):

* ``bool`` takes true/false only (not 1 or "yes"); ``int`` whole numbers only (not true, not 1.0);
  ``float`` ints and floats (not true; not NaN or infinite; a YAML 1.2 float such as ``1e-4``,
  which PyYAML reads as text, is accepted); ``str`` text only;
* ``Optional[X]`` also takes null; ``list[X]`` and ``tuple[X, ...]`` check every item;
  ``dict[K, V]`` every key and value; ``Literal[...]`` one of its choices (flags get them as
  argparse ``choices``, listed in ``--help``).

Numeric ranges are written in the field's metadata beside ``help``::

    checkpoint_every: int = field(default=500, metadata={"help": "...", "min": 1})
    warmup_ratio: float = field(default=0.1, metadata={"help": "...", "min": 0, "lt": 1})

``min``/``max`` are inclusive bounds, ``gt``/``lt`` exclusive ones (see :data:`RANGE_KEYS`). They
apply to a number and to each number of a list, never to null, and ``--help`` shows them. A
violation is a :class:`ConfigError` naming where the value came from, the value and what is allowed:
``configs/x.yaml: precision: 'fp4' is not one of fp32, fp16, bf16, fp8`` or
``--checkpoint_every: 0 is out of range: must be >= 1``.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import logging
import math
import pathlib
import re
import types
import typing
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, Sequence, TypeVar, Union

import yaml

from biomed_lm.errors import ConfigError
from biomed_lm.resources import places_looked, resolve_path

T = TypeVar("T")

#: Range keys of a field's metadata: ``min``/``max`` inclusive, ``gt``/``lt`` exclusive.
RANGE_KEYS = ("min", "max", "gt", "lt")
#: A renamed field's metadata key holding its old name: the YAML key and the flags (``--nsp``, and
#: ``--no-nsp`` for a bool that defaults to true) are still read as the field's.
OLD_NAME = "old_name"


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader refusing a key given twice in one mapping: PyYAML keeps the last value without a
    word (QA, 2026-11-28: micro_batch_size: 16, then 8, ran with 8)."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"{key!r} is given twice (lines {seen[key]} and {line}): which one is meant?",
                    key_node.start_mark)
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def load_yaml_mapping(path: str | Path) -> dict[str, Any]:
    """The YAML mapping in ``path`` (a shipped config such as ``configs/pretrain/demo.yaml`` is found
    from any working directory, see :func:`biomed_lm.resources.resolve_path`)."""
    path = resolve_path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}{places_looked(path)}")
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from err
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of option names to values")
    return data


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Show defaults, and keep the description's line breaks (scripts put usage examples there). A
    ``--no_<name>`` flag's default is its ``--<name>``'s, shown there. A help text that says its own default,
    and an empty or None default (which says nothing), gets no "(default: ...)" (QA: "(default:
    <ablation_dir>/report) (default: None)", and "(default: )" on an option that must be given)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        default = action.default.value if isinstance(action.default, _Unparsed) else action.default
        if isinstance(action, argparse._StoreFalseAction) or default is None or default == "" \
                or "(default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


# ------------------------------------------------------------------------------ value checks

_NONE = type(None)
_YAML12_FLOAT = re.compile(r"[-+]?(\d+(\.\d*)?|\.\d+)[eE][-+]?\d+")  # 1e-4: text to PyYAML, a float to YAML 1.2


class _Invalid(Exception):
    """A value that does not fit its annotation; the message says why (without the source)."""


def _show(value: Any) -> str:
    """A value as the message shows it: YAML's spelling for true/false/null, repr for the rest."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return repr(value)


def describe_range(metadata: Mapping[str, Any]) -> str:
    """The range that ``metadata``'s ``min``/``max``/``gt``/``lt`` keys allow, e.g. ``>= 1`` or ``in [0, 1)``."""
    low = ("[", metadata["min"]) if "min" in metadata else ("(", metadata["gt"]) if "gt" in metadata else None
    high = ("]", metadata["max"]) if "max" in metadata else (")", metadata["lt"]) if "lt" in metadata else None
    if low and high:
        return f"in {low[0]}{low[1]}, {high[1]}{high[0]}"
    if low:
        return f"{'>=' if low[0] == '[' else '>'} {low[1]}"
    if high:
        return f"{'<=' if high[0] == ']' else '<'} {high[1]}"
    return ""


def _is_union(origin: Any) -> bool:
    return origin is Union or origin is types.UnionType


def describe_type(annotation: Any) -> str:
    """What ``annotation`` allows, in words (for messages)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is Any:
        return "any value"
    if origin is Literal:
        return "one of " + ", ".join(str(choice) for choice in args)
    if _is_union(origin):
        words = " or ".join(describe_type(arg) for arg in args if arg is not _NONE)
        return words + (" or null" if _NONE in args else "")
    if annotation is bool:
        return "true or false"
    if annotation is int:
        return "an integer"
    if annotation is float:
        return "a number"
    if annotation is str:
        return "a string"
    if origin in (list, tuple) or annotation in (list, tuple):
        plural = {str: "strings", int: "integers", float: "numbers", bool: "true/false values"}
        if not args or args[0] is Any:
            return "a list"
        return f"a list of {plural[args[0]]}" if args[0] in plural else f"a list (items: {describe_type(args[0])})"
    if origin is dict or annotation is dict:
        return "a mapping"
    return f"a {getattr(annotation, '__name__', annotation)}"


def _coerce(value: Any, annotation: Any) -> Any:
    """``value`` checked against ``annotation`` (an int becomes a float for a float field); raises _Invalid."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is Any or annotation is object:
        return value
    if origin is Literal:
        return _coerce_literal(value, args)
    if _is_union(origin):
        return _coerce_union(value, annotation, args)
    if origin in (list, tuple) or annotation in (list, tuple):
        return _coerce_sequence(value, annotation, origin, args)
    if origin is dict or annotation is dict:
        return _coerce_mapping(value, annotation, args)
    if annotation is float:
        return _coerce_float(value)
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        try:
            return annotation(value)
        except ValueError:
            raise _Invalid(f"{_show(value)} is not one of "
                           f"{', '.join(str(member.value) for member in annotation)}") from None
    if not isinstance(annotation, type):
        return value  # a typing construct without a runtime check
    if issubclass(annotation, pathlib.PurePath) and isinstance(value, (str, pathlib.PurePath)):
        return annotation(value)
    if isinstance(value, annotation) and not (annotation is int and isinstance(value, bool)):
        return value  # bool is an int to Python, not to a config
    raise _Invalid(f"{_show(value)} is not {describe_type(annotation)}")


def _coerce_literal(value: Any, choices: tuple) -> Any:
    for choice in choices:  # type and value: True is not the choice 1, nor 1.0 the choice 1
        if type(value) is type(choice) and value == choice:
            return choice
    raise _Invalid(f"{_show(value)} is not one of {', '.join(str(choice) for choice in choices)}")


def _coerce_union(value: Any, annotation: Any, args: tuple) -> Any:
    if value is None and _NONE in args:
        return None
    alternatives = [arg for arg in args if arg is not _NONE]
    for alternative in alternatives:
        try:
            return _coerce(value, alternative)
        except _Invalid as err:
            reason = err
    if len(alternatives) == 1 and str(reason) != f"{_show(value)} is not {describe_type(alternatives[0])}":
        raise reason  # a specific reason (an item of a list, a non-finite number) says more
    raise _Invalid(f"{_show(value)} is not {describe_type(annotation)}")


def _coerce_float(value: Any) -> float:
    number = value
    if isinstance(value, str) and _YAML12_FLOAT.fullmatch(value.strip()):
        number = float(value)
    if isinstance(number, (int, float)) and not isinstance(number, bool):
        if not math.isfinite(number):
            raise _Invalid(f"{_show(value)} is not a finite number")
        return float(number)
    raise _Invalid(f"{_show(value)} is not {describe_type(float)}")


def _coerce_sequence(value: Any, annotation: Any, origin: Any, args: tuple) -> list | tuple:
    if not isinstance(value, (list, tuple)):
        raise _Invalid(f"{_show(value)} is not {describe_type(annotation)}")
    if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
        if len(value) != len(args):
            raise _Invalid(f"{_show(value)} is not a list of {len(args)} items")
        kinds = args
    else:
        kinds = [args[0] if args else Any] * len(value)
    items = []
    for index, (item, kind) in enumerate(zip(value, kinds), 1):
        try:
            items.append(_coerce(item, kind))
        except _Invalid as err:
            raise _Invalid(f"item {index} of {_show(list(value))}: {err}") from None
    return tuple(items) if (origin or annotation) is tuple else items


def _coerce_mapping(value: Any, annotation: Any, args: tuple) -> dict:
    if not isinstance(value, dict):
        raise _Invalid(f"{_show(value)} is not {describe_type(annotation)}")
    if not args:
        return value
    checked = {}
    for key, item in value.items():
        try:
            checked[_coerce(key, args[0])] = _coerce(item, args[1])
        except _Invalid as err:
            raise _Invalid(f"key {_show(key)}: {err}") from None
    return checked


def _check_range(value: Any, metadata: Mapping[str, Any]) -> None:
    bounds = {key: metadata[key] for key in RANGE_KEYS if key in metadata}
    if not bounds or value is None:
        return
    for item in value if isinstance(value, (list, tuple)) else [value]:
        if isinstance(item, bool) or not isinstance(item, (int, float)):
            continue
        if ("min" in bounds and not item >= bounds["min"]) or ("max" in bounds and not item <= bounds["max"]) \
                or ("gt" in bounds and not item > bounds["gt"]) or ("lt" in bounds and not item < bounds["lt"]):
            shown = _show(value) if item is value else f"{_show(item)} (in {_show(list(value))})"
            raise _Invalid(f"{shown} is out of range: must be {describe_range(bounds)}")


def check_value(value: Any, annotation: Any, metadata: Mapping[str, Any] | None = None, *, source: str) -> Any:
    """``value`` checked against a field's ``annotation`` and the range in its ``metadata``; returns it
    (ints for float fields become floats) or raises :class:`ConfigError` starting with ``source``."""
    try:
        value = _coerce(value, annotation)
        _check_range(value, metadata or {})
    except _Invalid as err:
        raise ConfigError(f"{source}: {err}") from None
    return value


def check_fields(dataclass_type: type, values: Mapping[str, Any],
                 source: str | Callable[[str], str] = "") -> dict[str, Any]:
    """Check ``values`` (field name -> value, a subset of ``dataclass_type``'s fields) against the
    fields' annotations and ranges. ``source`` names where they came from: a prefix such as
    ``"configs/x.yaml: pretrain"`` (messages read ``<prefix>.<name>: ...``), or a function of the name."""
    hints = typing.get_type_hints(dataclass_type)  # resolves `from __future__ import annotations`
    fields = {f.name: f for f in dataclasses.fields(dataclass_type)}
    checked = {}
    for name, value in values.items():
        if name not in fields:
            checked[name] = value  # unknown names are the caller's to report
            continue
        where = source(name) if callable(source) else (f"{source}.{name}" if source else name)
        checked[name] = check_value(value, hints[name], fields[name].metadata, source=where)
    return checked


@functools.cache
def _parser_class() -> type:
    """HfArgumentParser keeping the range keys out of argparse (HfArgumentParser hands a field's
    metadata to ``add_argument``) and showing them in the help instead. Built on first use:
    transformers is a heavy import."""
    from transformers import HfArgumentParser

    class RangeAwareParser(HfArgumentParser):
        @staticmethod
        def _parse_dataclass_field(parser, field):
            field = copy.copy(field)  # HfArgumentParser edits field.type; leave the class's field alone
            metadata = {k: v for k, v in field.metadata.items() if k not in RANGE_KEYS and k != OLD_NAME}
            bounds = describe_range(field.metadata)
            if bounds:
                metadata["help"] = f"{metadata['help']}; {bounds}" if metadata.get("help") else bounds
            old = field.metadata.get(OLD_NAME)
            if old:
                metadata["aliases"] = [*metadata.get("aliases", ()), *_flags(old)]
            field.metadata = types.MappingProxyType(metadata)
            optional = _NONE in typing.get_args(field.type)
            HfArgumentParser._parse_dataclass_field(parser, field)
            if optional:  # null on the command line too, as in YAML and as --help says ("null: all")
                for action in parser._actions:
                    if action.dest == field.name and action.type is not None:
                        action.type = _or_null(action.type)
            if field.default is True:  # HfArgumentParser gives its --no_<name> the field's own help, word for word
                for action in parser._actions:
                    if f"--no_{field.name}" in action.option_strings:
                        action.help = f"the same as --{field.name} false"
            if old and field.default is True:  # HfArgumentParser's --no-<name> for the old name too
                parser.add_argument(*_flags(f"no_{old}"), action="store_false", dest=field.name, help=argparse.SUPPRESS)

    return RangeAwareParser


def _or_null(convert: Callable[[str], Any]) -> Callable[[str], Any]:
    """A flag's conversion that also reads ``null`` (YAML's spelling, which ``--help`` uses) as None."""
    def converted(text: str) -> Any:
        return None if text == "null" else convert(text)
    converted.__name__ = getattr(convert, "__name__", "value")  # argparse names it in "invalid int value"
    return converted


def _flags(name: str) -> list[str]:
    return list(dict.fromkeys([f"--{name}", f"--{name.replace('_', '-')}"]))


def _read_old_names(values: dict[str, Any], dataclass_types: Sequence[type], path: str) -> dict[str, str]:
    """Move a YAML file's values given under a field's old name (:data:`OLD_NAME`) to its name;
    returns the key each field's value was given under."""
    keys = {name: name for name in values}
    for f in (f for dc in dataclass_types for f in dataclasses.fields(dc) if f.metadata.get(OLD_NAME) in values):
        old = f.metadata[OLD_NAME]
        if f.name in values:
            raise ConfigError(f"{path}: {old} is the old name of {f.name}: give one of them")
        values[f.name], keys[f.name] = values.pop(old), old
    return keys


@dataclasses.dataclass(frozen=True)
class _Unparsed:
    """A default (from the YAML file or the dataclass) wrapped so that argparse leaves it alone (it
    converts text defaults with the flag's type), with where it came from. A value that is not
    wrapped after parsing came from a flag."""

    value: Any
    source: str

    def __str__(self) -> str:  # --help shows the default
        return str(self.value)


def unknown_keys_message(given: Any, valid: Sequence[str], where: str, what: str = "key(s)",
                         section: str = "") -> str | None:
    """The one wording of keys a configuration does not know (None when every key is known): each named,
    with the nearest valid one when one is close (a typo), then the valid keys in ``valid``'s order."""
    import difflib

    unknown = sorted(set(given) - set(valid), key=str)
    if not unknown:
        return None
    near = {key: difflib.get_close_matches(str(key), list(valid), n=1) for key in unknown}
    named = ", ".join(f"{key} (did you mean {near[key][0]}?)" if near[key] else str(key) for key in unknown)
    under = f" under {section}:" if section else ""
    return f"{where}: unknown {what}{under} {named}; valid: {', '.join(valid)}"


def parse_config(dataclass_types: Sequence[type], argv: Sequence[str] | None = None,
                 description: str | None = None) -> tuple[Any, ...]:
    """Parse ``argv`` into instances of ``dataclass_types`` (YAML file first, flags override it).

    Every value is checked against its field's annotation and range (see the module docstring)
    before the dataclasses are built; a bad one raises :class:`ConfigError` naming the YAML file
    and key, or the flag. Errors argparse finds itself (a bad choice or number given as a flag, an
    unknown flag) exit with status 2 and argparse's message, as usual."""
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--config", default=None)
    known, _ = pre.parse_known_args(argv)

    # No abbreviations: --learning_rat was taken as --learning_rate (QA), and a flag added later would change
    # what a shortened one means.
    parser = _parser_class()(dataclass_types, description=description, formatter_class=_HelpFormatter,
                             allow_abbrev=False)
    parser.add_argument("--config", default=None, help="YAML file with option values; flags override it")
    values: dict[str, Any] = {}
    keys: dict[str, str] = {}
    if known.config:
        values = load_yaml_mapping(known.config)
        keys = _read_old_names(values, dataclass_types, known.config)
        field_names = {f.name for dc in dataclass_types for f in dataclasses.fields(dc)}
        unknown = unknown_keys_message(values, sorted(field_names), known.config, "option(s)")
        if unknown:
            raise ConfigError(unknown)
        # A required option that the YAML file provides is no longer required on the command line.
        for action in parser._actions:
            if action.dest in values:
                action.required = False
    defaults = {}
    for dc in dataclass_types:
        for f in dataclasses.fields(dc):
            if not f.init:
                continue
            if f.name in values:
                defaults[f.name] = _Unparsed(values[f.name], f"{known.config}: {keys[f.name]}")
            elif f.default is not dataclasses.MISSING:
                defaults[f.name] = _Unparsed(f.default, f"{f.name} (the default of {dc.__name__})")
            elif f.default_factory is not dataclasses.MISSING:
                defaults[f.name] = _Unparsed(f.default_factory(), f"{f.name} (the default of {dc.__name__})")
    parser.set_defaults(**defaults)
    parsed = vars(parser.parse_args(argv))
    outputs = []
    for dc in dataclass_types:
        hints = typing.get_type_hints(dc)  # the annotations, resolved (HfArgumentParser edits field.type)
        kwargs = {}
        for f in dataclasses.fields(dc):
            if not f.init or f.name not in parsed:
                continue
            given = parsed[f.name]
            value, source = (given.value, given.source) if isinstance(given, _Unparsed) else (given, f"--{f.name}")
            kwargs[f.name] = check_value(value, hints[f.name], f.metadata, source=source)
            if not isinstance(given, _Unparsed) and f.name in values:
                _warn_if_overridden_value_is_bad(values[f.name], hints[f.name], f, f"{known.config}: {keys[f.name]}")
        outputs.append(dc(**kwargs))
    return tuple(outputs)


def _warn_if_overridden_value_is_bad(value: Any, hint: Any, f: dataclasses.Field, source: str) -> None:
    """A flag replaced a YAML value, and only the flag's value is used: a bad value left in the file is
    still named (the next run without the flag would stop on it)."""
    try:
        check_value(value, hint, f.metadata, source=source)
    except ConfigError as err:
        logging.getLogger(__name__).warning("%s (not used here: --%s replaces it; fix the file)", err, f.name)


def to_dict(*configs: Any) -> dict[str, Any]:
    """Merge dataclass instances into one plain dict (for run records and summaries)."""
    merged: dict[str, Any] = {}
    for cfg in configs:
        merged.update(dataclasses.asdict(cfg))
    return merged
