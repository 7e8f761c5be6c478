"""ALUM adversarial pretraining as an extra loss term (Liu et al. 2020, "Adversarial Training for
Large Neural Language Models", arXiv:2004.08994; the PubMedBERT paper's §2.1.4 and Table 11).

ALUM regularizes training with a small perturbation δ of the input embeddings chosen to change the
model's predictions as much as possible, and penalizes that change. Per micro-batch (ALUM's
Algorithm 1 as written, with the ascent step's gradient normalized per token):

1. δ ~ N(0, σ²) on every token of the embedding output, projected onto the ε-ball;
2. K times: g = ∇_δ SymKL(stop(f(x)), f(x + δ)), δ ← Π_ε(δ + η · g / ‖g‖), per token;
3. loss = standard loss + α · SymKL(f(x), f(x + stop(δ))).

Definitions (the choices the paper leaves open, fixed here):

* **Embedding output** = the word (sub-word) embeddings ``E[input_ids]``, fed back through
  ``BertModel(inputs_embeds=...)``. In transformers 5.x ``BertEmbeddings`` computes
  ``LayerNorm(inputs_embeds + token_type + position)`` then dropout, so adding δ to the word
  embeddings is *exactly* adding δ to the pre-LayerNorm embedding sum (the position and segment
  tables are the same for clean and perturbed inputs): the perturbation sits where the sub-words
  enter the network, before the embedding LayerNorm, as in ALUM ("perturbations in the embedding
  space"). It is applied at every position (padding included: padded keys are masked out of
  attention and carry no MLM target, so their δ has zero gradient and no effect). MT-DNN's
  transformers port instead feeds the whole post-LayerNorm ``BertEmbeddings`` output back as
  ``inputs_embeds``, which adds the position and segment embeddings a second time; that is not
  reproduced here.
* **f(x)** = the MLM logits at the masked positions only (what :class:`PretrainingModel` already
  computes); NSP is not perturbed. Both passes run in the model's current mode, so in training the
  clean and the perturbed pass draw independent dropout masks, as in ALUM's implementation. At
  ε = 1e-5 that dropout difference dominates the term by orders of magnitude (a freshly
  initialized tiny BERT: SymKL 5e-3 in training mode, 5e-9 from δ alone in eval mode).
* **SymKL(p, q)** = KL(p‖q) + KL(q‖p), computed in float32 (or float64 for float64 inputs) from
  log-softmaxes, summed over the vocabulary and averaged over the masked positions (so α weighs a
  per-token quantity, like the MLM cross-entropy). Written as Σ (p − q)(log p − log q), it is
  exactly symmetric in floating point and non-negative term by term.
* **Ascent**: the clean logits are detached; δ is the only input differentiated
  (``torch.autograd.grad``), so no parameter gradient is touched and DeepSpeed's gradient hooks
  never fire. The ascent objective is summed over positions (its per-token direction does not
  depend on the reduction, and a sum keeps fp16 gradients away from underflow). The step direction
  is the gradient normalized per token by its L∞ norm (``g / max|g|``) or L2 norm (``g / ‖g‖₂``),
  without the additive 1e-6 of the public code's normalizations: rows with a zero gradient stay zero,
  and the direction is exactly scale-invariant.
* **Projection** Π_ε, per token (over the hidden dimension): L∞ clamps every coordinate to
  [−ε, ε]; L2 rescales a token's δ to norm ε when its norm exceeds ε and leaves it unchanged
  otherwise (a true Euclidean projection; exact up to one float rounding of the rescaled norm).
  The initial noise is projected too, so ‖δ‖ ≤ ε holds for every K, including K = 0.
* **Final term**: by default (``adv_kl_targets="live"``) gradients flow through *both* the clean and
  the perturbed distributions, with δ held fixed: the literal g_θ = ∇_θ ℓ(y) + α ∇_θ ℓ(f(x;θ),
  f(x+δ;θ)) of ALUM's Algorithm 1 (line 8). The released code (ALUM's fairseq pretraining criterion,
  MT-DNN's ``SymKlCriterion``) holds each KL direction's target distribution fixed,
  KL(stop(p)‖q) + KL(stop(q)‖p): ``adv_kl_targets="detached"``. Same value, another gradient, and not
  a small difference: the extra terms are of the same order in δ as the detached gradient itself. On
  a tiny BERT (QA, 2026-11-29) the live gradient was 13.7 times the detached one's norm at ε = 1e-2
  without dropout (cosine 0.31), 7.1 times with dropout 0.1 (cosine 0.10), so α = 10 here is not the
  released code's α = 10. Other choices of that code differ from the paper's algorithm too, and are
  not reproduced: δ is added after the embeddings' LayerNorm (here before it, which at initialization
  amplifies δ about 37 times), and its step normalizes δ + η·g per token to norm 1 instead of
  projecting onto the ε-ball.
* **Weighting**: the term is α times the SymKL summed over the masked positions and divided as the
  MLM loss is, by the step's masked tokens over all micro-batches and ranks (the released criterion
  sums both and divides by the update's sample size alike), so accumulation weighs every masked
  token as one large batch would.

Defaults are ALUM's pretraining settings: α = 10, σ = 1e-5, η = 1e-3, ε = 1e-5 (L∞), K = 1. Since
η ≫ ε, one L∞ step lands most coordinates of δ on ±ε: in effect a sign-of-gradient perturbation
of size ε.

Precision. δ is kept in float32 and added to the embeddings in their own dtype; with bf16 weights a
coordinate of magnitude 0.02 has a spacing of 1.2e-4, so e + δ would round back to e for most
coordinates at ε = 1e-5. :attr:`AdversarialResult.delta_retained` measures the share that got
through; the toolkit's bf16 is autocast over fp32 weights, where it is 1. But every bf16 matrix
multiply rounds its input to 8 significant bits (a spacing of 7.8e-3 at 1, after the embeddings'
LayerNorm), and a δ of 1e-5 moves few of them across a rounding step: the clean and perturbed
passes then differ by rounding more than by δ. Measured on bert-small (N(0, 0.02²) embeddings, no
dropout, the same δ draws; ``benchmarks/README.md``, "ALUM step cost"), the symmetric KL at
ε = 1e-5 is 7.9e-8 in fp32, 2.0e-7 under fp16 autocast and 5.8e-6 under bf16 autocast (×73 the fp32
term: rounding noise); at ε = 1e-4 bf16's is ×2.4 fp32's, at 1e-3 ×1.10. :meth:`AdversarialConfig.
precision_caveat` says so in the run log under bf16 and fp8 with ε below 1e-3.

Cost: a step is the standard forward+backward, plus per ascent step one forward and a backward
to δ only (no weight gradients), plus one forward+backward for the final term: about (6 + 2K) / 3
standard steps, 2.7× for K = 1 (2.8× measured on bert-small on CPU,
``benchmarks/bench_adversarial.py``). The non-finite check costs one host synchronization.

Fine-tuning reuses :func:`adversarial_term` with any ``forward_fn`` from embeddings to logits.
Reentrant activation checkpointing does not support ``torch.autograd.grad``; use the non-reentrant
kind with this module.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterator, Literal, Mapping, get_args

import torch
import torch.nn.functional as F
from torch import nn

from biomed_lm.pretrain.config import PretrainConfigError
from biomed_lm.pretrain.layout import PaddedBatch, VarlenBatch
from biomed_lm.pretrain.modeling import PretrainingModel, PretrainingOutput
from biomed_lm.pretrain.trainer_state import VariantState

Norm = Literal["linf", "l2"]
NORMS: tuple[str, ...] = get_args(Norm)
KlTargets = Literal["live", "detached"]
KL_TARGETS: tuple[str, ...] = get_args(KlTargets)
Reduction = Literal["mean", "sum", "none"]


#: The ε from which bf16 autocast's term is within about 10% of fp32's (the module docstring's measurement).
BF16_EPSILON_FLOOR = 1e-3


@dataclass
class AdversarialConfig:
    """ALUM's hyper-parameters. Field names carry an ``adv`` prefix because they are parsed by one
    ``HfArgumentParser`` together with the other argument dataclasses. ``adversarial`` is the
    switch that the model wrapper reads; the functions below compute the term whenever called."""

    adversarial: bool = field(default=False, metadata={
        "help": "add ALUM's adversarial term (Liu et al. 2020) to the MLM loss"})
    adv_alpha: float = field(default=10.0, metadata={
        "help": "weight α of the symmetric-KL adversarial term (ALUM: 10 for pretraining, 1 for fine-tuning)",
        "min": 0})
    adv_sigma: float = field(default=1e-5, metadata={
        "help": "standard deviation σ of δ's Gaussian initialization", "min": 0})
    adv_step_size: float = field(default=1e-3, metadata={
        "help": "ascent step size η, applied to the per-token normalized gradient", "min": 0})
    adv_epsilon: float = field(default=1e-5, metadata={
        "help": "radius ε of the per-token ball δ is projected onto, in adv_norm (ALUM: 1e-5, L∞). Under bf16 "
                "a δ of 1e-5 is smaller than the matrix multiplies' rounding, which then dominates the term; "
                "about 1e-3 is above it (pretrain/adversarial.py)", "gt": 0})
    adv_steps: int = field(default=1, metadata={
        "help": "ascent steps K (0: the projected random perturbation only)", "min": 0})
    adv_norm: Norm = field(default="linf", metadata={
        "help": "per-token norm of the ball and of the gradient normalization: linf or l2. An L2 ball of "
                "radius ε is √hidden_size times smaller per coordinate than an L∞ ball of the same ε"})
    adv_kl_targets: KlTargets = field(default="live", metadata={
        "help": "the final term's gradient: live (through both distributions of the symmetric KL, ALUM's "
                "Algorithm 1 as written) or detached (each KL direction's target distribution held fixed, as "
                "ALUM's released pretraining criterion and MT-DNN's SymKlCriterion do: on a tiny BERT a gradient "
                "7 to 14 times smaller at the same α)"})

    def __post_init__(self) -> None:
        for name in ("adv_alpha", "adv_sigma", "adv_step_size"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise PretrainConfigError(f"{name} must be a finite number >= 0, got {value}")
        if not (math.isfinite(self.adv_epsilon) and self.adv_epsilon > 0):
            raise PretrainConfigError(f"adv_epsilon must be a finite number > 0, got {self.adv_epsilon}")
        if isinstance(self.adv_steps, bool) or not isinstance(self.adv_steps, int) or self.adv_steps < 0:
            raise PretrainConfigError(f"adv_steps must be an integer >= 0, got {self.adv_steps!r}")
        if self.adv_norm not in NORMS:
            raise PretrainConfigError(f"adv_norm must be one of {', '.join(NORMS)}, got {self.adv_norm!r}")
        if self.adv_kl_targets not in KL_TARGETS:
            raise PretrainConfigError(f"adv_kl_targets must be one of {', '.join(KL_TARGETS)}, "
                                      f"got {self.adv_kl_targets!r}")

    def precision_caveat(self, precision: str) -> str | None:
        """The run log's warning when ε is below bf16's rounding of the matrix multiplies' inputs (see
        the module docstring), or None."""
        if precision not in ("bf16", "fp8") or self.adv_epsilon >= BF16_EPSILON_FLOOR:
            return None
        return (f"ALUM's epsilon {self.adv_epsilon:g} under {precision}: the matrix multiplies round their bf16 "
                "inputs more coarsely than δ moves them, so the adversarial term is mostly rounding noise (on "
                "bert-small at 1e-5: symmetric KL x73 the fp32 term's, x1.10 at 1e-3); --adv-epsilon "
                f"{BF16_EPSILON_FLOOR:g} or --precision fp32 keep δ's effect")

    def describe(self) -> str:
        """ALUM's settings, for the run log."""
        return (f"adversarial training (ALUM) on: alpha {self.adv_alpha:g}, sigma {self.adv_sigma:g}, step size "
                f"{self.adv_step_size:g}, epsilon {self.adv_epsilon:g} ({self.adv_norm}), {self.adv_steps} ascent "
                f"step(s) a micro-batch, KL targets {self.adv_kl_targets}")


