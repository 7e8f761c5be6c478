#!/usr/bin/env python
"""Fine-tuning: our training loop against HF ``Trainer``, same model, data, batch size, epochs and
learning-rate schedule; training examples/s, peak memory and dev/test F1 of both, per task.

    python benchmarks/bench_finetune.py                                   # cuda if available, else cpu
    python benchmarks/bench_finetune.py --device cuda --model bert-base --epochs 2   # bf16 on a GPU
    python benchmarks/bench_finetune.py --device cpu --model minilm --train-examples 250
    python benchmarks/bench_finetune.py --quick --device cpu              # the test's run: seconds

Tasks (``--tasks``, default both):

* ``ner``: NCBI-disease (BLURB; the committed ``data/blurb/NCBI-disease`` files, or ``--ner-data``),
  BIO tags, linear head, entity F1 (seqeval's conlleval mode, the run's default).
* ``relation``: GAD (BLURB's ``gad_blurb_{train,dev,test}.tsv``, sentences with ``@GENE$``/``@DISEASE$``
  in place of the pair), from ``--relation-data`` (e.g. a BLURB ``re/gad`` folder). Without it
  (as on a lent GPU machine), a GAD-format set derived from the committed NCBI-disease files:
  each sentence with two or more disease mentions gives one row per pair of consecutive mentions,
  the first written ``@GENE$`` and the second ``@DISEASE$``, label 1 when at most two words
  separate them (``X and Y``, ``X , Y``), else 0; run as a generic relation dataset (negative
  label 0). The JSON's ``relation_source`` says which was used. F1 of the positive class.

Models (``--model``): ``bert-base`` (default on cuda): BERT-base shape (12 x 768, 3072, 12 heads,
512 positions) randomly initialized (seed ``--seed``), nothing being downloadable; ``minilm``
(default on cpu): the packaged all-MiniLM-L6-v2, a real 6 x 384 BERT
(``biomed_lm.reference_models.general_bert_dir()``); ``tiny`` (``--quick``): 2 x 64 random; or a
checkpoint directory. The random models get the tokenizer of ``--tokenizer`` (a directory), else
all-MiniLM-L6-v2's (bert-base-uncased's 30,522 WordPiece tokens) when installed, else a WordPiece
vocabulary trained on the tasks' training text (``tokenizers``; the JSON's ``tokenizer_source`` says
which); their embedding table has the tokenizer's size. Randomly initialized models learn little in
a few epochs: their F1 checks that both loops learn alike, not the model.

Methods, per task, in this order in one process:

* ``hf_trainer`` (baseline): ``AutoModelForTokenClassification`` / ``AutoModelForSequenceClassification``
  from the same checkpoint (the sequence head reads BERT's pooler, ours the raw [CLS] state: one
  768 x 768 layer more), the examples tokenized the standard HF way (one batched fast-tokenizer
  call, ``truncation=True, max_length=L``; NER: the word's label on its first sub-word, -100
  elsewhere), ``DataCollatorForTokenClassification`` / ``DataCollatorWithPadding`` and ``Trainer``
  with ``TrainingArguments(bf16=<precision is bf16>, use_cpu=<device is cpu>, warmup_steps=0.1,
  weight_decay=0.01, max_grad_norm=1.0, lr_scheduler_type="linear", report_to="none",
  save/eval/logging_strategy="no", dataloader_num_workers=0)`` (a float ``warmup_steps`` is the
  warm-up ratio in transformers 5.x; the default optimizer is ``adamw_torch_fused``; bf16 is torch
  autocast with fp32 weights). Features are a plain list of dicts (no ``datasets``). Its training order is
  transformers' default, uniformly shuffled batches.
* ``hf_grouped`` (``--grouped-baseline``): the same with transformers' length-grouped order
  (``train_sampling_strategy="group_by_length"``, ``group_by_length=True`` in older versions): the
  batching ours has by default, so the ratio against it is the loops' own difference.
* ``ours``: ``finetune.trainer``'s own stages, as ``launch/finetune.py`` runs them:
  ``_prepare_data`` (dataset, ``check_model``, task adapter, featurization: NER sentences longer
  than L are split into word windows, not truncated) and ``_prepare_training`` (model, shuffled
  loader, ``build_optimizer("adamw")`` with ``parameter_groups``, the slanted triangular schedule:
  linear 10% warm-up then linear decay, as HF's; the stepper; batches of similar lengths,
  ``group_by_length``, unless ``--no-group-by-length``), then ``train_epoch`` per epoch. In
  bf16 on cuda (``--ours-engine auto``) that is the DeepSpeed path (``deepspeed=True,
  precision="bf16"``: DeepSpeed's torch autocast, fp32 weights as HF's bf16 has them), the only bf16
  path ``launch/finetune.py`` has; without ``deepspeed`` installed ``auto`` falls back to
  ``autocast``: ``_PlainStepper`` under ``torch.autocast(bfloat16)``, which is this benchmark's
  wrapper, not a ``launch/finetune.py`` path (the JSON's ``ours_engine`` says which ran). Unlike
  ``run_finetune`` the dev set is scored once, after the last epoch (no per-epoch model
  selection), exactly as for HF.

HF runs first in each task (accelerate's device state is set up before DeepSpeed's process group
exists; the launcher variables DeepSpeed sets are hidden while HF runs, and the JSON records HF's
``world_size`` and wrapped model class to show it ran as one plain process).

Measurements. Training time runs from the first epoch's start to the last optimizer step's end,
the device synchronized at those two ends and after the last warm-up step only (:class:`StepClock`):
each loop waits for the device as often as it does in a run (HF's ``Trainer`` reads every step's
loss for its NaN filter; ours reads them 32 steps at a time),
data loading and collation included, scoring excluded. ``examples_per_s`` = epochs x training
examples (sentences / sentence pairs) / that time; ``examples_per_s_steady`` leaves out the first
``--warmup-steps`` steps of each method (lazy CUDA/cuBLAS initialization, allocator growth) and is
the headline; ``ratio_examples_per_s`` = ours / hf_trainer of it (above 1 = ours faster). Peak
memory: on cuda ``torch.cuda.max_memory_allocated`` from just before the method's model is built
to the end of training (weights, gradients, optimizer state, activations); on cpu the process's
peak RSS over the method's training (``/proc/self/clear_refs`` resets the high-water mark first;
both methods share the process, so the absolute peak includes the other's leftovers) and its
growth over the RSS at the method's start. ``ratio_peak_memory`` = ours / hf_trainer (below 1 = ours
smaller). F1: both final models scored on dev and test with ``finetune.metrics.compute_metric``
(the same gold and metric); ``f1_diff_*`` = ours - hf_trainer, so "examples/s at equal F1" can be
checked. Truncated HF NER words are predicted O.

Needs: torch, transformers, ``accelerate`` (transformers' ``Trainer``), seqeval and scipy
(``finetune.metrics``), tqdm, numpy; ``deepspeed`` for our bf16 path; not ``datasets``.

Results go to ``benchmarks/results/finetune.json`` (``--output``), and a table is printed.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import gc
import os
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # checkpoints are local directories; never reach a hub

import torch
from _results import write_results  # benchmarks/ is on sys.path when a benchmark runs

REPO = Path(__file__).resolve().parents[1]
BASELINE = "hf_trainer"
GROUPED_BASELINE = "hf_grouped"  # HF Trainer with its group_by_length option (--grouped-baseline)
OURS = "ours"
TASKS = ("ner", "relation")
MODEL_PRESETS = ("bert-base", "minilm", "tiny")
WEIGHT_DECAY = 0.01
WARMUP_RATIO = 0.1
MAX_GRAD_NORM = 1.0
LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def log(message: str) -> None:
    print(f"  {message}", file=sys.stderr, flush=True)


def _malloc_trim() -> None:
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def _rss() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


class MemoryWindow:
    """Peak memory of one method: cuda allocator peak, or process peak RSS (and growth) on cpu."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def start(self) -> None:
        gc.collect()
        _malloc_trim()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
        self.start_rss = _rss()
        try:  # reset the high-water mark ru_maxrss reads (Linux)
            Path("/proc/self/clear_refs").write_text("5", encoding="ascii")
            self.rss_scope = "method"
        except OSError:
            self.rss_scope = "process"

    def stop(self) -> dict:
        peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
        out = {"peak_rss_bytes": peak_rss, "peak_rss_growth_bytes": peak_rss - self.start_rss,
               "peak_rss_scope": self.rss_scope}
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            out["cuda_max_memory_allocated_bytes"] = torch.cuda.max_memory_allocated(self.device)
            out["cuda_max_memory_reserved_bytes"] = torch.cuda.max_memory_reserved(self.device)
            out["peak_memory_bytes"] = out["cuda_max_memory_allocated_bytes"]
            out["peak_memory_kind"] = "torch.cuda.max_memory_allocated"
        else:
            out["peak_memory_bytes"] = peak_rss
            out["peak_memory_kind"] = "process peak RSS"
        return out


