"""``ablation.json``: the record of an ablation, in one versioned schema with one writer and one reader.

:func:`experiments.ablation.run_ablation` writes it (:func:`write_ablation_record`) when it starts
and again when the fine-tuning sweeps are done; :mod:`experiments.report` reads it
(:func:`load_ablation_record`). Schema version 2::

    {
      "schema_version": 2,
      "name": "vocab_x_masking",  "source": "configs/ablation/tiny.yaml",
      "factors": {"vocabulary": ["general", "in-domain"], ...},        # every factor; first level = reference
      "variants": {
        "in-domain_whole-word": {
          "factors": {"vocabulary": "in-domain", ...},                 # one level of each factor
          "checkpoints": [                                             # one per pretraining run
            {"run": 1, "seed": 42, "model": ".../pretrain/model",     # the last phase's export
             "pretrain_dir": ".../pretrain", "finetune_dir": ".../finetune"},
            {"run": 2, "seed": 43, ...}]}},
      "pretrain_seeds": 2,
      "analysis": {"specification": "checkpoints"},                    # experiments.choices.Specification
      "datasets": ["ncbi-disease"],  "budget": {...},  "finetune": {...},
      "excluded": ["in-domain_continual: left out (...)"],
      "failed": null                                                  # null until the sweeps end, then a list
    }

Directories are written as the runner saw them (absolute, or relative to where it was started);
the report resolves them. Version 1 is the unversioned file ``launch/ablate.py`` wrote before, in
two shapes: each variant with its first run's ``model``/``pretrain_dir``/``finetune_dir`` and, from
``pretrain_seeds`` on, a ``checkpoints`` list as above; without that list the variant had one
pretraining run. :func:`load_ablation_record` reads both shapes into the same
:class:`AblationRecord`, and refuses anything else with :class:`AblationError` naming the file and
the field.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, get_args

from biomed_lm.atomic_files import write_json_atomically
from biomed_lm.errors import ExperimentError
from biomed_lm.experiments.choices import SPECIFICATIONS, Specification
from biomed_lm.resources import read_json_object

__all__ = ["ABLATION_FILE", "SCHEMA_VERSION", "AblationError", "CheckpointRecord", "VariantRecord", "AblationRecord",
           "write_ablation_record", "load_ablation_record", "run_suffix"]

ABLATION_FILE = "ablation.json"
SCHEMA_VERSION = 2
_REGENERATE = ("re-run launch/ablate.py with the ablation's config to rewrite it (finished steps are skipped, "
               "so only the record is rewritten)")


def run_suffix(run: int) -> str:
    """The suffix of pretraining run ``run``'s directories (``pretrain<suffix>``,
    ``finetune<suffix>``): run 1 keeps the single-run layout; run k > 1 (``pretrain_seeds``) gets
    ``-run<k>``. The report looks there when a record names no directory."""
    return "" if run == 1 else f"-run{run}"


class AblationError(ExperimentError, ValueError):
    """An ablation record (or directory) that cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class CheckpointRecord:
    """One pretraining run of a variant and its fine-tuning sweep ("" where a version-1 record did
    not say: the report then looks in the standard layout)."""

    run: int
    seed: int | None = None
    model: str = ""          # the last phase's exported model
    pretrain_dir: str = ""   # the first phase's run directory (metrics.jsonl)
    finetune_dir: str = ""   # the sweep's directory (run.json files below it)


@dataclass(frozen=True)
class VariantRecord:
    """A variant's level of each factor and its pretraining runs (``run`` 1, 2, ...)."""

    factors: dict[str, str]
    checkpoints: tuple[CheckpointRecord, ...]

    @property
    def model(self) -> str:
        """The first pretraining run's model."""
        return self.checkpoints[0].model


@dataclass
class AblationRecord:
    """The record of an ablation (the module docstring has the JSON)."""

    name: str
    factors: dict[str, list[str]]
    variants: dict[str, VariantRecord]
    datasets: list[str] = field(default_factory=list)
    budget: dict[str, Any] = field(default_factory=dict)
    pretrain_seeds: int = 1
    specification: Specification = SPECIFICATIONS[0]
    finetune: dict[str, Any] = field(default_factory=dict)
    excluded: list[str] = field(default_factory=list)
    failed: list[str] | None = None  # None: the fine-tuning sweeps have not finished
    source: str = ""
    schema_version: int = SCHEMA_VERSION  # the version read (what is written is always SCHEMA_VERSION)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of schema version :data:`SCHEMA_VERSION`."""
        return {
            "schema_version": SCHEMA_VERSION, "name": self.name, "source": self.source,
            "factors": {f: list(levels) for f, levels in self.factors.items()},
            "variants": {name: {"factors": dict(v.factors),
                                "checkpoints": [dataclasses.asdict(c) for c in v.checkpoints]}
                         for name, v in self.variants.items()},
            "pretrain_seeds": self.pretrain_seeds, "analysis": {"specification": self.specification},
            "datasets": list(self.datasets), "budget": self.budget, "finetune": self.finetune,
            "excluded": list(self.excluded), "failed": None if self.failed is None else list(self.failed),
        }


