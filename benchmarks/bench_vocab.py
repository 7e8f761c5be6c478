#!/usr/bin/env python
"""Vocabulary training throughput (MB/s of text) against stock implementations, in one run.

    python benchmarks/bench_vocab.py [--input data/sample/sywada_PubMedAbstract_1MB.txt]
        [--vocab-size 30522] [--repeats 3]

Measured on the same text, with the same vocabulary size, special tokens (bert layout),
min_frequency and alphabet limit:

* ``hf_bert_wordpiece`` (baseline): ``tokenizers.BertWordPieceTokenizer().train(files=...)``,
  HF's stock implementation, which reads the file itself in Rust;
* ``ours_wordpiece``: :func:`tokenization.vocab.train_vocab`, fed document by document through
  ``iter_texts`` (the reader every input format goes through) and building the final tokenizer;
* ``ours_unigram``: the same with ``algorithm="unigram"`` (SentencePiece unigram LM, exported);
* ``spm_unigram`` (reference for the unigram row): ``SentencePieceTrainer.train(input=...)`` on the
  raw file with SentencePiece's own normalization, which is not BERT's.

Each method runs ``--repeats`` times, round-robin; the best time gives the throughput. The table
also shows, as sanity checks of what was learnt, the vocabulary size reached, the share of the
baseline's vocabulary that each WordPiece-format vocabulary also has, and the subwords per word
on the input text (BERT's pipeline, for the three WordPiece-format vocabularies). Results go to
``benchmarks/results/vocab.json``.
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

from _results import write_results  # benchmarks/ is on sys.path when a benchmark runs

REPO = Path(__file__).resolve().parents[1]
DEFAULT_INPUT = REPO / "data" / "sample" / "sywada_PubMedAbstract_1MB.txt"
BASELINE = "hf_bert_wordpiece"


def run_hf_bert_wordpiece(path: Path, vocab_size: int, min_frequency: int, limit_alphabet: int):
    from tokenizers import BertWordPieceTokenizer

    from biomed_lm.tokenization.vocab import special_tokens

    tokenizer = BertWordPieceTokenizer(clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True)
    tokenizer.train(files=[str(path)], vocab_size=vocab_size, min_frequency=min_frequency,
                    limit_alphabet=limit_alphabet, special_tokens=special_tokens("bert"), show_progress=False)
    return tokenizer


def run_ours(algorithm: str) -> Callable:
    def run(path: Path, vocab_size: int, min_frequency: int, limit_alphabet: int):
        from biomed_lm.tokenization.sources import iter_texts
        from biomed_lm.tokenization.vocab import VocabConfig, train_vocab

        config = VocabConfig(vocab_size=vocab_size, algorithm=algorithm, min_frequency=min_frequency,
                             limit_alphabet=limit_alphabet)
        return train_vocab(iter_texts(path), config).tokenizer
    return run


def run_spm_unigram(path: Path, vocab_size: int, min_frequency: int, limit_alphabet: int):
    import sentencepiece as spm

    from biomed_lm.tokenization.vocab import _cpu_count

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(input=str(path), model_writer=model, model_type="unigram", vocab_size=vocab_size,
                                   hard_vocab_limit=False, character_coverage=1.0, max_sentence_length=1 << 16,
                                   num_threads=_cpu_count(), minloglevel=2)
    return spm.SentencePieceProcessor(model_proto=model.getvalue())


METHODS: dict[str, Callable] = {
    BASELINE: run_hf_bert_wordpiece,
    "ours_wordpiece": run_ours("wordpiece"),
    "ours_unigram": run_ours("unigram"),
    "spm_unigram": run_spm_unigram,
}
ROLES = {BASELINE: "baseline", "ours_wordpiece": "ours", "ours_unigram": "ours", "spm_unigram": "reference"}


def subwords_per_word(tokenizer, texts: list[str]) -> float | None:
    """Subwords per BERT word over ``texts``, for ``tokenizers`` tokenizers (None otherwise)."""
    if not hasattr(tokenizer, "encode_batch"):
        return None
    tokenizer = getattr(tokenizer, "_tokenizer", tokenizer)  # BertWordPieceTokenizer wraps one
    pieces = words = 0
    for encoding in tokenizer.encode_batch(texts, add_special_tokens=False):
        pieces += len(encoding.ids)
        words += len({w for w in encoding.word_ids if w is not None})
    return pieces / words if words else None


def vocab_of(tokenizer) -> set[str]:
    if hasattr(tokenizer, "get_vocab"):
        return set(tokenizer.get_vocab())
    return {tokenizer.id_to_piece(i) for i in range(tokenizer.get_piece_size())}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", type=Path, default=DEFAULT_INPUT, help="plain text, one document per line")
    parser.add_argument("--vocab-size", type=int, default=30522)
    parser.add_argument("--min-frequency", type=int, default=2)
    parser.add_argument("--limit-alphabet", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--output", type=Path, default=REPO / "benchmarks" / "results" / "vocab.json")
    return parser.parse_args(argv)


def measure_methods(args) -> tuple[dict[str, list[float]], dict[str, object]]:
    """Every method ``--repeats`` times: the seconds of each run, and each method's tokenizer of the last repeat."""
    times: dict[str, list[float]] = {m: [] for m in args.methods}
    last_trained: dict[str, object] = {}
    for _ in range(args.repeats):
        for method in args.methods:  # round-robin, so drift in machine speed hits every method alike
            start = time.perf_counter()
            last_trained[method] = METHODS[method](args.input, args.vocab_size, args.min_frequency,
                                                   args.limit_alphabet)
            times[method].append(time.perf_counter() - start)
    return times, last_trained


