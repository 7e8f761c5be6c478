"""Two phases, one schedule: phase 2 continues phase 1's model, optimizer, step count and learning-rate
schedule on other data (PubMedBERT's 128 → 512 recipe, at tiny scale)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from biomed_lm.optim import ScheduleConfig, learning_rate_at
from tests.pretrain_runs import pretrain_args, run, with_option

SCHEDULE = 10
PHASE1 = 6


def _phase_args(inputs, out: Path, max_steps: int, *extra: str) -> list[str]:
    args = pretrain_args(inputs, out, "--schedule-total-steps", str(SCHEDULE), "--warmup-ratio", "0.3", *extra)
    return with_option(with_option(args, "--max-steps", str(max_steps)), "--checkpoint-every", "100")


def _records(run_dir: Path) -> dict[int, dict]:
    return {r["step"]: r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}


def _adam_state(checkpoint: Path) -> dict:
    """The first parameter's AdamW state (ZeRO stage 0 keeps it in the model-states file)."""
    return torch.load(checkpoint / "mp_rank_00_model_states.pt", weights_only=False)["optimizer"]["state"][0]


@pytest.fixture(scope="module")
def phase2_data(pretraining_inputs, tmp_path_factory) -> Path:
    from biomed_lm.pretrain.instance_builder import PretrainingDataConfig, create_pretraining_data

    out = tmp_path_factory.mktemp("phase2") / "data"
    create_pretraining_data(PretrainingDataConfig(corpus=str(pretraining_inputs["root"] / "corpus"),
                                                  tokenizer=str(pretraining_inputs["vocab"]), output_dir=str(out),
                                                  max_seq_length=32, num_proc=1), progress=False)
    return out


def test_phase2_continues_the_schedule_and_the_optimizer_state(pretraining_inputs, phase2_data, tmp_path):
    phase1, phase2 = tmp_path / "phase1", tmp_path / "phase2"
    first = run(_phase_args(pretraining_inputs, phase1, PHASE1))
    assert first.returncode == 0, first.stderr[-3000:]
    args = _phase_args(pretraining_inputs, phase2, SCHEDULE, "--continue-from", str(phase1))
    args = with_option(with_option(with_option(args, "--data-dir", str(phase2_data)), "--micro-batch-size", "4"),
                       "--gradient-accumulation-steps", "4")
    second = run(args)
    assert second.returncode == 0, second.stderr[-3000:]

    before, after = _records(phase1), _records(phase2)
    assert sorted(before) == list(range(1, PHASE1 + 1)) and sorted(after) == list(range(PHASE1 + 1, SCHEDULE + 1))
    schedule = ScheduleConfig(lr_schedule="slanted_triangular", warmup_ratio=0.3)
    for step, record in {**before, **after}.items():  # one schedule: step k uses the rate after k-1 updates
        assert record["lr"] == pytest.approx(learning_rate_at(step - 1, schedule, SCHEDULE, 1e-3), rel=1e-9)
    assert after[PHASE1 + 1]["lr"] < before[PHASE1]["lr"]  # still decaying: no second warm-up

    # The optimizer state carried over: Adam's per-parameter step count goes on from phase 1's.
    phase1_state = _adam_state(next((phase1 / "checkpoints").glob(f"*{PHASE1:08d}")))
    phase2_state = _adam_state(next((phase2 / "checkpoints").glob(f"*{SCHEDULE:08d}")))
    assert int(phase1_state["step"]) == PHASE1 and int(phase2_state["step"]) == SCHEDULE
    assert not torch.equal(phase1_state["exp_avg"], phase2_state["exp_avg"])
    run_config = json.loads((phase2 / "run_config.json").read_text())
    assert run_config["train"]["continue_from"] == str(phase1)


def test_continue_from_refuses_a_missing_run_and_another_schedule(pretraining_inputs, tmp_path):
    phase1 = tmp_path / "phase1"
    assert run(_phase_args(pretraining_inputs, phase1, 2)).returncode == 0
    other_rate = run(_phase_args(pretraining_inputs, tmp_path / "a", SCHEDULE, "--continue-from", str(phase1),
                                 "--learning-rate", "5e-4"))
    assert other_rate.returncode != 0 and "train.learning_rate" in other_rate.stderr
    missing = run(_phase_args(pretraining_inputs, tmp_path / "b", SCHEDULE, "--continue-from", str(tmp_path / "no")))
    assert missing.returncode != 0 and "continue_from" in missing.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()  # a refused start leaves no folder


def test_the_pubmedbert_configs_are_the_papers_recipe():
    """Section 2.5 of Gu et al.: AdamW 6e-4 (eps 1e-6, weight decay 0.01), one slanted triangular schedule
    of 62,500 steps at batch 8,192, 90% at length 128; phase 2 continues phase 1 with the same schedule."""
    import yaml

    from biomed_lm.pretrain.resume import CONTINUATION_FIXED
    from tests.conftest import REPO

    phase1, phase2 = (yaml.safe_load((REPO / "configs" / "pretrain" / f"pubmedbert_phase{n}.yaml").read_text())
                      for n in (1, 2))
    paper = {"optimizer": "adamw", "learning_rate": 6e-4, "adam_epsilon": 1e-6, "weight_decay": 0.01,
             "schedule": "slanted_triangular", "warmup_ratio": 0.1, "schedule_total_steps": 62500,
             "global_batch_size": 8192}
    for config in (phase1, phase2):
        assert {key: config[key] for key in paper} == paper
    assert phase1["max_steps"] == 56250 and phase2["max_steps"] == 62500
    assert phase2["continue_from"] == phase1["output_dir"]
    shared = {key.split(".")[1] for key in CONTINUATION_FIXED if key.startswith("train.")}
    assert {k: phase1.get(k) for k in shared} == {k: phase2.get(k) for k in shared}
    nvidia = yaml.safe_load((REPO / "configs" / "pretrain" / "nvidia_lamb_phase1.yaml").read_text())
    assert (nvidia["optimizer"], nvidia["learning_rate"], nvidia["global_batch_size"]) == ("lamb", 6e-3, 65536)


def test_a_checkpoint_written_before_the_schedule_fields_resumes_without_a_change():
    from biomed_lm.pretrain.resume import compare_continuation, compare_signatures

    current = {"train.max_steps": 10, "train.schedule_total_steps": 0, "train.continue_from": ""}
    old = {"train.max_steps": 10}
    assert compare_signatures(old, current, allow_change=False) == {}
    assert compare_continuation(old, current, source="x") == {}


def test_a_checkpoint_written_before_nsp_became_train_pair_resumes_without_a_change():
    from biomed_lm.pretrain.resume import ConfigChangeRefused, compare_continuation, compare_signatures

    current = {"data.train_pair": True, "train.max_steps": 10}
    old = {"data.nsp": True, "train.max_steps": 10}
    assert compare_signatures(old, current, allow_change=False) == {}
    assert compare_continuation(old, current, source="x") == {}
    with pytest.raises(ConfigChangeRefused, match="data.train_pair: True in the checkpoint, False now"):
        compare_signatures(old, {**current, "data.train_pair": False}, allow_change=False)
