"""The multi-model sweep report (paper 001's study): heatmaps and the cost table.

The report is built from a tiny real sweep (two tiny random BERTs, 2 learning rates × 2 batch sizes,
one seed, a slice of NCBI-disease) and its numbers are checked against the run records; the grid,
the checks on records and the entry script's exit status are checked on hand-made records.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from biomed_lm.finetune.sweep import SweepArgs, run_sweep  # noqa: E402
from biomed_lm.finetune.sweep_report import (FIGURES_DIR, MIB, REPORT_FILE, REPORT_JSON, SweepReportError,  # noqa: E402
                                             collect_study, dev_grid, grid_cells, parse_sweep_specs, write_sweep_report)
from tests import forked_main
from tests.conftest import ncbi_slice  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
LAUNCH = REPO / "launch" / "sweep_report.py"


def _record(lr, batch, seed, dev, test, *, model="ckpt", dataset="ncbi-disease", epochs=3, wall=10.0,
            rss=200 * MIB, cuda=None, train=100):
    hp = {"learning_rate": lr, "batch_size": batch, "epochs": epochs, "max_length": 128}
    memory = {"peak_rss_bytes": rss} | ({} if cuda is None else {"cuda_max_memory_allocated_bytes": cuda})
    return {"status": "complete", "model": model, "dataset": dataset, "task_type": "ner", "metric": "entity_f1",
            "seed": seed, "epochs": epochs, "hyperparameters": hp,
            "settings": {**hp, "seed": seed, "dataset": dataset, "model": model},
            "examples": {"train": train, "dev": 20, "test": 20}, "best_dev_score": dev, "test_score": test,
            "test": {"score": test}, "wall_time_s": wall, "memory": memory}


def _write(root: Path, record: dict) -> Path:
    hp = record["hyperparameters"]
    path = root / record["dataset"] / f"lr{hp['learning_rate']:g}_bs{hp['batch_size']}_ep{hp['epochs']}" \
        / f"seed{record.get('seed', 0)}" / "run.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record), encoding="utf-8")
    return path


# ------------------------------------------------------------------------ on a tiny real sweep

@pytest.fixture(scope="module")
def tiny_study(tiny_bert, general_tokenizer_dir, tmp_path_factory) -> dict[str, Path]:
    """Two tiny models' sweeps over lr {5e-4, 1e-3} × batch {4, 8}, one seed, one epoch."""
    from transformers import BertConfig, BertModel

    root = tmp_path_factory.mktemp("sweep_study")
    one_layer = root / "one_layer_bert"
    config = BertConfig.from_pretrained(tiny_bert)
    config.num_hidden_layers = 1
    BertModel(config).save_pretrained(one_layer)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (tiny_bert / name).exists():
            (one_layer / name).write_bytes((tiny_bert / name).read_bytes())
    ncbi_slice(root / "data", train=16, eval_=8)
    sweeps = {}
    for label, model in (("two-layer", tiny_bert), ("one-layer", one_layer)):
        sweeps[label] = root / "sweeps" / label
        run_sweep(SweepArgs(model=str(model), output_dir=str(sweeps[label]), data_root=str(root / "data"),
                            datasets=["ncbi-disease"], learning_rates=[5e-4, 1e-3], batch_sizes=[4, 8], epochs=1,
                            num_seeds=1, max_length=32), log=lambda message: None, progress=False)
    return sweeps


