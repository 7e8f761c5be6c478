"""Citation links (issue 15, item 3): each citation's outgoing links, kept by type from
CommentsCorrections and the reference list, carried into the corpus as the ``links`` column, merged
with a links file, and counted in ``summary.json``."""

from __future__ import annotations

import gzip
import json

import pytest
from datasets import Value, load_from_disk
from hypothesis import given, settings
from hypothesis import strategies as st

from biomed_lm.launch.prepare_corpus import main as prepare_main
from biomed_lm.tokenization.corpus import CorpusConfig, prepare_corpus, read_links_file
from biomed_lm.tokenization.pubmed_xml import (CITATION_LINK_TYPES, REFERENCE_LIST, Citation, canonical_pmid,
                                               collect_links, iter_pubmed_records)
from biomed_lm.tokenization.streams import Problem
from tests.conftest import shared_file
from tests.test_pubmed_xml import article_set, medline_citation

ABSTRACT = "Insulin and naloxone were given to the patients while lymphoma cells were counted daily."


def comments(*links: tuple[str, str | None]) -> str:
    """A CommentsCorrectionsList: (RefType, PMID text); a PMID of None gives an entry with only a RefSource."""
    entries = "".join(f'<CommentsCorrections RefType="{ref_type}"><RefSource>J X. 2001;1:1</RefSource>'
                      + (f'<PMID Version="1">{pmid}</PMID>' if pmid is not None else "") + "</CommentsCorrections>\n"
                      for ref_type, pmid in links)
    return f"<CommentsCorrectionsList>\n{entries}</CommentsCorrectionsList>\n"


def references(*ids: tuple[str, str]) -> str:
    """A ReferenceList: one Reference per (IdType, id)."""
    refs = "".join(f"<Reference><Citation>Ref {i}.</Citation><ArticleIdList><ArticleId IdType=\"{kind}\">{value}"
                   "</ArticleId></ArticleIdList></Reference>\n" for i, (kind, value) in enumerate(ids))
    return f"<ReferenceList>\n{refs}</ReferenceList>\n"


def article(pmid: str, cc: str = "", refs: str = "", abstract: str = ABSTRACT) -> str:
    """A PubmedArticle with CommentsCorrections ``cc`` in its MedlineCitation and ``refs`` in its PubmedData."""
    citation = medline_citation(pmid, abstract).replace("</Article>\n", "</Article>\n" + cc)
    return (f"<PubmedArticle>\n{citation}<PubmedData><History/>{refs}<ArticleIdList><ArticleId IdType=\"pubmed\">"
            f"{pmid}</ArticleId></ArticleIdList></PubmedData>\n</PubmedArticle>\n")


def citations(path) -> tuple[list[Citation], list[Problem]]:
    items = list(iter_pubmed_records(path))
    return [i for i in items if isinstance(i, Citation)], [i for i in items if isinstance(i, Problem)]


# ------------------------------------------------------------------------------------ parsing

def test_links_are_kept_apart_by_type_deduplicated_in_order(tmp_path):
    cc = comments(("Cites", "300"), ("CommentOn", "400"), ("Cites", "200"), ("Cites", "300"),
                  ("Cites", "10"),                       # a link to the citation itself
                  ("Cites", "PMC1234"), ("Cites", ""),   # not PMIDs: skipped, counted
                  ("ErratumIn", "0500"),                 # leading zeros dropped
                  ("RetractionOf", "600"), ("CommentIn", None), ("Cites", "200"))
    refs = references(("doi", "10.1/x"), ("pubmed", "200"), ("pubmed", "700"), ("pubmed", "n/a"),
                      ("pubmed", "700"), ("pmc", "PMC9"), ("pubmed", " 800 "))
    path = tmp_path / "a.xml"
    path.write_text(article_set(article("10", cc, refs)))
    (cit,), problems = citations(path)
    assert problems == []
    assert cit.links == {"Cites": ("300", "200"), "CommentOn": ("400",), "ErratumIn": ("500",),
                         "RetractionOf": ("600",), REFERENCE_LIST: ("200", "700", "800")}
    assert list(cit.links) == ["Cites", "CommentOn", "ErratumIn", "RetractionOf", "ReferenceList"]
    assert cit.skipped_links == 3  # PMC1234, "" and n/a
    assert CITATION_LINK_TYPES == ("Cites", "ReferenceList")
    assert cit.cited() == ("300", "200", "700", "800")  # Cites first, then the reference list, each once
    assert cit.cited(("CommentOn", "Cites")) == ("400", "300", "200")
    assert cit.abstract == ABSTRACT  # the text is what it was
    hash(cit)  # still hashable: the links mapping is left out of the hash