@dataclass(frozen=True)
class AdversarialResult:
    """The adversarial term of one micro-batch and what to log about it.

    ``loss_term`` is α·SymKL with its graph, to be added to the standard loss; when the term is
    not finite it is a graph-less zero, so the step falls back to the standard loss (``finite`` is
    False and the caller counts it). The other tensors are detached float scalars:
    ``symmetric_kl`` (the unweighted value, kept even when non-finite), ``delta_norm`` (the largest
    per-token norm of δ, ≤ ε) and ``delta_retained``, the share of δ that reached the model after
    ``embeds + δ`` was rounded to the embeddings' dtype: ⟨δ_applied, δ⟩ / ‖δ‖², 1 in float32 (and
    for δ = 0), near 0 when half precision rounds the perturbation away."""

    loss_term: torch.Tensor
    symmetric_kl: torch.Tensor
    delta_norm: torch.Tensor
    delta_retained: torch.Tensor
    finite: bool


def _compute_dtype(*dtypes: torch.dtype) -> torch.dtype:
    """At least float32: half-precision softmaxes and norms lose the small differences that ALUM's
    tiny perturbations produce."""
    result = torch.float32
    for dtype in dtypes:
        result = torch.promote_types(result, dtype)
    return result


def token_norm(x: torch.Tensor, norm: Norm) -> torch.Tensor:
    """Per-token norm over the last (hidden) dimension, keepdim, in at least float32."""
    x = x.to(_compute_dtype(x.dtype))
    if norm == "linf":
        return x.abs().amax(dim=-1, keepdim=True)
    if norm == "l2":
        return torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    raise ValueError(f"norm must be one of {', '.join(NORMS)}, got {norm!r}")


