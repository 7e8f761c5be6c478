"""prepare_corpus on inputs a user gets wrong: empty files, no usable input, unknown or binary
formats, JSONL fields of the wrong type, and PubMed's PMID versions.

Before these checks an empty .txt/.jsonl input exited 0 without writing a dataset, a CSV or a PNG
was read as plain text without a word, ``{"text": [...]}`` was reported as a missing field, and
``<PMID Version="2">`` lost to a version 1 that came in a later file."""

from __future__ import annotations

import gzip
import json
import re

import numpy as np
import pytest
from datasets import load_from_disk
from hypothesis import given, settings
from hypothesis import strategies as st

from biomed_lm.launch.prepare_corpus import main as prepare_main
from biomed_lm.tokenization.corpus import CorpusConfig, NoUsableInput, prepare_corpus, resolve
from biomed_lm.tokenization.sources import input_format, iter_jsonl, sniff_binary
from tests.test_pubmed_xml import article_set, delete, pubmed_article

PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x10\x00\x00\x00\x10\x08\x06\x00\x00\x00\x1f\xf3\xffa"


def doc(n: int, salt: str = "") -> str:
    return " ".join(f"word{salt}{i}" for i in range(n))


def cli(tmp_path, capsys, *inputs, extra: tuple[str, ...] = (), out: str = "out") -> tuple[int, str, dict]:
    """Run launch/prepare_corpus.py's main; (exit status, stderr, summary.json or {})."""
    target = tmp_path / out
    status = prepare_main(["--inputs", *map(str, inputs), "--output-dir", str(target), "--num-proc", "1",
                           "--min-words", "1", *extra])
    err = capsys.readouterr().err
    summary_path = target / "summary.json"
    return status, err, json.loads(summary_path.read_text()) if summary_path.is_file() else {}


@pytest.mark.parametrize("name,content", [("empty.txt", b""), ("empty.jsonl", b""),
                                          ("empty.txt.gz", gzip.compress(b"", mtime=0)), ("blank.txt", b"\n \n\n")])
def test_an_empty_input_alone_exits_2_without_a_dataset(tmp_path, capsys, name, content):
    path = tmp_path / name
    path.write_bytes(content)
    status, err, summary = cli(tmp_path, capsys, path)
    assert status == 2
    assert f"{path}: empty:" in err                       # reported like any problem ...
    assert "no usable input" in err and name in err.split("error:")[1]   # ... and the exit names the input
    assert not (tmp_path / "out" / "state.json").exists()
    assert summary["documents_kept"] == 0 and summary["problem_counts"] == {"empty": 1} and "error" in summary


def test_an_empty_xml_file_is_empty_too(tmp_path, capsys):
    path = tmp_path / "e.xml.gz"
    path.write_bytes(gzip.compress(b""))
    status, err, summary = cli(tmp_path, capsys, path)
    assert status == 2 and "empty: the file is empty (0 bytes after decompression)" in err


def test_an_empty_jsonl_among_good_inputs_is_reported_and_the_good_documents_kept(tmp_path, capsys):
    good = tmp_path / "good.txt"
    good.write_text(f"{doc(5, 'a')}\n{doc(5, 'b')}\n")
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    xml = tmp_path / "p.xml"
    xml.write_text(article_set(pubmed_article("3", doc(6, "c"))))
    status, err, summary = cli(tmp_path, capsys, good, empty, xml)
    assert status == 1
    assert f"prepare_corpus: skipped: {empty}: empty: the file is empty (0 bytes)" in err
    assert [(p["path"], p["reason"]) for p in summary["problems"]] == [(str(empty), "empty")]
    assert sorted(load_from_disk(str(tmp_path / "out"))["id"]) == ["3", "good.txt:1", "good.txt:2"]


def test_nothing_surviving_the_filters_exits_2_saying_why(tmp_path, capsys):
    path = tmp_path / "short.txt"
    path.write_text("two words\nthree more words\n")
    status, err, _ = cli(tmp_path, capsys, path, extra=("--min-words", "50"))
    assert status == 2
    assert "no document survived: 2 document rows were read from" in err and "too_short 2" in err
    assert "short.txt" in err and not (tmp_path / "out" / "state.json").exists()


