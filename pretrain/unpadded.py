"""Every family's encoder on real tokens only: a forward over the family's own modules, token by token.

A padded micro-batch ``(batch, length)`` wastes every position past each sequence's end — with
BERT's length distribution (short_seq_prob, document ends) about half of a 512-token batch. Here
the micro-batch's real tokens are concatenated into one ``(total_tokens,)`` row (MosaicBERT's and
ModernBERT's layout, built on the host by :mod:`pretrain.layout`) with ``cu_seqlens`` marking the
sequences; every dense layer runs on real tokens only and attention (:mod:`pretrain.attention`)
stays within each sequence. Each sequence keeps its own [CLS], token types and positions, so the
result is the padded model's, to rounding, and the weights are the family's ``transformers``
parameters: exports load in ``transformers`` unchanged.

BERT, RoBERTa (positions after the padding id, one token type, no pooler) and ALBERT (factorized
embeddings, layers shared in groups) each have an adapter below.

**The residual stream's dtype.** Under autocast LayerNorm returns fp32, so the hidden states between
sub-layers (what each residual adds onto) are fp32 and every element-wise kernel around a LayerNorm
moves 4 bytes an element where the matrix multiplies read 2. ``residual_dtype`` (the trainer's
``--residual-stream half``: the autocast dtype) keeps them in bf16/fp16 instead, LayerNorm still
computed in fp32 inside its kernel: Megatron-LM's default in bf16 (its ``--fp32-residual-connection``
is the opt-out). ``None`` leaves autocast's dtypes as they are (the default, transformers' numerics).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from biomed_lm.pretrain.attention import Sequences, attend
from biomed_lm.pretrain.layout import VarlenBatch
from biomed_lm.token_types import takes_token_type_ids


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
        return token_type_rows(encoder, batch)

    def embed(self, encoder: nn.Module, batch: VarlenBatch, inputs_embeds: torch.Tensor | None = None,
              residual_dtype: torch.dtype | None = None) -> torch.Tensor:
        embeddings = encoder.embeddings
        words = embeddings.word_embeddings(batch.input_ids) if inputs_embeds is None else inputs_embeds
        hidden = words + embeddings.token_type_embeddings(self.token_types(encoder, batch)) \
            + embeddings.position_embeddings(self.positions(encoder, batch))
        return in_stream(embeddings.dropout(embeddings.LayerNorm(hidden)), residual_dtype)

    def layers(self, encoder: nn.Module) -> list[nn.Module]:
        """The layers in the order they run."""
        return list(encoder.encoder.layer)

    def layer(self, layer: nn.Module, hidden: torch.Tensor, sequences: Sequences, kernel: str,
              residual_dtype: torch.dtype | None = None) -> torch.Tensor:
        hidden = in_stream(self_attention(layer.attention, hidden, sequences, kernel), residual_dtype)
        return in_stream(layer.output(layer.intermediate(hidden), hidden), residual_dtype)

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
    """``RobertaModel``: BERT's modules, but one token type (all 0: :func:`token_type_rows`, as
    transformers' forward gets no segment ids) and position ids after the padding id,
    ``pad_token_id + 1 + position`` (``create_position_ids_from_input_ids`` on real tokens). No
    pooler under ``RobertaForMaskedLM``: :meth:`pool` gives None."""

    def positions(self, encoder: nn.Module, batch: VarlenBatch) -> torch.Tensor:
        return batch.position_ids + ((encoder.config.pad_token_id or 0) + 1)


class AlbertEncoder:
    """``AlbertModel`` token by token: E-dimensional embeddings (word or ``inputs_embeds`` + token
    type + position, LayerNorm, dropout) mapped to H (``embedding_hidden_mapping_in``), the shared
    layers as ``AlbertTransformer`` runs them (layer ``i`` runs group ``int(i / (L / groups))``, each
    group its ``inner_group_num`` layers), and the pooler (dense, tanh) on each [CLS] (SOP's input)."""

    def embed(self, encoder: nn.Module, batch: VarlenBatch, inputs_embeds: torch.Tensor | None = None,
              residual_dtype: torch.dtype | None = None) -> torch.Tensor:
        embeddings = encoder.embeddings
        words = embeddings.word_embeddings(batch.input_ids) if inputs_embeds is None else inputs_embeds
        hidden = words + embeddings.token_type_embeddings(token_type_rows(encoder, batch)) \
            + embeddings.position_embeddings(batch.position_ids)
        hidden = embeddings.dropout(embeddings.LayerNorm(hidden))
        return in_stream(encoder.encoder.embedding_hidden_mapping_in(hidden), residual_dtype)

    def layers(self, encoder: nn.Module) -> list[nn.Module]:
        config, groups = encoder.config, encoder.encoder.albert_layer_groups
        order = []
        for i in range(config.num_hidden_layers):  # AlbertTransformer.forward's mapping, float division included
            order += list(groups[int(i / (config.num_hidden_layers / config.num_hidden_groups))].albert_layers)
        return order

    def layer(self, layer: nn.Module, hidden: torch.Tensor, sequences: Sequences, kernel: str,
              residual_dtype: torch.dtype | None = None) -> torch.Tensor:
        attention = layer.attention
        shape = (hidden.shape[0], attention.num_attention_heads, attention.attention_head_size)
        q, k, v = project_qkv((attention.query, attention.key, attention.value), hidden, shape)
        dropout = attention.attention_dropout.p if attention.training else 0.0
        context = attend(kernel, q, k, v, sequences, dropout, attention.scaling).reshape(hidden.shape[0], -1)
        hidden = in_stream(attention.LayerNorm(hidden + attention.output_dropout(attention.dense(context))),
                           residual_dtype)
        feed_forward = layer.ffn_output(layer.activation(layer.ffn(hidden)))
        return in_stream(layer.full_layer_layer_norm(feed_forward + hidden), residual_dtype)

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


def in_stream(hidden: torch.Tensor, residual_dtype: torch.dtype | None) -> torch.Tensor:
    """A sub-layer's output as the residual stream holds it (``None``: as autocast left it). Inside a
    compiled region the cast joins the LayerNorm's kernel, which then writes 2 bytes an element, not 4."""
    return hidden if residual_dtype is None else hidden.to(residual_dtype)


def token_type_rows(encoder: nn.Module, batch: VarlenBatch) -> torch.Tensor:
    """The token-type embedding row of each token: its segment (0, then 1 after the first [SEP]) for
    a model that takes token types (:mod:`biomed_lm.token_types`' rule: every adapter's encoder has
    segment embeddings, so its ``type_vocab_size`` decides), row 0 for one with a single row (RoBERTa)."""
    if takes_token_type_ids(True, encoder.config.type_vocab_size):
        return batch.token_type_ids
    return torch.zeros_like(batch.input_ids)


def encoder_for(config) -> "BertEncoder | AlbertEncoder":
    """The adapter of the family whose config this is (a family without the unpadded path: ValueError)."""
    from biomed_lm.pretrain.families import family_of  # here, so this module's top half stays as it is

    family = family_of(config)
    if family.unpadded_encoder is None:
        raise ValueError(f"the {family.name} family has no unpadded path")
    return ENCODERS[family.unpadded_encoder]


def embed(encoder: nn.Module, batch: VarlenBatch, inputs_embeds: torch.Tensor | None = None,
          residual_dtype: torch.dtype | None = None) -> torch.Tensor:
    """The family's embeddings on the varlen layout, ``(total_tokens, hidden)`` (``inputs_embeds``:
    the word embeddings to use instead of looking ``batch.input_ids`` up, E-dimensional for ALBERT)."""
    return encoder_for(encoder.config).embed(encoder, batch, inputs_embeds, residual_dtype)


def self_attention(attention: nn.Module, hidden: torch.Tensor, sequences: Sequences, kernel: str) -> torch.Tensor:
    """One ``BertAttention`` / ``RobertaAttention`` (its projections and self-output) with a varlen kernel."""
    heads = attention.self
    shape = (hidden.shape[0], heads.num_attention_heads, heads.attention_head_size)
    q, k, v = project_qkv((heads.query, heads.key, heads.value), hidden, shape)
    dropout = heads.dropout.p if attention.training else 0.0
    context = attend(kernel, q, k, v, sequences, dropout, heads.scaling).reshape(hidden.shape[0], -1)
    return attention.output(context, hidden)


def project_qkv(projections: tuple[nn.Module, nn.Module, nn.Module], hidden: torch.Tensor,
                shape: tuple[int, int, int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Queries, keys and values, each viewed as ``shape`` (tokens, heads, head size). Three plain
    ``nn.Linear`` run as one matrix multiply on their weights concatenated (MosaicBERT's and
    ModernBERT's ``Wqkv``): a third of the launches, and one wider product, forward and backward;
    the parameters stay the family's three, so checkpoints and exports do not change. Anything else
    (torchao's ``Float8Linear`` under ``--precision fp8``) runs as its own module."""
    biases = [projection.bias for projection in projections]
    if any(type(projection) is not nn.Linear for projection in projections) or \
            len({bias is None for bias in biases}) > 1:
        return tuple(projection(hidden).view(shape) for projection in projections)
    bias = None if biases[0] is None else torch.cat(biases)
    fused = F.linear(hidden, torch.cat([projection.weight for projection in projections]), bias)
    return fused.view(hidden.shape[0], 3, *shape[1:]).unbind(1)


def encode(encoder: nn.Module, batch: VarlenBatch, kernel: str, inputs_embeds: torch.Tensor | None = None,
           regions=None, residual_dtype: torch.dtype | None = None) -> torch.Tensor:
    """The encoder's last hidden states, ``(total_tokens, hidden)``, of the family's encoder; with
    ``regions`` (:class:`pretrain.modeling.CompiledRegions`) through their compiled embeddings and
    layer blocks; the residual stream in ``residual_dtype`` where given (the module's top)."""
    adapter = encoder_for(encoder.config)
    layers = adapter.layers(encoder)
    if regions is None:
        hidden = adapter.embed(encoder, batch, inputs_embeds, residual_dtype)
        return run_layers(adapter, layers, hidden, batch.sequences, kernel, residual_dtype)
    hidden = regions.embed(encoder, batch, inputs_embeds, residual_dtype)
    block = regions.layers_per_graph
    for start in range(0, len(layers), block):
        hidden = regions.layers(layers[start:start + block], hidden, batch.sequences, kernel, residual_dtype)
    return hidden


def run_layers(adapter: "BertEncoder | AlbertEncoder", layers: list[nn.Module], hidden: torch.Tensor,
               sequences: Sequences, kernel: str, residual_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``layers`` one after another (a compiled region's body: a block of consecutive layers)."""
    for layer in layers:
        hidden = adapter.layer(layer, hidden, sequences, kernel, residual_dtype)
    return hidden


def pool(encoder: nn.Module, hidden: torch.Tensor, batch: VarlenBatch) -> torch.Tensor | None:
    """The pooled [CLS] state of each sequence (the pair head's input; None without a pooler)."""
    return encoder_for(encoder.config).pool(encoder, hidden, batch)
