"""PyTorch's own flash attention on the varlen layout, with BERT's attention dropout.

``torch.nn.attention.varlen.varlen_attn`` runs PyTorch's built-in flash attention on sequences laid
end to end (``cu_seqlens``), but takes no dropout: it calls ``aten._flash_attention_forward`` with
``dropout_p=0``. The same kernel applies dropout inside the attention matrix (philox random numbers,
drawn from the CUDA generator and replayed by its backward from the ``rng_state`` the forward
returns; safe under CUDA graph capture). This module calls the pair with the model's dropout as a
custom operator: opaque to ``torch.compile`` (whose graphs keep it whole, inductor around it), with
its shapes taken from the aten operators' own meta functions, so they stay right for the installed
PyTorch. So BERT's recipe (attention dropout 0.1) trains on flash attention over real tokens only
without the ``flash-attn`` package. CUDA, fp16/bf16 (the kernel's own limits).

Importing the module registers the operators (``torch.ops.biomed_lm``); :mod:`pretrain.attention`
imports it when it checks the ``varlen`` kernel can run, before any region is compiled.
"""

from __future__ import annotations

import torch
from torch.nn.attention.varlen import varlen_attn

if not hasattr(torch.ops.aten, "_flash_attention_forward"):  # makes the module "not installed" for the kernel
    raise ImportError("this PyTorch has no aten._flash_attention_forward")


def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seqlens: torch.Tensor,
              max_length: int, dropout_p: float, scale: float) -> torch.Tensor:
    """Flash attention within each sequence of ``(total_tokens, heads, head_dim)`` inputs whose head
    dimension is contiguous (views of one packed projection are taken as they are, strides and all);
    ``cu_seqlens`` (int32) marks where each sequence starts. No dropout: PyTorch's public
    ``varlen_attn``; with it, :func:`flash_varlen_dropout`."""
    if not dropout_p:
        return varlen_attn(query, key, value, cu_seqlens, cu_seqlens, max_length, max_length, scale=scale)
    out, _, _, _ = flash_varlen_dropout(query, key, value, cu_seqlens, max_length, dropout_p, scale)
    return out


@torch.library.custom_op("biomed_lm::flash_varlen_dropout", mutates_args=())
def flash_varlen_dropout(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seqlens: torch.Tensor,
                         max_length: int, dropout_p: float, scale: float
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The attention output, its log-sum-exp (what the backward needs) and the dropout's philox state
    as the kernel returns it (``rng_state``, and the offset output that some PyTorch releases fill and
    others leave unused): the backward gets both back, as SDPA's own flash path passes them."""
    return _forward(query, key, value, cu_seqlens, max_length, dropout_p, scale)


def _forward(query, key, value, cu_seqlens, max_length, dropout_p, scale):
    """The aten call, on real tensors and (its meta function) on fake ones alike."""
    out, logsumexp, rng_state, philox_offset, _ = torch.ops.aten._flash_attention_forward(
        query, key, value, cu_seqlens, cu_seqlens, max_length, max_length, dropout_p, False, False, scale=scale)
    return out, logsumexp, rng_state, philox_offset


@torch.library.custom_op("biomed_lm::flash_varlen_dropout_backward", mutates_args=())
def flash_varlen_dropout_backward(grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                  out: torch.Tensor, logsumexp: torch.Tensor, cu_seqlens: torch.Tensor,
                                  max_length: int, dropout_p: float, scale: float, rng_state: torch.Tensor,
                                  philox_offset: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of the query, key and value, the forward's dropout replayed from its philox state."""
    return _backward(grad_out, query, key, value, out, logsumexp, cu_seqlens, max_length, dropout_p, scale,
                     rng_state, philox_offset)


def _backward(grad_out, query, key, value, out, logsumexp, cu_seqlens, max_length, dropout_p, scale, rng_state,
              philox_offset):
    """The aten call, on real tensors and (its meta function) on fake ones alike. ``philox_offset`` is
    the forward's own fourth output, not a stand-in: torch's ``varlen_attn`` passes an empty tensor
    there, which is safe only because it never drops anything."""
    dq, dk, dv = torch.ops.aten._flash_attention_backward(
        grad_out.contiguous(), query, key, value, out, logsumexp, cu_seqlens, cu_seqlens, max_length, max_length,
        dropout_p, False, rng_state, philox_offset, scale=scale)
    return dq, dk, dv


def _setup_context(ctx, inputs, output) -> None:
    query, key, value, cu_seqlens, max_length, dropout_p, scale = inputs
    out, logsumexp, rng_state, philox_offset = output
    ctx.save_for_backward(query, key, value, cu_seqlens, out, logsumexp, rng_state, philox_offset)
    ctx.max_length, ctx.dropout_p, ctx.scale = max_length, dropout_p, scale


def _flash_varlen_dropout_autograd(ctx, grad_out, grad_logsumexp, grad_rng_state, grad_philox_offset):
    query, key, value, cu_seqlens, out, logsumexp, rng_state, philox_offset = ctx.saved_tensors
    dq, dk, dv = flash_varlen_dropout_backward(grad_out, query, key, value, out, logsumexp, cu_seqlens,
                                               ctx.max_length, ctx.dropout_p, ctx.scale, rng_state, philox_offset)
    return dq, dk, dv, None, None, None, None


flash_varlen_dropout.register_fake(_forward)
flash_varlen_dropout_backward.register_fake(_backward)
flash_varlen_dropout.register_autograd(_flash_varlen_dropout_autograd, setup_context=_setup_context)