def test_every_input_missing_or_refused_exits_2_naming_them(tmp_path, capsys):
    csv = tmp_path / "table.csv"
    csv.write_text("id,text\n1,hello world\n")
    status, err, _ = cli(tmp_path, capsys, csv, tmp_path / "absent.txt")
    assert status == 2
    message = err.split("error:")[1]
    assert f"{csv}: unknown_format" in message and f"{tmp_path / 'absent.txt'}: missing" in message


def test_a_csv_is_refused_naming_its_suffix_or_read_as_text_with_format_text(tmp_path, capsys):
    csv = tmp_path / "table.csv"
    csv.write_text(f"{doc(4, 'x')}\n{doc(4, 'y')}\n")
    good = tmp_path / "good.txt"
    good.write_text(doc(5) + "\n")
    status, err, summary = cli(tmp_path, capsys, good, csv)
    assert status == 1
    line = next(line for line in err.splitlines() if "table.csv" in line)
    assert "unknown_format: unknown suffix '.csv'" in line
    assert all(s in line for s in (".xml", ".txt", ".jsonl", ".json", "optionally .gz", "--format text"))
    assert load_from_disk(str(tmp_path / "out"))["id"] == ["good.txt:1"]

    status, err, summary = cli(tmp_path, capsys, good, csv, extra=("--format", "text"), out="as_text")
    assert status == 0 and err.count("skipped") == 0
    assert sorted(load_from_disk(str(tmp_path / "as_text"))["id"]) == ["good.txt:1", "table.csv:1", "table.csv:2"]
    assert {f["path"]: f["format"] for f in summary["files"]}[str(csv)] == "text"


def test_format_never_overrides_a_known_suffix_and_jsonl_reads_other_suffixes(tmp_path):
    assert input_format("a.xml.gz", "text") == "pubmed-xml" and input_format("b.txt", "jsonl") == "text"
    assert input_format("c.csv") is None and input_format("d.gz") is None and input_format("README") is None
    assert input_format("c.CSV.gz", "jsonl") == "jsonl" and input_format("e.ndjson.gz") == "jsonl"
    path = tmp_path / "records.ldjson"
    path.write_text(json.dumps({"text": doc(3)}) + "\n")
    summary = prepare_corpus(CorpusConfig(inputs=[str(path)], output_dir=str(tmp_path / "o"), num_proc=1,
                                          min_words=1, format="jsonl"))
    assert summary["documents_kept"] == 1 and summary["problems"] == []


@pytest.mark.parametrize("name,extra", [("picture.txt", ()), ("picture.png", ("--format", "text")),
                                        ("picture.jsonl", ())])
def test_png_bytes_are_refused_as_binary(tmp_path, capsys, name, extra):
    png = tmp_path / name
    png.write_bytes(PNG * 50)
    good = tmp_path / "good.txt"
    good.write_text(doc(5) + "\n")
    status, err, summary = cli(tmp_path, capsys, good, png, extra=extra)
    assert status == 1
    assert f"{png}: binary: the content is a PNG image, not text" in err
    assert [p["reason"] for p in summary["problems"]] == ["binary"]   # one problem for the file, not per line
    assert load_from_disk(str(tmp_path / "out"))["id"] == ["good.txt:1"]
    status, err, _ = cli(tmp_path, capsys, png, extra=extra, out="alone")
    assert status == 2 and "binary" in err.split("error:")[1]


def test_sniff_binary_nul_bytes_and_text(tmp_path):
    utf16 = tmp_path / "u.txt"
    utf16.write_bytes("some text\n".encode("utf-16"))
    assert "UTF-16" in sniff_binary(utf16)
    doubled = tmp_path / "d.txt.gz"
    doubled.write_bytes(gzip.compress(gzip.compress(b"text\n")))
    assert "gzip-compressed data (compressed twice?)" in sniff_binary(doubled)
    plain = tmp_path / "p.txt"
    plain.write_bytes("naïve text, bad byte \xff\n".encode("latin-1"))  # invalid UTF-8 stays a per-line problem
    assert sniff_binary(plain) is None and sniff_binary(tmp_path / "absent.txt") is None
    # most lines not UTF-8: a file in another encoding, refused whole (QA: read line by line it kept its
    # ASCII lines only, with a warning per other line)
    latin1 = tmp_path / "l.txt"
    latin1.write_bytes("".join(f"Sjögren syndrome, case {i}\n" if i % 3 else f"case {i}\n"
                               for i in range(30)).encode("latin-1"))
    assert "20 of its first 30 lines are not UTF-8" in sniff_binary(latin1) and "iconv" in sniff_binary(latin1)