def test_report_of_a_tiny_sweep_has_a_heatmap_per_model_and_a_cost_row_matching_the_records(tiny_study, tmp_path):
    out = tmp_path / "report"
    report = write_sweep_report(list(tiny_study.items()), out)
    assert report == out / REPORT_FILE
    heatmaps = sorted(p.name for p in (out / FIGURES_DIR).glob("dev_*.png"))
    assert heatmaps == ["dev_one-layer_ncbi-disease.png", "dev_two-layer_ncbi-disease.png"]
    assert all((out / FIGURES_DIR / name).stat().st_size > 1000 for name in heatmaps)
    assert (out / FIGURES_DIR / "memory_vs_time.png").is_file()

    rows = {row["model"]: row for row in json.loads((out / REPORT_JSON).read_text())["rows"]}
    assert set(rows) == {"two-layer", "one-layer"}
    for label, directory in tiny_study.items():
        records = [json.loads(p.read_text()) for p in directory.rglob("run.json")]
        row = rows[label]
        assert row["runs"] == len(records) == 4 and row["grid_points"] == 4
        assert row["total_time_s"] == pytest.approx(sum(r["wall_time_s"] for r in records))
        assert row["peak_rss_mib"] == pytest.approx(max(r["memory"]["peak_rss_bytes"] for r in records) / MIB)
        # over the epochs' own time (train_time_s), as paper 001 times training: not the run's wall time
        speeds = [r["examples"]["train"] * r["hyperparameters"]["epochs"] / r["train_time_s"] for r in records]
        assert row["train_examples_per_s"] == pytest.approx(np.mean(speeds))
        assert row["mean_train_time_per_run_s"] == pytest.approx(np.mean([r["train_time_s"] for r in records]))
        best = max(records, key=lambda r: (r["best_dev_score"], -r["hyperparameters"]["learning_rate"],
                                           -r["hyperparameters"]["batch_size"]))
        assert (row["best"]["learning_rate"], row["best"]["batch_size"]) == \
            (best["hyperparameters"]["learning_rate"], best["hyperparameters"]["batch_size"])
        assert row["best"]["test"] == {"mean": pytest.approx(best["test_score"]), "std": None, "n": 1}
        assert (row["best"]["test_precision"], row["best"]["test_recall"]) == \
            (pytest.approx(best["test"]["precision"]), pytest.approx(best["test"]["recall"]))

    text = report.read_text()
    cost = [line for line in text.splitlines() if line.startswith(("| two-layer | ncbi", "| one-layer | ncbi"))]
    assert len(cost) == 2 and all("| ncbi-disease | 4 | 4 |" in line for line in cost)
    for label, directory in tiny_study.items():  # the text grid: a row per model x lr, a column per batch
        records = [json.loads(p.read_text()) for p in directory.rglob("run.json")]
        for lr, lr_text in ((5e-4, "5e-4"), (1e-3, "1e-3")):
            scores = {r["hyperparameters"]["batch_size"]: r["best_dev_score"] for r in records
                      if r["hyperparameters"]["learning_rate"] == lr}
            assert f"| {label} | {lr_text} | {scores[4] * 100:.2f} (1 run) | {scores[8] * 100:.2f} (1 run) |" in text
    assert "figures/dev_two-layer_ncbi-disease.png" in text and "figures/memory_vs_time.png" in text


def test_entry_script_writes_the_report_and_labels_by_directory_name(tiny_study, tmp_path):
    from biomed_lm.launch.sweep_report import main

    out = tmp_path / "by_name"
    args = ["--sweeps", str(tiny_study["two-layer"]), f"small={tiny_study['one-layer']}", "--output_dir", str(out)]
    assert main(args) == 0
    rows = json.loads((out / REPORT_JSON).read_text())["rows"]
    assert [row["model"] for row in rows] == ["two-layer", "small"]


# ----------------------------------------------------------------------- on hand-made records

def test_the_example_config_is_paper_001s_grid():
    from biomed_lm.config import parse_config
    from biomed_lm.finetune.sweep import plan_sweep

    (args,) = parse_config([SweepArgs], ["--config", str(REPO / "configs" / "blurb" / "paper001_ner_sweep.yaml"),
                                         "--model", "m", "--output_dir", "o"])
    assert args.learning_rates == [1e-6, 1e-5, 1e-4, 1e-3] and args.batch_sizes == [8, 16, 32]
    assert len(plan_sweep(args).runs) == 12  # one seed per grid point, as the paper ran



