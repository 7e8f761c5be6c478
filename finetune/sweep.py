"""The BLURB protocol over many runs: a hyperparameter grid × seeds per dataset, dev model selection,
test mean ± std, and the BLURB score.

The paper's protocol (section 2.4): learning rate {1e-5, 3e-5, 5e-5} × batch size {16, 32}, a fixed
number of epochs per dataset, and several seeds — 10 for BIOSSES, BioASQ and PubMedQA (small test
sets, noisy scores), 5 for the rest. Here, every grid point runs every seed; the grid point with
the best *mean dev score over seeds* is selected, and its test scores are reported as mean ± sample
std over seeds. (Selecting on the mean rather than per seed keeps test-set noise out of the choice.)

Each run is one :func:`finetune.trainer.run_finetune` call with its own directory::

    <output_dir>/<dataset>/lr3e-05_bs32_ep20/seed1/run.json

A run whose ``run.json`` is complete is skipped, so a killed sweep, re-run with the same command,
continues where it stopped and never redoes a finished run. The summary (``summary.json``) and the
table (``blurb.md``) are rebuilt from the run records alone, so they can also be produced for runs
made elsewhere (:func:`collect_runs`, :func:`summarize`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Iterable, Mapping, Sequence

from biomed_lm.backend import decided_on_rank0, rank0_log, start_distributed
from biomed_lm.errors import ConfigError, InputError
from biomed_lm.finetune.blurb import (BLURB, BLURB_DATASETS, BLURB_TASK_OF, BLURB_TASK_TYPES, UnknownDatasetError,
                                      canonical_dataset_name, default_max_length)
from biomed_lm.finetune.metrics import MeanStd, blurb_score, mean_std
from biomed_lm.finetune.model_check import check_model
from biomed_lm.finetune.sweep_pool import RunOutcome, SweepRunFailed, outcomes
from biomed_lm.finetune.trainer import (RUN_RECORD, FinetuneArgs, RunOptions, data_fingerprint, finished_record,
                                        is_complete_run, run_finetune)
from biomed_lm.resources import resolve_path
from biomed_lm.run_lock import ARTIFACT_LOCK_FILE, acquire_run_lock

__all__ = ["DatasetProtocol", "PROTOCOL", "SweepArgs", "SweepPlan", "PlannedRun", "run_options", "plan_sweep",
           "run_sweep", "collect_runs", "summarize", "format_table", "find_dataset_dir", "SUMMARY_FILE", "TABLE_FILE"]

SUMMARY_FILE = "summary.json"
ERROR_FILE = "error.txt"  # a failed run's traceback, in its folder (removed once the run completes)
TABLE_FILE = "blurb.md"
PLAN_FILE = "plan.json"  # the runs the sweep sets out to make, written before the first: a report of a sweep
#                          cut short says which are missing (launch/sweep_report.py)


@dataclass(frozen=True)
class DatasetProtocol:
    """Per-dataset defaults of the sweep, read from the registry (:class:`finetune.blurb.BlurbEntry`:
    epochs chosen in the paper's 2-60 range by dataset size, the paper's seeds, where the dataset
    lies under data_root). The input length is the entry's too (:meth:`SweepArgs.max_length_for`)."""

    epochs: int
    num_seeds: int
    directories: tuple[str, ...] = ()  # where the dataset lies under data_root, first match wins


PROTOCOL: Mapping[str, DatasetProtocol] = MappingProxyType(
    {name: DatasetProtocol(e.epochs, e.num_seeds, e.directories) for name, e in BLURB.items()})


