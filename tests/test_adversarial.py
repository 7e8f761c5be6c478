"""ALUM adversarial pretraining (pretrain/adversarial.py): the pure pieces as properties, the term on
a tiny BERT, and one DeepSpeed run on CPU in a subprocess."""

from __future__ import annotations

import dataclasses
import math
import textwrap

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from biomed_lm.pretrain.adversarial import (AdversarialConfig, AdversarialPretrainingModel,
                                            AdversarialPretrainingOutput, adversarial_pretraining_loss,
                                            adversarial_term, ascent_direction, project, symmetric_kl, token_norm)
from biomed_lm.pretrain.config import PretrainConfigError
from biomed_lm.pretrain.modeling import IGNORE_INDEX, PretrainingModel
from tests.conftest import run_single_rank_deepspeed

VOCAB = 500


# --------------------------------------------------------------------------------------------
# Fixtures
# --------------------------------------------------------------------------------------------

def tiny_bert(dropout: float = 0.1):
    from transformers import BertConfig, BertForPreTraining

    config = BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=128, max_position_embeddings=64, hidden_dropout_prob=dropout,
                        attention_probs_dropout_prob=dropout)
    torch.manual_seed(0)
    return BertForPreTraining._from_config(config, attn_implementation="sdpa")


def make_batch(seed: int = 0, batch: int = 4, seq: int = 24, pad: int = 4) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (batch, seq), generator=generator)
    attention = torch.ones_like(ids)
    attention[0, seq - pad:] = 0  # one padded row
    ids[0, seq - pad:] = 0
    labels = torch.full_like(ids, IGNORE_INDEX)
    chosen = (torch.rand(ids.shape, generator=generator) < 0.2) & attention.bool()
    labels[chosen] = ids[chosen]
    ids = torch.where(chosen, torch.full_like(ids, 4), ids)  # [MASK]
    return {"input_ids": ids, "attention_mask": attention, "token_type_ids": torch.zeros_like(ids),
            "labels": labels, "next_sentence_label": torch.tensor([0, 1] * (batch // 2))}


def prepared(model: PretrainingModel, batch):
    """The micro-batch in the model's own layout."""
    return model.prepare(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], batch["labels"])


def clean_masked_logits(model: PretrainingModel, batch) -> torch.Tensor:
    """The clean pass the wrapper captures, recomputed through the model's own layout."""
    return model.masked_logits(prepared(model, batch))


def config(**overrides) -> AdversarialConfig:
    return AdversarialConfig(adversarial=True, **overrides)


# --------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------

def test_config_defaults_are_alums_pretraining_settings():
    c = AdversarialConfig()
    assert (c.adversarial, c.adv_alpha, c.adv_sigma, c.adv_step_size, c.adv_epsilon, c.adv_steps, c.adv_norm) == (
        False, 10.0, 1e-5, 1e-3, 1e-5, 1, "linf")
    assert all(f.metadata.get("help") for f in dataclasses.fields(AdversarialConfig))


@pytest.mark.parametrize("bad", [{"adv_alpha": -1.0}, {"adv_sigma": float("nan")}, {"adv_step_size": float("inf")},
                                 {"adv_epsilon": 0.0}, {"adv_steps": -1}, {"adv_steps": 1.5}, {"adv_norm": "l1"}])
def test_config_rejects_unusable_values(bad):
    with pytest.raises(PretrainConfigError):
        AdversarialConfig(**bad)


def test_config_parses_beside_the_pretraining_arguments():
    from biomed_lm.config import parse_config
    from biomed_lm.pretrain.config import DataArguments, ModelArguments, TrainArguments

    *_, adv = parse_config([ModelArguments, DataArguments, TrainArguments, AdversarialConfig],
                           ["--adversarial", "--adv_norm", "l2", "--adv_epsilon", "1e-3", "--adv_steps", "2"])
    assert adv == AdversarialConfig(adversarial=True, adv_norm="l2", adv_epsilon=1e-3, adv_steps=2)


# --------------------------------------------------------------------------------------------
# Pure functions (property tests)
# --------------------------------------------------------------------------------------------

@st.composite
def tensors(draw, min_rows: int = 1):
    rows = draw(st.integers(min_rows, 6))
    width = draw(st.integers(1, 12))
    seed = draw(st.integers(0, 2**31 - 1))
    scale = draw(st.sampled_from([1e-7, 1e-5, 1e-3, 1.0, 30.0]))
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, width, generator=generator) * scale
    zero_rows = draw(st.lists(st.integers(0, rows - 1), max_size=2))
    x[zero_rows] = 0.0
    return x


norms = st.sampled_from(["linf", "l2"])
epsilons = st.sampled_from([1e-6, 1e-5, 1e-3, 0.5])


@settings(max_examples=200, deadline=None)
@given(x=tensors(), epsilon=epsilons, norm=norms)
def test_projection_lands_in_the_ball_and_is_idempotent(x, epsilon, norm):
    projected = project(x, epsilon, norm)
    assert projected.dtype == x.dtype and projected.shape == x.shape
    assert (token_norm(projected, norm) <= epsilon * (1 + 1e-6)).all()
    assert torch.allclose(project(projected, epsilon, norm), projected, rtol=1e-6, atol=0)
    inside = token_norm(x, norm).squeeze(-1) <= epsilon
    assert torch.equal(projected[inside], x[inside])  # points in the ball are left exactly as they are


@settings(max_examples=200, deadline=None)
@given(x=tensors(), epsilon=epsilons)
def test_l2_projection_puts_outside_points_on_the_boundary_along_the_same_ray(x, epsilon):
    projected = project(x, epsilon, "l2")
    outside = token_norm(x, "l2").squeeze(-1) > epsilon
    assert torch.allclose(token_norm(projected[outside], "l2"),
                          torch.full((int(outside.sum()), 1), epsilon), rtol=1e-6, atol=0)
    # same direction: the rescale is by a positive factor per row
    assert torch.allclose(F.normalize(projected[outside], dim=-1), F.normalize(x[outside], dim=-1), atol=1e-6)


@settings(max_examples=200, deadline=None)
@given(x=tensors(), epsilon=epsilons)
def test_linf_projection_clamps_each_coordinate(x, epsilon):
    assert torch.equal(project(x, epsilon, "linf"), torch.clamp(x, -epsilon, epsilon))


@settings(max_examples=200, deadline=None)
@given(g=tensors(), norm=norms, power=st.integers(-20, 20))
def test_ascent_direction_is_unit_per_token_and_scale_invariant(g, norm, power):
    direction = ascent_direction(g, norm)
    lengths = token_norm(direction, norm).squeeze(-1)
    nonzero = token_norm(g, norm).squeeze(-1) > 0
    assert torch.allclose(lengths[nonzero], torch.ones(int(nonzero.sum())), rtol=1e-6)
    assert torch.equal(direction[~nonzero], torch.zeros_like(direction[~nonzero]))
    assert torch.equal(torch.sign(direction), torch.sign(g))
    assert torch.allclose(ascent_direction(g * 2.0**power, norm), direction, rtol=1e-6, atol=0)


@settings(max_examples=200, deadline=None)
@given(p=tensors(), seed=st.integers(0, 2**31 - 1), scale=st.sampled_from([1e-4, 0.1, 1.0, 10.0]))
def test_symmetric_kl_is_symmetric_nonnegative_and_zero_on_equal_inputs(p, seed, scale):
    q = p + scale * torch.randn(p.shape, generator=torch.Generator().manual_seed(seed))
    per_row = symmetric_kl(p, q, reduction="none")
    assert torch.equal(per_row, symmetric_kl(q, p, reduction="none"))  # exactly, not just up to rounding
    assert (per_row >= 0).all()
    assert torch.equal(symmetric_kl(p, p, reduction="none"), torch.zeros(p.shape[0]))
    assert torch.allclose(symmetric_kl(p, q), per_row.mean())
    assert torch.allclose(symmetric_kl(p, q, "sum"), per_row.sum())
    # the textbook KL(p‖q) + KL(q‖p), and invariance to a per-row shift of the logits
    log_p, log_q = F.log_softmax(p.double(), -1), F.log_softmax(q.double(), -1)
    reference = (F.kl_div(log_q, log_p, log_target=True, reduction="none")
                 + F.kl_div(log_p, log_q, log_target=True, reduction="none")).sum(-1)
    assert torch.allclose(per_row.double(), reference, rtol=1e-4, atol=1e-6)
    assert torch.allclose(symmetric_kl(p + 3.0, q - 2.0, reduction="none"), per_row, rtol=1e-4, atol=1e-6)


def test_symmetric_kl_runs_in_float32_for_half_inputs_and_handles_no_rows():
    p = torch.randn(5, 50).to(torch.bfloat16)
    q = (p.float() + 0.01 * torch.randn(5, 50)).to(torch.bfloat16)
    assert symmetric_kl(p, q).dtype == torch.float32 and symmetric_kl(p, q) > 0
    assert symmetric_kl(p.double(), q.double()).dtype == torch.float64
    assert symmetric_kl(torch.empty(0, 7), torch.empty(0, 7)).item() == 0.0


# --------------------------------------------------------------------------------------------
# The term on a tiny BERT
# --------------------------------------------------------------------------------------------

def test_unperturbed_embeddings_path_reproduces_the_clean_logits_exactly():
    """σ = 0 and K = 0: δ is zero, and feeding the word embeddings through ``inputs_embeds`` is the
    very computation the model does from ``input_ids`` (the definition of "embedding output")."""
    model = PretrainingModel(tiny_bert()).eval()
    batch = make_batch()
    clean = clean_masked_logits(model, batch)
    result = adversarial_pretraining_loss(model, prepared(model, batch), clean, config(adv_sigma=0.0, adv_steps=0))
    assert result.finite and result.symmetric_kl.item() == 0.0 and result.loss_term.item() == 0.0
    assert result.delta_norm.item() == 0.0 and result.delta_retained.item() == 1.0


def test_alpha_zero_sigma_zero_reproduces_the_standard_loss_and_gradients_exactly():
    batch = make_batch()
    standard = PretrainingModel(tiny_bert())  # train mode: dropout on
    torch.manual_seed(7)
    expected = standard(**batch)
    expected.loss.backward()
    adversarial = AdversarialPretrainingModel(tiny_bert(), adversarial=config(adv_alpha=0.0, adv_sigma=0.0))
    torch.manual_seed(7)
    out = adversarial(**batch)
    out.loss.backward()
    assert isinstance(out, AdversarialPretrainingOutput) and out.adv_kl > 0  # the term ran (dropout differs)
    assert torch.equal(out.loss, expected.loss) and torch.equal(out.mlm_loss, expected.mlm_loss)
    for (name, p), q in zip(adversarial.named_parameters(), standard.parameters()):
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is not None:
            assert torch.equal(p.grad, q.grad), name


@pytest.mark.parametrize("norm,epsilon", [("linf", 1e-3), ("l2", 1e-2)])
def test_ascent_increases_the_term_beyond_its_start_and_a_random_perturbation(norm, epsilon):
    """Near δ = 0 the symmetric KL is quadratic in δ, so one normalized gradient step from small
    noise is a power-iteration step towards the most sensitive directions: it must beat a random
    perturbation of the same size in the same ball, not only the (smaller) starting noise."""
    model = PretrainingModel(tiny_bert()).eval()  # no dropout: the KL measures δ alone
    batch = make_batch()
    clean = clean_masked_logits(model, batch).detach()
    settings_ = dict(adv_epsilon=epsilon, adv_step_size=10 * epsilon, adv_sigma=epsilon / 10, adv_norm=norm)

    def kl(steps: int) -> float:
        result = adversarial_pretraining_loss(model, prepared(model, batch), clean,
                                              config(adv_steps=steps, **settings_),
                                              generator=torch.Generator().manual_seed(3))
        assert result.finite and result.delta_norm <= epsilon * (1 + 1e-6)
        return result.symmetric_kl.item()

    start, one, two = kl(0), kl(1), kl(2)
    assert 0 < start < one and start < two
    # a random direction of the same size in the same ball does much less than the ascent
    random = torch.randn(batch["input_ids"].shape + (64,), generator=torch.Generator().manual_seed(5))
    random = epsilon * (random.sign() if norm == "linf" else F.normalize(random, dim=-1))
    embeds = model.hf_model.get_input_embeddings()(batch["input_ids"])
    masked = batch["labels"] != IGNORE_INDEX
    with torch.no_grad():
        random_logits = model.hf_model.cls.predictions(model.hf_model.bert(
            inputs_embeds=embeds + random, attention_mask=batch["attention_mask"],
            token_type_ids=batch["token_type_ids"])[0][masked])
    assert one > 1.5 * symmetric_kl(clean, random_logits).item()


@pytest.mark.parametrize("norm", ["linf", "l2"])
def test_term_is_nonnegative_bounded_and_reaches_the_parameters(norm):
    model = PretrainingModel(tiny_bert())
    batch = make_batch()
    clean = clean_masked_logits(model, batch)
    result = adversarial_pretraining_loss(model, prepared(model, batch), clean, config(adv_norm=norm))
    assert result.finite and result.loss_term.item() >= 0
    assert torch.allclose(result.loss_term.detach(), 10.0 * result.symmetric_kl)
    assert 0 < result.delta_norm.item() <= 1e-5 * (1 + 1e-6)
    result.loss_term.backward()  # the adversarial term alone
    grads = {name: p.grad for name, p in model.named_parameters()}
    for name in ("hf_model.bert.embeddings.word_embeddings.weight", "hf_model.bert.embeddings.LayerNorm.weight",
                 "hf_model.bert.encoder.layer.0.attention.self.query.weight",
                 "hf_model.bert.encoder.layer.1.output.dense.weight", "hf_model.cls.predictions.transform.dense.weight",
                 "hf_model.cls.predictions.bias"):
        assert grads[name] is not None and grads[name].abs().sum() > 0, name
    assert grads["hf_model.cls.seq_relationship.weight"] is None  # NSP is not part of the term


def test_final_term_differentiates_through_both_sides():
    """ALUM's Algorithm 1, line 8: ∇θ ℓ(f(x; θ), f(x + δ; θ)) with both arguments live, so the
    parameters get more than the one-sided term (the same δ, clean side detached) gives them."""
    torch.manual_seed(0)
    weight = torch.randn(8, 11, requires_grad=True)
    embeds = torch.randn(3, 8)
    clean = embeds @ weight
    settings_ = config(adv_alpha=1.0, adv_epsilon=0.1)
    both = adversarial_term(lambda e: e @ weight, embeds, clean, settings_, generator=torch.Generator().manual_seed(0))
    one_sided = adversarial_term(lambda e: e @ weight, embeds, clean.detach(), settings_,
                                 generator=torch.Generator().manual_seed(0))
    assert torch.equal(both.symmetric_kl, one_sided.symmetric_kl)  # the same δ
    grad_clean, grad_both = torch.autograd.grad(both.loss_term, [clean, weight])
    (grad_one_sided,) = torch.autograd.grad(one_sided.loss_term, weight)
    assert grad_clean.abs().sum() > 0 and grad_one_sided.abs().sum() > 0
    assert not torch.allclose(grad_both, grad_one_sided)


def test_detached_targets_give_the_released_criterions_gradient_and_the_same_value():
    """adv_kl_targets="detached" is ALUM's released pretraining criterion: KL(adv‖stop(clean)) +
    KL(clean‖stop(adv)) as F.kl_div computes them; its value is the live term's, its gradient not."""
    torch.manual_seed(0)
    clean, adv = torch.randn(5, 13, requires_grad=True), torch.randn(5, 13, requires_grad=True)
    released = (F.kl_div(F.log_softmax(adv, -1), F.softmax(clean.detach(), -1), reduction="sum")
                + F.kl_div(F.log_softmax(clean, -1), F.softmax(adv.detach(), -1), reduction="sum"))
    ours = symmetric_kl(clean, adv, reduction="sum", detached_targets=True)
    live = symmetric_kl(clean, adv, reduction="sum")
    torch.testing.assert_close(ours, released, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(live, ours, rtol=1e-6, atol=1e-6)
    for mine, theirs in zip(torch.autograd.grad(ours, [clean, adv]), torch.autograd.grad(released, [clean, adv])):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-7)
    live_grads = torch.autograd.grad(live, [clean, adv])
    assert not torch.allclose(live_grads[0], torch.autograd.grad(
        symmetric_kl(clean, adv, reduction="sum", detached_targets=True), clean)[0], rtol=1e-2)
    with pytest.raises(PretrainConfigError, match="adv_kl_targets"):
        config(adv_kl_targets="fixed")


def test_the_term_divides_by_the_steps_masked_share_as_the_mlm_loss_does():
    """With the step's masked share as denominator (accumulation, several ranks) the term is α times the
    summed SymKL over it, so a masked token weighs the same in every micro-batch; the logged SymKL stays
    the rows' mean."""
    model = PretrainingModel(tiny_bert(dropout=0.0)).train()
    batch = make_batch()
    layout = prepared(model, batch)
    rows = layout.masked_positions.numel()
    results = []
    for denominator in (None, torch.tensor(3.5)):
        clean = model.masked_logits(layout)
        torch.manual_seed(5)
        results.append(adversarial_pretraining_loss(model, dataclasses.replace(layout, mlm_denominator=denominator),
                                                    clean, config(adv_alpha=2.0, adv_epsilon=1e-2)))
    own, shared = results
    torch.testing.assert_close(shared.symmetric_kl, own.symmetric_kl)
    torch.testing.assert_close(shared.loss_term * 3.5, own.loss_term * rows, rtol=1e-5, atol=0)
    torch.testing.assert_close(own.loss_term, 2.0 * own.symmetric_kl, rtol=1e-5, atol=0)


def test_a_dropped_term_is_left_out_of_the_logged_symmetric_kl(monkeypatch):
    """A micro-batch whose term was not finite logs 0 (not NaN, which metrics.jsonl cannot hold) and the
    step's SymKL is the mean over the others."""
    model = AdversarialPretrainingModel(tiny_bert(), adversarial=config()).train()
    batch = make_batch()
    real_randn = torch.randn
    monkeypatch.setattr(torch, "randn", lambda *args, **kwargs: real_randn(*args, **kwargs) * float("nan"))
    out = model(**batch)
    assert int(out.adv_nonfinite) == 1 and out.adv_kl.item() == 0.0 and math.isfinite(out.loss.item())
    state = AdversarialPretrainingOutput.state_type()
    metrics = AdversarialPretrainingOutput.step_metrics({"adv_kl": 0.3, "adv_nonfinite": 1}, 2, False, state)
    assert metrics["adv_symmetric_kl"] == pytest.approx(0.3)
    assert AdversarialPretrainingOutput.step_metrics({"adv_kl": 0.0, "adv_nonfinite": 2}, 2, False,
                                                     state)["adv_symmetric_kl"] is None


def test_same_generator_same_term():
    model = PretrainingModel(tiny_bert()).eval()
    batch = make_batch()
    clean = clean_masked_logits(model, batch)
    runs = [adversarial_pretraining_loss(model, prepared(model, batch), clean, config(),
                                         generator=torch.Generator().manual_seed(11))
            for _ in range(2)]
    assert torch.equal(runs[0].symmetric_kl, runs[1].symmetric_kl)


def test_nonfinite_perturbed_pass_falls_back_to_a_zero_term():
    weight = torch.randn(8, 5, requires_grad=True)
    embeds = torch.randn(4, 8)
    result = adversarial_term(lambda e: e @ weight * float("nan"), embeds, embeds @ weight, config())
    assert not result.finite and torch.isnan(result.symmetric_kl)
    assert result.loss_term.item() == 0.0 and result.loss_term.grad_fn is None


@pytest.mark.parametrize("steps", [0, 1])
def test_nan_in_delta_falls_back_to_a_zero_term(monkeypatch, steps):
    model = PretrainingModel(tiny_bert())
    batch = make_batch()
    clean = clean_masked_logits(model, batch)
    real_randn = torch.randn
    monkeypatch.setattr(torch, "randn", lambda *args, **kwargs: real_randn(*args, **kwargs) * float("nan"))
    result = adversarial_pretraining_loss(model, prepared(model, batch), clean, config(adv_steps=steps))
    assert not result.finite and result.loss_term.item() == 0.0 and result.loss_term.grad_fn is None


def test_absurd_perturbation_is_caught_on_the_model_and_the_step_keeps_the_standard_loss():
    batch = make_batch()
    absurd = config(adv_sigma=1e30, adv_epsilon=1e38, adv_step_size=1e38)  # finite settings, overflowing sums
    model = PretrainingModel(tiny_bert())
    result = adversarial_pretraining_loss(model, prepared(model, batch), clean_masked_logits(model, batch), absurd)
    assert not result.finite and result.loss_term.item() == 0.0
    wrapper = AdversarialPretrainingModel(tiny_bert(), adversarial=absurd)
    torch.manual_seed(1)
    out = wrapper(**batch)
    assert out.adv_nonfinite.item() == 1 and out.adv_loss.item() == 0.0
    assert torch.isfinite(out.loss) and torch.equal(out.loss.detach(), out.mlm_loss + out.pair_loss)
    out.loss.backward()  # the standard loss still trains every parameter
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in wrapper.parameters())


