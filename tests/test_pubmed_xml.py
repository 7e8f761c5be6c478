"""PubMed/MEDLINE XML parsing: both layouts, structured abstracts, deletes, revisions and damage."""

from __future__ import annotations

import gzip
import random
import zlib

from biomed_lm.tokenization.pubmed_xml import Citation, Deletion, iter_pubmed_records
from biomed_lm.tokenization.streams import Problem
from tests.conftest import shared_file


def medline_citation(pmid: str, abstract: str | list[tuple[str, str]] = "", title: str = "A title.",
                     version: int = 1, year: str = "<Year>2001</Year>", language: str = "eng") -> str:
    if isinstance(abstract, str):
        sections = f"<AbstractText>{abstract}</AbstractText>" if abstract else ""
    else:
        sections = "".join(f'<AbstractText Label="{label}" NlmCategory="X">{text}</AbstractText>'
                           for label, text in abstract)
    abstract_xml = f"<Abstract>{sections}</Abstract>" if sections else ""
    return (f'<MedlineCitation Status="MEDLINE" Owner="NLM">\n<PMID Version="{version}">{pmid}</PMID>\n'
            f"<Article PubModel=\"Print\">\n<Journal><JournalIssue><PubDate>{year}</PubDate></JournalIssue></Journal>\n"
            f"<ArticleTitle>{title}</ArticleTitle>\n{abstract_xml}\n<Language>{language}</Language>\n"
            f"</Article>\n</MedlineCitation>\n")


def pubmed_article(pmid: str, abstract="", **kw) -> str:
    return (f"<PubmedArticle>\n{medline_citation(pmid, abstract, **kw)}<PubmedData><ReferenceList><Reference>"
            f"<Citation>Ref.</Citation></Reference></ReferenceList></PubmedData>\n</PubmedArticle>\n")


def article_set(*records: str) -> str:
    return ('<?xml version="1.0" encoding="UTF-8"?>\n<!DOCTYPE PubmedArticleSet PUBLIC "x" "y.dtd">\n'
            "<PubmedArticleSet>\n" + "".join(records) + "</PubmedArticleSet>\n")


def delete(*pmids: str) -> str:
    return "<DeleteCitation>\n" + "".join(f'<PMID Version="1">{p}</PMID>\n' for p in pmids) + "</DeleteCitation>\n"


def parse(path) -> tuple[list[Citation], list[Deletion], list[Problem]]:
    items = list(iter_pubmed_records(path))
    return ([i for i in items if isinstance(i, Citation)], [i for i in items if isinstance(i, Deletion)],
            [i for i in items if isinstance(i, Problem)])


def test_structured_abstract_sections_labels_and_inline_markup(tmp_path):
    path = tmp_path / "a.xml"
    path.write_text(article_set(pubmed_article("11", [
        ("BACKGROUND", "IL-<i>6</i> rises&#xa0;fast."), ("METHODS", "We used CO<sub>2</sub> &amp; O<sub>2</sub>."),
        ("", "Unlabelled tail.")], title="The <i>RecA</i> protein.")))
    (cit,), _, problems = parse(path)
    assert problems == []
    assert cit.pmid == "11" and cit.title == "The RecA protein."
    assert cit.abstract == "IL-6 rises fast. We used CO2 & O2. Unlabelled tail."
    assert cit.abstract_sections[0] == ("BACKGROUND", "IL-6 rises fast.")
    assert cit.abstract_text(section_labels=True) == (
        "BACKGROUND: IL-6 rises fast. METHODS: We used CO2 & O2. Unlabelled tail.")
    assert cit.document_text() == "The RecA protein. IL-6 rises fast. We used CO2 & O2. Unlabelled tail."
    assert cit.language == "eng" and cit.year == 2001


def test_efetch_indentation_before_inline_markup_is_layout(tmp_path):
    # efetch pretty-prints mixed content: a line break and indentation before each inline element.
    path = tmp_path / "efetch.xml"
    path.write_text(article_set(pubmed_article("12", [
        ("BACKGROUND", "a fast-acting &#946;\n\t\t\t\t\t\t<sub>2</sub>-agonist may help.\n\t\t\t\t\t"),
        ("METHODS", "cultures of \n      <i>E. coli</i> grew;\nthen <i>in vitro</i> tests.")])))
    (cit,), _, problems = parse(path)
    assert problems == []
    # A space written before the layout run is a word break; a line break with no indentation too.
    assert cit.abstract_sections == (("BACKGROUND", "a fast-acting \u03b22-agonist may help."),
                                     ("METHODS", "cultures of E. coli grew; then in vitro tests."))


