"""One fine-tuning run: a checkpoint, a dataset, a seed → a run record (``run.json``).

The paper's recipe (section 2.4): a task-specific head on the pretrained encoder, AdamW with the
slanted triangular schedule (10% warm-up), dropout 0.1, model selection on dev (the epoch with the
best dev score is kept) and that model scored on test. A sweep is many such runs, one directory
each; a run whose ``run.json`` is complete is skipped, so an interrupted sweep resumes where it
stopped.

The loop is the same for every task family: what differs (featurization, collation, the head, the
model's inputs, decoding, gold values and metric arguments) is the family's task adapter
(:mod:`finetune.adapters`, ``docs/datasets.md`` lists the datasets). :func:`run_finetune` runs in
stages: skip or refuse a finished run; data, tokenizer and features; distributed set-up, model,
loader and optimizer (:mod:`biomed_lm.backend`); epochs with dev selection; the run record.
"""

from __future__ import annotations

import copy
import hashlib
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
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, Sampler
from tqdm.auto import tqdm

from biomed_lm.atomic_files import write_json_atomically, write_lines_atomically
from biomed_lm.backend import (DistributedContext, Precision, ZeroStage, decided_on_rank0, ds_config,
                               initialize_engine, lost_rank, rank0_log, start_distributed)
from biomed_lm.config import check_fields
from biomed_lm.errors import ConfigError, InputError
from biomed_lm.finetune.adapters import ADAPTERS, TaskAdapter, adapter_for
from biomed_lm.finetune.adapters.tagging import word_windows
from biomed_lm.finetune.blurb import DEV, QA_MAX_LENGTH, TEST, TRAIN, TaskType, blurb_entry, default_max_length
from biomed_lm.finetune.metrics import DEFAULT_NER_F1_MODE, NerF1Mode, compute_metric
from biomed_lm.finetune.model_check import CheckedModel, check_input_length, check_model, resolve_model_dir
from biomed_lm.finetune.modeling import Representation, TaggingLayer, load_encoder
from biomed_lm.finetune.readers import (GENERIC_FORMATS, RARE_LABEL_COUNT, BlurbDataset, expected_split_file,
                                        load_blurb_dataset, load_generic_dataset)
from biomed_lm.finetune.relation_inputs import Transformation
from biomed_lm.finetune.tagging import SchemeName, normalize_scheme
from biomed_lm.optim import ScheduleConfig, build_lr_scheduler, build_optimizer, parameter_groups
from biomed_lm.resources import resolve_path
from biomed_lm.run_lock import ARTIFACT_LOCK_FILE, acquire_run_lock
from biomed_lm.stall import StallWatchdog

__all__ = ["RunOptions", "FinetuneArgs", "RunResult", "run_finetune", "load_dataset_for", "word_windows",
           "is_complete_run", "train_epoch", "finetune_ds_config", "RUN_RECORD", "QA_MAX_LENGTH",
           "predictions_file"]

RUN_RECORD = "run.json"
MAX_GRAD_NORM = 1.0
# Settings that do not change the result; a finished run with other values of these is still the same run.
_NOT_RESULT_SETTINGS = ("num_workers", "output_dir", "data_dir", "local_rank", "save_predictions", "stall_timeout")
# What a record written before a setting existed was run with, where that is not today's default.
_BEFORE_RECORDED = {"ner_f1_mode": "strict", "group_by_length": False}


