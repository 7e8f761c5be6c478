"""The typed loop (issue 25): the checkpointed trainer state as a dataclass that still reads the
dicts older versions wrote (pretrain/trainer_state.py), ALUM's counter in ALUM's own type, and the
optimizer-step veto at the call site (``StepGate.vetoing``, pretrain/divergence.py).

The unit tests need no DeepSpeed; the two resumes at the end run launch/pretrain.py from a
checkpoint whose trainer state was rewritten into the old shape, and must match the run that never
stopped bit for bit.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

from biomed_lm.pretrain.adversarial import AdversarialPretrainingOutput, AdversarialState
from biomed_lm.pretrain.checkpoint import LATEST, MANIFEST, MODEL_STATES, write_manifest
from biomed_lm.pretrain.divergence import StepGate, Verdict
from biomed_lm.pretrain.modeling import PretrainingOutput
from biomed_lm.pretrain.trainer_state import TrainerState, VariantState
from tests.conftest import run_single_rank_deepspeed
from tests.pretrain_runs import copy_run, losses, pretrain_args, run, with_option

#: The trainer state as the version before the dataclass saved it (its ``_fresh_state()`` updated by
#: the loop): ALUM's counter in every run's state, ``continued_from`` only in a continued run's.
OLD_STATE = {"step": 10, "skipped_steps": 2, "consecutive_skips": 1, "adversarial_fallbacks": 3, "tokens": 9876,
             "train_seconds": 12.5, "lr_scale": 0.5, "guard": {"losses": [8.1, 8.0], "grad_norms": [1.5, 1.25],
                                                                "accepted": 8},
             "fp16_overflow_steps": 4}


# --- the state dict, old and new -------------------------------------------------------------

def test_an_old_state_dict_loads_field_by_field():
    state = TrainerState.from_dict(OLD_STATE)
    assert (state.step, state.skipped_steps, state.consecutive_skips, state.tokens) == (10, 2, 1, 9876)
    assert (state.train_seconds, state.lr_scale, state.fp16_overflow_steps) == (12.5, 0.5, 4)
    assert state.guard == OLD_STATE["guard"] and state.continued_from is None
    assert type(state.variant) is VariantState  # a run without ALUM leaves its counter out
    assert state.to_dict() == {k: v for k, v in OLD_STATE.items() if k != "adversarial_fallbacks"}


def test_an_old_alum_state_dict_gives_alum_its_counter_and_round_trips_exactly():
    state = TrainerState.from_dict(OLD_STATE, AdversarialState)
    assert state.variant == AdversarialState(adversarial_fallbacks=3)
    assert state.to_dict() == OLD_STATE


def test_fields_an_older_checkpoint_lacks_start_as_a_fresh_run_starts_them():
    state = TrainerState.from_dict({"step": 7, "tokens": 100}, AdversarialState)
    fresh = TrainerState(variant=AdversarialState())
    assert dataclasses.replace(state, step=0, tokens=0) == fresh
    assert state.variant.adversarial_fallbacks == 0 and state.fp16_overflow_steps == 0 and state.guard == {}


def test_continued_from_is_saved_only_when_the_run_continued_another():
    assert "continued_from" not in TrainerState().to_dict()
    continued = TrainerState(step=5, continued_from="/runs/phase1/checkpoints/step-00000005")
    assert TrainerState.from_dict(continued.to_dict()) == continued


def test_each_variant_names_its_state_type():
    assert PretrainingOutput.state_type is VariantState
    assert AdversarialPretrainingOutput.state_type is AdversarialState
    state = AdversarialState()
    AdversarialPretrainingOutput.account_step({"adv_nonfinite": 2.0}, state)
    AdversarialPretrainingOutput.account_step({"adv_nonfinite": 1.0}, state)
    assert state.adversarial_fallbacks == 3
    # the step's totals hold every EXTRA_TOTALS entry; a micro-batch whose term was dropped is not averaged
    assert AdversarialPretrainingOutput.step_metrics({"adv_kl": 0.5, "adv_nonfinite": 0.0}, 2, False, state) == {
        "adv_symmetric_kl": 0.25, "adv_fallbacks": 3}
    assert AdversarialPretrainingOutput.step_metrics({"adv_kl": 0.5, "adv_nonfinite": 1.0}, 2, False, state) == {
        "adv_symmetric_kl": 0.5, "adv_fallbacks": 3}


def test_a_variant_reusing_a_trainer_state_name_is_refused():
    @dataclasses.dataclass
    class Clashing(VariantState):
        tokens: int = 0

    with pytest.raises(TypeError, match="tokens"):
        TrainerState(variant=Clashing())


# --- the veto ----------------------------------------------------------------------------------

def _scheduled_model(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: 1.0 / (k + 1))
    return model, optimizer, scheduler


def _backward(model: torch.nn.Module) -> None:
    model.zero_grad()
    model(torch.ones(2, 4)).pow(2).sum().backward()


def _optimizer_state(optimizer) -> dict[tuple[int, str], torch.Tensor]:
    """Every tensor of the optimizer's state (moments, step counts), copied."""
    return {(i, name): torch.as_tensor(value).clone() for i, state in enumerate(optimizer.state.values())
            for name, value in state.items()}


