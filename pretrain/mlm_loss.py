"""The MLM head and its cross-entropy on the masked positions, without the whole [masked × vocab] logits.

The head's last layer projects onto the vocabulary (30k rows for BERT's); with thousands of masked
positions per micro-batch its fp32 logits, their softmax and their gradient are the largest
tensors of the step. :func:`masked_lm_loss` runs the head's transform (dense, activation,
LayerNorm) as usual and fuses the projection with the loss:

* ``dense``: the reference. ``head(hidden)`` in full, ``F.cross_entropy`` on its fp32 cast.
* ``chunked``: :class:`_ChunkedLinearCrossEntropy`, a ``torch.autograd.Function`` that walks the
  rows in chunks. Per chunk: logits in the compute dtype, fp32 log-softmax loss, argmax hits, and
  right away the gradient of the chunk's loss with respect to the chunk's features, the projection
  weight and the bias (liger-kernel's fused linear cross entropy does the same). Only those
  gradients are kept, so the backward pass scales them by the incoming gradient. Extra memory is
  O(chunk × vocab) for the logits plus the gradients' own size (features, and an fp32 weight-sized
  accumulator), instead of O(masked × vocab).
* ``liger``: liger-kernel's Triton ``liger_fused_linear_cross_entropy`` (CUDA only, imported
  lazily). Liger returns no argmax, so the correct count comes from a separate no-grad chunked
  pass: one more forward projection, about a third of the projection's fused forward+backward work.
* ``auto``: see :func:`resolve_implementation`.

Everything returns sums (loss, hits, counted rows), never means: the trainer divides by the masked
count summed over micro-batches and ranks. Rows whose target is ``ignore_index`` (the caller pads the
masked rows up to a bucketed size so shapes stay bounded) add nothing to the loss, the gradients or
the counts, and nothing in here waits on the device (no ``.item()``, no data-dependent shapes), so it
traces under ``torch.compile(fullgraph=True)`` once the implementation is resolved to ``dense`` or
``chunked``. The chunk loop is unrolled at trace time: a new masked-row count recompiles (hence the
caller's buckets). Padding rows must hold finite hidden states (any real row, or zeros): as with
``F.cross_entropy``, a NaN feature poisons the weight gradient even where the target is ignored.

Why ``auto`` is ``dense`` on CPU, measured (this project's 2-core CPU box, torch 2.13 CPU, fp32,
BERT-base head H=768, V=30522, default chunk 1024 rows, forward+backward of transform, projection
and loss, median of 7 interleaved runs; the box was shared, load average 6-7, so the absolute figures
are noisy: over four runs, dense was faster in 11 of the 12 comparisons at 128-512 rows, and the
two were level within the noise at 1024-2048)::

    masked rows   dense     chunked
    128           734 ms    901 ms
    256           1095 ms   1174 ms
    512           1627 ms   1770 ms
    1024          3046 ms   3051 ms

The matrix products are the same; chunked adds passes over weight-sized tensors (its fp32 gradient
accumulator, the backward's scaling by the incoming gradient) that a memory-bound CPU feels and a
GPU does not. On CPU the logits' memory is rarely what limits a run, so the faster one is taken.
"""

from __future__ import annotations

import importlib.util
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

IGNORE_INDEX = -100
IMPLEMENTATIONS = ("auto", "dense", "chunked", "liger")
#: Rows per chunk: a 1024 × 30522 fp32 chunk of logits is 125 MB (their gradient reuses the buffer),
#: against 2.4 GB for a 20k-row micro-batch's masked positions done whole (and as much for the gradient).
DEFAULT_CHUNK_ROWS = 1024


class MLMLossOutput(NamedTuple):
    """Sums over the rows whose target is not ``ignore_index``."""

    loss_sum: torch.Tensor  # fp32 scalar: summed cross-entropy
    correct: torch.Tensor  # long scalar: rows whose argmax is the target
    count: torch.Tensor  # long scalar: rows counted


