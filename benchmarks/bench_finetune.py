#!/usr/bin/env python
"""Fine-tuning throughput on CPU: our training loop against HF ``Trainer``, in one run, same model and data.

    python benchmarks/bench_finetune.py [--train-sentences 250] [--rounds 6] [--batch-size 32] [--threads N]

Task: NCBI-disease NER (BLURB; the committed ``data/blurb/NCBI-disease`` files), the first
``--train-sentences`` training sentences, BIO tags (3 labels). Model: the packaged all-MiniLM-L6-v2
(``common.reference_models.general_bert_dir()``: 6 layers of 384, bert-base-uncased vocabulary),
fp32, max_length 128, lr 5e-5, 10% warm-up then linear decay, weight decay 0.01, gradient clipping
at 1.0, dropout 0.1, shuffled batches of ``--batch-size``. Methods:

* ``hf_trainer`` (baseline): ``AutoModelForTokenClassification`` from the same checkpoint, the
  sentences tokenized the standard HF way (one batched fast-tokenizer call with
  ``is_split_into_words=True``, ``truncation=True, max_length=128``; the word's label on its first
  sub-word, -100 elsewhere), ``DataCollatorForTokenClassification``, and ``Trainer`` with
  ``TrainingArguments(use_cpu=True, report_to="none", save/eval/logging_strategy="no",
  dataloader_num_workers=0, warmup_steps=0.1)`` (in transformers 5.x a float ``warmup_steps`` is
  the warm-up ratio). Its default optimizer is ``adamw_torch_fused``. The features are a plain
  list of dicts (no ``datasets.Dataset``, so no Arrow row access in the timed loop).
* ``ours``: ``finetune.trainer`` as ``run_finetune`` uses it: ``_build_task(...).featurize`` (word
  windows), ``_build_model`` (``TokenTaggingModel``, linear head), ``DataLoader(shuffle=True,
  collate_fn=task.collate)``, ``build_optimizer("adamw")`` (``AdamW(fused=True)`` on CPU) with
  :func:`pretrain.optim.parameter_groups`, the slanted triangular schedule, ``_PlainStepper`` and
  ``train_epoch``.

Timing. Both methods train in the same process on their own model copy. HF trains for
``warmup + rounds`` epochs in a single ``Trainer.train()`` call; a ``TrainerCallback`` times each HF
epoch (``on_epoch_begin`` to ``on_epoch_end``: data loading, collation, forward, backward,
clipping, optimizer and scheduler steps, Trainer bookkeeping) and runs one epoch of our loop
(``train_epoch`` over the same sentences, timed on its own) right before or right after it,
alternating the order every round. So the two methods interleave epoch by epoch, machine drift
hits both alike, and both are timed in steady state (optimizer state allocated, schedule
running). Model loading and tokenization are outside the timed epochs; featurization is timed
separately (best of 3). Trainer's per-``train()`` set-up and tear-down is reported separately too.
The first ``--warmup-rounds`` rounds are not counted. The table gives each method's median
examples (sentences) per second over the timed rounds and ``ratio``: per round, ours / hf_trainer
examples/s, then the median over rounds (above 1 = ours faster). A round's two epochs run back to
back under nearly the same machine load, so the per-round ratio is what interleaving protects;
the ratio of the two medians (also reported) is skewed when the load changes mid-run. The same
per-round median is given for padded tokens per second (which discounts batch-composition luck).

Padding. Both collators pad dynamically to the longest sequence in the batch, but the two samplers
shuffle differently, so batch compositions differ: the mean padded tokens per epoch and per batch
(and the real, unpadded tokens) are reported for each method. A sentence longer than 126 sub-words
is cut by HF's truncation (its tail words get no label) but split by ours into windows of whole
words (one more sequence each); the number of such sentences is reported. Sentence 166 of
NCBI-disease's training file is one (133 sub-words with [CLS]/[SEP]). The default of 250 sentences
keeps the step counts equal (250 vs 251 sequences: 8 batches each); with 256, ours trains on 257
sequences, 9 batches against HF's 8 (compare ``steps`` in the table). That extra one-sequence
step is cheap on an idle machine (0.13 s against 0.91 s for a 32 x 61 batch: about 1.5% of an
epoch) but costs most of a full step when the cores are oversubscribed (4.8 s against 6.0 s
measured under a load average of ~4: every kernel still synchronizes both threads, whatever the
batch), so there it is a 5-10% handicap that has nothing to do with the loop.

Peak RSS growth (``RSS +MiB``): measured in the warm-up rounds only (the table shows the last),
so the timed epochs run without it: ``malloc_trim`` first returns freed heap pages to the OS, then
a thread samples ``/proc/self/statm`` every 10 ms during the epoch; the growth is the peak minus
the RSS at the epoch's start. It covers activations, gradients and (in the first epoch) the
optimizer state. Both models live in the same process, so absolute RSS is shared; only the growth
is per method, and it is approximate (allocator caching). ``--warmup-rounds 0`` skips it.

Needs ``accelerate`` (transformers' ``Trainer`` requires it; this project does not):
``.venv/bin/pip install -c requirements/cpu.lock accelerate``.

Results go to ``benchmarks/results/finetune.json``.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
from _results import write_results  # benchmarks/ is on sys.path when a benchmark runs

REPO = Path(__file__).resolve().parents[1]
BASELINE = "hf_trainer"
OURS = "ours"
MAX_LENGTH = 128
LEARNING_RATE = 5e-5
WEIGHT_DECAY = 0.01
WARMUP_RATIO = 0.1


def _malloc_trim() -> None:
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


class RssSampler:
    """Peak resident set size of this process while running, sampled from /proc every ``interval`` s."""

    def __init__(self, interval: float = 0.01) -> None:
        self.interval = interval
        self._page = os.sysconf("SC_PAGE_SIZE")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.start_rss = self.peak_rss = 0

    def rss(self) -> int:
        try:
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * self._page
        except OSError:
            return 0

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak_rss = max(self.peak_rss, self.rss())

    def start(self) -> None:
        _malloc_trim()  # hand memory the other method freed back to the OS, so growth is this method's own
        self.start_rss = self.peak_rss = self.rss()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> int:
        """Stop sampling; returns the peak growth in bytes over the RSS at start."""
        self._stop.set()
        self._thread.join()
        self.peak_rss = max(self.peak_rss, self.rss())
        return self.peak_rss - self.start_rss


class BatchShapes:
    """Wraps a collate function and records each batch's padded and real token counts."""

    def __init__(self, collate) -> None:
        self.collate, self.padded, self.real = collate, [], []

    def __call__(self, features):
        batch = self.collate(features)
        self.padded.append(int(batch["input_ids"].numel()))
        self.real.append(int(batch["attention_mask"].sum()))
        return batch


