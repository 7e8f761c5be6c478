#!/usr/bin/env python
"""Pretraining-instance creation throughput (instances/s, tokens/s) against the obvious approach, in one run.

    python benchmarks/bench_pretraining_data.py [--corpus DIR --tokenizer DIR] [--replicas 4]
        [--max-seq-lengths 128 512] [--repeats 3]

Input: the demo corpus (the embedded sample, 1,168 abstracts; built here in a temporary folder with
the demo configs unless ``--corpus``/``--tokenizer`` are given) replicated ``--replicas`` times, and
the demo's in-domain vocabulary. Methods, all writing a saved ``datasets`` dataset with the same
columns:

* ``hf_loop`` (baseline): the obvious Hugging Face way, as ``TextDatasetForNextSentencePrediction``
  did (transformers 5 no longer has it): a Python loop over the documents calling
  ``tokenizer(sentences, add_special_tokens=False)`` per document, the whole tokenized corpus kept
  in Python lists, Google's instance loop with ``random.Random`` (per-token truncation), special
  tokens and segment ids added per instance (transformers 5 dropped ``build_inputs_with_special_tokens``),
  word starts from ``convert_ids_to_tokens``, then ``Dataset.from_dict(...).save_to_disk``;
* ``ours_np1`` and ``ours_np2``: :func:`pretrain.instance_builder.create_pretraining_data` with 1 and 2 worker
  processes (batched tokenization, ``datasets.map``, summary pass, sharded save).

Each measurement runs in a fresh process (so tokenizer thread pools and page caches of one do not
help another), ``--repeats`` times round-robin; the best time counts. Times exclude interpreter
start-up and imports, include reading the corpus and writing the output. Peak RSS is the process's
(``ru_maxrss``, worker processes included for ours). Results go to
``benchmarks/results/pretraining_data.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _results import write_results  # benchmarks/ is on sys.path when a benchmark runs

REPO = Path(__file__).resolve().parents[1]
BASELINE = "hf_loop"
METHODS = (BASELINE, "ours_np1", "ours_np2")


# ----------------------------------------------------------------------------- the baseline

def hf_loop(corpus_dir: str, tokenizer_dir: str, output_dir: str, max_seq_length: int, seed: int) -> dict:
    """The obvious Hugging Face way (the module docstring's ``hf_loop``): tokenize per document, Google's
    instance loop over Python lists, ``Dataset.from_dict(...).save_to_disk``."""
    import datasets

    from biomed_lm.tokenization.tokenizer_io import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_dir)
    documents = tokenize_per_document(tokenizer, datasets.load_from_disk(corpus_dir))
    columns = nsp_instances(documents, tokenizer, max_seq_length, random.Random(seed))
    features = datasets.Features({"input_ids": datasets.List(datasets.Value("int32")),
                                  "token_type_ids": datasets.List(datasets.Value("int8")),
                                  "next_sentence_label": datasets.Value("int8"),
                                  "word_starts": datasets.List(datasets.Value("int8"))})
    dataset = datasets.Dataset.from_dict(columns, features=features)
    dataset.save_to_disk(output_dir)
    lengths = [len(ids) for ids in columns["input_ids"]]
    return {"instances": len(lengths), "tokens": sum(lengths),
            "not_next_fraction": sum(columns["next_sentence_label"]) / max(1, len(lengths))}


def tokenize_per_document(tokenizer, corpus) -> list[list[list[int]]]:
    """Each document's sentences as token ids, one tokenizer call per document; empty sentences and
    documents left out. The whole tokenized corpus stays in Python lists."""
    documents = []
    for row in corpus:
        ids = tokenizer(row["sentences"], add_special_tokens=False)["input_ids"] if row["sentences"] else []
        document = [sentence for sentence in ids if sentence]
        if document:
            documents.append(document)
    return documents


def nsp_instances(documents: list[list[list[int]]], tokenizer, max_seq_length: int,
                  rng: random.Random) -> dict[str, list]:
    """Google's instance loop: chunks of sentences up to a target length (a shorter one time in ten), each
    split into A and B, where B is the rest of the chunk or (for a one-sentence chunk always, else half the
    time; label 1) drawn from another document, the chunk's unused sentences then put back."""
    columns = {"input_ids": [], "token_type_ids": [], "next_sentence_label": [], "word_starts": []}
    max_num_tokens = max_seq_length - 3
    for index, document in enumerate(documents):
        target = max_num_tokens if rng.random() >= 0.1 else rng.randint(2, max_num_tokens)
        chunk, length, i = [], 0, 0
        while i < len(document):
            chunk.append(document[i])
            length += len(document[i])
            if i == len(document) - 1 or length >= target:
                a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
                tokens_a = [t for sentence in chunk[:a_end] for t in sentence]
                if len(chunk) == 1 or rng.random() < 0.5:
                    label = 1
                    tokens_b = random_next(documents, index, target - len(tokens_a), rng)
                    i -= len(chunk) - a_end
                else:
                    label = 0
                    tokens_b = [t for sentence in chunk[a_end:] for t in sentence]
                truncate_pair(tokens_a, tokens_b, max_num_tokens, rng)
                append_instance(columns, tokenizer, tokens_a, tokens_b, label)
                chunk, length = [], 0
            i += 1
    return columns


def random_next(documents: list[list[list[int]]], index: int, target_b: int, rng: random.Random) -> list[int]:
    """Segment B from a random document other than ``documents[index]``: its sentences from a random one
    on, until ``target_b`` tokens are reached."""
    tokens_b = []
    other = index
    while other == index:
        other = rng.randint(0, len(documents) - 1)
    random_document = documents[other]
    for sentence in random_document[rng.randint(0, len(random_document) - 1):]:
        tokens_b.extend(sentence)
        if len(tokens_b) >= target_b:
            break
    return tokens_b


def truncate_pair(tokens_a: list[int], tokens_b: list[int], max_num_tokens: int, rng: random.Random) -> None:
    """Per-token truncation, in place: a token off the front or the back of the longer segment at a time."""
    while len(tokens_a) + len(tokens_b) > max_num_tokens:
        longer = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        if rng.random() < 0.5:
            del longer[0]
        else:
            longer.pop()


def append_instance(columns: dict[str, list], tokenizer, tokens_a: list[int], tokens_b: list[int],
                    label: int) -> None:
    """One instance's columns: special tokens and segment ids added here, word starts from
    ``convert_ids_to_tokens``."""
    input_ids = [tokenizer.cls_token_id, *tokens_a, tokenizer.sep_token_id, *tokens_b, tokenizer.sep_token_id]
    pieces = tokenizer.convert_ids_to_tokens(input_ids)
    columns["input_ids"].append(input_ids)
    columns["token_type_ids"].append([0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1))
    columns["next_sentence_label"].append(label)
    columns["word_starts"].append([0 if p in ("[CLS]", "[SEP]") or p.startswith("##") else 1 for p in pieces])


def ours(corpus_dir: str, tokenizer_dir: str, output_dir: str, max_seq_length: int, seed: int,
         num_proc: int) -> dict:
    from biomed_lm.pretrain.instance_builder import PretrainingDataConfig, create_pretraining_data

    metadata = create_pretraining_data(PretrainingDataConfig(
        corpus=corpus_dir, tokenizer=tokenizer_dir, output_dir=output_dir, max_seq_length=max_seq_length,
        seed=seed, num_proc=num_proc), progress=False)
    summary = metadata["summary"]
    return {"instances": summary["instances"], "tokens": summary["tokens"],
            "not_next_fraction": summary["not_next_fraction"]}


def run_one(method: str, corpus_dir: str, tokenizer_dir: str, max_seq_length: int, seed: int) -> dict:
    """One measurement, in this (fresh) process."""
    import datasets  # imports are not timed (AutoTokenizer pulls in torch: seconds)
    from transformers import AutoTokenizer  # noqa: F401

    import biomed_lm.pretrain.instance_builder  # noqa: F401

    datasets.disable_progress_bars()
    output_dir = tempfile.mkdtemp(prefix=f"bench_{method}_")
    try:
        started = time.perf_counter()
        if method == BASELINE:
            result = hf_loop(corpus_dir, tokenizer_dir, output_dir, max_seq_length, seed)
        else:
            result = ours(corpus_dir, tokenizer_dir, output_dir, max_seq_length, seed,
                          num_proc=int(method.removeprefix("ours_np")))
        result["seconds"] = time.perf_counter() - started
    finally:
        shutil.rmtree(output_dir, ignore_errors=True)
    rss = [resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    result["peak_rss_mib"] = max(rss) / 1024
    return result


# ----------------------------------------------------------------------------- driver

def demo_inputs(work: Path) -> tuple[Path, Path]:
    """The demo's corpus and vocabulary, built with the demo configs."""
    from biomed_lm.config import load_yaml_mapping
    from biomed_lm.tokenization.corpus import CorpusConfig, prepare_corpus
    from biomed_lm.tokenization.vocab import VocabConfig, build_vocab

    corpus_options = load_yaml_mapping(REPO / "configs" / "corpus" / "demo.yaml")
    corpus_options["inputs"] = [str(REPO / path) for path in corpus_options["inputs"]]
    prepare_corpus(CorpusConfig(**corpus_options, output_dir=str(work / "corpus"), num_proc=2))
    vocab_options = {k: v for k, v in load_yaml_mapping(REPO / "configs" / "vocab" / "demo.yaml").items()
                     if k != "inputs"}
    build_vocab([str(work / "corpus")], str(work / "vocab"), VocabConfig(**vocab_options), progress=False)
    return work / "corpus", work / "vocab"


def replicate(corpus: Path, replicas: int, out: Path) -> Path:
    import datasets

    dataset = datasets.load_from_disk(str(corpus))
    datasets.concatenate_datasets([dataset] * replicas).save_to_disk(str(out))
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, help="prepared corpus (default: the demo corpus, built here)")
    parser.add_argument("--tokenizer", type=Path, help="tokenizer directory (default: the demo vocabulary)")
    parser.add_argument("--replicas", type=int, default=4, help="copies of the corpus's documents")
    parser.add_argument("--max-seq-lengths", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=12345)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--output", type=Path, default=REPO / "benchmarks" / "results" / "pretraining_data.json")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # internal: run one measurement, print JSON
    args = parser.parse_args(argv)
    if not args.worker and (args.corpus is None) != (args.tokenizer is None):
        parser.error("give both --corpus and --tokenizer, or neither")
    return args


def measure_once(method: str, corpus: Path, tokenizer: Path, max_seq_length: int, seed: int) -> dict:
    """One measurement of ``method``, in a fresh process (this script with ``--worker``)."""
    command = [sys.executable, __file__, "--worker", method, "--corpus", str(corpus),
               "--tokenizer", str(tokenizer), "--max-seq-lengths", str(max_seq_length),
               "--seed", str(seed)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure_length(args, corpus: Path, tokenizer: Path, max_seq_length: int, documents: int) -> list[dict]:
    """Every method ``--repeats`` times at one sequence length: a row per method, from its best run."""
    runs: dict[str, list[dict]] = {m: [] for m in args.methods}
    for _ in range(args.repeats):
        for method in args.methods:  # round-robin, so drift in machine speed hits every method alike
            runs[method].append(measure_once(method, corpus, tokenizer, max_seq_length, args.seed))
    rows = []
    for method in args.methods:
        best = min(runs[method], key=lambda r: r["seconds"])
        rows.append({"max_seq_length": max_seq_length, "method": method, "documents": documents,
                     "seconds_best": best["seconds"],
                     "seconds_all": [round(r["seconds"], 3) for r in runs[method]],
                     "instances": best["instances"], "tokens": best["tokens"],
                     "instances_per_s": best["instances"] / best["seconds"],
                     "tokens_per_s": best["tokens"] / best["seconds"],
                     "documents_per_s": documents / best["seconds"],
                     "not_next_fraction": best["not_next_fraction"],
                     "peak_rss_mib": max(r["peak_rss_mib"] for r in runs[method])})
    return rows


def throughput_ratios(rows: list[dict]) -> dict[str, float]:
    """Instances/s of each of our methods over the baseline's, per sequence length."""
    ratios = {}
    for row in rows:
        base = next((r for r in rows if r["method"] == BASELINE and r["max_seq_length"] == row["max_seq_length"]),
                    None)
        if base and row["method"] != BASELINE:
            ratios[f"{row['method']}/{BASELINE}@{row['max_seq_length']}"] = \
                row["instances_per_s"] / base["instances_per_s"]
    return ratios


def print_table(args, documents: int, rows: list[dict], ratios: dict[str, float]) -> None:
    print(f"corpus: {documents:,} documents ({args.replicas} x {args.corpus or 'the demo corpus'}), "
          f"best of {args.repeats}, {os.cpu_count()} CPUs")
    print(f"{'len':>4} {'method':<9} {'best s':>7} {'instances':>9} {'inst/s':>8} {'tokens/s':>9} {'docs/s':>7} "
          f"{'NotNext':>7} {'peak RSS MiB':>12}")
    for r in rows:
        print(f"{r['max_seq_length']:>4} {r['method']:<9} {r['seconds_best']:7.2f} {r['instances']:9,d} "
              f"{r['instances_per_s']:8,.0f} {r['tokens_per_s']:9,.0f} {r['documents_per_s']:7,.0f} "
              f"{r['not_next_fraction']:7.3f} {r['peak_rss_mib']:12.0f}")
    for name, value in ratios.items():
        print(f"throughput {name}: x{value:.2f}")


def result_json(args, documents: int, rows: list[dict], ratios: dict[str, float]) -> dict:
    import datasets
    import tokenizers
    import transformers

    return {"documents": documents, "replicas": args.replicas, "repeats": args.repeats, "seed": args.seed,
            "cpu_count": os.cpu_count(), "python": platform.python_version(),
            "versions": {"datasets": datasets.__version__, "tokenizers": tokenizers.__version__,
                         "transformers": transformers.__version__},
            "results": rows, "ratios": ratios}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(run_one(args.worker, str(args.corpus), str(args.tokenizer), args.max_seq_lengths[0],
                                 args.seed)))
        return 0

    import datasets

    with tempfile.TemporaryDirectory(prefix="bench_pretraining_data_") as tmp:
        work = Path(tmp)
        corpus, tokenizer = (args.corpus, args.tokenizer) if args.corpus else demo_inputs(work)
        corpus = replicate(corpus, args.replicas, work / "replicated")
        documents = len(datasets.load_from_disk(str(corpus)))
        rows = [row for max_seq_length in args.max_seq_lengths
                for row in measure_length(args, corpus, tokenizer, max_seq_length, documents)]
    ratios = throughput_ratios(rows)
    print_table(args, documents, rows, ratios)
    write_results(args.output, result_json(args, documents, rows, ratios))
    return 0


if __name__ == "__main__":
    sys.exit(main())