def _step(optimizer, scheduler) -> None:
    """What DeepSpeed's step does at the boundary, in the order it does it."""
    optimizer.step()
    optimizer.zero_grad()
    scheduler.step()


@pytest.mark.parametrize("first", [True, False], ids=["first step", "a later step"])
def test_a_vetoed_step_leaves_weights_and_optimizer_alone_and_the_schedule_advances(first):
    model, optimizer, scheduler = _scheduled_model()
    if not first:
        _backward(model)
        _step(optimizer, scheduler)
    weights = [p.detach().clone() for p in model.parameters()]
    moments = _optimizer_state(optimizer)
    lr_before = scheduler.get_last_lr()
    scheduler_step = vars(optimizer)["step"]  # the scheduler's counting wrapper
    _backward(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's first-step order warnings included: the veto means it
        with StepGate(optimizer).vetoing(True):
            _step(optimizer, scheduler)
    assert all(torch.equal(w, p) for w, p in zip(weights, model.parameters()))
    after = _optimizer_state(optimizer)
    assert moments.keys() == after.keys() and all(torch.equal(moments[k], after[k]) for k in moments)
    assert scheduler.get_last_lr() != lr_before and scheduler.last_epoch == (1 if first else 2)
    assert vars(optimizer)["step"] is scheduler_step


def test_a_vetoed_step_is_exactly_a_step_without_the_update():
    vetoed, vetoed_optimizer, vetoed_scheduler = _scheduled_model()
    skipped, skipped_optimizer, skipped_scheduler = _scheduled_model()
    for veto in (False, True, True, False, False):
        _backward(vetoed)
        with StepGate(vetoed_optimizer).vetoing(veto):
            _step(vetoed_optimizer, vetoed_scheduler)
        _backward(skipped)
        if not veto:
            skipped_optimizer.step()
        skipped_optimizer.zero_grad()
        skipped_scheduler.step()
    assert all(torch.equal(a, b) for a, b in zip(vetoed.parameters(), skipped.parameters()))
    assert vetoed_scheduler.get_last_lr() == skipped_scheduler.get_last_lr()


def test_no_veto_changes_nothing_and_a_raising_block_lifts_the_veto():
    model, optimizer, scheduler = _scheduled_model()
    step = vars(optimizer)["step"]
    with pytest.raises(RuntimeError, match="in the step"):
        with StepGate(optimizer).vetoing(True):
            raise RuntimeError("in the step")
    assert vars(optimizer)["step"] is step
    weights = [p.detach().clone() for p in model.parameters()]
    _backward(model)
    with StepGate(optimizer).vetoing(False):
        assert vars(optimizer)["step"] is step
        _step(optimizer, scheduler)
    assert not any(torch.equal(w, p) for w, p in zip(weights, model.parameters()))


def test_an_optimizer_without_a_scheduler_gets_its_own_step_back():
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with StepGate(optimizer).vetoing(True):
        optimizer.step()
    assert "step" not in vars(optimizer)


DEEPSPEED_VETO_SCRIPT = textwrap.dedent("""
    import json, logging
    import torch
    import deepspeed
    from biomed_lm.pretrain.divergence import StepGate

    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
    CONFIGS = {"fp32": {}, "bf16": {"bf16": {"enabled": True}}, "zero1": {"zero_optimization": {"stage": 1}},
               "zero2_bf16": {"bf16": {"enabled": True}, "zero_optimization": {"stage": 2}}}
    results = {}
    for name, extra in CONFIGS.items():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: 1.0 / (k + 1))
        gate = StepGate(optimizer)
        engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler, config={
            "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "gradient_clipping": 1.0,
            "steps_per_print": 10**9, "wall_clock_breakdown": False, **extra})
        dtype = next(engine.module.parameters()).dtype
        generator = torch.Generator().manual_seed(1)
        weights, lrs = [], []
        for veto in (False, True, True, False):  # steps 2 and 3 rejected
            for micro in range(2):  # as the trainer steps: the veto around the boundary's engine.step()
                x = torch.randn(4, 8, generator=generator).to(dtype)
                engine.backward(engine(x).float().pow(2).mean())
                with gate.vetoing(veto and micro == 1):
                    engine.step()
            weights.append(torch.cat([p.detach().float().flatten() for p in engine.module.parameters()]))
            lrs.append(engine.get_lr()[0])
        results[name] = {"wrapper": type(engine.optimizer).__name__, "lrs": lrs,
                         "held": [torch.equal(weights[i], weights[i - 1]) for i in range(1, 4)]}
    print("RESULT " + json.dumps(results))
""")


def test_the_veto_holds_under_each_optimizer_wrapper_deepspeed_puts_around_it():
    """fp32 (the optimizer itself), DeepSpeed's bf16 wrapper and ZeRO 1 and 2: two vetoed steps keep the
    weights, the schedule advances through them, and the step after them updates again."""
    results = run_single_rank_deepspeed(DEEPSPEED_VETO_SCRIPT)
    assert set(results) == {"fp32", "bf16", "zero1", "zero2_bf16"}
    for result in results.values():
        assert result["held"] == [True, True, False], result
        assert result["lrs"] == sorted(result["lrs"], reverse=True) and len(set(result["lrs"])) == 4, result


@pytest.mark.parametrize(("verdict", "vetoes"), [
    (Verdict(False), False), (Verdict(True, "loss_spike"), True), (Verdict(True, "nonfinite_loss"), True),
    (Verdict(True, "fp16_overflow"), False),  # DeepSpeed skips that update itself
])
def test_which_verdicts_veto_the_update(verdict, vetoes):
    assert verdict.vetoes_update is vetoes


# --- resuming a checkpoint of the old shape ---------------------------------------------------

def _rewrite_trainer_state(folder: Path, edit) -> None:
    """Replace the trainer state DeepSpeed saved in ``folder`` with ``edit(saved)``, and re-sign the
    manifest (a checkpoint the older version wrote that way, not a damaged one)."""
    path = folder / MODEL_STATES
    saved = torch.load(path, weights_only=False)
    saved["trainer_state"] = edit(saved["trainer_state"])
    torch.save(saved, path)
    manifest = json.loads((folder / MANIFEST).read_text())
    write_manifest(folder, step=manifest["step"], world_size=manifest["world_size"],
                   zero_stage=manifest["zero_stage"], signature=manifest["signature"])


def _resume_from(out: Path, tag: str) -> None:
    """``out`` as if killed right after its checkpoint ``tag``: newer checkpoints and the export gone."""
    root = out / "checkpoints"
    for newer in sorted(p for p in root.glob("step-*") if p.name > tag):
        shutil.rmtree(newer)
    (root / LATEST).write_text(tag + "\n")
    shutil.rmtree(out / "model")


def _saved_state(out: Path, tag: str) -> dict:
    return torch.load(out / "checkpoints" / tag / MODEL_STATES, weights_only=False)["trainer_state"]


def _old_shape(saved: dict, **values) -> dict:
    """``saved`` as the older version wrote it, in its key order, with ``values`` changed."""
    return {key: {**saved, "adversarial_fallbacks": 0, **values}[key] for key in OLD_STATE}


def test_a_checkpoint_with_the_old_state_dict_resumes_bit_identically(pretraining_inputs, straight_run, tmp_path):
    out = copy_run(straight_run, tmp_path / "run")
    _resume_from(out, "step-00000010")
    _rewrite_trainer_state(out / "checkpoints" / "step-00000010", _old_shape)
    result = run(pretrain_args(pretraining_inputs, out))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resumed from" in result.stderr and "step-00000010" in result.stderr
    assert losses(out) == losses(straight_run)
    resumed, reference = _saved_state(out, "step-00000020"), _saved_state(straight_run, "step-00000020")
    assert resumed.pop("train_seconds") > 0 and reference.pop("train_seconds") > 0
    assert resumed == reference  # the new shape again: no ALUM counter in a run without ALUM


def test_an_old_alum_checkpoint_resumes_with_its_adversarial_counter(pretraining_inputs, tmp_path):
    args = with_option(with_option(pretrain_args(pretraining_inputs, tmp_path / "straight", "--adversarial"),
                                   "--max-steps", "6"), "--checkpoint-every", "3")
    straight = run(args)
    assert straight.returncode == 0, straight.stderr[-3000:]
    out = copy_run(tmp_path / "straight", tmp_path / "run")
    _resume_from(out, "step-00000003")
    _rewrite_trainer_state(out / "checkpoints" / "step-00000003", lambda saved: _old_shape(
        saved, adversarial_fallbacks=5))  # a count no run of this size reaches: it can only come from there
    result = run(with_option(args, "--output-dir", str(out)))
    assert result.returncode == 0, result.stderr[-3000:]
    assert losses(out) == losses(tmp_path / "straight")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["adv_fallbacks"] for r in records] == [0, 0, 0, 5, 5, 5]
    assert _saved_state(out, "step-00000006")["adversarial_fallbacks"] == 5