def test_records_without_links_medline_layout_and_books(tmp_path):
    medline = medline_citation("5", ABSTRACT).replace("</Article>\n", "</Article>\n" + comments(("Cites", "6")))
    book = ("<PubmedBookArticle><BookDocument><PMID Version=\"1\">77</PMID><Book><BookTitle>Gene Reviews</BookTitle>"
            "</Book><Abstract><AbstractText>Book abstract.</AbstractText></Abstract>"
            + references(("pubmed", "8"), ("pubmed", "77")) + "</BookDocument><PubmedBookData/></PubmedBookArticle>\n")
    old = tmp_path / "m.xml.gz"
    old.write_bytes(gzip.compress(f"<?xml version=\"1.0\"?>\n<MedlineCitationSet>\n{medline}</MedlineCitationSet>\n"
                                  .encode()))
    new = tmp_path / "n.xml"
    # The test helper's PubmedArticle has a ReferenceList whose Reference has no ArticleIdList: no link.
    from tests.test_pubmed_xml import pubmed_article
    new.write_text(article_set(pubmed_article("1", "One."), book, article("2")))
    (cit,), _ = citations(old)
    assert cit.links == {"Cites": ("6",)} and cit.cited() == ("6",)
    cits, problems = citations(new)
    assert problems == []
    assert [c.links for c in cits] == [{}, {REFERENCE_LIST: ("8",)}, {}]


def test_reference_ids_are_read_from_the_bytes_of_pubmed_data(tmp_path):
    # PubmedData is not parsed as XML: markup ElementTree would refuse there costs nothing, and the
    # ArticleId's attributes may come in any order and quoting.
    refs = ("<ReferenceList><Title>References</Title>\n<Reference><ArticleIdList>"
            "<ArticleId IdType='pubmed'>9</ArticleId><ArticleId Source=\"x\" IdType=\"pubmed\">11</ArticleId>"
            "</ArticleIdList></Reference><Broken>\n<ReferenceList><Reference><ArticleIdList>"
            "<ArticleId IdType=\"pmc\">PMC5</ArticleId><ArticleId IdType=\"pubmed\">12</ArticleId></ArticleIdList>"
            "</Reference></ReferenceList>\n</ReferenceList>\n")
    path = tmp_path / "d.xml"
    path.write_text(article_set(article("1", comments(("Cites", "2")), references(("pubmed", "3"))),
                                article("4", comments(("Cites", "5")), refs), article("6", refs="<ReferenceList/>")))
    cits, problems = citations(path)
    assert problems == []
    assert [(c.pmid, c.links) for c in cits] == [("1", {"Cites": ("2",), REFERENCE_LIST: ("3",)}),
                                                  ("4", {"Cites": ("5",), REFERENCE_LIST: ("9", "11", "12")}),
                                                  ("6", {})]


@settings(max_examples=200, deadline=None)
@given(own=st.sampled_from(["1", "2", "x"]),
       pairs=st.lists(st.tuples(st.sampled_from(["Cites", "CommentOn", REFERENCE_LIST]),
                                st.one_of(st.sampled_from(["1", "2", "02", "3", " 4 ", "", "x9", "0", None]),
                                          st.text(max_size=4))), max_size=25))
