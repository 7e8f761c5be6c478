"""Typed configuration: dataclasses filled from an optional YAML file, then from the command line.

Every entry script declares its arguments as dataclasses and calls :func:`parse_config`. The
precedence is: dataclass defaults < ``--config file.yaml`` < command-line flags. Unknown YAML keys
are an error that names the file and the key, so a typo can never be silently ignored.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any, Sequence, TypeVar

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration file or value that cannot be used; the message names the file and key."""


def load_yaml_mapping(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from err
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of option names to values")
    return data


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Show defaults, and keep the description's line breaks (scripts put usage examples there)."""


def parse_config(dataclass_types: Sequence[type], argv: Sequence[str] | None = None,
                 description: str | None = None) -> tuple[Any, ...]:
    """Parse ``argv`` into instances of ``dataclass_types`` (YAML file first, flags override it)."""
    from transformers import HfArgumentParser  # heavy import: only when a script actually parses

    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", default=None)
    known, _ = pre.parse_known_args(argv)

    parser = HfArgumentParser(dataclass_types, description=description, formatter_class=_HelpFormatter)
    parser.add_argument("--config", default=None, help="YAML file with option values; flags override it")
    if known.config:
        values = load_yaml_mapping(known.config)
        field_names = {f.name for dc in dataclass_types for f in dataclasses.fields(dc)}
        unknown = sorted(set(values) - field_names)
        if unknown:
            raise ConfigError(f"{known.config}: unknown option(s) {', '.join(unknown)}; "
                              f"valid options are: {', '.join(sorted(field_names))}")
        parser.set_defaults(**values)
        # A required option that the YAML file provides is no longer required on the command line.
        for action in parser._actions:
            if action.dest in values:
                action.required = False
    parsed = parser.parse_args(argv)
    outputs = []
    for dc in dataclass_types:
        names = {f.name for f in dataclasses.fields(dc) if f.init}
        outputs.append(dc(**{k: v for k, v in vars(parsed).items() if k in names}))
    return tuple(outputs)


def to_dict(*configs: Any) -> dict[str, Any]:
    """Merge dataclass instances into one plain dict (for run records and summaries)."""
    merged: dict[str, Any] = {}
    for cfg in configs:
        merged.update(dataclasses.asdict(cfg))
    return merged
