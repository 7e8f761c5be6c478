#!/usr/bin/env python
"""build_vocab's word table on real text: how it grows, what it costs, what a bound changes.

    python benchmarks/bench_vocab_words.py [INPUT ...] [--vocab-size 30522] [--bounds 0.5 0.25 0.1]
        [--output benchmarks/results/vocab_words.json]

INPUT: text (one document per line), JSONL or PubMed XML files, read in the order given as one
corpus (default: the embedded sample, ``data/sample``). An input that does not exist is skipped
with a line saying so, and the run goes on with the others.

1. **Growth.** The words are counted as :class:`tokenization.vocab.BertWordCounter` counts them
   (uncased), and the distinct words are read at prefixes of 128 KiB, 256 KiB, ... of text and at
   the end. Heaps' law, distinct = K n^β (n: UTF-8 bytes of text), is fitted by least squares in
   log-log over the prefixes of at least ``--fit-from`` bytes and projected to the full PubMed
   baseline (~36M citations, ~20 GB of abstract text) and per million documents (at the
   baseline's ~556 bytes of text per document, not this corpus's).
2. **Memory per distinct word**, each stage in a fresh process (peak resident memory from the
   kernel's ``VmHWM``, reset through ``/proc/self/clear_refs`` as the stage starts):
   the counting (the Python ``Counter`` of words, its objects summed with ``sys.getsizeof``, and
   the stage's peak, which holds the table of not yet folded chunks too) and the trainer
   (``wordpiece_merges``: HF's ``WordPieceTrainer``, fed every word again; its peak above the
   counted table, per distinct word it learns from).
3. **The bound.** The same with ``max_distinct_words`` at each fraction of ``--bounds`` of the
   unbounded distinct words (measured in the same run): words kept, what was dropped, the peaks,
   and the vocabulary against the unbounded one (share of its entries present, share at the same
   id), all as ratios to the unbounded run. The bound is checked at each fold (every
   ``--fold-every`` distinct chunks, as build_vocab does every 1,000,000): a corpus with fewer
   distinct chunks is pruned once, at the end; a smaller ``--fold-every`` shows the repeated
   prunes of a corpus many windows long (PubMed: thousands).

Results go to ``benchmarks/results/vocab_words.json``.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import platform
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from _results import write_results  # benchmarks/ is on sys.path when a benchmark runs

REPO = Path(__file__).resolve().parents[1]
DEFAULT_INPUTS = [REPO / "data" / "sample" / "sywada_PubMedAbstract_1MB.txt",
                  REPO / "data" / "sample" / "medline16n0902_sample.xml.gz"]
FULL_BASELINE = {"citations": 36_000_000, "abstract_text_bytes": 20e9}
BYTES_PER_DOCUMENT = FULL_BASELINE["abstract_text_bytes"] / FULL_BASELINE["citations"]
FIRST_PREFIX = 128 << 10
MiB = 1 << 20


def _peak_reset() -> int:
    """Reset the process's peak resident memory to its current one; that current one, in bytes."""
    Path("/proc/self/clear_refs").write_text("5")
    return _status_bytes("VmHWM")


def _status_bytes(field: str) -> int:
    status = Path("/proc/self/status").read_text()
    return int(re.search(rf"^{field}:\s+(\d+) kB", status, re.MULTILINE).group(1)) * 1024


def table_bytes(counts: dict) -> int:
    """Bytes of a word -> count dict's objects: the hash table, the words, the counts not cached
    by CPython (> 256)."""
    return (sys.getsizeof(counts) + sum(sys.getsizeof(word) for word in counts)
            + sum(sys.getsizeof(n) for n in counts.values() if n > 256))


def growth(inputs: list[str]) -> dict:
    """Distinct words at each prefix size (child process), and the counted table's bytes."""
    from biomed_lm.tokenization.sources import iter_texts
    from biomed_lm.tokenization.vocab import BertWordCounter

    counter = BertWordCounter(lowercase=True)
    points, text_bytes, documents, next_point = [], 0, 0, FIRST_PREFIX
    for text in iter_texts(inputs):
        counter.update(text)
        text_bytes += len(text.encode("utf-8"))
        documents += 1
        if text_bytes >= next_point:
            points.append({"text_bytes": text_bytes, "documents": documents, "distinct": len(counter.counts())})
            next_point *= 2
    counts = counter.counts()
    if not points or points[-1]["text_bytes"] != text_bytes:
        points.append({"text_bytes": text_bytes, "documents": documents, "distinct": len(counts)})
    return {"points": points, "occurrences": sum(counts.values()), "table_bytes": table_bytes(counts)}


