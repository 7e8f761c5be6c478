"""The prepared GPU run (benchmarks/gpu_check.sh) and its comparison of launch/pretrain.py's pace
with bench_gpu.py's, checked on CPU: the script parses and names every stage the issue asks for,
and the comparison reads a run's metrics.jsonl and a bench's JSON as they are written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
import launch_vs_bench  # noqa: E402


def test_the_gpu_script_parses_and_runs_every_stage_by_default():
    script = REPO / "benchmarks" / "gpu_check.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    text = script.read_text()
    default = text.split('ALL="', 1)[1].split('"', 1)[0].split()
    assert 'STAGES="${STAGES:-$ALL}"' in text
    assert default == ["bert", "launch", "tests", "expandable", "fp8", "families", "finetune", "bert512", "autotune",
                       "graphs", "blocks", "batch512", "whole", "fp8large"]
    # run in the order of value (a lease cut short keeps the first ones)
    assert [text.index(f"if stage {stage}") for stage in default] == sorted(text.index(f"if stage {stage}")
                                                                          for stage in default)


def test_the_tests_stage_prints_each_failure_when_it_happens(tmp_path):
    """A stage cut off by its timeout prints no summary: --failures-at-once (tests/conftest.py) prints each
    failure's reason as it happens, before the tests after it run."""
    assert "--failures-at-once" in (REPO / "benchmarks" / "gpu_check.sh").read_text()
    (tmp_path / "test_two.py").write_text("def test_fails():\n    assert 1 == 2, 'the reason'\n\n"
                                          "def test_after():\n    print('SECOND RAN')\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.conftest", "-v", "-s", "-p", "no:cacheprovider",
                           "--failures-at-once", "--rootdir", str(tmp_path), str(tmp_path / "test_two.py")],
                          cwd=REPO, capture_output=True, text=True)
    out = done.stdout
    assert done.returncode == 1 and "FAILED" in out
    assert out.index("AssertionError: the reason") < out.index("SECOND RAN") < out.index("short test summary")


def _metrics(path: Path, paces: list[tuple[float, float]]) -> Path:
    lines = [json.dumps({"step": step, "tokens_per_s": tokens_per_s, "step_seconds": seconds, "mfu": 0.3})
             for step, (tokens_per_s, seconds) in enumerate(paces, start=1)]
    path.write_text("\n".join(lines) + "\n")
    return path


def _bench(path: Path) -> Path:
    rows = [{"system": "transformers (torch.compile)", "role": "hf_compiled", "tokens_per_s": 900.0},
            {"system": "ours [sdpa_padded, whole forward compiled]", "role": "ours", "tokens_per_s": 1000.0,
             "mfu": 0.31, "seq": 128, "batch": 256},
            {"system": "ours [sdpa_loop]", "role": "ours", "tokens_per_s": 400.0}]
    path.write_text(json.dumps({"results": rows}))
    return path


def test_the_runs_pace_leaves_out_warm_up_and_weighs_steps_by_time(tmp_path):
    # steps 1-2 compile (slow); after them 960 and 980 tokens/s over 1 s and 3 s: 975 tokens/s
    metrics = _metrics(tmp_path / "metrics.jsonl", [(10.0, 50.0), (500.0, 2.0), (960.0, 1.0), (980.0, 3.0)])
    result = launch_vs_bench.main([str(metrics), str(_bench(tmp_path / "bench.json")), "--skip", "2",
                                   "--out", str(tmp_path / "out.json")])
    assert result["run"]["tokens_per_s"] == pytest.approx(975.0)
    assert result["bench"]["system"].startswith("ours [sdpa_padded")  # the fastest ours row
    assert result["ratio"] == pytest.approx(0.975) and result["met"] is True
    assert json.loads((tmp_path / "out.json").read_text())["ratio"] == pytest.approx(0.975)


def test_a_named_bench_row_and_a_run_too_short_are_told_apart(tmp_path):
    metrics = _metrics(tmp_path / "metrics.jsonl", [(100.0, 1.0), (300.0, 1.0)])
    bench = _bench(tmp_path / "bench.json")
    result = launch_vs_bench.main([str(metrics), str(bench), "--skip", "1", "--system", "ours [sdpa_loop"])
    assert result["ratio"] == pytest.approx(0.75) and result["met"] is False
    with pytest.raises(SystemExit, match="no logged step after step 5"):
        launch_vs_bench.main([str(metrics), str(bench), "--skip", "5"])
    # QA: a bench cut before the row (or the row failed) lost the launch's pace; it is kept, with why
    unmatched = launch_vs_bench.main([str(metrics), str(bench), "--skip", "0", "--system", "ours [flex"])
    assert unmatched["ratio"] is None and unmatched["run"]["tokens_per_s"] == pytest.approx(200.0)
    assert "no 'ours' row named 'ours [flex'… to compare with" in unmatched["why"]
    assert unmatched["bench_file"] == str(bench) == result["bench_file"]


