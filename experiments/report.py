"""The report of an ablation: what each pretraining variant scored on BLURB, what it cost, and what
the multilevel analysis reads from the seeds.

Everything is rebuilt from the files the ablation left (layout in :mod:`experiments.ablation`)::

    <ablation_dir>/ablation.json                                   the plan (factors, variants, budget)
    <ablation_dir>/variants/<variant>/pretrain/metrics.jsonl       one JSON object per logged step
    <ablation_dir>/variants/<variant>/finetune/.../seed<N>/run.json one per complete fine-tuning run

and written to ``<ablation_dir>/report/`` (or ``output_dir``)::

    report.md       the index a person opens: budget, variants, results, analysis reading, plots, files
    results.md      dataset × variant table of test mean ± std (percent) at the selected grid point,
                    the BLURB score row, the selected grid points, and notes
    results.csv     the same numbers, machine-readable (fractions; mean/std/n per variant)
    runs.csv        one row per complete fine-tuning run of the plan (the input of the analysis)
    summaries.json  finetune.sweep.summarize() of each variant
    analysis.md, analysis.json   experiments.analysis.fit_multilevel() (absent, with the reason, when
                    it cannot run)
    plots/*.png     pretraining loss, per-dataset test scores over seeds, time and memory per run

Model selection and the BLURB score are :mod:`finetune.sweep`'s and :mod:`finetune.metrics`'s (the
grid point with the best mean dev score over seeds; test mean ± sample std there), so a variant's
column is exactly what ``launch/blurb.py`` prints for that variant's sweep.

Only the runs of the ablation's fine-tuning plan count (``finetune`` in ablation.json, rewritten each
time launch/ablate.py starts): a run.json where the plan puts no run, or one recording other settings
(an earlier configuration's, left on disk), is left out, and the report says how many in one line.
``summary.json`` of a sweep is no plan to go by: it is written when a sweep ends, so it still holds
the earlier configuration's after a sweep of the new one was stopped or refused. A record without
a plan (a hand-made ablation.json) is refused when a sweep folder's runs differ in more than the
grid and seed (the rule of launch/sweep_report.py). A run.json that is not JSON is counted as not
complete, with a warning; a complete one that lacks a field the report reads is an error naming
the file and field. Warnings go to ``log`` (stderr) and the report's notes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import pandas as pd

from biomed_lm.errors import BiomedLMError
from biomed_lm.experiments.ablation_record import (ABLATION_FILE, AblationError, AblationRecord, VariantRecord,
                                                  load_ablation_record, run_suffix)
from biomed_lm.reporting import format_duration, save_figure

__all__ = ["ABLATION_FILE", "AblationError", "Variant", "Ablation", "load_ablation", "RunsRead", "read_runs",
           "collect_rows", "ROW_COLUMNS", "ResultsTable", "results_table", "read_pretraining_metrics", "PlotResult",
           "plot_pretraining_loss", "plot_test_scores", "plot_cost", "analysis_factors", "run_analysis",
           "AnalysisOutcome", "write_report", "REPORT_DIR"]

REPORT_DIR = "report"
METRICS_FILE = "metrics.jsonl"

#: Columns of :func:`collect_rows` around the factor columns (which come right after ``variant``).
ROW_COLUMNS = ("variant", "checkpoint", "dataset", "task_type", "metric", "learning_rate", "batch_size", "epochs",
               "seed", "dev_score", "test_score", "wall_time_s", "peak_rss_bytes")


# ------------------------------------------------------------------------------------ loading

@dataclass(frozen=True)
class Checkpoint:
    """One pretraining run of a variant (``pretrain_seeds`` of them) and its fine-tuning sweep."""

    run: int
    pretrain_dir: Path | None = None  # resolved; holds metrics.jsonl
    finetune_dir: Path | None = None  # resolved; run.json files below it
    seed: int | None = None

    @property
    def metrics_path(self) -> Path | None:
        return self.pretrain_dir / METRICS_FILE if self.pretrain_dir is not None else None


@dataclass(frozen=True)
class Variant:
    """One pretraining variant of the ablation: its factor levels and its pretraining runs, with
    their directories resolved (``pretrain_dir``/``finetune_dir``: the first run's)."""

    name: str
    factors: dict[str, str]
    checkpoints: tuple[Checkpoint, ...]

    @property
    def pretrain_dir(self) -> Path | None:
        return self.checkpoints[0].pretrain_dir

    @property
    def finetune_dir(self) -> Path | None:
        return self.checkpoints[0].finetune_dir

    @property
    def metrics_path(self) -> Path | None:
        return self.checkpoints[0].metrics_path

    def runs(self) -> tuple[Checkpoint, ...]:
        """Every pretraining run."""
        return self.checkpoints


@dataclass(frozen=True)
class Ablation:
    """An ablation directory: its record (``ablation.json``) with every directory resolved.
    ``factors`` maps each factor to its levels (the first is the reference); ``variants`` maps
    names to :class:`Variant`; ``datasets`` are the planned ones, by their canonical names."""

    record: AblationRecord
    dir: Path
    variants: dict[str, Variant]
    datasets: list[str]

    @property
    def name(self) -> str:
        return self.record.name

    @property
    def factors(self) -> dict[str, list[str]]:
        return self.record.factors

    @property
    def budget(self) -> dict[str, Any]:
        return self.record.budget

    @property
    def file(self) -> Path:
        return self.dir / ABLATION_FILE

    def reference_levels(self) -> dict[str, str]:
        return {f: levels[0] for f, levels in self.factors.items() if levels}


def _resolve_dir(given: Any, ablation_dir: Path, default: Path) -> Path:
    """Where a directory named in ablation.json lies: the path as written when absolute and present,
    else the standard layout when present, else the path relative to the ablation directory or the
    working directory (ablate writes paths relative to where it was started), else the layout."""
    candidates = []
    if isinstance(given, str) and given:
        path = Path(given)
        if path.is_absolute():
            candidates.append(path)
        candidates.append(default)
        if not path.is_absolute():
            candidates += [ablation_dir / path, Path.cwd() / path]
    else:
        candidates.append(default)
    return next((c for c in candidates if c.is_dir()), default)


def _variant(name: str, record: VariantRecord, root: Path) -> Variant:
    """A variant of the record with its runs' directories resolved (the layout of
    :mod:`experiments.ablation` where the record names none, or none that exists)."""
    layout = root / "variants" / name
    checkpoints = tuple(
        Checkpoint(run=c.run, seed=c.seed,
                   pretrain_dir=_resolve_dir(c.pretrain_dir, root, layout / f"pretrain{run_suffix(c.run)}"),
                   finetune_dir=_resolve_dir(c.finetune_dir, root, layout / f"finetune{run_suffix(c.run)}"))
        for c in record.checkpoints)
    return Variant(name=name, factors=dict(record.factors), checkpoints=checkpoints)


def load_ablation(ablation_dir: str | os.PathLike) -> Ablation:
    """Read ``<ablation_dir>/ablation.json`` (:func:`experiments.ablation_record.load_ablation_record`)
    and resolve its directories; :class:`AblationError` names the file and what is wrong (missing,
    not JSON, a field of the wrong shape, a variant level not among its factor's, a factor whose name
    is a column of the run table)."""
    root = Path(ablation_dir)
    if not root.is_dir():
        raise AblationError(f"ablation directory not found: {root}")
    record = load_ablation_record(root / ABLATION_FILE)
    for f in record.factors:
        if f in ROW_COLUMNS:
            raise AblationError(f"{root / ABLATION_FILE}: field 'factors.{f}': the factor's name clashes with a "
                                f"column of the run table; rename it")
    return Ablation(record=record, dir=root,
                    variants={name: _variant(name, v, root) for name, v in record.variants.items()},
                    datasets=[_dataset_id(d) for d in record.datasets])


def _dataset_id(name: str) -> str:
    """The dataset key finetune.sweep.summarize uses (BLURB's canonical name, or the name as is)."""
    from biomed_lm.finetune.blurb import canonical_dataset_name

    try:
        return canonical_dataset_name(name)
    except ValueError:
        return name


# --------------------------------------------------------------------------------- the runs

_NUMBER = (int, float)
#: The fields of a complete run record that the report and finetune.sweep.summarize read.
_RECORD_FIELDS = (("dataset", str), ("task_type", str), ("metric", str), ("model", str), ("seed", int),
                  ("best_dev_score", _NUMBER), ("test_score", _NUMBER), ("hyperparameters.learning_rate", _NUMBER),
                  ("hyperparameters.batch_size", int), ("hyperparameters.epochs", int))
_OPTIONAL_FIELDS = (("settings", dict), ("wall_time_s", _NUMBER), ("memory.peak_rss_bytes", int))


@dataclass
class RunsRead:
    """What reading the variants' fine-tuning runs found: per variant the complete run records the
    ablation's plan asks for (tagged with their pretraining run); the complete records it does not
    ask for (``stale``: an earlier configuration's, left on disk); the run.json files that could not
    be read (``unreadable``: one message each, counted as not complete); with a plan, per variant
    the runs it asks for per dataset (``planned``) and the run.json paths of those not complete
    (``missing``: not run yet, running, failed or unreadable)."""

    records: dict[str, list[dict[str, Any]]]
    stale: list[Path] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    planned: dict[str, dict[str, int]] | None = None
    missing: dict[str, list[Path]] = field(default_factory=dict)

    def notes(self, ablation: Ablation) -> list[str]:
        """One line per unreadable file, one for the stale runs, one per variant with planned runs
        not complete (a variant without any complete run has its own note in the table's)."""
        notes = [f"{message}; counted as not complete" for message in self.unreadable]
        if self.stale:
            notes.append(f"left out {_count(len(self.stale), 'complete fine-tuning run')} that the plan in "
                         f"{ablation.file} ('finetune') does not ask for (an earlier configuration's grid points, "
                         f"seeds or settings), e.g. {self.stale[0].parent.parent}")
        for name, missing in self.missing.items():
            if missing and self.records.get(name):
                notes.append(_missing_note(name, missing, sum((self.planned or {}).get(name, {}).values())))
        return notes


def _missing_note(variant: str, missing: list[Path], planned: int) -> str:
    """``general: 1 of 3 planned fine-tuning runs not complete (1 failed), e.g. <folder>: <its error>``:
    a failed run leaves error.txt (finetune.sweep) and no run.json, so the table's mean and std are
    over fewer seeds than the plan asks for."""
    failed = [path.parent for path in missing if (path.parent / "error.txt").is_file()]
    example = failed[0] if failed else missing[0].parent
    text = (f"{variant}: {len(missing)} of {planned} planned fine-tuning runs not complete "
            f"({f'{len(failed)} failed' if failed else 'not run yet, running or unreadable'}), e.g. {example}")
    if failed:
        lines = [line.strip() for line in (example / "error.txt").read_text(encoding="utf-8", errors="replace")
                 .splitlines() if line.strip()]
        text += f": {lines[-1][:200]}" if lines else ""
    return text


def _planned_settings(ablation: Ablation, finetune_dir: Path) -> dict[Path, dict[str, Any]] | None:
    """The runs the ablation's fine-tuning plan (``finetune`` in ablation.json, which launch/ablate.py
    rewrites each time it starts) puts in ``finetune_dir``: run.json path -> the settings the sweep
    runs it with, model aside. None when the record holds no plan. The sweep's own planning is used
    (finetune.sweep.plan_sweep) with every dataset pointed at an existing folder: where the data lie
    is no part of which runs the plan asks for, and the report may run where they are absent."""
    if not ablation.record.finetune:
        return None
    from biomed_lm.finetune.sweep import SweepArgs, plan_sweep
    from biomed_lm.finetune.trainer import RUN_RECORD, run_settings

    try:
        args = SweepArgs(**{**ablation.record.finetune, "model": "-", "output_dir": str(finetune_dir)})
        args = dataclasses.replace(args, data_dirs=[f"{d}={ablation.dir}" for d in args.datasets])
    except (TypeError, BiomedLMError) as err:  # SweepArgs' errors name the option
        raise AblationError(f"{ablation.file}: field 'finetune': {err}") from None
    planned = {}
    for run in plan_sweep(args).runs:
        settings = {**run_settings(run.args), "max_length": run.args.effective_max_length()}
        settings.pop("model")  # the variant's folder says which model; a copied ablation names it elsewhere
        planned[Path(run.args.output_dir) / RUN_RECORD] = settings
    return planned


def _settings_differ(record: Mapping[str, Any], planned: Mapping[str, Any]) -> bool:
    """Whether the sweep would refuse this finished run as another configuration's: the trainer's
    rule (finetune.trainer._finished_run), the model aside."""
    from biomed_lm.finetune.trainer import changed_settings

    recorded = dict(record.get("settings") or {})
    recorded["max_length"] = record["hyperparameters"].get("max_length", recorded.get("max_length"))
    recorded.pop("model", None)
    return bool(changed_settings(recorded, planned))


def _read_record(path: Path, runs: RunsRead) -> dict[str, Any] | None:
    """A complete run record, its fields checked (finetune.sweep_report's check: SweepReportError names
    the file and field); None for an unfinished run, or an unreadable file (noted in ``runs``)."""
    from biomed_lm.finetune.sweep_report import SweepReportError, record_field, load_run_record

    try:
        record = load_run_record(path)
    except SweepReportError as err:  # a damaged file: the run will be redone; the report goes on
        runs.unreadable.append(str(err))
        return None
    if record.get("status") != "complete":
        return None
    try:  # a complete record without a field it needs is left out as a damaged one is (QA: it stopped the report)
        for dotted, kind in _RECORD_FIELDS:
            record_field(record, dotted, path, kind)
        for dotted, kind in _OPTIONAL_FIELDS:
            record_field(record, dotted, path, kind, optional=True)
    except SweepReportError as err:
        runs.unreadable.append(str(err))
        return None
    return record


def _check_unplanned(ablation: Ablation, label: str, finetune_dir: Path, records: dict[Path, dict]) -> None:
    """Without a plan the report cannot tell current runs from stale ones: refuse a sweep folder whose
    runs differ in more than the grid and seed, as launch/sweep_report.py does."""
    from biomed_lm.finetune.sweep_report import (SweepReportError, check_one_checkpoint,
                                                 check_one_grid_per_dataset)

    try:
        check_one_checkpoint(label, records)
        check_one_grid_per_dataset(label, records)
    except SweepReportError as err:
        raise AblationError(f"{err}; {ablation.file} holds no fine-tuning plan ('finetune') to tell the current "
                            f"runs from an earlier configuration's: move those out of {finetune_dir}") from None


def _records(ablation: Ablation, variant: Variant, runs: RunsRead) -> list[dict[str, Any]]:
    """The variant's complete run records that its plan asks for, tagged with their pretraining run
    (``checkpoint``). With several runs, ``model`` becomes the variant's name: the table pools them."""
    from biomed_lm.finetune.trainer import RUN_RECORD

    checkpoints = variant.runs()
    out = []
    for checkpoint in checkpoints:
        if checkpoint.finetune_dir is None:
            continue
        planned = _planned_settings(ablation, checkpoint.finetune_dir)
        if planned is not None:
            _count_planned(runs, variant.name, planned)
        if not checkpoint.finetune_dir.is_dir():
            runs.missing.setdefault(variant.name, []).extend(planned or {})
            continue
        found = {}
        for path in sorted(checkpoint.finetune_dir.rglob(RUN_RECORD)):
            if (record := _read_record(path, runs)) is None:
                continue
            if planned is not None and (path not in planned or _settings_differ(record, planned[path])
                                        or _dataset_id(str(record["dataset"])) != _dataset_id(
                                            str(planned[path]["dataset"]))):  # a record moved from another sweep
                runs.stale.append(path)
                continue
            found[path] = record
        if planned is not None:
            runs.missing.setdefault(variant.name, []).extend(path for path in planned if path not in found)
        if planned is None and found:
            label = variant.name + (f" run {checkpoint.run}" if len(checkpoints) > 1 else "")
            _check_unplanned(ablation, label, checkpoint.finetune_dir, found)
        for record in found.values():
            record["checkpoint"] = checkpoint.run
            if len(checkpoints) > 1:
                record["model"] = variant.name
            out.append(record)
    return out


def _count_planned(runs: RunsRead, variant: str, planned: Mapping[Path, Mapping[str, Any]]) -> None:
    """Add a pretraining run's planned fine-tuning runs to the variant's count per dataset."""
    if runs.planned is None:
        runs.planned = {}
    counts = runs.planned.setdefault(variant, {})
    for settings in planned.values():
        dataset = _dataset_id(str(settings["dataset"]))
        counts[dataset] = counts.get(dataset, 0) + 1


def read_runs(ablation: Ablation) -> RunsRead:
    """Every variant's complete fine-tuning runs of the ablation's plan (:class:`RunsRead`); a complete record
    that lacks a field is noted as unreadable (naming the file and field) and counted as not complete. Raises
    :class:`AblationError` for a sweep folder mixing configurations when ablation.json has no plan."""
    runs = RunsRead(records={})
    runs.records = {name: _records(ablation, v, runs) for name, v in ablation.variants.items()}
    return runs


def _variant_records(ablation: Ablation) -> dict[str, list[dict[str, Any]]]:
    return read_runs(ablation).records


def collect_rows(ablation: Ablation, records: Mapping[str, list[dict[str, Any]]] | None = None) -> pd.DataFrame:
    """One row per complete fine-tuning run of every variant: ``variant``, one column per factor (the
    variant's level), ``checkpoint`` (the variant's pretraining run, 1, 2, ...), ``dataset``
    (canonical BLURB name), ``task_type``, ``metric``, ``learning_rate``, ``batch_size``, ``epochs``,
    ``seed``, ``dev_score`` (the run's best dev score), ``test_score``, ``wall_time_s``,
    ``peak_rss_bytes`` (NaN when a record lacks it). Scores are fractions. ``records``: the
    variants' run records, when already read."""
    records = _variant_records(ablation) if records is None else records
    rows = []
    for name, variant in ablation.variants.items():
        for r in records.get(name, []):
            hp = r.get("hyperparameters") or {}
            rss = (r.get("memory") or {}).get("peak_rss_bytes")
            rows.append({
                "variant": name, **variant.factors, "checkpoint": r.get("checkpoint", 1),
                "dataset": _dataset_id(str(r["dataset"])),
                "task_type": r.get("task_type"), "metric": r.get("metric"),
                "learning_rate": float(hp.get("learning_rate", math.nan)),
                "batch_size": hp.get("batch_size"), "epochs": r.get("epochs", hp.get("epochs")),
                "seed": r.get("seed"), "dev_score": float(r["best_dev_score"]), "test_score": float(r["test_score"]),
                "wall_time_s": float(r["wall_time_s"]) if r.get("wall_time_s") is not None else math.nan,
                "peak_rss_bytes": float(rss) if rss is not None else math.nan})
    columns = ["variant", *ablation.factors, *ROW_COLUMNS[1:]]
    frame = pd.DataFrame(rows, columns=columns)
    for col in ("checkpoint", "batch_size", "epochs", "seed"):
        if frame[col].notna().all():
            frame[col] = frame[col].astype("int64")
    if frame["peak_rss_bytes"].notna().all():
        frame["peak_rss_bytes"] = frame["peak_rss_bytes"].astype("int64")
    for col in ("learning_rate", "dev_score", "test_score", "wall_time_s"):
        frame[col] = frame[col].astype("float64")
    return frame.sort_values(["variant", "checkpoint", "dataset", "learning_rate", "batch_size", "epochs", "seed"],
                             kind="stable", ignore_index=True)


# ----------------------------------------------------------------------------- results table

def _md(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _count(n: int, noun: str) -> str:
    """``1 seed``, ``3 seeds``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _seeds_text(seeds: list[int]) -> str:
    """The runs of a selected grid point: ``3 seeds``, or with pooled pretraining runs (each seed once per
    run) ``3 fine-tuning seeds × 2 pretraining runs``; ``5 runs: 3 fine-tuning seeds over 2 pretraining
    runs`` where some run is missing."""
    distinct, per_seed = len(set(seeds)), max((seeds.count(s) for s in seeds), default=0)
    if per_seed <= 1:
        return _count(len(seeds), "seed")
    if len(seeds) == distinct * per_seed:
        return f"{_count(distinct, 'fine-tuning seed')} × {per_seed} pretraining runs"
    return f"{len(seeds)} runs: {_count(distinct, 'fine-tuning seed')} over {per_seed} pretraining runs"


def _ms(entry: Mapping[str, Any]):
    from biomed_lm.finetune.metrics import MeanStd

    return MeanStd(entry["mean"], math.nan if entry.get("std") is None else entry["std"], entry["n"])


@dataclass
class ResultsTable:
    """Per variant, ``finetune.sweep.summarize`` of its runs, and the dataset × variant table."""

    variants: list[str]
    datasets: list[str]
    summaries: dict[str, dict[str, Any] | None]  # None: the variant has no complete run
    notes: list[str] = field(default_factory=list)

    def cell(self, variant: str, dataset: str) -> dict[str, Any] | None:
        summary = self.summaries.get(variant)
        return summary["datasets"].get(dataset) if summary else None

    def blurb(self, variant: str) -> dict[str, Any] | None:
        summary = self.summaries.get(variant)
        return summary.get("blurb") if summary else None

    def _metric_of(self, dataset: str) -> tuple[str, str]:
        for v in self.variants:
            entry = self.cell(v, dataset)
            if entry:
                return entry["task_type"], entry["metric"]
        return "", ""

    def to_frame(self) -> pd.DataFrame:
        """Machine-readable: one row per dataset plus a ``BLURB`` row; per variant ``<v>_mean``,
        ``<v>_std``, ``<v>_n`` (test score, fractions; std empty for one seed), and the selected grid
        point ``<v>_learning_rate``, ``<v>_batch_size``, ``<v>_epochs``. The BLURB row's ``_n`` is the
        number of datasets the score averages and its ``metric`` says whether it is partial."""
        rows = []
        for dataset in self.datasets:
            task_type, metric = self._metric_of(dataset)
            row: dict[str, Any] = {"dataset": dataset, "task_type": task_type, "metric": metric}
            for v in self.variants:
                entry = self.cell(v, dataset)
                sel = entry["selected"] if entry else {}
                row |= {f"{v}_mean": entry["test"]["mean"] if entry else None,
                        f"{v}_std": entry["test"]["std"] if entry else None,
                        f"{v}_n": entry["test"]["n"] if entry else None,
                        f"{v}_learning_rate": sel.get("learning_rate"), f"{v}_batch_size": sel.get("batch_size"),
                        f"{v}_epochs": sel.get("epochs")}
            rows.append(row)
        blurbs = {v: self.blurb(v) for v in self.variants}
        partial = any(b and b["partial"] for b in blurbs.values())
        row = {"dataset": "BLURB", "task_type": "", "metric": "blurb_score (partial)" if partial else "blurb_score"}
        for v, b in blurbs.items():
            row |= {f"{v}_mean": b["score"] if b else None, f"{v}_std": None,
                    f"{v}_n": len(b["dataset_scores"]) if b else None,
                    f"{v}_learning_rate": None, f"{v}_batch_size": None, f"{v}_epochs": None}
        rows.append(row)
        frame = pd.DataFrame(rows)
        for v in self.variants:
            for col in (f"{v}_n", f"{v}_batch_size", f"{v}_epochs"):
                frame[col] = frame[col].astype("Int64")
        return frame

    def _cells(self, dataset: str, render) -> list[str]:
        """One cell per variant: ``render(summary entry)``, or "—" where the variant has no run."""
        return ["—" if (entry := self.cell(v, dataset)) is None else render(entry) for v in self.variants]

    def to_markdown(self) -> str:
        """The table: dataset rows × variant columns, cells ``test mean ± std`` in percent at the grid
        point selected by mean dev score; then the BLURB score row (partial ones say so)."""
        head = ["dataset", "metric", *self.variants]
        lines = ["| " + " | ".join(_md(h) for h in head) + " |", "|" + "---|" * len(head)]
        for dataset in self.datasets:
            _, metric = self._metric_of(dataset)
            cells = self._cells(dataset, lambda entry: _ms(entry["test"]).format()
                                + (f" ({entry['incomplete']})" if entry.get("incomplete") else ""))
            lines.append(f"| {_md(dataset)} | {_md(metric or '—')} | " + " | ".join(_md(c) for c in cells) + " |")
        from biomed_lm.finetune.blurb import BLURB_DATASETS

        cells, partial = [], False
        for v in self.variants:
            b = self.blurb(v)
            if b is None:
                cells.append("—")
                continue
            partial |= b["partial"]
            text = f"{b['score'] * 100:.2f}"
            if b["partial"]:
                text += f" (partial: {len(b['dataset_scores'])}/{len(BLURB_DATASETS)} datasets)"
            cells.append(text)
        label = "**BLURB score (partial)**" if partial else "**BLURB score**"
        lines.append(f"| {label} | macro avg | " + " | ".join(cells) + " |")
        return "\n".join(lines) + "\n"

    def selection_markdown(self) -> str:
        """Which grid point each cell comes from (learning rate, batch size, epochs; seeds; dev score)."""
        head = ["dataset", *self.variants]
        lines = ["| " + " | ".join(_md(h) for h in head) + " |", "|" + "---|" * len(head)]
        for dataset in self.datasets:
            cells = self._cells(dataset, lambda entry: (
                f"lr {entry['selected']['learning_rate']:g}, bs {entry['selected']['batch_size']}, "
                f"ep {entry['selected']['epochs']}; {_seeds_text(entry['selected']['seeds'])}; "
                f"dev {_ms(entry['dev']).format()}; {_count(len(entry['grid']), 'grid point')}"))
            lines.append(f"| {_md(dataset)} | " + " | ".join(_md(c) for c in cells) + " |")
        return "\n".join(lines) + "\n"

    def blurb_footnote(self) -> str:
        from biomed_lm.finetune.blurb import BLURB_DATASETS

        partial = {v: b for v in self.variants if (b := self.blurb(v)) and b["partial"]}
        if not partial:
            return ""
        present = sorted({d for b in partial.values() for d in b["dataset_scores"]}, key=BLURB_DATASETS.index)
        return (f"BLURB score: macro average over task types of the per-dataset test means. Partial "
                f"(computed over {', '.join(present)} only): comparable between these variants when they "
                f"cover the same datasets, not with the paper's BLURB scores, which average all "
                f"{len(BLURB_DATASETS)} datasets.")


def results_table(ablation: Ablation, records: Mapping[str, list[dict[str, Any]]] | None = None,
                  planned: Mapping[str, Mapping[str, int]] | None = None) -> ResultsTable:
    """Per variant, :func:`finetune.sweep.summarize` of its complete runs (``records``: the variants'
    run records, when already read; ``planned``: the runs the plan asks for, variant -> dataset ->
    count, :attr:`RunsRead.planned`), as a :class:`ResultsTable` (``to_markdown()``, ``to_frame()``
    for the CSV, ``selection_markdown()``). A cell with fewer complete runs than planned (or, without
    a plan, than another variant has) says "k of n runs complete"."""
    if records is None:
        runs = read_runs(ablation)
        records, planned = runs.records, runs.planned
    from biomed_lm.finetune.blurb import BLURB_DATASETS
    from biomed_lm.finetune.sweep import summarize

    notes: list[str] = []
    counts: dict[str, dict[str, int]] = {}
    for name, recs in records.items():
        for r in recs:
            d = _dataset_id(str(r["dataset"]))
            counts.setdefault(d, {}).setdefault(name, 0)
            counts[d][name] += 1
    # A variant with fewer complete runs of a dataset than planned is still running or failed part of
    # its sweep: summarize() flags its cell as incomplete. Without a plan, the most any variant has is
    # the best guess (it misses runs that every variant lacks).
    most = {d: max(c.values()) for d, c in counts.items()}
    summaries: dict[str, dict[str, Any] | None] = {}
    for name, recs in records.items():
        if not recs:
            summaries[name] = None
            notes.append(f"{name}: no complete fine-tuning run (looked below {ablation.variants[name].finetune_dir})")
            continue
        expected = dict(planned[name]) if planned is not None and name in planned else most
        try:
            summaries[name] = summarize(recs, expected={d: n for d, n in expected.items()
                                                        if d in {_dataset_id(str(r['dataset'])) for r in recs}})
        except ValueError as err:
            raise AblationError(f"variant {name} ({ablation.variants[name].finetune_dir}): {err}") from None
    if any(s and any(e.get("incomplete") for e in s["datasets"].values()) for s in summaries.values()):
        notes.append("'k of n runs complete': n is " + ("the runs the fine-tuning plan asks for"
                                                        if planned is not None else
                                                        "the most complete runs any variant has for that dataset")
                     + "; the mean and std are over the complete ones: compare such cells with care.")
    order = {d: i for i, d in enumerate(ablation.datasets)}
    datasets = list(ablation.datasets) + sorted(
        (d for d in counts if d not in order),
        key=lambda d: (BLURB_DATASETS.index(d) if d in BLURB_DATASETS else len(BLURB_DATASETS), d))
    for d in ablation.datasets:
        if d not in counts:
            notes.append(f"{d}: planned, but no variant has a complete run")
    return ResultsTable(variants=list(ablation.variants), datasets=datasets, summaries=summaries, notes=notes)


# ------------------------------------------------------------------------------------- plots

@dataclass(frozen=True)
class PlotResult:
    """A plot written to ``path``, or skipped (``path`` None) with ``note`` saying why; ``notes`` are
    remarks about a drawn plot (variants left out of it, ...)."""

    title: str
    path: Path | None
    note: str = ""
    notes: tuple[str, ...] = ()


def read_pretraining_metrics(path: str | os.PathLike) -> tuple[pd.DataFrame, list[int]]:
    """A metrics.jsonl as a DataFrame sorted by step, keeping the last entry of a step logged twice (a
    resumed run appends); also the numbers of the unreadable lines skipped (a killed run's last line)."""
    from biomed_lm.pretrain.metrics import read_metrics_file

    entries, bad_lines = read_metrics_file(Path(path), required_key="step")
    frame = pd.DataFrame(entries)
    if not frame.empty:
        frame = frame.drop_duplicates("step", keep="last").sort_values("step", ignore_index=True)
    return frame, bad_lines


def _line_numbers(numbers: list[int], most: int = 5) -> str:
    """``line 7``, ``lines 3, 9 and 12``, ``lines 1, 2, 3, 4, 5 and 8 more``."""
    shown = [str(n) for n in numbers[:most]]
    if len(numbers) > most:
        return f"lines {', '.join(shown)} and {len(numbers) - most} more"
    return f"line {shown[0]}" if len(shown) == 1 else f"lines {', '.join(shown[:-1])} and {shown[-1]}"


def _smooth(values: pd.Series) -> pd.Series:
    window = max(1, len(values) // 25)
    return values.rolling(window, min_periods=1).mean()


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _colors(variants: list[str]) -> dict[str, Any]:
    plt = _pyplot()
    cycle = plt.rcParams["axes.prop_cycle"].by_key().get("color", ["C0"])
    return {v: cycle[i % len(cycle)] for i, v in enumerate(variants)}


def _loss_column(frame: pd.DataFrame) -> str | None:
    return next((c for c in ("loss", "mlm_loss") if c in frame and frame[c].notna().any()), None)


_RUN_STYLES = ("-", "--", ":", "-.")  # the line style of pretraining run 1, 2, ...
_RUN_MARKERS = ("o", "s", "^", "D")  # the marker of pretraining run 1, 2, ... in the test score plot


def plot_pretraining_loss(ablation: Ablation, path: Path) -> PlotResult:
    """Pretraining loss against step, one colour per variant and one line style per pretraining run
    (both in the legend): the raw per-step loss faint, a moving average over 1/25 of the steps on top.
    Variants without metrics.jsonl are left out with a note."""
    title = "Pretraining loss"
    curves, notes = {}, []
    for name, variant in ablation.variants.items():
        for checkpoint in variant.runs():
            label = name if len(variant.runs()) == 1 else f"{name} run {checkpoint.run}"
            mpath = checkpoint.metrics_path
            if mpath is None or not mpath.is_file():
                notes.append(f"{label}: no pretraining metrics ({mpath or 'no pretrain_dir'} is absent)")
                continue
            frame, bad = read_pretraining_metrics(mpath)
            if bad:
                notes.append(f"{label}: {len(bad)} unreadable line(s) of {mpath} skipped ({_line_numbers(bad)})")
            column = _loss_column(frame) if not frame.empty else None
            if column is None:
                notes.append(f"{label}: {mpath} has no loss values")
                continue
            curves[name, checkpoint.run] = frame[["step", column]].dropna().rename(columns={column: "loss"})
    if not curves:
        return PlotResult(title, None, "skipped: no variant has pretraining metrics ("
                          + "; ".join(notes) + ")", tuple(notes))
    plt = _pyplot()
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    colors = _colors(list(ablation.variants))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    try:
        for (name, run), frame in curves.items():  # a variant's runs share its colour; its first one, the label
            ax.plot(frame["step"], frame["loss"], color=colors[name], alpha=0.25, linewidth=0.8)
            ax.plot(frame["step"], _smooth(frame["loss"]), color=colors[name], linewidth=1.8,
                    linestyle=_RUN_STYLES[(run - 1) % len(_RUN_STYLES)],
                    label=name if not any(n == name and r < run for n, r in curves) else None)
        runs = sorted({run for _, run in curves})
        # colour names the variant; the line style the pretraining run, explained once for all variants
        extra = [Line2D([], [], color="grey", linewidth=1.8, linestyle=_RUN_STYLES[(r - 1) % len(_RUN_STYLES)],
                        label=f"pretraining run {r}") for r in runs] if len(runs) > 1 else []
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("training loss, nats (MLM per masked token + the pair task per sequence)")  # NSP, SOP, DRP
        # Fewer than 50 logged steps are not averaged (a window of 1): the title says so (QA)
        smoothed = any(len(frame) >= 50 for frame in curves.values())
        ax.set_title(f"{ablation.name}: pretraining loss"
                     + (" (faint: per step; line: moving average over 1/25 of the steps)" if smoothed else
                        " per logged step"))
        ax.grid(alpha=0.3)
        handles, _ = ax.get_legend_handles_labels()
        ax.legend(handles=handles + extra, fontsize="small")
        save_figure(fig, path)
    finally:
        plt.close(fig)
    return PlotResult(title, path, notes=tuple(notes))


def _selected_mask(rows: pd.DataFrame, table: ResultsTable) -> pd.Series:
    """Which rows are runs of the grid point each (variant, dataset) cell was selected at."""
    mask = pd.Series(False, index=rows.index)
    for (variant, dataset), group in rows.groupby(["variant", "dataset"], sort=False):
        entry = table.cell(variant, dataset)
        if entry is None:
            continue
        sel = entry["selected"]
        mask.loc[group.index] = (np.isclose(group["learning_rate"], sel["learning_rate"], rtol=1e-9, atol=0)
                                 & (group["batch_size"] == sel["batch_size"])
                                 & (group["epochs"] == sel["epochs"]) & group["seed"].isin(sel["seeds"]))
    return mask


def plot_test_scores(ablation: Ablation, rows: pd.DataFrame, table: ResultsTable, path: Path) -> PlotResult:
    """One panel per dataset: each variant's test score per seed (points) at its selected grid point,
    with the mean ± sample std over seeds (bar), in percent."""
    title = "Test scores over seeds"
    if rows.empty:
        return PlotResult(title, None, "skipped: no complete fine-tuning run")
    selected = rows[_selected_mask(rows, table)]
    datasets = [d for d in table.datasets if d in set(selected["dataset"])]
    plt = _pyplot()
    from matplotlib.lines import Line2D

    variants = list(ablation.variants)
    colors = _colors(variants)
    runs = sorted(set(selected["checkpoint"]))  # the pretraining runs: one marker each, else they look like seeds
    ncols = min(3, len(datasets))
    nrows = math.ceil(len(datasets) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(max(4.5, 1.2 * len(variants) + 2.5) * ncols, 3.6 * nrows),
                             squeeze=False)
    try:
        rng = np.random.default_rng(0)
        for ax, dataset in zip(axes.flat, datasets):
            sub = selected[selected["dataset"] == dataset]
            for x, v in enumerate(variants):
                mine = sub[sub["variant"] == v]
                entry = table.cell(v, dataset)
                if entry is None or mine.empty:
                    continue
                for run, points in mine.groupby("checkpoint"):
                    scores = points["test_score"].to_numpy() * 100
                    ax.scatter(x + rng.uniform(-0.12, 0.12, len(scores)), scores, color=colors[v], alpha=0.55, s=18,
                               zorder=3, marker=_RUN_MARKERS[(int(run) - 1) % len(_RUN_MARKERS)])
                test = entry["test"]
                ax.errorbar(x + 0.28, test["mean"] * 100, yerr=(test["std"] or 0) * 100, fmt="o",
                            color=colors[v], capsize=4, markersize=6, zorder=4)
            _, metric = table._metric_of(dataset)
            ax.set_title(f"{dataset} ({metric})", fontsize="medium")
            ax.set_xticks(range(len(variants)))
            ax.set_xticklabels(variants, rotation=20, ha="right", fontsize="small")
            ax.set_ylabel("test score (%)")
            ax.grid(axis="y", alpha=0.3)
            ax.set_xlim(-0.5, len(variants) - 0.3)
        for ax in list(axes.flat)[len(datasets):]:
            ax.axis("off")
        pooled = len(runs) > 1
        if pooled:  # the shapes' legend, once, in the first panel
            axes.flat[0].legend(handles=[Line2D([], [], color="grey", linestyle="", label=f"pretraining run {r}",
                                                marker=_RUN_MARKERS[(int(r) - 1) % len(_RUN_MARKERS)]) for r in runs],
                                fontsize="small")
        fig.suptitle(f"{ablation.name}: test score per seed at the selected grid point\n"
                     f"(points: seeds{'; shape: pretraining run' if pooled else ''}; "
                     f"marker and bar: mean ± std)", fontsize="medium")
        save_figure(fig, path)
    finally:
        plt.close(fig)
    return PlotResult(title, path)


def plot_cost(ablation: Ablation, rows: pd.DataFrame, path: Path) -> PlotResult:
    """Wall time and peak RSS per fine-tuning run: per dataset, one bar per variant (mean over all its
    runs, every grid point and seed) with the runs as points."""
    title = "Fine-tuning time and memory per run"
    if rows.empty:
        return PlotResult(title, None, "skipped: no complete fine-tuning run")
    panels = [(c, label, scale) for c, label, scale in (("wall_time_s", "wall time per run (s)", 1.0),
                                                        ("peak_rss_bytes", "peak RSS per run (GiB)", 2.0 ** -30))
              if rows[c].notna().any()]
    if not panels:
        return PlotResult(title, None, "skipped: the run records hold no wall time or memory")
    plt = _pyplot()
    variants = list(ablation.variants)
    colors = _colors(variants)
    present = set(rows["dataset"])
    datasets = [d for d in ablation.datasets if d in present] + sorted(present - set(ablation.datasets))
    width = 0.8 / max(1, len(variants))
    panel_width = max(5.0, 0.6 * len(datasets) * len(variants) + 2.0)
    fig, axes = plt.subplots(1, len(panels), figsize=(panel_width * len(panels), 4), squeeze=False)
    try:
        for ax, (column, label, scale) in zip(axes.flat, panels):
            for i, v in enumerate(variants):
                offset = (i - (len(variants) - 1) / 2) * width
                for x, dataset in enumerate(datasets):
                    values = rows.loc[(rows["variant"] == v) & (rows["dataset"] == dataset), column].dropna()
                    if values.empty:
                        continue
                    values = values.to_numpy(dtype=float) * scale
                    ax.bar(x + offset, values.mean(), width * 0.9, color=colors[v], alpha=0.6, label=v)
                    ax.scatter(np.full(len(values), x + offset), values, color="black", s=6, alpha=0.5, zorder=3)
            ax.set_xticks(range(len(datasets)))
            ax.set_xticklabels(datasets, rotation=20, ha="right", fontsize="small")
            ax.set_ylabel(label)
            ax.grid(axis="y", alpha=0.3)
        handles, labels = axes.flat[0].get_legend_handles_labels()
        unique = dict(zip(labels, handles))
        axes.flat[0].legend(unique.values(), unique.keys(), fontsize="small")
        fig.suptitle(f"{ablation.name}: fine-tuning cost (bars: mean over runs; points: runs)", fontsize="medium")
        save_figure(fig, path)
    finally:
        plt.close(fig)
    # QA: the demo's variants, of one shape, differed 5x in wall time because the first ran on a loaded machine
    timing = ("wall time is the elapsed time of each run, timed one after another: on a machine shared with other "
              "work it measures the load as well as the variant") if "wall_time_s" in [c for c, _, _ in panels] else ""
    return PlotResult(title, path, notes=(timing,) if timing else ())


# ---------------------------------------------------------------------------------- analysis

@dataclass
class AnalysisOutcome:
    """The multilevel fit (``result``), or why there is none (``reason``)."""

    factors: dict[str, str]
    result: Any = None
    reason: str = ""


def analysis_factors(ablation: Ablation, rows: pd.DataFrame) -> dict[str, str]:
    """Factor -> reference level, for the factors with more than one level among the variants that
    have runs; the reference is the first declared level present."""
    factors = {}
    for f, levels in ablation.factors.items():
        present = set(rows[f]) if f in rows else set()
        if len(present) > 1:
            factors[f] = next(level for level in levels if level in present)
    return factors


def run_analysis(ablation: Ablation, rows: pd.DataFrame, specification: str | None = None) -> AnalysisOutcome:
    """``experiments.checkpoint_analysis.analyse_runs(rows, factors, specification)`` (default: the
    ablation's); an absent module, nothing to compare, or a fit that raises ValueError gives an
    outcome with the reason instead of a result."""
    factors = analysis_factors(ablation, rows)
    if rows.empty:
        return AnalysisOutcome(factors, reason="no complete fine-tuning run to analyse")
    if not factors:
        return AnalysisOutcome(factors, reason="no factor has more than one level among the variants with "
                                               "fine-tuning runs, so there is no contrast to estimate")
    try:
        from biomed_lm.experiments.checkpoint_analysis import analyse_runs
    except ImportError as err:
        return AnalysisOutcome(factors, reason=f"experiments.checkpoint_analysis could not be imported ({err})")
    try:
        result = analyse_runs(rows, factors, specification or ablation.record.specification)
    except (ValueError, np.linalg.LinAlgError) as err:
        return AnalysisOutcome(factors, reason=f"the multilevel fit failed: {type(err).__name__}: {err}")
    return AnalysisOutcome(factors, result=result)


def _jsonable(value: Any) -> Any:
    if isinstance(value, (np.generic,)):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (pd.DataFrame,)):
        return value.to_dict(orient="records")
    if isinstance(value, pd.Series):
        return value.to_dict()
    return str(value)


# ------------------------------------------------------------------------------------ report

def _pretrain_summary(checkpoint: Checkpoint) -> dict[str, Any]:
    """One pretraining run's steps logged, final loss (mean of the last 5% of steps), tokens seen,
    summed step time."""
    mpath = checkpoint.metrics_path
    if mpath is None or not mpath.is_file():
        return {}
    frame, _ = read_pretraining_metrics(mpath)
    if frame.empty:
        return {}
    out: dict[str, Any] = {"steps": int(frame["step"].max())}
    column = _loss_column(frame)
    if column:
        out["final_loss"] = _final_mean(frame[column])
    if "mlm_loss" in frame and frame["mlm_loss"].notna().any():  # the MLM part alone: what ln V is chance for
        vocab = _vocab_size(checkpoint.pretrain_dir / "model" / "config.json")
        out["final_mlm"] = f"{_final_mean(frame['mlm_loss']):.3f}" + (f" (ln V {math.log(vocab):.2f})" if vocab else "")
    if "tokens_seen" in frame and frame["tokens_seen"].notna().any():
        out["tokens_seen"] = int(frame["tokens_seen"].dropna().iloc[-1])
    if "step_seconds" in frame and frame["step_seconds"].notna().any():
        out["seconds"] = float(frame["step_seconds"].sum())
    return out


def _final_mean(values: pd.Series) -> float:
    """The mean of the last 5% of a logged column's values (the last value alone under 40)."""
    tail = values.dropna()
    return float(tail.iloc[-max(1, len(tail) // 20):].mean())


def _vocab_size(config: Path) -> int | None:
    """The exported model's vocabulary size (None: not exported yet, or unreadable)."""
    try:
        size = json.loads(config.read_text(encoding="utf-8")).get("vocab_size")
    except (OSError, ValueError, AttributeError):
        return None
    return size if isinstance(size, int) and size > 1 else None


def _per_run(summaries: list[dict[str, Any]], key: str, show: Callable[[Any], str]) -> str:
    """A variants-table cell: the pretraining runs' values of ``key`` joined by " / " ("—" for a run
    without it); "—" alone when no run has it."""
    if not any(key in s for s in summaries):
        return "—"
    return " / ".join(show(s[key]) if key in s else "—" for s in summaries)


def _budget_lines(budget: Mapping[str, Any]) -> list[str]:
    if not budget:
        return ["- (ablation.json gives no budget)"]
    lines = [f"- {k.replace('_', ' ')}: {_value_text(v)}" for k, v in budget.items()
             if v is not None and not (k == "phases" and isinstance(v, list))]
    phases = budget.get("phases")
    if isinstance(phases, list):  # one readable line per phase, not a Python list of dicts
        lines += [f"- phase {i}: " + ", ".join(_setting_text(k, v) for k, v in phase.items() if v not in (None, []))
                  if isinstance(phase, dict) else f"- phase {i}: {phase}" for i, phase in enumerate(phases, start=1)]
    steps, batch = budget.get("steps"), budget.get("global_batch_size")
    if "sequences" not in budget and isinstance(steps, int) and isinstance(batch, int):
        lines.append(f"- sequences (steps × global batch size): {steps * batch:,}")
    return lines


def _setting_text(key: str, value: Any) -> str:
    """``max steps 20``, ``extra args `--learning_rate 2e-4```."""
    if isinstance(value, list):
        return f"{key.replace('_', ' ')} `{' '.join(map(str, value))}`"
    return f"{key.replace('_', ' ')} {_value_text(value)}"


def _value_text(value: Any) -> str:
    """An integer with thousands separators (not a bool); anything else as str() gives it."""
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)


def _remove(path: Path) -> None:
    if path.is_file():
        path.unlink()


def _to_stderr(message: str) -> None:
    print(f"report: {message}", file=sys.stderr)


def write_report(ablation_dir: str | os.PathLike, output_dir: str | os.PathLike | None = None,
                 specification: str | None = None, log: Callable[[str], None] = _to_stderr) -> Path:
    """Write the ablation's report (see the module docstring) and return the path of ``report.md``.

    Raises :class:`AblationError` when ``ablation.json`` is missing or malformed, or a sweep folder
    mixes configurations that ablation.json holds no plan to tell apart; SweepReportError when a
    complete run record lacks a field. Missing data make parts of the report absent with a note (a
    variant without runs, a plot without data, an analysis that cannot run), never a failure; files
    of an earlier report that no longer apply are removed. ``log`` gets one line for each thing the
    reader should know about what was read (unreadable or stale run records, runs read elsewhere).
    """
    ablation = load_ablation(ablation_dir)
    out = Path(output_dir) if output_dir is not None else ablation.dir / REPORT_DIR
    try:
        (out / "plots").mkdir(parents=True, exist_ok=True)
    except OSError as err:  # a file where the folder should be, no permission: say which, not a traceback
        raise AblationError(f"cannot write the report to {out}: {err.filename}: {err.strerror}") from None
    # reading
    runs = read_runs(ablation)
    read_from = _read_elsewhere(ablation)
    notes = runs.notes(ablation)
    for line in ([read_from] if read_from else []) + notes:
        log(f"warning: {line}")
    rows = collect_rows(ablation, runs.records)
    # summarizing and fitting
    table = results_table(ablation, runs.records, runs.planned)
    _write_tables(out, rows, table)
    plots = _draw_plots(ablation, rows, table, out / "plots")
    for line in plots[0].notes:  # the pretraining loss plot's: metrics.jsonl files missing or damaged
        log(f"warning: {line}")
    analysis = run_analysis(ablation, rows, specification)
    _write_analysis(out, analysis)
    # writing it up
    page = _ReportPage(ablation, runs.records, table, analysis, plots, out,
                       notes + _report_notes(ablation, table), read_from)
    (out / "results.md").write_text(page.results_md(), encoding="utf-8")
    report = out / "report.md"
    report.write_text(page.index_md(), encoding="utf-8")
    return report


def _read_elsewhere(ablation: Ablation) -> str:
    """One line saying where the runs were read from when that is outside the ablation directory
    (ablation.json names absolute folders, read where they exist: a copy's report reads the
    original's runs); "" when every folder read lies below it."""
    root = ablation.dir.resolve()
    folders = [d.resolve() for v in ablation.variants.values() for c in v.runs()
               for d in (c.pretrain_dir, c.finetune_dir) if d is not None and d.is_dir()]
    outside = [d for d in folders if not d.is_relative_to(root)]
    if not outside:
        return ""
    share = "the runs" if len(outside) == len(folders) else f"{len(outside)} of {len(folders)} run folders"
    return (f"read {share} from {os.path.commonpath(outside)} (the absolute folders {ablation.file} names, which "
            f"exist), not from below {ablation.dir}")


def _write_tables(out: Path, rows: pd.DataFrame, table: ResultsTable) -> None:
    """runs.csv (the analysis input), results.csv and summaries.json."""
    rows.to_csv(out / "runs.csv", index=False)
    table.to_frame().to_csv(out / "results.csv", index=False, float_format="%.12g")
    (out / "summaries.json").write_text(json.dumps(table.summaries, indent=2, default=_jsonable) + "\n",
                                        encoding="utf-8")


def _draw_plots(ablation: Ablation, rows: pd.DataFrame, table: ResultsTable, plots_dir: Path) -> list[PlotResult]:
    """One figure per plot function; an earlier report's figure that is not drawn now is removed."""
    plots = [plot_pretraining_loss(ablation, plots_dir / "pretraining_loss.png"),
             plot_test_scores(ablation, rows, table, plots_dir / "test_scores.png"),
             plot_cost(ablation, rows, plots_dir / "finetune_cost.png")]
    for name in ("pretraining_loss.png", "test_scores.png", "finetune_cost.png"):
        if not any(p.path is not None and p.path.name == name for p in plots):
            _remove(plots_dir / name)
    return plots


def _write_analysis(out: Path, analysis: AnalysisOutcome) -> None:
    """analysis.md and analysis.json, or neither (an earlier report's are removed)."""
    if analysis.result is None:
        _remove(out / "analysis.md")
        _remove(out / "analysis.json")
        return
    (out / "analysis.md").write_text(analysis.result.to_markdown().rstrip("\n") + "\n", encoding="utf-8")
    (out / "analysis.json").write_text(json.dumps(analysis.result.to_dict(), indent=2, default=_jsonable)
                                       + "\n", encoding="utf-8")


def _report_notes(ablation: Ablation, table: ResultsTable) -> list[str]:
    """Every note about the numbers: the table's, the variants left out, the sweeps that failed."""
    record = ablation.record
    return (list(table.notes) + [f"excluded: {v}" for v in record.excluded]
            + [f"failed: {v}" for v in record.failed or []])


@dataclass
class _ReportPage:
    """The text of results.md and report.md."""

    ablation: Ablation
    records: Mapping[str, list[dict[str, Any]]]
    table: ResultsTable
    analysis: AnalysisOutcome
    plots: list[PlotResult]
    out: Path
    notes: list[str]
    read_from: str = ""  # where the runs were read from, when not below the ablation directory

    @property
    def legend(self) -> str:
        pooled = " and pretraining runs" if any(len(v.runs()) > 1 for v in self.ablation.variants.values()) else ""
        return (f"Test score in percent: mean ± sample std over seeds{pooled} at the grid point with the best mean "
                f"dev score (finetune.sweep); '—': no complete run.{self._examples_line}")

    @property
    def _examples_line(self) -> str:
        """The sentences each dataset's runs trained and were scored on (QA: a 150-sentence slice of NCBI-disease's
        940 test sentences was reported as NCBI-disease)."""
        sizes: dict[str, set[tuple]] = {}
        for record in (r for records in self.records.values() for r in records):
            examples = record.get("examples")
            if isinstance(examples, dict):
                sizes.setdefault(str(record["dataset"]), set()).add(
                    tuple(examples.get(split) for split in ("train", "dev", "test")))
        parts = [f"{dataset}: " + " or ".join(f"{train} train / {dev} dev / {test} test examples"
                                             for train, dev, test in sorted(found, key=str))
                 for dataset, found in sorted(sizes.items())]
        return f" Data: {'; '.join(parts)}." if parts else ""

    @property
    def analysis_note(self) -> str:
        return "" if self.analysis.result is not None else f"No multilevel analysis: {self.analysis.reason}."

    def results_md(self) -> str:
        """results.md: the tables and every note about the numbers."""
        lines = [f"# {self.ablation.name}: BLURB results per variant", "", self.legend, "", self.table.to_markdown()]
        if footnote := self.table.blurb_footnote():
            lines += [footnote, ""]
        lines += ["## Selected grid points", "", self.table.selection_markdown()]
        if self.analysis_note:
            lines += ["## Analysis", "", self.analysis_note, ""]
        if self.notes:
            lines += ["## Notes", "", *[f"- {n}" for n in self.notes], ""]
        return "\n".join(lines).rstrip("\n") + "\n"

    def index_md(self) -> str:
        """report.md: the index a person opens."""
        ablation = self.ablation
        lines = [f"# Ablation report: {ablation.name}", "",
                 f"Ablation directory: `{ablation.dir.resolve()}`  ",
                 *([f"Note: {self.read_from}.  "] if self.read_from else []),
                 f"Generated {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')} by `launch/report.py`.", "",
                 "## Pretraining budget (the same for every variant)", "", *_budget_lines(ablation.budget), ""]
        lines += self._variants_section()
        lines += ["## Results", "", self.legend, "", self.table.to_markdown()]
        if footnote := self.table.blurb_footnote():
            lines += [footnote, ""]
        lines += ["Selected grid points and notes: [results.md](results.md).", ""]
        lines += self._analysis_section() + self._plots_section() + self._files_section()
        if self.notes:
            lines += ["## Notes", "", *[f"- {n}" for n in self.notes], ""]
        return "\n".join(lines).rstrip("\n") + "\n"

    def _variants_section(self) -> list[str]:
        ablation = self.ablation
        # a factor with one level among the variants is a column of identical cells: said once below instead
        varying = [f for f in ablation.factors if len({v.factors[f] for v in ablation.variants.values()}) > 1]
        constant = {f: next(iter(ablation.variants.values())).factors[f] for f in ablation.factors
                    if f not in varying}
        refs = {f: level for f, level in ablation.reference_levels().items() if f in varying}
        head = ["variant", *varying, "pretraining runs", "fine-tuning runs", "pretraining steps logged",
                "final loss", "final MLM loss", "pretraining time (sum of step times)"]
        lines = ["## Variants", "", "| " + " | ".join(_md(h) for h in head) + " |", "|" + "---|" * len(head)]
        for name, variant in ablation.variants.items():
            # one value per pretraining run, "/"-separated: run 1's alone would stand for all of them
            pre = [_pretrain_summary(c) for c in variant.runs()]
            cells = [name, *(variant.factors[f] + (" (ref)" if variant.factors[f] == refs.get(f) else "")
                             for f in varying),
                     str(len(variant.runs())), str(len(self.records[name])),
                     _per_run(pre, "steps", str), _per_run(pre, "final_loss", lambda x: f"{x:.3f}"),
                     _per_run(pre, "final_mlm", str), _per_run(pre, "seconds", format_duration)]
            lines.append("| " + " | ".join(_md(c) for c in cells) + " |")
        several = any(len(v.runs()) > 1 for v in ablation.variants.values())
        # QA: a report set 8.49 at 30,522 tokens beside 9.79 at 16,000, read as one model learning better
        losses = ["Final losses are the mean of the last 5% of logged steps (the last step alone when fewer than 40 "
                  "were logged); the loss is MLM plus the pair task's, the MLM loss alone is per token of the "
                  "variant's own vocabulary of V tokens, where guessing uniformly scores ln V (shown beside it). "
                  "Vocabularies cut text into other tokens, so a loss compares only between variants that share "
                  "one; the fine-tuning scores below compare all.", ""]
        return lines + ["", *(["Pretraining columns: one value per pretraining run (run 1 / run 2 / ...).", ""]
                              if several else []), *(losses if len(ablation.variants) > 1 else []),
                        *([("Reference levels (the first listed for each factor): "
                            + ", ".join(f"{f} = {lvl}" for f, lvl in refs.items()) + "."), ""] if refs else []),
                        *([("The same for every variant: "
                            + ", ".join(f"{f} = {lvl}" for f, lvl in constant.items()) + "."), ""] if constant else [])]

    def _analysis_section(self) -> list[str]:
        result = self.analysis.result
        if result is None:
            return ["## Analysis", "", self.analysis_note, ""]
        lines = ["## Analysis", "",
                 f"Multilevel model over all runs, specification `{result.specification}` "
                 f"({self._fitted_units(result)}; factors and references: "
                 + ", ".join(f"{f} vs {r}" for f, r in self.analysis.factors.items()) + ").", ""]
        lines += [f"- {s}" + ("" if s.rstrip().endswith((".", "!", "?")) else ".") for s in result.reading()] \
            or ["(the fit gave no reading)"]
        if excluded := self.ablation.record.excluded:  # QA: readings stated as main effects over every variant
            lines.append(f"- Not every combination of factor levels was run ({'; '.join(excluded)}): each factor's "
                         "effect is measured among the variants that have both of its levels, with the other "
                         "factors at the levels those variants share, and no interaction between factors is "
                         "estimated.")
        fit_notes = list(getattr(result, "notes", []) or [])
        if fit_notes:
            lines += ["", "Notes of the fit:", *[f"- {n}" for n in fit_notes]]
        return lines + ["", "Details: [analysis.md](analysis.md), [analysis.json](analysis.json).", ""]

    def _fitted_units(self, result: Any) -> str:
        """"n pretraining runs of m variants", counting those the fit had runs of (a variant whose
        sweep failed, or has not run, is not among them)."""
        with_runs = [name for name, records in self.records.items() if records]
        variants = getattr(result, "n_variants", 0) or len(with_runs)
        checkpoints = result.n_checkpoints or sum(len({r.get("checkpoint", 1) for r in self.records[name]})
                                                  for name in with_runs)
        return f"{_count(checkpoints, 'pretraining run')} of {_count(variants, 'variant')}"

    def _plots_section(self) -> list[str]:
        lines = ["## Plots", ""]
        for plot in self.plots:
            if plot.path is None:
                lines += [f"### {plot.title}", "", f"Not drawn — {plot.note}.", ""]
                continue
            rel = plot.path.relative_to(self.out).as_posix()
            lines += [f"### {plot.title}", "", f"![{plot.title}]({rel})", "", f"[{rel}]({rel})", ""]
            lines += [f"- {n}" for n in plot.notes] + ([""] if plot.notes else [])
        return lines

    def _files_section(self) -> list[str]:
        files = [("results.md", "results table, selected grid points, notes"),
                 ("results.csv", "the results table, machine-readable (fractions; mean/std/n per variant)"),
                 ("runs.csv", "one row per complete fine-tuning run (the analysis input)"),
                 ("summaries.json", "finetune.sweep summary of each variant (every grid point)")]
        if self.analysis.result is not None:
            files += [("analysis.md", "multilevel analysis"),
                      ("analysis.json", "multilevel analysis, machine-readable")]
        files += [(p.path.relative_to(self.out).as_posix(), p.title) for p in self.plots if p.path is not None]
        record = os.path.relpath(self.ablation.file.resolve(), self.out.resolve())
        return ["## Files", "", *[f"- [{f}]({f}) — {what}" for f, what in files],
                f"- [ablation.json]({record}) — the plan", ""]