def test_wrapper_adds_the_term_only_when_training_and_enabled():
    batch = make_batch()
    wrapper = AdversarialPretrainingModel(tiny_bert(), adversarial=config())
    assert list(wrapper.state_dict()) == list(PretrainingModel(tiny_bert()).state_dict())
    out = wrapper(**batch)
    assert out.adv_nonfinite.item() == 0 and out.adv_kl > 0 and out.adv_delta_retained > 0.99
    assert torch.allclose(out.loss.detach(), out.mlm_loss + out.pair_loss + out.adv_loss)
    assert out.adv_loss > 0

    wrapper.eval()
    evaluated = wrapper(**batch)
    assert evaluated.adv_kl.item() == 0.0 and torch.equal(evaluated.loss, evaluated.mlm_loss + evaluated.pair_loss)
    wrapper.train()
    disabled = AdversarialPretrainingModel(wrapper.hf_model, adversarial=AdversarialConfig(adversarial=False))
    assert disabled(**batch).adv_kl.item() == 0.0
    unmasked = dict(batch, labels=torch.full_like(batch["labels"], IGNORE_INDEX))
    nothing = wrapper(**unmasked)
    assert nothing.adv_kl.item() == 0.0 and nothing.mlm_count.item() == 0


def test_half_precision_model_reports_how_much_of_delta_survives():
    """Under bf16 weights the KL is still float32, and a 1e-5 perturbation is mostly rounded away:
    the result says so, and a 1e-3 one gets through."""
    model = PretrainingModel(tiny_bert().to(torch.bfloat16)).eval()
    batch = make_batch()
    clean = clean_masked_logits(model, batch)
    small = adversarial_pretraining_loss(model, prepared(model, batch), clean, config(),
                                         generator=torch.Generator().manual_seed(0))
    large = adversarial_pretraining_loss(model, prepared(model, batch), clean, config(adv_epsilon=1e-3),
                                         generator=torch.Generator().manual_seed(0))
    assert small.finite and small.symmetric_kl.dtype == torch.float32 and small.loss_term.dtype == torch.float32
    assert small.delta_retained < 0.5 < 0.95 < large.delta_retained
    assert large.symmetric_kl > small.symmetric_kl