class StepClock:
    """Step-end timestamps from a start time, with the device synchronized at the timed windows' ends
    only — the start, the last warm-up step (``warmup_steps``, as :func:`timing` leaves them out) and the
    last step (``total``, once known) — not after each step, as a run goes: a loop that waits for the
    device every step pays for it, one that does not queues the next step meanwhile. The other
    timestamps are when the host finished queuing a step."""

    def __init__(self, device: torch.device, warmup_steps: int, total: int | None = None) -> None:
        self.device, self.warmup_steps, self.total, self.start, self.ends = device, warmup_steps, total, None, []

    def begin(self) -> None:
        if self.start is None:
            self._sync()
            self.start = time.perf_counter()

    def step_done(self) -> None:
        done = len(self.ends) + 1
        if self.total is None or done in (self.total, min(self.warmup_steps, self.total - 1)):
            self._sync()
        self.ends.append(time.perf_counter())

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


class TimedStepper:
    """Wraps our stepper (``_PlainStepper`` / ``_DeepSpeedStepper``) to time each step; optionally
    runs it under bf16 autocast (the ``autocast`` engine)."""

    def __init__(self, inner, clock: StepClock, autocast_device: str | None = None) -> None:
        self.inner, self.clock, self.module, self.autocast_device = inner, clock, inner.module, autocast_device

    def __call__(self, inputs):
        context = (torch.autocast(self.autocast_device, dtype=torch.bfloat16) if self.autocast_device
                   else contextlib.nullcontext())
        with context:
            loss = self.inner(inputs)
        self.clock.step_done()
        return loss


