"""benchmarks/bench_gpu.py keeps working: its whole path (batches, transformers' recipe, each kernel
that runs here, FLOPs accounting, the report) on CPU with a tiny model."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO


def test_bench_gpu_runs_end_to_end_on_cpu(tmp_path):
    out = tmp_path / "gpu.json"
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_gpu.py"), "--device", "cpu", "--quick",
                           "--seq-lengths", "128", "--out", str(out)], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    systems = {row["system"]: row for row in result["results"]}
    baseline = systems["transformers BertForPreTraining (SDPA, padded, full MLM head)"]
    ours = systems["ours [sdpa_loop]"]
    assert baseline["ratio"] == 1.0 and ours["tokens_per_s"] > 0 and ours["padding_fraction"] == 0.0
    assert baseline["padding_fraction"] > 0.0 and ours["mfu"] is None  # no peak is known for a CPU
    assert "device-hours" in done.stdout and result["paper_budget_device_hours"] > 0


def test_bench_gpu_takes_the_other_model_families(tmp_path):
    """ALBERT and the RoBERTa layout run transformers' padded forward: ours is that forward with the MLM
    head on the masked positions only, against the family's own transformers class."""
    for architecture, baseline_class in (("albert", "AlbertForPreTraining"), ("roberta", "RobertaForMaskedLM")):
        out = tmp_path / f"{architecture}.json"
        done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_gpu.py"), "--device", "cpu",
                               "--quick", "--architecture", architecture, "--seq-lengths", "128", "--out", str(out)],
                              cwd=REPO, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        result = json.loads(out.read_text())
        assert result["architecture"] == architecture
        baseline, ours = result["results"]
        assert baseline["system"].startswith(f"transformers {baseline_class}") and ours["system"].startswith("ours")
        assert ours["tokens_per_s"] > 0 and ours["padding_fraction"] == baseline["padding_fraction"] > 0
