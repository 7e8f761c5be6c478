"""Tests for build_vocab's bound on the word-count table (``max_distinct_words``, issue 24).

The counter against a step-by-step reference of word2vec's ReduceVocab (drop the words counted at
most t times, t += 1, again while over the bound), the bound never exceeded after a fold, the same
counts for the same texts (and the same vocabulary with one or two trainer threads), an unbounded
build byte-identical to the one before the option existed, a bound above the distinct words
changing nothing, and the card, the summary, the log and the CLI saying what was dropped.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from biomed_lm.tokenization.vocab import BertWordCounter, ChunkCounter, VocabBuildError, VocabConfig, build_vocab

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "data" / "sample" / "sywada_PubMedAbstract_1MB.txt"
SIZE = 3000
# sha256 of the files build_vocab wrote from SAMPLE at vocab_size 3000 (uncased, other options at
# their defaults) at commit a1d51c9, before max_distinct_words existed.
GOLDEN = {"wordpiece": ("vocab.txt", "8919546a97befd6cd054f01f67be9d02c9c4ad4e5845f8e4d3c75731eab3127c"),
          "sentencepiece": ("spiece.model", "718a76dcdc63bd3a2276700f772634cba08eb096692e8d05f86fb3df0a094cb3")}

# Texts of lowercase ASCII words: BERT's words are then the whitespace-separated ones, so the
# reference below can count them with str.split. A few words, Zipf-like by repetition.
WORDS = st.sampled_from([f"w{i}" for i in range(40)] + ["a", "a", "a", "b", "b", "c"])
TEXTS = st.lists(st.lists(WORDS, max_size=12).map(" ".join), max_size=25)


def reduce_vocab_reference(texts: list[str], bound: int) -> tuple[Counter, int]:
    """Word counts folded after every text, pruned as word2vec's ReduceVocab would, one t at a time."""
    words: Counter = Counter()
    t = 0
    for text in texts:
        words.update(text.split())
        while len(words) > bound:
            t += 1
            for word in [w for w, n in words.items() if n <= t]:
                del words[word]
    return words, t


def counted(texts: list[str], bound: int | None, fold_every: int = 1) -> BertWordCounter:
    counter = BertWordCounter(lowercase=True, fold_every=fold_every, max_distinct_words=bound)
    for text in texts:
        counter.update(text)
    counter.counts()
    return counter


@settings(max_examples=300, deadline=None)
@given(texts=TEXTS, bound=st.integers(1, 30))
def test_pruning_is_word2vecs_reduce_vocab(texts, bound):
    expected, threshold = reduce_vocab_reference(texts, bound)
    counter = counted(texts, bound)
    assert counter.counts() == expected
    assert counter.pruning.threshold == threshold
    kept = sum(expected.values())
    assert counter.pruning.occurrences == sum(len(t.split()) for t in texts) - kept


@settings(max_examples=200, deadline=None)
@given(texts=TEXTS, bound=st.integers(1, 30), fold_every=st.integers(1, 50))
def test_bound_never_exceeded_after_a_fold(texts, bound, fold_every):
    counter = BertWordCounter(lowercase=True, fold_every=fold_every, max_distinct_words=bound)
    for text in texts:
        counter.update(text)
        assert len(counter.counts()) <= bound  # counts() folds
    for counter_class in (BertWordCounter, ChunkCounter):
        other = counter_class(lowercase=True, fold_every=fold_every, max_distinct_words=bound)
        for text in texts:
            other.update(text)
        assert len(other.counts()) <= bound


@settings(max_examples=100, deadline=None)
@given(texts=TEXTS, bound=st.integers(1, 30), fold_every=st.integers(1, 50))
def test_pruning_is_deterministic(texts, bound, fold_every):
    first, second = counted(texts, bound, fold_every), counted(texts, bound, fold_every)
    assert list(first.counts().items()) == list(second.counts().items())
    assert first.pruning == second.pruning


