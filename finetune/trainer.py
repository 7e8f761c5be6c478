"""One fine-tuning run: a checkpoint, a dataset, a seed → a run record (``run.json``).

The paper's recipe (section 2.4): a task-specific head on the pretrained encoder, AdamW with the
slanted triangular schedule (10% warm-up), dropout 0.1, model selection on dev (the epoch with the
best dev score is kept) and that model scored on test. A sweep is many such runs, one directory
each; a run whose ``run.json`` is complete is skipped, so an interrupted sweep resumes where it
stopped.

Inputs per task type (``docs/datasets.md`` lists the datasets):

* ``ner`` / ``pico`` — words are split into sub-words; the word's label sits on its first sub-word
  and every other position is ``-100``. A sentence longer than ``max_length`` is cut into
  consecutive windows of whole words, so no word is dropped and every word gets a prediction.
* ``relation`` — :func:`finetune.relation_inputs.encode_relation_example`, windowed around the two
  entities (``on_overflow="clip"``, so every test instance is scored; clipped ones are counted).
* ``similarity`` — the sentence pair, one regression output (MSE).
* ``classification`` — the document, one sigmoid per label (binary cross-entropy).
* ``qa`` — ``[CLS] question [SEP] context [SEP]``, truncated longest-first: the context (a question
  is rarely the longer), and a question that alone exceeds the budget is cut too instead of failing.
"""

from __future__ import annotations

import copy
import json
import math
import os
import platform
import random
import resource
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from biomed_lm.errors import InputError
from biomed_lm.finetune.datasets import (CLASSIFICATION, DEV, NER, PICO, QA_MAX_LENGTH, RELATION, SIMILARITY,
                                         TASK_TYPES, TEST, TRAIN, BlurbDataset, default_max_length, load_blurb_dataset,
                                         load_generic_dataset)
from biomed_lm.finetune.metrics import NER_F1_MODES, compute_metric
from biomed_lm.finetune.model_check import CheckedModel, check_model
from biomed_lm.finetune.modeling import (IGNORE_INDEX, REPRESENTATIONS, TAGGING_LAYERS, MultiTokenTaggingModel,
                                         SequenceClassificationModel, TokenTaggingModel, load_encoder)
from biomed_lm.finetune.relation_inputs import (PLACEHOLDER_PAIRS, TRANSFORMATIONS, TYPE_MAPS, add_marker_tokens,
                                                collate_relation_features, encode_relation_example,
                                                entities_from_placeholders, pair_from_placeholders)
from biomed_lm.finetune.tagging import SCHEMES, convert_tags, normalize_scheme, split_tag, tag_labels
from biomed_lm.pretrain.optim import ScheduleConfig, build_lr_scheduler, build_optimizer, parameter_groups

__all__ = ["FinetuneArgs", "RunResult", "run_finetune", "load_dataset_for", "word_windows", "is_complete_run",
           "train_epoch", "finetune_ds_config", "RUN_RECORD", "QA_MAX_LENGTH", "PRECISIONS"]

RUN_RECORD = "run.json"
MAX_GRAD_NORM = 1.0
# Settings that do not change the result; a finished run with other values of these is still the same run.
_NOT_RESULT_SETTINGS = ("num_workers", "output_dir", "data_dir", "local_rank")
# What a record written before a setting existed was run with, where that is not today's default.
_BEFORE_RECORDED = {"ner_f1_mode": "strict"}
PRECISIONS = ("fp32", "bf16", "fp16")


