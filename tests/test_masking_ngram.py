"""ALBERT's n-gram masking and the per-sequence prediction cap (pretrain/masking.py): spans of up to
``max_ngram`` whole words with p(n) proportional to 1/n, never across [SEP]; at most
``max_predictions`` selected tokens per sequence."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from biomed_lm.pretrain.masking import (IGNORE_INDEX, MaskingConfig, mask_tokens, masking_budget, ngram_starts,
                                        ngram_weights)
from tests.test_masking import CLS, SEP, collator, make_instance


def test_ngram_weights_are_albert_s():
    assert ngram_weights(3).tolist() == pytest.approx([6 / 11, 3 / 11, 2 / 11])
    assert ngram_weights(1).tolist() == [1.0]


def test_span_lengths_follow_the_distribution():
    """Single-piece words, no gaps: the distance between span starts is n, drawn from p(n)."""
    rows, length = 64, 512
    word_start = torch.ones(rows, length, dtype=torch.bool)
    previous = torch.ones(rows, length, dtype=torch.bool)
    starts = ngram_starts(word_start, previous, 3, torch.Generator().manual_seed(0))
    gaps = torch.cat([row.nonzero().flatten().diff() for row in starts])
    observed = torch.bincount(gaps, minlength=4)[1:].double() / gaps.numel()
    assert observed.tolist() == pytest.approx(ngram_weights(3).tolist(), abs=0.01)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(1, 3), min_size=1, max_size=12), min_size=1, max_size=2),
       st.integers(0, 2**32 - 1))
def test_spans_start_at_words_and_never_cross_sep(segments, seed):
    instance = make_instance(random.Random(seed), (segments[0], segments[1] if len(segments) > 1 else []),
                             unk_rate=0.0)
    ids = torch.tensor([instance["input_ids"]])
    candidate = ~torch.isin(ids, torch.tensor([CLS, SEP]))
    previous = torch.nn.functional.pad(candidate[:, :-1], (1, 0), value=False)
    word_start = candidate & (torch.tensor([instance["word_starts"]]).bool() | ~previous)
    starts = ngram_starts(word_start, previous, 3, torch.Generator().manual_seed(seed))
    assert not (starts & ~word_start).any()                      # a span starts at a word
    assert (starts | ~(candidate & ~previous)).all()             # the first word after [CLS]/[SEP] starts one
    words_per_span = torch.cumsum(starts.long(), 1)
    for span in words_per_span.unique():
        inside = (words_per_span == span) & candidate
        assert int((word_start & inside).sum()) <= 3


def test_masking_takes_whole_spans_within_the_budget():
    features = [make_instance(random.Random(i), ([1] * 60, [1, 2] * 20), unk_rate=0.0) for i in range(64)]
    real = torch.tensor([len(f["input_ids"]) - 3 for f in features])  # less [CLS] and two [SEP]
    mean_run = {}
    for max_ngram in (1, 3):
        batch = collator(MaskingConfig(mlm_probability=0.15, max_ngram=max_ngram))(
            features, torch.Generator().manual_seed(1))
        selected = batch["labels"] != IGNORE_INDEX
        assert (selected.sum(1) <= masking_budget(real, 0.15)).all()
        runs = [len(run) for row in selected for run in _runs(row.tolist())]
        mean_run[max_ngram] = sum(runs) / len(runs)
    # single words: runs are mostly one word (1-2 pieces); spans of up to 3 words: clearly longer
    assert mean_run[3] > 1.4 * mean_run[1], mean_run


def test_max_predictions_caps_each_sequence():
    config = MaskingConfig(mlm_probability=0.15, max_predictions=20)
    features = [make_instance(random.Random(i), ([1] * 250, [1] * 250), unk_rate=0.0) for i in range(8)]
    batch = collator(config)(features, torch.Generator().manual_seed(2))
    assert ((batch["labels"] != IGNORE_INDEX).sum(1) == 20).all()  # 15% of 500 would be 75


def test_single_word_spans_change_nothing():
    """max_ngram 1 takes the plain whole-word path: the same batch for the same generator state."""
    features = [make_instance(random.Random(i), ([1, 2, 3] * 10, [2] * 10)) for i in range(16)]
    plain = collator(MaskingConfig())(features, torch.Generator().manual_seed(3))
    ngram1 = collator(MaskingConfig(max_ngram=1))(features, torch.Generator().manual_seed(3))
    assert all(torch.equal(plain[key], ngram1[key]) for key in plain)


def test_invalid_ngram_settings():
    with pytest.raises(ValueError, match="max_ngram"):
        MaskingConfig(max_ngram=3, whole_word=False)
    with pytest.raises(ValueError, match="max_ngram"):
        MaskingConfig(max_ngram=0)
    with pytest.raises(ValueError, match="max_predictions"):
        MaskingConfig(max_predictions=0)


def test_ngram_masking_draws_a_shape_dependent_count():
    """Two calls from the same generator state give the same batch (the draw count depends on the shape)."""
    ids = torch.randint(200, 900, (4, 40))
    special = torch.zeros_like(ids, dtype=torch.bool)
    special[:, 0] = special[:, -1] = True
    config = MaskingConfig(max_ngram=3, mlm_probability=0.3)
    out = [mask_tokens(ids, ~special, special, config=config, mask_token_id=103,
                       random_token_ids=torch.arange(1000, 1100), generator=torch.Generator().manual_seed(4))
           for _ in range(2)]
    assert torch.equal(out[0][0], out[1][0]) and torch.equal(out[0][1], out[1][1])


def _runs(flags: list[bool]) -> list[list[int]]:
    runs, current = [], []
    for index, flag in enumerate(flags):
        if flag:
            current.append(index)
        elif current:
            runs.append(current)
            current = []
    return runs + ([current] if current else [])


def test_pretraining_refuses_ngrams_without_whole_words(tmp_path, capsys):
    from biomed_lm.launch import pretrain

    argv = ["--output_dir", str(tmp_path / "run"), "--data_dir", str(tmp_path), "--tokenizer", str(tmp_path),
            "--max_ngram", "3", "--whole_word_masking", "False"]
    assert pretrain.main(argv) == 2
    assert "max_ngram 3 masks spans of whole words" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