@contextlib.contextmanager
def hidden_launcher_variables():
    """Hide the single-process launcher variables DeepSpeed's set-up exported, so that HF's Trainer
    (accelerate) sets itself up as one plain process."""
    saved = {k: os.environ.pop(k) for k in LAUNCHER_VARIABLES if k in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


# ------------------------------------------------------------------------------------ inputs

def derived_relation_data(ner_dir: Path, out: Path, limit: int | None = None) -> dict[str, int]:
    """A GAD-format relation set from NCBI-disease sentences (see the module docstring); at most
    ``limit`` rows per split (the first ones)."""
    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    for split, source in (("train", "train.tsv"), ("dev", "devel.tsv"), ("test", "test.tsv")):
        rows = []
        for block in (ner_dir / source).read_text(encoding="utf-8").split("\n\n"):
            if limit is not None and len(rows) >= limit:
                break
            pairs = [line.split("\t") for line in block.strip().split("\n") if line.strip()]
            tokens, tags = [p[0] for p in pairs], [p[-1] for p in pairs]
            mentions, begin = [], None
            for i, tag in enumerate(tags + ["O"]):
                if begin is not None and not tag.startswith("I"):
                    mentions.append((begin, i))
                    begin = None
                if tag.startswith("B") or (tag.startswith("I") and begin is None):
                    begin = i
            for (b1, e1), (b2, e2) in zip(mentions, mentions[1:]):
                words = tokens[:b1] + ["@GENE$"] + tokens[e1:b2] + ["@DISEASE$"] + tokens[e2:]
                rows.append(f"{' '.join(words)}\t{'1' if b2 - e1 <= 2 else '0'}\n")
        rows = rows[:limit]
        (out / f"{split}.tsv").write_text("".join(rows), encoding="utf-8")
        counts[split] = len(rows)
    return counts


def make_tokenizer(args, texts_for_training) -> tuple[object, str]:
    """The tokenizer of a random model (see the module docstring for the order)."""
    from transformers import AutoTokenizer, BertTokenizerFast

    if args.tokenizer:
        return AutoTokenizer.from_pretrained(args.tokenizer), str(args.tokenizer)
    try:
        from biomed_lm.reference_models import general_bert_dir

        path = general_bert_dir()
        return AutoTokenizer.from_pretrained(str(path)), f"{path} (bert-base-uncased vocabulary)"
    except FileNotFoundError:
        pass
    from tokenizers import BertWordPieceTokenizer

    trained = BertWordPieceTokenizer(lowercase=True)
    trained.train_from_iterator(texts_for_training(), vocab_size=30522, min_frequency=2)
    tokenizer = BertTokenizerFast(tokenizer_object=trained._tokenizer)
    return tokenizer, f"WordPiece trained on the tasks' training text ({len(tokenizer)} tokens)"


def make_model_dir(args, root: Path, texts_for_training) -> tuple[str, dict]:
    """A checkpoint directory for ``args.model`` and a description of it."""
    if args.model not in MODEL_PRESETS:
        return str(args.model), {"model": str(args.model), "model_kind": "checkpoint"}
    if args.model == "minilm":
        from biomed_lm.reference_models import general_bert_dir

        return str(general_bert_dir()), {"model": "all-MiniLM-L6-v2 (pretrained, 6 x 384)", "model_kind": "minilm"}
    from transformers import BertConfig, BertModel

    tokenizer, source = make_tokenizer(args, texts_for_training)
    shape = (dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128)
             if args.model == "tiny" else {})  # BertConfig's defaults are BERT-base's
    config = BertConfig(vocab_size=len(tokenizer), max_position_embeddings=512, **shape)
    torch.manual_seed(args.seed)
    path = root / f"{args.model}_random"
    BertModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path), {"model": f"{args.model} shape, randomly initialized ({config.num_hidden_layers} x "
                                f"{config.hidden_size}, vocabulary {config.vocab_size})",
                       "model_kind": args.model, "tokenizer_source": source}


# ---------------------------------------------------------------------------------- HF side

def hf_token_features(examples, tokenizer, label_index: dict[str, int], max_length: int, gold_tags) -> tuple:
    """The run_ner.py recipe: one batched tokenizer call, label on the first sub-word, -100 elsewhere.
    Returns the features and the number of sentences truncation cut."""
    encodings = tokenizer([list(e.tokens) for e in examples], is_split_into_words=True, truncation=True,
                          max_length=max_length)
    features, truncated = [], 0
    for i, example in enumerate(examples):
        tags, labels, previous = gold_tags[i], [], None
        word_ids = encodings.word_ids(i)
        for word in word_ids:
            labels.append(-100 if word is None or word == previous else label_index[tags[word]])
            previous = word
        last_word = max((w for w in word_ids if w is not None), default=-1)
        truncated += int(last_word < len(example.tokens) - 1)
        feature = {k: encodings[k][i] for k in ("input_ids", "attention_mask", "token_type_ids") if k in encodings}
        features.append(feature | {"labels": labels, "word_ids": word_ids})
    return features, truncated


def hf_sequence_features(examples, tokenizer, label_index: dict[str, int], max_length: int) -> tuple:
    texts = []
    for e in examples:
        if getattr(e, "entities", None):
            raise SystemExit("bench_finetune: the HF baseline reads pre-dummified relation text (GAD layout); "
                             "this dataset gives entity offsets")
        texts.append(e.text)
    encodings = tokenizer(texts, truncation=True, max_length=max_length)
    truncated = sum(1 for ids in encodings["input_ids"] if len(ids) >= max_length)
    features = [{k: encodings[k][i] for k in ("input_ids", "attention_mask", "token_type_ids") if k in encodings}
                | {"labels": label_index[e.label]} for i, e in enumerate(examples)]
    return features, truncated