@dataclass
class RunOptions:
    """The options of a run that are not its data, its grid point or its seed: a BLURB sweep
    (:class:`finetune.sweep.SweepArgs`) has these same fields and passes them to each of its runs,
    so an option added here is a sweep option too. Choices and ranges are checked by
    :mod:`biomed_lm.config`, from a YAML file, a flag, or code alike (:meth:`__post_init__`)."""

    model: str = field(default="", metadata={"help": "checkpoint directory (config, weights, tokenizer), or a "
                                                      "pretraining run directory (its model/ export is used)"})
    resize_embeddings: bool = field(default=False, metadata={
        "help": "resize the model's embeddings to the tokenizer's size when they differ (default: refuse)"})
    max_length: int | None = field(default=None, metadata={
        "help": "sub-words per input; default: the dataset's own (docs/datasets.md)", "min": 8})
    warmup_ratio: float = field(default=0.1, metadata={"help": "share of the schedule spent warming up",
                                                       "min": 0, "lt": 1})
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay", "min": 0})
    dropout: float = field(default=0.1, metadata={"help": "dropout of the encoder and the head", "min": 0, "lt": 1})
    tagging_scheme: SchemeName = field(default="bio", metadata={
        "help": "NER tags (iob2 and bilou are other names of bio and bioul; the run records the scheme)"})
    tagging_layer: TaggingLayer = field(default="linear", metadata={"help": "NER head over the encoder"})
    ner_f1_mode: NerF1Mode = field(default=DEFAULT_NER_F1_MODE, metadata={
        "help": "NER entity F1 reading (conlleval: seqeval's default mode, the field's convention; strict: "
                "ill-formed predicted chunks are no entities)"})
    relation_transformation: Transformation = field(default="dummify", metadata={
        "help": "relation inputs: mentions replaced by @TYPE$ placeholders (dummify, BLURB's), wrapped in "
                "[E1]/[E2] markers, or left as they are (original)"})
    relation_representation: Representation = field(default="cls", metadata={
        "help": "relation head input: [CLS], the max-pooled mentions, or the entity start tokens"})
    max_train_examples: int | None = field(default=None, metadata={"help": "first N training examples only",
                                                                    "min": 1})
    max_eval_examples: int | None = field(default=None, metadata={"help": "first N dev/test examples only",
                                                                   "min": 1})
    allow_missing_train: bool = field(default=False, metadata={
        "help": "NER datasets without a train file train on a seeded 90%% of the dev file's documents "
                "(JNLPBA as distributed here); the run record's dataset_notes say so"})
    group_by_length: bool = field(default=True, metadata={
        "help": "train on batches of similar lengths: the shuffled training set cut into mega-batches of 50 "
                "batches (fewer where that leaves under 4 mega-batches), each sorted by length (transformers' "
                "LengthGroupedSampler; on NCBI-disease 5%% of the padded positions are padding, against 56%% "
                "in uniformly shuffled batches). false: uniformly shuffled batches"})
    save_predictions: bool = field(default=True, metadata={
        "help": "write the test predictions (and those of the dev epoch kept) next to run.json, one JSON line "
                "per example (predictions_test.jsonl, predictions_dev.jsonl); false: none, for sweeps where "
                "disk matters"})
    num_workers: int = field(default=0, metadata={"help": "DataLoader worker processes", "min": 0})
    deepspeed: bool = field(default=False, metadata={
        "help": "train through DeepSpeed (launch with `deepspeed launch/finetune.py ...`); its config is "
                "generated from batch_size, precision and zero_stage"})
    precision: Precision = field(default="fp32", metadata={"help": "bf16/fp16 need --deepspeed on a GPU"})
    zero_stage: ZeroStage = field(default=0, metadata={"help": "DeepSpeed ZeRO stage"})
    stall_timeout: float = field(default=300.0, metadata={
        "help": "with several ranks, end a rank with an error after this many seconds (or 20 times its slowest "
                "step so far, if longer) without a training step (evaluation not counted), or waiting that long "
                "at the run's last barrier: a rank that freezes without exiting otherwise leaves its peers waiting "
                "in a collective for 10 (NCCL) to 30 (gloo) minutes. 0: off", "min": 0})

    def __post_init__(self) -> None:
        """Check every value as ``parse_config`` does (runs and sweeps are also built in code, from an
        ablation's YAML), then the rules between fields; a ConfigError names the field."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        for name, value in check_fields(type(self), values).items():
            setattr(self, name, value)  # as checked: an int given for a float field is a float
        self.tagging_scheme = normalize_scheme(self.tagging_scheme)
        if not self.model:
            raise ConfigError("model is required")
        if self.precision != "fp32" and not self.deepspeed:
            raise ConfigError(f"precision {self.precision} needs --deepspeed (mixed precision runs through DeepSpeed)")


@dataclass
class FinetuneArgs(RunOptions):
    """Everything one run depends on (YAML keys and command-line flags of ``launch/finetune.py``):
    the run options, and the data, grid point and seed that a sweep sets per run."""

    dataset: str = field(default="", metadata={"help": "BLURB dataset name (ncbi-disease, gad, ...) or, with "
                                                        "task_type, the name of a generic dataset"})
    data_dir: str = field(default="", metadata={"help": "directory holding the dataset's files"})
    output_dir: str = field(default="", metadata={"help": "where run.json is written"})
    task_type: TaskType | None = field(default=None, metadata={
        "help": "read data_dir in the generic format of this task family instead of as a BLURB dataset"})
    negative_label: str | None = field(default=None, metadata={
        "help": "generic relation datasets: the 'no relation' label (metric: micro F1 without it)"})
    labels: str | None = field(default=None, metadata={
        "help": "generic datasets: the label set, comma-separated (yes,no,maybe), in the model's label order; a "
                "label outside it in any split is an error naming file and line. NER: the entity types "
                f"(Chemical,Disease). Default: the training file's labels, with a warning for any seen fewer "
                f"than {RARE_LABEL_COUNT} times (docs/datasets.md)"})
    learning_rate: float = field(default=3e-5, metadata={"help": "peak learning rate", "gt": 0})
    batch_size: int = field(default=32, metadata={"help": "examples per optimizer step", "min": 1})
    epochs: int = field(default=3, metadata={"help": "training epochs (the best on dev is kept)", "min": 1})
    seed: int = field(default=42, metadata={"help": "seed of the head's weights and the data order", "min": 0})
    local_rank: int = field(default=-1, metadata={"help": "set by the deepspeed launcher"})

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("dataset", "data_dir", "output_dir"):
            if not getattr(self, name):
                raise ConfigError(f"{name} is required")
        if self.labels is not None:  # refused if empty or repeated before any data is read; one spelling recorded
            self.labels = ",".join(self.label_list())

    def label_list(self) -> tuple[str, ...] | None:
        """``labels`` as a tuple (None when not given): split on commas, spaces around them dropped."""
        if self.labels is None:
            return None
        items = tuple(item.strip() for item in self.labels.split(","))
        if not all(items):
            raise InputError(f"--labels: empty label in {self.labels!r} (give them comma-separated: yes,no,maybe)")
        repeated = next((item for n, item in enumerate(items) if item in items[:n]), None)
        if repeated is not None:
            raise InputError(f"--labels: {repeated!r} is given twice in {self.labels!r}")
        return items

    def effective_max_length(self) -> int:
        """``max_length``, or the dataset's default (:func:`finetune.blurb.default_max_length`)."""
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
    _refuse_a_contradicting_dataset(args)
    if args.task_type is not None:
        if args.allow_missing_train:
            raise InputError("allow_missing_train applies to BLURB NER datasets only (a generic dataset needs train)")
        return load_generic_dataset(args.task_type, args.data_dir, args.label_list(), name=args.dataset,
                                    negative_label=args.negative_label)
    if args.negative_label is not None:
        raise InputError("negative_label applies to generic datasets (task_type set) only")
    if args.labels is not None:  # a BLURB dataset's labels are its registry entry's; its readers check them
        raise InputError(f"--labels applies to generic datasets (--task_type set) only: BLURB dataset "
                         f"{args.dataset!r} has its own fixed labels")
    return load_blurb_dataset(args.dataset, args.data_dir, allow_missing_train=args.allow_missing_train)