def test_jsonl_field_of_the_wrong_type_names_the_type_and_line(tmp_path, capsys):
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join([json.dumps({"text": doc(4)}), json.dumps({"text": "fine " + doc(3)}),
                               json.dumps({"text": ["a", "list"]}), json.dumps({"body": "x"}),
                               json.dumps({"text": None}), json.dumps({"text": 7}), json.dumps({"text": {"a": 1}}),
                               "[1, 2]"]) + "\n")
    status, err, summary = cli(tmp_path, capsys, path)
    assert status == 1 and summary["documents_kept"] == 2
    assert f"{path}, line 3: wrong_type: field 'text' is a list, expected a string" in err
    assert f"{path}, line 4: missing_field: no field 'text' (fields present: body)" in err
    assert "line 5: wrong_type: field 'text' is null" in err and "line 6: wrong_type: field 'text' is a number" in err
    assert "line 7: wrong_type: field 'text' is an object" in err
    assert "line 8: invalid_json: the line is a list, expected a JSON object" in err
    items = list(iter_jsonl(path, "body"))
    assert isinstance(items[3], tuple) and items[0].message.startswith("no field 'body'")


def test_pmid_versions_out_of_order_across_files_keep_the_highest(tmp_path, capsys):
    first, second = tmp_path / "pubmed26n0001.xml", tmp_path / "pubmed26n0002.xml"
    first.write_text(article_set(pubmed_article("5", doc(8, "vtwo"), version=2),
                                 pubmed_article("6", doc(8, "sixold"), version=1)))
    second.write_text(article_set(pubmed_article("5", doc(8, "vone"), version=1),
                                  pubmed_article("6", doc(8, "sixnew"), version=1)))
    status, err, summary = cli(tmp_path, capsys, tmp_path / "pubmed26n*.xml")
    assert status == 0, err
    ds = load_from_disk(str(tmp_path / "out"))
    texts = dict(zip(ds["id"], ds["text"]))
    assert "vtwo" in texts["5"] and "vone" not in texts["5"]          # the highest version, from the older file
    assert "sixnew" in texts["6"]                                     # equal versions: the later file
    assert summary["dropped"]["superseded"] == 2


def _delete_versions(*pairs: tuple[str, str | None]) -> str:
    return "<DeleteCitation>\n" + "".join(f'<PMID Version="{v}">{p}</PMID>\n' if v else f"<PMID>{p}</PMID>\n"
                                          for p, v in pairs) + "</DeleteCitation>\n"


def test_a_delete_with_a_version_removes_only_that_version(tmp_path):
    base = tmp_path / "n1.xml"
    base.write_text(article_set(*[pubmed_article(pmid, doc(6, f"{pmid}v{v}"), version=v)
                                  for pmid in ("1", "2", "3", "4") for v in (1, 2)]))
    upd = tmp_path / "n2.xml"
    upd.write_text(article_set(_delete_versions(("1", "1"), ("2", "2"), ("3", None)), delete("4")))
    summary = prepare_corpus(CorpusConfig(inputs=[str(base), str(upd)], output_dir=str(tmp_path / "o"),
                                          num_proc=1, min_words=1))
    ds = load_from_disk(str(tmp_path / "o"))
    kept = {i: re.search(r"word(\d+v\d)", t).group(1) for i, t in zip(ds["id"], ds["text"])}
    # v1 deleted: v2 stays; v2 deleted: v1 comes back; no version: every version goes;
    # PubMed's usual <PMID Version="1"> delete of a PMID with two versions leaves version 2.
    assert kept == {"1": "1v2", "2": "2v1", "4": "4v2"}
    assert summary["dropped"]["deleted"] == 5 and summary["read"]["deletions"] == 4


# ------------------------------------------------------------------ resolve against a reference