def symmetric_kl(logits_p: torch.Tensor, logits_q: torch.Tensor, reduction: Reduction = "mean", *,
                 detached_targets: bool = False) -> torch.Tensor:
    """KL(p‖q) + KL(q‖p) between the softmaxes of two logit tensors over their last dimension.

    Computed in at least float32 as Σ (p − q)(log p − log q): both factors of a summand have the
    same sign (exp is monotone), so every summand is ≥ 0, and swapping the arguments negates both
    factors, so the result is symmetric exactly, not just up to rounding. ``reduction``: "mean"
    over rows (every leading position; an empty input gives 0), "sum", or "none" (one value per
    row). Gradients flow into whichever arguments require them; with ``detached_targets`` only through
    the log-softmaxes, each direction's target distribution held fixed (the value is the same)."""
    if logits_p.shape != logits_q.shape:
        raise ValueError(f"logits shapes differ: {tuple(logits_p.shape)} vs {tuple(logits_q.shape)}")
    dtype = _compute_dtype(logits_p.dtype, logits_q.dtype)
    log_p = F.log_softmax(logits_p.to(dtype), dim=-1)
    log_q = F.log_softmax(logits_q.to(dtype), dim=-1)
    if detached_targets:  # KL(stop(p)‖q) + KL(stop(q)‖p): the same value, the log-softmaxes' gradient only
        p, q = log_p.detach().exp(), log_q.detach().exp()
        per_row = (p * (log_p.detach() - log_q) + q * (log_q.detach() - log_p)).sum(dim=-1)
    else:
        per_row = ((log_p.exp() - log_q.exp()) * (log_p - log_q)).sum(dim=-1)
    return _reduced(per_row, reduction)


