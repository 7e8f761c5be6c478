"""BERT on real tokens only: the varlen layout and an encoder forward over ``BertModel``'s own modules.

A padded micro-batch ``(batch, length)`` wastes every position past each sequence's end — with
BERT's length distribution (short_seq_prob, document ends) about half of a 512-token batch. Here
the micro-batch's real tokens are concatenated into one ``(total_tokens,)`` row (MosaicBERT's and
ModernBERT's layout) with ``cu_seqlens`` marking the sequences; every dense layer runs on real
tokens only and attention (:mod:`pretrain.attention`) stays within each sequence. Each sequence
keeps its own [CLS], token types and positions from 0, so the result is the padded model's, to
rounding, and the weights are the same ``BertForPreTraining`` parameters: exports load in
``transformers`` unchanged.

Only the BERT family runs this way (:mod:`pretrain.families`): the forward below is ``BertModel``'s
modules, token by token; ALBERT and RoBERTa run transformers' padded forward.

The masking collators still build padded ``(batch, length)`` tensors (masking is defined per
sequence and the property tests check it there); :func:`unpad` converts one micro-batch, a gather
of a few integer tensors, before the encoder runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from biomed_lm.pretrain.attention import Sequences, attend

IGNORE_INDEX = -100


@dataclass
class VarlenBatch:
    """A micro-batch in the varlen layout. ``indices`` are the real tokens' positions in the
    flattened padded batch (row-major), so ``padded.flatten(0, 1)[indices]`` is the varlen tensor
    and the order of masked positions is the padded batch's. ``padding`` trailing tokens (a
    sequence of their own, ignored by every loss) round ``total_tokens`` up when shapes are bucketed
    for ``torch.compile``."""

    input_ids: torch.Tensor
    token_type_ids: torch.Tensor
    position_ids: torch.Tensor
    labels: torch.Tensor | None
    indices: torch.Tensor
    sequences: Sequences
    num_sequences: int
    padded_shape: tuple[int, int]
    padding: int = 0

    @property
    def cls_positions(self) -> torch.Tensor:
        """Where each sequence's [CLS] sits (the first token of each)."""
        return self.sequences.cu_seqlens[:self.num_sequences].long()


def unpad(input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor,
          labels: torch.Tensor | None = None, *, pad_to_multiple_of: int | None = None,
          pad_token_id: int = 0) -> VarlenBatch:
    """The varlen layout of a padded micro-batch whose masks are prefixes (real tokens first)."""
    batch, length = input_ids.shape
    lengths = attention_mask.sum(dim=1)
    indices = torch.nonzero(attention_mask.flatten(), as_tuple=True)[0]
    positions = torch.arange(length, device=input_ids.device).expand(batch, length).flatten()[indices]
    offsets = [0] + torch.cumsum(lengths, 0).tolist()  # one host sync per micro-batch, not per layer
    flat = {"input_ids": input_ids.flatten()[indices], "token_type_ids": token_type_ids.flatten()[indices],
            "position_ids": positions, "labels": labels.flatten()[indices] if labels is not None else None}
    padding = 0
    if pad_to_multiple_of and offsets[-1] % pad_to_multiple_of:
        padding = pad_to_multiple_of - offsets[-1] % pad_to_multiple_of
        flat = _append_padding(flat, padding, pad_token_id)
        offsets.append(offsets[-1] + padding)
    cu_seqlens = torch.tensor(offsets, dtype=torch.int32, device=input_ids.device)
    sequences = Sequences(cu_seqlens, tuple(offsets), max(b - a for a, b in zip(offsets[:-1], offsets[1:])))
    return VarlenBatch(**flat, indices=indices, sequences=sequences, num_sequences=batch,
                       padded_shape=(batch, length), padding=padding)


def _append_padding(flat: dict, padding: int, pad_token_id: int) -> dict:
    device = flat["input_ids"].device
    fill = {"input_ids": pad_token_id, "token_type_ids": 0, "labels": IGNORE_INDEX}
    out = {}
    for key, value in flat.items():
        if value is None:
            out[key] = None
        elif key == "position_ids":
            out[key] = torch.cat([value, torch.arange(padding, device=device)])
        else:
            out[key] = torch.cat([value, torch.full((padding,), fill[key], dtype=value.dtype, device=device)])
    return out


# ----------------------------------------------------------------------------- the encoder

def embed(bert_model: nn.Module, batch: VarlenBatch, inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
    """``BertEmbeddings`` on the varlen layout: word (or the given ``inputs_embeds``, ALUM's
    perturbed ones) + token type + position, LayerNorm, dropout — its forward, token by token."""
    embeddings = bert_model.embeddings
    words = embeddings.word_embeddings(batch.input_ids) if inputs_embeds is None else inputs_embeds
    hidden = words + embeddings.token_type_embeddings(batch.token_type_ids) \
        + embeddings.position_embeddings(batch.position_ids)
    return embeddings.dropout(embeddings.LayerNorm(hidden))


def self_attention(attention: nn.Module, hidden: torch.Tensor, sequences: Sequences, kernel: str) -> torch.Tensor:
    """One ``BertAttention`` (its projections and ``BertSelfOutput``) with a varlen kernel."""
    heads = attention.self
    shape = (hidden.shape[0], heads.num_attention_heads, heads.attention_head_size)
    q, k, v = (projection(hidden).view(shape) for projection in (heads.query, heads.key, heads.value))
    dropout = heads.dropout.p if attention.training else 0.0
    context = attend(kernel, q, k, v, sequences, dropout, heads.scaling).reshape(hidden.shape[0], -1)
    return attention.output(context, hidden)


def encode(bert_model: nn.Module, batch: VarlenBatch, kernel: str,
           inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
    """The encoder's last hidden states, ``(total_tokens, hidden)``, of a ``BertModel``."""
    hidden = embed(bert_model, batch, inputs_embeds)
    for layer in bert_model.encoder.layer:
        hidden = self_attention(layer.attention, hidden, batch.sequences, kernel)
        hidden = layer.output(layer.intermediate(hidden), hidden)
    return hidden


def pool(bert_model: nn.Module, hidden: torch.Tensor, batch: VarlenBatch) -> torch.Tensor:
    """``BertPooler`` on each sequence's [CLS] state (NSP's input)."""
    pooler = bert_model.pooler
    return pooler.activation(pooler.dense(hidden[batch.cls_positions]))


def padding_fraction(batch: VarlenBatch) -> float:
    """Share of the positions the encoder computes that are not real tokens (bucketing's)."""
    total = batch.sequences.offsets[-1]
    return batch.padding / total if total else 0.0

