"""Pretraining building blocks: batch plan, generated DeepSpeed config, sparse MLM head, checkpoints."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from biomed_lm.pretrain.checkpoint import LATEST, checkpoints_root, latest_tag, tag_for
from biomed_lm.pretrain.config import (PretrainConfigError, TrainArguments, create_ds_config, load_model_preset,
                                       trainer_clips_gradients)
from biomed_lm.pretrain.modeling import PretrainingModel, build_bert
from biomed_lm.pretrain.sampler import BatchPlan


@settings(max_examples=100, deadline=None)
@given(n=st.integers(8, 400), micro=st.integers(1, 4), accum=st.integers(1, 3), world=st.integers(1, 4),
       step=st.integers(0, 50), seed=st.integers(0, 5))
def test_batch_plan_partitions_each_global_batch(n, micro, accum, world, step, seed):
    if n < micro * accum * world:
        with pytest.raises(PretrainConfigError, match="cannot fill one global batch"):
            BatchPlan(n, micro, accum, world, 0, seed)
        return
    plans = [BatchPlan(n, micro, accum, world, r, seed) for r in range(world)]
    per_rank = [sum(p.micro_batches(step), []) for p in plans]
    flat = sum(per_rank, [])
    assert len(flat) == len(set(flat)) == micro * accum * world  # ranks never share an instance
    assert all(len(mb) == micro for p in plans for mb in p.micro_batches(step))
    assert all(0 <= i < n for i in flat)
    # A pure function of (seed, step, rank): a fresh plan gives the same batches.
    assert BatchPlan(n, micro, accum, world, 0, seed).micro_batches(step) == plans[0].micro_batches(step)


def test_batch_plan_epochs_cover_data_and_reshuffle():
    plan = BatchPlan(10, 2, 1, 2, 0, seed=1)
    other = BatchPlan(10, 2, 1, 2, 1, seed=1)
    epoch0 = [i for s in range(plan.steps_per_epoch) for p in (plan, other) for mb in p.micro_batches(s) for i in mb]
    assert len(set(epoch0)) == 8  # two steps of 4: 8 distinct instances, the last 2 dropped
    epoch1 = [i for s in range(2, 4) for p in (plan, other) for mb in p.micro_batches(s) for i in mb]
    assert epoch0 != epoch1


@pytest.mark.parametrize("n", [1, 2, 3, 5, 10, 17, 64, 1000, 4097])
def test_batch_plan_permutation_is_a_bijection_per_epoch(n):
    plan = BatchPlan(n, 1, 1, 1, 0, seed=3)
    epochs = [plan.permutation(e).tolist() for e in range(3)]
    assert all(sorted(p) == list(range(n)) for p in epochs)
    if n >= 10:
        assert epochs[0] != epochs[1] != epochs[2]
        assert BatchPlan(n, 1, 1, 1, 0, seed=4).permutation(0).tolist() != epochs[0]
    assert plan.shuffled(1, n // 3, n).tolist() == epochs[1][n // 3:]  # any slice, computed on its own


def test_batch_plan_never_materializes_the_epoch():
    """A step of a 10^11-instance epoch costs what a step of a small one does (no O(N) permutation)."""
    import time

    plan = BatchPlan(10 ** 11, 256, 2, 8, 5, seed=42)
    started = time.perf_counter()
    batches = plan.micro_batches(123_456_789)
    assert time.perf_counter() - started < 0.5
    flat = sum(batches, [])
    assert len(flat) == len(set(flat)) == 512 and all(0 <= i < 10 ** 11 for i in flat)


def test_ds_config_is_derived_from_typed_arguments():
    args = TrainArguments(micro_batch_size=64, global_batch_size=8192, precision="bf16", zero_stage=1,
                          max_grad_norm=1.0)
    config = create_ds_config(args, world_size=64)
    assert config["train_batch_size"] == 8192 and config["gradient_accumulation_steps"] == 2
    assert (config["train_micro_batch_size_per_gpu"] == 64
            and config["torch_autocast"] == {"enabled": True, "dtype": "bfloat16"} and "bf16" not in config)
    assert config["zero_optimization"] == {"stage": 1} and config["gradient_clipping"] == 1.0
    # ZeRO stage 0 outside fp16: the trainer clips (one foreach multiply by the norm it computes anyway)
    stage0 = TrainArguments(micro_batch_size=64, global_batch_size=8192, precision="bf16", max_grad_norm=1.0)
    assert trainer_clips_gradients(stage0) and create_ds_config(stage0, world_size=64)["gradient_clipping"] == 0.0
    fp16 = TrainArguments(micro_batch_size=64, global_batch_size=8192, precision="fp16", max_grad_norm=1.0)
    assert not trainer_clips_gradients(fp16) and create_ds_config(fp16, world_size=64)["gradient_clipping"] == 1.0
    assert create_ds_config(TrainArguments(micro_batch_size=8, gradient_accumulation_steps=3), 2)[
        "train_batch_size"] == 48
    with pytest.raises(PretrainConfigError, match="not a multiple"):
        create_ds_config(TrainArguments(micro_batch_size=64, global_batch_size=1000), world_size=8)
    with pytest.raises(PretrainConfigError, match="zero_stage"):
        create_ds_config(TrainArguments(zero_stage=3), world_size=1)
    with pytest.raises(PretrainConfigError, match="profile_after 20 \\+ profile_steps 5 go past max_steps 24"):
        create_ds_config(TrainArguments(max_steps=24, profile_steps=5), world_size=1)
    assert create_ds_config(TrainArguments(max_steps=25, profile_steps=5), world_size=1)


def test_an_accumulation_the_global_batch_replaces_is_a_warning(caplog):
    """QA (2026-11-28): --global-batch-size 32 with --gradient-accumulation-steps 4 (micro 16) ran with 2,
    without a word."""
    from biomed_lm.pretrain.config import resolve_batch

    with caplog.at_level("WARNING", logger="biomed_lm.pretrain.config"):
        train = resolve_batch(TrainArguments(micro_batch_size=16, global_batch_size=32, gradient_accumulation_steps=4),
                              world_size=1)
        assert train.gradient_accumulation_steps == 2
        assert caplog.messages == ["gradient_accumulation_steps 4 is replaced by 2: global_batch_size 32 = "
                                   "micro_batch_size 16 × world size 1 × 2 (a global batch size decides the "
                                   "accumulation; give one of the two)"]
        resolve_batch(train, world_size=1)  # resolved again (the DeepSpeed config): agrees, no second warning
        resolve_batch(TrainArguments(micro_batch_size=16, global_batch_size=32), world_size=1)  # the default 1
    assert len(caplog.messages) == 1


def test_model_presets():
    base = load_model_preset("bert-base")
    assert (base["hidden_size"], base["num_hidden_layers"], base["num_attention_heads"]) == (768, 12, 12)
    assert "vocab_size" not in base
    with pytest.raises(PretrainConfigError, match="presets"):
        load_model_preset("bert-huge")


def test_sparse_mlm_head_matches_the_full_head():
    bert = build_bert(load_model_preset("bert-tiny"), vocab_size=500, pad_token_id=0).eval()
    model = PretrainingModel(bert)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(5, 500, (4, 20), generator=g)
    labels = torch.full_like(ids, -100)
    pick = torch.rand(ids.shape, generator=g) < 0.2
    labels[pick] = ids[pick]
    nsp = torch.tensor([0, 1, 1, 0])
    mask, types = torch.ones_like(ids), torch.zeros_like(ids)
    ours = model(ids, mask, types, labels, nsp)
    reference = bert(input_ids=ids, attention_mask=mask, token_type_ids=types, labels=labels, next_sentence_label=nsp)
    assert torch.allclose(ours.loss, reference.loss, atol=1e-5)
    assert int(ours.mlm_count) == int(pick.sum()) and int(ours.pair_count) == 4
    assert bert.config._attn_implementation == "sdpa"
    assert bert.cls.predictions.decoder.weight is bert.bert.embeddings.word_embeddings.weight  # tied


@pytest.mark.parametrize("attention", ["hf_sdpa", "sdpa_loop"])
def test_sdpa_and_eager_attention_give_the_same_losses_and_gradients(attention):
    """Kernel parity: a 2-layer × 32 model with transformers' "sdpa" attention (padded, or the default
    unpadded loop) gives the losses and gradients of the same weights under "eager", padding included."""
    fields = {**load_model_preset("bert-tiny"), "hidden_size": 32, "intermediate_size": 64,
              "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    torch.manual_seed(0)
    eager = build_bert(fields, vocab_size=200, pad_token_id=0, attn_implementation="eager")
    sdpa = build_bert(fields, vocab_size=200, pad_token_id=0, attn_implementation="sdpa")
    sdpa.load_state_dict(eager.state_dict())
    assert (eager.config._attn_implementation, sdpa.config._attn_implementation) == ("eager", "sdpa")
    g = torch.Generator().manual_seed(5)
    lengths = torch.tensor([16, 9, 13])
    mask = (torch.arange(16)[None, :] < lengths[:, None]).long()
    ids = torch.randint(5, 200, (3, 16), generator=g) * mask
    labels = torch.where((torch.rand(ids.shape, generator=g) < 0.3) & mask.bool(), ids, -100)
    batch = {"input_ids": ids, "attention_mask": mask, "token_type_ids": (torch.arange(16) >= 6).long().expand(3, 16)
             * mask, "labels": labels, "next_sentence_label": torch.tensor([0, 1, 0])}
    outs = []
    for bert, kind in ((eager, "hf_eager"), (sdpa, attention)):
        out = PretrainingModel(bert, attention=kind)(**batch)
        out.loss.backward()
        outs.append((out, {name: p.grad for name, p in bert.named_parameters()}))
    (ref, ref_grads), (got, got_grads) = outs
    for name in ("loss", "mlm_loss", "pair_loss"):
        assert torch.allclose(getattr(got, name), getattr(ref, name), atol=1e-5), name
    assert [int(getattr(got, n)) for n in ("mlm_correct", "mlm_count", "pair_correct", "pair_count")] == [
        int(getattr(ref, n)) for n in ("mlm_correct", "mlm_count", "pair_correct", "pair_count")]
    for name, grad in ref_grads.items():
        assert torch.allclose(got_grads[name], grad, atol=1e-5), name


def test_no_masked_token_and_no_pair_label_still_give_a_graph():
    bert = build_bert(load_model_preset("bert-tiny"), vocab_size=100, pad_token_id=0)
    model = PretrainingModel(bert, train_pair=False)
    ids = torch.randint(5, 100, (2, 8))
    out = model(ids, torch.ones_like(ids), torch.zeros_like(ids), torch.full_like(ids, -100),
                torch.tensor([-100, -100]))
    out.loss.backward()
    assert out.loss.item() == 0.0 and int(out.mlm_count) == 0
    assert all(p.grad is not None for p in model.parameters())


def test_a_state_dict_saved_under_the_old_attribute_name_loads():
    """Checkpoints written when PretrainingModel held its transformers model as ``bert`` name every
    parameter ``bert.…`` (bert.bert.embeddings.…, bert.cls.…): they load, strictly, into ``hf_model``."""
    torch.manual_seed(0)
    saved = PretrainingModel(build_bert(load_model_preset("bert-tiny"), vocab_size=100, pad_token_id=0))
    new_state = saved.state_dict()
    old_state = {"bert." + key.removeprefix("hf_model."): value for key, value in new_state.items()}
    assert {"bert.bert.embeddings.word_embeddings.weight", "bert.cls.predictions.bias"} <= set(old_state)
    for state in (old_state, new_state):
        torch.manual_seed(1)
        fresh = PretrainingModel(build_bert(load_model_preset("bert-tiny"), vocab_size=100, pad_token_id=0))
        fresh.load_state_dict(state)  # strict: no key missing or left over
        assert fresh.state_dict().keys() == new_state.keys()
        assert all(torch.equal(fresh.state_dict()[key], value) for key, value in new_state.items())
    assert "bert.cls.predictions.bias" in old_state  # the caller's dict is left as it was


def test_latest_tag_ignores_a_partial_save(tmp_path):
    root = checkpoints_root(tmp_path)
    (root / tag_for(10)).mkdir(parents=True)
    (root / LATEST).write_text(tag_for(10) + "\n")
    (root / f".partial-{tag_for(20)}").mkdir()  # a save that crashed half way
    assert latest_tag(tmp_path) == tag_for(10)
    (root / LATEST).write_text(tag_for(30) + "\n")  # points at a checkpoint that does not exist
    assert latest_tag(tmp_path) is None


def test_masking_rate_schedules():
    from biomed_lm.pretrain.masking import MaskRateSchedule

    constant = MaskRateSchedule()
    assert [constant.rate(s, 100) for s in (0, 50, 99)] == [0.15, 0.15, 0.15]
    # The paper's stepwise schedule: 5% -> 25%, +5% every 20% of training.
    stepwise = MaskRateSchedule("stepwise", start=0.05, end=0.25, stages=5)
    rates = [stepwise.rate(s, 100) for s in (0, 19, 20, 39, 40, 60, 80, 99)]
    assert rates == pytest.approx([0.05, 0.05, 0.10, 0.10, 0.15, 0.20, 0.25, 0.25])
    linear = MaskRateSchedule("linear", start=0.30, end=0.15)
    assert [linear.rate(s, 11) for s in (0, 5, 10)] == pytest.approx([0.30, 0.225, 0.15])
    with pytest.raises(ValueError):
        MaskRateSchedule("cosine")
    with pytest.raises(ValueError):
        MaskRateSchedule("linear", start=0.3, end=1.5)


def test_mask_schedule_from_arguments():
    from biomed_lm.pretrain.config import DataArguments
    from biomed_lm.pretrain.masking import mask_rate_schedule

    schedule = mask_rate_schedule(DataArguments(mlm_probability=0.05, mask_schedule="stepwise", mask_rate_end=0.25))
    assert schedule.rate(0, 10) == pytest.approx(0.05) and schedule.rate(9, 10) == pytest.approx(0.25)
    with pytest.raises(PretrainConfigError):
        mask_rate_schedule(DataArguments(mask_schedule="bogus"))


def test_masking_settings_the_schedule_ignores_are_said():
    """QA: --mask-schedule constant --mask-rate-end 0.3 trained at a constant 0.15 without a word."""
    from biomed_lm.pretrain.config import DataArguments
    from biomed_lm.pretrain.masking import unused_masking_settings

    assert unused_masking_settings(DataArguments(mask_rate_end=0.3)) == [
        "mask_rate_end 0.3 has no effect with mask_schedule constant: every step masks mlm_probability 0.15 "
        "(stepwise or linear end at mask_rate_end)"]
    assert unused_masking_settings(DataArguments(mask_schedule="linear", mask_schedule_stages=3)) == [
        "mask_schedule_stages 3 has no effect with mask_schedule linear: only a stepwise schedule has stages"]
    assert unused_masking_settings(DataArguments(mask_schedule="stepwise", mask_rate_end=0.3,
                                                 mask_schedule_stages=3)) == []
    assert unused_masking_settings(DataArguments(mask_rate_end=0.15)) == []  # the constant rate itself


def test_the_trainer_clips_the_gradients_to_the_global_norm_it_was_given():
    from types import SimpleNamespace

    from biomed_lm.pretrain.trainer import _clip_gradients, _gradient_norm

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    model(torch.randn(32, 8)).square().sum().backward()
    engine = SimpleNamespace(module=model, zero_optimization_stage=lambda: 0, fp16_enabled=lambda: False)
    grads = [p.grad.clone() for p in model.parameters()]
    norm = _gradient_norm(engine)
    assert float(norm) > 1.0
    _clip_gradients(engine, TrainArguments(max_grad_norm=1.0), norm)
    assert float(_gradient_norm(engine)) == pytest.approx(1.0, rel=1e-5)
    for before, p in zip(grads, model.parameters()):  # one factor for every tensor: the direction is kept
        assert torch.allclose(p.grad, before * (1.0 / (float(norm) + 1e-6)), rtol=1e-5)
    _clip_gradients(engine, TrainArguments(max_grad_norm=1.0, precision="fp16"), _gradient_norm(engine) * 10)
    assert float(_gradient_norm(engine)) == pytest.approx(1.0, rel=1e-5)  # fp16: DeepSpeed's to clip, not touched


def test_the_host_reads_at_logged_steps_checkpoints_the_end_and_every_16_micro_batches():
    from biomed_lm.pretrain.trainer import _is_read_point

    def reads(**options) -> list[int]:
        args = TrainArguments(max_steps=50, **options)
        return [step for step in range(1, 51) if _is_read_point(args, step)]

    assert reads(log_every=1) == list(range(1, 51))
    assert reads(log_every=100, checkpoint_every=1000) == [16, 32, 48, 50]
    assert reads(log_every=10, checkpoint_every=25) == [10, 16, 20, 25, 30, 32, 40, 48, 50]
    assert reads(log_every=100, checkpoint_every=1000, gradient_accumulation_steps=4) == list(range(4, 49, 4)) + [50]
    assert reads(log_every=100, checkpoint_every=1000, gradient_accumulation_steps=32) == list(range(1, 51))


def test_the_step_profiler_is_off_without_steps_and_covers_its_window(tmp_path):
    from biomed_lm.pretrain.profiling import StepProfiler

    off = StepProfiler(0, 20, tmp_path, torch.device("cpu"), "off")
    off.before_step(20)
    assert not off.on and off.after_step(21) is None
    window = StepProfiler(2, 1, tmp_path, torch.device("cpu"), "a run")
    reports = []
    for done in range(4):
        window.before_step(done)
        torch.ones(64, 64) @ torch.ones(64, 64)
        reports.append(window.after_step(done + 1))
    assert reports == [None, None, tmp_path / "profile.txt", None]  # steps 2-3
    text = (tmp_path / "profile.txt").read_text()
    assert text.startswith("a run, steps 2-3: top ") and "aten::mm" in text


def test_a_damaged_tokenizer_is_refused_naming_it(tmp_path):
    """QA (2026-11-28): a truncated tokenizer.json ended the run with a raw JSONDecodeError traceback
    naming no folder; create_pretraining_data and finetune already named it."""
    import shutil

    from biomed_lm.pretrain.config import DataArguments, PretrainConfigError
    from biomed_lm.pretrain.families import get_family
    from biomed_lm.pretrain.trainer import _load_data
    from biomed_lm.reference_models import general_bert_dir

    damaged = tmp_path / "tokenizer"
    shutil.copytree(general_bert_dir(), damaged)
    text = (damaged / "tokenizer.json").read_text(encoding="utf-8")
    (damaged / "tokenizer.json").write_text(text[:len(text) // 2], encoding="utf-8")
    with pytest.raises(PretrainConfigError, match=rf"cannot load the tokenizer at {damaged}: JSONDecodeError: "):
        _load_data(DataArguments(data_dir=str(tmp_path / "data"), tokenizer=str(damaged)), 512, get_family("bert"))