def _reduced(per_row: torch.Tensor, reduction: Reduction) -> torch.Tensor:
    if reduction == "none":
        return per_row
    if reduction == "sum":
        return per_row.sum()
    if reduction == "mean":
        return per_row.sum() / max(per_row.numel(), 1)
    raise ValueError(f"reduction must be mean, sum or none, got {reduction!r}")


def project(delta: torch.Tensor, epsilon: float, norm: Norm) -> torch.Tensor:
    """The Euclidean projection of every token's δ (last dimension) onto its ε-ball.

    L∞: clamp each coordinate to [−ε, ε]. L2: rescale to norm ε when the norm exceeds ε, leave it
    unchanged otherwise. Points inside the ball are returned unchanged, so the projection is
    idempotent (for L2 up to the rounding of one rescale). Non-finite entries stay non-finite, so
    the caller's finiteness check sees them. Same dtype as ``delta``."""
    if not epsilon >= 0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon}")
    if norm == "linf":
        return delta.clamp(-epsilon, epsilon)
    if norm == "l2":
        # ε / 0 = inf is clamped to 1: a zero row stays zero.
        scale = (epsilon / token_norm(delta, "l2")).clamp(max=1.0)
        return (delta.to(scale.dtype) * scale).to(delta.dtype)
    raise ValueError(f"norm must be one of {', '.join(NORMS)}, got {norm!r}")