@torch.no_grad()
def hf_predict(model, features, collator, batch_size: int, device: torch.device, bf16: bool, labels, ner: bool):
    """One prediction per example (NER: a tag per word, O for words truncation cut)."""
    model.eval()
    predictions = []
    for begin in range(0, len(features), batch_size):
        chunk = features[begin:begin + batch_size]
        batch = collator([{k: v for k, v in f.items() if k != "word_ids"} for f in chunk])
        batch = {k: v.to(device) for k, v in batch.items() if k != "labels"}
        with torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
            argmax = model(**batch).logits.argmax(-1).cpu().tolist()
        for feature, row in zip(chunk, argmax):
            if not ner:
                predictions.append(labels[row])
                continue
            words, previous = {}, None
            for position, word in enumerate(feature["word_ids"]):
                if word is not None and word != previous:
                    words[word] = labels[row[position]]
                previous = word
            predictions.append([words.get(w, "O") for w in range(feature["num_words"])])
    return predictions


def hf_sampling(group_by_length: bool) -> dict:
    """TrainingArguments' training order: random, or transformers' LengthGroupedSampler (its option was
    ``group_by_length=True`` until ``train_sampling_strategy`` replaced it)."""
    from transformers import TrainingArguments

    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    if "train_sampling_strategy" in names:
        return {"train_sampling_strategy": "group_by_length" if group_by_length else "random"}
    return {"group_by_length": group_by_length}


def hf_features(data, tokenizer, labels: list[str], ner: bool) -> tuple[dict[str, list[dict]], dict[str, int]]:
    """Every split's features the HF way (NER: with each sentence's word count, which scoring needs), and
    how many examples truncation cut in each split."""
    from biomed_lm.finetune.blurb import DEV, TEST, TRAIN

    label_index = {label: i for i, label in enumerate(labels)}
    max_length = data.task.max_length
    features, truncated = {}, {}
    for split in (TRAIN, DEV, TEST):
        examples = data.examples[split]
        if ner:
            features[split], truncated[split] = hf_token_features(examples, tokenizer, label_index, max_length,
                                                                  data.task.gold(examples))
            for f, e in zip(features[split], examples):
                f["num_words"] = len(e.tokens)
        else:
            features[split], truncated[split] = hf_sequence_features(examples, tokenizer, label_index, max_length)
    return features, truncated


def clock_callback(clock: StepClock):
    """A ``TrainerCallback`` that reports HF's training to ``clock``: its total steps, each epoch's start and
    each step's end."""
    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        def on_train_begin(self, _args, state, control, **kwargs):
            clock.total = state.max_steps

        def on_epoch_begin(self, _args, state, control, **kwargs):
            clock.begin()

        def on_step_end(self, _args, state, control, **kwargs):
            clock.step_done()

    return Clock()


def train_hf(args, cfg, model_dir: str, labels: list[str], ner: bool, train: list[dict], collator,
             device: torch.device, bf16: bool, group_by_length: bool) -> tuple[object, StepClock, dict]:
    """The HF model built and trained by ``Trainer`` within one :class:`MemoryWindow`, its steps on a
    :class:`StepClock`. Returns the trained model, the clock and what the row reports of the run."""
    # Imported before the window opens, so that loading these modules does not count as the method's memory.
    from transformers import (AutoModelForSequenceClassification, AutoModelForTokenClassification, Trainer,
                              TrainingArguments)

    memory = MemoryWindow(device)
    memory.start()
    model_class = AutoModelForTokenClassification if ner else AutoModelForSequenceClassification
    model = model_class.from_pretrained(model_dir, num_labels=len(labels), id2label=dict(enumerate(labels)),
                                        label2id={label: i for i, label in enumerate(labels)})
    clock = StepClock(device, args.warmup_steps)
    with tempfile.TemporaryDirectory(prefix="bench_finetune_hf_") as tmp, hidden_launcher_variables():
        training_args = TrainingArguments(
            output_dir=tmp, per_device_train_batch_size=cfg.batch_size, learning_rate=cfg.learning_rate,
            num_train_epochs=cfg.epochs, warmup_steps=WARMUP_RATIO, weight_decay=WEIGHT_DECAY,
            max_grad_norm=MAX_GRAD_NORM, lr_scheduler_type="linear", bf16=bf16, use_cpu=device.type == "cpu",
            report_to="none", save_strategy="no", eval_strategy="no", logging_strategy="no",
            dataloader_num_workers=0, disable_tqdm=True, seed=args.seed, **hf_sampling(group_by_length))
        trainer = Trainer(model=model, args=training_args, train_dataset=train, data_collator=collator,
                          callbacks=[clock_callback(clock)])
        started = time.perf_counter()
        output = trainer.train()
        call_s = time.perf_counter() - started
        peak = memory.stop()
        world_size = training_args.world_size  # read while the launcher variables are still hidden
        wrapped = type(trainer.model_wrapped).__name__
        optimizer = trainer.optimizer.optimizer if hasattr(trainer.optimizer, "optimizer") else trainer.optimizer
    trained = {"optimizer": type(optimizer).__name__, "world_size": world_size, "wrapped_model": wrapped,
               "train_call_seconds": call_s, "mean_training_loss": output.training_loss, "peak": peak}
    return model, clock, trained


def hf_scores(data, model, features: dict[str, list[dict]], collator, batch_size: int, device: torch.device,
              bf16: bool, labels: list[str], ner: bool) -> dict[str, float]:
    """The trained HF model's dev and test F1, with the same gold and metric as ours."""
    from biomed_lm.finetune.blurb import DEV, TEST
    from biomed_lm.finetune.metrics import compute_metric

    scores = {}
    for split in (DEV, TEST):
        predicted = hf_predict(model, features[split], collator, batch_size, device, bf16, labels, ner)
        scores[split] = compute_metric(data.dataset.metric, data.task.gold(data.examples[split]), predicted,
                                       **data.task.metric_kwargs())["score"]
    return {"dev_f1": scores[DEV], "test_f1": scores[TEST]}