@dataclass
class SweepArgs(RunOptions):
    """A BLURB sweep (YAML keys and flags of ``launch/blurb.py``): the run options
    (:class:`finetune.trainer.RunOptions`), passed to each run, and what the sweep sets per run — the
    datasets and where they lie, the grid, the seeds, where the runs write."""

    output_dir: str = field(default="", metadata={"help": "one directory per run below it, plus summary.json "
                                                           "and blurb.md"})
    data_root: str = field(default="data/blurb", metadata={
        "help": "directory holding the datasets (BLURB's names, flat or under ner/, re/, ...)"})
    datasets: list[str] = field(default_factory=lambda: list(BLURB_DATASETS), metadata={
        "help": "BLURB datasets to run (default: all 13; absent ones are reported, not fatal)"})
    data_dirs: list[str] = field(default_factory=list, metadata={
        "help": "NAME=DIR overrides of where a dataset lies, e.g. bioasq=/data/bioasq"})
    learning_rates: list[float] = field(default_factory=lambda: [1e-5, 3e-5, 5e-5], metadata={
        "help": "the grid's peak learning rates", "gt": 0})
    batch_sizes: list[int] = field(default_factory=lambda: [16, 32], metadata={"help": "the grid's batch sizes",
                                                                              "min": 1})
    epochs: int | None = field(default=None, metadata={"help": "epochs for every dataset (default: per dataset, "
                                                                "biomed_lm.finetune.sweep.PROTOCOL)", "min": 1})
    num_seeds: int | None = field(default=None, metadata={"help": "seeds per grid point (default: 10 for BIOSSES, "
                                                                   "BioASQ, PubMedQA; 5 otherwise)", "min": 1})
    first_seed: int = field(default=1, metadata={"help": "seeds are first_seed, first_seed + 1, ...", "min": 0})
    stop_on_error: bool = field(default=False, metadata={
        "help": "stop at the first failed run (default: record the failure and go on with the other datasets)"})
    parallel_runs: int = field(default=1, metadata={
        "help": "runs at a time, each in a process of its own on a GPU of its own (at most the GPUs visible; "
                "on a CPU they share the cores); 1: one at a time in this process", "min": 1})

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.output_dir:
            raise ConfigError("output_dir is required")
        for name in ("datasets", "learning_rates", "batch_sizes"):
            if not getattr(self, name):
                raise ConfigError(f"{name} is empty")
        try:
            self.datasets = list(dict.fromkeys(canonical_dataset_name(d) for d in self.datasets))
        except UnknownDatasetError as err:
            raise ConfigError(f"datasets: {err}") from None
        self.data_dir_overrides()  # reject malformed NAME=DIR entries now
        if self.parallel_runs > 1 and self.deepspeed:
            raise ConfigError(f"parallel_runs {self.parallel_runs} runs each fine-tuning in a process of its own on "
                              "one GPU; under --deepspeed every run uses all of the launcher's ranks: use one of them")

    def data_dir_overrides(self) -> dict[str, Path]:
        overrides = {}
        for item in self.data_dirs:
            name, sep, path = item.partition("=")
            if not sep or not path:
                raise ConfigError(f"data_dirs: expected NAME=DIR, got {item!r}")
            try:
                overrides[canonical_dataset_name(name)] = Path(path)
            except UnknownDatasetError as err:
                raise ConfigError(f"data_dirs: {err}") from None
        return overrides

    def epochs_for(self, dataset: str) -> int:
        return self.epochs if self.epochs is not None else PROTOCOL[dataset].epochs

    def seeds_for(self, dataset: str) -> list[int]:
        count = self.num_seeds if self.num_seeds is not None else PROTOCOL[dataset].num_seeds
        return list(range(self.first_seed, self.first_seed + count))

    def max_length_for(self, dataset: str) -> int:
        """``max_length``, else the dataset's own: the same default a single run takes."""
        return self.max_length if self.max_length is not None else default_max_length(dataset)


# ---------------------------------------------------------------------------------- planning

