"""prepare_corpus: update semantics, duplicates, filters, summary counts, resume and exit codes."""

from __future__ import annotations

import json

import numpy as np
import pytest
from datasets import load_from_disk
from hypothesis import given, settings
from hypothesis import strategies as st

from biomed_lm.launch.prepare_corpus import main as prepare_main
from biomed_lm.tokenization.corpus import CorpusConfig, prepare_corpus, resolve
from tests.conftest import shared_file
from tests.test_pubmed_xml import article_set, delete, pubmed_article

WORDS = "the patients received insulin and naloxone while lymphoma cells were counted".split()


def words(n: int, salt: str = "") -> str:
    return " ".join(f"{WORDS[i % len(WORDS)]}{salt}" for i in range(n)) + "."


def run(tmp_path, inputs, **kw) -> tuple[dict, object]:
    out = tmp_path / "corpus"
    summary = prepare_corpus(CorpusConfig(inputs=[str(i) for i in inputs], output_dir=str(out), num_proc=1, **kw))
    dataset = load_from_disk(str(out)) if summary["documents_kept"] else None
    return summary, dataset


def test_update_files_revise_and_delete(tmp_path):
    baseline = tmp_path / "pubmed26n0001.xml"
    baseline.write_text(article_set(pubmed_article("1", words(10)), pubmed_article("2", words(10, "old")),
                                    pubmed_article("3", words(10))))
    update = tmp_path / "pubmed26n0002.xml"
    update.write_text(article_set(pubmed_article("2", words(12, "new"), version=1), delete("3", "999")))
    summary, ds = run(tmp_path, [tmp_path / "pubmed26n0*.xml"], min_words=5)
    assert sorted(ds["id"]) == ["1", "2"]
    revised = ds[ds["id"].index("2")]
    assert "new" in revised["text"] and "old" not in revised["text"]
    assert revised["source"] == "pubmed26n0002.xml"
    assert summary["dropped"]["superseded"] == 1 and summary["dropped"]["deleted"] == 1
    assert summary["read"]["deletions"] == 2


def test_delete_then_readd_in_a_later_file(tmp_path):
    a, b, c = (tmp_path / f"n000{i}.xml" for i in (1, 2, 3))
    a.write_text(article_set(pubmed_article("7", words(8))))
    b.write_text(article_set(delete("7")))
    c.write_text(article_set(pubmed_article("7", words(9, "back"))))
    summary, ds = run(tmp_path, [a, b, c], min_words=1)
    assert ds["id"] == ["7"] and "back" in ds["text"][0]
    assert summary["dropped"]["deleted"] == 1


def test_text_duplicates_filters_and_summary(tmp_path):
    text = tmp_path / "docs.txt"
    text.write_text("\n".join([words(20), words(3), "", words(20), words(25, "x")]) + "\n")
    xml = tmp_path / "p.xml"
    xml.write_text(article_set(pubmed_article("5", ""), pubmed_article("6", words(20), language="fre"),
                               pubmed_article("8", words(20))))
    summary, ds = run(tmp_path, [text, xml], min_words=10, languages=["eng"])
    assert summary["dropped"] == {"deleted": 0, "superseded": 0, "duplicate_text": 1, "empty_abstract": 1,
                                  "language": 1, "too_short": 1}
    assert summary["read"]["empty_lines"] == 1
    assert sorted(ds["id"]) == ["8", "docs.txt:1", "docs.txt:5"]  # the first copy of a duplicate is kept
    f = summary["funnel"]
    assert f["document_rows"] == f["kept"] + sum(summary["dropped"].values())


def test_sentences_title_and_columns(tmp_path):
    xml = tmp_path / "p.xml"
    xml.write_text(article_set(pubmed_article("1", "Dr. Smith et al. gave 2.5 mg i.v. daily. Pain fell.",
                                              title="Naloxone trial.")))
    _, ds = run(tmp_path, [xml], min_words=1)
    row = ds[0]
    assert ds.column_names == ["id", "source", "text", "sentences", "title", "year", "language", "links"]
    assert row["sentences"] == ["Naloxone trial.", "Dr. Smith et al. gave 2.5 mg i.v. daily.", "Pain fell."]
    assert row["text"].startswith("Naloxone trial. Dr. Smith") and row["year"] == 2001 and row["language"] == "eng"
    _, ds = run(tmp_path / "no_title", [xml], min_words=1, include_title=False)
    assert ds[0]["sentences"][0].startswith("Dr. Smith")


