"""Attention over the unpadded (varlen) layout: every kernel, and the choice among them.

The encoder (:mod:`pretrain.unpadded`) hands each layer's queries, keys and values as
``(total_tokens, heads, head_dim)`` tensors holding only real tokens, the micro-batch's sequences
one after another, with ``cu_seqlens`` marking where each starts. A kernel returns the attention
output in the same layout; attention never crosses a sequence boundary. One function per kernel,
one table (:data:`KERNELS`) saying what each needs, and :func:`choose_kernel` picking the fastest
that applies — no branching on kernel names anywhere else.

``hf_sdpa`` and ``hf_eager`` are not varlen kernels: they name transformers' own padded forward,
kept as the reference the equivalence tests and benchmarks compare against.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable, get_args

import torch
import torch.nn.functional as F

from biomed_lm.pretrain.config import AttentionImplementation, PretrainConfigError

PADDED = ("hf_sdpa", "hf_eager")


@dataclass(frozen=True)
class Sequences:
    """Where the sequences of a varlen batch lie: ``cu_seqlens`` (int32, ``n + 1`` offsets), the
    same offsets as Python ints (kernels that loop need them without a device sync each layer), the
    longest length, and what the other kernels index with, built with the offsets on the host
    (:meth:`from_offsets`) so no kernel derives a shape from device data: each token's sequence
    number (FlexAttention's document mask) and its cell in the (sequences × longest length) grid the
    padded kernel attends on, with the grid's filled cells."""

    cu_seqlens: torch.Tensor
    offsets: tuple[int, ...]
    max_length: int
    document_ids: torch.Tensor
    cells: torch.Tensor
    filled: torch.Tensor

    @classmethod
    def from_offsets(cls, offsets: list[int] | tuple[int, ...], device: torch.device | str = "cpu") -> "Sequences":
        offsets = tuple(int(o) for o in offsets)
        lengths = torch.tensor([b - a for a, b in zip(offsets[:-1], offsets[1:])], dtype=torch.long)
        longest = int(lengths.max()) if lengths.numel() else 0
        document_ids = torch.repeat_interleave(torch.arange(lengths.numel()), lengths)
        starts = torch.tensor(offsets[:-1], dtype=torch.long)
        cells = document_ids * longest + torch.arange(offsets[-1]) - starts[document_ids]
        filled = torch.arange(longest) < lengths[:, None]
        return cls(torch.tensor(offsets, dtype=torch.int32), offsets, longest, document_ids, cells,
                   filled).moved(lambda t: t.to(device))

    def moved(self, move: Callable[[torch.Tensor], torch.Tensor]) -> "Sequences":
        """The same sequences with ``move`` applied to each tensor (to a device, to pinned memory)."""
        return Sequences(move(self.cu_seqlens), self.offsets, self.max_length, move(self.document_ids),
                         move(self.cells), move(self.filled))

    @property
    def lengths(self) -> tuple[int, ...]:
        return tuple(b - a for a, b in zip(self.offsets[:-1], self.offsets[1:]))

    @functools.cached_property
    def length_groups(self) -> tuple[list[tuple[int, int, torch.Tensor | None]], torch.Tensor | None]:
        """Sequences grouped by length, for batched per-length attention: (length, count, token
        indices or None for a lone sequence read by slicing) per group, and the permutation that puts
        the groups' outputs back in token order (None when the order is already the tokens')."""
        by_length: dict[int, list[int]] = {}
        for start, end in zip(self.offsets[:-1], self.offsets[1:]):
            by_length.setdefault(end - start, []).append(start)
        device = self.cu_seqlens.device
        groups, order = [], []
        for length, starts in by_length.items():
            index = (torch.tensor(starts, device=device)[:, None] + torch.arange(length, device=device)).flatten()
            groups.append((length, len(starts), index))
            order.append(index)
        permutation = torch.cat(order)
        if torch.equal(permutation, torch.arange(permutation.numel(), device=device)):
            return groups, None
        return groups, torch.empty_like(permutation).scatter_(0, permutation, torch.arange(permutation.numel(),
                                                                                              device=device))


class _GatherDistinctRows(torch.autograd.Function):
    """``source.index_select(0, index)`` for an ``index`` with no repeated row, whose backward writes
    the gradient's rows back with ``index_copy`` into zeros. ``index_select``'s own backward is an
    ``index_add`` (it must sum rows read twice), which runs as an atomic-add kernel in bf16: 4.1% of
    an H200 BERT-base step, one per layer (benchmarks/README.md). MosaicBERT's ``IndexFirstAxis``."""

    @staticmethod
    def forward(ctx, source: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(index)
        ctx.source_rows = source.shape[0]
        return source.index_select(0, index)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (index,) = ctx.saved_tensors
        return grad.new_zeros(ctx.source_rows, *grad.shape[1:]).index_copy(0, index, grad), None


def gather_rows(source: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``source``'s rows at ``index`` (whose entries are distinct: a token's cell, a masked position,
    a permutation), with a backward that copies instead of accumulating."""
    return _GatherDistinctRows.apply(source, index)


Kernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Sequences, float, float], torch.Tensor]


def sdpa_loop(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seqs: Sequences, dropout_p: float,
              scale: float) -> torch.Tensor:
    """PyTorch's SDPA over the sequences, one batched call per distinct length (BERT's instances are
    mostly of the maximum length, so a handful of calls per layer): every device, any dtype,
    attention dropout; the CPU's fastest (its SDPA kernels take no varlen input)."""
    groups, inverse = seqs.length_groups
    outputs = []
    for length, count, index in groups:
        q_g, k_g, v_g = (t.index_select(0, index).view(count, length, *t.shape[1:]).transpose(1, 2)
                         for t in (q, k, v))
        out = F.scaled_dot_product_attention(q_g, k_g, v_g, dropout_p=dropout_p, scale=scale)
        outputs.append(out.transpose(1, 2).reshape(count * length, *q.shape[1:]))
    out = torch.cat(outputs)
    return out if inverse is None else gather_rows(out, inverse)


def sdpa_padded(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seqs: Sequences, dropout_p: float,
                scale: float) -> torch.Tensor:
    """SDPA on the sequences re-padded to the longest, with a key-padding mask: attention as
    transformers computes it (on CUDA, PyTorch's memory-efficient kernel, attention dropout
    included), the rest of the layer unpadded. MosaicBERT's fallback where no varlen kernel applies;
    on an H200 with BERT's dropout it beats both jagged tensors and per-length calls (benchmarks/README.md)."""
    cells, filled = seqs.cells, seqs.filled
    rows, width = filled.shape

    def pad(t: torch.Tensor) -> torch.Tensor:
        grid = t.new_zeros(rows * width, *t.shape[1:]).index_copy(0, cells, t)
        return grid.view(rows, width, *t.shape[1:]).transpose(1, 2)

    out = F.scaled_dot_product_attention(pad(q), pad(k), pad(v), attn_mask=filled[:, None, None, :],
                                         dropout_p=dropout_p, scale=scale)
    return gather_rows(out.transpose(1, 2).reshape(rows * width, *q.shape[1:]), cells)


def sdpa_nested(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seqs: Sequences, dropout_p: float,
                scale: float) -> torch.Tensor:
    """SDPA on nested (jagged) tensors: on CUDA PyTorch dispatches it to its varlen flash /
    memory-efficient kernels, attention dropout included; on CPU it is a slow reference."""
    offsets = seqs.cu_seqlens.long()

    def nested(t: torch.Tensor) -> torch.Tensor:  # jagged values must be contiguous (q, k, v are views of one)
        jagged = torch.nested.nested_tensor_from_jagged(t.contiguous(), offsets=offsets, max_seqlen=seqs.max_length)
        return jagged.transpose(1, 2)

    out = F.scaled_dot_product_attention(nested(q), nested(k), nested(v), dropout_p=dropout_p, scale=scale)
    return out.transpose(1, 2).values()


def varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seqs: Sequences, dropout_p: float,
           scale: float) -> torch.Tensor:
    """PyTorch's built-in flash attention on the varlen layout (CUDA, fp16/bf16), with attention dropout
    (:mod:`pretrain.flash_varlen`: ``varlen_attn`` takes none, so with dropout the same kernels are
    called directly)."""
    from biomed_lm.pretrain.flash_varlen import attention  # imported by why_not before any compiling

    # q, k and v are views of one projection (unpadded.project_qkv): the flash kernels take each tensor's
    # row and head strides (only the head dimension must be contiguous), so no copy is made of them here.
    # Copying them cost a read and a write of the projection's output in every layer (run C's profile put
    # these copies and their gradients' concatenation at 2.6% of an H200 step at 128).
    return attention(q, k, v, seqs.cu_seqlens, seqs.max_length, dropout_p, scale)