def split_head(head: nn.Module) -> tuple[Callable[[torch.Tensor], torch.Tensor], torch.Tensor, torch.Tensor | None]:
    """The head as ``(transform, weight, bias)`` with ``head(x) == F.linear(transform(x), weight, bias)``.

    Takes the three families' MLM heads: ``BertLMPredictionHead`` (or the ``BertOnlyMLMHead`` /
    ``BertPreTrainingHeads`` around it), ``AlbertMLMHead`` and ``RobertaLMHead``. The bias is
    ``head.decoder.bias``, the one ``forward`` adds; in a built model transformers ties it to
    ``head.bias`` (the same Parameter), and ``weight`` is the word embeddings' Parameter, so
    gradients computed from these land where ``head(x)``'s would."""
    from transformers.models.albert.modeling_albert import AlbertMLMHead
    from transformers.models.bert.modeling_bert import BertLMPredictionHead
    # Each class imported from its own module: dynamo traces this function inside the compiled heads,
    # and cannot import through a package that is a transformers _LazyModule (``models.roberta``).
    from transformers.models.roberta.modeling_roberta import RobertaLMHead, gelu

    if isinstance(getattr(head, "predictions", None), BertLMPredictionHead):
        head = head.predictions
    if isinstance(head, BertLMPredictionHead):
        transform = head.transform
    elif isinstance(head, AlbertMLMHead):
        def transform(x: torch.Tensor) -> torch.Tensor:
            return head.LayerNorm(head.activation(head.dense(x)))
    elif isinstance(head, RobertaLMHead):
        def transform(x: torch.Tensor) -> torch.Tensor:  # RobertaLMHead.forward's own gelu, not config.hidden_act
            return head.layer_norm(gelu(head.dense(x)))
    else:
        raise TypeError(f"split_head does not know {type(head).__name__}: it takes BertLMPredictionHead "
                        "(or a module whose .predictions is one), AlbertMLMHead and RobertaLMHead")
    return transform, head.decoder.weight, head.decoder.bias


def liger_available() -> bool:
    """Whether liger-kernel can be imported (it needs CUDA and Triton to run)."""
    return importlib.util.find_spec("liger_kernel") is not None


def resolve_implementation(requested: str, device: torch.device | str,
                           compiled: bool = False) -> tuple[str, str | None]:
    """The implementation ``requested`` runs as on ``device``, and why a faster one was passed over
    (None when nothing was). ``auto``: ``dense`` inside a ``torch.compile`` region
    (``compiled``), where inductor fuses the cast and the log-softmax into the projection's consumers
    and the shapes stay symbolic; liger there breaks the graph at its ``.item()`` and, on an H200
    (torch 2.11, liger 0.8.5), ended in an illegal memory access; ``chunked`` unrolls per masked-row
    count. Eager on CUDA: liger when installed, else ``chunked``; ``dense`` on CPU, where it is the
    faster of the two (timings in the module docstring) and liger's kernels do not run. An explicit
    name is taken as it is; ``liger`` off CUDA or without the package is a ValueError naming the reason."""
    if requested not in IMPLEMENTATIONS:
        raise ValueError(f"MLM loss implementation {requested!r}: expected one of {', '.join(IMPLEMENTATIONS)}")
    on_cuda = torch.device(device).type == "cuda"
    if requested == "liger":
        if not on_cuda:
            raise ValueError(f"MLM loss implementation 'liger' runs Triton kernels on CUDA, not on {device}")
        if not liger_available():
            raise ValueError("MLM loss implementation 'liger' needs liger-kernel: pip install liger-kernel")
    if requested != "auto":
        return requested, None
    if not on_cuda or compiled:
        return "dense", None
    if liger_available():
        return "liger", None
    return "chunked", "liger-kernel is not installed (pip install liger-kernel): its fused Triton kernel is faster"