def _refuse_a_contradicting_dataset(args: FinetuneArgs) -> None:
    """A BLURB dataset's name with another task family's ``task_type``, or with the folder of another BLURB
    dataset: each was read as what the reader expected and failed on its first line with a message about the
    file (QA: "@GENE$ placeholders" for NCBI-disease's train.tsv), not about the contradiction."""
    named = _blurb_entry_or_none(args.dataset)
    if args.task_type is not None:
        if named is not None and named.task_type != args.task_type:
            raise InputError(f"dataset {args.dataset!r} is BLURB's {named.task_type} dataset {named.title}, and "
                             f"task_type {args.task_type} reads data_dir as a generic {args.task_type} dataset: drop "
                             "task_type to read it as BLURB's, or name your generic dataset otherwise")
        return
    folder = _blurb_entry_or_none(Path(args.data_dir).name) if args.data_dir else None
    if named is not None and folder is not None and folder.name != named.name:
        raise InputError(f"dataset {args.dataset!r}, but data_dir {args.data_dir} is the folder of {folder.name!r} "
                         f"(a config's data_dir with another --dataset?): pass data_dir {named.name}'s folder "
                         f"({' or '.join(named.directories)} under the BLURB data root)")


def _blurb_entry_or_none(name: str):
    try:
        return blurb_entry(name)
    except InputError:
        return None


def _warn_about_options_of_other_tasks(args: FinetuneArgs, task: TaskAdapter, log) -> None:
    """An option of another task family set away from its default has no effect on this run: said, not silent
    (QA: --relation_representation entity_start on an NER dataset)."""
    defaults = {f.name: f.default for f in fields(FinetuneArgs)}
    others = {option for adapter in ADAPTERS.values() for option in adapter.options} - set(task.options)
    for option in sorted(others):
        if getattr(args, option) != defaults.get(option):
            log(f"warning: {option} {getattr(args, option)} has no effect on {task.dataset.name} "
                f"({task.task_type}); it applies to "
                f"{', '.join(a.family for a in ADAPTERS.values() if option in a.options)} datasets")


def _build_task(args: FinetuneArgs, dataset: BlurbDataset, tokenizer) -> TaskAdapter:
    """The task adapter of the dataset's family, for this run."""
    return adapter_for(dataset.task_type)(args, dataset, tokenizer)


def _build_model(args: FinetuneArgs, task: TaskAdapter, checked: CheckedModel) -> nn.Module:
    """The encoder (the paper's dropout in it as well as the head) under the task's head, its
    embeddings resized to the tokenizer when asked, and beyond it for marker tokens a task added."""
    encoder = load_encoder(checked.directory)
    for module in encoder.modules():
        if isinstance(module, nn.Dropout):
            module.p = args.dropout
    model = task.build_head(encoder)
    rows = max(checked.resize_to or 0, len(checked.tokenizer))
    if checked.resize_to is not None or rows > encoder.get_input_embeddings().num_embeddings:
        model.resize_token_embeddings(rows)
    return model


# ------------------------------------------------------------------------------- evaluation

@torch.no_grad()
def _predict(model: nn.Module, task: TaskAdapter, examples: Sequence, features: list[dict], batch_size: int,
             device: torch.device) -> list:
    """One prediction per example, in the form the task's metric takes."""
    model.eval()
    # Batches of similar lengths pad less; predictions are put back in feature order.
    order = sorted(range(len(features)), key=lambda i: len(features[i]["input_ids"]))
    outputs: list = [None] * len(features)
    for begin in range(0, len(order), batch_size):
        indices = order[begin:begin + batch_size]
        predicted = task.predict_batch(model, task.collate([features[i] for i in indices]), device)
        for index, prediction in zip(indices, predicted):
            outputs[index] = prediction
    return task.predictions(examples, features, outputs)


def _gold(task: TaskAdapter, examples: Sequence) -> list:
    return task.gold(examples)


def _evaluate(model, task: TaskAdapter, examples, features, args, metric: str, device) -> dict[str, Any]:
    """The metric's result alone (benchmarks/bench_finetune.py scores this way)."""
    return _evaluated(model, task, examples, features, args, metric, device)[0]


def _evaluated(model, task: TaskAdapter, examples, features, args, metric: str, device) -> tuple[dict[str, Any], list]:
    """The metric's result and the predictions it scored (one per example, as the metric takes them)."""
    predictions = _predict(model, task, examples, features, args.batch_size, device)
    scores = compute_metric(metric, _gold(task, examples), predictions, **task.metric_kwargs())
    return _jsonable(scores), predictions


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (np.floating, np.integer, np.bool_)):
        return value.item()
    return value


# ------------------------------------------------------------------------------- run record

def run_settings(args: FinetuneArgs) -> dict[str, Any]:
    settings = {k: v for k, v in asdict(args).items() if k not in _NOT_RESULT_SETTINGS}
    return {**settings, "model": _model_path(args.model)}


