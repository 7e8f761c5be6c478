"""Adapters whose input is one sequence (or pair) with one prediction per example: sentence
similarity (BIOSSES), document classification (HoC) and yes/no(/maybe) question answering.

* similarity — the sentence pair, one regression output (MSE).
* classification — the document, one sigmoid per label (binary cross-entropy).
* qa — ``[CLS] question [SEP] context [SEP]``, truncated longest-first: the context (a question is
  rarely the longer), and a question that alone exceeds the budget is cut too instead of failing.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from biomed_lm.finetune.adapters.base import TaskAdapter, label_list, pad_sequences
from biomed_lm.finetune.blurb import CLASSIFICATION, QA, SIMILARITY
from biomed_lm.finetune.modeling import SequenceClassificationModel

__all__ = ["SimilarityAdapter", "DocumentClassificationAdapter", "QAAdapter"]


def sequence_feature(encoding, label) -> dict:
    """A tokenizer encoding as a feature with its label (token types 0 where the tokenizer gives none)."""
    return {"input_ids": encoding["input_ids"], "attention_mask": encoding["attention_mask"],
            "token_type_ids": encoding.get("token_type_ids") or [0] * len(encoding["input_ids"]),
            "labels": label}


class SimilarityAdapter(TaskAdapter):
    family = SIMILARITY

    def featurize(self, examples: Sequence) -> list[dict]:
        return [sequence_feature(self.tokenizer(e.text_a, e.text_b, truncation=True, max_length=self.max_length),
                                 float(e.score)) for e in examples]

    def collate(self, features: Sequence[dict]) -> dict[str, torch.Tensor]:
        return pad_sequences(features, self.pad_id, torch.float)

    def build_head(self, encoder: nn.Module) -> nn.Module:
        return SequenceClassificationModel(encoder, 1, "regression", "cls", self.args.dropout)

    def predictions(self, examples: Sequence, features: Sequence[dict], outputs: Sequence) -> list:
        return [float(x) for x in outputs]

    def gold(self, examples: Sequence) -> list:
        return [e.score for e in examples]

    def prediction_row(self, index: int, example, gold: Any, predicted: Any) -> dict[str, Any]:
        return {"index": index, "id": example.id, "text_a": example.text_a, "text_b": example.text_b,
                "gold": gold, "predicted": predicted}


class DocumentClassificationAdapter(TaskAdapter):
    family = CLASSIFICATION

    def featurize(self, examples: Sequence) -> list[dict]:
        return [sequence_feature(self.tokenizer(e.text, truncation=True, max_length=self.max_length),
                                 [float(label in e.labels) for label in self.labels]) for e in examples]

    def collate(self, features: Sequence[dict]) -> dict[str, torch.Tensor]:
        return pad_sequences(features, self.pad_id, torch.float)

    def build_head(self, encoder: nn.Module) -> nn.Module:
        return SequenceClassificationModel(encoder, len(self.labels), "multi_label", "cls", self.args.dropout)

    def predictions(self, examples: Sequence, features: Sequence[dict], outputs: Sequence) -> list:
        return [{label for label, on in zip(self.labels, row) if on} for row in outputs]

    def gold(self, examples: Sequence) -> list:
        return [set(e.labels) for e in examples]

    def metric_kwargs(self) -> dict[str, Any]:
        return {"labels": list(self.labels)}

    def prediction_row(self, index: int, example, gold: Any, predicted: Any) -> dict[str, Any]:
        # the id (a PMID for HoC) finds the abstract; the text itself would make the file a copy of the test set
        return {"index": index, "id": example.id, "gold": label_list(gold), "predicted": label_list(predicted)}


class QAAdapter(TaskAdapter):
    family = QA

    def featurize(self, examples: Sequence) -> list[dict]:
        index = {label: i for i, label in enumerate(self.labels)}
        return [sequence_feature(self.tokenizer(e.question, e.context, truncation="longest_first",
                                                max_length=self.max_length), index[e.label]) for e in examples]

    def collate(self, features: Sequence[dict]) -> dict[str, torch.Tensor]:
        return pad_sequences(features, self.pad_id, torch.long)

    def build_head(self, encoder: nn.Module) -> nn.Module:
        return SequenceClassificationModel(encoder, len(self.labels), "single_label", "cls", self.args.dropout)

    def prediction_row(self, index: int, example, gold: Any, predicted: Any) -> dict[str, Any]:
        # the question, not the context (an abstract per line would make the file a copy of the test set)
        return {"index": index, "id": example.id, "question": example.question, "gold": gold, "predicted": predicted}
