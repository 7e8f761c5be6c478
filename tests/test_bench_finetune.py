"""benchmarks/bench_finetune.py --quick on CPU: every method (ours, HF Trainer, and with
--grouped-baseline HF Trainer batching by length) runs on both tasks (NER, relation) and the JSON has
their throughput, memory, F1 and the ratios (tiny random BERT, one epoch of 48 examples: seconds; the
numbers themselves mean nothing here)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from tests import forked_main

REPO = Path(__file__).resolve().parents[1]

pytest.importorskip("accelerate", reason="HF Trainer (the baseline) needs accelerate")


def test_quick_cpu_run_has_both_methods_for_both_tasks(tmp_path):
    out = tmp_path / "finetune.json"
    # relation data: the set derived from the committed NCBI-disease files (what a machine without
    # ../shared/data uses), so the test does not depend on the shared data folder
    proc = forked_main.run_command([sys.executable, str(REPO / "benchmarks" / "bench_finetune.py"), "--quick",
                                    "--device", "cpu", "--relation-data", "derived", "--threads", "2",
                                    "--grouped-baseline", "--output", str(out)], timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["device"] == "cpu" and result["precision"] == "fp32" and result["ours_engine"] == "plain"
    assert result["complete"] is True  # saved after each task as well (complete: false), a stage cut keeps them
    assert result["relation_source"].startswith("derived from NCBI-disease")
    assert set(result["tasks"]) == {"ner", "relation"}
    for name, task in result["tasks"].items():
        assert task["metric"] == ("entity_f1" if name == "ner" else task["metric"])
        assert set(task["results"]) == {"hf_trainer", "hf_grouped", "ours"}
        assert [task["results"][m]["group_by_length"] for m in ("hf_trainer", "hf_grouped", "ours")] == [
            False, True, True]
        for method, row in task["results"].items():
            assert row["method"] == method
            assert row["examples_per_s"] > 0 and row["examples_per_s_steady"] > 0, (name, row)
            assert row["steps"] == 3  # 48 examples, batch 16, one epoch: the same steps for both
            assert row["peak_memory_bytes"] > 0 and row["peak_memory_kind"] == "process peak RSS"
            for split in ("dev_f1", "test_f1"):
                assert isinstance(row[split], float) and 0.0 <= row[split] <= 1.0, (name, method, split)
        for key in ("ratio_examples_per_s", "ratio_examples_per_s_all_steps", "ratio_peak_memory",
                    "ratio_examples_per_s_vs_grouped"):
            assert isinstance(task[key], float) and task[key] > 0 and math.isfinite(task[key]), (name, key)
        for key in ("f1_diff_dev", "f1_diff_test"):
            ours, hf = task["results"]["ours"], task["results"]["hf_trainer"]
            assert task[key] == pytest.approx(ours[key.replace("f1_diff_", "") + "_f1"]
                                              - hf[key.replace("f1_diff_", "") + "_f1"])
    assert "ours/hf" in proc.stdout and "ours/hf_grp" in proc.stdout and "examples/s" in proc.stdout
