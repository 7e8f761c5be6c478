"""What build_vocab leaves out: counted per reason, the first few named, the likely cause said, exit status 1
as prepare_corpus's (tokenization/vocab.py, launch/build_vocab.py).

QA: a 20,000-line JSONL whose text is in field ``abstract`` beside a 2-line text file gave a vocabulary "learnt
from 2 documents" and exit 0, and the card listed every skipped record (megabytes for 20k, gigabytes
extrapolated to PubMed); an empty input file was left out without a word.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from biomed_lm.launch.build_vocab import main
from biomed_lm.tokenization.vocab import (LISTED_SKIPS_PER_REASON, EmptyCorpusError, SkippedRecords, VocabConfig,
                                          build_vocab)

DOCS = ["Insulin binds its receptor in the liver of diabetic patients.",
        "DNA repair genes were studied in the tumour cells of the patients."]
RECORDS = 300  # more than LISTED_SKIPS_PER_REASON of one reason


def _card(out: Path) -> dict:
    return json.loads((out / "vocab_card.json").read_text(encoding="utf-8"))


@pytest.fixture
def inputs(tmp_path) -> list[Path]:
    records = tmp_path / "records.jsonl"
    records.write_text("".join(json.dumps({"abstract": f"Protein {i} binds DNA.", "pmid": i}) + "\n"
                               for i in range(RECORDS)), encoding="utf-8")
    text = tmp_path / "two.txt"
    text.write_text("\n".join(DOCS) + "\n", encoding="utf-8")
    return [records, text]


def _build(inputs: list[Path], out: Path, *extra: str) -> int:
    return main(["--inputs", *map(str, inputs), "--output-dir", str(out), "--vocab-size", "200", "--no-progress",
                 *extra])


def test_records_without_the_text_field_exit_1_with_the_likely_cause(inputs, tmp_path, capsys):
    out = tmp_path / "vocab"
    assert _build(inputs, out) == 1
    captured = capsys.readouterr()
    assert f"{RECORDS} record(s) or file(s) left out beside the 2 documents read (missing_field {RECORDS}" \
        in captured.out
    assert f"build_vocab: warning: {RECORDS} record(s) or file(s) skipped; likely cause: {RECORDS} JSON record(s) " \
           "have no field 'text': if their text is in another field, pass --text-field naming it (their fields: " \
           "abstract, pmid)" in captured.err
    assert (out / "vocab.txt").is_file()  # what could be read is still a vocabulary: nothing good is lost
    card = _card(out)
    assert card["skipped_record_counts"] == {"missing_field": RECORDS} and card["skipped_records_truncated"]
    assert len(card["skipped_records"]) == LISTED_SKIPS_PER_REASON
    assert card["skipped_records"][0].startswith(f"{inputs[0]}, line 1: missing_field: no field 'text'")
    assert _build(inputs, out) == 1  # already complete: the first run's status, as prepare_corpus's
    assert "already complete" in capsys.readouterr().err
    assert _build(inputs, tmp_path / "fixed", "--text-field", "abstract") == 0  # the cause, fixed: all read
    assert _card(tmp_path / "fixed")["documents"] == RECORDS + 2


def test_reused_counts_keep_the_counts_of_what_was_not_listed(inputs, tmp_path, capsys):
    assert _build(inputs, tmp_path / "a") == 1
    assert main(["--inputs", *map(str, inputs), "--output-dir", str(tmp_path / "b"), "--vocab-size", "210",
                 "--no-progress", "--word-counts-from", str(tmp_path / "a")]) == 1
    card = _card(tmp_path / "b")
    assert card["skipped_record_counts"] == {"missing_field": RECORDS}
    assert card["skipped_records"] == _card(tmp_path / "a")["skipped_records"]


def test_an_empty_input_file_is_reported_and_only_empty_files_are_said_to_be_empty(inputs, tmp_path, capsys):
    empty, blank = tmp_path / "empty.txt", tmp_path / "blank.txt"
    empty.write_text("", encoding="utf-8")
    blank.write_text("\n  \n", encoding="utf-8")
    assert _build([inputs[1], empty], tmp_path / "vocab") == 1
    assert _card(tmp_path / "vocab")["skipped_records"] == [f"{empty}: empty: the file is empty (0 bytes)"]
    assert f"likely cause: 1 input file(s) are empty: {empty}" in capsys.readouterr().err
    with pytest.raises(EmptyCorpusError, match=rf"2 input file\(s\) are empty: {empty}, {blank}"):
        build_vocab([empty, blank], tmp_path / "none", VocabConfig(vocab_size=200))
    assert _build([empty, blank], tmp_path / "none") == 2
    # Review: a PubMed update file of deletions only holds no abstract and is not empty (prepare_corpus agrees)
    deletions = tmp_path / "pubmed26n1400.xml"
    deletions.write_text('<?xml version="1.0"?>\n<PubmedArticleSet><DeleteCitation><PMID Version="1">123</PMID>'
                         "</DeleteCitation></PubmedArticleSet>\n", encoding="utf-8")
    assert _build([inputs[1], deletions], tmp_path / "with_deletions") == 0


def test_a_file_of_unknown_suffix_beside_readable_ones_exits_1(inputs, tmp_path, capsys):
    """prepare_corpus's rule: a file not read for its suffix is a problem (exit 1), a licence beside is not."""
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "docs.txt").write_text("\n".join(DOCS) + "\n", encoding="utf-8")
    (folder / "LICENSE.txt").write_text("Apache-2.0\n", encoding="utf-8")
    assert _build([folder], tmp_path / "clean") == 0
    (folder / "table.csv").write_text("id,text\n1,zz\n", encoding="utf-8")
    assert _build([folder], tmp_path / "vocab") == 1
    assert "1 input file(s) of an unknown suffix not read" in capsys.readouterr().err


def test_the_list_is_bounded_per_reason_and_round_trips():
    skipped = SkippedRecords()
    for i in range(50):
        skipped.add("missing_field", f"a.jsonl, line {i + 1}: missing_field: no field 'text' (fields present: x)")
    skipped.add("invalid_json", "a.jsonl, line 60: invalid_json: Expecting value at column 1")
    assert skipped.total == 51 and len(skipped.listed) == LISTED_SKIPS_PER_REASON + 1
    again = SkippedRecords()
    again.extend_recorded(skipped.recorded())
    assert (again.counts, again.listed) == (skipped.counts, skipped.listed)
    assert SkippedRecords.from_card({"skipped_records": skipped.listed}).counts == {"missing_field": 20,
                                                                                     "invalid_json": 1}
