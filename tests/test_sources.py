"""Input discovery and line readers: order, missing inputs, damaged bytes and streams."""

from __future__ import annotations

import gzip
import json

import pytest

from biomed_lm.errors import InputError
from biomed_lm.tokenization.sources import detect_format, expand_inputs, iter_jsonl, iter_lines, iter_texts
from biomed_lm.tokenization.streams import Problem, iter_blocks


def test_expand_inputs_orders_and_reports_missing(tmp_path):
    (tmp_path / "d").mkdir()
    for name in ("pubmed26n0002.xml.gz", "pubmed26n0001.xml.gz", ".hidden"):
        (tmp_path / "d" / name).write_bytes(b"")
    single = tmp_path / "x.txt"
    single.write_text("a\n")
    files, problems = expand_inputs([str(single), str(tmp_path / "d"), str(tmp_path / "d" / "*.gz"),
                                     str(tmp_path / "nothing*"), str(tmp_path / "absent.txt")])
    assert [f.name for f in files] == ["x.txt", "pubmed26n0001.xml.gz", "pubmed26n0002.xml.gz"]
    assert [p.reason for p in problems] == ["missing", "missing"]


def test_detect_format():
    assert detect_format("a/pubmed26n0001.xml.gz") == "pubmed-xml"
    assert detect_format("b.JSONL") == "jsonl" and detect_format("c.txt.gz") == "text"


def test_iter_lines_invalid_utf8_and_truncated_gzip(tmp_path):
    lines = [f"document number {i}" for i in range(5000)]
    blob = gzip.compress(("\n".join(lines) + "\n").encode())
    path = tmp_path / "t.txt.gz"
    path.write_bytes(blob[: len(blob) - 200])
    items = list(iter_lines(path))
    good = [i for i in items if not isinstance(i, Problem)]
    assert [t for _, t in good] == lines[: len(good)] and len(good) > 4000
    assert isinstance(items[-1], Problem) and items[-1].reason == "truncated_or_corrupt_gzip"
    assert items[-1].line == len(good) + 1

    raw = tmp_path / "r.txt"
    raw.write_bytes(b"ok\n\xc3\x28 bad\nfine\n")
    items = list(iter_lines(raw))
    assert items[0] == (1, "ok") and items[2] == (3, "fine")
    assert items[1].reason == "invalid_utf8" and items[1].line == 2 and items[1].byte_offset == 3


def test_iter_blocks_plain_equals_gzip(tmp_path):
    data = b"".join(b"line %d\n" % i for i in range(100000))
    (tmp_path / "a").write_bytes(data)
    (tmp_path / "a.gz").write_bytes(gzip.compress(data))
    assert b"".join(iter_blocks(tmp_path / "a", 1000)) == data == b"".join(iter_blocks(tmp_path / "a.gz", 1000))


def test_iter_jsonl_and_iter_texts(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"text": "one"}) + "\n[1]\n\n" + json.dumps({"body": "x"}) + "\n")
    items = list(iter_jsonl(path, "text"))
    assert items[0] == (1, {"text": "one"})
    assert [(p.reason, p.line) for p in items[1:]] == [("invalid_json", 2), ("missing_field", 4)]
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"text": "cut\n{"text": 1,}\n')  # json's own messages, each read as one sentence
    assert [p.message for p in iter_jsonl(broken, "text")] == [
        "Unterminated string starting at column 10", "Expecting property name enclosed in double quotes at column 12"]
    text = tmp_path / "t.txt"
    text.write_text("alpha\n\nbeta\n")
    assert list(iter_texts([str(path), str(text)])) == ["one", "alpha", "beta"]


def test_iter_texts_names_a_prepared_corpus_without_the_text_column(tmp_path):
    from datasets import Dataset

    Dataset.from_dict({"body": ["x"]}).save_to_disk(str(tmp_path / "corpus"))
    with pytest.raises(InputError, match="prepared corpus has no column 'text' \\(columns: body\\)"):
        list(iter_texts(tmp_path / "corpus"))


def test_the_readers_import_no_circle():
    """streams <- pubmed_xml <- sources: the XML reader does not import the module that dispatches to it."""
    import ast
    import inspect

    from biomed_lm.tokenization import pubmed_xml, streams

    for module in (pubmed_xml, streams):
        imported = {node.module for node in ast.walk(ast.parse(inspect.getsource(module)))
                    if isinstance(node, ast.ImportFrom) and node.module}
        assert "biomed_lm.tokenization.sources" not in imported, module.__name__


def test_a_damaged_prepared_corpus_is_named(tmp_path):
    """QA (2026-11-28): build_vocab on a corpus with a truncated shard ended in pyarrow's traceback
    ("Expected to be able to read N bytes"), which names no file."""
    import datasets

    corpus = tmp_path / "corpus"
    datasets.Dataset.from_dict({"text": [f"document {i} " * 50 for i in range(2000)]}).save_to_disk(str(corpus))
    (shard,) = corpus.glob("data-*.arrow")
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    with pytest.raises(InputError, match=rf"{corpus}: prepared corpus cannot be read: its shard data-"):
        list(iter_texts([str(corpus)]))


def test_a_folder_holding_a_prepared_corpus_is_not_read_as_raw_text(tmp_path):
    """QA (2026-11-28): build_vocab --inputs runs/corpus (the parent of the prepared runs/corpus/pubmed) read
    its Arrow and JSON files as text and wrote a 283-token vocabulary, exit 0."""
    import datasets

    corpus = tmp_path / "corpus" / "pubmed"
    datasets.Dataset.from_dict({"text": ["a document"]}).save_to_disk(str(corpus))
    files, problems = expand_inputs([str(tmp_path / "corpus")])
    assert files == [] and len(problems) == 1
    assert f"the folder holds a prepared corpus ({corpus}); pass that corpus folder itself" in problems[0].describe()
    with pytest.raises(FileNotFoundError, match="holds a prepared corpus"):
        list(iter_texts([str(tmp_path / "corpus")]))
    assert list(iter_texts([str(corpus)])) == ["a document"]
