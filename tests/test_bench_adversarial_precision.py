"""benchmarks/bench_adversarial_precision.py runs and reports what it says it does (bert-tiny, one small
batch: its figures mean little at this size)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_adversarial_precision  # noqa: E402


def test_each_epsilon_gets_its_terms_and_ratios_to_fp32(tmp_path):
    result = bench_adversarial_precision.main(["--model", "bert-tiny", "--batch", "2",
                                               "--seq", "16", "--batches", "1", "--epsilons", "1e-5", "1e-3",
                                               "--precisions", "bf16", "--output", str(tmp_path / "out.json")])
    assert [row["epsilon"] for row in result["rows"]] == [1e-5, 1e-3]
    for row in result["rows"]:
        assert row["fp32"]["kl"] > 0 and row["bf16"]["kl"] > 0
        assert row["bf16"]["ratio_vs_fp32"] == row["bf16"]["kl"] / row["fp32"]["kl"]
        assert abs(row["bf16"]["delta_retained"] - 1) < 1e-4  # autocast: δ reaches the fp32 embeddings whole
    assert (tmp_path / "out.json").is_file()