def masked_lm_loss(hidden: torch.Tensor, head: nn.Module, targets: torch.Tensor, *, implementation: str = "auto",
                   ignore_index: int = IGNORE_INDEX, chunk_size: int = DEFAULT_CHUNK_ROWS) -> MLMLossOutput:
    """The MLM head's summed cross-entropy, argmax hits and counted rows on ``hidden`` (M, H): the
    masked positions' last hidden states, with ``targets`` (M,) their token ids or ``ignore_index``
    on padding rows. Under ``torch.compile`` pass a resolved name (``dense``/``chunked``):
    ``auto`` looks for liger-kernel's package, which the tracer does not follow."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    name, _ = resolve_implementation(implementation, hidden.device)
    valid = targets != ignore_index
    count = valid.sum()
    if name == "dense":
        logits = head(hidden).float()
        loss_sum = F.cross_entropy(logits, targets, ignore_index=ignore_index, reduction="sum")
        correct = ((logits.argmax(-1) == targets) & valid).sum()
        return MLMLossOutput(loss_sum, correct, count)
    transform, weight, bias = split_head(head)
    features = transform(hidden)
    compute_dtype = _compute_dtype(features)
    if name == "liger":
        loss_sum, correct = _liger_loss(features, weight, bias, targets, ignore_index, chunk_size, compute_dtype)
    elif not _wants_grad(features, weight, bias):
        loss_sum, correct = _chunked_loss_without_grad(features, weight, bias, targets, ignore_index, chunk_size,
                                                       compute_dtype)
    else:
        loss_sum, correct = _ChunkedLinearCrossEntropy.apply(
            features, weight, bias, targets, ignore_index, chunk_size, compute_dtype)
    return MLMLossOutput(loss_sum, correct, count)


def _wants_grad(*tensors: torch.Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _compute_dtype(features: torch.Tensor) -> torch.dtype:
    """The projection's dtype: autocast's when it is on (what ``head(x)`` would run in), else the
    features'. The fused paths cast explicitly, so they agree with ``dense`` under autocast."""
    device_type = features.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return features.dtype


def _liger_loss(features: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
                ignore_index: int, chunk_size: int, compute_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    # Liger's Function does not go through autocast: cast as F.linear under autocast would.
    cast_features, cast_weight = features.to(compute_dtype), weight.to(compute_dtype)
    cast_bias = None if bias is None else bias.to(compute_dtype)
    loss_sum = liger_fused_linear_cross_entropy(cast_features, cast_weight, targets, cast_bias,
                                                ignore_index=ignore_index, reduction="sum")
    with torch.no_grad():  # liger gives no argmax: one more projection, chunked, for the hits
        correct = _count_correct(cast_features, cast_weight, cast_bias, targets, ignore_index, chunk_size)
    return loss_sum.float(), correct


def _count_correct(features: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
                   ignore_index: int, chunk_size: int) -> torch.Tensor:
    """Rows whose argmax is the target, one chunk of logits at a time."""
    correct = torch.zeros((), dtype=torch.long, device=features.device)
    for start in range(0, features.shape[0], chunk_size):
        logits = F.linear(features[start:start + chunk_size], weight, bias)
        chunk_targets = targets[start:start + chunk_size]
        correct = correct + ((logits.argmax(-1) == chunk_targets) & (chunk_targets != ignore_index)).sum()
    return correct


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """``sum CE(F.linear(features, weight, bias), targets)`` and its argmax hits, the gradients
    computed chunk by chunk in the forward pass (see the module docstring)."""

    @staticmethod
    def forward(ctx, features: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
                ignore_index: int, chunk_size: int, compute_dtype: torch.dtype):
        cast_weight = weight.to(compute_dtype)
        cast_bias = None if bias is None else bias.to(compute_dtype)
        loss_sum = torch.zeros((), dtype=torch.float32, device=features.device)
        correct = torch.zeros((), dtype=torch.long, device=features.device)
        grad_weight = grad_bias = None  # fp32 sums over the chunks (bf16 sums would drop the small ones)
        grad_feature_chunks = []
        for start in range(0, features.shape[0], chunk_size):
            chunk = features[start:start + chunk_size].to(compute_dtype)
            chunk_loss, chunk_correct, grad_logits = _chunk_loss_and_grad(
                chunk, cast_weight, cast_bias, targets[start:start + chunk_size], ignore_index)
            loss_sum = loss_sum + chunk_loss
            correct = correct + chunk_correct
            cast_grad_logits = grad_logits.to(compute_dtype)
            grad_feature_chunks.append((cast_grad_logits @ cast_weight).to(features.dtype))
            grad_weight = _accumulate(grad_weight, (cast_grad_logits.t() @ chunk).float())
            grad_bias = None if bias is None else _accumulate(grad_bias, grad_logits.sum(0))
        if not grad_feature_chunks:  # no rows: zero gradients, every parameter still in the graph
            grad_weight, grad_bias = torch.zeros_like(weight), None if bias is None else torch.zeros_like(bias)
        grad_features = torch.cat(grad_feature_chunks) if grad_feature_chunks else torch.zeros_like(features)
        ctx.save_for_backward(grad_features, grad_weight.to(weight.dtype),
                              None if grad_bias is None else grad_bias.to(bias.dtype))
        ctx.mark_non_differentiable(correct)
        return loss_sum, correct

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor, _grad_correct: torch.Tensor | None):
        grad_features, grad_weight, grad_bias = ctx.saved_tensors
        scaled_bias = None if grad_bias is None else grad_bias * grad_loss.to(grad_bias.dtype)
        return (grad_features * grad_loss.to(grad_features.dtype), grad_weight * grad_loss.to(grad_weight.dtype),
                scaled_bias, None, None, None, None)