def ascent_direction(grad: torch.Tensor, norm: Norm) -> torch.Tensor:
    """The gradient normalized per token by its L∞ or L2 norm (so every token with a non-zero
    gradient takes a step of the same size η, whatever the loss scale or the token's influence);
    rows with a zero gradient give a zero direction. Returned in at least float32."""
    grad = grad.to(_compute_dtype(grad.dtype))
    scale = token_norm(grad, norm)
    return torch.where(scale > 0, grad / scale, torch.zeros_like(grad))


def adversarial_term(forward_fn: Callable[[torch.Tensor], torch.Tensor], embeds: torch.Tensor,
                     clean_logits: torch.Tensor, config: AdversarialConfig,
                     generator: torch.Generator | None = None,
                     noise: tuple[tuple[int, ...], Callable[[torch.Tensor], torch.Tensor]] | None = None,
                     denominator: torch.Tensor | None = None) -> AdversarialResult:
    """ALUM's term for any model written as ``forward_fn(embeddings) -> logits``.

    ``embeds`` are the clean embedding outputs (with their graph, so the final term also trains
    the embedding table through the perturbed pass); ``clean_logits`` are the clean pass's logits,
    row-aligned with ``forward_fn``'s output and carrying their graph (the final term
    differentiates through them too; detach them beforehand for a one-sided term). δ's noise
    comes from ``generator`` (which must live on ``embeds``' device) or, when None, from the global
    RNG, which the trainer seeds and checkpoints per rank. See the module docstring for the exact
    definitions. ``noise`` = (shape, to_layout) draws δ's noise in ``shape`` and maps it onto
    ``embeds``' layout (the unpadded pretraining layout draws it as if padded). The loss term is α times
    the SymKL summed over rows and divided by ``denominator`` (the step's share of masked tokens, as the MLM
    loss divides: :func:`pretrain.trainer.mlm_denominator`), or averaged over rows without one; the
    logged ``symmetric_kl`` is the rows' mean either way."""
    dtype = _compute_dtype(embeds.dtype)
    shape, to_layout = noise if noise is not None else (embeds.shape, lambda x: x)
    delta = to_layout(torch.randn(shape, generator=generator, device=embeds.device, dtype=dtype)) * config.adv_sigma
    delta = project(delta, config.adv_epsilon, config.adv_norm)
    clean_target = clean_logits.detach()
    base = embeds.detach()
    with torch.enable_grad():  # the ascent needs a graph even if the caller runs without one
        for _ in range(config.adv_steps):
            delta.requires_grad_(True)
            objective = symmetric_kl(clean_target, forward_fn(base + delta.to(base.dtype)), reduction="sum")
            (grad,) = torch.autograd.grad(objective, delta)
            step = config.adv_step_size * ascent_direction(grad, config.adv_norm)
            delta = project(delta.detach() + step, config.adv_epsilon, config.adv_norm)
    delta = delta.detach()

    perturbed = embeds + delta.to(embeds.dtype)
    kl_sum = symmetric_kl(clean_logits, forward_fn(perturbed), reduction="sum",
                          detached_targets=config.adv_kl_targets == "detached")
    rows = max(math.prod(clean_logits.shape[:-1]), 1)
    delta_norm = token_norm(delta, config.adv_norm).max()
    applied = perturbed.detach().to(dtype) - base.to(dtype)
    energy = (delta * delta).sum()
    delta_retained = torch.where(energy > 0, (applied * delta).sum() / energy, torch.ones_like(energy))
    finite = bool(torch.isfinite(kl_sum) & torch.isfinite(delta_norm))  # the one host synchronization
    weighted = kl_sum / (rows if denominator is None else denominator)
    loss_term = config.adv_alpha * weighted if finite else torch.zeros((), dtype=kl_sum.dtype, device=kl_sum.device)
    return AdversarialResult(loss_term=loss_term, symmetric_kl=kl_sum.detach() / rows, delta_norm=delta_norm,
                             delta_retained=delta_retained, finite=finite)