def test_real_efetch_record_keeps_beta2_agonist_whole():
    (cit,) = [c for c in iter_pubmed_records(shared_file("pubmed/pubmed-29768149.xml")) if isinstance(c, Citation)]
    assert "fast-acting \u03b22-agonist may" in cit.abstract


def test_pubmed_article_set_layout_with_book_and_delete(tmp_path):
    book = ("<PubmedBookArticle><BookDocument><PMID Version=\"1\">77</PMID><Book><BookTitle>Gene Reviews"
            "</BookTitle><PubDate><Year>1999</Year></PubDate></Book><Language>eng</Language><Abstract>"
            "<AbstractText>Book abstract.</AbstractText></Abstract></BookDocument><PubmedBookData/>"
            "</PubmedBookArticle>\n")
    path = tmp_path / "b.xml"
    path.write_text(article_set(pubmed_article("1", "First."), book, delete("5", "6"),
                                pubmed_article("2", "Second.")))
    cits, dels, problems = parse(path)
    assert problems == []
    assert [c.pmid for c in cits] == ["1", "77", "2"]
    assert cits[1].title == "Gene Reviews" and cits[1].abstract == "Book abstract." and cits[1].year == 1999
    assert dels == [Deletion(pmids=("5", "6"), line=dels[0].line)]


def test_medline_citation_set_layout_gzip_and_medline_date(tmp_path):
    xml = ('<?xml version="1.0"?>\n<MedlineCitationSet>\n'
           + medline_citation("10", "Old layout.", year="<MedlineDate>1998 Dec-1999 Jan</MedlineDate>")
           + medline_citation("11", "", title="Title only.") + delete("10") + "</MedlineCitationSet>\n")
    path = tmp_path / "medline.xml.gz"
    path.write_bytes(gzip.compress(xml.encode()))
    cits, dels, problems = parse(path)
    assert problems == []
    assert [(c.pmid, c.year, c.abstract) for c in cits] == [("10", 1998, "Old layout."), ("11", 2001, "")]
    assert dels[0].pmids == ("10",)


def test_revisions_keep_their_version_attribute(tmp_path):
    path = tmp_path / "v.xml"
    path.write_text(article_set(pubmed_article("9", "v1 text.", version=1), pubmed_article("9", "v2 text.", version=2)))
    cits, _, _ = parse(path)
    assert [(c.pmid, c.version, c.abstract) for c in cits] == [("9", 1, "v1 text."), ("9", 2, "v2 text.")]


def test_malformed_record_is_reported_and_neighbours_are_kept(tmp_path):
    bad = pubmed_article("2", "Broken <b>tag.")  # <b> never closed
    path = tmp_path / "m.xml"
    path.write_text(article_set(pubmed_article("1", "Good one."), bad, pubmed_article("3", "Good three.")))
    cits, _, problems = parse(path)
    assert [c.pmid for c in cits] == ["1", "3"]
    assert len(problems) == 1 and problems[0].reason == "malformed_xml"
    bad_line = path.read_text().splitlines().index("<PubmedArticle>", 10) + 1
    assert problems[0].line >= bad_line and str(path) in problems[0].describe()
    assert "(PMID 2)" in problems[0].describe()  # which citation is lost


def test_unclosed_record_is_skipped_up_to_the_next_record(tmp_path):
    text = article_set(pubmed_article("1", "One."), "<PubmedArticle>\n<MedlineCitation>\n<PMID>2</PMID>\n",
                       pubmed_article("3", "Three."))
    path = tmp_path / "u.xml"
    path.write_text(text)
    cits, _, problems = parse(path)
    assert [c.pmid for c in cits] == ["1", "3"]
    assert [p.reason for p in problems] == ["malformed_xml"]
    # The line of the unclosed <PubmedArticle> tag, the line before <MedlineCitation>.
    assert problems[0].line == text.splitlines().index("<PMID>2</PMID>") - 1


def test_invalid_utf8_in_one_record(tmp_path):
    good1, good2 = pubmed_article("1", "Fine."), pubmed_article("3", "Also fine.")
    raw = article_set(good1, pubmed_article("2", "BADBYTE here."), good2).encode().replace(b"BADBYTE", b"\xff\xfe")
    path = tmp_path / "enc.xml"
    path.write_bytes(raw)
    cits, _, problems = parse(path)
    assert [c.pmid for c in cits] == ["1", "3"]
    assert problems[0].reason == "invalid_utf8"
    assert problems[0].byte_offset == raw.index(b"\xff\xfe")
    assert problems[0].line == raw[:raw.index(b"\xff")].count(b"\n") + 1


