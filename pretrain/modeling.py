"""The pretraining model: a ``transformers`` model of one family, BERT's run on real tokens only.

The weights are a plain ``transformers`` model of the run's family (:mod:`pretrain.families`:
``BertForPreTraining``, ``AlbertForPreTraining`` or ``RobertaForMaskedLM``; MLM head tied to the
input embeddings, the pair head on the pooled [CLS]), so exports load with ``from_pretrained``.
Where the family keeps its encoder, MLM head and pair head is the family's business; this module
asks it. Only the forward pass differs from transformers', in two ways:

* **Unpadded** (BERT's default on every device): the micro-batch's real tokens run through the
  encoder concatenated, with attention kept within each sequence (:mod:`pretrain.unpadded`,
  kernels in :mod:`pretrain.attention`). ``attention="hf_sdpa"`` / ``"hf_eager"`` run transformers'
  own padded forward instead: the reference the equivalence tests compare against, and the only
  forward of the families without the unpadded path (ALBERT, RoBERTa).
* **Masked positions only**: BERT masks 15% of the tokens, and projecting every position onto a
  30k vocabulary is the single largest matrix multiply of the step, so the MLM head runs on the
  masked positions' hidden states alone (the same loss, about a seventh of the head's work).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from biomed_lm.pretrain import unpadded
from biomed_lm.pretrain.attention import PADDED
from biomed_lm.pretrain.config import PretrainConfigError
from biomed_lm.pretrain.families import BERT, family_of

IGNORE_INDEX = -100


def build_bert(model_fields: dict, vocab_size: int, pad_token_id: int, attn_implementation: str = "sdpa"):
    """A freshly initialized ``BertForPreTraining`` from BertConfig fields and the tokenizer's size
    (``attn_implementation`` is transformers' own: see :func:`hf_attention`); the bert family's
    :meth:`~pretrain.families.ModelFamily.build`."""
    return BERT.build(model_fields, vocab_size, pad_token_id, attn_implementation)


def hf_attention(attention: str) -> str:
    """transformers' ``attn_implementation`` for a model run with ``attention`` (what its padded
    forward and its export use; the unpadded kernels do not go through it)."""
    return "eager" if attention == "hf_eager" else "sdpa"


@dataclass
class PretrainingOutput:
    """Losses and the counts the trainer turns into accuracies (summed over ranks before dividing)."""

    loss: torch.Tensor
    mlm_loss: torch.Tensor
    nsp_loss: torch.Tensor
    mlm_correct: torch.Tensor
    mlm_count: torch.Tensor
    nsp_correct: torch.Tensor
    nsp_count: torch.Tensor
    real_tokens: int = 0  # tokens of the micro-batch that are not padding
    computed_positions: int = 0  # positions the encoder ran on (padding included)

    # A variant of the objective (ALUM's adversarial term) reports what it adds through its output
    # class: the trainer's loop sums, accounts and logs these without knowing which variant runs.

    #: Names of the variant's per-step sums (over micro-batches, then ranks) beyond the standard ones.
    EXTRA_TOTALS: ClassVar[tuple[str, ...]] = ()

    def extra_totals(self) -> dict[str, float]:
        """This micro-batch's amounts of :attr:`EXTRA_TOTALS`, as host floats (a finite loss's only)."""
        return {}

    @classmethod
    def account_step(cls, totals: Mapping[str, float], state: dict[str, Any]) -> None:
        """Fold one step's reduced totals into the trainer's (checkpointed) state."""

    @classmethod
    def step_metrics(cls, totals: Mapping[str, float], micro_batches: int, nonfinite: bool,
                     state: dict[str, Any]) -> dict[str, Any]:
        """The variant's entries of the step's metrics.jsonl record: ``micro_batches`` is the number of
        finite micro-batches the totals cover; ``nonfinite``: some micro-batch's loss was not finite."""
        return {}