def method_rows(args, times: dict[str, list[float]], last_trained: dict[str, object], mb: float, texts: list[str]
                ) -> list[dict]:
    """One row per method: its throughput (best run) and what its vocabulary learnt, against the baseline's."""
    rows = []
    baseline_vocab = vocab_of(last_trained[BASELINE]) if BASELINE in last_trained else None
    for method in args.methods:
        best = min(times[method])
        vocab = vocab_of(last_trained[method])
        shared = None
        if baseline_vocab and method != "spm_unigram":  # spm pieces are not in ## form
            shared = len(vocab & baseline_vocab) / len(baseline_vocab)
        rows.append({"method": method, "role": ROLES[method], "seconds_best": best,
                     "seconds_median": statistics.median(times[method]), "mb_per_s": mb / best,
                     "vocab_size": len(vocab), "shared_with_baseline": shared,
                     "subwords_per_word": subwords_per_word(last_trained[method], texts)})
    return rows


def throughput_ratios(methods: list[str], rows: list[dict]) -> dict[str, float]:
    """Throughput of each of ours over the baseline's, and the unigram one's over SentencePiece's too."""
    by = {r["method"]: r for r in rows}
    ratios = {}
    for method in methods:
        if ROLES[method] == "ours":
            for reference in (BASELINE, "spm_unigram" if method == "ours_unigram" else None):
                if reference in by:
                    ratios[f"{method}/{reference}"] = by[method]["mb_per_s"] / by[reference]["mb_per_s"]
    return ratios


def print_table(args, mb: float, texts: list[str], rows: list[dict], ratios: dict[str, float]) -> None:
    print(f"input {args.input} ({mb:.2f} MB, {len(texts)} documents), vocab_size {args.vocab_size}, "
          f"best of {args.repeats}, {os.cpu_count()} CPUs")
    print(f"{'method':<18} {'role':<9} {'best s':>8} {'median s':>9} {'MB/s':>7} {'vocab':>6} "
          f"{'shared w/ baseline':>18} {'subwords/word':>14}")
    for r in rows:
        spw = "-" if r["subwords_per_word"] is None else f"{r['subwords_per_word']:.3f}"
        shared = "-" if r["shared_with_baseline"] is None else f"{100 * r['shared_with_baseline']:.1f}%"
        print(f"{r['method']:<18} {r['role']:<9} {r['seconds_best']:8.3f} {r['seconds_median']:9.3f} "
              f"{r['mb_per_s']:7.2f} {r['vocab_size']:6d} {shared:>18} {spw:>14}")
    for name, value in ratios.items():
        print(f"throughput {name}: x{value:.2f}")


def summarize(args, mb: float, texts: list[str], rows: list[dict], ratios: dict[str, float]) -> dict:
    """The JSON result: the run's settings and machine, the libraries' versions, the rows and the ratios."""
    import sentencepiece
    import tokenizers

    return {"input": str(args.input), "input_mb": mb, "documents": len(texts), "vocab_size": args.vocab_size,
            "min_frequency": args.min_frequency, "limit_alphabet": args.limit_alphabet, "repeats": args.repeats,
            "cpu_count": os.cpu_count(), "python": platform.python_version(),
            "versions": {"tokenizers": tokenizers.__version__, "sentencepiece": sentencepiece.__version__},
            "results": rows, "ratios": ratios}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.input.is_file():
        print(f"bench_vocab: error: input not found: {args.input}", file=sys.stderr)
        return 2

    from biomed_lm.tokenization.sources import iter_texts

    texts = list(iter_texts(args.input))
    mb = args.input.stat().st_size / 1e6
    times, last_trained = measure_methods(args)
    rows = method_rows(args, times, last_trained, mb, texts)
    ratios = throughput_ratios(args.methods, rows)
    print_table(args, mb, texts, rows, ratios)
    write_results(args.output, summarize(args, mb, texts, rows, ratios))
    return 0


if __name__ == "__main__":
    sys.exit(main())