def test_structured_sections_end_sentences_and_any_language_counts(tmp_path):
    """A section's last sentence never runs into the next section (QA: 36 of 870 boundaries in the MEDLINE
    sample did), and an article in French and English is kept by --languages eng (QA: only the first
    <Language> was read)."""
    from biomed_lm.tokenization.sentences import splitter_identity

    xml = tmp_path / "p.xml"
    xml.write_text(article_set(
        pubmed_article("1", [("METHODS", "Women undergoing IVF"), ("RESULTS", "None."),
                             ("CONCLUSIONS", "Incidence of aneuploidy rose.")], title="IVF."),
        pubmed_article("2", words(8), language="fre</Language><Language>eng"),
        pubmed_article("3", words(8, "f"), language="fre")))
    summary, ds = run(tmp_path, [xml], min_words=1, languages=["eng"])
    assert ds["id"] == ["1", "2"] and summary["dropped"]["language"] == 1
    assert ds[0]["sentences"] == ["IVF.", "Women undergoing IVF", "None.", "Incidence of aneuploidy rose."]
    assert ds[1]["language"] == "fre eng"
    assert summary["inputs_identity"]["sentence_splitter"] == splitter_identity()


def test_a_new_sentence_splitter_splits_again_and_a_bom_is_not_text(tmp_path, monkeypatch):
    """The sentences' cache and the finished corpus name the splitter (QA: after a change to the splitter,
    --overwrite reused the old sentences); a byte-order mark does not stay in the first document."""
    import biomed_lm.tokenization.corpus as corpus

    text = tmp_path / "bom.txt"
    text.write_bytes("\ufeff".encode() + words(6).encode() + b"\n")
    _, ds = run(tmp_path, [text], min_words=1)
    assert ds[0]["text"] == words(6)
    monkeypatch.setattr(corpus, "splitter_identity", lambda: "99/test")
    monkeypatch.setattr(corpus, "split_sentences", lambda text: ["split anew"])
    with pytest.raises(FileExistsError, match="sentence_splitter"):
        run(tmp_path, [text], min_words=1)
    _, ds = run(tmp_path, [text], min_words=1, overwrite=True)
    assert ds[0]["sentences"] == ["split anew"]


def test_jsonl_with_numeric_ids_are_pmids(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [
        {"pmid": "4", "abstract": words(6, "a")}, {"pmid": "4", "abstract": words(6, "b")},
        {"pmid": "x1", "abstract": words(6, "c")}]) + "\n")
    summary, ds = run(tmp_path, [path], min_words=1, text_field="abstract", id_field="pmid")
    assert sorted(ds["id"]) == ["4", "x1"] and summary["dropped"]["superseded"] == 1
    assert "b" in ds[ds["id"].index("4")]["text"]


def test_damage_is_reported_and_good_records_survive(tmp_path):
    good = tmp_path / "a.txt"
    good.write_bytes(words(5).encode() + b"\n\xff\xfe broken\n" + words(6, "z").encode() + b"\n")
    summary, ds = run(tmp_path, [good, tmp_path / "missing.xml"], min_words=1)
    assert summary["documents_kept"] == 2
    assert summary["problem_counts"] == {"missing": 1, "invalid_utf8": 1}
    bad = [p for p in summary["problems"] if p["reason"] == "invalid_utf8"][0]
    assert bad["line"] == 2 and bad["path"].endswith("a.txt")


def test_resume_reuses_parsed_files_and_refuses_to_clobber(tmp_path, monkeypatch):
    xml = tmp_path / "p.xml"
    xml.write_text(article_set(*[pubmed_article(str(i), words(12)) for i in range(1, 6)]))
    first, ds1 = run(tmp_path, [xml], min_words=1)
    assert run(tmp_path, [xml], min_words=1)[0]["already_complete"]  # the same command: nothing to redo
    with pytest.raises(FileExistsError, match="min_words: 1 in the finished corpus, 2 now"):
        run(tmp_path, [xml], min_words=2)

    import biomed_lm.tokenization.corpus as corpus

    def no_parsing(*args, **kwargs):
        raise AssertionError("an already parsed file was parsed again")

    monkeypatch.setattr(corpus, "parse_file", no_parsing)
    second, ds2 = run(tmp_path, [xml], min_words=1, overwrite=True)
    assert ds2["id"] == ds1["id"] and second["funnel"] == first["funnel"]


def test_rerun_with_an_added_update_file_uses_the_update(tmp_path):
    baseline = tmp_path / "n0001.xml"
    baseline.write_text(article_set(pubmed_article("1", words(10, "old")), pubmed_article("2", words(10))))
    _, first = run(tmp_path, [baseline], min_words=1)
    update = tmp_path / "n0002.xml"
    update.write_text(article_set(pubmed_article("1", words(10, "new"))))
    _, second = run(tmp_path, [baseline, update], min_words=1, overwrite=True)
    assert len(first) == len(second) == 2
    texts = dict(zip(second["id"], second["text"]))
    assert "new" in texts["1"] and "old" not in texts["1"]


def test_parallel_equals_serial(tmp_path):
    files = []
    for n in range(4):
        path = tmp_path / f"n{n}.xml"
        path.write_text(article_set(*[pubmed_article(str(10 * n + i), words(15, str(i))) for i in range(5)],
                                    delete(str(10 * n - 9)) if n else ""))
        files.append(path)
    serial = prepare_corpus(CorpusConfig(inputs=[str(f) for f in files], output_dir=str(tmp_path / "s"),
                                         min_words=1, num_proc=1))
    parallel = prepare_corpus(CorpusConfig(inputs=[str(f) for f in files], output_dir=str(tmp_path / "p"),
                                           min_words=1, num_proc=2))
    assert serial["dropped"] == parallel["dropped"]
    assert load_from_disk(str(tmp_path / "s"))["id"] == load_from_disk(str(tmp_path / "p"))["id"]