def find_dataset_dir(dataset: str, data_root: str | Path, overrides: Mapping[str, Path] | None = None
                     ) -> tuple[Path | None, list[Path]]:
    """Where ``dataset`` lies: its override, else the first of its usual directories under
    ``data_root`` that exists. Returns the directory (None when absent) and the places tried."""
    if overrides and dataset in overrides:
        path = overrides[dataset]
        return (path if path.is_dir() else None), [path]
    tried = [resolve_path(data_root) / sub for sub in PROTOCOL[dataset].directories]
    return next((p for p in tried if p.is_dir()), None), tried


@dataclass(frozen=True)
class PlannedRun:
    dataset: str
    learning_rate: float
    batch_size: int
    epochs: int
    seed: int
    args: FinetuneArgs

    @property
    def grid_point(self) -> str:
        return grid_point_name(self.learning_rate, self.batch_size, self.epochs)


def grid_point_name(learning_rate: float, batch_size: int, epochs: int) -> str:
    return f"lr{learning_rate:g}_bs{batch_size}_ep{epochs}"


@dataclass
class SweepPlan:
    runs: list[PlannedRun]
    absent: dict[str, str]  # dataset -> why it is not in the sweep (the places looked at)


def run_options(args: SweepArgs, dataset: str) -> dict[str, Any]:
    """The run options of ``dataset``'s runs: the sweep's own (every :class:`RunOptions` field), with
    the dataset's input length when none is given and ``allow_missing_train`` for NER datasets only."""
    options = {f.name: getattr(args, f.name) for f in dataclasses.fields(RunOptions)}
    return options | {"max_length": args.max_length_for(dataset),
                      "allow_missing_train": args.allow_missing_train and BLURB_TASK_OF[dataset] == "ner"}


def plan_sweep(args: SweepArgs) -> SweepPlan:
    """Every run of the sweep, in order (dataset, grid point, seed), and the datasets not found."""
    overrides = args.data_dir_overrides()
    runs, absent = [], {}
    for dataset in args.datasets:
        data_dir, tried = find_dataset_dir(dataset, args.data_root, overrides)
        if data_dir is None:
            absent[dataset] = "not found at " + ", ".join(str(p) for p in tried)
            continue
        epochs, options = args.epochs_for(dataset), run_options(args, dataset)
        for learning_rate in args.learning_rates:
            for batch_size in args.batch_sizes:
                for seed in args.seeds_for(dataset):
                    out = Path(args.output_dir) / dataset / grid_point_name(learning_rate, batch_size, epochs) \
                        / f"seed{seed}"
                    finetune_args = FinetuneArgs(
                        **options, dataset=dataset, data_dir=str(data_dir), output_dir=str(out),
                        learning_rate=learning_rate, batch_size=batch_size, epochs=epochs, seed=seed)
                    runs.append(PlannedRun(dataset, learning_rate, batch_size, epochs, seed, finetune_args))
    return SweepPlan(runs, absent)


# ----------------------------------------------------------------------------------- running

def run_sweep(args: SweepArgs, log: Callable[[str], None] = print, progress: bool = True) -> dict[str, Any]:
    """Run (or resume) the sweep and write ``summary.json`` and ``blurb.md``; returns the summary.

    The model is checked first (:func:`finetune.model_check.check_model`; InputError if unusable).
    A failed run (bad data, out of memory, ...) is recorded in the summary with its error and the
    rest of its dataset is not attempted; the other datasets go on (``stop_on_error`` re-raises).
    One sweep at a time owns ``output_dir`` (:mod:`biomed_lm.run_lock`): a second one is refused
    (``RunDirectoryLocked``) before it reads or writes anything there.
    """
    # Under the deepspeed launcher every rank runs the sweep (each run is one job of all ranks): rank 0
    # holds the lock, and a refusal reaches every rank (decided_on_rank0) rather than leave rank 0's peers
    # waiting in the first run's collectives.
    rank = start_distributed(args.deepspeed, "blurb").rank
    log, progress = rank0_log(rank, log), progress and rank == 0
    lock = decided_on_rank0(rank, lambda: acquire_run_lock(args.output_dir, ARTIFACT_LOCK_FILE), share=False)
    failed = True
    try:
        summary = _run_sweep(args, rank, log, progress)
        failed = False
        return summary
    finally:
        if lock is not None:  # a refused sweep leaves no folder behind (nothing else was written in it)
            lock.release(failed=failed)