def adversarial_pretraining_loss(model: PretrainingModel, prepared: PaddedBatch | VarlenBatch,
                                 clean_logits: torch.Tensor, config: AdversarialConfig,
                                 generator: torch.Generator | None = None) -> AdversarialResult:
    """ALUM's term for BERT pretraining: δ on the word embeddings, SymKL on the masked positions.

    ``prepared`` is the micro-batch in ``model``'s layout (:meth:`PretrainingModel.prepare`);
    ``clean_logits`` are the clean MLM logits at its masked positions, in row-major order and with
    their graph, i.e. what ``model.mlm_head`` produced inside ``model``'s forward. The perturbed
    passes run in the model's own layout (unpadded or padded); δ's noise is drawn in the padded
    shape either way and gathered, so both layouts perturb every real token alike."""
    embeds = model.word_embeddings(prepared)
    noise_shape = (*prepared.padded_shape, embeds.shape[-1])

    def to_layout(noise: torch.Tensor) -> torch.Tensor:
        if noise.shape == embeds.shape:
            return noise
        real = noise.flatten(0, 1)[prepared.indices]  # the unpadded layout's real tokens, then bucket padding
        return torch.cat([real, real.new_zeros(embeds.shape[0] - real.shape[0], real.shape[1])])

    return adversarial_term(lambda inputs_embeds: model.masked_logits(prepared, inputs_embeds), embeds, clean_logits,
                            config, generator=generator, noise=(noise_shape, to_layout),
                            denominator=prepared.mlm_denominator)


@dataclass
class AdversarialState(VariantState):
    """ALUM's checkpointed counter, beside the trainer's own (:mod:`pretrain.trainer_state`)."""

    adversarial_fallbacks: int = 0  # micro-batches whose term was dropped as non-finite (the standard loss ran)


@dataclass(kw_only=True)  # keyword-only: stays valid if PretrainingOutput gains defaulted fields
class AdversarialPretrainingOutput(PretrainingOutput):
    """:class:`PretrainingOutput` whose ``loss`` includes the adversarial term, plus its statistics
    (detached scalars): ``adv_loss`` (the α·SymKL added, 0 when skipped or non-finite), ``adv_kl``
    (SymKL, 0 when not computed), ``adv_delta_norm`` and ``adv_delta_retained`` (see
    :class:`AdversarialResult`; 0 when not computed) and ``adv_nonfinite`` (1 when the term was
    dropped as non-finite: the trainer counts these)."""

    adv_loss: torch.Tensor
    adv_kl: torch.Tensor
    adv_delta_norm: torch.Tensor
    adv_delta_retained: torch.Tensor
    adv_nonfinite: torch.Tensor

    # What the trainer sums, counts and logs for the term (see PretrainingOutput): SymKL, averaged over
    # the step's finite micro-batches, and the micro-batches whose term was dropped as non-finite.
    EXTRA_TOTALS: ClassVar[tuple[str, ...]] = ("adv_kl", "adv_nonfinite")
    state_type: ClassVar[type[VariantState]] = AdversarialState

    def extra_totals(self) -> dict[str, torch.Tensor]:
        return {"adv_kl": self.adv_kl, "adv_nonfinite": self.adv_nonfinite}

    @classmethod
    def account_step(cls, totals: Mapping[str, float], state: AdversarialState) -> None:
        state.adversarial_fallbacks += int(totals["adv_nonfinite"])

    @classmethod
    def step_metrics(cls, totals: Mapping[str, float], micro_batches: int, nonfinite: bool,
                     state: AdversarialState) -> dict[str, Any]:
        finite_micro_batches = micro_batches - int(totals["adv_nonfinite"])
        return {"adv_symmetric_kl": None if nonfinite or finite_micro_batches <= 0
                else totals["adv_kl"] / finite_micro_batches,
                "adv_fallbacks": state.adversarial_fallbacks}


