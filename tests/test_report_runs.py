"""Which fine-tuning runs the ablation report reads, and what it says about them (experiments/report.py,
launch/report.py), on small synthetic ablation folders of schema version 2 (no pretraining).

The plan is ablation.json's ``finetune`` block, as launch/ablate.py writes it: one dataset (NCBI-disease),
one grid point (lr 5e-4, batch 16, 3 epochs), two seeds, 256 training examples. The run records carry
the settings a real sweep records (finetune.trainer's), so the report judges them as the sweep would.
"""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
import sys
import types
from pathlib import Path

import pandas as pd
import pytest

from biomed_lm.experiments.ablation_record import (AblationRecord, CheckpointRecord, VariantRecord,
                                                  write_ablation_record)
from biomed_lm.experiments.report import AblationError, PlotResult, plot_pretraining_loss, load_ablation, write_report
from biomed_lm.finetune.trainer import FinetuneArgs, run_settings

REPO = Path(__file__).resolve().parents[1]
DATASET = "ncbi-disease"
PLAN = {"data_root": "data/blurb", "datasets": [DATASET], "learning_rates": [5e-4], "batch_sizes": [16],
        "epochs": 3, "num_seeds": 2, "max_length": 64, "max_train_examples": 256}
VARIANTS = {"general": {"vocabulary": "general"}, "in-domain": {"vocabulary": "in-domain"}}


def run_record(model: str, seed: int, score: float, *, learning_rate: float = 5e-4, epochs: int = 3,
               max_train_examples: int = 256) -> dict:
    """A complete run.json as finetune.trainer writes it (the fields the report reads)."""
    args = FinetuneArgs(model=model, dataset=DATASET, data_dir="data", output_dir="out", max_length=64,
                        max_train_examples=max_train_examples, learning_rate=learning_rate, batch_size=16,
                        epochs=epochs, seed=seed)
    hp = {"learning_rate": learning_rate, "batch_size": 16, "epochs": epochs, "max_length": 64}
    return {"status": "complete", "model": model, "dataset": DATASET, "task_type": "ner", "metric": "entity_f1",
            "seed": seed, "epochs": epochs, "hyperparameters": hp, "settings": run_settings(args),
            "best_dev_score": score, "test_score": score - 0.01, "test": {"score": score - 0.01},
            "wall_time_s": 5.0 + seed, "memory": {"peak_rss_bytes": 2 ** 30}}


