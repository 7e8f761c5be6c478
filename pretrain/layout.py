"""The micro-batch layouts the model runs on, built on the host before the batch moves to the device.

The masking collator makes padded ``(batch, length)`` tensors (masking is defined per sequence).
What the encoder runs on is derived from them here, in the DataLoader's workers: the unpadded
(varlen) layout of :mod:`pretrain.unpadded` — the real tokens concatenated, ``cu_seqlens`` marking
the sequences — or the padded one transformers' forward takes; in both, the masked positions the
MLM head runs on. Every size that depends on the data (how many real tokens, where each sequence
starts, which positions are masked) is computed from CPU tensors here, so the step on the device
never has to wait for the device to say how large its next tensor is: no ``nonzero``, boolean
indexing, ``.item()`` or ``.tolist()`` between the batch's transfer and the optimizer.

A layout object holds its tensors and the host-side counts the trainer needs for throughput and
FLOPs (``real_tokens``, ``computed_positions``, ...); ``to(device)`` moves the tensors (non-blocking,
from pinned memory when the loader pins it) and keeps the counts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from biomed_lm.pretrain.attention import Sequences

IGNORE_INDEX = -100


def _moved(obj, move):
    """``obj`` (a layout dataclass) with ``move`` applied to every tensor field, nested layouts included."""
    changes = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, torch.Tensor):
            changes[f.name] = move(value)
        elif isinstance(value, Sequences):
            changes[f.name] = value.moved(move)
    return dataclasses.replace(obj, **changes)


class _Movable:
    def to(self, device: torch.device | str, non_blocking: bool = True):
        return _moved(self, lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self):
        """Called by the DataLoader's pinning thread (``pin_memory=True``)."""
        return _moved(self, lambda t: t.pin_memory())


@dataclass
class PaddedBatch(_Movable):
    """A micro-batch as the collator made it, for transformers' own padded forward.
    ``masked_positions``: the masked tokens' indices in the row-major flattened batch, and
    ``masked_labels`` their targets (see :func:`masked_selection` for padding rows)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    token_type_ids: torch.Tensor
    labels: torch.Tensor | None
    masked_positions: torch.Tensor
    masked_labels: torch.Tensor
    lengths: tuple[int, ...]  # each sequence's real tokens
    mlm_denominator: torch.Tensor | None = None  # see VarlenBatch

    @property
    def num_sequences(self) -> int:
        return len(self.lengths)

    @property
    def real_tokens(self) -> int:
        return sum(self.lengths)

    @property
    def computed_positions(self) -> int:
        return self.input_ids.numel()

    @property
    def padded_shape(self) -> tuple[int, int]:
        return tuple(self.input_ids.shape)


@dataclass
class VarlenBatch(_Movable):
    """A micro-batch in the varlen layout. ``indices`` are the real tokens' positions in the
    flattened padded batch (row-major), so ``padded.flatten(0, 1)[indices]`` is the varlen tensor
    and the order of masked positions is the padded batch's. ``padding`` trailing tokens (sequences
    of their own, none longer than the padded batch's rows, ignored by every loss) round the token
    count up when shapes are bucketed for ``torch.compile``. ``masked_positions`` index the masked
    tokens in the varlen rows."""

    input_ids: torch.Tensor
    token_type_ids: torch.Tensor
    position_ids: torch.Tensor
    labels: torch.Tensor | None
    indices: torch.Tensor
    sequences: Sequences
    masked_positions: torch.Tensor
    masked_labels: torch.Tensor
    num_sequences: int
    padded_shape: tuple[int, int]
    padding: int = 0
    # What the summed MLM loss is divided by: the trainer's share of the step's masked tokens over all its
    # micro-batches and ranks (pretrain.trainer.mlm_denominator); None: this micro-batch's own masked tokens.
    mlm_denominator: torch.Tensor | None = None

    @property
    def cls_positions(self) -> torch.Tensor:
        """Where each sequence's [CLS] sits (the first token of each)."""
        return self.sequences.cu_seqlens[:self.num_sequences].long()

    @property
    def lengths(self) -> tuple[int, ...]:
        """Each sequence's real tokens (the bucket's padding sequence not included)."""
        return self.sequences.lengths[:self.num_sequences]

    @property
    def computed_positions(self) -> int:
        return self.sequences.offsets[-1]

    @property
    def real_tokens(self) -> int:
        return self.computed_positions - self.padding