def flash_attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seqs: Sequences, dropout_p: float,
               scale: float) -> torch.Tensor:
    """The ``flash-attn`` package's varlen kernel (CUDA, fp16/bf16, attention dropout)."""
    from flash_attn import flash_attn_varlen_func

    return flash_attn_varlen_func(q, k, v, seqs.cu_seqlens, seqs.cu_seqlens, seqs.max_length, seqs.max_length,
                                  dropout_p=dropout_p, softmax_scale=scale)


def flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seqs: Sequences, dropout_p: float,
         scale: float) -> torch.Tensor:
    """FlexAttention over the whole micro-batch as one row with a document mask (block-sparse:
    blocks between sequences are skipped). Fast compiled on CUDA; no dropout."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if dropout_p:
        raise ValueError("FlexAttention applies no attention dropout")
    documents = seqs.document_ids
    total = q.shape[0]

    def same_document(batch, head, q_index, kv_index):
        return documents[q_index] == documents[kv_index]

    # Compiled here on CUDA outside a compiled region; inside one both are traced into its graph (there
    # create_block_mask's ``_compile`` flag warns, which breaks the graph); on CPU unfused (the full
    # score matrix): fine for CPU tests only.
    compiled = q.device.type == "cuda" and not torch.compiler.is_compiling()
    mask = create_block_mask(same_document, None, None, total, total, device=q.device, _compile=compiled)
    attention = _compiled_flex_attention() if compiled else flex_attention
    out = attention(*(t.transpose(0, 1).unsqueeze(0) for t in (q, k, v)), block_mask=mask, scale=scale)
    return out.squeeze(0).transpose(0, 1)


@functools.lru_cache(maxsize=1)
def _compiled_flex_attention():
    """FlexAttention is a fused kernel only when compiled; one compiled function, made on first use."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=True)