def write_run(finetune_dir: Path, record: dict) -> Path:
    hp = record["hyperparameters"]
    path = (finetune_dir / DATASET / f"lr{hp['learning_rate']:g}_bs{hp['batch_size']}_ep{hp['epochs']}"
            / f"seed{record['seed']}" / "run.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record), encoding="utf-8")
    return path


def build(root: Path, *, runs: int = 1, plan: dict | None = PLAN, metrics_steps: int = 0) -> Path:
    """An ablation folder: two variants × ``runs`` pretraining runs, each with the plan's runs complete
    (absolute directories in ablation.json, as launch/ablate.py writes them)."""
    root.mkdir(parents=True, exist_ok=True)
    variants = {}
    for v, (name, levels) in enumerate(VARIANTS.items()):
        checkpoints = []
        for run in range(1, runs + 1):
            suffix = "" if run == 1 else f"-run{run}"
            pretrain = root / "variants" / name / f"pretrain{suffix}"
            finetune = root / "variants" / name / f"finetune{suffix}"
            pretrain.mkdir(parents=True)
            checkpoints.append(CheckpointRecord(run=run, seed=41 + run, model=str(pretrain / "model"),
                                                pretrain_dir=str(pretrain), finetune_dir=str(finetune)))
            for seed in (1, 2):
                write_run(finetune, run_record(str(pretrain / "model"), seed, 0.5 + 0.1 * v + 0.01 * seed + 0.02 * run))
            if metrics_steps:
                lines = [json.dumps({"step": s, "loss": 10.0 / s + run}) for s in range(1, metrics_steps + 1)]
                (pretrain / "metrics.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
        variants[name] = VariantRecord(dict(levels), tuple(checkpoints))
    record = AblationRecord(name="runs-test", factors={"vocabulary": ["general", "in-domain"]}, variants=variants,
                            datasets=[DATASET], budget={"steps": 10, "global_batch_size": 4}, pretrain_seeds=runs,
                            finetune=dict(plan or {}), failed=[])
    write_ablation_record(record, root)
    return root


def _no_plots(monkeypatch):
    for name in ("plot_pretraining_loss", "plot_test_scores", "plot_cost"):
        monkeypatch.setattr(f"biomed_lm.experiments.report.{name}", lambda *a: PlotResult("skipped", None, "test"))


def _launch_main(monkeypatch):
    name = "launch_report_runs_under_test"
    spec = importlib.util.spec_from_file_location(name, REPO / "launch" / "report.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module.main


# ------------------------------------------------------------------------- stale runs (QA finding 1)

def _add_stale_runs(root: Path) -> None:
    """An earlier configuration's runs (lr 2e-4, 1 epoch, 64 examples) beside each variant's planned
    ones, and one planned folder whose record has other settings (64 examples: the sweep would refuse it)."""
    for name in VARIANTS:
        finetune = root / "variants" / name / "finetune"
        model = str(root / "variants" / name / "pretrain" / "model")
        for seed in (1, 2):
            write_run(finetune, run_record(model, seed, 0.1, learning_rate=2e-4, epochs=1, max_train_examples=64))
    model = str(root / "variants" / "in-domain" / "pretrain" / "model")
    write_run(root / "variants" / "in-domain" / "finetune", run_record(model, 2, 0.2, max_train_examples=64))


def test_runs_the_plan_does_not_ask_for_are_left_out_and_counted(tmp_path, capsys, monkeypatch):
    root = build(tmp_path / "abl")
    _add_stale_runs(root)
    _no_plots(monkeypatch)
    report = write_report(root)
    rows = pd.read_csv(root / "report" / "runs.csv")
    assert set(zip(rows["learning_rate"], rows["epochs"])) == {(5e-4, 3)}
    assert len(rows) == 3 and rows.groupby("variant").size().to_dict() == {"general": 2, "in-domain": 1}
    line = (f"left out 5 complete fine-tuning runs that the plan in {root / 'ablation.json'} ('finetune') does "
            f"not ask for")
    example = str(root / "variants" / "general" / "finetune" / DATASET / "lr0.0002_bs16_ep1")
    err = capsys.readouterr().err.splitlines()
    assert [e for e in err if line in e] == [f"report: warning: {line} (an earlier configuration's grid points, "
                                             f"seeds or settings), e.g. {example}"]
    assert line in report.read_text(encoding="utf-8") and line in (root / "report" / "results.md").read_text()
    assert "; 1 grid point |" in (root / "report" / "results.md").read_text(encoding="utf-8")


def test_without_a_plan_a_sweep_folder_mixing_configurations_is_refused(tmp_path, capsys, monkeypatch):
    root = build(tmp_path / "abl", plan=None)
    write_report(root, tmp_path / "clean")  # one configuration on disk: read as it is
    assert len(pd.read_csv(tmp_path / "clean" / "runs.csv")) == 4
    _add_stale_runs(root)
    with pytest.raises(AblationError, match=r"differ in epochs, max_train_examples, not only in learning rate.*"
                                            r"holds no fine-tuning plan \('finetune'\).*move those out of"):
        write_report(root, tmp_path / "mixed")
    capsys.readouterr()  # the reports above warned of their metrics files
    assert _launch_main(monkeypatch)(["--ablation_dir", str(root), "--output_dir", str(tmp_path / "cli")]) == 2
    assert capsys.readouterr().err.startswith("report: error: sweep 'general'")


# ------------------------------------------------------------ damaged run records (QA findings 2, 3)

def test_a_complete_record_without_a_field_is_a_warning_naming_the_file_and_field(tmp_path, capsys, monkeypatch):
    """QA (2026-11-29): it stopped the whole report (exit 2), leaving an earlier report.md with the old numbers,
    where a truncated record is a warning; it is now left out as that one is."""
    root = build(tmp_path / "abl")
    path = root / "variants" / "general" / "finetune" / DATASET / "lr0.0005_bs16_ep3" / "seed1" / "run.json"
    record = json.loads(path.read_text(encoding="utf-8"))
    del record["test_score"]
    path.write_text(json.dumps(record), encoding="utf-8")
    _no_plots(monkeypatch)
    assert _launch_main(monkeypatch)(["--ablation_dir", str(root)]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if str(path) in line]
    assert err == [f"report: warning: {path}: field 'test_score' is missing; counted as not complete"]
    assert len(pd.read_csv(root / "report" / "runs.csv")) == 3


def test_a_record_of_another_dataset_in_a_planned_folder_is_left_out_as_stale(tmp_path, capsys, monkeypatch):
    """QA (2026-11-29): a run.json saying jnlpba in ncbi-disease's planned folder made a jnlpba row of one run."""
    root = build(tmp_path / "abl")
    path = root / "variants" / "general" / "finetune" / DATASET / "lr0.0005_bs16_ep3" / "seed1" / "run.json"
    record = json.loads(path.read_text(encoding="utf-8"))
    path.write_text(json.dumps({**record, "dataset": "jnlpba"}), encoding="utf-8")
    _no_plots(monkeypatch)
    write_report(root)
    runs = pd.read_csv(root / "report" / "runs.csv")
    assert len(runs) == 3 and "jnlpba" not in set(runs["dataset"])


def test_a_truncated_record_is_a_warning_and_counts_as_not_complete(tmp_path, capsys, monkeypatch):
    root = build(tmp_path / "abl")
    path = root / "variants" / "in-domain" / "finetune" / DATASET / "lr0.0005_bs16_ep3" / "seed2" / "run.json"
    path.write_text(path.read_text(encoding="utf-8")[:100], encoding="utf-8")
    _no_plots(monkeypatch)
    report = write_report(root)
    err = [line for line in capsys.readouterr().err.splitlines() if str(path) in line]
    assert len(err) == 1 and err[0].startswith(f"report: warning: {path}: not a readable run record (")
    assert err[0].endswith("; counted as not complete")
    assert len(pd.read_csv(root / "report" / "runs.csv")) == 3
    text = report.read_text(encoding="utf-8")
    assert f"{path}: not a readable run record" in text and "1 of 2 runs complete" in text


# ------------------------------------------------------------------ runs read elsewhere (QA finding 4)

def test_a_copied_ablation_says_where_it_read_the_runs_from(tmp_path, capsys, monkeypatch):
    original = build(tmp_path / "original")
    _no_plots(monkeypatch)
    write_report(original)
    assert "read the runs from" not in capsys.readouterr().err
    assert "read the runs from" not in (original / "report" / "report.md").read_text(encoding="utf-8")
    copy = tmp_path / "copy"
    shutil.copytree(original, copy)
    report = write_report(copy)
    line = (f"read the runs from {original / 'variants'} (the absolute folders {copy / 'ablation.json'} names, "
            f"which exist), not from below {copy}")
    assert capsys.readouterr().err.splitlines() == [f"report: warning: {line}"]
    assert f"Note: {line}." in report.read_text(encoding="utf-8")


# ----------------------------------------------------------------- text and numbers (QA finding 5)

class _Fit:
    """A stand-in for the multilevel result: what the report's analysis section reads."""

    specification, notes, n_checkpoints = "checkpoints", [], 0

    def to_dict(self):
        return {}

    def to_markdown(self):
        return "# fit\n"

    def reading(self):
        return []


def test_the_report_counts_the_variants_and_pretraining_runs_that_have_runs(tmp_path, monkeypatch):
    root = build(tmp_path / "abl", runs=2)
    record = json.loads((root / "ablation.json").read_text(encoding="utf-8"))
    record["factors"]["vocabulary"].append("mixed")
    record["variants"]["mixed"] = {"factors": {"vocabulary": "mixed"}, "checkpoints": [{"run": 1}, {"run": 2}]}
    (root / "ablation.json").write_text(json.dumps(record), encoding="utf-8")  # a variant whose sweep never ran
    module = types.ModuleType("biomed_lm.experiments.checkpoint_analysis")
    module.analyse_runs = lambda rows, factors, specification: _Fit()
    monkeypatch.setitem(sys.modules, "biomed_lm.experiments.checkpoint_analysis", module)
    _no_plots(monkeypatch)
    report = write_report(root).read_text(encoding="utf-8")
    assert "specification `checkpoints` (4 pretraining runs of 2 variants;" in report
    results = (root / "report" / "results.md").read_text(encoding="utf-8")
    assert "; 2 fine-tuning seeds × 2 pretraining runs; dev" in results and "4 seeds" not in results


# ------------------------------------------------------------------- the loss plot (QA finding 6)

def test_the_loss_plot_explains_its_line_styles_and_has_whole_steps(tmp_path, monkeypatch):
    root = build(tmp_path / "abl", runs=2, metrics_steps=10)
    seen = {}

    def keep(fig, path):
        ax = fig.axes[0]
        seen["legend"] = [t.get_text() for t in ax.get_legend().get_texts()]
        seen["ticks"] = list(ax.get_xticks())

    monkeypatch.setattr("biomed_lm.experiments.report.save_figure", keep)
    plot = plot_pretraining_loss(load_ablation(root), tmp_path / "loss.png")
    assert plot.path is not None and not plot.notes
    assert seen["legend"] == ["general", "in-domain", "pretraining run 1", "pretraining run 2"]
    assert seen["ticks"] and all(math.isclose(t, round(t)) for t in seen["ticks"])


# ------------------------------------------------- every pretraining run in the variants table (QA finding 7)

def test_the_variants_table_gives_each_pretraining_run_its_own_pretraining_values(tmp_path, monkeypatch):
    """QA: with two pretraining runs per variant the table's steps, final loss and time were run 1's
    alone, whatever run 2 logged (here 5 steps at loss 50, 100 s each)."""
    root = build(tmp_path / "abl", runs=2, metrics_steps=10)
    lines = [json.dumps({"step": s, "loss": 50.0, "mlm_loss": 9.0, "step_seconds": 100.0}) for s in range(1, 6)]
    run2 = root / "variants" / "in-domain" / "pretrain-run2"
    (run2 / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (run2 / "model").mkdir(parents=True)
    (run2 / "model" / "config.json").write_text(json.dumps({"vocab_size": 16000}))
    _no_plots(monkeypatch)
    text = write_report(root).read_text(encoding="utf-8")
    row = next(line for line in text.splitlines() if line.startswith("| in-domain |"))
    # the MLM loss beside the chance level of the run's own vocabulary (QA: ln V was a sentence's literal numbers)
    mlm = f"— / 9.000 (ln V {math.log(16000):.2f})"
    assert row.endswith(f"| 2 | 4 | 10 / 5 | 2.000 / 50.000 | {mlm} | — / 8.3 min |"), row
    general = next(line for line in text.splitlines() if line.startswith("| general |"))
    assert general.endswith("| 2 | 4 | 10 / 10 | 2.000 / 3.000 | — | — |"), general
    assert "one value per pretraining run (run 1 / run 2 / ...)" in text


# ------------------------------------------- planned runs that no variant finished (QA finding 8)

def test_a_planned_run_missing_in_every_variant_is_flagged_and_named(tmp_path, capsys, monkeypatch):
    """QA: the plan asks for 3 seeds; seed 3 failed in both variants (finetune.sweep leaves error.txt and
    no run.json). The table showed two-seed means as if complete, with no note: 'n' was the most runs any
    variant had, not the plan's."""
    root = build(tmp_path / "abl", plan={**PLAN, "num_seeds": 3})
    failed = {}
    for name in VARIANTS:
        failed[name] = root / "variants" / name / "finetune" / DATASET / "lr0.0005_bs16_ep3" / "seed3"
        failed[name].mkdir(parents=True)
        (failed[name] / "error.txt").write_text("Traceback ...\nRuntimeError: out of memory\n", encoding="utf-8")
    _no_plots(monkeypatch)
    text = write_report(root).read_text(encoding="utf-8")
    row = next(line for line in text.splitlines() if line.startswith(f"| {DATASET} |"))
    assert row.count("(2 of 3 runs complete)") == 2, row
    err = capsys.readouterr().err
    for name in VARIANTS:
        line = (f"{name}: 1 of 3 planned fine-tuning runs not complete (1 failed), e.g. {failed[name]}: "
                f"RuntimeError: out of memory")
        assert f"report: warning: {line}" in err and f"- {line}" in text
    assert "n is the runs the fine-tuning plan asks for" in text
    csv = pd.read_csv(root / "report" / "results.csv").set_index("dataset")
    assert csv.loc[DATASET, "general_n"] == 2


def test_the_test_score_plot_tells_the_pretraining_runs_apart(tmp_path, monkeypatch):
    """QA: with two pretraining runs per variant the plot drew their seeds alike, titled 'points: seeds',
    so one pretraining run's luck could not be seen; now each run has its shape, explained in a legend."""
    from biomed_lm.experiments.report import collect_rows, plot_test_scores, results_table

    seen = {}

    def keep(fig, path):
        ax = fig.axes[0]
        seen["legend"] = [t.get_text() for t in ax.get_legend().get_texts()] if ax.get_legend() else []
        seen["shapes"] = len({tuple(map(tuple, c.get_paths()[0].vertices.round(3))) for c in ax.collections
                              if len(c.get_offsets()) == 2})
        seen["title"] = fig._suptitle.get_text()

    monkeypatch.setattr("biomed_lm.experiments.report.save_figure", keep)
    for runs, legend, shapes in ((2, ["pretraining run 1", "pretraining run 2"], 2), (1, [], 1)):
        ablation = load_ablation(build(tmp_path / f"abl{runs}", runs=runs))
        rows = collect_rows(ablation)
        plot_test_scores(ablation, rows, results_table(ablation), tmp_path / "scores.png")
        assert seen["legend"] == legend and seen["shapes"] == shapes
        assert ("shape: pretraining run" in seen["title"]) == (runs == 2)


# ------------------------------------------------------ budget phases and constant factors (QA finding 9)

def test_the_index_says_constant_factors_once_and_each_phase_in_words(tmp_path, monkeypatch):
    """QA: the demo's report had a column per factor, four of seven holding 'off (ref)' in every row, and its
    budget printed the phases as a Python list of dicts."""
    root = build(tmp_path / "abl")
    record = json.loads((root / "ablation.json").read_text(encoding="utf-8"))
    record["factors"]["masking"] = ["whole-word"]
    for variant in record["variants"].values():
        variant["factors"]["masking"] = "whole-word"
    record["budget"]["phases"] = [{"config": "configs/pretrain/demo.yaml", "max_steps": 20, "global_batch_size": 8,
                                   "extra_args": ["--learning_rate", "2.0e-4"]}]
    (root / "ablation.json").write_text(json.dumps(record), encoding="utf-8")
    _no_plots(monkeypatch)
    text = write_report(root).read_text(encoding="utf-8")
    assert ("- phase 1: config configs/pretrain/demo.yaml, max steps 20, global batch size 8, extra args "
            "`--learning_rate 2.0e-4`") in text and "[{" not in text
    assert "| variant | vocabulary | pretraining runs |" in text and "whole-word (ref)" not in text
    assert "\n\nThe same for every variant: masking = whole-word.\n" in text
    assert "Reference levels (the first listed for each factor): vocabulary = general.\n" in text


def test_the_results_say_how_many_examples_the_runs_trained_and_were_scored_on(tmp_path, monkeypatch):
    """QA (2026-11-29): the demo's scores come from a 150-sentence slice of NCBI-disease's 940 test sentences, and
    nothing in the report said so."""
    root = build(tmp_path / "abl")
    for path in root.rglob("run.json"):
        record = json.loads(path.read_text(encoding="utf-8"))
        path.write_text(json.dumps({**record, "examples": {"train": 400, "dev": 150, "test": 150}}), encoding="utf-8")
    _no_plots(monkeypatch)
    text = write_report(root).read_text(encoding="utf-8")
    assert f"Data: {DATASET}: 400 train / 150 dev / 150 test examples." in text
