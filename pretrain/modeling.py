"""The pretraining model: ``transformers.BertForPreTraining`` with a masked-positions-only MLM head.

The weights are a plain ``BertForPreTraining`` (MLM head tied to the input embeddings, NSP head on
the pooled [CLS]), so every export loads with ``BertForPreTraining``, ``BertForMaskedLM`` and
``AutoModel``. Only the forward pass differs: BERT masks 15% of the tokens, and projecting every
position onto a 30k vocabulary is the single largest matrix multiply of the step, so
:class:`PretrainingModel` gathers the hidden states of the masked positions first and runs the
MLM head on those alone (the same loss, about a seventh of the head's work). Attention uses
PyTorch's scaled-dot-product kernel (``attn_implementation="sdpa"``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

IGNORE_INDEX = -100


def build_bert(model_fields: dict, vocab_size: int, pad_token_id: int, attn_implementation: str = "sdpa"):
    """A freshly initialized ``BertForPreTraining`` from BertConfig fields and the tokenizer's size."""
    from transformers import BertConfig, BertForPreTraining

    config = BertConfig(**model_fields, vocab_size=vocab_size, pad_token_id=pad_token_id)
    config.architectures = ["BertForPreTraining"]
    return BertForPreTraining._from_config(config, attn_implementation=attn_implementation)


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


class PretrainingModel(nn.Module):
    """Wraps a ``BertForPreTraining``; ``self.bert`` is what gets exported."""

    def __init__(self, bert: nn.Module, nsp: bool = True):
        super().__init__()
        self.bert = bert
        self.nsp = nsp

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor,
                labels: torch.Tensor, next_sentence_label: torch.Tensor | None = None) -> PretrainingOutput:
        encoder = self.bert.bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        sequence_output, pooled_output = encoder[0], encoder[1]
        heads = self.bert.cls

        masked = labels != IGNORE_INDEX
        targets = labels[masked]
        mlm_count = targets.numel()
        if mlm_count:
            logits = heads.predictions(sequence_output[masked])
            mlm_loss = F.cross_entropy(logits.float(), targets)
            mlm_correct = (logits.argmax(-1) == targets).sum()
        else:  # keeps every parameter in the graph, so data-parallel gradient reduction still works
            mlm_loss = heads.predictions(sequence_output[:1, 0]).sum() * 0.0
            mlm_correct = torch.zeros((), dtype=torch.long, device=input_ids.device)

        nsp_logits = heads.seq_relationship(pooled_output)
        has_nsp = self.nsp and next_sentence_label is not None and bool((next_sentence_label != IGNORE_INDEX).any())
        if has_nsp:
            nsp_loss = F.cross_entropy(nsp_logits.float(), next_sentence_label, ignore_index=IGNORE_INDEX)
            valid = next_sentence_label != IGNORE_INDEX
            nsp_correct = (nsp_logits.argmax(-1)[valid] == next_sentence_label[valid]).sum()
            nsp_count = int(valid.sum())
        else:
            nsp_loss = nsp_logits.sum() * 0.0
            nsp_correct = torch.zeros((), dtype=torch.long, device=input_ids.device)
            nsp_count = 0
        device = input_ids.device
        return PretrainingOutput(
            loss=mlm_loss + nsp_loss, mlm_loss=mlm_loss.detach(), nsp_loss=nsp_loss.detach(),
            mlm_correct=mlm_correct, mlm_count=torch.tensor(mlm_count, device=device),
            nsp_correct=nsp_correct, nsp_count=torch.tensor(nsp_count, device=device))


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def flops_per_token(config, seq_length: int) -> float:
    """Training FLOPs per token (forward + backward ≈ 3 × forward), for the MFU estimate:
    6 × non-embedding parameters plus attention's 12 × layers × hidden × sequence length
    (Kaplan et al. 2020; the MLM head is counted as if it ran on every position, an upper bound)."""
    h, layers = config.hidden_size, config.num_hidden_layers
    per_layer = 4 * h * h + 2 * h * config.intermediate_size
    dense = layers * per_layer + h * config.vocab_size
    return 6.0 * dense + 12.0 * layers * h * seq_length