@dataclass(frozen=True)
class HeadSizes:
    """The head sizes (hidden_size / num_attention_heads) a kernel takes."""

    multiple_of: int = 1
    at_least: int = 1
    at_most: int | None = None

    def take(self, head_size: int) -> bool:
        return head_size % self.multiple_of == 0 and head_size >= self.at_least and \
            (self.at_most is None or head_size <= self.at_most)

    def __str__(self) -> str:
        parts = [f"multiples of {self.multiple_of}"] if self.multiple_of > 1 else []
        parts += [f"from {self.at_least}"] if self.at_least > 1 else []
        parts += [f"up to {self.at_most}"] if self.at_most is not None else []
        return " ".join(parts)


@dataclass(frozen=True)
class KernelSpec:
    """What a kernel needs: the devices it runs on at all and those it is fast on (``auto`` picks
    only those), a half-precision dtype, an importable module; whether it applies attention dropout
    (BERT's recipe uses 0.1; a kernel without it would train another model); whether
    ``torch.compile`` can take the whole forward around it."""

    function: Kernel
    runs_on: tuple[str, ...]
    fast_on: tuple[str, ...]
    half_only: bool
    dropout: bool
    module: str | None = None
    traceable: bool = True  # torch.compile captures it whole (its shapes come from tensors, not host lengths)
    head_sizes: HeadSizes | None = None  # the kernel's limits on hidden_size / num_attention_heads
    # Why auto passes it over under attention dropout (None: auto takes it): its dropout has not passed
    # tests/test_gpu.py's check on a GPU, though it runs when named.
    auto_dropout_unverified: str | None = None


FLASH_HEAD_SIZES = HeadSizes(multiple_of=8, at_most=256)  # FlashAttention 2 (the package's and PyTorch's own)
# FlexAttention's CUDA kernels (triton's tl.dot) take no head narrower than 16: inductor raises "NYI:
# embedding dimension ... must be at least 16" while compiling it.
FLEX_HEAD_SIZES = HeadSizes(at_least=16)