@dataclass
class FinetuneArgs:
    """Everything one run depends on (YAML keys and command-line flags of ``launch/finetune.py``)."""

    model: str = field(default="", metadata={"help": "checkpoint directory (config, weights, tokenizer), or a "
                                                      "pretraining run directory (its model/ export is used)"})
    resize_embeddings: bool = field(default=False, metadata={
        "help": "resize the model's embeddings to the tokenizer's size when they differ (default: refuse)"})
    dataset: str = field(default="", metadata={"help": "BLURB dataset name (ncbi-disease, gad, ...) or, with "
                                                        "task_type, the name of a generic dataset"})
    data_dir: str = field(default="", metadata={"help": "directory holding the dataset's files"})
    output_dir: str = field(default="", metadata={"help": "where run.json is written"})
    task_type: str | None = field(default=None, metadata={
        "help": f"read data_dir in the generic format of this task type ({', '.join(TASK_TYPES)}) instead of "
                "as a BLURB dataset"})
    negative_label: str | None = field(default=None, metadata={
        "help": "generic relation datasets: the 'no relation' label (metric: micro F1 without it)"})
    learning_rate: float = 3e-5
    batch_size: int = 32
    epochs: int = 3
    seed: int = 42
    max_length: int | None = field(default=None, metadata={"help": "sub-words per input; default: the dataset's "
                                                                    "own (docs/datasets.md)"})
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    dropout: float = 0.1
    tagging_scheme: str = field(default="bio", metadata={"help": f"NER tags: {', '.join(SCHEMES)}"})
    tagging_layer: str = field(default="linear", metadata={"help": f"NER head: {', '.join(TAGGING_LAYERS)}"})
    ner_f1_mode: str = field(default="conlleval", metadata={
        "help": f"NER entity F1 reading: {', '.join(NER_F1_MODES)} (conlleval: seqeval's default mode, the "
                "field's convention; strict: ill-formed predicted chunks are no entities)"})
    relation_transformation: str = field(default="dummify", metadata={"help": ", ".join(TRANSFORMATIONS)})
    relation_representation: str = field(default="cls", metadata={"help": ", ".join(REPRESENTATIONS)})
    max_train_examples: int | None = field(default=None, metadata={"help": "first N training examples only"})
    max_eval_examples: int | None = field(default=None, metadata={"help": "first N dev/test examples only"})
    allow_missing_train: bool = field(default=False, metadata={
        "help": "NER datasets without a train file train on a seeded 90%% of the dev file's documents "
                "(JNLPBA as distributed here); the run record's dataset_notes say so"})
    num_workers: int = 0
    deepspeed: bool = field(default=False, metadata={
        "help": "train through DeepSpeed (launch with `deepspeed launch/finetune.py ...`); its config is "
                "generated from batch_size, precision and zero_stage"})
    precision: str = field(default="fp32", metadata={"help": f"{', '.join(PRECISIONS)}; bf16/fp16 need "
                                                              "--deepspeed on a GPU"})
    zero_stage: int = field(default=0, metadata={"help": "DeepSpeed ZeRO stage (0-2)"})
    local_rank: int = field(default=-1, metadata={"help": "set by the deepspeed launcher"})

    def __post_init__(self) -> None:
        """Reject bad settings before any data or model is loaded, naming the setting."""
        for name in ("model", "dataset", "data_dir", "output_dir"):
            if not getattr(self, name):
                raise InputError(f"{name} is required")
        if self.task_type is not None and self.task_type not in TASK_TYPES:
            raise InputError(f"task_type must be one of {', '.join(TASK_TYPES)}, got {self.task_type!r}")
        for name in ("batch_size", "epochs"):
            if getattr(self, name) < 1:
                raise InputError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not self.learning_rate > 0:
            raise InputError(f"learning_rate must be positive, got {self.learning_rate}")
        if self.max_length is not None and self.max_length < 8:
            raise InputError(f"max_length must be at least 8, got {self.max_length}")
        if not 0 <= self.warmup_ratio < 1:
            raise InputError(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        if not 0 <= self.dropout < 1:
            raise InputError(f"dropout must be in [0, 1), got {self.dropout}")
        try:
            self.tagging_scheme = normalize_scheme(self.tagging_scheme)
        except ValueError as err:
            raise InputError(f"tagging_scheme: {err}") from None
        choices = {"tagging_layer": TAGGING_LAYERS, "relation_transformation": TRANSFORMATIONS,
                   "relation_representation": REPRESENTATIONS, "ner_f1_mode": NER_F1_MODES}
        for name, valid in choices.items():
            if getattr(self, name) not in valid:
                raise InputError(f"{name} must be one of {', '.join(valid)}, got {getattr(self, name)!r}")
        for name in ("max_train_examples", "max_eval_examples"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise InputError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.num_workers < 0:
            raise InputError(f"num_workers must be >= 0, got {self.num_workers}")
        if self.precision not in PRECISIONS:
            raise InputError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.precision != "fp32" and not self.deepspeed:
            raise InputError(f"precision {self.precision} needs --deepspeed (mixed precision runs through DeepSpeed)")
        if self.zero_stage not in (0, 1, 2):
            raise InputError(f"zero_stage must be 0, 1 or 2, got {self.zero_stage}")

    def effective_max_length(self) -> int:
        """``max_length``, or the dataset's default (:func:`finetune.datasets.default_max_length`)."""
        return self.max_length if self.max_length is not None else default_max_length(self.dataset, self.task_type)


@dataclass
class RunResult:
    """What :func:`run_finetune` returns: the record written to ``run.json`` and whether the run was
    skipped because a complete record for the same settings was already there."""

    record: dict[str, Any]
    skipped: bool
    path: Path


# ------------------------------------------------------------------------------------ data

def load_dataset_for(args: FinetuneArgs) -> BlurbDataset:
    """The dataset of ``args``: a BLURB dataset by name, or a generic one when ``task_type`` is set."""
    if args.task_type is not None:
        if args.allow_missing_train:
            raise InputError("allow_missing_train applies to BLURB NER datasets only (a generic dataset needs train)")
        return load_generic_dataset(args.task_type, args.data_dir, name=args.dataset,
                                    negative_label=args.negative_label)
    if args.negative_label is not None:
        raise InputError("negative_label applies to generic datasets (task_type set) only")
    return load_blurb_dataset(args.dataset, args.data_dir, allow_missing_train=args.allow_missing_train)


def word_windows(subword_counts: Sequence[int], budget: int) -> list[tuple[int, int]]:
    """Split a sentence into consecutive ``[start, end)`` word ranges of at most ``budget`` sub-words.

    Windows never overlap and together hold every word, so each word is predicted exactly once. A
    single word longer than ``budget`` gets a window of its own (its sub-words are cut later, but
    its first sub-word, which carries the label, is kept).
    """
    if budget < 1:
        raise ValueError(f"budget must be positive, got {budget}")
    windows, start, used = [], 0, 0
    for index, count in enumerate(subword_counts):
        count = max(1, count)
        if index > start and used + count > budget:
            windows.append((start, index))
            start, used = index, 0
        used += count
    if start < len(subword_counts) or not windows:
        windows.append((start, len(subword_counts)))
    return windows


def _word_pieces(tokenizer, sentences: Sequence[Sequence[str]]) -> list[list[list[int]]]:
    """Per sentence, the sub-word ids of each word on its own (a word the tokenizer drops, e.g. a
    control character, becomes [UNK] so that it still has a position to carry its label). One
    tokenizer call for all the words: the fast tokenizer batches them in Rust."""
    words = [word for sentence in sentences for word in sentence]
    pieces = tokenizer(words, add_special_tokens=False)["input_ids"] if words else []
    pieces = [ids if ids else [tokenizer.unk_token_id] for ids in pieces]
    out, start = [], 0
    for sentence in sentences:
        out.append(pieces[start:start + len(sentence)])
        start += len(sentence)
    return out


def _tagging_features(examples: Sequence, tokenizer, max_length: int, encode_labels) -> list[dict]:
    """Windowed NER/PICO features; each remembers its example and first word for mapping back."""
    budget = max_length - 2
    features = []
    all_pieces = _word_pieces(tokenizer, [example.tokens for example in examples])
    for example_index, (example, pieces) in enumerate(zip(examples, all_pieces)):
        labels = encode_labels(example)
        for start, end in word_windows([len(p) for p in pieces], budget):
            ids, label_row, word_mask = [tokenizer.cls_token_id], [None], [False]
            for word in range(start, end):
                word_ids = pieces[word][:max(1, budget - (len(ids) - 1))]
                ids.extend(word_ids)
                label_row.extend([labels[word]] + [None] * (len(word_ids) - 1))
                word_mask.extend([True] + [False] * (len(word_ids) - 1))
            ids.append(tokenizer.sep_token_id)
            label_row.append(None)
            word_mask.append(False)
            features.append({"input_ids": ids, "labels": label_row, "word_mask": word_mask,
                             "example": example_index, "first_word": start, "num_words": end - start})
    return features


def _pad_tagging(features: Sequence[dict], pad_id: int, num_elements: int | None) -> dict[str, torch.Tensor]:
    length = max(len(f["input_ids"]) for f in features)
    ignore = IGNORE_INDEX if num_elements is None else [IGNORE_INDEX] * num_elements
    batch = {
        "input_ids": torch.tensor([f["input_ids"] + [pad_id] * (length - len(f["input_ids"])) for f in features]),
        "attention_mask": torch.tensor([[1] * len(f["input_ids"]) + [0] * (length - len(f["input_ids"]))
                                        for f in features]),
        "word_mask": torch.tensor([f["word_mask"] + [False] * (length - len(f["word_mask"])) for f in features]),
        "labels": torch.tensor([[ignore if x is None else x for x in f["labels"]]
                                + [ignore] * (length - len(f["labels"])) for f in features]),
    }
    batch["token_type_ids"] = torch.zeros_like(batch["input_ids"])
    return batch


def _pad_sequences(features: Sequence[dict], pad_id: int, label_dtype: torch.dtype) -> dict[str, torch.Tensor]:
    length = max(len(f["input_ids"]) for f in features)

    def pad(key: str, value: int) -> torch.Tensor:
        return torch.tensor([list(f[key]) + [value] * (length - len(f[key])) for f in features], dtype=torch.long)

    return {"input_ids": pad("input_ids", pad_id), "attention_mask": pad("attention_mask", 0),
            "token_type_ids": pad("token_type_ids", 0),
            "labels": torch.tensor([f["labels"] for f in features], dtype=label_dtype)}


@dataclass
class _Task:
    """How one task type turns examples into features and batches, and predictions into labels."""

    task_type: str
    labels: tuple[str, ...]          # the model's output ids (tags in the chosen scheme for NER)
    featurize: Any
    collate: Any
    metric_kwargs: dict[str, Any]
    stats: dict[str, int] = field(default_factory=dict)
    to_model_tags: Any = None        # NER: a dataset's tag sequence in the model's scheme (gold for scoring)


def _file_scheme(labels: Sequence[str]) -> str:
    """The scheme a dataset's tags are written in: BIO, or BIOUL when any tag is U-/L- (or the
    BIOES spelling S-/E-, read as U-/L-)."""
    prefixes = {tag.partition("-")[0] for tag in labels if tag != "O"}
    return "bioul" if prefixes & {"U", "L", "S", "E"} else "bio"


def _bioes_as_bioul(tags: Sequence[str]) -> list[str]:
    return [("U" + t[1:]) if t.startswith("S-") else ("L" + t[1:]) if t.startswith("E-") else t for t in tags]


def _build_task(args: FinetuneArgs, dataset: BlurbDataset, tokenizer) -> _Task:
    task_type, max_length = dataset.task_type, args.effective_max_length()
    pad_id = tokenizer.pad_token_id
    stats: dict[str, int] = {}

    def plain(encoding, label) -> dict:
        return {"input_ids": encoding["input_ids"], "attention_mask": encoding["attention_mask"],
                "token_type_ids": encoding.get("token_type_ids") or [0] * len(encoding["input_ids"]),
                "labels": label}

    if task_type == NER:
        source = _file_scheme(dataset.labels)
        types = list(dict.fromkeys(split_tag(t)[1] for t in _bioes_as_bioul(dataset.labels) if t != "O"))
        labels = tuple(tag_labels(types, args.tagging_scheme))
        index = {tag: i for i, tag in enumerate(labels)}

        def to_model_tags(tags: Sequence[str]) -> list[str]:
            return convert_tags(_bioes_as_bioul(tags), source, args.tagging_scheme)

        def encode(example):
            return [index[t] for t in to_model_tags(example.tags)]

        metric_kwargs = {"scheme": args.tagging_scheme, "mode": args.ner_f1_mode}
        return _Task(task_type, labels, lambda exs: _tagging_features(exs, tokenizer, max_length, encode),
                     lambda fs: _pad_tagging(fs, pad_id, None), metric_kwargs, stats, to_model_tags)
    if task_type == PICO:
        elements = dataset.labels

        def encode_elements(example):
            return [[int(e in word) for e in elements] for word in example.elements]

        return _Task(task_type, elements, lambda exs: _tagging_features(exs, tokenizer, max_length, encode_elements),
                     lambda fs: _pad_tagging(fs, pad_id, len(elements)), {"elements": elements}, stats)
    if task_type == RELATION:
        label_index = {label: i for i, label in enumerate(dataset.labels)}
        type_map = TYPE_MAPS.get(dataset.name)
        pair = PLACEHOLDER_PAIRS.get(dataset.name) if args.task_type is None else None  # its reader checked it
        if args.relation_transformation == "markers":
            add_marker_tokens(tokenizer)

        def featurize_relations(examples):
            features = []
            for example in examples:
                if example.entities:
                    text, entities, transformation = example.text, example.entities, args.relation_transformation
                    mapping = type_map
                else:  # distributed already dummified: the placeholders are the mentions
                    text = example.text
                    entities = pair_from_placeholders(text, pair) if pair else entities_from_placeholders(text)
                    transformation = "original" if args.relation_transformation == "dummify" \
                        else args.relation_transformation
                    mapping = None
                feature = encode_relation_example(text, entities, tokenizer, transformation, max_length,
                                                  type_map=mapping, on_overflow="clip")
                stats["entities_clipped"] = stats.get("entities_clipped", 0) + int(feature["entities_clipped"])
                stats["truncated"] = stats.get("truncated", 0) + int(feature["truncated"])
                feature["labels"] = label_index[example.label]
                features.append(feature)
            return features

        if dataset.negative_label is None:
            kwargs = {}
        elif dataset.metric == "f1_positive":
            kwargs = {"positive": next(label for label in dataset.labels if label != dataset.negative_label)}
        else:
            kwargs = {"negative_labels": dataset.negative_label}
        return _Task(task_type, dataset.labels, featurize_relations,
                     lambda fs: collate_relation_features(fs, pad_id), kwargs, stats)
    if task_type == SIMILARITY:
        return _Task(task_type, (), lambda exs: [
            plain(tokenizer(e.text_a, e.text_b, truncation=True, max_length=max_length), float(e.score))
            for e in exs], lambda fs: _pad_sequences(fs, pad_id, torch.float), {}, stats)
    if task_type == CLASSIFICATION:
        return _Task(task_type, dataset.labels, lambda exs: [
            plain(tokenizer(e.text, truncation=True, max_length=max_length),
                  [float(label in e.labels) for label in dataset.labels]) for e in exs],
            lambda fs: _pad_sequences(fs, pad_id, torch.float), {"labels": list(dataset.labels)}, stats)
    label_index = {label: i for i, label in enumerate(dataset.labels)}
    return _Task(task_type, dataset.labels, lambda exs: [
        plain(tokenizer(e.question, e.context, truncation="longest_first", max_length=max_length),
              label_index[e.label]) for e in exs],
        lambda fs: _pad_sequences(fs, pad_id, torch.long), {}, stats)


def _build_model(args: FinetuneArgs, task: _Task, checked: CheckedModel) -> nn.Module:
    encoder = load_encoder(checked.directory)
    for module in encoder.modules():  # the paper's dropout 0.1 in the encoder as well as the head
        if isinstance(module, nn.Dropout):
            module.p = args.dropout
    if task.task_type == NER:
        model = TokenTaggingModel(encoder, len(task.labels), args.tagging_layer, args.dropout)
    elif task.task_type == PICO:
        if args.tagging_layer == "crf":
            raise InputError("tagging_layer 'crf' does not apply to PICO's multi-label tagging; use linear or bilstm")
        model = MultiTokenTaggingModel(encoder, len(task.labels), args.tagging_layer, args.dropout)
    elif task.task_type == SIMILARITY:
        model = SequenceClassificationModel(encoder, 1, "regression", "cls", args.dropout)
    elif task.task_type == CLASSIFICATION:
        model = SequenceClassificationModel(encoder, len(task.labels), "multi_label", "cls", args.dropout)
    else:
        representation = args.relation_representation if task.task_type == RELATION else "cls"
        model = SequenceClassificationModel(encoder, len(task.labels), "single_label", representation, args.dropout)
    # To the tokenizer's size when asked, and beyond it for marker tokens a relation task added.
    rows = max(checked.resize_to or 0, len(checked.tokenizer))
    if checked.resize_to is not None or rows > encoder.get_input_embeddings().num_embeddings:
        model.resize_token_embeddings(rows)
    return model


# ------------------------------------------------------------------------------- evaluation

def _model_inputs(batch: dict[str, torch.Tensor], task_type: str, device: torch.device) -> dict[str, torch.Tensor]:
    keep = {"input_ids", "attention_mask", "token_type_ids", "labels"}
    if task_type == NER:
        keep.add("word_mask")
    if task_type == RELATION:
        keep |= {"entity_spans", "entity_starts"}
    return {k: v.to(device) for k, v in batch.items() if k in keep}


@torch.no_grad()
def _predict(model: nn.Module, task: _Task, examples: Sequence, features: list[dict], batch_size: int,
             device: torch.device) -> list:
    """One prediction per example, in the form the task's metric takes."""
    model.eval()
    # Batches of similar lengths pad less; predictions are put back in feature order.
    order = sorted(range(len(features)), key=lambda i: len(features[i]["input_ids"]))
    outputs: list = [None] * len(features)
    for begin in range(0, len(order), batch_size):
        indices = order[begin:begin + batch_size]
        batch = task.collate([features[i] for i in indices])
        inputs = _model_inputs(batch, task.task_type, device)
        inputs.pop("labels")
        word_mask = inputs.pop("word_mask", None)
        logits = model(**inputs).logits
        if task.task_type == NER:
            predicted = model.decode_logits(logits, word_mask)
        elif task.task_type == PICO:
            predicted = model.decode_logits(logits, batch["word_mask"].to(device))
        else:
            predicted = model.predict(logits).cpu().tolist()
        for index, prediction in zip(indices, predicted):
            outputs[index] = prediction
    if task.task_type in (NER, PICO):  # windows back to sentences
        per_example: list[list] = [[] for _ in examples]
        for feature, words in zip(features, outputs):
            if len(words) != feature["num_words"]:
                raise RuntimeError(f"window of example {feature['example']} predicted {len(words)} words, "
                                   f"expected {feature['num_words']}")
            per_example[feature["example"]].extend(words)
        if task.task_type == NER:
            return [[task.labels[i] for i in words] for words in per_example]
        return [[{e for e, on in zip(task.labels, word) if on} for word in words] for words in per_example]
    if task.task_type == SIMILARITY:
        return [float(x) for x in outputs]
    if task.task_type == CLASSIFICATION:
        return [{label for label, on in zip(task.labels, row) if on} for row in outputs]
    return [task.labels[i] for i in outputs]


def _gold(task: _Task, examples: Sequence) -> list:
    if task.task_type == NER:
        return [task.to_model_tags(e.tags) for e in examples]
    if task.task_type == PICO:
        return [[set(word) for word in e.elements] for e in examples]
    if task.task_type == SIMILARITY:
        return [e.score for e in examples]
    if task.task_type == CLASSIFICATION:
        return [set(e.labels) for e in examples]
    return [e.label for e in examples]


def _evaluate(model, task, examples, features, args, metric: str, device) -> dict[str, Any]:
    predictions = _predict(model, task, examples, features, args.batch_size, device)
    return _jsonable(compute_metric(metric, _gold(task, examples), predictions,
                                    **task.metric_kwargs))


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (np.floating, np.integer, np.bool_)):
        return value.item()
    return value


# ------------------------------------------------------------------------------- run record

def _settings(args: FinetuneArgs) -> dict[str, Any]:
    return {k: v for k, v in asdict(args).items() if k not in _NOT_RESULT_SETTINGS}


def _changed_settings(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """Settings that differ; one a record predates counts as what such records were run with (its
    default then), so records stay valid when a setting is added."""
    defaults = {f.name: f.default for f in fields(FinetuneArgs)}
    before = {**defaults, **_BEFORE_RECORDED}
    return sorted(k for k in set(recorded) | set(current)
                  if recorded.get(k, before.get(k)) != current.get(k, defaults.get(k)))


def is_complete_run(path: str | Path) -> bool:
    """Whether ``path`` (a run.json) records a finished run: readable, with a test score."""
    try:
        record = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and record.get("status") == "complete" \
        and isinstance(record.get("test"), dict) and "score" in record["test"]


def _write_json(path: Path, record: dict) -> None:
    """Write through a temporary file and rename, so an interrupted run never leaves a half record
    that a resumed sweep would read as finished."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _versions() -> dict[str, str]:
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "numpy": np.__version__}


def _peak_memory(device: torch.device) -> dict[str, Any]:
    peak = {"peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            * (1 if sys.platform == "darwin" else 1024)}
    if device.type == "cuda":
        peak["cuda_max_memory_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
    return peak


def _seed_everything(seed: int) -> torch.Generator:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------------------------- training

class _PlainStepper:
    """One optimizer step in plain PyTorch: backward, clip to MAX_GRAD_NORM, step, schedule."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler) -> None:
        self.module, self.optimizer, self.scheduler = model, optimizer, scheduler

    def __call__(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        loss = self.module(**inputs).loss
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.module.parameters(), MAX_GRAD_NORM)
        self.optimizer.step()
        self.scheduler.step()
        return loss.detach()


class _DeepSpeedStepper:
    """The same step through a DeepSpeed engine (it clips, steps and schedules; mixed precision)."""

    def __init__(self, engine) -> None:
        self.module = engine

    def __call__(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        loss = self.module(**inputs).loss
        self.module.backward(loss)
        self.module.step()
        return loss.detach().float()


def train_epoch(step: "_PlainStepper | _DeepSpeedStepper", loader, task_type: str, device: torch.device, progress=None, epoch: int = 0) -> list[float]:
    """One pass over ``loader``; ``step(inputs) -> loss`` does forward, backward and the update.
    Returns the per-step losses."""
    losses = []
    step.module.train()
    for batch in loader:
        losses.append(float(step(_model_inputs(batch, task_type, device))))
        if progress is not None:
            progress.update()
            progress.set_postfix(epoch=epoch, loss=f"{losses[-1]:.3f}", refresh=False)
    return losses


def finetune_ds_config(args: FinetuneArgs, world_size: int) -> dict[str, Any]:
    """The DeepSpeed config of a fine-tuning run, generated from its arguments so that batch size,
    clipping and precision cannot disagree with the run record."""
    config: dict[str, Any] = {
        "train_batch_size": args.batch_size,
        "train_micro_batch_size_per_gpu": args.batch_size // world_size,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": MAX_GRAD_NORM,
        "steps_per_print": 10 ** 9,
        "wall_clock_breakdown": False,
        "zero_optimization": {"stage": args.zero_stage},
        "zero_allow_untested_optimizer": True,  # our AdamW is passed in as a client optimizer
    }
    if args.precision == "fp16":
        config["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    elif args.precision == "bf16":
        config["bf16"] = {"enabled": True}
    return config


@dataclass
class _Distributed:
    """Where this process runs: a single CPU/GPU process, or one rank of a DeepSpeed job."""

    rank: int
    world_size: int
    device: torch.device
    deepspeed: bool

    @classmethod
    def start(cls, args: FinetuneArgs) -> "_Distributed":
        if not args.deepspeed:
            return cls(0, 1, torch.device("cuda" if torch.cuda.is_available() else "cpu"), False)
        import deepspeed
        import torch.distributed as dist

        from biomed_lm.pretrain.trainer import ensure_distributed_env

        ensure_distributed_env()
        deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo", verbose=False)
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if torch.cuda.is_available():
            torch.cuda.set_device(local_rank)
            device = torch.device("cuda", local_rank)
        else:
            device = torch.device("cpu")
        return cls(dist.get_rank(), dist.get_world_size(), device, True)

    def micro_batch(self, batch_size: int) -> int:
        if batch_size % self.world_size:
            raise InputError(f"batch_size {batch_size} is not divisible by the {self.world_size} ranks")
        return batch_size // self.world_size

    def stepper(self, model: nn.Module, optimizer, scheduler, args: FinetuneArgs):
        if not self.deepspeed:
            return _PlainStepper(model, optimizer, scheduler)
        import deepspeed

        engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler,
                                               config=finetune_ds_config(args, self.world_size))
        return _DeepSpeedStepper(engine)

    def barrier(self) -> None:
        if self.deepspeed and self.world_size > 1:
            import torch.distributed as dist

            dist.barrier()


# ----------------------------------------------------------------------------------- the run

def run_finetune(args: FinetuneArgs, log=print) -> RunResult:
    """Fine-tune ``args.model`` on ``args.dataset`` once and write ``output_dir/run.json``.

    Skips the run when ``run.json`` already records a complete run with the same settings, and
    refuses (InputError) when it records one with different settings, so a sweep never mixes or
    overwrites results.
    """
    output_dir = Path(args.output_dir)
    record_path = output_dir / RUN_RECORD
    if is_complete_run(record_path):
        record = json.loads(record_path.read_text(encoding="utf-8"))
        # max_length by the length a run used: a record's None meant the default of its day
        recorded = dict(record.get("settings") or {})
        recorded["max_length"] = (record.get("hyperparameters") or {}).get("max_length", recorded.get("max_length"))
        changed = _changed_settings(recorded, {**_settings(args), "max_length": args.effective_max_length()})
        if changed:
            raise InputError(f"{record_path} holds a finished run with different settings ({', '.join(changed)}); "
                             "use another output_dir")
        log(f"skipping: {record_path} is complete (test {record['test']['score']:.4f})")
        return RunResult(record, True, record_path)

    started = time.time()
    dataset = load_dataset_for(args)
    for split in (TRAIN, DEV, TEST):
        if not dataset.splits.get(split):
            raise InputError(f"dataset {dataset.name!r} has no {split} examples (in {args.data_dir})")
    checked = check_model(args.model, resize_embeddings=args.resize_embeddings)
    for note in checked.notes:
        log(note)
    tokenizer = checked.tokenizer
    generator = _seed_everything(args.seed)
    task = _build_task(args, dataset, tokenizer)
    examples = {TRAIN: dataset.splits[TRAIN][:args.max_train_examples],
                DEV: dataset.splits[DEV][:args.max_eval_examples],
                TEST: dataset.splits[TEST][:args.max_eval_examples]}
    features = {split: task.featurize(exs) for split, exs in examples.items()}
    distributed = _Distributed.start(args)
    device = distributed.device
    model = _build_model(args, task, checked).to(device)

    # Every rank draws its own part of each global batch of batch_size examples.
    micro_batch = distributed.micro_batch(args.batch_size)
    sampler = None
    if distributed.world_size > 1:
        sampler = torch.utils.data.DistributedSampler(features[TRAIN], distributed.world_size, distributed.rank,
                                                      shuffle=True, seed=args.seed)
    loader = DataLoader(features[TRAIN], batch_size=micro_batch, shuffle=sampler is None, sampler=sampler,
                        generator=generator if sampler is None else None, collate_fn=task.collate,
                        num_workers=args.num_workers)
    total_steps = args.epochs * len(loader)
    optimizer = build_optimizer("adamw", parameter_groups(model, args.weight_decay), lr=args.learning_rate,
                                weight_decay=args.weight_decay, device=device).optimizer
    scheduler = build_lr_scheduler(optimizer, ScheduleConfig(warmup_ratio=args.warmup_ratio), total_steps)
    stepper = distributed.stepper(model, optimizer, scheduler, args)

    log(f"{dataset.name} ({dataset.task_type}): {len(examples[TRAIN])} train / {len(examples[DEV])} dev / "
        f"{len(examples[TEST])} test examples, {total_steps} steps")
    epochs, best_score, best_epoch, best_state = [], -math.inf, 0, None
    progress = tqdm(total=total_steps, desc=f"finetune {dataset.name}", unit="step", dynamic_ncols=True,
                    disable=distributed.rank != 0)
    for epoch in range(1, args.epochs + 1):
        if sampler is not None:
            sampler.set_epoch(epoch)
        losses = train_epoch(stepper, loader, task.task_type, device, progress, epoch)
        dev = _evaluate(model, task, examples[DEV], features[DEV], args, dataset.metric, device)
        epochs.append({"epoch": epoch, "train_loss": float(np.mean(losses)) if losses else None,
                       "dev_score": dev["score"]})
        log(f"epoch {epoch}: train loss {epochs[-1]['train_loss']:.4f}, dev {dataset.metric} {dev['score']:.4f}")
        if dev["score"] > best_score or best_state is None:  # model selection on dev
            best_score, best_epoch, best_dev = dev["score"], epoch, dev
            best_state = copy.deepcopy({k: v.detach().cpu() for k, v in model.state_dict().items()})
    progress.close()
    model.load_state_dict(best_state)
    test = _evaluate(model, task, examples[TEST], features[TEST], args, dataset.metric, device)
    log(f"test {dataset.metric} (epoch {best_epoch}): {test['score']:.4f}")

    record = {
        "status": "complete",
        "model": args.model,
        "dataset": dataset.name,
        "task_type": dataset.task_type,
        "metric": dataset.metric,
        "labels": list(dataset.labels),
        "model_check": checked.record(),
        "seed": args.seed,
        "epochs": args.epochs,
        "hyperparameters": {k: getattr(args, k) for k in (
            "learning_rate", "batch_size", "epochs", "warmup_ratio", "weight_decay", "dropout", "tagging_scheme",
            "tagging_layer", "relation_transformation", "relation_representation")}
        | {"max_length": args.effective_max_length(), "max_grad_norm": MAX_GRAD_NORM,
           "optimizer": "adamw", "lr_schedule": "slanted_triangular"},
        "settings": _settings(args),
        "examples": {split: len(exs) for split, exs in examples.items()},
        "features": {split: len(fs) for split, fs in features.items()},
        "input_stats": dict(task.stats),
        "dataset_notes": list(dataset.notes),
        "dev_per_epoch": epochs,
        "best_epoch": best_epoch,
        "best_dev_score": best_score,
        "best_dev": best_dev,
        "test_score": test["score"],
        "test": test,
        "total_steps": total_steps,
        "wall_time_s": round(time.time() - started, 3),
        "device": str(device),
        "world_size": distributed.world_size,
        "deepspeed": args.deepspeed,
        "memory": _peak_memory(device),
        "versions": _versions(),
    }
    if distributed.rank == 0:
        output_dir.mkdir(parents=True, exist_ok=True)
        _write_json(record_path, _jsonable(record))
    distributed.barrier()
    return RunResult(record, False, record_path)