#: The top-level fields of the current schema, in the order they are written.
_TOP_FIELDS = tuple(AblationRecord(name="", factors={}, variants={}).to_dict())


def write_ablation_record(record: AblationRecord, directory: str | os.PathLike) -> Path:
    """Write ``<directory>/ablation.json`` (atomically: a reader never sees half a file)."""
    path = Path(directory) / ABLATION_FILE
    write_json_atomically(path, record.to_dict())
    return path


# ---------------------------------------------------------------------------------- reading

class _Fields:
    """Typed access to a record's fields; a wrong one raises :class:`AblationError` naming the file
    and the field (``variants.v.checkpoints[0].run``)."""

    def __init__(self, path: Path):
        self.path = path

    def error(self, name: str, problem: str) -> AblationError:
        return AblationError(f"{self.path}: field '{name}': {problem}")

    def object(self, value: Any, name: str, *, required: bool = True) -> dict[str, Any]:
        if value is None and not required:
            return {}
        if not isinstance(value, dict):
            raise self.error(name, f"expected an object, got {_shown(value)}")
        return value

    def strings(self, value: Any, name: str, *, required: bool = False) -> list[str]:
        if value is None and not required:
            return []
        if not isinstance(value, list) or not all(isinstance(v, (str, int, float)) for v in value):
            raise self.error(name, f"expected a list of names, got {_shown(value)}")
        return [str(v) for v in value]

    def integer(self, value: Any, name: str, *, minimum: int | None = None) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or (minimum is not None and value < minimum):
            raise self.error(name, f"expected a whole number{f' ≥ {minimum}' if minimum is not None else ''}, "
                                   f"got {_shown(value)}")
        return value

    def string(self, value: Any, name: str) -> str:
        if value is None:
            return ""
        if not isinstance(value, str):
            raise self.error(name, f"expected a string, got {_shown(value)}")
        return value


def _shown(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, (set, tuple)) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise AblationError(f"{path}: not found (is {path.parent} an ablation directory written by "
                            f"launch/ablate.py?)")
    return read_json_object(path, AblationError)


def _schema_version(plan: Mapping[str, Any], fields: _Fields) -> int:
    if "schema_version" not in plan:
        return 1
    version = fields.integer(plan["schema_version"], "schema_version", minimum=1)
    if version > SCHEMA_VERSION:
        raise fields.error("schema_version", f"{version} is newer than this biomed-lm reads (up to "
                                             f"{SCHEMA_VERSION}): upgrade biomed-lm, or {_REGENERATE}")
    return version


def load_ablation_record(path: str | os.PathLike) -> AblationRecord:
    """Read and check an ``ablation.json`` (or the one in a directory) of schema version 1 or 2.

    Raises :class:`AblationError` naming the file and the field: missing or unreadable file, a
    field of the wrong type, a variant without a level of some factor or with a level not among
    its factor's, two pretraining runs with the same number, a schema version newer than this code.
    """
    path = Path(path)
    if path.is_dir():
        path = path / ABLATION_FILE
    plan = _read_json(path)
    fields = _Fields(path)
    version = _schema_version(plan, fields)
    unknown = sorted(set(plan) - set(_TOP_FIELDS)) if version == SCHEMA_VERSION else []
    if unknown:
        raise fields.error(unknown[0], f"not a field of schema version {SCHEMA_VERSION} (fields: "
                                       f"{', '.join(_TOP_FIELDS)})")
    variants_in = plan.get("variants")
    if not isinstance(variants_in, dict) or not variants_in:
        raise fields.error("variants", f"expected a non-empty object of variant name -> factors and checkpoints, "
                                       f"got {_shown(variants_in)}")
    factors = _factors(plan, variants_in, fields, version)
    variants = {str(name): _variant(spec, str(name), factors, fields, version) for name, spec in variants_in.items()}
    failed = plan.get("failed")
    return AblationRecord(
        name=fields.string(plan.get("name"), "name") or path.resolve().parent.name,
        factors=factors, variants=variants,
        datasets=fields.strings(plan.get("datasets"), "datasets"),
        budget=dict(fields.object(plan.get("budget"), "budget", required=False)),
        pretrain_seeds=_pretrain_seeds(plan, variants, fields),
        specification=_specification(plan.get("analysis"), fields),
        finetune=dict(fields.object(plan.get("finetune"), "finetune", required=False)),
        excluded=fields.strings(plan.get("excluded"), "excluded"),
        failed=None if failed is None else fields.strings(failed, "failed"),
        source=fields.string(plan.get("source"), "source"), schema_version=version)