def test_the_runs_allocator_counts_over_the_timed_steps(tmp_path):
    """The CUDA allocator's cumulative counters in metrics.jsonl: their growth from the last record at or
    before --skip to the last step is what the timed steps cost (a retry is a synchronize and cudaFree)."""
    counters = [(0, 10), (1, 12), (1, 12), (3, 15)]  # (alloc retries, cudaMallocs) so far at steps 1-4
    lines = [json.dumps({"step": step, "tokens_per_s": 900.0, "step_seconds": 1.0, "cuda_alloc_retries": retries,
                         "cuda_mallocs": mallocs}) for step, (retries, mallocs) in enumerate(counters, start=1)]
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("\n".join(lines) + "\n")
    result = launch_vs_bench.main([str(metrics), str(_bench(tmp_path / "bench.json")), "--skip", "2"])
    assert result["run"]["cuda_alloc_retries_in_window"] == 2 and result["run"]["cuda_mallocs_in_window"] == 3
    plain = launch_vs_bench.main([str(_metrics(tmp_path / "plain.jsonl", [(900.0, 1.0)] * 3)),
                                  str(tmp_path / "bench.json"), "--skip", "1"])
    assert "cuda_alloc_retries_in_window" not in plain["run"]  # a CPU run logs no allocator counts


def test_a_stage_the_budget_cannot_hold_is_skipped_and_named(tmp_path):
    """BUDGET bounds the whole script (the lease's per-call limit): a stage with under 30 s of it left is skipped,
    named in skipped_stages.txt and in goals.md, and the report is still written."""
    env = {**os.environ, "SMOKE": "1", "PYTHON": sys.executable, "BUDGET": "25", "RESULTS": str(tmp_path),
           "STAGES": "tests launch"}
    done = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_check.sh")], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert [line.split(" skipped")[0] for line in (tmp_path / "skipped_stages.txt").read_text().splitlines()] == [
        "== launch", "== tests"]  # the script's order, not STAGES'
    goals = (tmp_path / "goals.md").read_text()
    assert "launch_vs_bench.json missing: stage launch was skipped (" in goals and "of the budget left)" in goals
    assert "stages: tests launch (budget 25 s)" in (tmp_path / "environment.txt").read_text()


def test_a_launch_on_a_fresh_machine_without_the_bench_row_keeps_its_pace(tmp_path):
    """QA: a second call on a fresh machine had no /tmp/gpu_check/bert128.json; the comparison crashed and the
    100 steps' pace was lost."""
    metrics = _metrics(tmp_path / "metrics.jsonl", [(100.0, 1.0)] * 4)
    result = launch_vs_bench.main([str(metrics), str(tmp_path / "absent.json"), "--skip", "1",
                                   "--out", str(tmp_path / "out.json")])
    assert result["ratio"] is None and result["bench"] is None and result["run"]["tokens_per_s"] == 100.0
    assert "absent.json missing" in json.loads((tmp_path / "out.json").read_text())["why"]


@pytest.mark.parametrize("budget", ["183.9", "1e3", ".9"])
def test_a_budget_in_other_than_whole_seconds_is_rounded_or_refused(tmp_path, budget):
    """QA: BUDGET=183.4 broke bash's arithmetic and gave every stage a 1 s timeout: a whole call measured nothing."""
    env = {**os.environ, "SMOKE": "1", "PYTHON": sys.executable, "BUDGET": budget, "RESULTS": str(tmp_path),
           "STAGES": "none"}
    done = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_check.sh")], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    if budget == "183.9":  # cut to whole seconds
        assert done.returncode == 0 and "(budget 183 s)" in (tmp_path / "environment.txt").read_text()
    else:
        assert done.returncode == 2 and f"BUDGET must be seconds, not {budget}" in done.stderr


def test_the_gpu_scripts_refuse_arguments_and_a_machine_without_cuda(tmp_path):
    """QA: `gpu_check.sh --help` started every stage on the CPU (BERT-base, failing on an argument error that said
    nothing of a GPU); `gpu_prepare.sh --help` would empty .whl/ and download; bench_gpu.py fell back to BERT-base
    on the CPU and took the machine's memory."""
    pytest.importorskip("torch")
    import torch

    if torch.cuda.device_count():  # a CPU-only test (the -m gpu selection looks for CUDA-only ones)
        pytest.skip("a CUDA machine runs them")
    env = {**os.environ, "PYTHON": sys.executable, "RESULTS": str(tmp_path)}
    for script in ("gpu_check.sh", "gpu_prepare.sh"):
        helped = subprocess.run(["bash", str(REPO / "benchmarks" / script), "--help"], cwd=REPO, env=env,
                                capture_output=True, text=True, timeout=60)
        assert helped.returncode == 0 and "benchmarks/gpu_check.sh" in helped.stdout
        refused = subprocess.run(["bash", str(REPO / "benchmarks" / script), "--stages"], cwd=REPO, env=env,
                                 capture_output=True, text=True, timeout=60)
        assert refused.returncode == 2 and "takes no arguments" in refused.stderr
    done = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_check.sh")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "no CUDA device" in done.stderr and not list(tmp_path.iterdir())
    bench = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_gpu.py")], cwd=REPO,
                           capture_output=True, text=True, timeout=120)
    assert bench.returncode == 2 and "no CUDA device: this benchmark measures a GPU" in bench.stderr