def masked_selection(labels: torch.Tensor | None, multiple_of: int | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices of the labelled (masked) entries of ``labels`` flattened, in order, and their labels;
    empty without labels. ``multiple_of`` pads both to a multiple of it (position 0, label ignored:
    no loss, no gradient, not counted), so CUDA graphs see a bounded set of shapes."""
    if labels is None:
        return torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)
    flat = labels.flatten()
    positions = torch.nonzero(flat != IGNORE_INDEX, as_tuple=True)[0]
    targets = flat.index_select(0, positions)
    if multiple_of and positions.numel() % multiple_of:
        extra = multiple_of - positions.numel() % multiple_of
        positions = torch.cat([positions, positions.new_zeros(extra)])
        targets = torch.cat([targets, targets.new_full((extra,), IGNORE_INDEX)])
    return positions, targets


def padded(input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor,
           labels: torch.Tensor | None = None) -> PaddedBatch:
    """The padded layout (transformers' forward), with its masked positions."""
    return PaddedBatch(input_ids, attention_mask, token_type_ids, labels, *masked_selection(labels),
                       lengths=tuple(attention_mask.sum(dim=1).tolist()))


def unpad(input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor,
          labels: torch.Tensor | None = None, *, pad_to_multiple_of: int | None = None,
          pad_token_id: int = 0, masked_multiple_of: int | None = None) -> VarlenBatch:
    """The varlen layout of a padded micro-batch whose masks are prefixes (real tokens first).
    Meant for CPU tensors (the loader's workers); on a device it synchronizes to read the lengths.

    The bucket's padding is cut into sequences of at most ``length`` (the padded batch's width): a
    bucket larger than the width would otherwise make one sequence longer than any real one, whose
    positions run past the position embeddings and whose row widens ``sdpa_padded``'s whole grid."""
    batch, length = input_ids.shape
    lengths = attention_mask.sum(dim=1)
    indices = torch.nonzero(attention_mask.flatten(), as_tuple=True)[0]
    positions = torch.arange(length, device=input_ids.device).expand(batch, length).flatten()[indices]
    offsets = [0] + torch.cumsum(lengths, 0).tolist()
    flat = {"input_ids": input_ids.flatten()[indices], "token_type_ids": token_type_ids.flatten()[indices],
            "position_ids": positions, "labels": labels.flatten()[indices] if labels is not None else None}
    padding = 0
    if pad_to_multiple_of and offsets[-1] % pad_to_multiple_of:
        padding = pad_to_multiple_of - offsets[-1] % pad_to_multiple_of
        pieces = [min(length, padding - start) for start in range(0, padding, length)]
        flat = _append_padding(flat, pieces, pad_token_id)
        for piece in pieces:
            offsets.append(offsets[-1] + piece)
    positions, targets = masked_selection(flat["labels"], masked_multiple_of)
    return VarlenBatch(**flat, indices=indices, sequences=Sequences.from_offsets(offsets, input_ids.device),
                       masked_positions=positions.to(input_ids.device), masked_labels=targets.to(input_ids.device),
                       num_sequences=batch, padded_shape=(batch, length), padding=padding)


def _append_padding(flat: dict, pieces: list[int], pad_token_id: int) -> dict:
    """``flat`` with padding sequences of the ``pieces``' lengths after the real tokens (positions restart in each)."""
    device, padding = flat["input_ids"].device, sum(pieces)
    fill = {"input_ids": pad_token_id, "token_type_ids": 0, "labels": IGNORE_INDEX}
    out = {}
    for key, value in flat.items():
        if value is None:
            out[key] = None
        elif key == "position_ids":
            out[key] = torch.cat([value, *(torch.arange(piece, device=device) for piece in pieces)])
        else:
            out[key] = torch.cat([value, torch.full((padding,), fill[key], dtype=value.dtype, device=device)])
    return out


@dataclass(frozen=True)
class Layout:
    """How a model wants its micro-batches: unpadded (bucketed to ``pad_to_multiple_of`` tokens) or
    padded. Picklable, so the loader's workers build the layout (:meth:`__call__`) off the step's path."""

    unpadded: bool
    pad_to_multiple_of: int | None = None
    pad_token_id: int = 0
    masked_multiple_of: int | None = None  # CUDA graphs: the masked count bucketed too

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor,
                 labels: torch.Tensor | None = None) -> PaddedBatch | VarlenBatch:
        if not self.unpadded:
            return padded(input_ids, attention_mask, token_type_ids, labels)
        return unpad(input_ids, attention_mask, token_type_ids, labels, pad_to_multiple_of=self.pad_to_multiple_of,
                     pad_token_id=self.pad_token_id, masked_multiple_of=self.masked_multiple_of)