def run_hf(args, cfg, data, model_dir: str, device: torch.device, bf16: bool, group_by_length: bool = False) -> dict:
    """HF ``Trainer`` on the task's examples, featurized the HF way (``group_by_length``: in transformers'
    length-grouped order): its row, with examples/s, peak memory and dev/test F1."""
    import transformers
    from transformers import AutoTokenizer, DataCollatorForTokenClassification, DataCollatorWithPadding

    from biomed_lm.finetune.blurb import TRAIN

    ner = data.dataset.task_type == "ner"
    labels = list(data.task.labels)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    features, truncated = hf_features(data, tokenizer, labels, ner)
    train = [{k: v for k, v in f.items() if k not in ("word_ids", "num_words")} for f in features[TRAIN]]
    collator = (DataCollatorForTokenClassification(tokenizer) if ner else DataCollatorWithPadding(tokenizer))
    model, clock, trained = train_hf(args, cfg, model_dir, labels, ner, train, collator, device, bf16, group_by_length)
    scores = hf_scores(data, model, features, collator, cfg.batch_size, device, bf16, labels, ner)
    row = {"method": GROUPED_BASELINE if group_by_length else BASELINE, "group_by_length": group_by_length,
           "sequences_per_epoch": len(train), "truncated_examples": truncated,
           "optimizer": trained["optimizer"], "world_size": trained["world_size"],
           "wrapped_model": trained["wrapped_model"],
           "precision": "bf16 autocast (fp32 weights)" if bf16 else "fp32",
           "train_call_seconds": trained["train_call_seconds"], "mean_training_loss": trained["mean_training_loss"],
           "transformers": transformers.__version__}
    row |= timing(clock, cfg, len(data.examples[TRAIN]), len(train), args.warmup_steps)
    row |= trained["peak"] | scores
    return row


# ---------------------------------------------------------------------------------- our side

def run_ours(args, cfg, fargs, data, device: torch.device, engine: str) -> dict:
    from biomed_lm.finetune.blurb import DEV, TEST, TRAIN
    from biomed_lm.backend import start_distributed
    from biomed_lm.finetune.trainer import _evaluate, _prepare_training, _seed_everything, train_epoch

    memory = MemoryWindow(device)
    memory.start()
    data.generator = _seed_everything(args.seed)  # as run_finetune: seeded right before the model is built
    setup_started = time.perf_counter()
    # The process group first, as run_finetune starts it (counted in the set-up, as before); the model's
    # preparation resets the cuda peak itself, just before building the model.
    run = _prepare_training(fargs, data, start_distributed(fargs.deepspeed, "bench_finetune"))
    setup_s = time.perf_counter() - setup_started
    if run.distributed.device != device:
        raise SystemExit(f"bench_finetune: our trainer chose {run.distributed.device}, the benchmark {device}")
    clock = StepClock(device, args.warmup_steps, run.total_steps)
    stepper = TimedStepper(run.stepper, clock, device.type if engine == "autocast" else None)
    losses = []
    for epoch in range(1, cfg.epochs + 1):
        clock.begin()
        losses.extend(train_epoch(stepper, run.loader, data.task, device, None, epoch))
    peak = memory.stop()
    scores = {split: _evaluate(run.model, data.task, data.examples[split], data.features[split], fargs,
                               data.dataset.metric, device)["score"] for split in (DEV, TEST)}
    optimizer = getattr(run.stepper, "optimizer", None)
    wrapper = None
    if optimizer is None:  # a DeepSpeed engine: its optimizer wraps ours
        wrapper = run.stepper.module.optimizer
        optimizer = getattr(wrapper, "optimizer", wrapper)
    precision = ("bf16 autocast (fp32 weights)" if engine == "autocast" else
                 f"{fargs.precision}{' (DeepSpeed torch autocast, fp32 weights)' if fargs.precision == 'bf16' else ''}")
    row = {"method": OURS, "engine": engine, "group_by_length": fargs.group_by_length,
           "sequences_per_epoch": len(data.features[TRAIN]),
           "extra_windows": len(data.features[TRAIN]) - len(data.examples[TRAIN]),
           "input_stats": dict(data.task.stats), "optimizer": type(optimizer).__name__,
           "optimizer_wrapper": type(wrapper).__name__ if wrapper is not None else None,
           "setup_seconds": setup_s, "world_size": run.distributed.world_size, "precision": precision,
           "mean_training_loss": sum(losses) / len(losses), "total_steps": run.total_steps}
    row |= timing(clock, cfg, len(data.examples[TRAIN]), len(data.features[TRAIN]), args.warmup_steps)
    row |= peak | {"dev_f1": scores[DEV], "test_f1": scores[TEST]}
    del run, stepper
    return row


def timing(clock: StepClock, cfg, n_examples: int, n_sequences: int, warmup_steps: int) -> dict:
    steps = len(clock.ends)
    if steps == 0:
        raise SystemExit("bench_finetune: no training step was timed")
    seconds = clock.ends[-1] - clock.start
    sequences = cfg.epochs * n_sequences
    per_example = n_examples / n_sequences  # examples per training sequence (ours windows long sentences)
    skip = min(warmup_steps, steps - 1)
    steps_per_epoch = steps // cfg.epochs
    if skip and skip < steps_per_epoch:  # the skipped steps are full batches
        steady_s = clock.ends[-1] - clock.ends[skip - 1]
        steady = (sequences - skip * cfg.batch_size) / steady_s * per_example
    else:
        skip, steady_s, steady = 0, seconds, sequences / seconds * per_example
    return {"steps": steps, "train_seconds": seconds, "examples_per_s": cfg.epochs * n_examples / seconds,
            "warmup_steps_excluded": skip, "steady_seconds": steady_s, "examples_per_s_steady": steady,
            "mean_step_seconds_steady": steady_s / (steps - skip)}