def test_under_bf16_autocast_a_small_epsilon_is_mostly_rounding_and_the_config_says_so():
    """Autocast keeps fp32 weights, so δ reaches the embeddings whole (retained 1), yet the bf16
    matrix multiplies round their inputs more coarsely than a δ of 1e-5 moves them: the term is far
    larger than fp32's (rounding, not δ). At 1e-3 the two agree closely. The run log's caveat
    (``precision_caveat``) names the case; fp32, or ε of 1e-3, get none."""
    model = AdversarialPretrainingModel(tiny_bert(), adversarial=config()).eval()
    batch = make_batch()

    def term(epsilon: float, autocast: bool):
        model.adversarial = config(adv_epsilon=epsilon)
        torch.manual_seed(0)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = adversarial_pretraining_loss(model, prepared(model, batch), clean_masked_logits(model, batch),
                                               model.adversarial, generator=torch.Generator().manual_seed(0))
        return out.symmetric_kl.item(), out.delta_retained.item()

    (small_fp32, _), (small_bf16, retained) = term(1e-5, False), term(1e-5, True)
    (large_fp32, _), (large_bf16, _) = term(1e-3, False), term(1e-3, True)
    assert retained == pytest.approx(1.0, abs=1e-4)
    assert small_bf16 > 5 * small_fp32 and large_bf16 == pytest.approx(large_fp32, rel=0.5)
    assert "mostly rounding noise" in config().precision_caveat("bf16")
    assert config().precision_caveat("fp8") is not None
    assert config().precision_caveat("fp32") is None and config(adv_epsilon=1e-3).precision_caveat("bf16") is None