# In the order auto tries them, fastest first as measured on an H200 (BERT-base, bf16, seq 128,
# benchmarks/README.md, ratios to transformers' eager padded step): varlen 1.30-1.46x without attention
# dropout (1.84x with BERT's, compiled by layer, against sdpa_padded's 1.78x, run C), sdpa_padded 1.19x, flex
# 0.90x, sdpa_nested 0.37x, sdpa_loop 0.03x (a call per distinct length). sdpa_nested and sdpa_loop
# are not fast on CUDA, so auto takes them there only when asked by name.
KERNELS: dict[str, KernelSpec] = {
    "flash_attn": KernelSpec(flash_attn, ("cuda",), ("cuda",), half_only=True, dropout=True, module="flash_attn",
                             head_sizes=FLASH_HEAD_SIZES),
    "varlen": KernelSpec(varlen, ("cuda",), ("cuda",), half_only=True, dropout=True,
                         module="biomed_lm.pretrain.flash_varlen", head_sizes=FLASH_HEAD_SIZES,
                         auto_dropout_unverified="failed the GPU dropout check on an H200 (2026-11-27, "
                                                 "benchmarks/README.md); it runs when named"),
    "sdpa_padded": KernelSpec(sdpa_padded, ("cuda", "cpu"), ("cuda",), half_only=False, dropout=True),
    # FlexAttention has no CPU backward (torch 2.13); its forward runs on CPU (tested there).
    "flex": KernelSpec(flex, ("cuda",), ("cuda",), half_only=False, dropout=False,
                       module="torch.nn.attention.flex_attention", head_sizes=FLEX_HEAD_SIZES),
    "sdpa_nested": KernelSpec(sdpa_nested, ("cuda", "cpu"), (), half_only=False, dropout=True, traceable=False),
    "sdpa_loop": KernelSpec(sdpa_loop, ("cuda", "cpu"), ("cpu",), half_only=False, dropout=True, traceable=False),
}


assert set(get_args(AttentionImplementation)) == {"auto", *PADDED, *KERNELS}  # one choice set, defined once


def why_not(name: str, device: torch.device, dtype: torch.dtype, attention_dropout: float,
            head_size: int | None = None) -> str | None:
    """Why kernel ``name`` cannot run here (None when it can); ``head_size``: the model's, when known."""
    spec = KERNELS[name]
    if device.type not in spec.runs_on:
        return f"runs on {' or '.join(spec.runs_on)} only"
    if spec.half_only and dtype not in (torch.float16, torch.bfloat16):
        return f"needs fp16 or bf16 (the run computes in {str(dtype).removeprefix('torch.')})"
    if spec.head_sizes is not None and head_size is not None and not spec.head_sizes.take(head_size):
        return (f"takes head sizes {spec.head_sizes}, and the model's is {head_size} "
                "(hidden_size / num_attention_heads)")
    if attention_dropout and not spec.dropout:
        return (f"applies no attention dropout, and the model's attention_probs_dropout_prob is {attention_dropout} "
                "(set it to 0 in the model preset, as MosaicBERT and ModernBERT do, to use it)")
    if spec.module is not None and not _importable(spec.module):
        return f"{spec.module} is not installed"
    return None


def choose_kernel(requested: str, device: torch.device, dtype: torch.dtype, attention_dropout: float,
                  head_size: int | None = None) -> tuple[str, list[str]]:
    """The kernel to run and, for ``auto``, why each faster one was passed over (for the log).

    ``requested`` other than ``auto`` is taken as given if it can run, else :class:`PretrainConfigError`
    saying why."""
    if requested in PADDED:
        return requested, []
    if requested != "auto":
        reason = why_not(requested, device, dtype, attention_dropout, head_size)
        if reason is not None:
            raise PretrainConfigError(f"attn_implementation {requested!r} cannot run: it {reason}")
        return requested, []
    passed = []
    for name, spec in KERNELS.items():
        reason = f"slow on {device.type}" if device.type not in spec.fast_on else \
            why_not(name, device, dtype, attention_dropout, head_size)
        if reason is None and attention_dropout and spec.auto_dropout_unverified:
            reason = f"with attention dropout it {spec.auto_dropout_unverified}"
        if reason is None:
            return name, passed
        passed.append(f"{name}: {reason}")
    raise AssertionError("sdpa_loop runs everywhere")  # pragma: no cover


def attend(name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seqs: Sequences, dropout_p: float,
           scale: float | None = None) -> torch.Tensor:
    """Kernel ``name`` on ``(total_tokens, heads, head_dim)`` inputs."""
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    return KERNELS[name].function(q, k, v, seqs, dropout_p, scale)


@functools.lru_cache(maxsize=None)
def _importable(module: str) -> bool:
    import importlib

    try:
        importlib.import_module(module)
    except Exception:  # noqa: BLE001 - a broken optional install is as good as none
        return False
    return True
