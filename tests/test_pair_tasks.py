"""Pair objectives and packing of the pretraining instances (pretrain/instance_recipe.py and
instance_builder.py): ALBERT's sentence-order prediction, LinkBERT's document relation prediction,
RoBERTa's cross-document packing, and word starts for vocabularies that mark them (SentencePiece
``▁``, byte-level BPE ``Ġ``).

The end-to-end tests reuse tests/test_pretraining_data.py's traceable synthetic corpus: every word
names its document and position, so an instance's segments can be traced back exactly.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from biomed_lm.pretrain.instance_builder import PACK_GROUP, PretrainingDataConfig
from biomed_lm.pretrain.instance_recipe import (CONTIGUOUS, IN_ORDER, LINKED_DOCUMENT, NO_PAIR_LABEL,
                                                RANDOM_DOCUMENT, SWAPPED, pack_documents, plan_document,
                                                word_boundary_markers, word_start_table)
from biomed_lm.pretrain.prepared_corpus import PretrainingDataError
from tests.test_pretraining_data import (build, corpus, corpus_docs, is_contiguous, positions,  # noqa: F401
                                         split_segments, tables_equal, tokenizer, tokenizer_dir, traced, work)

lengths_strategy = st.lists(st.integers(1, 30), min_size=1, max_size=25)


# ----------------------------------------------------------------------------- SOP, pure

@settings(max_examples=200, deadline=None)
@given(lengths_strategy, st.integers(2, 80), st.integers(0, 2**32 - 1))
def test_sop_plans_are_two_consecutive_segments_of_the_document(lengths, max_num_tokens, seed):
    plans = plan_document(lengths, np.random.default_rng(seed), max_num_tokens=max_num_tokens, pair_task="sop")
    start = 0
    for plan in plans:
        assert plan.a_start == start and not plan.is_random_next  # never another document
        if plan.label == NO_PAIR_LABEL:  # a lone last sentence: one segment, nothing to order
            assert plan.b_end == plan.a_end == plan.a_start + 1 == len(lengths)
        else:
            assert plan.a_start < plan.a_end < plan.b_end <= len(lengths)
            assert plan.label == (SWAPPED if plan.swapped else IN_ORDER)
        start = plan.next_sentence()
    assert start == len(lengths)  # the plans tile the document


def test_sop_swaps_half_the_pairs():
    labels = Counter()
    for d in range(300):
        for plan in plan_document([3] * 20, np.random.default_rng([1, d]), max_num_tokens=12, pair_task="sop"):
            labels[plan.label] += 1
    assert labels[SWAPPED] / (labels[SWAPPED] + labels[IN_ORDER]) == pytest.approx(0.5, abs=0.03)


def test_sop_single_sentence_document_trains_mlm_only():
    (plan,) = plan_document([7], np.random.default_rng(0), max_num_tokens=20, pair_task="sop")
    assert plan.label == NO_PAIR_LABEL and not plan.has_b


# ----------------------------------------------------------------------------- DRP, pure

@settings(max_examples=200, deadline=None)
@given(lengths_strategy, st.integers(2, 80), st.integers(0, 2**32 - 1),
       st.lists(st.integers(0, 49).filter(lambda d: d != 7), max_size=4, unique=True))
def test_drp_plans_take_b_from_where_their_label_says(lengths, max_num_tokens, seed, linked):
    plans = plan_document(lengths, np.random.default_rng(seed), max_num_tokens=max_num_tokens, pair_task="drp",
                          document_index=7, num_documents=50, linked=linked)
    start = 0
    for plan in plans:
        assert plan.a_start == start and plan.has_b
        if plan.label == CONTIGUOUS:
            assert not plan.is_random_next and plan.a_start < plan.a_end < plan.b_end
        elif plan.label == LINKED_DOCUMENT:
            assert plan.other_document in linked
        else:
            assert plan.label == RANDOM_DOCUMENT and plan.other_document not in (-1, 7)
        start = plan.next_sentence()
    assert start == len(lengths)


def test_drp_draws_the_three_relations_evenly_and_no_link_without_links():
    with_links, without = Counter(), Counter()
    for d in range(300):
        for plan in plan_document([2] * 30, np.random.default_rng([2, d]), max_num_tokens=10, pair_task="drp",
                                  document_index=d, num_documents=300, linked=[(d + 1) % 300]):
            with_links[plan.label] += 1
        for plan in plan_document([2] * 30, np.random.default_rng([3, d]), max_num_tokens=10, pair_task="drp",
                                  document_index=d, num_documents=300):
            without[plan.label] += 1
    total = sum(with_links.values())
    for label in (CONTIGUOUS, RANDOM_DOCUMENT, LINKED_DOCUMENT):
        assert with_links[label] / total == pytest.approx(1 / 3, abs=0.03)
    assert without[LINKED_DOCUMENT] == 0
    assert without[CONTIGUOUS] / sum(without.values()) == pytest.approx(0.5, abs=0.03)


# ----------------------------------------------------------------------------- packing, pure

@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(1, 20), max_size=6), min_size=1, max_size=12), st.integers(4, 60),
       st.integers(0, 2**32 - 1))
def test_packs_cover_every_sentence_once_in_order_within_the_length(documents, max_num_tokens, seed):
    packs = pack_documents(documents, np.random.default_rng(seed), max_num_tokens=max_num_tokens)
    covered = [(d, k) for pack in packs for d, first, end in pack for k in range(first, end)]
    assert covered == [(d, k) for d, lengths in enumerate(documents) for k in range(len(lengths))]
    for pack in packs:
        assert len({d for d, _, _ in pack}) == len(pack)  # one run per document, [SEP] between runs
        cost = sum(sum(documents[d][first:end]) for d, first, end in pack) + len(pack) - 1
        assert cost <= max_num_tokens or (len(pack) == 1 and pack[0][2] - pack[0][1] == 1)


# ----------------------------------------------------------------------------- end to end

def test_sop_instances(build, tokenizer):
    dataset, metadata = build(pair_task="sop", max_seq_length=48, short_seq_prob=0.0)
    assert (metadata["pair_task"], metadata["pair_classes"], metadata["nsp"]) == ("sop", 2, False)
    where = positions(tokenizer)
    labels = Counter()
    for row in dataset:
        labels[row["next_sentence_label"]] += 1
        if row["next_sentence_label"] == NO_PAIR_LABEL:
            assert row["input_ids"].count(tokenizer.sep_token_id) == 1
            continue
        first, second = (traced(s, where) for s in split_segments(row["input_ids"], tokenizer.sep_token_id))
        if not first or not second:
            continue  # a segment cut down to a lone "##x" piece
        assert {d for d, _ in first + second} == {row["document"]}  # both segments of one document
        assert is_contiguous(first) and is_contiguous(second)
        in_order = first[-1][1] < second[0][1]
        assert in_order == (row["next_sentence_label"] == IN_ORDER)
    assert labels[SWAPPED] > 20 and labels[IN_ORDER] > 20
    assert abs(labels[SWAPPED] - labels[IN_ORDER]) < 0.25 * (labels[SWAPPED] + labels[IN_ORDER])
    assert metadata["summary"]["pair_labels"] == {name: n for name, n in
                                                 (("in_order", labels[IN_ORDER]), ("swapped", labels[SWAPPED]),
                                                  ("none", labels[NO_PAIR_LABEL])) if n}


def test_cross_document_packs(build, tokenizer, corpus_docs):
    dataset, metadata = build(pair_task="none", packing="cross-document", max_seq_length=64, short_seq_prob=0.0)
    assert metadata["packing"] == "cross-document" and metadata["summary"]["documents"]["used"] == 58
    where = positions(tokenizer)
    seen: list[tuple[int, int]] = []
    for row in dataset:
        ids = row["input_ids"]
        assert ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id and len(ids) <= 64
        assert row["next_sentence_label"] == NO_PAIR_LABEL and set(row["token_type_ids"]) == {0}
        runs = [traced(run, where) for run in _split(ids[1:-1], tokenizer.sep_token_id)]
        documents = [run[0][0] for run in runs if run]
        assert documents == sorted(documents) and len(set(documents)) == len(documents)
        assert documents[0] // PACK_GROUP == documents[-1] // PACK_GROUP
        seen += [position for run in runs for position in run]
    # nothing is truncated at this length, so every word of the corpus is in exactly one pack, in order
    assert seen == [(d, p) for d, sentences in enumerate(corpus_docs)
                    for p in range(len([w for s in sentences for w in s.split() if w.startswith(f"d{d}p")]))]
    lengths = [len(ids) for ids in dataset["input_ids"]]
    assert np.mean(lengths) > 0.8 * 64  # packed full, unlike one-document chunks of short abstracts


def test_cross_document_packs_do_not_depend_on_batching(build):
    reference, _ = build(pair_task="none", packing="cross-document", seed=5)
    parallel, _ = build(pair_task="none", packing="cross-document", seed=5, num_proc=2, batch_size=7)
    assert tables_equal(reference, parallel)


def test_packing_needs_one_segment_instances():
    with pytest.raises(PretrainingDataError, match="cross-document.*needs pair_task none"):
        PretrainingDataConfig(corpus="c", tokenizer="t", output_dir="o", packing="cross-document").validate()


def _split(ids: list[int], sep: int) -> list[list[int]]:
    runs, current = [], []
    for token in ids:
        if token == sep:
            runs.append(current)
            current = []
        else:
            current.append(token)
    return runs + [current]


# ----------------------------------------------------------------------------- word starts

def test_word_start_table_for_start_markers():
    vocab = {"[CLS]": 0, "▁acetyl": 1, "transferase": 2, "▁of": 3, "<unk>": 4, "ĠRec": 5}
    # SentencePiece: ALBERT's rule also starts a word at <...> symbols and pieces with characters other than
    # ASCII letters ("Ġ" here); byte-level BPE: the marker alone
    assert word_start_table(vocab, [0], continuation_prefix=None, start_marker="▁").tolist() == [0, 1, 0, 1, 1, 1]
    assert word_start_table(vocab, [0], continuation_prefix=None, start_marker="Ġ").tolist() == [0, 0, 0, 0, 0, 1]
    assert word_start_table({"a": 0, "##b": 1}, []).tolist() == [1, 0]


def test_word_boundary_markers_of_real_tokenizers():
    from tokenizers import ByteLevelBPETokenizer, SentencePieceUnigramTokenizer

    text = ["acetyltransferase activity of RecA in coli", "naloxone reversed the effect"] * 20
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(text, vocab_size=300, min_frequency=1, show_progress=False)
    unigram = SentencePieceUnigramTokenizer()
    unigram.train_from_iterator(text, vocab_size=60, show_progress=False)
    import json

    assert word_boundary_markers(json.loads(bpe._tokenizer.to_str())) == (None, "Ġ")
    assert word_boundary_markers(json.loads(unigram._tokenizer.to_str())) == (None, "▁")
    table = word_start_table(bpe.get_vocab(), [], None, "Ġ")
    ids = bpe.encode("acetyltransferase activity").ids
    assert table[ids[0]] == 0  # no prefix space: the text's first word has no marker (the writer fixes that)
    assert table[bpe.encode(" activity").ids[0]] == 1


def test_drp_instances_take_linked_segments_from_cited_documents(work, corpus_docs, tokenizer_dir, tokenizer):
    import datasets

    from biomed_lm.pretrain.instance_builder import create_pretraining_data
    from tests.test_pretraining_data import save_corpus

    n = len(corpus_docs)
    cites = {d: [(d + 1) % n, (d + 7) % n] for d in range(n)}
    path = save_corpus(corpus_docs, work / "linked_corpus")
    linked = datasets.load_from_disk(str(path)).add_column(
        "links", [[str(c) for c in cites[d]] + ["99999999", str(d)] for d in range(n)])  # absent, self: dropped
    linked.save_to_disk(str(work / "linked_corpus2"))
    out = work / "drp_out"
    metadata = create_pretraining_data(PretrainingDataConfig(
        corpus=str(work / "linked_corpus2"), tokenizer=str(tokenizer_dir), output_dir=str(out), pair_task="drp",
        max_seq_length=48, num_proc=1), progress=False)
    assert metadata["summary"]["links"] == {"links": 4 * n, "links_in_corpus": 2 * n,
                                            "documents_with_links_in_corpus": n}
    assert not (out / "_work").exists()
    where = positions(tokenizer)
    labels = Counter()
    for row in datasets.load_from_disk(str(out)):
        labels[row["next_sentence_label"]] += 1
        a, b = (traced(s, where) for s in split_segments(row["input_ids"], tokenizer.sep_token_id))
        if not a or not b:
            continue
        source = b[0][0]
        if row["next_sentence_label"] == LINKED_DOCUMENT:
            assert source in cites[row["document"]]
        elif row["next_sentence_label"] == CONTIGUOUS:
            assert source == row["document"] and b[0][1] > a[-1][1]
        else:
            assert source != row["document"]
    total = sum(labels.values())
    for label in (CONTIGUOUS, RANDOM_DOCUMENT, LINKED_DOCUMENT):
        assert 0.2 < labels[label] / total < 0.5, labels


def test_drp_needs_a_corpus_with_links(work, corpus, tokenizer_dir):
    from biomed_lm.pretrain.instance_builder import create_pretraining_data

    with pytest.raises(PretrainingDataError, match="drp needs citation links.*no 'links' column"):
        create_pretraining_data(PretrainingDataConfig(corpus=str(corpus), tokenizer=str(tokenizer_dir),
                                                      output_dir=str(work / "no_links"), pair_task="drp",
                                                      num_proc=1), progress=False)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.lists(st.sampled_from(["1", "2", "3", "5", "8", "13", "x", "", "99"]), max_size=6),
                min_size=1, max_size=12),
       st.integers(1, 13))
def test_link_index_does_not_depend_on_its_batch_size(tmp_path_factory, links, batch_documents):
    """Resolving the links a few documents at a time (memory that follows the documents, not the
    links) gives the index that resolving them all at once does: rows in corpus and link order,
    links to absent documents, to the document itself and to non-PMIDs dropped."""
    from datasets import Dataset, Features, Sequence, Value

    from biomed_lm.pretrain.instance_builder import build_link_index

    ids = ["1", "2", "3", "5", "8", "13", "21", "34", "55", "89", "144", "233"][:len(links)]
    corpus = Dataset.from_dict({"id": ids, "links": links},
                               features=Features({"id": Value("string"), "links": Sequence(Value("string"))}))
    folder = tmp_path_factory.mktemp("links")
    index, stats = build_link_index(corpus, folder / "batched", batch_documents=batch_documents)
    expected = {i: [ids.index(t) for t in own if t in ids and t != ids[i]] for i, own in enumerate(links)}
    assert {i: list(index.rows(i)) for i in range(len(ids))} == expected
    assert stats == {"links": sum(map(len, links)), "links_in_corpus": sum(map(len, expected.values())),
                     "documents_with_links_in_corpus": sum(1 for rows in expected.values() if rows)}
    assert not list((folder / "batched").glob("*.raw"))