# --------------------------------------------------------------------------------------------
# DeepSpeed (CPU, one process)
# --------------------------------------------------------------------------------------------

DEEPSPEED_SCRIPT = textwrap.dedent("""
    import json, logging
    import torch
    import deepspeed
    from transformers import BertConfig, BertForPreTraining
    from biomed_lm.pretrain.adversarial import AdversarialConfig, AdversarialPretrainingModel

    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
    results = {}
    for precision in ("fp32", "bf16"):
        torch.manual_seed(0)
        config = BertConfig(vocab_size=500, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=128, max_position_embeddings=64)
        model = AdversarialPretrainingModel(BertForPreTraining._from_config(config, attn_implementation="sdpa"),
                                            adversarial=AdversarialConfig(adversarial=True, adv_epsilon=1e-3))
        ds_config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
                     "steps_per_print": 10**9, "wall_clock_breakdown": False}
        if precision == "bf16":
            ds_config["bf16"] = {"enabled": True}
        engine, _, _, _ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3),
                                               config=ds_config)
        before = [p.detach().float().clone() for p in engine.module.parameters()]
        generator = torch.Generator().manual_seed(1)
        micro = []
        for _ in range(4):  # 2 optimizer steps x 2 accumulated micro-batches
            ids = torch.randint(5, 500, (2, 16), generator=generator)
            labels = torch.full_like(ids, -100)
            labels[:, 2:6] = ids[:, 2:6]
            out = engine(input_ids=ids, attention_mask=torch.ones_like(ids), token_type_ids=torch.zeros_like(ids),
                         labels=labels, next_sentence_label=torch.tensor([0, 1]))
            engine.backward(out.loss)
            engine.step()
            micro.append({"loss": out.loss.item(), "adv_loss": out.adv_loss.item(),
                          "nonfinite": int(out.adv_nonfinite), "retained": out.adv_delta_retained.item()})
        results[precision] = {
            "micro": micro, "global_steps": engine.global_steps,
            "dtype": str(next(engine.module.parameters()).dtype),
            "changed": sum(not torch.equal(b, p.detach().float()) for b, p in zip(before, engine.module.parameters()))}
    print("RESULT " + json.dumps(results))
""")


def test_alum_inside_a_deepspeed_engine_with_accumulation_and_bf16():
    results = run_single_rank_deepspeed(DEEPSPEED_SCRIPT)
    assert results["fp32"]["dtype"] == "torch.float32" and results["bf16"]["dtype"] == "torch.bfloat16"
    for run in results.values():
        assert run["global_steps"] == 2 and run["changed"] > 0
        for micro in run["micro"]:
            assert micro["nonfinite"] == 0 and micro["adv_loss"] > 0
            assert math.isfinite(micro["loss"]) and micro["retained"] > 0.9