def _count_finished_runs(runs: Sequence[PlannedRun], fingerprints: Mapping[str, Mapping[str, str]],
                         output_dir: str) -> int:
    """How many planned runs are already complete; before any run starts (or any summary is rewritten), a
    folder holding finished runs of other settings or data is refused, naming them: a sweep resumed with a
    changed flag failed every run and then wrote a summary of the old scores under the new settings (QA)."""
    done, refused = 0, []
    for run in runs:
        try:
            done += finished_record(run.args, Path(run.args.output_dir) / RUN_RECORD,
                                    fingerprints[run.args.data_dir]) is not None
        except InputError as err:
            refused.append(str(err))
    if refused:
        more = f" (and {len(refused) - 1} more run(s) like it)" if len(refused) > 1 else ""
        raise InputError(f"{output_dir} holds finished runs this sweep would not make: {refused[0]}{more}; "
                         "nothing was run or rewritten")
    return done


def _run_sweep(args: SweepArgs, rank: int, log: Callable[[str], None], progress: bool) -> dict[str, Any]:
    from tqdm.auto import tqdm

    # Once, before any run: a model every run would fail on is the sweep's error, not each run's.
    checked = check_model(args.model, resize_embeddings=args.resize_embeddings)
    for note in checked.notes:
        log(note)
    args = dataclasses.replace(args, model=str(checked.directory))
    plan = plan_sweep(args)
    for dataset, why in plan.absent.items():
        log(f"{dataset}: absent ({why})")
    fingerprints = {data_dir: data_fingerprint(data_dir) for data_dir in {r.args.data_dir for r in plan.runs}}
    if not plan.runs and plan.absent:
        raise InputError(f"none of the datasets asked for is under data_root {Path(args.data_root).resolve()}: "
                         + "; ".join(f"{dataset}: {why}" for dataset, why in plan.absent.items()))
    done = _count_finished_runs(plan.runs, fingerprints, args.output_dir)
    if rank == 0:
        _write_plan(plan.runs, Path(args.output_dir), args.model)
    log(f"{len(plan.runs)} runs over {len({r.dataset for r in plan.runs})} datasets; {done} already complete")
    failed: dict[str, str] = {}
    said: set[tuple[str, str]] = set()
    bar = tqdm(total=len(plan.runs), desc="BLURB sweep", unit="run", dynamic_ncols=True, disable=not progress)

    def say(message: str) -> None:  # on its own line, not after the bar's
        with tqdm.external_write_mode():
            log(message)
    def warn_for(run: PlannedRun) -> Callable[[str], None]:
        return _warnings_once(run.dataset, said, say)
    held: dict[str, str] = {}  # datasets with runs another live process holds
    try:
        with contextlib.closing(outcomes(plan.runs, run_finetune, fingerprints, failed, args.parallel_runs,
                                         warn_for)) as results:  # closed on an error: the workers stop at once
            for run, outcome in results:
                _record_outcome(run, outcome, args, (failed, held), warn_for(run), say)
                bar.set_postfix(dataset=run.dataset, grid=run.grid_point, seed=run.seed, refresh=False)
                bar.update()
        bar.update(bar.total - bar.n)  # the runs of failed datasets, not attempted
    finally:
        bar.close()
    for dataset, why in held.items():  # not finished, so not a sweep that succeeded (QA: exit 0, summary silent)
        failed.setdefault(dataset, f"run(s) not attempted: {why}")
    records = [json.loads((Path(r.args.output_dir) / RUN_RECORD).read_text(encoding="utf-8"))
               for r in plan.runs if is_complete_run(Path(r.args.output_dir) / RUN_RECORD)]
    summary = summarize(records, absent=plan.absent, failed=failed,
                        expected={d: sum(r.dataset == d for r in plan.runs) for d in args.datasets
                                  if d not in plan.absent})
    summary["sweep"] = dataclasses.asdict(args)
    if rank == 0:  # under the deepspeed launcher every rank runs the sweep
        out = Path(args.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        (out / TABLE_FILE).write_text(format_table(summary), encoding="utf-8")
    return summary


def _record_outcome(run: PlannedRun, outcome: RunOutcome, args: SweepArgs,
                    failures: tuple[dict[str, str], dict[str, str]], warn: Callable[[str], None],
                    say: Callable[[str], None]) -> None:
    """Say how a run ended and keep what a resumed sweep needs: a failed run's error file, and its dataset
    in ``failed`` (whose runs not yet started are not attempted) or, for a run another live process holds,
    in ``held`` (``failures`` is the two)."""
    failed, held = failures
    for line in outcome.warnings:
        warn(line)
    folder = Path(run.args.output_dir)
    if outcome.in_use:  # another process's run: not this dataset's failure, and not this sweep's folder to mark
        say(f"{run.dataset} {run.grid_point} seed {run.seed}: not attempted: {outcome.error}")
        held.setdefault(run.dataset, outcome.error)
        return
    if outcome.error is None:
        if not outcome.skipped:
            say(f"{run.dataset} {run.grid_point} seed {run.seed}: dev {outcome.dev:.4f}, test {outcome.test:.4f} "
                f"({outcome.seconds:.0f} s)")
        # An earlier attempt's error is over: its folder should not read as failed and complete at once.
        (folder / ERROR_FILE).unlink(missing_ok=True)
        return
    folder.mkdir(parents=True, exist_ok=True)
    (folder / ERROR_FILE).write_text(outcome.details, encoding="utf-8")
    if args.stop_on_error:
        if outcome.exception is not None:  # one at a time: the error itself, as the run raised it
            raise outcome.exception
        raise SweepRunFailed(f"{run.dataset} run {run.grid_point}/seed{run.seed} failed: {outcome.error} (its "
                             f"traceback: {folder / ERROR_FILE})")
    failed[run.dataset] = outcome.error
    say(f"{run.dataset}: run {run.grid_point}/seed{run.seed} failed: {outcome.error}")


def _write_plan(runs: Sequence[PlannedRun], out: Path, model: str) -> None:
    plan = {"model": model, "runs": [{"dataset": r.dataset, "learning_rate": r.learning_rate,
                                      "batch_size": r.batch_size, "seed": r.seed, "output_dir": r.args.output_dir}
                                     for r in runs]}
    out.mkdir(parents=True, exist_ok=True)
    (out / PLAN_FILE).write_text(json.dumps(plan, indent=2) + "\n", encoding="utf-8")


# ------------------------------------------------------------------------------- summarizing

def collect_runs(root: str | Path) -> list[dict[str, Any]]:
    """Every complete run record (``run.json``) below ``root``."""
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(Path(root).rglob(RUN_RECORD))
            if is_complete_run(p)]