def _model_path(model: Any) -> Any:
    """The model folder as an absolute path with links resolved, a pretraining run folder as its ``model/``
    export: the same checkpoint named from another working directory, through a link, or by its run folder
    (QA: refused as another model), is the same run's model."""
    if not isinstance(model, str) or not model:
        return model
    path = resolve_path(model)
    if not path.exists():
        return model
    try:
        path, _ = resolve_model_dir(path)
    except InputError:  # not a checkpoint folder: compared as it is named (check_model says what is wrong)
        pass
    return str(path.resolve())


#: The suffixes of the files the dataset readers read (finetune/readers); a record holds their checksums.
_DATA_SUFFIXES = (".tsv", ".txt", ".jsonl", ".json")


def data_fingerprint(data_dir: str | os.PathLike) -> dict[str, str]:
    """sha256 of each data file directly in ``data_dir``, by name (a README or a license is not data). A
    finished run is skipped only over the same data: another folder holding the same files is the same."""
    root = resolve_path(data_dir)
    if not root.is_dir():
        return {}
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.iterdir())
            if p.is_file() and p.suffix.lower() in _DATA_SUFFIXES}


def _changed_data(recorded: Mapping[str, str] | None, current: Mapping[str, str]) -> list[str]:
    """The data files that differ from a record's (changed, added, removed); none for a record that
    predates the checksums."""
    if recorded is None:
        return []
    return sorted(name for name in set(recorded) | set(current) if recorded.get(name) != current.get(name))


