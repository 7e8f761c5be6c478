"""The end-to-end pretraining benchmark runs and reports what it promises (``--quick``: a tiny model,
4 timed steps at 128). Speed itself is never asserted here: benchmarks/README.md records it.

The demo's inputs (corpus, vocabulary, instances) are cached in the benchmark's default work dir,
so only the first run on a machine builds them. DeepSpeed's CPU op (about 25 s to build on 2 cores)
is shared with every other test's runs: torch's default build folder, not the benchmark's own."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO, SAMPLE_DIR

SCRIPT = REPO / "benchmarks" / "bench_pretrain_e2e.py"
SYSTEMS = ("ours", "hf_whole_word", "hf_token")
# One xdist worker runs this module: its runs share the benchmark's cached inputs on disk.
pytestmark = pytest.mark.xdist_group("bench_pretrain_e2e")


@pytest.fixture(scope="module")
def quick_result(tmp_path_factory: pytest.TempPathFactory) -> dict:
    if not SAMPLE_DIR.is_dir():
        pytest.skip(f"{SAMPLE_DIR} is absent")
    pytest.importorskip("deepspeed")
    pytest.importorskip("accelerate")  # transformers.Trainer needs it
    output = tmp_path_factory.mktemp("bench") / "pretrain_e2e_quick.json"
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": torch_extensions_dir()}
    done = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--output", str(output)], cwd=REPO,
                          capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "ours_vs_hf_whole_word" in done.stdout  # the printed table
    return json.loads(output.read_text(encoding="utf-8"))


def torch_extensions_dir() -> str:
    """The folder the suite's DeepSpeed runs build their CPU op in (backend's rule), so the benchmark's runs
    reuse that build rather than make their own."""
    from biomed_lm.backend import extensions_dir_of_this_install

    return os.environ.get("TORCH_EXTENSIONS_DIR") or str(extensions_dir_of_this_install())


def test_quick_reports_every_system(quick_result: dict) -> None:
    entry = quick_result["results"]["128"]
    assert entry["steps"] == 4 and entry["same_tokens_as_plan"]
    for name in SYSTEMS:
        result = entry["systems"][name]
        assert result["tokens_per_s"] > 0 and result["timed_tokens"] == entry["timed_real_tokens"]
        assert math.isfinite(result["final_loss"]) and math.isfinite(result["mean_timed_loss"])
        assert 0 <= result["padding_fraction"] < 1 and result["peak_rss_mib"] > 0
        for key in ("startup_s", "warmup_steps_s", "steps_s", "checkpoint_s", "export_s"):
            assert result[key] > 0, (name, key)
        assert result["total_s"] > result["startup_s"] + result["steps_s"]
    assert entry["systems"]["hf_token"]["padding_fraction"] > 0  # HF pads to the longest in each batch


def test_quick_ratios_against_both_hf_runs(quick_result: dict) -> None:
    ratios = quick_result["results"]["128"]["ratios"]
    for pair in ("ours_vs_hf_whole_word", "ours_vs_hf_token", "hf_token_vs_hf_whole_word"):
        assert set(ratios[pair]) >= {"tokens_per_s", "startup_s", "steps_s", "checkpoint_export_s", "peak_rss_mib"}
        assert all(value > 0 for value in ratios[pair].values())
    ours, hf = (quick_result["results"]["128"]["systems"][k]["tokens_per_s"] for k in ("ours", "hf_whole_word"))
    assert ratios["ours_vs_hf_whole_word"]["tokens_per_s"] == pytest.approx(ours / hf)