def test_collect_links_property(own, pairs):
    links, skipped = collect_links(own, pairs)
    assert skipped == sum(canonical_pmid(value) is None for _, value in pairs)
    for link_type, pmids in links.items():
        expected = [canonical_pmid(v) for t, v in pairs if t == link_type and canonical_pmid(v) is not None]
        expected = list(dict.fromkeys(p for p in expected if p != canonical_pmid(own)))
        assert list(pmids) == expected and pmids and own not in pmids
        assert all(p.isdigit() and p.isascii() and not p.startswith("0") for p in pmids)
    assert set(links) == {t for t, v in pairs if canonical_pmid(v) not in (None, canonical_pmid(own))}


# ------------------------------------------------------------------------------------ corpus

def run(tmp_path, inputs, name="corpus", **kw) -> tuple[dict, object]:
    out = tmp_path / name
    kw.setdefault("min_words", 1)
    summary = prepare_corpus(CorpusConfig(inputs=[str(i) for i in inputs], output_dir=str(out), num_proc=1, **kw))
    return summary, load_from_disk(str(out))


def links_of(ds) -> dict[str, list[str]]:
    return dict(zip(ds["id"], ds["links"]))


def small_corpus(tmp_path):
    path = tmp_path / "p.xml"
    path.write_text(article_set(
        article("1", comments(("Cites", "2"), ("Cites", "99"), ("CommentOn", "3")), references(("pubmed", "2"),
                                                                                                ("pubmed", "4"))),
        article("2", comments(("CommentIn", "1"))),
        article("3", refs=references(("pubmed", "1"))),
        article("5", comments(("Cites", "1")), abstract="")))  # no abstract: not in the corpus
    return path


def test_links_column_round_trips_with_summary_counts(tmp_path):
    summary, ds = run(tmp_path, [small_corpus(tmp_path)])
    assert ds.column_names[-1] == "links" and ds.features["links"].feature == Value("string")
    assert links_of(ds) == {"1": ["2", "99", "4"], "2": [], "3": ["1"]}
    reloaded = load_from_disk(str(tmp_path / "corpus"))
    assert reloaded["links"] == ds["links"]
    links = summary["links"]
    assert (links["link_types"], links["documents_with_links"], links["links"], links["resolvable"]) == (
        ["Cites", "ReferenceList"], 2, 4, 2)
    assert links["by_type"] == {"Cites": {"documents": 1, "links": 2, "resolvable": 1},
                                "ReferenceList": {"documents": 2, "links": 3, "resolvable": 2},
                                "CommentOn": {"documents": 1, "links": 1, "resolvable": 1},
                                "CommentIn": {"documents": 1, "links": 1, "resolvable": 1}}
    # other types into the column on request
    summary, ds = run(tmp_path, [small_corpus(tmp_path)], name="all", link_types=["Cites", "CommentOn", "CommentIn"])
    assert links_of(ds) == {"1": ["2", "99", "3"], "2": ["1"], "3": []}
    assert summary["links"]["resolvable"] == 3


@pytest.mark.parametrize("chunk", [100_000, 1, 2])  # documents whose links are assembled at a time
def test_links_file_is_merged(tmp_path, monkeypatch, chunk):
    import biomed_lm.tokenization.corpus as corpus

    monkeypatch.setattr(corpus, "LINKS_CHUNK", chunk)
    links = tmp_path / "links.tsv"
    links.write_text("# citing_pmid\tcited_pmid\n1\t2\n1\t7\n\n2\t3\n3\t3\n2\t1\tCommentOn\n42\t1\n1\t7\n")
    summary, ds = run(tmp_path, [small_corpus(tmp_path)], links_file=str(links))
    # 1->2 was already a Cites link (once), 1->7 is new (twice in the file, once in the column);
    # 3->3 is a self-link, 2->1 CommentOn is not a column type, 42 is not in the corpus.
    assert links_of(ds) == {"1": ["2", "99", "4", "7"], "2": ["3"], "3": ["1"]}
    assert summary["problems"] == []
    assert summary["links"]["links_file"] == {"path": str(links), "links_read": 6, "self_links": 1,
                                              "citing_not_in_corpus": 1}
    assert summary["links"]["by_type"]["Cites"] == {"documents": 2, "links": 4, "resolvable": 2}