def _reference(keys, is_delete, versions):
    """The rule, one row at a time: a delete removes the earlier rows of its key (of its version if it
    has one); of what is left the highest version then the latest wins for PMIDs, the first for text."""
    alive = {}
    for i, (key, delete_row, version) in enumerate(zip(keys, is_delete, versions)):
        if delete_row:
            alive[key] = [j for j in alive.get(key, []) if version and versions[j] != version]
        else:
            alive.setdefault(key, []).append(i)
    winners = set()
    for key, rows in alive.items():
        if rows:
            winners.add(max(rows, key=lambda j: (versions[j], j)) if key >= 0 else min(rows))
    return winners


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(-3, 4), st.booleans(), st.integers(0, 3)), min_size=1, max_size=40))
def test_resolve_with_versions_matches_the_reference(rows):
    keys = np.array([k for k, _, _ in rows], dtype=np.int64)
    is_delete = np.array([d and k >= 0 for k, d, _ in rows])
    versions = np.array([(v if d else max(v, 1)) if k >= 0 else 0 for (k, _, v), d in zip(rows, is_delete)])
    keep, dropped, funnel = resolve(keys, is_delete, np.full(len(rows), 5), np.ones(len(rows), bool), 1, versions)
    assert set(np.flatnonzero(keep).tolist()) == _reference(keys.tolist(), is_delete.tolist(), versions.tolist())
    assert funnel["document_rows"] == funnel["kept"] + sum(dropped.values())


def test_no_usable_input_is_an_exception_for_library_callers(tmp_path):
    path = tmp_path / "e.txt"
    path.write_text("")
    with pytest.raises(NoUsableInput, match="no usable input") as info:
        prepare_corpus(CorpusConfig(inputs=[str(path)], output_dir=str(tmp_path / "o"), num_proc=1))
    assert info.value.summary["problems"][0]["reason"] == "empty"


def test_checksum_files_beside_pubmed_files_are_skipped_in_a_directory(tmp_path, capsys):
    folder = tmp_path / "updatefiles"
    folder.mkdir()
    xml = folder / "pubmed26n1275.xml"
    xml.write_text(article_set(pubmed_article("9", doc(6))))
    (folder / "pubmed26n1275.xml.md5").write_text("MD5(pubmed26n1275.xml)= 0123456789abcdef\n")
    status, err, summary = cli(tmp_path, capsys, folder)
    assert status == 0 and summary["read"]["files"] == 1, err


def test_licence_and_readme_files_in_a_folder_are_set_aside_and_named(tmp_path, capsys):
    folder = tmp_path / "abstracts"
    folder.mkdir()
    (folder / "part1.txt").write_text(doc(5, "a") + "\n")
    (folder / "LICENSE-Apache-2.0.txt").write_text("Licensed under the Apache License, Version 2.0\n")
    (folder / "README.txt").write_text("These abstracts come from PubMed.\n")
    (folder / "licensed_terms.txt").write_text(doc(4, "b") + "\n")  # a word that begins a name is not enough
    status, err, summary = cli(tmp_path, capsys, folder)
    assert status == 0  # expected beside data, not damage
    assert sorted(load_from_disk(str(tmp_path / "out"))["id"]) == ["licensed_terms.txt:1", "part1.txt:1"]
    assert [p["path"] for p in summary["set_aside"]] == [str(folder / "LICENSE-Apache-2.0.txt"),
                                                         str(folder / "README.txt")]
    assert f"not read: {folder / 'README.txt'}: not_corpus" in err and summary["problems"] == []

    named = cli(tmp_path, capsys, folder / "README.txt", out="named")  # a file named on its own is read
    assert named[0] == 0 and load_from_disk(str(tmp_path / "named"))["id"] == ["README.txt:1"]

    only = tmp_path / "only_licences"
    only.mkdir()
    (only / "COPYING").write_text("GPL\n")
    status, err, _ = cli(tmp_path, capsys, only, out="none")
    assert status == 2 and f"{only / 'COPYING'}: not_corpus" in err


@pytest.mark.parametrize("name, documentation", [
    ("LICENSE-sywada-Apache-2.0.txt", True), ("README.md", True), ("COPYING", True), ("LICENSES.txt", True),
    ("licensed_terms.txt", False), ("notice-2020.xml.gz", False), ("license.jsonl", False),
    ("authors_abstracts.txt", False), ("citation_network.jsonl", False)])
def test_a_licence_or_readme_is_told_by_its_name_and_suffix(name, documentation):
    """Review: data files named after a licence word (a .jsonl, an .xml.gz) were set aside unread."""
    from biomed_lm.tokenization.sources import is_documentation

    assert is_documentation(name) == documentation