def test_truncated_gzip_keeps_every_complete_record(tmp_path):
    records = [pubmed_article(str(i), f"Abstract number {i}. " * 20) for i in range(1, 400)]
    blob = gzip.compress(article_set(*records).encode())
    path = tmp_path / "t.xml.gz"
    path.write_bytes(blob[: len(blob) * 2 // 3])
    cits, _, problems = parse(path)
    assert len(cits) > 100
    assert [c.pmid for c in cits] == [str(i) for i in range(1, len(cits) + 1)]
    assert [p.reason for p in problems] == ["truncated_record"]
    assert "truncated" in problems[0].message


def test_corrupt_gzip_keeps_the_data_before_the_damage(tmp_path):
    rng = random.Random(0)
    words = ["alpha", "beta", "gamma", "kinase", "tumor", "patients", "dose", "mg", "cells", "liver"]
    blob = gzip.compress(article_set(*[pubmed_article(str(i), " ".join(rng.choices(words, k=120)))
                                       for i in range(1, 300)]).encode())
    damaged = bytearray(blob)
    for i in range(len(blob) // 2, len(blob) // 2 + 40):
        damaged[i] ^= 0xA5
    path = tmp_path / "c.xml.gz"
    path.write_bytes(bytes(damaged))
    cits, _, problems = parse(path)
    assert len(problems) >= 1
    assert {p.reason for p in problems} <= {"truncated_record", "truncated_or_corrupt_gzip", "malformed_xml",
                                            "malformed_record", "invalid_utf8"}
    assert len(cits) > 50 and [c.pmid for c in cits][:50] == [str(i) for i in range(1, 51)]


def test_concatenated_gzip_members(tmp_path):
    part1 = gzip.compress(b'<?xml version="1.0"?>\n<PubmedArticleSet>\n' + pubmed_article("1", "A.").encode())
    part2 = gzip.compress((pubmed_article("2", "B.") + "</PubmedArticleSet>\n").encode())
    path = tmp_path / "cat.xml.gz"
    path.write_bytes(part1 + part2)
    cits, _, problems = parse(path)
    assert [c.pmid for c in cits] == ["1", "2"] and problems == []


def test_records_straddling_read_blocks(tmp_path, monkeypatch):
    import biomed_lm.tokenization.pubmed_xml as px

    monkeypatch.setattr(px, "READ_BLOCK", 97)  # tiny blocks: every record crosses several
    records = [pubmed_article(str(i), f"Text {i}.") for i in range(1, 60)]
    text = article_set(*records)
    path = tmp_path / "s.xml"
    path.write_text(text)
    cits, _, problems = parse(path)
    assert problems == [] and [c.pmid for c in cits] == [str(i) for i in range(1, 60)]
    lines = text.splitlines()
    expected = [i + 1 for i, line in enumerate(lines) if line.startswith("<MedlineCitation")]
    assert [c.line for c in cits] == expected


def test_not_pubmed_xml_and_missing_file(tmp_path):
    path = tmp_path / "other.xml"
    path.write_text("<root><item/></root>")
    assert [p.reason for p in iter_pubmed_records(path)] == ["no_records"]
    assert [p.reason for p in iter_pubmed_records(tmp_path / "absent.xml")] == ["missing"]


def test_real_medline_sample_counts_and_delete():
    path = shared_file("pubmed/medline16n0902_sample.xml.gz")
    cits, dels, problems = parse(path)
    assert problems == []
    with_abstract = [c for c in cits if c.abstract]
    assert len(with_abstract) == 526
    assert sum(len(c.abstract.split()) >= 128 for c in with_abstract) == 446
    assert dels and dels[0].pmids == ("26432306",)


def test_real_sample_truncated_mid_file(tmp_path):
    source = shared_file("pubmed/medline16n0902_sample.xml.gz")
    full, _, _ = parse(source)
    blob = source.read_bytes()
    cut = tmp_path / "cut.xml.gz"
    cut.write_bytes(blob[: len(blob) // 2])
    cits, _, problems = parse(cut)
    assert [c.pmid for c in cits] == [c.pmid for c in full[: len(cits)]]
    # Every record that ended before the cut is there: the decompressible prefix holds no more.
    prefix = zlib.decompressobj(31).decompress(blob[: len(blob) // 2])
    assert len(cits) == prefix.count(b"</MedlineCitation>")
    assert [p.reason for p in problems] == ["truncated_record"]
    assert problems[0].line == prefix[: prefix.rindex(b"<MedlineCitation ")].count(b"\n") + 1