def test_bad_link_line_is_reported_with_file_and_line_and_good_lines_kept(tmp_path, capsys):
    links = tmp_path / "links.tsv"
    links.write_text("1\t3\n# fine\n1 4\nPMC1\t3\n2\t3\n")
    good, problems = read_links_file(str(links))
    assert good.citing.tolist() == [1, 2] and good.cited.tolist() == [3, 3]
    assert [(p.reason, p.path, p.line) for p in problems] == [("bad_link", str(links), 3), ("bad_link", str(links), 4)]
    assert "1 tab-separated field" in problems[0].message and "citing_pmid 'PMC1'" in problems[1].message
    gz = tmp_path / "links.tsv.gz"
    gz.write_bytes(gzip.compress(links.read_bytes()))
    assert read_links_file(str(gz))[0].cited.tolist() == [3, 3]
    out = tmp_path / "cli"
    code = prepare_main(["--inputs", str(small_corpus(tmp_path)), "--output-dir", str(out), "--min-words", "1",
                         "--num-proc", "1", "--links-file", str(links)])
    err = capsys.readouterr().err
    assert code == 1 and f"{links}, line 3: bad_link" in err and f"{links}, line 4: bad_link" in err
    assert links_of(load_from_disk(str(out)))["2"] == ["3"]  # the good lines are in the corpus
    assert json.loads((out / "summary.json").read_text())["problem_counts"] == {"bad_link": 2}


def test_unusable_links_file_stops_the_run(tmp_path, capsys):
    bad = tmp_path / "bad.tsv"
    bad.write_text("# header\ncitation,cited\n")
    xml = small_corpus(tmp_path)
    for links, message in [(bad, f"{bad}, line 2: bad_link"), (tmp_path / "missing.tsv", "no such file")]:
        out = tmp_path / "cli"
        code = prepare_main(["--inputs", str(xml), "--output-dir", str(out), "--links-file", str(links)])
        err = capsys.readouterr().err
        assert code == 2 and message in err and str(links) in err
        assert not (out / "state.json").exists()


def test_text_and_jsonl_inputs(tmp_path):
    text = tmp_path / "d.txt"
    text.write_text("A plain text document with words.\n")
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in [
        {"pmid": "11", "text": "First jsonl document.", "cites": [12, "13", "x", 11, "012", True]},
        {"pmid": "12", "text": "Second jsonl document."},
        {"pmid": "14", "text": "Third jsonl document.", "cites": "13"}]) + "\n")
    summary, ds = run(tmp_path, [text, jsonl], id_field="pmid", links_field="cites")
    assert links_of(ds) == {"d.txt:1": [], "11": ["12", "13"], "12": [], "14": []}
    assert summary["read"]["links_skipped"] == 2  # "x" and true
    (problem,) = summary["problems"]
    assert (problem["reason"], problem["line"]) == ("wrong_type", 3) and "'cites'" in problem["message"]
    assert summary["links"]["by_type"] == {"Cites": {"documents": 1, "links": 2, "resolvable": 1}}


def test_real_medline_sample(tmp_path):
    path = shared_file("pubmed/medline16n0902_sample.xml.gz")
    cits, problems = citations(path)
    assert problems == []
    cites = sum(len(c.links.get("Cites", ())) for c in cits)
    assert 1000 <= cites < 10_000  # 3,547 RefType="Cites" links in the file, none repeated within a citation
    assert {"CommentIn", "CommentOn", "ErratumFor", "ErratumIn"} <= {t for c in cits for t in c.links}
    summary, ds = run(tmp_path, [path], min_words=128)  # the paper's filter: 446 documents kept
    links = summary["links"]
    assert links["documents_with_links"] == sum(bool(row) for row in ds["links"]) > 10
    assert links["links"] == sum(len(row) for row in ds["links"]) >= 1000
    assert 0 <= links["resolvable"] <= links["links"]
    assert links["by_type"]["Cites"]["links"] == links["links"]  # no ReferenceList in a 2016 MEDLINE file