def _grid_key(record: Mapping[str, Any]) -> tuple:
    """What makes runs of one dataset the same grid point: every hyperparameter but the seed."""
    settings = dict(record.get("settings") or record["hyperparameters"])
    if "max_length" in record.get("hyperparameters", {}):  # the length used: None in older records meant a default
        settings["max_length"] = record["hyperparameters"]["max_length"]
    for key in ("seed", "output_dir", "data_dir", "model", "dataset"):
        settings.pop(key, None)
    return tuple(sorted((k, json.dumps(v, sort_keys=True)) for k, v in settings.items()))


def _warnings_once(dataset: str, said: set[tuple[str, str]], say: Callable[[str], None]) -> Callable[[str], None]:
    """A run's log for the sweep: its warnings (a one-label slice, a dataset's own) once per dataset,
    the rest of its lines dropped (the bar and the per-run score line say the progress)."""
    def log(message: str) -> None:
        if message.startswith("warning: ") and (dataset, message) not in said:
            said.add((dataset, message))
            say(f"{dataset}: {message}")
    return log


def _run_warnings(runs: Sequence[Mapping[str, Any]], selected: Sequence[Mapping[str, Any]]) -> list[str]:
    """The runs' dataset and slice warnings, and the selected grid point's prediction warnings (another
    point's one-label predictions do not bear on the reported score), each once, in the order first seen."""
    found = [w for r in runs for kind in ("dataset_warnings", "slice_warnings") for w in r.get(kind, [])]
    found += [f"{w} (seed {r['seed']})" for r in selected for w in r.get("prediction_warnings", [])]
    return list(dict.fromkeys(found))