@contextlib.contextmanager
def _capture_outputs(module: nn.Module) -> Iterator[list[torch.Tensor]]:
    """Collect ``module``'s outputs (graph included) for the duration of the block."""
    outputs: list[torch.Tensor] = []
    handle = module.register_forward_hook(lambda _module, _args, output: outputs.append(output))
    try:
        yield outputs
    finally:
        handle.remove()


class AdversarialPretrainingModel(PretrainingModel):
    """:class:`PretrainingModel` plus ALUM's term, inside the one forward the trainer calls
    (``out = engine(**batch); engine.backward(out.loss)``), so DeepSpeed's gradient accumulation,
    mixed precision and gradient reduction apply unchanged. Same parameters and state-dict keys as
    the parent (checkpoints and exports are interchangeable).

    The clean masked logits are taken from the parent's own forward (its MLM head's output,
    captured with a forward hook): no second clean pass, and the clean side shares the standard
    loss's dropout masks and graph. The term is added only in training mode, when ``adversarial``
    is on and the batch has masked positions; evaluation returns the standard loss."""

    output_type = AdversarialPretrainingOutput

    def __init__(self, hf_model: nn.Module, train_pair: bool = True, *, adversarial: AdversarialConfig, **layout):
        # The clean logits are the MLM head module's output, which the fused losses never produce.
        layout["mlm_loss"] = "dense"
        super().__init__(hf_model, train_pair=train_pair, **layout)  # layout: attention, pad_to_multiple_of
        self.adversarial = adversarial

    def forward(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                next_sentence_label: torch.Tensor | None = None, *,
                prepared: PaddedBatch | VarlenBatch | None = None) -> AdversarialPretrainingOutput:
        if prepared is None:
            prepared = self.prepare(input_ids, attention_mask, token_type_ids, labels)
        with _capture_outputs(self.mlm_head) as head_outputs:
            out = self.compute_losses(prepared, next_sentence_label)
        standard = {f.name: getattr(out, f.name) for f in dataclasses.fields(PretrainingOutput)}
        zero = torch.zeros((), dtype=torch.float32, device=out.loss.device)
        masked = prepared.masked_positions.numel()  # the layout's shape, known on the host
        if not (self.training and self.adversarial.adversarial and masked):
            return AdversarialPretrainingOutput(**standard, adv_loss=zero, adv_kl=zero, adv_delta_norm=zero,
                                                adv_delta_retained=zero, adv_nonfinite=zero.long())
        if len(head_outputs) != 1 or head_outputs[0].shape[0] != masked:
            raise RuntimeError(
                "AdversarialPretrainingModel expects PretrainingModel.forward to call its MLM head once, on "
                f"the {masked} masked positions; it saw {[tuple(o.shape) for o in head_outputs]}")
        result = adversarial_pretraining_loss(self, prepared, head_outputs[0], self.adversarial)
        standard["loss"] = out.loss + result.loss_term
        return AdversarialPretrainingOutput(
            **standard, adv_loss=result.loss_term.detach().float(),
            adv_kl=result.symmetric_kl.float() if result.finite else zero,  # a dropped term is not averaged
            adv_delta_norm=result.delta_norm.float(), adv_delta_retained=result.delta_retained.float(),
            adv_nonfinite=torch.tensor(int(not result.finite), device=out.loss.device))