# ------------------------------------------------------------------------------------- main

class TaskConfig:
    def __init__(self, batch_size: int, epochs: int, learning_rate: float) -> None:
        self.batch_size, self.epochs, self.learning_rate = batch_size, epochs, learning_rate


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda when available")
    parser.add_argument("--precision", choices=("bf16", "fp32"), default=None,
                        help="default: bf16 on cuda, fp32 on cpu")
    parser.add_argument("--model", default=None, help=f"{', '.join(MODEL_PRESETS)} or a checkpoint directory "
                                                      "(default: bert-base on cuda, minilm on cpu, tiny with --quick)")
    parser.add_argument("--tokenizer", default=None, help="tokenizer directory for the random presets")
    parser.add_argument("--tasks", default=",".join(TASKS), help=f"comma-separated: {', '.join(TASKS)}")
    parser.add_argument("--ner-data", type=Path, default=REPO / "data" / "blurb" / "NCBI-disease")
    parser.add_argument("--relation-data", type=Path, default=None,
                        help="GAD directory (BLURB's re/gad), or 'derived' for the set derived from "
                             "NCBI-disease (the default)")
    parser.add_argument("--train-examples", type=int, default=None,
                        help="first N training examples per task (default: all on cuda, 250 on cpu, 48 --quick)")
    parser.add_argument("--eval-examples", type=int, default=None,
                        help="first N dev and test examples (default: all; 32 --quick)")
    parser.add_argument("--epochs", type=int, default=None, help="default 2 (1 with --quick)")
    parser.add_argument("--batch-size", type=int, default=None, help="default 32 (16 with --quick)")
    parser.add_argument("--learning-rate", type=float, default=None,
                        help="default 5e-5 for a pretrained checkpoint, 1e-4 for the random presets, 1e-3 --quick")
    parser.add_argument("--max-length", type=int, default=None, help="default: the dataset's (128 for both)")
    parser.add_argument("--warmup-steps", type=int, default=None,
                        help="steps left out of the steady-state rate (default 5 on cuda, 1 on cpu)")
    parser.add_argument("--ours-engine", choices=("auto", "plain", "deepspeed", "autocast"), default="auto",
                        help="auto: deepspeed for bf16 (autocast without deepspeed installed), plain for fp32")
    parser.add_argument("--no-group-by-length", dest="group_by_length", action="store_false",
                        help="ours in uniformly shuffled batches (default: our trainer's default, batches of "
                             "similar lengths)")
    parser.add_argument("--grouped-baseline", action="store_true",
                        help="also run HF Trainer with group_by_length=True (its own option for the same batching "
                             "as ours), reported as hf_grouped with ratios against it")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    parser.add_argument("--quick", action="store_true", help="tiny model, few steps (the test's run)")
    parser.add_argument("--output", type=Path, default=REPO / "benchmarks" / "results" / "finetune.json")
    args = parser.parse_args(argv)
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available")
    cuda = args.device == "cuda"
    args.precision = args.precision or ("bf16" if cuda else "fp32")
    if args.precision == "bf16" and not cuda:
        parser.error("--precision bf16 is for --device cuda")
    args.model = args.model or ("tiny" if args.quick else "bert-base" if cuda else "minilm")
    if args.train_examples is None:
        args.train_examples = 48 if args.quick else None if cuda else 250
    if args.eval_examples is None and args.quick:
        args.eval_examples = 32
    args.epochs = args.epochs or (1 if args.quick else 2)
    args.batch_size = args.batch_size or (16 if args.quick else 32)
    if args.learning_rate is None:
        args.learning_rate = 1e-3 if args.model == "tiny" else 1e-4 if args.model == "bert-base" else 5e-5
    if args.warmup_steps is None:
        args.warmup_steps = 5 if cuda else 1
    if str(args.relation_data) == "derived":
        args.relation_data = None  # the set derived from NCBI-disease, as with no --relation-data
    if args.relation_data is not None and not args.relation_data.is_dir():
        parser.error(f"--relation-data {args.relation_data} is not a directory")
    args.tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if not args.tasks or any(t not in TASKS for t in args.tasks):
        parser.error(f"--tasks: choose from {', '.join(TASKS)}")
    for name in ("train_examples", "eval_examples"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.epochs < 1 or args.batch_size < 1 or args.warmup_steps < 0:
        parser.error("--epochs and --batch-size must be at least 1, --warmup-steps at least 0")
    engine = args.ours_engine
    if engine == "auto":
        if args.precision == "fp32":
            engine = "plain"
        else:
            try:
                import deepspeed  # noqa: F401
                engine = "deepspeed"
            except ImportError:
                print("bench_finetune: deepspeed is not installed: ours runs bf16 as torch autocast around "
                      "_PlainStepper (not a launch/finetune.py path)", file=sys.stderr)
                engine = "autocast"
    if args.precision == "fp32" and engine == "autocast":
        parser.error("--ours-engine autocast is bf16")
    if args.precision == "bf16" and engine == "plain":
        parser.error("--ours-engine plain is fp32 (our trainer runs bf16 through DeepSpeed only)")
    args.engine = engine
    return args


def task_specs(args, root: Path) -> tuple[dict[str, dict], str | None]:
    """Each task's dataset for ``FinetuneArgs``, and where the relation task's examples come from: GAD
    from ``--relation-data``, or pairs derived from NCBI-disease where none is given."""
    specs, relation_source = {}, None
    if "ner" in args.tasks:
        specs["ner"] = dict(dataset="ncbi-disease", data_dir=str(args.ner_data))
    if "relation" not in args.tasks:
        return specs, relation_source
    if args.relation_data is not None:
        specs["relation"] = dict(dataset="gad", data_dir=str(args.relation_data))
        return specs, f"GAD ({args.relation_data})"
    limits = [n for n in (args.train_examples, args.eval_examples) if n is not None]
    counts = derived_relation_data(args.ner_data, root / "ncbi_pairs", max(limits) if len(limits) == 2 else None)
    specs["relation"] = dict(dataset="ncbi-pairs", data_dir=str(root / "ncbi_pairs"), task_type="relation",
                             negative_label="0")
    relation_source = (f"derived from NCBI-disease ({args.ner_data}): consecutive disease-mention pairs, "
                       f"label 1 when at most 2 words apart; rows {counts}")
    log(f"relation data: {relation_source}")
    return specs, relation_source


def training_texts(specs: dict[str, dict]):
    """The tasks' training texts (what a tokenizer trained for the benchmark learns from)."""
    from biomed_lm.finetune.blurb import TRAIN
    from biomed_lm.finetune.readers import load_blurb_dataset, load_generic_dataset

    for spec in specs.values():
        if "task_type" in spec:
            dataset = load_generic_dataset("relation", spec["data_dir"], None, name=spec["dataset"],
                                           negative_label="0")
        else:
            dataset = load_blurb_dataset(spec["dataset"], spec["data_dir"])
        for e in dataset.splits[TRAIN]:
            yield " ".join(e.tokens) if hasattr(e, "tokens") else e.text


def warm_up_cuda(device: torch.device) -> None:
    """The CUDA context and cuBLAS handles (fp32 and bf16) made before anything is timed."""
    if device.type != "cuda":
        return
    x = torch.randn(256, 256, device=device)
    (x @ x).sum().item()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        (x @ x).sum().item()


def measure_task(args, cfg: TaskConfig, name: str, spec: dict, model_dir: str, root: Path,
                 device: torch.device) -> dict:
    """One task: HF ``Trainer`` (and its grouped variant with ``--grouped-baseline``), then ours on the same
    examples; every method's row and the ratios ours / HF."""
    from biomed_lm.finetune.trainer import FinetuneArgs, _prepare_data

    print(f"== {name}: {spec['dataset']}", file=sys.stderr, flush=True)
    bf16 = args.precision == "bf16"
    fargs = FinetuneArgs(model=model_dir, output_dir=str(root / f"ours_{name}"), learning_rate=cfg.learning_rate,
                         batch_size=cfg.batch_size, epochs=cfg.epochs, seed=args.seed, max_length=args.max_length,
                         warmup_ratio=WARMUP_RATIO, weight_decay=WEIGHT_DECAY, dropout=0.1,
                         max_train_examples=args.train_examples, max_eval_examples=args.eval_examples,
                         deepspeed=args.engine == "deepspeed", precision="bf16" if args.engine == "deepspeed"
                         else "fp32", group_by_length=args.group_by_length, **spec)
    data = _prepare_data(fargs, log)
    baselines = {}
    for grouped in (False, True) if args.grouped_baseline else (False,):
        hf = run_hf(args, cfg, data, model_dir, device, bf16, group_by_length=grouped)
        log(f"{hf['method']}: {hf['examples_per_s_steady']:.1f} examples/s, test F1 {hf['test_f1']:.4f}")
        baselines[hf["method"]] = hf
        gc.collect()
    ours = run_ours_or_fall_back(args, cfg, fargs, data, device)
    log(f"ours: {ours['examples_per_s_steady']:.1f} examples/s, test F1 {ours['test_f1']:.4f}")
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"dataset": data.dataset.name, "metric": data.dataset.metric, "max_length": data.task.max_length,
            "examples": {split: len(exs) for split, exs in data.examples.items()},
            "results": {**baselines, OURS: ours}, **task_ratios(ours, baselines)}