def test_a_missing_grid_point_is_a_blank_cell_and_seeds_give_mean_and_sample_sd(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for lr in (1e-5, 1e-4):
        for batch in (8, 16):
            for seed, dev in ((1, 0.6), (2, 0.8)):
                _write(a, _record(lr, batch, seed, dev, 0.5))
            if (lr, batch) != (1e-4, 16):  # b never finished this grid point
                _write(b, _record(lr, batch, 1, 0.7, 0.5, model="other"))
    runs, notes = collect_study(parse_sweep_specs([f"A={a}", f"B={b}"]))
    assert notes == [] and len(runs) == 8 + 3
    mean, sd, n = dev_grid(grid_cells(r for r in runs if r.model == "B"), [1e-5, 1e-4], [8, 16])
    assert math.isnan(mean[1, 1]) and n[1, 1] == 0 and n[0, 0] == 1 and math.isnan(sd[0, 0])
    mean, sd, n = dev_grid(grid_cells(r for r in runs if r.model == "A"), [1e-5, 1e-4], [8, 16])
    assert np.allclose(mean, 0.7) and np.allclose(sd, np.std([0.6, 0.8], ddof=1)) and (n == 2).all()
    (tmp_path / "out" / FIGURES_DIR).mkdir(parents=True)
    (tmp_path / "out" / FIGURES_DIR / "dev_gone_ncbi-disease.png").write_bytes(b"an earlier report's model")
    out = write_sweep_report([("A", a), ("B", b)], tmp_path / "out")
    assert len(list((out.parent / FIGURES_DIR).glob("dev_*.png"))) == 2  # the stale one removed
    rows = {row["model"]: row for row in json.loads((out.parent / REPORT_JSON).read_text())["rows"]}
    assert rows["B"]["runs"] == 3 and rows["B"]["grid_points"] == 3 and rows["A"]["runs"] == 8
    text = out.read_text()
    assert "| A | 1e-4 | 70.00 ± 14.14 | 70.00 ± 14.14 |" in text and "| B | 1e-4 | 70.00 (1 run) | — |" in text


def test_cost_row_reports_cuda_memory_and_the_best_points_test_score(tmp_path):
    _write(tmp_path / "s", _record(1e-5, 8, 1, 0.9, 0.85, wall=20.0, cuda=3 * 1024 * MIB, rss=100 * MIB))
    _write(tmp_path / "s", _record(1e-3, 8, 1, 0.1, 0.95, wall=40.0, cuda=1024 * MIB, rss=300 * MIB, train=200))
    out = write_sweep_report([("m", tmp_path / "s")], tmp_path / "out")
    (row,) = json.loads((out.parent / REPORT_JSON).read_text())["rows"]
    assert row["peak_cuda_mib"] == 3072 and row["peak_rss_mib"] == 300
    assert row["total_time_s"] == 60 and row["mean_train_time_per_run_s"] == 30  # records without train_time_s
    assert row["train_examples_per_s"] == pytest.approx((100 * 3 / 20 + 200 * 3 / 40) / 2)
    assert row["best"]["learning_rate"] == 1e-5 and row["best"]["test"]["mean"] == 0.85
    assert "| m | ncbi-disease | 2 | 2 | 60.0 s | 30.0 s | 15.0 | 300 | 3072 | 1e-5, 8 | 90.00 (1 run) | " \
           "85.00 (1 run) | — |" in out.read_text()


def test_training_time_precision_recall_and_the_f1_mode_are_reported(tmp_path):
    """Paper 001 shows precision and recall at every point and averages training time (its Figure 12); the
    records hold both, and the mode the entity F1 was computed in, which the report used to leave out."""
    for lr, p_r in ((1e-5, (0.8, 0.9)), (1e-3, (0.2, 0.1))):
        record = _record(lr, 8, 1, 0.9 if lr == 1e-5 else 0.1, 0.85, wall=20.0)
        record["test"] |= {"precision": p_r[0], "recall": p_r[1], "mode": "conlleval"}
        record["train_time_s"] = 5.0
        _write(tmp_path / "s", record)
    out = write_sweep_report([("m", tmp_path / "s")], tmp_path / "out")
    (row,) = json.loads((out.parent / REPORT_JSON).read_text())["rows"]
    assert row["mean_train_time_per_run_s"] == 5.0 and row["train_examples_per_s"] == pytest.approx(100 * 3 / 5)
    assert (row["best"]["test_precision"], row["best"]["test_recall"]) == (0.8, 0.9)
    text = out.read_text()
    assert "| 80.00 / 90.00 |" in text and "### ncbi-disease (entity F1 in seqeval's conlleval mode)" in text


def test_a_sweep_cut_short_and_models_tuned_otherwise_are_said_first(tmp_path):
    """QA: a sweep killed after 2 of 4 points was reported as if complete, its best point chosen from 2, and
    two models fine-tuned for 2 and 1 epochs were set side by side without a word. A directory given twice
    would be one model shown as two."""
    planned = []
    for lr in (1e-5, 1e-3):
        for batch in (8, 16):
            record = _record(lr, batch, 1, 0.5, 0.5)
            path = _write(tmp_path / "a", record).parent
            planned.append({"dataset": "ncbi-disease", "learning_rate": lr, "batch_size": batch, "seed": 1,
                            "output_dir": str(path)})
            if batch == 16:
                (path / "run.json").unlink()  # not finished
    (tmp_path / "a" / "plan.json").write_text(json.dumps({"model": "ckpt", "runs": planned}))
    _write(tmp_path / "b", _record(1e-5, 8, 1, 0.6, 0.6, epochs=1, model="other"))
    out = write_sweep_report([("a", tmp_path / "a"), ("b", tmp_path / "b")], tmp_path / "out")
    text = out.read_text()
    assert text.index("## Notes") < text.index("## Cost")
    assert "a: 2 of the sweep's 4 planned runs finished; missing" in text and "lr 1e-3 batch 16 seed 1" in text
    assert "ncbi-disease: the models were fine-tuned under different settings" in text and "epochs: a 3, b 1" in text
    with pytest.raises(SweepReportError, match="one directory"):
        write_sweep_report([("a", tmp_path / "a"), ("a2", tmp_path / "a")], tmp_path / "out2")


@pytest.mark.parametrize("change, field", [
    (lambda r: r.pop("best_dev_score"), "best_dev_score"),
    (lambda r: r["hyperparameters"].update(batch_size="16"), "hyperparameters.batch_size"),
    (lambda r: r["hyperparameters"].update(learning_rate=0), "hyperparameters.learning_rate"),
    (lambda r: r["memory"].pop("peak_rss_bytes"), "memory.peak_rss_bytes"),
    (lambda r: r.update(wall_time_s=None), "wall_time_s"),
    (lambda r: r["examples"].pop("train"), "examples.train"),
    (lambda r: r.update(settings=[1]), "settings"),
])
def test_a_bad_record_is_an_error_naming_the_file_and_field(tmp_path, change, field):
    _write(tmp_path / "s", _record(1e-5, 8, 1, 0.5, 0.5))
    bad = _record(1e-5, 16, 1, 0.5, 0.5)
    change(bad)
    path = _write(tmp_path / "s", bad)
    with pytest.raises(SweepReportError) as err:
        collect_study([("m", tmp_path / "s")])
    assert str(path) in str(err.value) and repr(field) in str(err.value)


def test_a_field_of_the_wrong_type_names_the_type_expected(tmp_path):
    path = _write(tmp_path / "s", _record(1e-5, 16, 1, 0.5, 0.5))
    bad = json.loads(path.read_text())
    bad["hyperparameters"]["learning_rate"] = "fast"
    path.write_text(json.dumps(bad))
    with pytest.raises(SweepReportError, match=r"'hyperparameters.learning_rate' is 'fast', not an int or float$"):
        collect_study([("m", tmp_path / "s")])


def test_unusable_sweeps_are_refused_with_the_reason(tmp_path):
    with pytest.raises(SweepReportError, match="not a directory"):
        collect_study([("m", tmp_path / "nowhere")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(SweepReportError, match="no complete run.json"):
        collect_study([("m", tmp_path / "empty")])
    with pytest.raises(SweepReportError, match="labels must differ"):
        parse_sweep_specs([f"m={tmp_path}", f"m={tmp_path / 'x'}"])
    broken = tmp_path / "broken" / "ncbi-disease" / "x" / "run.json"
    broken.parent.mkdir(parents=True)
    broken.write_text("{not json", encoding="utf-8")
    with pytest.raises(SweepReportError, match=str(broken)):
        collect_study([("m", tmp_path / "broken")])
    _write(tmp_path / "epochs", _record(1e-5, 8, 1, 0.5, 0.5, epochs=3))
    _write(tmp_path / "epochs", _record(1e-5, 16, 1, 0.5, 0.5, epochs=20))
    with pytest.raises(SweepReportError, match="differ in epochs"):
        collect_study([("m", tmp_path / "epochs")])
    _write(tmp_path / "mixed", _record(1e-5, 8, 1, 0.5, 0.5, model="ckpt-a"))
    _write(tmp_path / "mixed", _record(1e-5, 16, 1, 0.5, 0.5, model="ckpt-b"))
    with pytest.raises(SweepReportError, match="mixes models"):
        collect_study([("m", tmp_path / "mixed")])


def test_unfinished_runs_are_left_out_with_a_note(tmp_path):
    _write(tmp_path / "s", _record(1e-5, 8, 1, 0.5, 0.5))
    _write(tmp_path / "s", _record(1e-5, 16, 1, 0.5, 0.5) | {"status": "running"})
    runs, notes = collect_study([("m", tmp_path / "s")])
    assert len(runs) == 1 and notes == ["m: 1 run record(s) of unfinished runs left out"]
    # a record cut short (QA: the whole report was refused over it) is one run left out, said in a note
    cut = tmp_path / "s" / "ncbi-disease" / "cut" / "run.json"
    cut.parent.mkdir(parents=True)
    cut.write_text(json.dumps(_record(1e-5, 32, 1, 0.5, 0.5))[:200], encoding="utf-8")
    runs, notes = collect_study([("m", tmp_path / "s")])
    assert len(runs) == 1 and notes[0].startswith(f"m: {cut}: not a readable run record")
    assert notes[0].endswith("; left out (the same launch/blurb.py command reruns it)")


def test_entry_script_exits_2_naming_the_bad_record(tmp_path):
    bad = _record(1e-5, 8, 1, 0.5, 0.5)
    del bad["seed"]
    path = _write(tmp_path / "s", bad)
    proc = forked_main.run_command([sys.executable, str(LAUNCH), "--sweeps", f"m={tmp_path / 's'}", "--output_dir",
                                    str(tmp_path / "out")], timeout=120)
    assert proc.returncode == 2 and str(path) in proc.stderr and "'seed'" in proc.stderr
    assert not (tmp_path / "out" / REPORT_FILE).exists()


@pytest.mark.parametrize("metric", ["entity_f1", "pico_token_macro_f1"])
def test_heatmap_text_fits_in_the_figure_for_a_one_point_grid(tmp_path, monkeypatch, metric):
    """A one-row grid made the figure too short for the colorbar's label ("...(mean over seed")."""
    from matplotlib.text import Text

    from biomed_lm.finetune import sweep_report

    for seed, dev in ((1, 0.30), (2, 0.31)):
        record = _record(3e-3, 16, seed, dev, 0.3, model="dom")
        _write(tmp_path / "dom", {**record, "metric": metric})
    cut_off = []

    def save_and_measure(fig, path, **kwargs):
        save_figure(fig, path, **kwargs)  # lays the figure out as it is written
        if not path.name.startswith("dev_"):
            return
        fig.canvas.draw()  # a renderer at the figure's own dpi (savefig's is at its own)
        renderer, frame = fig.canvas.get_renderer(), fig.bbox
        for text in fig.findobj(Text):
            box = text.get_window_extent(renderer)
            if text.get_visible() and text.get_text() and not (
                    box.x0 >= frame.x0 - 1 and box.y0 >= frame.y0 - 1 and box.x1 <= frame.x1 + 1
                    and box.y1 <= frame.y1 + 1):
                cut_off.append(text.get_text())

    save_figure = sweep_report.save_figure
    monkeypatch.setattr(sweep_report, "save_figure", save_and_measure)
    write_sweep_report([("dom", tmp_path / "dom")], tmp_path / "out")
    assert cut_off == []