def _accumulate(total: torch.Tensor | None, term: torch.Tensor) -> torch.Tensor:
    return term if total is None else total + term  # the first term as it is: no zero-filled buffer to add to


def _chunked_loss_without_grad(features: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                               targets: torch.Tensor, ignore_index: int, chunk_size: int,
                               compute_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunked loss and hits where no gradient is wanted (evaluation): the autograd Function
    would compute and keep weight-sized gradients for nothing."""
    cast_weight = weight.to(compute_dtype)
    cast_bias = None if bias is None else bias.to(compute_dtype)
    loss_sum = torch.zeros((), dtype=torch.float32, device=features.device)
    correct = torch.zeros((), dtype=torch.long, device=features.device)
    for start in range(0, features.shape[0], chunk_size):
        chunk_loss, chunk_correct, _, _ = _chunk_loss(features[start:start + chunk_size].to(compute_dtype),
                                                      cast_weight, cast_bias, targets[start:start + chunk_size],
                                                      ignore_index)
        loss_sum, correct = loss_sum + chunk_loss, correct + chunk_correct
    return loss_sum, correct


def _chunk_loss(features: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
                ignore_index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One chunk's summed loss and argmax hits, with its fp32 logits and their log-normalizer."""
    logits = F.linear(features, weight, bias).float()
    valid = targets != ignore_index
    safe_targets = torch.where(valid, targets, 0).unsqueeze(1)  # any real id: the row is masked out
    log_normalizer = torch.logsumexp(logits, dim=-1, keepdim=True)
    row_losses = (log_normalizer - logits.gather(1, safe_targets)).squeeze(1)
    loss = torch.where(valid, row_losses, 0.0).sum()
    correct = ((logits.argmax(-1) == targets) & valid).sum()
    return loss, correct, logits, log_normalizer


def _chunk_loss_and_grad(features: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                         targets: torch.Tensor, ignore_index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One chunk's summed loss, argmax hits, and the fp32 gradient of that loss with respect to its
    logits (softmax minus the target's one-hot; zero on ignored rows)."""
    loss, correct, logits, log_normalizer = _chunk_loss(features, weight, bias, targets, ignore_index)
    valid = targets != ignore_index
    safe_targets = torch.where(valid, targets, 0).unsqueeze(1)
    # In place from here: the chunk's logits become their gradient (one chunk × vocab fp32 buffer).
    grad_logits = logits.sub_(log_normalizer).exp_()
    grad_logits.scatter_add_(1, safe_targets, torch.full(safe_targets.shape, -1.0, device=logits.device))
    return loss, correct, grad_logits.masked_fill_(~valid.unsqueeze(1), 0.0)