def fit_heaps(points: list[dict], fit_from: int) -> dict:
    """distinct = K n^beta, least squares in log-log over the points of at least ``fit_from`` bytes."""
    used = [p for p in points if p["text_bytes"] >= fit_from] or points
    if len(used) < 2:
        return {"K": None, "beta": None, "points_used": len(used)}
    xs = [math.log(p["text_bytes"]) for p in used]
    ys = [math.log(p["distinct"]) for p in used]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    beta = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return {"K": math.exp(my - beta * mx), "beta": beta, "points_used": len(used),
            "from_bytes": used[0]["text_bytes"]}


def stage_memory(inputs: list[str], vocab_size: int, bound: int | None, fold_every: int) -> dict:
    """build_vocab's WordPiece path in steps (child process): counting, then the trainer, each
    with its own peak; the vocabulary it assembles."""
    from biomed_lm.tokenization.sources import iter_texts
    from biomed_lm.tokenization.vocab import (BertWordCounter, VocabConfig, alphabet_of, assemble_vocab,
                                              special_tokens, trainable_words, wordpiece_merges)

    config = VocabConfig(vocab_size=vocab_size, max_distinct_words=bound)
    base = _peak_reset()
    started = time.perf_counter()
    counter = BertWordCounter(config.lowercase, fold_every, max_distinct_words=bound)
    for text in iter_texts(inputs):
        counter.update(text)
    counts = counter.counts()
    count_peak, count_seconds = _status_bytes("VmHWM"), time.perf_counter() - started
    specials = special_tokens(config.special_token_layout)
    alphabet = alphabet_of(counts, config.limit_alphabet)
    words = trainable_words(counts, alphabet)
    before_trainer = _peak_reset()
    started = time.perf_counter()
    merged = wordpiece_merges(words, alphabet, specials, config)
    trainer_peak, trainer_seconds = _status_bytes("VmHWM"), time.perf_counter() - started
    vocab = assemble_vocab({t: -rank for rank, t in enumerate(merged)}, alphabet, specials, vocab_size)
    pruning = counter.pruning.card() if counter.pruning else None
    return {"bound": bound, "distinct": len(counts), "trainable": len(words), "table_bytes": table_bytes(counts),
            "occurrences": sum(counts.values()), "pruning": pruning,
            "count_peak_above_start": count_peak - base, "trainer_peak_above_table": trainer_peak - before_trainer,
            "stage_peak_above_start": max(count_peak, trainer_peak) - base,
            "count_seconds": count_seconds, "trainer_seconds": trainer_seconds, "vocab": vocab}


def in_child(fn, *args):
    """``fn(*args)`` in a fresh process, so each peak is that stage's alone."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def compare(run: dict, unbounded: dict) -> dict:
    """A bounded run as ratios to the unbounded one, and its vocabulary against the unbounded one's."""
    mine, theirs = run["vocab"], unbounded["vocab"]
    same_id = sum(a == b for a, b in zip(mine, theirs))
    return {"distinct": run["distinct"] / unbounded["distinct"],
            "count_peak": run["count_peak_above_start"] / unbounded["count_peak_above_start"],
            "trainer_peak": run["trainer_peak_above_table"] / unbounded["trainer_peak_above_table"],
            "stage_peak": run["stage_peak_above_start"] / unbounded["stage_peak_above_start"],
            "vocab_entries_shared": len(set(mine) & set(theirs)) / len(theirs),
            "vocab_entries_same_id": same_id / len(theirs)}


def project(fit: dict, per_word: dict) -> list[dict]:
    """Distinct words and table/peak bytes at PubMed sizes, from the fit and the bytes per word."""
    rows = []
    for documents in (1_000_000, 10_000_000, FULL_BASELINE["citations"]):
        n = documents * BYTES_PER_DOCUMENT
        distinct = fit["K"] * n ** fit["beta"]
        rows.append({"documents": documents, "text_bytes": n, "distinct": distinct,
                     **{f"{name}_bytes": distinct * b for name, b in per_word.items()}})
    return rows


def print_growth(points: list[dict], fit: dict) -> None:
    print("text MB | documents | distinct words | K n^beta")
    for p in points:
        model = fit["K"] * p["text_bytes"] ** fit["beta"] if fit["beta"] else float("nan")
        print(f"{p['text_bytes'] / 1e6:7.2f} | {p['documents']:9,} | {p['distinct']:14,} | {model:11,.0f}")
    if fit["beta"]:
        print(f"Heaps' law over the prefixes of >= {fit['from_bytes'] / 1e6:.2f} MB: "
              f"distinct = {fit['K']:.2f} n^{fit['beta']:.3f} (n: bytes of text)")