def summarize(records: Iterable[Mapping[str, Any]], *, absent: Mapping[str, str] | None = None,
              failed: Mapping[str, str] | None = None, expected: Mapping[str, int] | None = None
              ) -> dict[str, Any]:
    """Per dataset: every grid point's dev/test mean ± std over seeds, the grid point selected by
    mean dev score, its test mean ± std, and the (possibly partial) BLURB score over datasets.

    ``records`` must come from one model; a mix of models raises ValueError. ``expected`` (runs
    planned per dataset) marks datasets whose sweep is not finished as incomplete.
    """
    records = list(records)
    models = sorted({r["model"] for r in records})
    if len(models) > 1:
        raise InputError(f"run records of several models: {', '.join(models)}; summarize one model at a time")
    by_dataset: dict[str, list[Mapping[str, Any]]] = {}
    for record in records:
        by_dataset.setdefault(_dataset_id(record["dataset"]), []).append(record)
    datasets: dict[str, Any] = {}
    for dataset, runs in by_dataset.items():
        grid: dict[tuple, list[Mapping[str, Any]]] = {}
        for run in runs:
            grid.setdefault(_grid_key(run), []).append(run)
        scored = []  # (grid point, its runs)
        for group in grid.values():
            group = sorted(group, key=lambda r: r["seed"])
            hp = group[0]["hyperparameters"]
            dev, test = mean_std(r["best_dev_score"] for r in group), mean_std(r["test_score"] for r in group)
            scored.append(({"learning_rate": hp["learning_rate"], "batch_size": hp["batch_size"],
                            "epochs": hp["epochs"], "seeds": [r["seed"] for r in group],
                            "dev": _ms(dev), "test": _ms(test),
                            "wall_time_s": sum(r.get("wall_time_s", 0.0) for r in group),
                            "peak_rss_bytes": max(r.get("memory", {}).get("peak_rss_bytes", 0) for r in group)},
                           group))
        # The best mean dev score wins; ties go to the point with more seeds, then the smaller lr.
        scored.sort(key=lambda pair: (-pair[0]["dev"]["mean"], -pair[0]["dev"]["n"], pair[0]["learning_rate"],
                                      pair[0]["batch_size"]))
        points = [point for point, _ in scored]
        best, best_runs = scored[0]
        entry = {"task_type": runs[0]["task_type"], "metric": runs[0]["metric"], "runs": len(runs),
                 "selected": {k: best[k] for k in ("learning_rate", "batch_size", "epochs", "seeds")},
                 "dev": best["dev"], "test": best["test"], "grid": points,
                 "notes": list(runs[0].get("dataset_notes", [])), "warnings": _run_warnings(runs, best_runs),
                 "differs_from_blurb": runs[0].get("dataset_differs_from_blurb")}
        if expected is not None and dataset in expected and len(runs) < expected[dataset]:
            entry["incomplete"] = f"{len(runs)} of {expected[dataset]} runs complete"
        datasets[dataset] = entry
    ordered = {d: datasets[d] for d in sorted(datasets, key=_order)}
    blurb_inputs = {d: e["test"]["mean"] for d, e in ordered.items() if d in BLURB_DATASETS}
    summary: dict[str, Any] = {
        "model": models[0] if models else None,
        "datasets": ordered,
        "absent": dict(absent or {}),
        "failed": dict(failed or {}),
        "blurb": blurb_score(blurb_inputs).to_dict() if blurb_inputs else None,
    }
    if summary["blurb"] is not None:  # which of its datasets are not the data BLURB scores, and how
        summary["blurb"]["other_data"] = {d: e["differs_from_blurb"] for d, e in ordered.items()
                                          if d in blurb_inputs and e.get("differs_from_blurb")}
    return summary