def hf_features(examples, tokenizer, label_index: dict[str, int]) -> tuple[list[dict], int]:
    """The run_ner.py recipe: one batched tokenizer call, label on the first sub-word, -100 elsewhere.
    Returns the features and the number of sentences truncation cut."""
    encodings = tokenizer([list(e.tokens) for e in examples], is_split_into_words=True, truncation=True,
                          max_length=MAX_LENGTH)
    features, truncated = [], 0
    for i, example in enumerate(examples):
        labels, previous = [], None
        word_ids = encodings.word_ids(i)
        for word in word_ids:
            labels.append(-100 if word is None or word == previous else label_index[example.tags[word]])
            previous = word
        last_word = max((w for w in word_ids if w is not None), default=-1)
        truncated += int(last_word < len(example.tokens) - 1)
        features.append({"input_ids": encodings["input_ids"][i], "attention_mask": encodings["attention_mask"][i],
                         "token_type_ids": encodings["token_type_ids"][i], "labels": labels})
    return features, truncated


def best_of(fn, repeats: int = 3) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train-sentences", type=int, default=250, help="first N NCBI-disease training sentences")
    parser.add_argument("--rounds", type=int, default=6, help="timed rounds (one epoch of each method per round)")
    parser.add_argument("--warmup-rounds", type=int, default=1, help="untimed rounds first")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--model", default=None, help="checkpoint directory (default: the packaged all-MiniLM-L6-v2)")
    parser.add_argument("--output", type=Path, default=REPO / "benchmarks" / "results" / "finetune.json")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.warmup_rounds < 0 or args.train_sentences < 1 or args.batch_size < 1:
        parser.error("--rounds, --train-sentences and --batch-size must be at least 1, --warmup-rounds at least 0")
    if args.threads:
        torch.set_num_threads(args.threads)

    try:
        import accelerate  # noqa: F401  (transformers' Trainer needs it; not a dependency of this project)
    except ImportError:
        print("bench_finetune: error: the hf_trainer baseline needs accelerate (transformers' Trainer requires it); "
              "install it with: .venv/bin/pip install -c requirements/cpu.lock accelerate", file=sys.stderr)
        return 2
    import transformers
    from torch.utils.data import DataLoader
    from transformers import (AutoModelForTokenClassification, AutoTokenizer, DataCollatorForTokenClassification,
                              Trainer, TrainerCallback, TrainingArguments)

    from biomed_lm.finetune.blurb import TRAIN
    from biomed_lm.finetune.model_check import check_model
    from biomed_lm.finetune.trainer import (FinetuneArgs, _build_model, _build_task, _PlainStepper, _seed_everything,
                                            load_dataset_for, train_epoch)
    from biomed_lm.pretrain.optim import ScheduleConfig, build_lr_scheduler, build_optimizer, parameter_groups
    from biomed_lm.reference_models import general_bert_dir

    transformers.logging.set_verbosity_error()  # "newly initialized classifier" etc.
    model_dir = args.model or str(general_bert_dir())
    tmp = tempfile.TemporaryDirectory(prefix="bench_finetune_")
    fargs = FinetuneArgs(model=model_dir, dataset="ncbi-disease", data_dir=str(REPO / "data" / "blurb" / "NCBI-disease"),
                         output_dir=tmp.name, learning_rate=LEARNING_RATE, batch_size=args.batch_size,
                         epochs=args.warmup_rounds + args.rounds, seed=args.seed, max_length=MAX_LENGTH,
                         warmup_ratio=WARMUP_RATIO, weight_decay=WEIGHT_DECAY, dropout=0.1, tagging_scheme="bio",
                         tagging_layer="linear")
    dataset = load_dataset_for(fargs)
    examples = dataset.splits[TRAIN][:args.train_sentences]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    task = _build_task(fargs, dataset, tokenizer)
    label_index = {label: i for i, label in enumerate(task.labels)}
    n = len(examples)

    # ---- featurization (outside the timed epochs)
    ours_featurize_s, ours_features = best_of(lambda: task.featurize(examples))
    hf_tokenize_s, (hf_train, hf_truncated) = best_of(lambda: hf_features(examples, tokenizer, label_index))
    windowed = sum(1 for f in ours_features if f["first_word"] > 0)

    # ---- our loop, built as run_finetune builds it
    epochs = args.warmup_rounds + args.rounds
    generator = _seed_everything(args.seed)
    ours_model = _build_model(fargs, task, check_model(model_dir))
    ours_shapes = BatchShapes(task.collate)
    loader = DataLoader(ours_features, batch_size=args.batch_size, shuffle=True, generator=generator,
                        collate_fn=ours_shapes, num_workers=0)
    optimizer = build_optimizer("adamw", parameter_groups(ours_model, WEIGHT_DECAY), lr=LEARNING_RATE,
                                weight_decay=WEIGHT_DECAY, device="cpu")
    scheduler = build_lr_scheduler(optimizer.optimizer, ScheduleConfig(warmup_ratio=WARMUP_RATIO),
                                   epochs * len(loader))
    stepper = _PlainStepper(ours_model, optimizer.optimizer, scheduler)
    device = torch.device("cpu")

    # ---- HF Trainer
    hf_model = AutoModelForTokenClassification.from_pretrained(
        model_dir, num_labels=len(task.labels), id2label=dict(enumerate(task.labels)), label2id=label_index)
    hf_shapes = BatchShapes(DataCollatorForTokenClassification(tokenizer))
    training_args = TrainingArguments(
        output_dir=tmp.name, per_device_train_batch_size=args.batch_size, learning_rate=LEARNING_RATE,
        num_train_epochs=epochs, warmup_steps=WARMUP_RATIO, weight_decay=WEIGHT_DECAY, max_grad_norm=1.0,
        report_to="none", save_strategy="no", eval_strategy="no", logging_strategy="no",
        dataloader_num_workers=0, use_cpu=True, disable_tqdm=True, seed=args.seed)

    sampler = RssSampler()
    records: dict[str, list[dict]] = {BASELINE: [], OURS: []}
    ours_losses: list[float] = []

    def run_ours(measure_memory: bool) -> None:
        first = len(ours_shapes.padded)
        if measure_memory:
            sampler.start()
        start = time.perf_counter()
        ours_losses.extend(train_epoch(stepper, loader, task, device))
        seconds = time.perf_counter() - start
        records[OURS].append({"seconds": seconds, "rss_growth_bytes": sampler.stop() if measure_memory else None,
                              "padded_tokens": ours_shapes.padded[first:], "real_tokens": ours_shapes.real[first:]})

    class Interleave(TrainerCallback):
        """Times each HF epoch and runs one epoch of ours before (odd rounds) or after (even) it."""

        round = 0
        start = 0.0
        first = 0
        warmup = False

        def on_epoch_begin(self, _args, state, control, **kwargs):
            self.warmup = self.round < args.warmup_rounds  # memory is sampled in warm-up rounds only
            if self.round % 2 == 1:
                run_ours(self.warmup)
            self.first = len(hf_shapes.padded)
            if self.warmup:
                sampler.start()
            self.start = time.perf_counter()

        def on_epoch_end(self, _args, state, control, **kwargs):
            seconds = time.perf_counter() - self.start
            records[BASELINE].append({"seconds": seconds, "rss_growth_bytes": sampler.stop() if self.warmup else None,
                                      "padded_tokens": hf_shapes.padded[self.first:],
                                      "real_tokens": hf_shapes.real[self.first:]})
            if self.round % 2 == 0:
                run_ours(self.warmup)
            self.round += 1
            print(f"round {self.round}/{epochs}{' (warm-up)' if self.round <= args.warmup_rounds else ''}: "
                  f"hf_trainer {records[BASELINE][-1]['seconds']:.2f} s, ours {records[OURS][-1]['seconds']:.2f} s",
                  flush=True)

    trainer = Trainer(model=hf_model, args=training_args, train_dataset=hf_train, data_collator=hf_shapes,
                      callbacks=[Interleave()])
    load_before = os.getloadavg()
    start = time.perf_counter()
    output = trainer.train()
    train_call_s = time.perf_counter() - start
    load_after = os.getloadavg()
    hf_optimizer = type(trainer.optimizer.optimizer if hasattr(trainer.optimizer, "optimizer") else trainer.optimizer)
    hf_epochs_s = sum(r["seconds"] for r in records[BASELINE])
    ours_epochs_s = sum(r["seconds"] for r in records[OURS])
    if len(records[BASELINE]) != epochs or len(records[OURS]) != epochs:
        print(f"bench_finetune: error: expected {epochs} epochs each, got {len(records[BASELINE])} HF and "
              f"{len(records[OURS])} ours", file=sys.stderr)
        return 1

    # ---- summary
    rows = {}
    for method, featurize_s, n_sequences in ((BASELINE, hf_tokenize_s, len(hf_train)),
                                             (OURS, ours_featurize_s, len(ours_features))):
        timed = records[method][args.warmup_rounds:]
        seconds = [r["seconds"] for r in timed]
        padded = [t for r in timed for t in r["padded_tokens"]]
        real = [t for r in timed for t in r["real_tokens"]]
        median = statistics.median(seconds)
        rows[method] = {
            "method": method, "role": "baseline" if method == BASELINE else "ours",
            "epoch_seconds_median": median, "epoch_seconds_best": min(seconds), "epoch_seconds_all": seconds,
            "warmup_epoch_seconds": [r["seconds"] for r in records[method][:args.warmup_rounds]],
            "examples_per_s_median": n / median, "examples_per_s_best": n / min(seconds),
            "sequences_per_epoch": n_sequences, "steps_per_epoch": len(timed[0]["padded_tokens"]),
            "padded_tokens_per_round": [sum(r["padded_tokens"]) for r in timed],
            "mean_padded_tokens_per_epoch": sum(padded) / len(timed),
            "mean_padded_tokens_per_batch": statistics.fmean(padded),
            "mean_real_tokens_per_batch": statistics.fmean(real),
            "padding_fraction": 1 - sum(real) / sum(padded),
            "padded_tokens_per_s_median": statistics.median(sum(r["padded_tokens"]) / r["seconds"] for r in timed),
            "featurize_seconds_best_of_3": featurize_s,
            "warmup_peak_rss_growth_mib": [r["rss_growth_bytes"] / 2 ** 20
                                           for r in records[method][:args.warmup_rounds]],
        }
    # The headline ratio: per round, ours / hf examples/s, then the median over rounds. A round's two
    # epochs ran back to back, so each ratio sees (nearly) one machine load; the ratio of the two
    # medians does not, and is skewed when the load changes mid-run.
    pairs = list(zip(records[BASELINE][args.warmup_rounds:], records[OURS][args.warmup_rounds:]))
    per_round = [h["seconds"] / o["seconds"] for h, o in pairs]
    per_round_tokens = [(sum(o["padded_tokens"]) / o["seconds"]) / (sum(h["padded_tokens"]) / h["seconds"])
                        for h, o in pairs]
    for method, row in rows.items():
        mine = method == OURS
        row["ratio_per_round"] = per_round if mine else [1.0] * len(pairs)
        row["ratio_vs_baseline"] = statistics.median(per_round) if mine else 1.0
        row["ratio_padded_tokens_per_s_per_round"] = per_round_tokens if mine else [1.0] * len(pairs)
        row["ratio_padded_tokens_per_s_vs_baseline"] = statistics.median(per_round_tokens) if mine else 1.0
        row["ratio_of_medians_vs_baseline"] = row["examples_per_s_median"] / rows[BASELINE]["examples_per_s_median"]
    hf_overhead_s = train_call_s - hf_epochs_s - ours_epochs_s

    print(f"\nNCBI-disease, first {n} training sentences; {'/'.join(model_dir.rstrip('/').split('/')[-2:])} fp32; batch "
          f"{args.batch_size}, max_length {MAX_LENGTH}; {args.rounds} timed rounds (+{args.warmup_rounds} warm-up), "
          f"interleaved; torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{torch.get_num_threads()} threads, {os.cpu_count()} CPUs; load average {load_before[0]:.2f} -> "
          f"{load_after[0]:.2f}")
    print(f"{'method':<11} {'examples/s':>10} {'best':>7} {'s/epoch':>8} {'ratio':>6} {'steps':>5} "
          f"{'pad tok/epoch':>13} {'pad tok/batch':>13} {'real tok/batch':>14} {'featurize s':>11} {'RSS +MiB':>8}")
    for r in rows.values():
        print(f"{r['method']:<11} {r['examples_per_s_median']:10.1f} {r['examples_per_s_best']:7.1f} "
              f"{r['epoch_seconds_median']:8.2f} {r['ratio_vs_baseline']:6.2f} "
              f"{r['steps_per_epoch']:5d} {r['mean_padded_tokens_per_epoch']:13.0f} "
              f"{r['mean_padded_tokens_per_batch']:13.0f} {r['mean_real_tokens_per_batch']:14.0f} "
              f"{r['featurize_seconds_best_of_3']:11.3f} "
              f"{r['warmup_peak_rss_growth_mib'][-1] if args.warmup_rounds else float('nan'):8.1f}")
    ratio = rows[OURS]["ratio_vs_baseline"]
    print(f"ratio ours / hf_trainer examples/s, median of the per-round ratios: x{ratio:.2f} "
          f"({'ours faster' if ratio > 1 else 'HF faster'}; rounds: {', '.join(f'{x:.2f}' for x in per_round)}); "
          f"per padded token x{rows[OURS]['ratio_padded_tokens_per_s_vs_baseline']:.2f}; ratio of the medians "
          f"x{rows[OURS]['ratio_of_medians_vs_baseline']:.2f}")
    print(f"sequences per epoch: hf {len(hf_train)} ({hf_truncated} sentences truncated), ours {len(ours_features)} "
          f"({windowed} extra windows); HF optimizer {hf_optimizer.__name__}, ours "
          f"{type(optimizer.optimizer).__name__}; Trainer.train() set-up/tear-down {hf_overhead_s:.2f} s "
          f"(whole call {train_call_s:.1f} s); mean training loss over the run: hf {output.training_loss:.4f}, "
          f"ours {statistics.fmean(ours_losses):.4f}")

    result = {
        "task": "ncbi-disease", "model": model_dir, "train_sentences": n, "batch_size": args.batch_size,
        "max_length": MAX_LENGTH, "learning_rate": LEARNING_RATE, "rounds": args.rounds,
        "warmup_rounds": args.warmup_rounds, "seed": args.seed, "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
        "transformers": transformers.__version__, "load_average_before": load_before[0],
        "load_average_after": load_after[0], "baseline": BASELINE,
        "hf_sentences_truncated": hf_truncated, "ours_extra_windows": windowed,
        "hf_optimizer": hf_optimizer.__name__, "ours_optimizer": type(optimizer.optimizer).__name__,
        "hf_train_call_seconds": train_call_s, "hf_train_setup_teardown_seconds": hf_overhead_s,
        "hf_mean_training_loss": output.training_loss, "ours_mean_training_loss": statistics.fmean(ours_losses),
        "results": list(rows.values()),
    }
    write_results(args.output, result)
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
