"""The ablation report (experiments/report.py, launch/report.py) on a synthetic ablation directory.

Two variants (vocabulary general | in-domain, masking token for both) × two BLURB datasets
(ncbi-disease: ner/entity_f1, gad: relation/f1_positive) × two grid points × three seeds of fake
run records whose scores are written out below, so selection, mean ± std and the BLURB score are
checked against hand-computed numbers. Only the general variant has pretraining metrics.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import sys
import types
from pathlib import Path

import pandas as pd
import pytest

from biomed_lm.errors import ExperimentError
from biomed_lm.experiments.ablation_record import (SCHEMA_VERSION, AblationRecord, CheckpointRecord, VariantRecord,
                                                  load_ablation_record, write_ablation_record)
from biomed_lm.experiments.report import (ROW_COLUMNS, AblationError, analysis_factors, collect_rows, load_ablation,
                                          plot_pretraining_loss, read_pretraining_metrics, results_table, run_analysis,
                                          write_report)

REPO = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

GENERAL, IN_DOMAIN = "general-token", "in-domain-token"
GRID = {"A": (1e-5, 32), "B": (3e-5, 32)}  # a learning-rate grid (batch size fixed)
EPOCHS = 3
# (variant, dataset, grid point) -> (dev scores, test scores) for seeds 1, 2, 3.
SCORES = {
    # general / ncbi: A has the single best dev (0.95, a lucky seed) but mean dev 0.72 < B's 0.81 -> B.
    (GENERAL, "ncbi-disease", "A"): ([0.95, 0.60, 0.61], [0.70, 0.71, 0.72]),
    (GENERAL, "ncbi-disease", "B"): ([0.80, 0.81, 0.82], [0.80, 0.82, 0.84]),  # test 82.00 ± 2.00
    # general / gad: A (mean dev 0.71) beats B (0.60) although B's test is higher.
    (GENERAL, "gad", "A"): ([0.70, 0.71, 0.72], [0.60, 0.62, 0.64]),  # test 62.00 ± 2.00
    (GENERAL, "gad", "B"): ([0.60, 0.60, 0.60], [0.90, 0.90, 0.90]),
    # in-domain / ncbi: A (0.86) beats B (0.663, with one 0.99 seed).
    (IN_DOMAIN, "ncbi-disease", "A"): ([0.85, 0.86, 0.87], [0.85, 0.86, 0.87]),  # test 86.00 ± 1.00
    (IN_DOMAIN, "ncbi-disease", "B"): ([0.50, 0.50, 0.99], [0.90, 0.90, 0.90]),
    # in-domain / gad: B (0.75) beats A (0.70).
    (IN_DOMAIN, "gad", "A"): ([0.70, 0.70, 0.70], [0.50, 0.50, 0.50]),
    (IN_DOMAIN, "gad", "B"): ([0.75, 0.75, 0.75], [0.66, 0.67, 0.68]),  # test 67.00 ± 1.00
}
TASK = {"ncbi-disease": ("ner", "entity_f1"), "gad": ("relation", "f1_positive")}
EXPECTED_TEST = {(GENERAL, "ncbi-disease"): (0.82, 0.02), (GENERAL, "gad"): (0.62, 0.02),
                 (IN_DOMAIN, "ncbi-disease"): (0.86, 0.01), (IN_DOMAIN, "gad"): (0.67, 0.01)}
EXPECTED_SELECTED = {(GENERAL, "ncbi-disease"): "B", (GENERAL, "gad"): "A",
                     (IN_DOMAIN, "ncbi-disease"): "A", (IN_DOMAIN, "gad"): "B"}
# BLURB: macro average over the two task types present (ner, relation).
EXPECTED_BLURB = {GENERAL: (0.82 + 0.62) / 2, IN_DOMAIN: (0.86 + 0.67) / 2}


def _run_record(variant: str, dataset: str, point: str, seed: int, dev: float, test: float) -> dict:
    lr, batch = GRID[point]
    task_type, metric = TASK[dataset]
    hp = {"learning_rate": lr, "batch_size": batch, "epochs": EPOCHS, "warmup_ratio": 0.1, "weight_decay": 0.01}
    model = f"/abl/variants/{variant}/pretrain/model"
    return {"status": "complete", "model": model, "dataset": dataset, "task_type": task_type, "metric": metric,
            "seed": seed, "epochs": EPOCHS, "hyperparameters": hp,
            "settings": {**hp, "seed": seed, "dataset": dataset, "model": model},
            "best_dev_score": dev, "test_score": test, "test": {"score": test},
            "dev_per_epoch": [{"epoch": e, "train_loss": 1.0 / e, "dev_score": dev} for e in range(1, EPOCHS + 1)],
            "wall_time_s": 10.0 * batch / 16 + seed, "memory": {"peak_rss_bytes": (1 + seed) * 2 ** 30}}


def build_ablation(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    variants = {}
    for name, vocabulary in ((GENERAL, "general"), (IN_DOMAIN, "in-domain")):
        vdir = root / "variants" / name
        variants[name] = {"factors": {"vocabulary": vocabulary, "masking": "token"},
                          "model": str(vdir / "pretrain" / "model"),
                          # one absolute path, one relative to the ablation directory
                          "pretrain_dir": str(vdir / "pretrain") if name == GENERAL else f"variants/{name}/pretrain"}
        (vdir / "pretrain").mkdir(parents=True)
    plan = {"name": "vocab-test",
            "factors": {"vocabulary": ["general", "in-domain"], "masking": ["token", "whole-word"]},
            "variants": variants, "datasets": ["ncbi-disease", "gad"],
            "budget": {"steps": 200, "global_batch_size": 8}, "excluded": ["continual + in-domain: not a combination"]}
    (root / "ablation.json").write_text(json.dumps(plan, indent=2), encoding="utf-8")
    for (variant, dataset, point), (devs, tests) in SCORES.items():
        lr, batch = GRID[point]
        for seed, (dev, test) in enumerate(zip(devs, tests), start=1):
            run_dir = (root / "variants" / variant / "finetune" / dataset / f"lr{lr:g}_bs{batch}_ep{EPOCHS}"
                       / f"seed{seed}")
            run_dir.mkdir(parents=True)
            (run_dir / "run.json").write_text(json.dumps(_run_record(variant, dataset, point, seed, dev, test)),
                                              encoding="utf-8")
    # An unfinished run: not a row, not in the table.
    unfinished = root / "variants" / GENERAL / "finetune" / "gad" / "lr5e-05_bs16_ep3" / "seed1"
    unfinished.mkdir(parents=True)
    (unfinished / "run.json").write_text(json.dumps({"status": "running", "dataset": "gad"}), encoding="utf-8")
    # Pretraining metrics for the general variant only: 200 steps, a resumed stretch logged twice, and
    # a last line cut off by a kill; the pair loss under its old key (nsp_loss), as runs before the rename logged it.
    lines = []
    for step in list(range(1, 201)) + list(range(150, 201)):
        loss = 10.5 * math.exp(-step / 60) + 2.0 + 0.1 * math.sin(step)
        lines.append(json.dumps({"step": step, "loss": loss, "mlm_loss": loss - 0.69, "nsp_loss": 0.69,
                                 "lr": 1e-4, "tokens_per_s": 6000.0, "step_seconds": 0.25, "tokens_seen": 1800 * step}))
    lines.append('{"step": 201, "loss": 2.')
    (root / "variants" / GENERAL / "pretrain" / "metrics.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def _analysis_importable() -> bool:
    try:
        return importlib.util.find_spec("biomed_lm.experiments.analysis") is not None
    except (ImportError, ValueError):
        return False


@pytest.fixture(scope="module")
def ablation_dir(tmp_path_factory) -> Path:
    return build_ablation(tmp_path_factory.mktemp("ablation") / "vocab-test")


@pytest.fixture(scope="module")
def report(ablation_dir) -> Path:
    return write_report(ablation_dir)


# ---------------------------------------------------------------------------------- loading

def test_load_ablation_reads_the_plan_and_resolves_directories(ablation_dir):
    ablation = load_ablation(ablation_dir)
    assert ablation.name == "vocab-test" and ablation.dir == ablation_dir
    assert list(ablation.variants) == [GENERAL, IN_DOMAIN]
    assert ablation.reference_levels() == {"vocabulary": "general", "masking": "token"}
    assert ablation.datasets == ["ncbi-disease", "gad"] and ablation.budget["steps"] == 200
    for variant in ablation.variants.values():  # absolute and ablation-relative pretrain_dir alike
        assert variant.pretrain_dir == ablation_dir / "variants" / variant.name / "pretrain"
        assert variant.finetune_dir == ablation_dir / "variants" / variant.name / "finetune"


@pytest.mark.parametrize("content, message", [
    (None, "ablation.json: not found"),
    ("{not json", "not a readable JSON object"),
    ("[]", r"not a JSON object \(a JSON list"),
    ('{"factors": {"a": ["x"]}}', "field 'variants': expected a non-empty object"),
    ('{"factors": {"a": ["x"]}, "variants": {"v": {"factors": {"a": "y"}}}}',
     "field 'variants.v.factors.a': level 'y'"),
    ('{"factors": {"a": ["x"], "b": ["z"]}, "variants": {"v": {"factors": {"a": "x"}}}}', "no level for factor"),
    ('{"factors": {"seed": ["x"]}, "variants": {"v": {"factors": {"seed": "x"}}}}', "field 'factors.seed'.*clashes"),
])
def test_load_ablation_names_the_file_and_the_problem(tmp_path, content, message):
    if content is not None:
        (tmp_path / "ablation.json").write_text(content, encoding="utf-8")
    with pytest.raises(AblationError, match=message) as info:
        load_ablation(tmp_path)
    assert str(tmp_path / "ablation.json") in str(info.value)
    with pytest.raises(AblationError, match="not found"):
        load_ablation(tmp_path / "missing")


# ----------------------------------------------------------------------- the ablation record

def _record() -> AblationRecord:
    return AblationRecord(
        name="r", source="configs/ablation/tiny.yaml", factors={"vocabulary": ["general", "in-domain"]},
        variants={level: VariantRecord({"vocabulary": level}, tuple(
            CheckpointRecord(run, 41 + run, f"out/variants/{level}/pretrain{'' if run == 1 else f'-run{run}'}/model",
                             f"out/variants/{level}/pretrain{'' if run == 1 else f'-run{run}'}",
                             f"out/variants/{level}/finetune{'' if run == 1 else f'-run{run}'}") for run in (1, 2)))
                  for level in ("general", "in-domain")},
        datasets=["ncbi-disease"], budget={"steps": 2}, pretrain_seeds=2, specification="model-dataset-groups",
        finetune={"epochs": 2}, excluded=["x: left out"], failed=["fine-tune general"])


def test_the_record_round_trips_in_its_versioned_schema(tmp_path):
    record = _record()
    path = write_ablation_record(record, tmp_path)
    written = json.loads(path.read_text(encoding="utf-8"))
    assert written["schema_version"] == SCHEMA_VERSION and not (tmp_path / "ablation.json.partial").exists()
    assert written["analysis"] == {"specification": "model-dataset-groups"}
    assert set(written["variants"]["general"]) == {"factors", "checkpoints"}  # no per-variant copy of run 1
    assert load_ablation_record(path) == record
    assert load_ablation_record(tmp_path) == record  # the directory will do
    ablation = load_ablation(tmp_path)  # run 2's directories: the layout's -run2 (the written ones are absent)
    assert [c.finetune_dir for c in ablation.variants["general"].runs()] == [
        tmp_path / "variants" / "general" / "finetune", tmp_path / "variants" / "general" / "finetune-run2"]


def test_version_1_records_read_in_both_shapes(tmp_path, ablation_dir):
    # without checkpoints (before pretrain_seeds): one pretraining run, the variant's directories
    record = load_ablation_record(ablation_dir / "ablation.json")
    assert record.schema_version == 1 and record.pretrain_seeds == 1 and record.failed is None
    general = record.variants[GENERAL]
    assert len(general.checkpoints) == 1 and general.checkpoints[0].run == 1
    assert general.checkpoints[0].pretrain_dir == str(ablation_dir / "variants" / GENERAL / "pretrain")
    assert record.specification == "checkpoints" and record.excluded == ["continual + in-domain: not a combination"]
    # with checkpoints (and run 1's directories repeated on the variant), no schema_version
    legacy = _record().to_dict()
    del legacy["schema_version"]
    for name, variant in legacy["variants"].items():
        variant.update(model=variant["checkpoints"][0]["model"], pretrain_dir=variant["checkpoints"][0]["pretrain_dir"],
                       finetune_dir=variant["checkpoints"][0]["finetune_dir"])
    (tmp_path / "ablation.json").write_text(json.dumps(legacy), encoding="utf-8")
    read = load_ablation_record(tmp_path)
    assert read.schema_version == 1 and read.variants == _record().variants and read.pretrain_seeds == 2


@pytest.mark.parametrize("change, field, problem", [
    (lambda d: d["variants"]["general"]["checkpoints"][1].update(run="two"),
     "variants.general.checkpoints[1].run", "expected a whole number"),
    (lambda d: d["variants"]["general"]["checkpoints"][0].update(seed=1.5),
     "variants.general.checkpoints[0].seed", "expected a whole number"),
    (lambda d: d["variants"]["general"]["checkpoints"][1].update(run=1),
     "variants.general.checkpoints", "same 'run'"),
    (lambda d: d["variants"]["general"].pop("checkpoints"), "variants.general.checkpoints", "non-empty list"),
    (lambda d: d["variants"]["in-domain"]["factors"].update(vocabulary="medical"),
     "variants.in-domain.factors.vocabulary", "level 'medical'"),
    (lambda d: d.update(analysis={"specification": "groups"}), "analysis.specification", "expected one of"),
    (lambda d: d.update(failed="general"), "failed", "expected a list"),
    (lambda d: d.update(datasets={"ncbi": 1}), "datasets", "expected a list"),
    (lambda d: d.update(budget=[2]), "budget", "expected an object"),
    (lambda d: d.update(pretrain_seeds=0), "pretrain_seeds", "≥ 1"),
    (lambda d: d.update(bogus=1), "bogus", "not a field of schema version 2"),
    (lambda d: d.update(schema_version=3), "schema_version", "newer than this biomed-lm reads.*launch/ablate.py"),
    (lambda d: d.update(schema_version="2"), "schema_version", "expected a whole number"),
])
def test_a_bad_record_names_the_file_and_the_field(tmp_path, change, field, problem):
    values = _record().to_dict()
    change(values)
    (tmp_path / "ablation.json").write_text(json.dumps(values), encoding="utf-8")
    with pytest.raises(AblationError, match=problem) as info:
        load_ablation_record(tmp_path / "ablation.json")
    assert str(info.value).startswith(f"{tmp_path / 'ablation.json'}: field '{field}': ")
    assert isinstance(info.value, ExperimentError)


# ------------------------------------------------------------------------------------- rows

def test_rows_are_one_per_complete_run_with_factor_columns(ablation_dir):
    rows = collect_rows(load_ablation(ablation_dir))
    assert len(rows) == 2 * 2 * 2 * 3  # variants × datasets × grid points × seeds; the running one is out
    assert list(rows.columns) == ["variant", "vocabulary", "masking", *ROW_COLUMNS[1:]]
    assert set(rows["vocabulary"]) == {"general", "in-domain"} and set(rows["masking"]) == {"token"}
    assert rows.groupby(["variant", "dataset"]).size().eq(6).all()
    one = rows[(rows["variant"] == GENERAL) & (rows["dataset"] == "ncbi-disease") & (rows["learning_rate"] == 1e-5)
               & (rows["seed"] == 1)].iloc[0]
    assert one["dev_score"] == 0.95 and one["test_score"] == 0.70 and one["batch_size"] == 32
    assert one["task_type"] == "ner" and one["metric"] == "entity_f1" and one["epochs"] == EPOCHS
    assert one["wall_time_s"] == 21.0 and one["peak_rss_bytes"] == 2 * 2 ** 30


# ------------------------------------------------------------------------------------ table

def test_table_selects_by_mean_dev_and_reports_test_mean_std(ablation_dir):
    table = results_table(load_ablation(ablation_dir))
    assert table.datasets == ["ncbi-disease", "gad"] and table.variants == [GENERAL, IN_DOMAIN]
    for (variant, dataset), (mean, std) in EXPECTED_TEST.items():
        entry = table.cell(variant, dataset)
        lr, batch = GRID[EXPECTED_SELECTED[variant, dataset]]
        assert (entry["selected"]["learning_rate"], entry["selected"]["batch_size"]) == (lr, batch)
        assert entry["test"]["mean"] == pytest.approx(mean) and entry["test"]["std"] == pytest.approx(std)
        assert entry["test"]["n"] == 3
    markdown = table.to_markdown()
    lines = {line.split("|")[1].strip(): line for line in markdown.splitlines()[2:]}
    assert "82.00 ± 2.00" in lines["ncbi-disease"] and "86.00 ± 1.00" in lines["ncbi-disease"]
    assert "62.00 ± 2.00" in lines["gad"] and "67.00 ± 1.00" in lines["gad"]
    blurb_line = lines["**BLURB score (partial)**"]
    assert "72.00 (partial: 2/13 datasets)" in blurb_line and "76.50 (partial: 2/13 datasets)" in blurb_line


def test_report_files_and_csv_numbers(report, ablation_dir):
    out = ablation_dir / "report"
    assert report == out / "report.md"
    for name in ("report.md", "results.md", "results.csv", "runs.csv", "summaries.json"):
        assert (out / name).is_file(), name
    # losses of different vocabularies are per token of each: the table says they do not compare
    assert "compares only between variants that share one" in report.read_text(encoding="utf-8")
    csv = pd.read_csv(out / "results.csv")
    assert list(csv["dataset"]) == ["ncbi-disease", "gad", "BLURB"]
    by_dataset = csv.set_index("dataset")
    for (variant, dataset), (mean, std) in EXPECTED_TEST.items():
        assert by_dataset.loc[dataset, f"{variant}_mean"] == pytest.approx(mean)
        assert by_dataset.loc[dataset, f"{variant}_std"] == pytest.approx(std)
        assert by_dataset.loc[dataset, f"{variant}_n"] == 3
        assert by_dataset.loc[dataset, f"{variant}_learning_rate"] == GRID[EXPECTED_SELECTED[variant, dataset]][0]
    for variant, score in EXPECTED_BLURB.items():
        assert by_dataset.loc["BLURB", f"{variant}_mean"] == pytest.approx(score)
        assert by_dataset.loc["BLURB", f"{variant}_n"] == 2
    assert by_dataset.loc["BLURB", "metric"] == "blurb_score (partial)"
    runs = pd.read_csv(out / "runs.csv")
    assert len(runs) == 24 and runs["test_score"].sum() == pytest.approx(sum(sum(t) for _, t in SCORES.values()))
    results = (out / "results.md").read_text(encoding="utf-8")
    assert "82.00 ± 2.00" in results and "BLURB score (partial)" in results and "Selected grid points" in results
    assert "continual + in-domain: not a combination" in results


def test_plots_are_pngs_and_the_loss_plot_notes_the_variant_without_metrics(report, ablation_dir):
    plots = ablation_dir / "report" / "plots"
    for name in ("pretraining_loss.png", "test_scores.png", "finetune_cost.png"):
        assert (plots / name).read_bytes()[:8] == PNG_MAGIC, name
    text = report.read_text(encoding="utf-8")
    assert "](plots/pretraining_loss.png)" in text and "](plots/test_scores.png)" in text
    assert "](plots/finetune_cost.png)" in text
    assert f"{IN_DOMAIN}: no pretraining metrics" in text
    assert "1 unreadable line(s)" in text and "metrics.jsonl skipped (line 252)" in text


def test_metrics_reader_keeps_the_last_entry_of_a_repeated_step(ablation_dir):
    frame, bad = read_pretraining_metrics(ablation_dir / "variants" / GENERAL / "pretrain" / "metrics.jsonl")
    assert bad == [252] and len(frame) == 200 and frame["step"].is_monotonic_increasing  # the line cut off


def test_metrics_files_with_the_old_pair_keys_read_as_the_new_ones(ablation_dir, tmp_path):
    # The fixture's file is written as runs before the rename wrote it (nsp_loss); a newer run logs pair_*.
    old, _ = read_pretraining_metrics(ablation_dir / "variants" / GENERAL / "pretrain" / "metrics.jsonl")
    new_file = tmp_path / "metrics.jsonl"
    new_file.write_text(json.dumps({"step": 1, "loss": 3.0, "pair_loss": 0.5, "pair_accuracy": 0.75}) + "\n",
                        encoding="utf-8")
    new, _ = read_pretraining_metrics(new_file)
    assert "nsp_loss" not in old and (old["pair_loss"] == 0.69).all()
    assert new.loc[0, "pair_loss"] == 0.5 and new.loc[0, "pair_accuracy"] == 0.75


def test_a_resumed_run_rewrites_an_old_metrics_file_under_the_new_keys(tmp_path):
    from biomed_lm.pretrain.metrics import MetricsLogger

    lines = [{"step": step, "loss": 1.0, "nsp_loss": 0.25, "nsp_accuracy": 0.5} for step in (1, 2, 3)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    logger = MetricsLogger(tmp_path, True, "disabled", "", "", {}, total_steps=4, initial_step=2)
    logger.log({"step": 3, "loss": 0.9, "pair_loss": 0.2, "pair_accuracy": 0.6})
    logger.close()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3] and all("nsp_loss" not in r for r in records)
    assert [r["pair_loss"] for r in records] == [0.25, 0.25, 0.2]


def test_loss_plot_is_skipped_with_a_note_when_no_variant_has_metrics(ablation_dir, tmp_path):
    ablation = load_ablation(ablation_dir)
    bare = dataclasses.replace(ablation, variants={
        n: dataclasses.replace(v, checkpoints=tuple(dataclasses.replace(c, pretrain_dir=tmp_path / "nowhere")
                                                    for c in v.runs()))
        for n, v in ablation.variants.items()})
    result = plot_pretraining_loss(bare, tmp_path / "loss.png")
    assert result.path is None and "no variant has pretraining metrics" in result.note
    assert not (tmp_path / "loss.png").exists()


def test_report_index_lists_budget_variants_results_and_links(report):
    text = report.read_text(encoding="utf-8")
    assert text.startswith("# Ablation report: vocab-test")
    assert "- steps: 200" in text and "- global batch size: 8" in text and "1,600" in text
    variant_rows = [line for line in text.splitlines() if line.startswith(f"| {GENERAL} ")
                    or line.startswith(f"| {IN_DOMAIN} ")]
    assert len(variant_rows) == 2
    assert "general (ref)" in variant_rows[0] and "| 12 | 200 |" in variant_rows[0]
    assert "in-domain" in variant_rows[1] and "| 12 | — |" in variant_rows[1]
    assert "82.00 ± 2.00" in text and "BLURB score (partial)" in text
    for link in ("(results.md)", "(results.csv)", "(runs.csv)", "(summaries.json)"):
        assert link in text


def test_an_ablation_without_finished_runs_still_gets_a_report(tmp_path):
    plan = {"name": "fresh", "factors": {"vocabulary": ["general", "in-domain"]},
            "variants": {"a": {"factors": {"vocabulary": "general"}}, "b": {"factors": {"vocabulary": "in-domain"}}},
            "datasets": ["gad"], "budget": {"steps": 10, "global_batch_size": 4}}
    (tmp_path / "ablation.json").write_text(json.dumps(plan), encoding="utf-8")
    report = write_report(tmp_path)
    text = report.read_text(encoding="utf-8")
    assert "| gad | — | — | — |" in text and "a: no complete fine-tuning run" in text
    assert "No multilevel analysis: no complete fine-tuning run to analyse" in text
    assert text.count("Not drawn") == 3 and not list((tmp_path / "report" / "plots").iterdir())
    assert len(pd.read_csv(tmp_path / "report" / "runs.csv")) == 0


# --------------------------------------------------------------------------------- analysis

def test_analysis_uses_only_factors_that_vary(ablation_dir):
    ablation = load_ablation(ablation_dir)
    assert analysis_factors(ablation, collect_rows(ablation)) == {"vocabulary": "general"}


def test_analysis_in_the_report(report, ablation_dir):
    out = ablation_dir / "report"
    text = report.read_text(encoding="utf-8")
    if _analysis_importable():
        assert (out / "analysis.md").is_file() and (out / "analysis.json").is_file()
        json.loads((out / "analysis.json").read_text(encoding="utf-8"))
        assert "(analysis.md)" in text
    else:
        assert not (out / "analysis.md").exists()
        assert "No multilevel analysis: experiments.checkpoint_analysis could not be imported" in text
        assert "No multilevel analysis" in (out / "results.md").read_text(encoding="utf-8")


class _FakeResult:
    notes = ["fake note"]
    specification = "checkpoints"
    n_checkpoints = 0

    def to_dict(self):
        return {"effects": {"vocabulary": 0.045}}

    def to_markdown(self):
        return "# fake analysis\n"

    def reading(self):
        return ["In-domain vocabulary raises the test score by 4.5 points."]


def _fake_analysis(monkeypatch, fit):
    module = types.ModuleType("biomed_lm.experiments.checkpoint_analysis")
    module.analyse_runs = lambda rows, factors, specification: fit(rows, factors)
    monkeypatch.setitem(sys.modules, "biomed_lm.experiments.checkpoint_analysis", module)


def test_run_analysis_reports_why_it_is_absent(ablation_dir, monkeypatch):
    ablation = load_ablation(ablation_dir)
    rows = collect_rows(ablation)
    monkeypatch.setitem(sys.modules, "biomed_lm.experiments.checkpoint_analysis", None)  # import fails
    assert "could not be imported" in run_analysis(ablation, rows).reason

    def failing(rows, factors, **kwargs):
        raise ValueError("singular fit")

    _fake_analysis(monkeypatch, failing)
    outcome = run_analysis(ablation, rows)
    assert outcome.result is None and "singular fit" in outcome.reason
    assert "no contrast" in run_analysis(ablation, rows[rows["vocabulary"] == "general"]).reason


def test_report_with_a_fit_writes_analysis_files_and_reading(ablation_dir, tmp_path, monkeypatch):
    seen = {}

    def fit(rows, factors, **kwargs):
        seen.update(rows=rows, factors=factors)
        return _FakeResult()

    _fake_analysis(monkeypatch, fit)
    monkeypatch.setattr("biomed_lm.experiments.report.plot_test_scores", lambda *a: _skipped("Test scores"))
    monkeypatch.setattr("biomed_lm.experiments.report.plot_cost", lambda *a: _skipped("Cost"))
    report = write_report(ablation_dir, tmp_path / "out")
    assert seen["factors"] == {"vocabulary": "general"} and len(seen["rows"]) == 24
    assert (tmp_path / "out" / "analysis.md").read_text(encoding="utf-8") == "# fake analysis\n"
    assert json.loads((tmp_path / "out" / "analysis.json").read_text(encoding="utf-8")) == _FakeResult().to_dict()
    text = report.read_text(encoding="utf-8")
    assert "- In-domain vocabulary raises the test score by 4.5 points." in text and "- fake note" in text

    # The fit fails on the same output directory: the stale analysis files go, the note says why.
    _fake_analysis(monkeypatch, lambda rows, factors, **kw: (_ for _ in ()).throw(ValueError("too few groups")))
    write_report(ablation_dir, tmp_path / "out")
    assert not (tmp_path / "out" / "analysis.md").exists()
    note = "No multilevel analysis: the multilevel fit failed: ValueError: too few groups"
    assert note in (tmp_path / "out" / "results.md").read_text(encoding="utf-8")
    assert note in report.read_text(encoding="utf-8")


def _skipped(title):
    from biomed_lm.experiments.report import PlotResult

    return PlotResult(title, None, "skipped in this test")


# ----------------------------------------------------------------------------------- launch

def _launch_main(monkeypatch):
    """launch/report.py's main(), loaded in this process (no second interpreter start-up)."""
    name = "launch_report_under_test"
    spec = importlib.util.spec_from_file_location(name, REPO / "launch" / "report.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)  # dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module.main


def test_launch_exits_2_on_a_bad_dir_and_0_on_a_good_one(ablation_dir, tmp_path, capsys, monkeypatch):
    main = _launch_main(monkeypatch)
    assert main(["--ablation_dir", str(tmp_path / "missing")]) == 2
    assert "report: error: ablation directory not found" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["--ablation_dir", str(tmp_path / "empty")]) == 2
    assert "ablation.json: not found" in capsys.readouterr().err

    monkeypatch.setattr("biomed_lm.experiments.report.plot_test_scores", lambda *a: _skipped("Test scores"))
    monkeypatch.setattr("biomed_lm.experiments.report.plot_cost", lambda *a: _skipped("Cost"))
    monkeypatch.setattr("biomed_lm.experiments.report.plot_pretraining_loss", lambda *a: _skipped("Loss"))
    assert main(["--ablation_dir", str(ablation_dir), "--output_dir", str(tmp_path / "cli")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "cli" / "report.md")
    assert (tmp_path / "cli" / "results.csv").is_file()


def test_launch_exits_2_naming_an_output_dir_that_is_a_file(ablation_dir, tmp_path, capsys, monkeypatch):
    """QA: --output_dir naming a file ended in a NotADirectoryError traceback (and exit 1)."""
    main = _launch_main(monkeypatch)
    (tmp_path / "taken").write_text("not a folder", encoding="utf-8")
    assert main(["--ablation_dir", str(ablation_dir), "--output_dir", str(tmp_path / "taken")]) == 2
    assert capsys.readouterr().err == (f"report: error: cannot write the report to {tmp_path / 'taken'}: "
                                       f"{tmp_path / 'taken' / 'plots'}: Not a directory\n")


def test_missing_or_damaged_pretraining_metrics_are_warnings_on_stderr_too(ablation_dir, tmp_path):
    """QA (2026-11-29): they were only in the loss plot's notes, while run.json problems reach stderr."""
    said: list[str] = []
    write_report(ablation_dir, tmp_path / "out", log=said.append)
    assert any(line.startswith("warning: ") and f"{IN_DOMAIN}: no pretraining metrics" in line for line in said)
    assert any(line.startswith("warning: ") and "1 unreadable line(s)" in line for line in said)


def test_the_analysis_says_when_the_variants_do_not_cross_every_factor_level(report):
    """QA (2026-11-29): with continual + in-domain left out, the readings were stated as main effects over every
    variant."""
    text = report.read_text(encoding="utf-8")
    assert "## Analysis" in text
    assert ("- Not every combination of factor levels was run (continual + in-domain: not a combination): each "
            "factor's effect is measured among the variants that have both of its levels") in text
