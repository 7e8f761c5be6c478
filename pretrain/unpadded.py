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
#
# One adapter per family (:data:`ENCODERS`, named by the family's ``unpadded_encoder``): how its
# embeddings, layers and pooler run on the varlen layout, each with the family's own modules, and
# which of those modules ``--compile on`` compiles (:func:`pretrain.compiling.dense_blocks`). The
# module functions below (:func:`embed`, :func:`encode`, :func:`pool`) take the family's encoder
# (``BertModel``, ``RobertaModel``, ``AlbertModel``) and dispatch on its config.


class BertEncoder:
    """``BertModel`` token by token: embeddings (word or the given ``inputs_embeds``, ALUM's
    perturbed ones, + token type + position, LayerNorm, dropout), each ``BertLayer`` with a varlen
    kernel, ``BertPooler`` on each sequence's [CLS] (NSP's, SOP's and DRP's input)."""

    def positions(self, encoder: nn.Module, batch: VarlenBatch) -> torch.Tensor:
        """Position-embedding rows of the tokens (BERT: the position within the sequence)."""
        return batch.position_ids

    def token_types(self, encoder: nn.Module, batch: VarlenBatch) -> torch.Tensor:
        return batch.token_type_ids

    def embed(self, encoder: nn.Module, batch: VarlenBatch, inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        embeddings = encoder.embeddings
        words = embeddings.word_embeddings(batch.input_ids) if inputs_embeds is None else inputs_embeds
        hidden = words + embeddings.token_type_embeddings(self.token_types(encoder, batch)) \
            + embeddings.position_embeddings(self.positions(encoder, batch))
        return embeddings.dropout(embeddings.LayerNorm(hidden))

    def layers(self, encoder: nn.Module) -> list[nn.Module]:
        """The layers in the order they run."""
        return list(encoder.encoder.layer)

    def layer(self, layer: nn.Module, hidden: torch.Tensor, sequences: Sequences, kernel: str) -> torch.Tensor:
        hidden = self_attention(layer.attention, hidden, sequences, kernel)
        return layer.output(layer.intermediate(hidden), hidden)

    def pool(self, encoder: nn.Module, hidden: torch.Tensor, batch: VarlenBatch) -> torch.Tensor | None:
        pooler = encoder.pooler
        if pooler is None:
            return None
        return pooler.activation(pooler.dense(hidden[batch.cls_positions]))

    def dense_blocks(self, encoder: nn.Module) -> list[nn.Module]:
        """Each layer's attention output (dense, dropout, residual, LayerNorm), intermediate (dense,
        activation) and output (dense, dropout, residual, LayerNorm)."""
        blocks: list[nn.Module] = []
        for layer in self.layers(encoder):
            blocks += [layer.attention.output, layer.intermediate, layer.output]
        return blocks


class RobertaEncoder(BertEncoder):
    """``RobertaModel``: BERT's modules, but one token type (all 0: the data's segment ids are not
    given to it, as transformers' forward gets none) and position ids after the padding id,
    ``pad_token_id + 1 + position`` (``create_position_ids_from_input_ids`` on real tokens). No
    pooler under ``RobertaForMaskedLM``: :meth:`pool` gives None."""

    def positions(self, encoder: nn.Module, batch: VarlenBatch) -> torch.Tensor:
        return batch.position_ids + ((encoder.config.pad_token_id or 0) + 1)

    def token_types(self, encoder: nn.Module, batch: VarlenBatch) -> torch.Tensor:
        return torch.zeros_like(batch.input_ids)


class AlbertEncoder:
    """``AlbertModel`` token by token: E-dimensional embeddings (word or ``inputs_embeds`` + token
    type + position, LayerNorm, dropout) mapped to H (``embedding_hidden_mapping_in``), the shared
    layers as ``AlbertTransformer`` runs them (layer ``i`` runs group ``int(i / (L / groups))``, each
    group its ``inner_group_num`` layers), and the pooler (dense, tanh) on each [CLS] (SOP's input)."""

    def embed(self, encoder: nn.Module, batch: VarlenBatch, inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        embeddings = encoder.embeddings
        words = embeddings.word_embeddings(batch.input_ids) if inputs_embeds is None else inputs_embeds
        hidden = words + embeddings.token_type_embeddings(batch.token_type_ids) \
            + embeddings.position_embeddings(batch.position_ids)
        hidden = embeddings.dropout(embeddings.LayerNorm(hidden))
        return encoder.encoder.embedding_hidden_mapping_in(hidden)

    def layers(self, encoder: nn.Module) -> list[nn.Module]:
        config, groups = encoder.config, encoder.encoder.albert_layer_groups
        order = []
        for i in range(config.num_hidden_layers):  # AlbertTransformer.forward's mapping, float division included
            order += list(groups[int(i / (config.num_hidden_layers / config.num_hidden_groups))].albert_layers)
        return order

    def layer(self, layer: nn.Module, hidden: torch.Tensor, sequences: Sequences, kernel: str) -> torch.Tensor:
        attention = layer.attention
        shape = (hidden.shape[0], attention.num_attention_heads, attention.attention_head_size)
        q, k, v = (projection(hidden).view(shape) for projection in (attention.query, attention.key, attention.value))
        dropout = attention.attention_dropout.p if attention.training else 0.0
        context = attend(kernel, q, k, v, sequences, dropout, attention.scaling).reshape(hidden.shape[0], -1)
        hidden = attention.LayerNorm(hidden + attention.output_dropout(attention.dense(context)))
        return layer.full_layer_layer_norm(layer.ffn_output(layer.activation(layer.ffn(hidden))) + hidden)

    def pool(self, encoder: nn.Module, hidden: torch.Tensor, batch: VarlenBatch) -> torch.Tensor | None:
        if encoder.pooler is None:
            return None
        return encoder.pooler_activation(encoder.pooler(hidden[batch.cls_positions]))

    def dense_blocks(self, encoder: nn.Module) -> list[nn.Module]:
        """ALBERT's modules split each block into leaves (no module holds dense + residual +
        LayerNorm, as BERT's ``BertSelfOutput`` does), so what compiles is the element-wise work
        they hold: the feed-forward's activation and both LayerNorms, once per distinct (shared)
        layer."""
        blocks: list[nn.Module] = []
        for layer in dict.fromkeys(self.layers(encoder)):  # shared layers: each once, in order
            blocks += [layer.attention.LayerNorm, layer.activation, layer.full_layer_layer_norm]
        return blocks


#: The unpadded forward of each family, by :attr:`pretrain.families.ModelFamily.unpadded_encoder`.
ENCODERS = {"bert": BertEncoder(), "roberta": RobertaEncoder(), "albert": AlbertEncoder()}


def encoder_for(config) -> "BertEncoder | AlbertEncoder":
    """The adapter of the family whose config this is (a family without the unpadded path: ValueError)."""
    from biomed_lm.pretrain.families import family_of  # here, so this module's top half stays as it is

    family = family_of(config)
    if family.unpadded_encoder is None:
        raise ValueError(f"the {family.name} family has no unpadded path")
    return ENCODERS[family.unpadded_encoder]


def embed(encoder: nn.Module, batch: VarlenBatch, inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
    """The family's embeddings on the varlen layout, ``(total_tokens, hidden)`` (``inputs_embeds``:
    the word embeddings to use instead of looking ``batch.input_ids`` up, E-dimensional for ALBERT)."""
    return encoder_for(encoder.config).embed(encoder, batch, inputs_embeds)


def self_attention(attention: nn.Module, hidden: torch.Tensor, sequences: Sequences, kernel: str) -> torch.Tensor:
    """One ``BertAttention`` / ``RobertaAttention`` (its projections and self-output) with a varlen kernel."""
    heads = attention.self
    shape = (hidden.shape[0], heads.num_attention_heads, heads.attention_head_size)
    q, k, v = (projection(hidden).view(shape) for projection in (heads.query, heads.key, heads.value))
    dropout = heads.dropout.p if attention.training else 0.0
    context = attend(kernel, q, k, v, sequences, dropout, heads.scaling).reshape(hidden.shape[0], -1)
    return attention.output(context, hidden)


def encode(encoder: nn.Module, batch: VarlenBatch, kernel: str,
           inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
    """The encoder's last hidden states, ``(total_tokens, hidden)``, of the family's encoder."""
    adapter = encoder_for(encoder.config)
    hidden = adapter.embed(encoder, batch, inputs_embeds)
    for layer in adapter.layers(encoder):
        hidden = adapter.layer(layer, hidden, batch.sequences, kernel)
    return hidden


def pool(encoder: nn.Module, hidden: torch.Tensor, batch: VarlenBatch) -> torch.Tensor | None:
    """The pooled [CLS] state of each sequence (the pair head's input; None without a pooler)."""
    return encoder_for(encoder.config).pool(encoder, hidden, batch)
