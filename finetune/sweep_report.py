"""A multi-model sweep study as a report (paper 001's presentation): per model × dataset a heatmap of
the dev score over learning rate × batch size, and a table of what each model's sweep cost.

Paper 001 (Shire, *Evaluation of Foundation Models for Biomedical NER*) fine-tunes BERT, BioBERT,
BiomedBERT, RoBERTa, GPT-2 and Bioformer on one NER corpus over lr {1e-6, 1e-5, 1e-4, 1e-3} × batch
{8, 16, 32}, shows each model's F1 over that grid (its Figures 3-9), and compares the models' memory
and average time per grid point (its Figure 12). Here each model is one sweep directory written by
``launch/blurb.py`` and everything is read from the run records (``run.json``) it holds::

    write_sweep_report([("bert", "runs/blurb/bert"), ("biobert", "runs/blurb/biobert")], "runs/study")

writes ``sweep_report.md`` (the page to open), ``sweep_report.json`` (the same numbers) and
``figures/*.png``. A heatmap cell is the mean dev score over the seeds run at that point, annotated
with its sample sd and seed count; a grid point no run finished is left blank. Every model of a
dataset shares one colour scale, so the heatmaps can be compared side by side.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from biomed_lm.errors import FinetuneError, InputError
from biomed_lm.finetune.metrics import MeanStd, mean_std
from biomed_lm.finetune.sweep import PLAN_FILE, SUMMARY_FILE, _dataset_id, _grid_key
from biomed_lm.finetune.trainer import RUN_RECORD
from biomed_lm.reporting import format_duration, save_figure
from biomed_lm.resources import read_json_object

__all__ = ["SweepReportError", "SweepRun", "Cell", "parse_sweep_specs", "read_run", "collect_study",
           "grid_cells", "dev_grid", "best_setting", "cost_row", "plot_dev_heatmap", "plot_memory_vs_time",
           "format_cost_table", "format_dev_table", "write_sweep_report", "REPORT_FILE", "REPORT_JSON", "FIGURES_DIR"]

REPORT_FILE = "sweep_report.md"
REPORT_JSON = "sweep_report.json"
FIGURES_DIR = "figures"
MIB = 1024 * 1024


class SweepReportError(FinetuneError, InputError):
    """A sweep directory or run record the report cannot use; the message names the file and field."""


@dataclass(frozen=True)
class SweepRun:
    """The fields of one run record the report reads, checked."""

    model: str  # the study's label for the model, not the checkpoint path
    dataset: str
    metric: str
    learning_rate: float
    batch_size: int
    seed: int
    dev: float  # the best dev score over epochs: what the sweep selects on
    test: float  # the test score at that epoch
    test_precision: float | None  # entity metrics' precision and recall (paper 001's Figures 3-9 a and b)
    test_recall: float | None
    f1_mode: str | None  # seqeval's mode the entity F1 was computed in (default/conlleval or strict)
    wall_time_s: float
    train_time_s: float | None  # the epochs alone, without featurization and evaluation (older records: none)
    train_examples: int
    epochs: int
    peak_rss_bytes: int
    cuda_peak_bytes: int | None
    path: Path

    @property
    def time_s(self) -> float:
        """Training time (paper 001's Figure 12 averages it over the grid); wall time for older records."""
        return self.wall_time_s if self.train_time_s is None else self.train_time_s

    @property
    def train_examples_per_s(self) -> float:
        """Training examples seen over :attr:`time_s`."""
        return self.train_examples * self.epochs / self.time_s


@dataclass(frozen=True)
class Cell:
    """One grid point (learning rate, batch size) of one model on one dataset, over its seeds."""

    dev: MeanStd
    test: MeanStd


# ------------------------------------------------------------------------------------ reading

def parse_sweep_specs(specs: Sequence[str]) -> list[tuple[str, Path]]:
    """``NAME=DIR`` or ``DIR`` (labelled by the directory's name) → (label, directory) pairs."""
    if not specs:
        raise SweepReportError("no sweeps given: pass NAME=DIR (or DIR) for each model's sweep directory")
    pairs = []
    for spec in specs:
        name, sep, directory = spec.partition("=")
        if not sep:
            name, directory = Path(spec).resolve().name, spec
        if not name or not directory:
            raise SweepReportError(f"sweep {spec!r}: expected NAME=DIR or DIR")
        pairs.append((name, Path(directory)))
    labels = [name for name, _ in pairs]
    if len(set(labels)) < len(labels):
        raise SweepReportError(f"sweep labels must differ, got {labels}; name them NAME=DIR")
    slugs = [_slug(name) for name in labels]
    if len(set(slugs)) < len(slugs):
        raise SweepReportError(f"sweep labels {labels} give the same figure file names; choose other names")
    return pairs


def record_field(record: Mapping[str, Any], dotted: str, path: Path, kind: type | tuple,
                 optional: bool = False) -> Any:
    """``record["a"]["b"]`` for ``dotted`` "a.b", of ``kind``; a missing or mistyped field is an
    error naming the file and field. Booleans are not numbers here (JSON true is no batch size)."""
    value: Any = record
    for key in dotted.split("."):
        if not isinstance(value, Mapping) or key not in value:
            if optional:
                return None
            raise SweepReportError(f"{path}: field {dotted!r} is missing")
        value = value[key]
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, kind):
        raise SweepReportError(f"{path}: field {dotted!r} is {value!r}, not {_kind_name(kind)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise SweepReportError(f"{path}: field {dotted!r} is {value!r}, not a finite number")
    return value


def _kind_name(kind: type | tuple) -> str:
    """``an int or float``, ``a str``: the expected type as the error's sentence names it."""
    names = " or ".join(k.__name__ for k in kind) if isinstance(kind, tuple) else kind.__name__
    return ("an " if names[0] in "aeiou" else "a ") + names


def _positive(value: float, dotted: str, path: Path) -> float:
    if value <= 0:
        raise SweepReportError(f"{path}: field {dotted!r} is {value!r}, not positive")
    return value


def read_run(path: Path, model: str, record: Mapping[str, Any] | None = None) -> SweepRun:
    """The checked fields of one complete ``run.json`` (``record``: its content, when already read);
    SweepReportError names the file and field."""
    record = load_run_record(path) if record is None else record
    number = (int, float)
    return SweepRun(
        model=model,
        dataset=_dataset_id(record_field(record, "dataset", path, str)),  # one spelling, as the sweep summary
        metric=record_field(record, "metric", path, str),
        learning_rate=_positive(record_field(record, "hyperparameters.learning_rate", path, number),
                                "hyperparameters.learning_rate", path),
        batch_size=_positive(record_field(record, "hyperparameters.batch_size", path, int),
                             "hyperparameters.batch_size", path),
        seed=record_field(record, "seed", path, int),
        dev=float(record_field(record, "best_dev_score", path, number)),
        test=float(record_field(record, "test_score", path, number)),
        test_precision=record_field(record, "test.precision", path, number, optional=True),
        test_recall=record_field(record, "test.recall", path, number, optional=True),
        f1_mode=record_field(record, "test.mode", path, str, optional=True),
        wall_time_s=float(_positive(record_field(record, "wall_time_s", path, number), "wall_time_s", path)),
        train_time_s=record_field(record, "train_time_s", path, number, optional=True) or None,
        train_examples=record_field(record, "examples.train", path, int),
        epochs=_positive(record_field(record, "hyperparameters.epochs", path, int), "hyperparameters.epochs", path),
        peak_rss_bytes=record_field(record, "memory.peak_rss_bytes", path, int),
        cuda_peak_bytes=record_field(record, "memory.cuda_max_memory_allocated_bytes", path, int, optional=True),
        path=path)


def load_run_record(path: Path) -> dict[str, Any]:
    return read_json_object(path, SweepReportError, "run record")


def collect_study(sweeps: Sequence[tuple[str, Path]]) -> tuple[list[SweepRun], list[str]]:
    """Every complete run of every sweep directory, labelled by its model; and notes on what is missing
    (the runs its ``plan.json`` names that did not finish, records of unfinished runs) and on models trained
    under other settings than each other. A directory without a complete run or given twice, or a dataset
    whose runs differ in more than learning rate, batch size and seed (epochs, length, ...), is an error."""
    runs, notes, settings = [], [], {}
    _refuse_a_directory_twice(sweeps)
    for label, directory in sweeps:
        if not directory.is_dir():
            raise SweepReportError(f"sweep {label!r}: {directory} is not a directory")
        records, unreadable = _readable_records(sorted(directory.rglob(RUN_RECORD)))
        notes += [f"{label}: {problem}; left out (the same launch/blurb.py command reruns it)"
                  for problem in unreadable]
        complete = {p: r for p, r in records.items() if r.get("status") == "complete"}
        if len(complete) < len(records):
            notes.append(f"{label}: {len(records) - len(complete)} run record(s) of unfinished runs left out")
        if not complete:
            raise SweepReportError(f"sweep {label!r}: no complete {RUN_RECORD} below {directory} (its "
                                   f"{SUMMARY_FILE} says which datasets were absent or failed)"
                                   + "".join(f"; {problem}" for problem in unreadable))
        runs += [read_run(p, label, r) for p, r in complete.items()]
        check_one_checkpoint(label, complete)
        settings[label] = check_one_grid_per_dataset(label, complete)
        notes += _unfinished_plan(label, directory, [r for r in runs if r.model == label])
    return runs, notes + _settings_differences(settings)


def _readable_records(paths: Sequence[Path]) -> tuple[dict[Path, dict[str, Any]], list[str]]:
    """The run records that read as JSON objects, and a line for each that does not (a record cut short
    by a full disk or an edit: one run's loss, not the report's, as in launch/report.py)."""
    records, unreadable = {}, []
    for path in paths:
        try:
            records[path] = load_run_record(path)
        except SweepReportError as err:
            unreadable.append(str(err))
    return records, unreadable


def _refuse_a_directory_twice(sweeps: Sequence[tuple[str, Path]]) -> None:
    seen: dict[Path, str] = {}
    for label, directory in sweeps:
        other = seen.setdefault(directory.resolve(), label)
        if other != label:
            raise SweepReportError(f"sweeps {other!r} and {label!r} are one directory, {directory}: one model's "
                                   "runs would be shown as two models'")


def _unfinished_plan(label: str, directory: Path, finished: Sequence[SweepRun]) -> list[str]:
    """What the sweep's plan holds that did not finish (a sweep cut short reads as complete without it)."""
    plan_path = directory / PLAN_FILE
    if not plan_path.is_file():
        return []
    planned = read_json_object(plan_path, SweepReportError, "sweep plan").get("runs") or []
    done = {(r.dataset, r.learning_rate, r.batch_size, r.seed) for r in finished}
    missing = [r for r in planned
               if (_dataset_id(r["dataset"]), r["learning_rate"], r["batch_size"], r["seed"]) not in done]
    if not missing:
        return []
    points = ", ".join(sorted({f"{r['dataset']} lr {_format_lr(r['learning_rate'])} batch {r['batch_size']} "
                               f"seed {r['seed']}" for r in missing}))
    return [f"{label}: {len(planned) - len(missing)} of the sweep's {len(planned)} planned runs finished; "
            f"missing (blank in the grids, and not among the best points): {points}. The same launch/blurb.py "
            "command finishes them"]


def _settings_differences(settings: Mapping[str, Mapping[str, dict]]) -> list[str]:
    """Per dataset, the settings (beyond lr, batch and seed) in which the models' sweeps differ."""
    notes = []
    for dataset in dict.fromkeys(d for by_dataset in settings.values() for d in by_dataset):
        of_dataset = {label: by_dataset[dataset] for label, by_dataset in settings.items() if dataset in by_dataset}
        keys = sorted({k for fixed in of_dataset.values() for k in fixed} - {"model"})
        differ = [k for k in keys if len({json.dumps(f.get(k), sort_keys=True) for f in of_dataset.values()}) > 1]
        if differ:
            values = "; ".join(f"{k}: " + ", ".join(f"{label} {of_dataset[label].get(k)}" for label in of_dataset)
                               for k in differ)
            notes.append(f"{dataset}: the models were fine-tuned under different settings, so their scores "
                         f"differ by more than the model ({values})")
    return notes


def check_one_checkpoint(label: str, records: Mapping[Path, Mapping[str, Any]]) -> None:
    """A sweep directory is one model's: records of two checkpoints would be pooled as one model."""
    first: dict[str, Path] = {}
    for path, record in records.items():
        model = record_field(record, "model", path, str)
        first.setdefault(model, path)
    if len(first) > 1:
        (a, pa), (b, pb) = list(first.items())[:2]
        raise SweepReportError(f"sweep {label!r} mixes models: {pa} fine-tuned {a!r}, {pb} fine-tuned {b!r}")


def check_one_grid_per_dataset(label: str, records: Mapping[Path, Mapping[str, Any]]) -> dict[str, dict]:
    """Runs of one dataset must differ only in learning rate, batch size and seed, or a heatmap cell
    would pool (say) 3-epoch and 20-epoch runs. Returns each dataset's other settings."""
    first: dict[str, tuple[dict, Path]] = {}
    for path, record in records.items():
        record_field(record, "settings", path, dict, optional=True)  # what the grid key reads, when there
        fixed = dict(_grid_key(record))
        for key in ("learning_rate", "batch_size"):
            fixed.pop(key, None)
        dataset = _dataset_id(record["dataset"])
        seen, seen_path = first.setdefault(dataset, (fixed, path))
        if fixed != seen:
            differ = sorted(k for k in set(fixed) | set(seen) if fixed.get(k) != seen.get(k))
            raise SweepReportError(f"sweep {label!r}, {dataset}: {path} and {seen_path} differ in "
                                   f"{', '.join(differ)}, not only in learning rate, batch size and seed")
    return {dataset: {k: json.loads(v) for k, v in fixed.items()} for dataset, (fixed, _) in first.items()}


# ---------------------------------------------------------------------------------- the grid

def grid_cells(runs: Iterable[SweepRun]) -> dict[tuple[float, int], Cell]:
    """(learning rate, batch size) → dev and test mean ± sd over the seeds of one model × dataset."""
    groups: dict[tuple[float, int], list[SweepRun]] = {}
    for run in runs:
        groups.setdefault((run.learning_rate, run.batch_size), []).append(run)
    return {key: Cell(mean_std(r.dev for r in group), mean_std(r.test for r in group))
            for key, group in sorted(groups.items())}


def dev_grid(cells: Mapping[tuple[float, int], Cell], learning_rates: Sequence[float],
             batch_sizes: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean, sd and seed count of the dev score as arrays (rows learning rate, columns batch size);
    a grid point without runs is NaN (count 0), as is the sd of a single seed."""
    shape = (len(learning_rates), len(batch_sizes))
    mean, sd, n = np.full(shape, np.nan), np.full(shape, np.nan), np.zeros(shape, dtype=int)
    for i, lr in enumerate(learning_rates):
        for j, batch in enumerate(batch_sizes):
            cell = cells.get((lr, batch))
            if cell is not None:
                mean[i, j], sd[i, j], n[i, j] = cell.dev.mean, cell.dev.std, cell.dev.n
    return mean, sd, n


def best_setting(cells: Mapping[tuple[float, int], Cell]) -> tuple[tuple[float, int], Cell]:
    """The grid point with the best mean dev score; ties go to more seeds, then the smaller lr and
    batch (the rule of :func:`finetune.sweep.summarize`)."""
    return min(cells.items(), key=lambda item: (-item[1].dev.mean, -item[1].dev.n, item[0]))


def cost_row(model: str, dataset: str, runs: Sequence[SweepRun]) -> dict[str, Any]:
    """One row of the cost table: runs, time, throughput, peak memory, and the best grid point.

    Peak memory is the largest over the runs, each run's own where the system lets a run reset its
    process's high-water mark (Linux: ``peak_rss_scope`` "run"), else the sweep process's so far."""
    cells = grid_cells(runs)
    (lr, batch), best = best_setting(cells)
    cuda = [r.cuda_peak_bytes for r in runs if r.cuda_peak_bytes is not None]
    at_best = [r for r in runs if (r.learning_rate, r.batch_size) == (lr, batch)]
    return {"model": model, "dataset": dataset, "metric": runs[0].metric, "f1_mode": runs[0].f1_mode,
            "runs": len(runs), "grid_points": len(cells), "total_time_s": sum(r.wall_time_s for r in runs),
            "mean_train_time_per_run_s": float(np.mean([r.time_s for r in runs])),
            "train_examples_per_s": float(np.mean([r.train_examples_per_s for r in runs])),
            "peak_rss_mib": max(r.peak_rss_bytes for r in runs) / MIB,
            "peak_cuda_mib": max(cuda) / MIB if cuda else None,
            "best": {"learning_rate": lr, "batch_size": batch, "dev": _mean_sd(best.dev),
                     "test": _mean_sd(best.test), "test_precision": _mean_of(r.test_precision for r in at_best),
                     "test_recall": _mean_of(r.test_recall for r in at_best)}}


def _mean_of(values: Iterable[float | None]) -> float | None:
    """The mean, or None where a run lacks the value (a metric without precision and recall)."""
    values = list(values)
    return None if any(v is None for v in values) else float(np.mean(values))


def _mean_sd(value: MeanStd) -> dict[str, Any]:
    """As JSON: the sd of a single seed is null, not NaN (which strict JSON readers refuse)."""
    return {"mean": value.mean, "std": None if math.isnan(value.std) else value.std, "n": value.n}


def _format_mean_sd(entry: Mapping[str, Any]) -> str:
    return MeanStd(entry["mean"], math.nan if entry["std"] is None else entry["std"], entry["n"]).format()


# ------------------------------------------------------------------------------------ figures

def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _cell_text(mean: float, sd: float, n: int) -> str:
    if n == 0:
        return "no runs"
    spread = f"\n± {sd * 100:.1f}" if n > 1 else ""
    return f"{mean * 100:.1f}{spread}\nn={n}"


def plot_dev_heatmap(cells: Mapping[tuple[float, int], Cell], learning_rates: Sequence[float],
                     batch_sizes: Sequence[int], path: Path, *, title: str, metric: str,
                     value_range: tuple[float, float]) -> Path:
    """Dev score (×100) over learning rate (rows) × batch size (columns), each cell annotated with
    mean ± sd and the seed count; blank where no run finished. ``value_range`` fixes the colour
    scale so that the heatmaps of one dataset compare."""
    plt = _pyplot()
    mean, sd, n = dev_grid(cells, learning_rates, batch_sizes)
    cmap = plt.get_cmap("viridis").with_extremes(bad="white")  # no run: a blank cell
    low, high = (v * 100 for v in value_range)
    # at least 3.2 in tall: the colorbar's label runs along it, and a one-row grid would cut it off
    fig, ax = plt.subplots(figsize=(1.6 * len(batch_sizes) + 2.4, max(3.2, 1.0 * len(learning_rates) + 1.6)))
    try:
        image = ax.imshow(np.ma.masked_invalid(mean * 100), cmap=cmap, vmin=low, vmax=high, aspect="auto")
        for i in range(len(learning_rates)):
            for j in range(len(batch_sizes)):
                # light text on the dark half of viridis, dark text on the light half
                dark = n[i, j] > 0 and (high == low or (mean[i, j] * 100 - low) / (high - low) < 0.5)
                ax.text(j, i, _cell_text(mean[i, j], sd[i, j], n[i, j]), ha="center", va="center",
                        fontsize=8, color="white" if dark else "black")
        ax.set_xticks(range(len(batch_sizes)), [str(b) for b in batch_sizes])
        ax.set_yticks(range(len(learning_rates)), [_format_lr(lr) for lr in learning_rates])
        ax.set_xlabel("batch size")
        ax.set_ylabel("learning rate")
        ax.set_title(title, fontsize=10)
        fig.colorbar(image, ax=ax, label=f"mean dev {metric} ×100")  # the mean over seeds (cells: n=)
        save_figure(fig, path)
    finally:
        plt.close(fig)
    return path


def plot_memory_vs_time(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Peak memory against mean training time per run, one point per model × dataset (paper 001's Figure 12).
    GPU memory when every row recorded it, else the process's peak RSS."""
    plt = _pyplot()
    use_cuda = all(row["peak_cuda_mib"] is not None for row in rows)
    key, label = ("peak_cuda_mib", "peak CUDA memory allocated (MiB)") if use_cuda else \
        ("peak_rss_mib", "peak process RSS (MiB)")
    several_datasets = len({row["dataset"] for row in rows}) > 1
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    try:
        for row in rows:
            x, y = row["mean_train_time_per_run_s"], row[key]
            ax.scatter([x], [y], s=36)
            name = f"{row['model']} ({row['dataset']})" if several_datasets else row["model"]
            ax.annotate(name, (x, y), textcoords="offset points", xytext=(5, 4), fontsize=8)
        # from zero, since the ratio between models is the point; headroom for the labels
        ax.set_xlim(0, 1.25 * max(row["mean_train_time_per_run_s"] for row in rows))
        ax.set_ylim(0, 1.15 * max(row[key] for row in rows))
        ax.set_xlabel("mean training time per run (s)")
        ax.set_ylabel(label)
        ax.set_title("Cost per model: memory against time per grid-point run", fontsize=10)
        ax.grid(alpha=0.3)
        save_figure(fig, path)
    finally:
        plt.close(fig)
    return path


# ------------------------------------------------------------------------------------- tables

def _format_lr(learning_rate: float) -> str:
    """``1e-4``, ``3e-5``, ``2.5e-5``: one form for every rate (``:g`` writes 0.0001 beside 1e-05)."""
    mantissa, exponent = f"{learning_rate:.6e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def format_cost_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The cost table as Markdown: one row per model × dataset."""
    lines = ["| model | dataset | runs | grid points | total time | mean training time / run | train examples/s | "
             "peak RSS (MiB) | peak CUDA (MiB) | best (lr, batch) | dev at best | test at best | "
             "test P / R at best |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        best = row["best"]
        cuda = "—" if row["peak_cuda_mib"] is None else f"{row['peak_cuda_mib']:.0f}"
        p_r = ("—" if best["test_precision"] is None or best["test_recall"] is None
               else f"{best['test_precision'] * 100:.2f} / {best['test_recall'] * 100:.2f}")
        lines.append(
            f"| {row['model']} | {row['dataset']} | {row['runs']} | {row['grid_points']} | "
            f"{format_duration(row['total_time_s'])} | {format_duration(row['mean_train_time_per_run_s'])} | "
            f"{row['train_examples_per_s']:.1f} | {row['peak_rss_mib']:.0f} | {cuda} | "
            f"{_format_lr(best['learning_rate'])}, {best['batch_size']} | {_format_mean_sd(best['dev'])} | "
            f"{_format_mean_sd(best['test'])} | {p_r} |")
    return "\n".join(lines) + "\n"


def format_dev_table(cells_by_model: Mapping[str, Mapping[tuple[float, int], Cell]],
                     learning_rates: Sequence[float], batch_sizes: Sequence[int]) -> str:
    """One dataset's heatmaps as one Markdown table (paper 001's Figure 13 is such a table): a row
    per model × learning rate, a column per batch size; "—" where no run finished."""
    lines = ["| model | learning rate | " + " | ".join(f"batch {b}" for b in batch_sizes) + " |",
             "|---|---|" + "---|" * len(batch_sizes)]
    for model, cells in cells_by_model.items():
        for lr in learning_rates:
            scores = [cells[lr, b].dev.format() if (lr, b) in cells else "—" for b in batch_sizes]
            lines.append(f"| {model} | {_format_lr(lr)} | " + " | ".join(scores) + " |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------- report

def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "model"


def _by_model_and_dataset(runs: Sequence[SweepRun]) -> dict[tuple[str, str], list[SweepRun]]:
    groups: dict[tuple[str, str], list[SweepRun]] = {}
    for run in runs:
        groups.setdefault((run.model, run.dataset), []).append(run)
    return groups


@dataclass(frozen=True)
class DatasetGrids:
    """One dataset's grid over every model: the axes are the union of the models' grid points, so a
    point one model lacks shows as a blank cell; figures holds each model's heatmap."""

    learning_rates: list[float]
    batch_sizes: list[int]
    cells: dict[str, dict[tuple[float, int], Cell]]
    figures: dict[str, Path]


def _dataset_grids(groups: Mapping[tuple[str, str], list[SweepRun]], figures: Path) -> dict[str, DatasetGrids]:
    """One heatmap per model × dataset, on one colour scale per dataset."""
    grids = {}
    for dataset in dict.fromkeys(d for _, d in groups):
        of_dataset = {m: runs for (m, d), runs in groups.items() if d == dataset}
        learning_rates = sorted({r.learning_rate for runs in of_dataset.values() for r in runs})
        batch_sizes = sorted({r.batch_size for runs in of_dataset.values() for r in runs})
        cells = {m: grid_cells(runs) for m, runs in of_dataset.items()}
        means = [c.dev.mean for by_point in cells.values() for c in by_point.values()]
        paths = {model: plot_dev_heatmap(
            cells[model], learning_rates, batch_sizes, figures / f"dev_{_slug(model)}_{_slug(dataset)}.png",
            title=f"{model} on {dataset}: dev {runs[0].metric}", metric=runs[0].metric,
            value_range=(min(means), max(means))) for model, runs in of_dataset.items()}
        grids[dataset] = DatasetGrids(learning_rates, batch_sizes, cells, paths)
    return grids


def write_sweep_report(sweeps: Sequence[tuple[str, str | Path]], output_dir: str | Path) -> Path:
    """Read the sweeps (label, directory), write ``sweep_report.md``, ``sweep_report.json`` and the
    figures to ``output_dir``; returns the path of ``sweep_report.md``."""
    sweeps = [(label, Path(directory)) for label, directory in sweeps]
    runs, notes = collect_study(sweeps)
    out = Path(output_dir)
    groups = _by_model_and_dataset(runs)
    rows = [cost_row(model, dataset, group) for (model, dataset), group in groups.items()]
    grids = _dataset_grids(groups, out / FIGURES_DIR)
    cost_figure = plot_memory_vs_time(rows, out / FIGURES_DIR / "memory_vs_time.png")
    current = {p.resolve() for g in grids.values() for p in g.figures.values()}
    for stale in (out / FIGURES_DIR).glob("dev_*.png"):  # an earlier report's model, no longer in the study
        if stale.resolve() not in current:
            stale.unlink()
    out.mkdir(parents=True, exist_ok=True)
    study = {"sweeps": {label: str(directory) for label, directory in sweeps}, "rows": rows, "notes": notes,
             "runs": [{**asdict(r), "path": str(r.path)} for r in runs],
             "figures": {f"{m}/{d}": p.relative_to(out).as_posix() for d, g in grids.items()
                         for m, p in g.figures.items()}}
    (out / REPORT_JSON).write_text(json.dumps(study, indent=2) + "\n", encoding="utf-8")
    report = _markdown(sweeps, rows, grids, cost_figure, notes, out)
    (out / REPORT_FILE).write_text(report, encoding="utf-8")
    return out / REPORT_FILE


def _markdown(sweeps, rows, grids: Mapping[str, DatasetGrids], cost_figure: Path, notes, out: Path) -> str:
    lines = [f"# Sweep report: {', '.join(label for label, _ in sweeps)}", "",
             "Read from the run records (`run.json`) of: "
             + "; ".join(f"{label} = `{directory}`" for label, directory in sweeps) + ".", "",
             *(["## Notes", "", *(f"- {note}" for note in notes), ""] if notes else []),
             "## Cost and best grid point per model", "", format_cost_table(rows).rstrip("\n"), "",
             "Scores ×100, mean ± sample sd over seeds. *Best* is the grid point with the highest mean dev "
             "score (each run's dev score is its best epoch's, the epoch it keeps); *test at best* is that "
             "point's test score, with its precision and recall (entity metrics) beside it. *Total time* is "
             "the runs' wall time; *mean training time / run* their epochs alone (paper 001's Figure 12), "
             "without featurization and evaluation, and *train examples/s* training examples × epochs over "
             "it, averaged over runs. "
             "Peak memory is the largest peak any run recorded. Each run records its own: the runs of a "
             "sweep share a process, whose high-water mark is reset as each run starts where the system "
             "allows it (Linux; its `run.json` says `peak_rss_scope: run`), else it holds the earlier "
             "runs' too (`process`).", "",
             f"![memory against time]({cost_figure.relative_to(out).as_posix()})", "",
             "## Dev score over learning rate × batch size", "",
             "Each cell: mean dev score ×100 over seeds, ± sample sd, n seeds; blank: no finished run. "
             "One colour scale per dataset.", ""]
    modes = {row["dataset"]: row["f1_mode"] for row in rows if row.get("f1_mode")}
    for dataset, grid in grids.items():
        mode = f" (entity F1 in seqeval's {modes[dataset]} mode)" if dataset in modes else ""
        lines += [f"### {dataset}{mode}", ""]
        lines += [f"![{model}]({path.relative_to(out).as_posix()})" for model, path in grid.figures.items()]
        lines += ["", format_dev_table(grid.cells, grid.learning_rates, grid.batch_sizes)]
    return "\n".join(lines)