def print_memory(unbounded: dict, per_word: dict, projection: list[dict]) -> None:
    print(f"\nunbounded: {unbounded['distinct']:,} distinct words ({unbounded['trainable']:,} trainable), "
          f"{unbounded['occurrences']:,} occurrences")
    print("bytes per distinct word: " + ", ".join(f"{k} {v:.0f}" for k, v in per_word.items()))
    print("projection (at %.0f bytes of text per document):" % BYTES_PER_DOCUMENT)
    print("documents | text GB | distinct words | " + " | ".join(f"{k} GiB" for k in per_word))
    for row in projection:
        print(f"{row['documents']:>10,} | {row['text_bytes'] / 1e9:7.2f} | {row['distinct']:14,.0f} | "
              + " | ".join(f"{row[f'{k}_bytes'] / 2 ** 30:.2f}" for k in per_word))


def print_bounds(runs: list[dict], unbounded: dict) -> None:
    print("\nbound | distinct kept | dropped words (occurrences, share of all) | t | count peak MiB | "
          "trainer peak MiB | stage peak MiB | vocab shared | same id | count s | trainer s")
    for run in [unbounded, *runs]:
        r = run.get("vs_unbounded") or {k: 1.0 for k in ("count_peak", "trainer_peak", "stage_peak",
                                                            "vocab_entries_shared", "vocab_entries_same_id")}
        p = run["pruning"] or {"words_dropped": 0, "occurrences_dropped": 0, "threshold": 0}
        share = p["occurrences_dropped"] / unbounded["occurrences"]
        print(f"{run['bound'] or 'none':>9} | {run['distinct']:,} | {p['words_dropped']:,} "
              f"({p['occurrences_dropped']:,}, {share:.2%}) | {p['threshold']} | "
              f"{run['count_peak_above_start'] / MiB:.0f} ({r['count_peak']:.2f}) | "
              f"{run['trainer_peak_above_table'] / MiB:.0f} ({r['trainer_peak']:.2f}) | "
              f"{run['stage_peak_above_start'] / MiB:.0f} ({r['stage_peak']:.2f}) | "
              f"{r['vocab_entries_shared']:.1%} | {r['vocab_entries_same_id']:.1%} | "
              f"{run['count_seconds']:.1f} | {run['trainer_seconds']:.1f}")


def present_inputs(names: list[str]) -> list[str]:
    """The inputs that exist, in order; each missing one is named as skipped."""
    present = []
    for name in names:
        if Path(name).exists():
            present.append(name)
        else:
            print(f"skipped: {name} does not exist")
    return present


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("inputs", nargs="*", default=[str(p) for p in DEFAULT_INPUTS])
    parser.add_argument("--vocab-size", type=int, default=30522)
    parser.add_argument("--bounds", type=float, nargs="*", default=[0.5, 0.25, 0.1],
                        help="max_distinct_words as fractions of the unbounded distinct words")
    parser.add_argument("--fold-every", type=int, default=1_000_000,
                        help="distinct chunks between folds (and prunes); build_vocab's is 1,000,000")
    parser.add_argument("--fit-from", type=float, default=1e6,
                        help="fit Heaps' law over the prefixes of at least this many bytes")
    parser.add_argument("--output", default=str(REPO / "benchmarks" / "results" / "vocab_words.json"))
    args = parser.parse_args(argv)
    inputs = present_inputs(args.inputs)
    if not inputs:
        print("skipped: none of the inputs exists")
        return 0
    print(f"inputs: {', '.join(inputs)}; {platform.processor() or platform.machine()}, "
          f"{multiprocessing.cpu_count()} CPUs, Python {platform.python_version()}")
    grown = in_child(growth, inputs)
    fit = fit_heaps(grown["points"], args.fit_from)
    print_growth(grown["points"], fit)
    unbounded = in_child(stage_memory, inputs, args.vocab_size, None, args.fold_every)
    per_word = {"table": unbounded["table_bytes"] / unbounded["distinct"],
                "counting_peak": unbounded["count_peak_above_start"] / unbounded["distinct"],
                "trainer_peak": unbounded["trainer_peak_above_table"] / unbounded["trainable"]}
    projection = project(fit, per_word) if fit["beta"] else []
    print_memory(unbounded, per_word, projection)
    runs = []
    for fraction in args.bounds:
        bound = max(1, int(unbounded["distinct"] * fraction))
        run = in_child(stage_memory, inputs, args.vocab_size, bound, args.fold_every)
        run["fraction"], run["vs_unbounded"] = fraction, compare(run, unbounded)
        runs.append(run)
    print_bounds(runs, unbounded)
    for run in [unbounded, *runs]:
        run["vocab_size"] = len(run.pop("vocab"))
    write_results(args.output, {"inputs": inputs, "growth": grown, "heaps_fit": fit, "bytes_per_word": per_word,
                                "projection": projection, "unbounded": unbounded, "bounded": runs,
                                "fold_every": args.fold_every,
                                "machine": {"cpus": multiprocessing.cpu_count(), "python": platform.python_version()}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