def run_ours_or_fall_back(args, cfg: TaskConfig, fargs, data, device: torch.device) -> dict:
    """Ours with ``args.engine``; a DeepSpeed bf16 run that fails falls back to plain bf16 autocast, the
    reason kept in the row, so a one-shot GPU check still gets numbers."""
    try:
        return run_ours(args, cfg, fargs, data, device, args.engine)
    except Exception as error:  # noqa: BLE001  a one-shot GPU check still gets numbers, and says why
        if args.engine != "deepspeed" or args.precision != "bf16":
            raise
        reason = f"{type(error).__name__}: {error}"
    print(f"bench_finetune: our DeepSpeed bf16 run failed ({reason}); running ours as bf16 autocast", file=sys.stderr)
    gc.collect()
    fargs = dataclasses.replace(fargs, deepspeed=False, precision="fp32")
    return run_ours(args, cfg, fargs, data, device, "autocast") | {"engine_fallback_reason": reason}


def task_ratios(ours: dict, baselines: dict[str, dict]) -> dict:
    """Ours / HF ``Trainer`` (examples/s, memory) and ours - HF (F1), against its grouped run too where measured."""
    hf = baselines[BASELINE]
    ratios = {
        "ratio_examples_per_s": ours["examples_per_s_steady"] / hf["examples_per_s_steady"],
        "ratio_examples_per_s_all_steps": ours["examples_per_s"] / hf["examples_per_s"],
        "ratio_peak_memory": ours["peak_memory_bytes"] / hf["peak_memory_bytes"],
        "ratio_peak_rss_growth": (ours["peak_rss_growth_bytes"] / hf["peak_rss_growth_bytes"]
                                  if hf["peak_rss_growth_bytes"] > 0 else None),
        "f1_diff_dev": ours["dev_f1"] - hf["dev_f1"], "f1_diff_test": ours["test_f1"] - hf["test_f1"],
    }
    if GROUPED_BASELINE in baselines:
        grouped = baselines[GROUPED_BASELINE]
        ratios |= {"ratio_examples_per_s_vs_grouped": ours["examples_per_s_steady"] / grouped["examples_per_s_steady"],
                   "f1_diff_test_vs_grouped": ours["test_f1"] - grouped["test_f1"]}
    return ratios