def _dataset_id(name: str) -> str:
    try:
        return canonical_dataset_name(name)
    except UnknownDatasetError:
        return name  # a generic dataset: summarized, but not part of the BLURB score


def _order(dataset: str) -> tuple[int, str]:
    return (BLURB_DATASETS.index(dataset) if dataset in BLURB_DATASETS else len(BLURB_DATASETS), dataset)


def _ms(value: MeanStd) -> dict[str, Any]:
    return {"mean": value.mean, "std": None if math.isnan(value.std) else value.std, "n": value.n}


def _format_ms(entry: Mapping[str, Any]) -> str:
    return MeanStd(entry["mean"], math.nan if entry["std"] is None else entry["std"], entry["n"]).format()


def format_table(summary: Mapping[str, Any]) -> str:
    """The summary as Markdown: one row per dataset (test mean ± std over seeds at the selected grid
    point), then the task-type scores and the BLURB score, then what was absent or failed."""
    lines = [f"# BLURB results: `{summary.get('model')}`", ""]
    lines += ["| task type | dataset | metric | selected (lr, batch, epochs) | seeds | dev | test |",
              "|---|---|---|---|---|---|---|"]
    for dataset, entry in summary["datasets"].items():
        sel = entry["selected"]
        flag = f" ({entry['incomplete']})" if entry.get("incomplete") else ""
        lines.append(f"| {entry['task_type']} | {dataset}{flag} | {entry['metric']} | "
                     f"{sel['learning_rate']:g}, {sel['batch_size']}, {sel['epochs']} | {len(sel['seeds'])} | "
                     f"{_format_ms(entry['dev'])} | {_format_ms(entry['test'])} |")
    blurb = summary.get("blurb")
    lines.append("")
    if blurb:
        lines += ["| task type | score | datasets present |", "|---|---|---|"]
        for task, datasets in BLURB_TASK_TYPES.items():
            present = [d for d in datasets if d in blurb["dataset_scores"]]
            score = f"{blurb['task_scores'][task] * 100:.2f}" if task in blurb["task_scores"] else "—"
            lines.append(f"| {task} | {score} | {', '.join(present) or 'none'} of {len(datasets)} |")
        lines += ["", f"**{blurb['label']}: {blurb['score'] * 100:.2f}**"]
        if blurb["partial"]:
            lines.append("(Partial: not comparable with the paper's BLURB scores, which average all 13 datasets.)")
        if blurb.get("other_data"):
            differ = "; ".join(f"{d}: {why}" for d, why in blurb["other_data"].items())
            lines.append(f"(On data other than BLURB's for {len(blurb['other_data'])} dataset(s), so not directly "
                         f"comparable with the paper's scores: {differ}.)")
    else:
        lines.append("No BLURB dataset finished: no BLURB score.")
    notes = [f"- {d}: absent ({why})" for d, why in summary.get("absent", {}).items()]
    notes += [f"- {d}: failed ({why})" for d, why in summary.get("failed", {}).items()]
    notes += [f"- {d}: {n}" for d, e in summary["datasets"].items() for n in e.get("notes", [])]
    notes += [f"- {d}: warning: {w}" for d, e in summary["datasets"].items() for w in e.get("warnings", [])]
    if notes:
        lines += ["", "Notes:", *notes]
    return "\n".join(lines) + "\n"

