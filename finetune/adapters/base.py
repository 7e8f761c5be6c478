"""The interface every task adapter implements, and the registry of adapters by task family.

An adapter owns everything that differs between task families: how examples become features
(:meth:`TaskAdapter.featurize`) and batches (:meth:`~TaskAdapter.collate`), the head put on the
encoder (:meth:`~TaskAdapter.build_head`), which batch keys the model reads
(:meth:`~TaskAdapter.inputs`), how logits become one prediction per example
(:meth:`~TaskAdapter.predict_batch`, :meth:`~TaskAdapter.predictions`), the gold values and the
metric's arguments. The fine-tuning loop (:mod:`finetune.trainer`) is the same for every family and
asks the adapter; adding a family is one subclass registered in :data:`finetune.adapters.ADAPTERS`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar, Sequence

import torch
from torch import nn

from biomed_lm.errors import InputError

if TYPE_CHECKING:
    from biomed_lm.finetune.readers.examples import BlurbDataset
    from biomed_lm.finetune.trainer import FinetuneArgs

__all__ = ["TaskAdapter", "pad_sequences", "label_list"]


class TaskAdapter(ABC):
    """One task family's featurization, collation, head, inputs, decoding and metric arguments.

    Built per run from the run's arguments, its dataset and the tokenizer. ``labels`` are the
    model's output ids in order (tags in the chosen scheme for NER); ``stats`` counts what
    featurization had to do (truncations, clipped entities) for the run record; ``details`` records
    what :meth:`select` decided about particular rows (``run.json``'s ``input_details``).
    """

    family: ClassVar[str]
    #: batch keys the model reads in every forward pass
    input_keys: ClassVar[tuple[str, ...]] = ("input_ids", "attention_mask", "token_type_ids")
    #: batch keys the training forward pass reads besides those (the loss's targets)
    train_keys: ClassVar[tuple[str, ...]] = ("labels",)
    #: the run's options this family uses besides the common ones, which its run record holds (QA: a BIOSSES run
    #: recorded a tagging scheme)
    options: ClassVar[tuple[str, ...]] = ()

    def __init__(self, args: "FinetuneArgs", dataset: "BlurbDataset", tokenizer) -> None:
        self.args, self.dataset, self.tokenizer = args, dataset, tokenizer
        self.max_length = args.effective_max_length()
        self.pad_id = tokenizer.pad_token_id
        if self.pad_id is None:
            raise InputError(f"{type(tokenizer).__name__} has no pad token: load the checkpoint through "
                             "finetune.model_check.check_model, which sets one where the model family has none")
        self.labels: tuple[str, ...] = tuple(dataset.labels)
        self.stats: dict[str, int] = {}
        self.details: dict[str, Any] = {}

    @property
    def task_type(self) -> str:
        return self.family

    # ------------------------------------------------------------------ features and batches

    def select(self, split: str, examples: Sequence) -> list:
        """The examples of ``split`` that the run uses: all of them, unless this family cannot
        represent some for training (it then records them in :attr:`details`). Dev and test examples
        are never dropped: every one is scored, so test scores stay comparable."""
        return list(examples)

    def summary(self) -> list[str]:
        """Lines for the run's log saying what :meth:`select` decided (none when nothing was special)."""
        return []

    @abstractmethod
    def featurize(self, examples: Sequence) -> list[dict]:
        """One feature dict per model input (several per example where an example is windowed)."""

    @abstractmethod
    def collate(self, features: Sequence[dict]) -> dict[str, torch.Tensor]:
        """A padded batch of features."""

    def inputs(self, batch: dict[str, torch.Tensor], device: torch.device, *, train: bool = True
               ) -> dict[str, torch.Tensor]:
        """The model's keyword arguments from a batch: :attr:`input_keys`, and :attr:`train_keys`
        when training."""
        keys = self.input_keys + (self.train_keys if train else ())
        return {k: batch[k].to(device, non_blocking=True) for k in keys if k in batch}

    # ----------------------------------------------------------------------------- the model

    @abstractmethod
    def build_head(self, encoder: nn.Module) -> nn.Module:
        """The task model: ``encoder`` under this family's head (dropout ``args.dropout``)."""

    # -------------------------------------------------------------------------- predictions

    def predict_batch(self, model: nn.Module, batch: dict[str, torch.Tensor], device: torch.device) -> list:
        """One raw prediction per feature of ``batch``."""
        logits = model(**self.inputs(batch, device, train=False)).logits
        return model.predict(logits).cpu().tolist()

    def predictions(self, examples: Sequence, features: Sequence[dict], outputs: Sequence) -> list:
        """One prediction per example, in the form the metric takes, from the features' outputs."""
        return [self.labels[i] for i in outputs]

    def gold(self, examples: Sequence) -> list:
        """The gold value of each example, in the form the metric takes."""
        return [e.label for e in examples]

    def metric_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of the dataset's metric (:func:`finetune.metrics.compute_metric`)."""
        return {}

    def degenerate(self, gold: Sequence, predicted: Sequence) -> list[str]:
        """Warnings for predictions that show a collapsed model (none when they do not): here, one label for
        every example where the gold has several (QA: DDI at 64 examples predicted DDI-false throughout and
        scored 0.00, which read like a failure)."""
        labels = set(gold)
        if predicted and len(set(predicted)) == 1 and len(labels) > 1:
            return [f"every test prediction is {predicted[0]!r} (the test set has {len(labels)} labels): "
                    "the model has not learned to tell them apart, and the score reflects that"]
        return []

    # ------------------------------------------------------------------- predictions file

    def prediction_rows(self, examples: Sequence, gold: Sequence, predicted: Sequence) -> list[dict]:
        """One JSON-ready dict per example (``predictions_<split>.jsonl``), in the examples' order: ``gold``
        and ``predicted`` as :meth:`gold` and :meth:`predictions` give them to the metric, so the score
        can be recomputed from the file, with what a reader needs to see the error."""
        if not len(examples) == len(gold) == len(predicted):
            raise RuntimeError(f"{len(examples)} examples, {len(gold)} gold values, {len(predicted)} predictions")
        return [self.prediction_row(i, *row) for i, row in enumerate(zip(examples, gold, predicted))]

    def prediction_row(self, index: int, example, gold: Any, predicted: Any) -> dict[str, Any]:
        """One example's row: its index in the split as run, its id (the dataset's, or the reader's
        file-and-line name where the file has none), gold and prediction; families add their context."""
        return {"index": index, "id": example.id, "gold": gold, "predicted": predicted}


def label_list(labels) -> list[str]:
    """A set of labels as a sorted list: JSON has no sets, and a fixed order makes files comparable."""
    return sorted(labels)


def pad_sequences(features: Sequence[dict], pad_id: int, label_dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """A batch of ``input_ids``/``attention_mask``/``token_type_ids`` features padded to the longest,
    with one label (or label vector) per feature."""
    length = max(len(f["input_ids"]) for f in features)

    def pad(key: str, value: int) -> torch.Tensor:
        return torch.tensor([list(f[key]) + [value] * (length - len(f[key])) for f in features], dtype=torch.long)

    return {"input_ids": pad("input_ids", pad_id), "attention_mask": pad("attention_mask", 0),
            "token_type_ids": pad("token_type_ids", 0),
            "labels": torch.tensor([f["labels"] for f in features], dtype=label_dtype)}