def changed_settings(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """Settings that differ; one a record predates counts as what such records were run with (its
    default then), so records stay valid when a setting is added."""
    return sorted(_setting_changes(recorded, current))


def _setting_changes(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Each setting that differs: (the record's value, today's), as :func:`changed_settings` compares them."""
    defaults = {f.name: f.default for f in fields(FinetuneArgs)}
    before = {**defaults, **_BEFORE_RECORDED}
    compared = {key: (recorded.get(key, before.get(key)), current.get(key, defaults.get(key)))
                for key in set(recorded) | set(current)}
    return {k: values for k, values in compared.items() if values[0] != values[1]}


def is_complete_run(path: str | Path) -> bool:
    """Whether ``path`` (a run.json) records a finished run: readable, with a test score."""
    try:
        record = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and record.get("status") == "complete" \
        and isinstance(record.get("test"), dict) and "score" in record["test"]


def predictions_file(split: str) -> str:
    """The name of a split's predictions file in a run's directory (``predictions_test.jsonl``)."""
    return f"predictions_{split}.jsonl"


def _write_jsonl(path: Path, rows: Sequence[dict]) -> None:
    """One JSON object a line; a file named in ``run.json`` is always whole (:mod:`biomed_lm.atomic_files`)."""
    write_lines_atomically(path, (json.dumps(_jsonable(row), ensure_ascii=False) + "\n" for row in rows))


def _versions() -> dict[str, str]:
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "numpy": np.__version__}


def _reset_peak_rss() -> str:
    """Start this run's peak-RSS window where the system allows it (Linux: writing 5 to
    /proc/self/clear_refs resets the high-water mark that ru_maxrss reads), so each run of a sweep
    in one process records its own peak. Returns the scope of the peak: "run" or "process"."""
    try:
        Path("/proc/self/clear_refs").write_text("5", encoding="ascii")
    except OSError:
        return "process"
    return "run"


def _peak_memory(device: torch.device, rss_scope: str) -> dict[str, Any]:
    """The run's peak memory: process RSS (since :func:`_reset_peak_rss`, ``peak_rss_scope`` says
    whether that is the run or the whole process) and, on a GPU, the allocator's peak since the run
    started (:func:`_prepare_training` resets it)."""
    peak = {"peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            * (1 if sys.platform == "darwin" else 1024), "peak_rss_scope": rss_scope}
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


#: The host reads the steps' losses back once per this many steps (and at the epoch's end), not after each:
#: a read waits for the device, and a step that waits cannot queue the next one while the device runs.
LOSS_READS_EVERY = 32


def train_epoch(step: "_PlainStepper | _DeepSpeedStepper", loader, task: TaskAdapter, device: torch.device,
                progress=None, epoch: int = 0, beat: Callable[[], None] = lambda: None) -> list[float]:
    """One pass over ``loader``; ``step(inputs) -> loss`` does forward, backward and the update on
    the inputs ``task`` picks from each batch, and ``beat()`` follows each (a stall watchdog's). Returns
    the per-step losses, kept on the device and read back :data:`LOSS_READS_EVERY` steps at a time (the
    progress bar's loss is the last one read)."""
    losses: list[float] = []
    unread: list[torch.Tensor] = []
    step.module.train()
    if progress is not None:  # the epoch now, not with the next loss read (QA: epoch=1 shown 15 steps into 2)
        progress.set_postfix(epoch=epoch, refresh=False)
    for batch in loader:
        unread.append(step(task.inputs(batch, device)))
        if progress is not None:
            progress.update()
        if len(unread) == LOSS_READS_EVERY:
            losses += _read_losses(unread, progress, epoch)
        beat()
    return losses + (_read_losses(unread, progress, epoch) if unread else [])


def _read_losses(unread: list[torch.Tensor], progress, epoch: int) -> list[float]:
    """The ``unread`` losses as floats, in one transfer (the list is emptied)."""
    read = torch.stack([loss.float() for loss in unread]).tolist()
    unread.clear()
    if progress is not None:
        progress.set_postfix(epoch=epoch, loss=f"{read[-1]:.3f}", refresh=False)
    return read


def finetune_ds_config(args: FinetuneArgs, world_size: int) -> dict[str, Any]:
    """The DeepSpeed config of a fine-tuning run (:func:`biomed_lm.backend.ds_config`), generated from
    its arguments so that batch size, clipping and precision cannot disagree with the run record.
    One step per batch (no accumulation); bf16 as torch autocast with fp32 weights (HF ``Trainer``'s bf16)."""
    return ds_config(global_batch_size=args.batch_size, micro_batch_size=args.batch_size // world_size,
                     gradient_accumulation_steps=1, max_grad_norm=MAX_GRAD_NORM, precision=args.precision,
                     zero_stage=args.zero_stage)


def _micro_batch(distributed: DistributedContext, batch_size: int) -> int:
    """Every rank draws its own part of each global batch of ``batch_size`` examples."""
    if batch_size % distributed.world_size:
        raise InputError(f"batch_size {batch_size} is not divisible by the {distributed.world_size} ranks")
    return batch_size // distributed.world_size


def _stepper(distributed: DistributedContext, model: nn.Module, optimizer, scheduler, args: FinetuneArgs):
    if not distributed.deepspeed:
        return _PlainStepper(model, optimizer, scheduler)
    config = finetune_ds_config(args, distributed.world_size)
    return _DeepSpeedStepper(initialize_engine(model, optimizer, scheduler, config))


def _barrier(distributed: DistributedContext) -> None:
    if distributed.deepspeed and distributed.world_size > 1:
        import torch.distributed as dist

        dist.barrier()


# ------------------------------------------------------------------------- the run, in stages

@dataclass
class _Data:
    """Stage 2's result: the dataset, the checked model directory, the task and its features."""

    dataset: BlurbDataset
    checked: CheckedModel
    task: TaskAdapter
    examples: dict[str, list]
    features: dict[str, list[dict]]
    generator: torch.Generator
    slice_warnings: list[str]      # what --max_*_examples left unfit to score (run.json's slice_warnings)


@dataclass
class _Training:
    """Stage 3's result: where the run trains, and what."""

    distributed: DistributedContext
    model: nn.Module
    loader: DataLoader  # its sampler sets the training order (_training_order)
    stepper: Any
    total_steps: int


@dataclass
class _Selection:
    """Stage 4's result: the dev score per epoch, the epoch kept (its weights are loaded) and the
    seconds spent in training steps (dev scoring excluded)."""

    epochs: list[dict[str, Any]] = field(default_factory=list)
    best_epoch: int = 0
    best_score: float = -math.inf
    best_dev: dict[str, Any] = field(default_factory=dict)
    best_dev_predictions: list = field(default_factory=list)  # computed for selection anyway: kept for the file
    train_time_s: float = 0.0


def _finished_run(args: FinetuneArgs, record_path: Path, data_files: Mapping[str, str], log) -> RunResult | None:
    """Stage 1: the recorded result when ``record_path`` holds a complete run with the same settings over
    the same data files; InputError when it holds one with other settings or data; None when there is none."""
    record = finished_record(args, record_path, data_files)
    if record is None:
        return None
    log(f"skipping: {record_path} is complete (test {record['test']['score']:.4f})")
    if args.save_predictions and not _has_predictions(record, record_path.parent):
        # Still finished: the weights are not kept, so the predictions could only come from training again.
        log(f"note: {record_path} has no {predictions_file(TEST)} (recorded before runs wrote one, with "
            f"save_predictions false, or the file was removed); delete {record_path} to run again and write it")
    return RunResult(record, True, record_path)


def _has_predictions(record: Mapping[str, Any], directory: Path) -> bool:
    """Whether a record names its test predictions file and the file is there."""
    named = (record.get("predictions") or {}).get(TEST) or {}
    return bool(named.get("file")) and (directory / named["file"]).is_file()


def finished_record(args: FinetuneArgs, record_path: Path, data_files: Mapping[str, str]) -> dict | None:
    """The record at ``record_path`` when it is a complete run of ``args`` over ``data_files``; None when
    there is no complete run; InputError naming what differs when it is one with other settings or data
    (a sweep asks this of every run before it starts any)."""
    if not is_complete_run(record_path):
        return None
    record = json.loads(record_path.read_text(encoding="utf-8"))
    # max_length by the length a run used: a record's None meant the default of its day
    recorded = dict(record.get("settings") or {})
    recorded["max_length"] = (record.get("hyperparameters") or {}).get("max_length", recorded.get("max_length"))
    recorded["model"] = _model_path(recorded.get("model"))  # a record of a relative path, from today's directory
    current = {**run_settings(args), "max_length": args.effective_max_length()}
    changed = _setting_changes(recorded, current)
    if changed:
        values = ", ".join(f"{key}: {was!r} recorded, {now!r} now" for key, (was, now) in sorted(changed.items()))
        raise InputError(f"{record_path} holds a finished run with different settings ({values}); "
                         f"use another output_dir, or delete {record_path} to run again with these settings")
    changed = _changed_data(record.get("data_files"), data_files)
    if changed:
        raise InputError(f"{record_path} holds a finished run over other data: {', '.join(changed)} in "
                         f"{args.data_dir} differ from the files it was trained and scored on; use another "
                         f"output_dir, or delete {record_path} to run again")
    return record


def _no_split(args: FinetuneArgs, dataset: str, split: str) -> str:
    """A dataset without one of the three splits: fine-tuning keeps the epoch best on dev and scores it on
    test. For a user's own files the message names the file it looked for."""
    where = f"(in {args.data_dir})"
    if args.task_type is not None:
        extensions = GENERIC_FORMATS[args.task_type].extensions
        where = f"expected {expected_split_file(resolve_path(args.data_dir), split, extensions)}"
    return (f"dataset {dataset!r} has no {split} examples: {where}; fine-tuning keeps the epoch best on dev "
            "and reports its test score, so it needs train, dev and test")


def _prepare_data(args: FinetuneArgs, log) -> _Data:
    """Stage 2: the dataset (every split present), the checked model and tokenizer, the seeded
    generator, the task adapter and the features of each split."""
    dataset = load_dataset_for(args)
    for split in (TRAIN, DEV, TEST):
        if not dataset.splits.get(split):
            raise InputError(_no_split(args, dataset.name, split))
    for warning in dataset.warnings:
        log(f"warning: {warning}")
    checked = check_model(args.model, resize_embeddings=args.resize_embeddings)
    check_input_length(args.effective_max_length(), args.max_length is not None, checked)
    for note in checked.notes:
        log(note)
    generator = _seed_everything(args.seed)
    task = _build_task(args, dataset, checked.tokenizer)
    _warn_about_options_of_other_tasks(args, task, log)
    examples = {split: task.select(split, dataset.splits[split][:limit]) for split, limit in
                ((TRAIN, args.max_train_examples), (DEV, args.max_eval_examples), (TEST, args.max_eval_examples))}
    for line in task.summary():
        log(line)
    slice_warnings = _one_label_slices(args, dataset, examples)
    for line in slice_warnings:
        log(f"warning: {line}")
    if not examples[TRAIN]:
        raise InputError(f"dataset {dataset.name!r}: no training example is left to train on (see above)")
    features = {split: task.featurize(exs) for split, exs in examples.items()}
    return _Data(dataset, checked, task, examples, features, generator, slice_warnings)


def _one_label_slices(args: FinetuneArgs, dataset, examples: Mapping[str, Sequence]) -> list[str]:
    """A split that ``--max_*_examples`` cut down to examples of one label where the whole split has several
    (QA: the first 200 of GAD's test file are all positive, and F1 1.0 came without a word)."""
    lines = []
    for split, limit, flag in ((TRAIN, args.max_train_examples, "max_train_examples"),
                               (DEV, args.max_eval_examples, "max_eval_examples"),
                               (TEST, args.max_eval_examples, "max_eval_examples")):
        full = dataset.splits[split]
        if limit is None or limit >= len(full) or not isinstance(getattr(full[0], "label", None), (str, int)):
            continue
        kept, labels = {e.label for e in examples[split]}, {e.label for e in full}
        if len(kept) == 1 and len(labels) > 1:
            lines.append(f"--{flag} {limit} keeps the first {len(examples[split])} {split} examples, all labelled "
                         f"{next(iter(kept))!r} (the whole split has {len(labels)} labels): scores on them say little")
    return lines


def _prepare_training(args: FinetuneArgs, data: _Data, distributed: DistributedContext) -> _Training:
    """Stage 3: the model, the shuffled (or distributed) loader, AdamW with the slanted triangular
    schedule, and the stepper (plain PyTorch or a DeepSpeed engine)."""
    if distributed.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(distributed.device)
    model = _build_model(args, data.task, data.checked).to(distributed.device)
    loader = _training_loader(args, data, distributed)
    total_steps = args.epochs * len(loader)
    optimizer = build_optimizer("adamw", parameter_groups(model, args.weight_decay), lr=args.learning_rate,
                                weight_decay=args.weight_decay, device=distributed.device).optimizer
    scheduler = build_lr_scheduler(optimizer, ScheduleConfig(warmup_ratio=args.warmup_ratio), total_steps)
    return _Training(distributed, model, loader, _stepper(distributed, model, optimizer, scheduler, args), total_steps)


def _training_loader(args: FinetuneArgs, data: _Data, distributed: DistributedContext) -> DataLoader:
    """This rank's training batches. The seeded generator also draws the loader's base seed, first, as
    the shuffling loader of runs before ``group_by_length`` did: their order is kept exactly."""
    # Pinned batches move to a GPU without the host waiting for the copy (TaskAdapter.inputs).
    return DataLoader(data.features[TRAIN], batch_size=_micro_batch(distributed, args.batch_size),
                      sampler=_training_order(args, data, distributed), generator=data.generator,
                      collate_fn=data.task.collate, num_workers=args.num_workers,
                      pin_memory=distributed.device.type == "cuda")


def _training_order(args: FinetuneArgs, data: _Data, distributed: DistributedContext) -> Sampler:
    """Each epoch's order of the training features: shuffled by the run's seeded generator (one
    process) or by seed and epoch (several ranks, each taking its share of every global batch); with
    ``group_by_length``, in batches of similar lengths, which the collator pads to less."""
    from transformers.trainer_pt_utils import LengthGroupedSampler

    features = data.features[TRAIN]
    if not args.group_by_length:
        if distributed.world_size > 1:
            return DistributedSampler(features, distributed.world_size, distributed.rank, shuffle=True, seed=args.seed)
        return RandomSampler(features, generator=data.generator)
    lengths = [len(feature["input_ids"]) for feature in features]
    if distributed.world_size > 1:
        return _DistributedLengthGroupedSampler(lengths, args.batch_size, distributed.world_size, distributed.rank,
                                                args.seed)
    return LengthGroupedSampler(args.batch_size, lengths=lengths, generator=data.generator)


class _DistributedLengthGroupedSampler(DistributedSampler):
    """A rank's share of each epoch's length-grouped order (transformers' grouping, seeded by seed and
    epoch), grouped by global batch and dealt out, so each rank's micro-batches are alike in length too;
    shares as ``DistributedSampler`` makes them (the last global batch topped up from the epoch's start).
    transformers' own ``DistributedLengthGroupedSampler`` fails with fewer than half as many features
    as ranks."""

    def __init__(self, lengths: list[int], global_batch_size: int, world_size: int, rank: int, seed: int) -> None:
        super().__init__(range(len(lengths)), world_size, rank, shuffle=True, seed=seed)
        self.lengths, self.global_batch_size = lengths, global_batch_size

    def __iter__(self):
        from transformers.trainer_pt_utils import get_length_grouped_indices

        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = get_length_grouped_indices(self.lengths, self.global_batch_size, generator=generator)
        order = (order * math.ceil(self.total_size / len(order)))[:self.total_size]
        return iter(order[self.rank:self.total_size:self.num_replicas])


def _train_and_select(args: FinetuneArgs, data: _Data, run: _Training, log) -> _Selection:
    """Stage 4: the epochs, each scored on dev; the best dev epoch's weights are kept and loaded."""
    selection, best_state = _Selection(), None
    progress = tqdm(total=run.total_steps, desc=f"finetune {data.dataset.name}", unit="step", dynamic_ncols=True,
                    disable=run.distributed.rank != 0)
    rank, ranks, epoch = run.distributed.rank, run.distributed.world_size, 1
    watchdog = _watchdog(args, run.distributed, lambda: (
        f"rank {rank} of {ranks} ends in epoch {epoch} rather than wait in a collective for the process group's "
        "timeout: a rank stopped answering without exiting (a stopped node, a network partition, a hung device). "
        "This run is not recorded: the same command starts it again (complete runs are skipped)"))
    try:
        for epoch in range(1, args.epochs + 1):
            if _train_and_score_epoch(args, data, run, selection, epoch, progress, watchdog, log):
                best_state = copy.deepcopy({k: v.detach().cpu() for k, v in run.model.state_dict().items()})
    finally:  # the bar closed on any way out: an error's line then starts on a line of its own
        watchdog.stop()
        progress.close()
    run.model.load_state_dict(best_state)
    return selection


def _watchdog(args: FinetuneArgs, distributed: DistributedContext, describe) -> StallWatchdog:
    """The stall watchdog of a run of several ranks (off for one: nothing to wait for)."""
    return StallWatchdog(args.stall_timeout if distributed.world_size > 1 else 0, program="finetune",
                         describe=describe)


def _train_and_score_epoch(args: FinetuneArgs, data: _Data, run: _Training, selection: _Selection, epoch: int,
                           progress, watchdog: StallWatchdog, log) -> bool:
    """One epoch, scored on dev and added to ``selection``: whether it is the best so far (model selection)."""
    metric, device = data.dataset.metric, run.distributed.device
    if isinstance(run.loader.sampler, DistributedSampler):
        run.loader.sampler.set_epoch(epoch)
    started = time.perf_counter()
    losses = train_epoch(run.stepper, run.loader, data.task, device, progress, epoch, beat=watchdog.beat)
    selection.train_time_s += time.perf_counter() - started
    with watchdog.paused():  # every rank scores all of dev on its own: no collective, and not a stall
        dev, dev_predictions = _evaluated(run.model, data.task, data.examples[DEV], data.features[DEV], args, metric,
                                          device)
    selection.epochs.append({"epoch": epoch, "train_loss": float(np.mean(losses)) if losses else None,
                             "dev_score": dev["score"]})
    log(f"epoch {epoch}: train loss {selection.epochs[-1]['train_loss']:.4f}, dev {metric} {dev['score']:.4f}")
    if dev["score"] > selection.best_score or not selection.best_epoch:
        selection.best_score, selection.best_epoch, selection.best_dev = dev["score"], epoch, dev
        selection.best_dev_predictions = dev_predictions
        return True
    return False


_HYPERPARAMETERS = ("learning_rate", "batch_size", "epochs", "warmup_ratio", "weight_decay", "dropout")


def _run_record(args: FinetuneArgs, data: _Data, run: _Training, selection: _Selection, test: dict[str, Any],
                started: float, rss_scope: str) -> dict[str, Any]:
    """Stage 5: everything the run depended on and produced, as ``run.json`` holds it."""
    dataset, device = data.dataset, run.distributed.device
    return {
        "status": "complete", "model": args.model, "dataset": dataset.name, "task_type": dataset.task_type,
        "metric": dataset.metric, "labels": list(dataset.labels), "model_check": data.checked.record(),
        "seed": args.seed, "epochs": args.epochs,
        "hyperparameters": {k: getattr(args, k) for k in _HYPERPARAMETERS + data.task.options}
        | {"max_length": args.effective_max_length(), "max_grad_norm": MAX_GRAD_NORM,
           "optimizer": "adamw", "lr_schedule": "slanted_triangular"},
        "settings": run_settings(args),
        "examples": {split: len(exs) for split, exs in data.examples.items()},
        "features": {split: len(fs) for split, fs in data.features.items()},
        "input_stats": dict(data.task.stats), "input_details": _jsonable(data.task.details),
        "dataset_notes": list(dataset.notes), "dataset_warnings": list(dataset.warnings),
        "dataset_differs_from_blurb": dataset.differs_from_blurb,
        "slice_warnings": data.slice_warnings,
        "dev_per_epoch": selection.epochs, "best_epoch": selection.best_epoch,
        "best_dev_score": selection.best_score, "best_dev": selection.best_dev,
        "test_score": test["score"], "test": test, "predictions": None, "total_steps": run.total_steps,
        "wall_time_s": round(time.time() - started, 3), "train_time_s": round(selection.train_time_s, 3),
        "device": str(device), "world_size": run.distributed.world_size, "deepspeed": args.deepspeed,
        "memory": _peak_memory(device, rss_scope), "versions": _versions(),
    }


def _prediction_rows(args: FinetuneArgs, data: _Data, predicted: Mapping[str, list]) -> dict[str, list[dict]]:
    """Per split, the rows of its predictions file (the task adapter shapes them); none when not saved."""
    if not args.save_predictions:
        return {}
    task = data.task
    return {split: task.prediction_rows(data.examples[split], task.gold(data.examples[split]), predictions)
            for split, predictions in predicted.items()}


def _predictions_entry(data: _Data, selection: _Selection, files: Mapping[str, list]) -> dict[str, Any] | None:
    """``run.json``'s ``predictions``: each file with its line count, and the metric's arguments, so a
    score can be recomputed from a file alone (``compute_metric(metric, golds, predictions, **metric_kwargs)``)."""
    if not files:
        return None
    entry: dict[str, Any] = {split: {"file": predictions_file(split), "lines": len(rows)}
                             for split, rows in files.items()}
    if DEV in entry:
        entry[DEV]["epoch"] = selection.best_epoch
    return {**entry, "metric": data.dataset.metric, "metric_kwargs": _jsonable(data.task.metric_kwargs())}


def _write_predictions(directory: Path, files: Mapping[str, list]) -> None:
    """Write each split's predictions file; with none to write, remove one an earlier run left here, which
    the new record would not name and which would not be its predictions."""
    for split in (TEST, DEV):
        path = directory / predictions_file(split)
        if split in files:
            _write_jsonl(path, files[split])
        else:
            path.unlink(missing_ok=True)


def run_finetune(args: FinetuneArgs, log=print, data_files: Mapping[str, str] | None = None) -> RunResult:
    """Fine-tune ``args.model`` on ``args.dataset`` once and write ``output_dir/run.json``.

    Skips the run when ``run.json`` already records a complete run with the same settings over the same
    data files, and refuses (InputError) when it records one with different settings or data, so a sweep
    never mixes or overwrites results. One run at a time owns ``output_dir`` (:mod:`biomed_lm.run_lock`,
    held by rank 0): a second one is refused (``RunDirectoryLocked``) before it reads anything there.
    ``data_files`` is ``data_fingerprint(args.data_dir)`` when the caller has it (a sweep hashes each
    dataset once, not once per run).
    """
    distributed = start_distributed(args.deepspeed, "finetune")
    log = rank0_log(distributed.rank, log)
    lock = decided_on_rank0(distributed.rank, lambda: acquire_run_lock(args.output_dir, ARTIFACT_LOCK_FILE),
                            share=False)
    failed = True
    try:
        result = _run_finetune(args, distributed, log, data_files)
        failed = False
        return result
    except Exception as err:
        lost = lost_rank(err, distributed.rank, distributed.world_size, "This run did not finish and is not "
                         "recorded: the same command starts it again (complete runs are skipped)")
        if lost is None:
            raise
        raise lost from err
    finally:
        if lock is not None:  # a refused run leaves no folder behind (nothing else was written in it)
            lock.release(failed=failed)


def _run_finetune(args: FinetuneArgs, distributed: DistributedContext, log,
                  data_files: Mapping[str, str] | None) -> RunResult:
    record_path = Path(args.output_dir) / RUN_RECORD
    data_files = data_fingerprint(args.data_dir) if data_files is None else dict(data_files)
    finished = _finished_run(args, record_path, data_files, log)
    if finished is not None:
        return finished
    started, rss_scope = time.time(), _reset_peak_rss()
    data = _prepare_data(args, log)
    run = _prepare_training(args, data, distributed)
    log(f"{data.dataset.name} ({data.dataset.task_type}): {len(data.examples[TRAIN])} train / "
        f"{len(data.examples[DEV])} dev / {len(data.examples[TEST])} test examples, {run.total_steps} steps")
    selection = _train_and_select(args, data, run, log)
    test, test_predictions = _evaluated(run.model, data.task, data.examples[TEST], data.features[TEST], args,
                                        data.dataset.metric, run.distributed.device)
    log(f"test {data.dataset.metric} (epoch {selection.best_epoch}): {test['score']:.4f}")
    prediction_warnings = data.task.degenerate(data.task.gold(data.examples[TEST]), test_predictions)
    for line in prediction_warnings:
        log(f"warning: {line}")
    record = {**_run_record(args, data, run, selection, test, started, rss_scope), "data_files": data_files,
              "prediction_warnings": prediction_warnings}
    files = _prediction_rows(args, data, {TEST: test_predictions, DEV: selection.best_dev_predictions})
    record["predictions"] = _predictions_entry(data, selection, files)
    if run.distributed.rank == 0:
        record_path.parent.mkdir(parents=True, exist_ok=True)
        _write_predictions(record_path.parent, files)  # before run.json: a record never names a missing file
        write_json_atomically(record_path, _jsonable(record))  # a half record never reads as finished
    _last_barrier(args, run.distributed, record_path)
    return RunResult(record, False, record_path)


def _last_barrier(args: FinetuneArgs, distributed: DistributedContext, record_path: Path) -> None:
    """Every rank waits here for rank 0's writing, watched as the steps are: a rank that froze here, or
    while writing, would leave the others in the barrier for the process group's timeout."""
    rank, ranks = distributed.rank, distributed.world_size
    watchdog = _watchdog(args, distributed, lambda: (
        f"rank {rank} of {ranks} ends at the run's last barrier, where rank 0 writes {record_path}: a rank "
        "stopped answering without exiting. The run is complete if that file exists (the same command then "
        "skips it); otherwise the same command starts it again"))
    watchdog.beat()
    try:
        _barrier(distributed)
    finally:
        watchdog.stop()