@settings(max_examples=100, deadline=None)
@given(texts=TEXTS, fold_every=st.integers(1, 50), extra=st.integers(0, 5))
def test_a_bound_above_the_distinct_words_changes_nothing(texts, fold_every, extra):
    exact = counted(texts, None, fold_every).counts()
    bounded = counted(texts, len(exact) + extra or 1, fold_every)
    assert bounded.counts() == exact
    assert bounded.pruning.prunes == 0 and bounded.pruning.words == 0


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def card(out: Path) -> dict:
    return json.loads((out / "vocab_card.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("fmt", sorted(GOLDEN))
def test_an_unbounded_build_is_unchanged(tmp_path, fmt):
    name, digest = GOLDEN[fmt]
    build_vocab([SAMPLE], tmp_path, VocabConfig(vocab_size=SIZE, format=fmt))
    assert sha256(tmp_path / name) == digest
    assert card(tmp_path)["max_distinct_words"] is None and card(tmp_path)["word_pruning"] is None


def test_a_bound_above_the_corpus_builds_the_same_vocabulary(tmp_path):
    result = build_vocab([SAMPLE], tmp_path, VocabConfig(vocab_size=SIZE, max_distinct_words=10**6))
    assert sha256(tmp_path / "vocab.txt") == GOLDEN["wordpiece"][1]
    assert card(tmp_path)["word_pruning"] == {"threshold": 0, "prunes": 0, "words_dropped": 0,
                                              "occurrences_dropped": 0}
    assert "nothing dropped" in result.summary()


def test_a_bound_below_the_corpus_is_kept_recorded_and_logged(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="biomed_lm.tokenization.vocab"):
        result = build_vocab([SAMPLE], tmp_path, VocabConfig(vocab_size=SIZE, max_distinct_words=6000))
    recorded = card(tmp_path)
    assert recorded["max_distinct_words"] == 6000
    assert 0 < recorded["distinct_words"] <= 6000
    pruned = recorded["word_pruning"]
    assert pruned["prunes"] >= 1 and pruned["threshold"] >= 1
    assert pruned["words_dropped"] > 0 and pruned["occurrences_dropped"] >= pruned["words_dropped"]
    assert sha256(tmp_path / "vocab.txt") != GOLDEN["wordpiece"][1]
    assert f"{pruned['words_dropped']} words ({pruned['occurrences_dropped']} occurrences)" in result.summary()
    assert any("over max_distinct_words=6000" in r.getMessage() for r in caplog.records)


def run_build_vocab(out: Path, *args: str, threads: int = 1) -> subprocess.CompletedProcess:
    env = dict(os.environ, RAYON_RS_NUM_CPUS=str(threads), TOKENIZERS_PARALLELISM="true")
    return subprocess.run([sys.executable, "launch/build_vocab.py", "--inputs", str(SAMPLE), "--output-dir", str(out),
                           "--vocab-size", str(SIZE), "--no-progress", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def test_cli_bounded_build_is_the_same_with_one_or_two_threads(tmp_path):
    for threads in (1, 2):
        result = run_build_vocab(tmp_path / str(threads), "--max-distinct-words", "6000", threads=threads)
        assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "1" / "vocab.txt").read_bytes() == (tmp_path / "2" / "vocab.txt").read_bytes()
    assert card(tmp_path / "1")["word_pruning"] == card(tmp_path / "2")["word_pruning"]
    assert card(tmp_path / "1")["word_pruning"]["words_dropped"] > 0


@pytest.mark.parametrize("options, message", [
    ({"max_distinct_words": 0}, "max_distinct_words must be >= 1"),
    ({"max_distinct_words": 1000, "format": "bytelevel-bpe"}, "leave it out"),
])
def test_a_meaningless_bound_is_refused(options, message):
    with pytest.raises(VocabBuildError, match=message):
        VocabConfig(**options)


def test_bench_vocab_words_on_the_embedded_sample(tmp_path):
    """benchmarks/bench_vocab_words.py runs on the sample alone, names a missing input as skipped,
    and its figures hang together."""
    out = tmp_path / "vocab_words.json"
    result = subprocess.run([sys.executable, "benchmarks/bench_vocab_words.py", str(tmp_path / "absent.txt"),
                             str(SAMPLE), "--vocab-size", str(SIZE), "--bounds", "0.5", "--fit-from", "100000",
                             "--output", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"skipped: {tmp_path / 'absent.txt'} does not exist" in result.stdout
    report = json.loads(out.read_text(encoding="utf-8"))
    distinct = [p["distinct"] for p in report["growth"]["points"]]
    assert distinct == sorted(distinct) and len(distinct) >= 3
    assert 0.3 < report["heaps_fit"]["beta"] < 1
    unbounded, (bounded,) = report["unbounded"], report["bounded"]
    assert unbounded["distinct"] == distinct[-1] and unbounded["pruning"] is None
    assert bounded["distinct"] <= bounded["bound"] == unbounded["distinct"] // 2
    assert bounded["pruning"]["words_dropped"] > 0
    assert 0 < bounded["vs_unbounded"]["vocab_entries_shared"] < 1
    assert report["bytes_per_word"]["table"] > 50