def print_table(args, tasks: dict[str, dict], model_info: dict, device: torch.device, device_name: str) -> None:
    import transformers

    print(f"\n{model_info['model']}; {args.device} ({device_name}), {args.precision}; batch {args.batch_size}, "
          f"{args.epochs} epoch(s), lr {args.learning_rate:g} (10% warm-up, linear decay); ours: {args.engine}; "
          f"torch {torch.__version__}, transformers {transformers.__version__}")
    memory_label = "peak alloc MiB" if device.type == "cuda" else "peak RSS MiB"
    print(f"{'task':<9} {'method':<11} {'examples/s':>10} {'all steps':>9} {'steps':>5} {memory_label:>14} "
          f"{'RSS +MiB':>8} {'dev F1':>7} {'test F1':>7}")
    for name, task in tasks.items():
        for row in task["results"].values():
            print(f"{name:<9} {row['method']:<11} {row['examples_per_s_steady']:10.1f} {row['examples_per_s']:9.1f} "
                  f"{row['steps']:5d} {row['peak_memory_bytes'] / 2 ** 20:14.0f} "
                  f"{row['peak_rss_growth_bytes'] / 2 ** 20:8.0f} {row['dev_f1']:7.4f} {row['test_f1']:7.4f}")
        print(f"{name:<9} {'ours/hf':<11} {task['ratio_examples_per_s']:9.2f}x "
              f"{task['ratio_examples_per_s_all_steps']:8.2f}x {'':5} {task['ratio_peak_memory']:13.2f}x {'':8} "
              f"{task['f1_diff_dev']:+7.4f} {task['f1_diff_test']:+7.4f}")
        if "ratio_examples_per_s_vs_grouped" in task:
            print(f"{name:<9} {'ours/hf_grp':<11} {task['ratio_examples_per_s_vs_grouped']:9.2f}x "
                  f"{'':9} {'':5} {'':14} {'':8} {'':7} {task['f1_diff_test_vs_grouped']:+7.4f}")
    print("examples/s: steady state (first --warmup-steps steps of each method left out); ratios ours / hf_trainer "
          "(examples/s above 1 = ours faster; memory below 1 = ours smaller); F1 rows: ours - hf_trainer")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        import accelerate  # noqa: F401  (transformers' Trainer needs it; not a dependency of this project)
    except ImportError:
        print("bench_finetune: error: the hf_trainer baseline needs accelerate (transformers' Trainer requires it); "
              "install it with: .venv/bin/pip install -c requirements/cpu.lock accelerate", file=sys.stderr)
        return 2
    import transformers

    transformers.logging.set_verbosity_error()  # "newly initialized classifier" etc.
    # "cuda" names the current device; the trainer reports it with its index (cuda:0)
    device = torch.device("cuda", torch.cuda.current_device()) if args.device == "cuda" else torch.device(args.device)
    tmp = tempfile.TemporaryDirectory(prefix="bench_finetune_")
    root = Path(tmp.name)
    started = time.perf_counter()
    specs, relation_source = task_specs(args, root)
    model_dir, model_info = make_model_dir(args, root, lambda: training_texts(specs))
    cfg = TaskConfig(args.batch_size, args.epochs, args.learning_rate)
    warm_up_cuda(device)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{os.cpu_count()} CPUs"
    tasks: dict[str, dict] = {}

    def result(complete: bool) -> dict:
        return {
            "benchmark": "finetune", "device": args.device, "device_name": device_name, "precision": args.precision,
            "ours_engine": args.engine, "quick": args.quick, **model_info, "model_dir": model_dir,
            "relation_source": relation_source, "batch_size": args.batch_size, "epochs": args.epochs,
            "learning_rate": args.learning_rate, "warmup_ratio": WARMUP_RATIO, "weight_decay": WEIGHT_DECAY,
            "max_grad_norm": MAX_GRAD_NORM, "train_examples_limit": args.train_examples,
            "eval_examples_limit": args.eval_examples, "warmup_steps": args.warmup_steps, "seed": args.seed,
            "baseline": BASELINE, "group_by_length": args.group_by_length, "threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "wall_seconds": time.perf_counter() - started, "tasks": tasks, "complete": complete,
        }

    for name, spec in specs.items():  # saved after each task: a stage's timeout keeps the tasks that ended
        tasks[name] = measure_task(args, cfg, name, spec, model_dir, root, device)
        write_results(args.output, result(complete=False), quiet=True)
    print_table(args, tasks, model_info, device, device_name)
    write_results(args.output, result(complete=True))
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
