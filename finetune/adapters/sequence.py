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

#: Predicted scores spanning at most this share of the gold's span are one score (bf16 noise on a collapsed head).
CONSTANT_SPREAD = 1e-3


class _SequenceAdapter(TaskAdapter):
    """Counts the inputs cut at ``max_length`` (``run.json``'s ``input_stats``, as relation runs count theirs):
    the paper truncates too, and the count says how much of a dataset that touches (QA: 20 of PubMedQA's
    500 test inputs at 512 with bert-base-uncased's vocabulary, unrecorded)."""

    def __init__(self, args, dataset, tokenizer) -> None:
        super().__init__(args, dataset, tokenizer)
        self.stats.update(truncated=0)

    def encode(self, text, pair=None, truncation: bool | str = True):
        encoding = self.tokenizer(text, pair, truncation=truncation, max_length=self.max_length)
        self.stats["truncated"] += _was_truncated(encoding, self.max_length)
        return encoding


def _was_truncated(encoding, max_length: int) -> bool:
    """Whether tokens were cut: a fast tokenizer keeps them (``overflowing``); otherwise an input at the
    limit is counted as cut."""
    if getattr(encoding, "encodings", None):
        return bool(encoding.encodings[0].overflowing)
    return len(encoding["input_ids"]) >= max_length


def sequence_feature(encoding, label) -> dict:
    """A tokenizer encoding as a feature with its label (token types 0 where the tokenizer gives none)."""
    return {"input_ids": encoding["input_ids"], "attention_mask": encoding["attention_mask"],
            "token_type_ids": encoding.get("token_type_ids") or [0] * len(encoding["input_ids"]),
            "labels": label}


class SimilarityAdapter(_SequenceAdapter):
    family = SIMILARITY

    def featurize(self, examples: Sequence) -> list[dict]:
        return [sequence_feature(self.encode(e.text_a, e.text_b), float(e.score)) for e in examples]

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

    def degenerate(self, gold: Sequence, predicted: Sequence) -> list[str]:
        """A regressor predicting (nearly) one score: r is undefined, or measures rounding noise (QA: a
        constant epoch scored 0.0 and was kept over epochs of negative r)."""
        gold_spread, spread = max(gold) - min(gold), max(predicted) - min(predicted)
        if gold_spread > 0 and spread <= CONSTANT_SPREAD * gold_spread:
            return [f"the test predictions span {spread:.3g} (from {min(predicted):.4g}) where the gold spans "
                    f"{gold_spread:.3g}: the model predicts one score, and Pearson's r says nothing of it"]
        return []


class DocumentClassificationAdapter(_SequenceAdapter):
    family = CLASSIFICATION

    def featurize(self, examples: Sequence) -> list[dict]:
        return [sequence_feature(self.encode(e.text), [float(label in e.labels) for label in self.labels])
                for e in examples]

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

    def degenerate(self, gold: Sequence, predicted: Sequence) -> list[str]:
        """One label set for every document where the gold has several (no label at all, most often)."""
        kinds = {frozenset(labels) for labels in gold}
        if not predicted or len({frozenset(labels) for labels in predicted}) > 1 or len(kinds) < 2:
            return []
        if not predicted[0]:
            labelled = sum(bool(labels) for labels in gold)
            return [f"no test document is given a label (the gold labels {labelled}): the model predicts no label "
                    "everywhere, and the score of 0 reflects that"]
        return [f"every test document is given the labels {label_list(predicted[0])} (the test set has "
                f"{len(kinds)} label sets): the model has not learned to tell documents apart"]


class QAAdapter(_SequenceAdapter):
    family = QA

    def featurize(self, examples: Sequence) -> list[dict]:
        index = {label: i for i, label in enumerate(self.labels)}
        return [sequence_feature(self.encode(e.question, e.context, truncation="longest_first"), index[e.label])
                for e in examples]

    def collate(self, features: Sequence[dict]) -> dict[str, torch.Tensor]:
        return pad_sequences(features, self.pad_id, torch.long)

    def build_head(self, encoder: nn.Module) -> nn.Module:
        return SequenceClassificationModel(encoder, len(self.labels), "single_label", "cls", self.args.dropout)

    def prediction_row(self, index: int, example, gold: Any, predicted: Any) -> dict[str, Any]:
        # the question, not the context (an abstract per line would make the file a copy of the test set)
        return {"index": index, "id": example.id, "question": example.question, "gold": gold, "predicted": predicted}