def test_cli_exit_codes(tmp_path, capsys):
    xml = tmp_path / "p.xml"
    xml.write_text(article_set(pubmed_article("1", words(130))))
    assert prepare_main(["--inputs", str(xml), "--output-dir", str(tmp_path / "ok")]) == 0
    assert prepare_main(["--inputs", str(xml), str(tmp_path / "nope.txt"), "--output-dir", str(tmp_path / "bad")]) == 1
    assert "nope.txt: missing" in capsys.readouterr().err
    config = tmp_path / "c.yaml"
    config.write_text("inputs: [a.xml]\nmin_wordz: 3\n")
    assert prepare_main(["--config", str(config), "--output-dir", str(tmp_path / "x")]) == 2
    assert "min_wordz" in capsys.readouterr().err
    config.write_text(f"inputs: ['{xml}']\nmin_words: 200\n")
    assert prepare_main(["--config", str(config), "--output-dir", str(tmp_path / "y"), "--min-words", "100"]) == 0
    assert json.loads((tmp_path / "y" / "summary.json").read_text())["documents_kept"] == 1
    # Unusable options are the package's own errors (exit 2, the message, no traceback), refused before parsing.
    assert prepare_main(["--inputs", str(xml), "--output-dir", str(tmp_path / "z"), "--max-shard-size", "5XB"]) == 2
    assert "prepare_corpus: error: max_shard_size (--max-shard-size) '5XB' is not a size: give a whole number" \
        in capsys.readouterr().err
    assert prepare_main(["--output-dir", str(tmp_path / "z")]) == 2
    assert "prepare_corpus: error: no inputs given" in capsys.readouterr().err
    assert not (tmp_path / "z").exists()


def test_real_medline_sample(tmp_path):
    source = shared_file("pubmed/medline16n0902_sample.xml.gz")
    summary, ds = run(tmp_path, [source])
    assert summary["funnel"]["with_abstract"] == 526
    assert summary["documents_kept"] == len(ds) == 446
    assert summary["read"]["deletions"] == 1 and summary["problems"] == []
    assert "26432306" not in set(ds["id"])
    assert all(len(s) >= 2 for s in ds["sentences"])


@st.composite
def record_streams(draw):
    n = draw(st.integers(1, 60))
    keys = draw(st.lists(st.integers(-5, 8), min_size=n, max_size=n))
    deletes = [k >= 0 and draw(st.booleans()) and draw(st.booleans()) for k in keys]
    n_words = draw(st.lists(st.integers(0, 20), min_size=n, max_size=n))
    lang = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    return np.array(keys, dtype=np.int64), np.array(deletes), np.array(n_words), np.array(lang)


@settings(max_examples=200, deadline=None)
@given(record_streams(), st.integers(0, 20))
def test_resolve_properties(stream, min_words):
    keys, is_delete, n_words, language_ok = stream
    keep, dropped, funnel = resolve(keys, is_delete, n_words, language_ok, min_words)
    # Every document row is kept or dropped for exactly one reason.
    assert funnel["document_rows"] == int((~is_delete).sum()) == funnel["kept"] + sum(dropped.values())
    kept_keys = keys[keep]
    assert len(set(kept_keys.tolist())) == len(kept_keys)
    for i in np.flatnonzero(keep):
        assert not is_delete[i] and n_words[i] >= max(min_words, 1) and language_ok[i]
        later = [j for j in range(i + 1, len(keys)) if keys[j] == keys[i]]
        earlier = [j for j in range(i) if keys[j] == keys[i]]
        if keys[i] >= 0:
            assert later == []            # a PMID's newest row wins ...
        else:
            assert earlier == []          # ... a text's first copy is kept
    for key in set(keys.tolist()):        # a PMID whose last row is a delete is gone
        last = max(j for j in range(len(keys)) if keys[j] == key)
        if is_delete[last]:
            assert key not in set(kept_keys.tolist())


def test_parsing_one_file_reports_its_rows_as_it_goes(tmp_path):
    """One large file is parsed by one process, and the bar counted files: hours without a move. parse_file
    tells its caller the rows parsed at each record batch it writes."""
    from biomed_lm.tokenization.corpus import FLUSH_ROWS, parse_file

    path = tmp_path / "many.txt"
    path.write_text("".join(f"doc {i} has words\n" for i in range(2 * FLUSH_ROWS + 5)), encoding="utf-8")
    seen: list[int] = []
    summary = parse_file(path, tmp_path / "shard.arrow", CorpusConfig(inputs=[str(path)]), on_rows=seen.append)
    assert seen == [FLUSH_ROWS, 2 * FLUSH_ROWS, 2 * FLUSH_ROWS + 5] and summary["rows"] == 2 * FLUSH_ROWS + 5
