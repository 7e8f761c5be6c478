"""benchmarks/bench_loader.py at tiny sizes: its JSON, the ranks' disjoint shares covering the
epoch, and a start-up that reads only what the first batches need."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO


def test_bench_loader_two_ranks_tiny(tmp_path):
    out = tmp_path / "loader.json"
    # 2,674 base instances (the embedded sample at seq 128) x1 and x2; micro-batch 64, 2 ranks: a global
    # batch of 128, so 20 and 41 steps per epoch; warm-up 2 + window 30 reaches the end of the smaller.
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_loader.py"), "--replicas", "1", "2",
                           "--ranks", "2", "--workers", "2", "--micro-batch", "64", "--warmup", "2", "--window", "30",
                           "--sampler-sizes", "1000", "100000",
                           "--work", str(tmp_path / "work"), "--output", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "seq/s/rank" in done.stdout  # the table
    result = json.loads(out.read_text())
    assert result["benchmark"] == "loader" and result["goal_sequences_per_s"] == 6000
    assert result["config"]["ranks"] == 2 and result["config"]["micro_batch"] == 64
    sizes = result["sizes"]
    assert [s["replicas"] for s in sizes] == [1, 2]
    assert sizes[1]["instances"] == 2 * sizes[0]["instances"]
    for size in sizes:
        summary, shares = size["summary"], size["shares"]
        for key in ("seq_per_s_per_rank", "goal_ratio", "startup_s", "open_s", "first_batch_s",
                    "peak_rss_mib_per_rank", "pss_mib_per_rank", "private_mib_per_rank", "cores_for_goal",
                    "read_before_first_batch"):
            assert key in summary
        assert summary["seq_per_s_per_rank"] > 0 and summary["startup_s"] > 0
        assert shares["disjoint"] and shares["overlapping_indices"] == 0 and shares["repeated_within_rank"] == 0
        assert shares["union_is_planned_prefix"]
        assert len(size["ranks"]) == 2
        for rank in size["ranks"]:
            assert rank["read_instances"] == size["steps"] * 64  # its own share, nothing more
            # Before its first batch a rank has read at most what its workers prefetch (2 workers x 4
            # micro-batches), plus the one the DataLoader asks for as it hands the first batch over (a
            # worker may start reading it before the rank stamps the first batch's time; CI saw 576):
            # never every instance.
            assert 64 <= rank["read_before_first_batch"] <= (2 * 4 + 1) * 64 < size["instances"]
            assert rank["main_memory_mib"]["VmHWM"] > 0 and rank["worker_memory_mib"]
    small = sizes[0]
    assert small["covers_epoch"]  # the whole epoch was read: the ranks' shares cover it
    assert small["shares"]["union"] == small["shares"]["epoch_instances_used"] == small["steps_per_epoch"] * 128
    assert [row["instances"] for row in result["sampler_startup"]] == [1000, 100_000]
    assert all(row["plan_first_step_ms"] >= 0 for row in result["sampler_startup"])