def _factors(plan: Mapping[str, Any], variants_in: Mapping[str, Any], fields: _Fields,
             version: int) -> dict[str, list[str]]:
    """``factors``; a version-1 record without them has them inferred from its variants, levels in
    order of appearance."""
    factors_in = plan.get("factors")
    if factors_in is None and version == 1:
        factors_in = {}
        for spec in variants_in.values():
            for f, level in (spec.get("factors") or {}).items() if isinstance(spec, dict) else ():
                factors_in.setdefault(f, [])
                if level not in factors_in[f]:
                    factors_in[f].append(level)
    factors_in = fields.object(factors_in, "factors")
    factors: dict[str, list[str]] = {}
    for f, levels in factors_in.items():
        factors[str(f)] = fields.strings(levels, f"factors.{f}", required=True)
        if not factors[str(f)]:
            raise fields.error(f"factors.{f}", "expected a non-empty list of levels, got []")
    return factors


def _variant(spec: Any, name: str, factors: Mapping[str, list[str]], fields: _Fields,
             version: int) -> VariantRecord:
    where = f"variants.{name}"
    spec = fields.object(spec, where)
    levels = fields.object(spec.get("factors", {}), f"{where}.factors")
    missing = [f for f in factors if f not in levels]
    unknown = [f for f in levels if f not in factors]
    if missing or unknown:
        raise fields.error(f"{where}.factors", "; ".join(filter(None, [
            missing and f"no level for factor(s) {', '.join(missing)}",
            unknown and f"undeclared factor(s) {', '.join(unknown)}"])))
    for f, level in levels.items():
        if str(level) not in factors[f]:
            raise fields.error(f"{where}.factors.{f}", f"level {level!r} of {f!r} is not one of "
                                                      f"{', '.join(factors[f])}")
    return VariantRecord({f: str(levels[f]) for f in factors}, _checkpoints(spec, where, fields, version))


def _checkpoints(spec: Mapping[str, Any], where: str, fields: _Fields, version: int) -> tuple[CheckpointRecord, ...]:
    """A variant's pretraining runs; a version-1 variant without ``checkpoints`` had one, whose
    directories are the variant's own."""
    given = spec.get("checkpoints")
    if given is None and version == 1:
        return (CheckpointRecord(run=1, model=fields.string(spec.get("model"), f"{where}.model"),
                                 pretrain_dir=fields.string(spec.get("pretrain_dir"), f"{where}.pretrain_dir"),
                                 finetune_dir=fields.string(spec.get("finetune_dir"), f"{where}.finetune_dir")),)
    if not isinstance(given, list) or not given:
        raise fields.error(f"{where}.checkpoints", f"expected a non-empty list of pretraining runs, got "
                                                   f"{_shown(given)}")
    out = []
    for i, item in enumerate(given):
        at = f"{where}.checkpoints[{i}]"
        item = fields.object(item, at)
        seed = item.get("seed")
        out.append(CheckpointRecord(
            run=fields.integer(item.get("run"), f"{at}.run", minimum=1),
            seed=None if seed is None else fields.integer(seed, f"{at}.seed"),
            model=fields.string(item.get("model"), f"{at}.model"),
            pretrain_dir=fields.string(item.get("pretrain_dir"), f"{at}.pretrain_dir"),
            finetune_dir=fields.string(item.get("finetune_dir"), f"{at}.finetune_dir")))
    if len({c.run for c in out}) != len(out):
        raise fields.error(f"{where}.checkpoints", "two pretraining runs with the same 'run'")
    return tuple(out)


def _pretrain_seeds(plan: Mapping[str, Any], variants: Mapping[str, VariantRecord], fields: _Fields) -> int:
    if "pretrain_seeds" in plan:
        return fields.integer(plan["pretrain_seeds"], "pretrain_seeds", minimum=1)
    return max(len(v.checkpoints) for v in variants.values())


def _specification(analysis: Any, fields: _Fields) -> Specification:
    """``analysis.specification`` (records written before it: the first of SPECIFICATIONS)."""
    analysis = fields.object(analysis, "analysis", required=False)
    specification = analysis.get("specification", SPECIFICATIONS[0])
    if specification not in get_args(Specification):
        raise fields.error("analysis.specification", f"expected one of {', '.join(SPECIFICATIONS)}, got "
                                                     f"{_shown(specification)}")
    return specification