@dataclass
class PaddedBatch:
    """A micro-batch as the collator made it, for transformers' own padded forward."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    token_type_ids: torch.Tensor
    labels: torch.Tensor | None


class PretrainingModel(nn.Module):
    """Wraps a model of one family (``BertForPreTraining``, ``AlbertForPreTraining``,
    ``RobertaForMaskedLM``; the family is read off its config); ``self.bert`` is what gets exported,
    whatever the family (the name keeps the checkpoints' parameter names).

    ``nsp``: train the pair objective (the data's pair task, whose labels arrive as
    ``next_sentence_label``; see :func:`pretrain.families.resolve_pair_objective`).
    ``attention`` is a resolved kernel name (:func:`pretrain.attention.choose_kernel`), one of
    transformers' padded ones for a family without the unpadded path;
    ``pad_to_multiple_of`` rounds the unpadded token count up (bounded shapes for ``torch.compile``)."""

    #: What :meth:`forward` returns; the trainer asks it for the variant's extra totals and metrics.
    output_type: ClassVar[type[PretrainingOutput]] = PretrainingOutput

    def __init__(self, bert: nn.Module, nsp: bool = True, attention: str = "sdpa_loop",
                 pad_to_multiple_of: int | None = None):
        super().__init__()
        self.bert = bert
        self.family = family_of(bert.config)
        if attention not in PADDED and not self.family.unpadded:
            raise PretrainConfigError(f"attention {attention!r} runs unpadded, and the {self.family.name} family has "
                                      f"no unpadded path: use one of {', '.join(PADDED)}")
        self.nsp = nsp
        self.attention = attention
        self.pad_to_multiple_of = pad_to_multiple_of

    @property
    def unpadded(self) -> bool:
        return self.attention not in PADDED

    @property
    def encoder(self) -> nn.Module:
        """The family's encoder (``BertModel``, ``AlbertModel``, ``RobertaModel``)."""
        return self.family.encoder_of(self.bert)

    @property
    def mlm_head(self) -> nn.Module:
        """The MLM head: hidden states in, vocabulary logits out."""
        return self.family.mlm_head_of(self.bert)

    @property
    def pair_head(self) -> nn.Module | None:
        """The pair classifier on the pooled [CLS] (None for a family without one)."""
        return self.family.pair_head_of(self.bert)

    def prepare(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor,
                labels: torch.Tensor | None = None) -> "PaddedBatch | unpadded.VarlenBatch":
        """The micro-batch in the layout the encoder runs on."""
        if not self.unpadded:
            return PaddedBatch(input_ids, attention_mask, token_type_ids, labels)
        return unpadded.unpad(input_ids, attention_mask, token_type_ids, labels,
                              pad_to_multiple_of=self.pad_to_multiple_of,
                              pad_token_id=self.bert.config.pad_token_id or 0)

    def word_embeddings(self, batch: "PaddedBatch | unpadded.VarlenBatch") -> torch.Tensor:
        return self.bert.get_input_embeddings()(batch.input_ids)

    def encode(self, batch: "PaddedBatch | unpadded.VarlenBatch", inputs_embeds: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Last hidden states (one row per token of ``batch``'s layout) and the pooled [CLS] states
        (None for a family without a pooler)."""
        if isinstance(batch, PaddedBatch):
            return self.family.encode_padded(self.bert, batch.input_ids, batch.attention_mask, batch.token_type_ids,
                                             inputs_embeds)
        encoder = self.encoder
        hidden = unpadded.encode(encoder, batch, self.attention, inputs_embeds)
        return hidden, unpadded.pool(encoder, hidden, batch)

    def masked_logits(self, batch: "PaddedBatch | unpadded.VarlenBatch", inputs_embeds: torch.Tensor | None = None
                      ) -> torch.Tensor:
        """MLM logits at the masked positions, in the padded batch's row-major order (ALUM's forward)."""
        hidden, _ = self.encode(batch, inputs_embeds)
        return self.mlm_head(hidden[batch.labels != IGNORE_INDEX])

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor,
                labels: torch.Tensor, next_sentence_label: torch.Tensor | None = None) -> PretrainingOutput:
        return self.losses(self.prepare(input_ids, attention_mask, token_type_ids, labels), next_sentence_label)

    def losses(self, batch: "PaddedBatch | unpadded.VarlenBatch", next_sentence_label: torch.Tensor | None
               ) -> PretrainingOutput:
        sequence_output, pooled_output = self.encode(batch)
        mlm_head, device = self.mlm_head, sequence_output.device
        masked = batch.labels != IGNORE_INDEX
        targets = batch.labels[masked]
        mlm_count = targets.numel()
        if mlm_count:
            logits = mlm_head(sequence_output[masked])
            mlm_loss = F.cross_entropy(logits.float(), targets)
            mlm_correct = (logits.argmax(-1) == targets).sum()
        else:  # keeps every parameter in the graph, so data-parallel gradient reduction still works
            mlm_loss = mlm_head(sequence_output.flatten(0, -2)[:1]).sum() * 0.0
            mlm_correct = torch.zeros((), dtype=torch.long, device=device)
        nsp_loss, nsp_correct, nsp_count = self._pair_loss(pooled_output, next_sentence_label, device)
        return PretrainingOutput(
            loss=mlm_loss + nsp_loss, mlm_loss=mlm_loss.detach(), nsp_loss=nsp_loss.detach(),
            mlm_correct=mlm_correct, mlm_count=torch.tensor(mlm_count, device=device),
            nsp_correct=nsp_correct, nsp_count=torch.tensor(nsp_count, device=device),
            **_positions(batch))

    def _pair_loss(self, pooled_output: torch.Tensor | None, label: torch.Tensor | None, device: torch.device
                   ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """The pair objective's loss, correct predictions and labelled sequences (0 without labels,
        when not trained, or for a family without a pair head)."""
        head = self.pair_head
        no_correct = torch.zeros((), dtype=torch.long, device=device)
        if head is None:
            return torch.zeros((), device=device), no_correct, 0
        logits = head(pooled_output)
        if not (self.nsp and label is not None and bool((label != IGNORE_INDEX).any())):
            return logits.sum() * 0.0, no_correct, 0  # the head stays in the graph
        loss = F.cross_entropy(logits.float(), label, ignore_index=IGNORE_INDEX)
        valid = label != IGNORE_INDEX
        return loss, (logits.argmax(-1)[valid] == label[valid]).sum(), int(valid.sum())


def _positions(batch: "PaddedBatch | unpadded.VarlenBatch") -> dict[str, int]:
    if isinstance(batch, PaddedBatch):
        return {"real_tokens": int(batch.attention_mask.sum()), "computed_positions": batch.input_ids.numel()}
    total = batch.sequences.offsets[-1]
    return {"real_tokens": total - batch.padding, "computed_positions": total}


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
