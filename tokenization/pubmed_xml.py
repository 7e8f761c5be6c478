"""Streaming reader for PubMed/MEDLINE XML (baseline and update files, both layouts).

Layouts understood:

* ``<PubmedArticleSet>`` (PubMed baseline/updates since 2017, efetch): ``<PubmedArticle>``,
  ``<PubmedBookArticle>`` and ``<DeleteCitation>`` records;
* ``<MedlineCitationSet>`` (MEDLINE files up to 2016): ``<MedlineCitation>`` and ``<DeleteCitation>``.

How it streams. A byte-level scanner cuts the (decompressed) stream into top-level records and
ElementTree parses one record at a time, so memory holds one read block plus one record whatever
the file size: the memory profile of ``iterparse`` with cleared elements. Cutting first is what
makes damage local: a malformed record, a record with invalid UTF-8, or a record cut off by a
truncated gzip stream becomes one :class:`~tokenization.streams.Problem` naming the file, line and
byte offset, and every good record before *and after* it is still yielded. (One ``iterparse`` over
the whole file stops for good at the first error.)

Outgoing links. Each :class:`Citation` carries ``links``, a mapping *link type -> PMIDs* (a
tuple of decimal strings, in document order), kept apart by type:

* ``"Cites"``, ``"CommentOn"``, ``"CommentIn"``, ``"ErratumFor"``, ``"ErratumIn"``,
  ``"RetractionOf"``, ... : ``MedlineCitation/CommentsCorrectionsList/CommentsCorrections``, under
  its ``RefType`` verbatim (``"Unspecified"`` without one); an entry without a ``<PMID>`` (only a
  ``RefSource``) is no link;
* ``"ReferenceList"`` (:data:`REFERENCE_LIST`): the PMIDs of the article's reference list,
  ``PubmedData/ReferenceList/Reference/ArticleIdList/ArticleId[@IdType="pubmed"]`` (nested
  reference lists and a book's ``ReferenceList`` included). It is *not* merged into ``"Cites"``:
  the two lists overlap heavily in today's PubMed, and keeping them apart lets a user count, or
  trust, one source alone.

The citation links, the ones LinkBERT's document relation prediction uses, are
:data:`CITATION_LINK_TYPES` (``"Cites"`` and ``"ReferenceList"``); :meth:`Citation.cited` merges
them (deduplicated, ``"Cites"`` first). The other types are kept for whoever wants them. Within a
type a PMID is listed once (first occurrence); a link to the citation itself is dropped; a PMID that
is not a positive decimal number of at most 18 digits (``"PMC12345"``, ``"n/a"``, empty) is dropped
without a problem and counted in ``Citation.skipped_links``. PMIDs are written without leading
zeros. ``PubmedData`` is not parsed as XML: the pubmed ids of its reference lists are picked out of
the record's bytes between the first ``<ReferenceList`` and the last ``</ReferenceList>`` (ten times
faster than parsing them, and markup there that ElementTree would refuse costs nothing).
"""

from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from itertools import chain
from typing import Iterable, Iterator

from biomed_lm.tokenization.streams import Problem, StreamDamage, iter_blocks

READ_BLOCK = 1 << 22           # 4 MiB of decompressed XML per read
MAX_RECORD_BYTES = 1 << 26     # a record larger than 64 MiB is certainly damage, not a citation

_RECORD_START = re.compile(rb"<(PubmedArticle|PubmedBookArticle|MedlineCitation|DeleteCitation)(?=[\s/>])")
_YEAR = re.compile(r"\b(1[89]\d\d|20\d\d)\b")
_LINK_PMID = re.compile(r"0*([1-9][0-9]{0,17})")
_PRETTY_PRINT_INDENT = re.compile(r"\n[ \t]+\Z")  # a line break and its indentation, ending a text run
# An <ArticleId IdType="pubmed"> inside a ReferenceList (only a Reference's ArticleIdList holds one there).
_PUBMED_ARTICLE_ID = re.compile(rb"<ArticleId\b[^>]*?\bIdType\s*=\s*[\"']pubmed[\"'][^>]*>([^<]*)</ArticleId>")

#: The link type of the reference list's PMIDs (the CommentsCorrections types keep their RefType).
REFERENCE_LIST = "ReferenceList"
#: The link types that are citations: what LinkBERT's document relation prediction links by default.
CITATION_LINK_TYPES = ("Cites", REFERENCE_LIST)


@dataclass(frozen=True)
class Citation:
    """One citation: what pretraining needs from it, and where it came from."""

    pmid: str
    version: int
    title: str
    abstract: str
    abstract_sections: tuple[tuple[str, str], ...]  # (label, text) per AbstractText; label may be ""
    language: str  # the article's language codes, space-separated in PubMed's order ("fre eng")
    year: int | None
    line: int
    #: link type -> PMIDs it links to (see the module docstring); left out of the hash, not of ==
    links: dict[str, tuple[str, ...]] = field(default_factory=dict, hash=False)
    #: links dropped because their PMID is not a number (not compared)
    skipped_links: int = field(default=0, compare=False)

    def cited(self, types: tuple[str, ...] = CITATION_LINK_TYPES) -> tuple[str, ...]:
        """The PMIDs linked by any of ``types`` (by default the citations), in the order of
        ``types`` then of the document, each once."""
        return tuple(dict.fromkeys(pmid for link_type in types for pmid in self.links.get(link_type, ())))

    def document_text(self, include_title: bool = True, section_labels: bool = False) -> str:
        body = self.abstract_text(section_labels)
        if include_title and self.title:
            return f"{self.title} {body}".strip()
        return body

    def abstract_text(self, section_labels: bool = False, separator: str = " ") -> str:
        """The abstract, its sections joined by ``separator`` (the corpus joins them by a line break, which
        its sentence splitting keeps as a boundary), each with its label before it when ``section_labels``."""
        if not section_labels and separator == " ":
            return self.abstract
        return separator.join(f"{label}: {text}" if label and section_labels else text
                              for label, text in self.abstract_sections)


@dataclass(frozen=True)
class Deletion:
    """A ``<DeleteCitation>`` block: these PMIDs are withdrawn from PubMed.

    ``versions[i]`` is the ``Version`` attribute of ``pmids[i]`` (``None`` without one: every
    version). It is left out of comparisons, so a Deletion compares by what it deletes and where."""

    pmids: tuple[str, ...]
    line: int
    versions: tuple[int | None, ...] = field(default=(), compare=False)

    def version_of(self, index: int) -> int | None:
        return self.versions[index] if index < len(self.versions) else None


def _text(element: ET.Element | None) -> str:
    """All text inside an element (inline markup such as <i>, <sup> included), whitespace folded."""
    if element is None:
        return ""
    return " ".join(_mixed_content(element).split())


def _mixed_content(element: ET.Element) -> str:
    parts = [element.text or ""]
    for child in element:
        # efetch pretty-prints mixed content: a line break and indentation go before each inline
        # element ("beta\n\t\t<sub>2</sub>-agonist"). That run is layout, not a word break; a space
        # written before it stays.
        parts[-1] = _PRETTY_PRINT_INDENT.sub("", parts[-1])
        parts.append(_mixed_content(child))
        parts.append(child.tail or "")
    return "".join(parts)


def _year(*candidates: ET.Element | None) -> int | None:
    for element in candidates:
        if element is None:
            continue
        # <Year> first; <MedlineDate> such as "1998 Dec-1999 Jan" otherwise.
        for child_tag in ("Year", "MedlineDate"):
            match = _YEAR.search(_text(element.find(child_tag)))
            if match:
                return int(match.group(1))
    return None


def _sections(abstract: ET.Element | None) -> tuple[tuple[str, str], ...]:
    if abstract is None:
        return ()
    sections = []
    for node in abstract.findall("AbstractText"):
        text = _text(node)
        if text:
            sections.append((node.get("Label", "") or "", text))
    return tuple(sections)


def canonical_pmid(value: str | None) -> str | None:
    """``value`` as a link target: a PMID in decimal without leading zeros, or ``None`` when it is
    not a positive number of at most 18 digits (so that it fits an int64 key)."""
    if value and value.isdigit() and value.isascii() and value[0] != "0" and len(value) <= 18:
        return value  # the common case, without the regular expression
    match = _LINK_PMID.fullmatch((value or "").strip())
    return match.group(1) if match else None


def collect_links(own_pmid: str, pairs: Iterable[tuple[str, str | None]]
                  ) -> tuple[dict[str, tuple[str, ...]], int]:
    """``(link type, PMID text)`` pairs -> the links by type (each PMID once per type, in order,
    without a link to ``own_pmid``) and how many were dropped because their PMID is not a number."""
    own = canonical_pmid(own_pmid)
    links: dict[str, dict[str, None]] = {}
    skipped = 0
    for link_type, value in pairs:
        pmid = canonical_pmid(value)
        if pmid is None:
            skipped += 1
        elif pmid != own:
            links.setdefault(link_type, {})[pmid] = None
    return {link_type: tuple(pmids) for link_type, pmids in links.items()}, skipped


def _comments_corrections(citation: ET.Element) -> Iterator[tuple[str, str | None]]:
    """``(RefType, PMID text)`` of each CommentsCorrections entry that names a PMID."""
    for entry in citation.iterfind("CommentsCorrectionsList/CommentsCorrections"):
        pmid = entry.find("PMID")
        if pmid is not None:
            yield (entry.get("RefType") or "").strip() or "Unspecified", pmid.text


def _references(root: ET.Element) -> Iterator[tuple[str, str | None]]:
    """``(REFERENCE_LIST, id text)`` of each pubmed id of each ``<Reference>`` under ``root``."""
    for reference in root.iter("Reference"):
        for article_id in reference.iterfind("ArticleIdList/ArticleId"):
            if (article_id.get("IdType") or "").strip().lower() == "pubmed":
                yield REFERENCE_LIST, article_id.text


def parse_medline_citation(citation: ET.Element, line: int,
                           references: Iterable[tuple[str, str | None]] = ()) -> Citation:
    """A ``<MedlineCitation>``; ``references``: the ``(REFERENCE_LIST, id)`` pairs of its ``PubmedData``."""
    pmid_el = citation.find("PMID")
    if pmid_el is None or not _text(pmid_el):
        raise ValueError("MedlineCitation without a PMID")
    article = citation.find("Article")
    sections = _sections(article.find("Abstract") if article is not None else None)
    language = _languages(article) if article is not None else ""
    year = _year(article.find("Journal/JournalIssue/PubDate") if article is not None else None,
                 article.find("ArticleDate") if article is not None else None,
                 citation.find("DateCompleted"), citation.find("DateCreated"))
    links, skipped = collect_links(_text(pmid_el), chain(_comments_corrections(citation), references))
    return Citation(
        pmid=_text(pmid_el),
        version=_version(pmid_el),
        title=_text(article.find("ArticleTitle")) if article is not None else "",
        abstract=" ".join(text for _, text in sections),
        abstract_sections=sections,
        language=language,
        year=year,
        line=line,
        links=links,
        skipped_links=skipped,
    )


def _languages(element: ET.Element) -> str:
    """Every ``<Language>`` of an article, space-separated: an article can be in several ("fre", "eng"),
    and a language filter keeps it for any of them (QA: only the first was read)."""
    return " ".join(text for text in (_text(el) for el in element.findall("Language")) if text)


def parse_book_document(document: ET.Element, line: int) -> Citation:
    pmid_el = document.find("PMID")
    if pmid_el is None or not _text(pmid_el):
        raise ValueError("BookDocument without a PMID")
    sections = _sections(document.find("Abstract"))
    title = _text(document.find("ArticleTitle")) or _text(document.find("Book/BookTitle"))
    links, skipped = collect_links(_text(pmid_el), chain(_comments_corrections(document), _references(document)))
    return Citation(
        pmid=_text(pmid_el),
        version=_version(pmid_el),
        title=title,
        abstract=" ".join(text for _, text in sections),
        abstract_sections=sections,
        language=_languages(document),
        year=_year(document.find("Book/PubDate"), document.find("DateRevised")),
        line=line,
        links=links,
        skipped_links=skipped,
    )


def _parse_pubmed_article(chunk: bytes, line: int) -> Citation:
    """A ``<PubmedArticle>``: ElementTree parses only its MedlineCitation (skipping PubmedData,
    history and reference lists, roughly halves the parsing work); the reference lists' pubmed ids
    are picked out of the bytes (ten times faster than parsing them)."""
    start = chunk.find(b"<MedlineCitation")
    end = chunk.find(b"</MedlineCitation>")
    if start < 0 or end < 0:
        raise ValueError("PubmedArticle without a complete MedlineCitation")
    end += len(b"</MedlineCitation>")
    first = chunk.find(b"<ReferenceList", end)
    last = chunk.rfind(b"</ReferenceList>")
    references = []
    if first >= 0 and last > first:
        references = [(REFERENCE_LIST, value.decode()) for value in _PUBMED_ARTICLE_ID.findall(chunk, first, last)]
    return parse_medline_citation(ET.fromstring(chunk[start:end]), line + chunk.count(b"\n", 0, start), references)


def _parse_record(tag: bytes, chunk: bytes, line: int) -> Citation | Deletion:
    if tag == b"PubmedArticle":
        return _parse_pubmed_article(chunk, line)
    root = ET.fromstring(chunk)
    if tag == b"MedlineCitation":
        return parse_medline_citation(root, line)
    if tag == b"PubmedBookArticle":
        document = root.find("BookDocument")
        if document is None:
            raise ValueError("PubmedBookArticle without a BookDocument")
        return parse_book_document(document, line)
    listed = [p for p in root.findall("PMID") if _text(p)]
    return Deletion(pmids=tuple(_text(p) for p in listed), line=line,
                    versions=tuple(_version(p, default=None) for p in listed))


def _version(pmid: ET.Element, default: int | None = 1) -> int | None:
    """The ``Version`` attribute of a ``<PMID>``: PubMed numbers the versions of a citation 1, 2, ...
    (``PMID.version`` is unique; unversioned citations are version 1)."""
    value = (pmid.get("Version") or "").strip()
    if not value:
        return default
    if not value.isdigit() or not 1 <= int(value) < 2**31:
        raise ValueError(f"<PMID Version={value!r}>: a version is a positive integer")
    return int(value)


class _ScanWindow:
    """The part of the decompressed stream being scanned: its bytes, where they start in the stream
    (byte offset, newlines before), the end of the stream and why it ended, and line numbers."""

    def __init__(self, blocks: Iterator[bytes]):
        self.blocks = blocks
        self.buf = b""
        self.offset = 0           # byte offset (in the decompressed stream) of buf[0]
        self.lines_before = 0     # newlines in the stream before buf[0]
        self.eof = False
        self.stream_error: str | None = None
        self._counted_to = 0      # newlines in buf[:_counted_to] are counted in _newlines_seen
        self._newlines_seen = 0

    def line_of(self, index: int) -> int:
        """The line of ``buf[index]``. Records are visited in increasing order, so newlines are
        counted incrementally (linear time)."""
        if index < self._counted_to:
            self._counted_to, self._newlines_seen = 0, self.lines_before
        self._newlines_seen += self.buf.count(b"\n", self._counted_to, index)
        self._counted_to = index
        return self._newlines_seen + 1

    def refill(self, keep_from: int) -> None:
        """Drop ``buf[:keep_from]`` and append the next block, or mark the end of the stream."""
        self.lines_before = self.line_of(keep_from) - 1
        self._counted_to, self._newlines_seen = 0, self.lines_before
        self.offset += keep_from
        self.buf = self.buf[keep_from:]
        try:
            self.buf += next(self.blocks)
        except StopIteration:
            self.eof = True
        except StreamDamage as err:
            self.eof = True
            self.stream_error = str(err)


def iter_pubmed_records(path: str | os.PathLike) -> Iterator[Citation | Deletion | Problem]:
    """Yield every citation and deletion in file order; damage is yielded as :class:`Problem`."""
    spath = str(path)
    if not os.path.isfile(path):
        yield Problem(spath, "missing", "no such file")
        return
    w = _ScanWindow(iter_blocks(path, READ_BLOCK))
    pos = 0             # scanning position in w.buf
    found_any = False
    while True:
        match = _RECORD_START.search(w.buf, pos)
        if match:
            tag = match.group(1)
            end_tag = b"</" + tag + b">"
            end = w.buf.find(end_tag, match.end())
            start, where = match.start(), {"line": w.line_of(match.start()), "byte_offset": w.offset + match.start()}
            next_start = _next_record_start(w.buf, match, end if end >= 0 else len(w.buf))
            if next_start:
                yield Problem(spath, "malformed_xml", f"<{tag.decode()}> record is not closed before the next "
                              "record starts; skipped it", **where)
                pos = next_start.start()
                continue
            if end >= 0:
                found_any, pos = True, end + len(end_tag)
                yield _checked_parse(spath, tag, w.buf[start:pos], where["line"], where["byte_offset"])
                continue
            if len(w.buf) - start > MAX_RECORD_BYTES:
                yield Problem(spath, "malformed_xml", f"<{tag.decode()}> record runs past {MAX_RECORD_BYTES} "
                              "bytes without closing; skipped it", **where)
                pos = match.end()
                continue
        if w.eof:
            yield from _end_of_stream_problems(spath, w, match, found_any)
            return
        # Need more data. Drop what is consumed, but keep an open record, or a short tail in case a
        # start tag straddles the block boundary.
        w.refill(match.start() if match else max(pos, len(w.buf) - 64))
        pos = 0


def _next_record_start(buf: bytes, match: re.Match, limit: int) -> re.Match | None:
    """A record starting inside this one before ``limit`` (which means this one is damaged). A
    MedlineCitation inside a PubmedArticle is part of it, not a new record."""
    next_start = _RECORD_START.search(buf, match.end(), limit)
    while next_start and match.group(1) == b"PubmedArticle" and next_start.group(1) == b"MedlineCitation":
        next_start = _RECORD_START.search(buf, next_start.end(), limit)
    return next_start


def _end_of_stream_problems(spath: str, w: _ScanWindow, match: re.Match | None, found_any: bool
                            ) -> Iterator[Problem]:
    """What the end of the stream says: a record cut off, a damaged gzip stream, or no record at all."""
    if match:
        yield Problem(spath, "truncated_record", f"<{match.group(1).decode()}> record is incomplete: "
                      f"{w.stream_error or 'the file ends inside it'}", line=w.line_of(match.start()),
                      byte_offset=w.offset + match.start())
    elif w.stream_error:
        yield Problem(spath, "truncated_or_corrupt_gzip", w.stream_error, line=w.line_of(len(w.buf)),
                      byte_offset=w.offset + len(w.buf))
    if not found_any and w.stream_error is None:
        if w.offset + len(w.buf) == 0:
            yield Problem(spath, "empty", "the file is empty (0 bytes" + (" after decompression)" if
                          spath.endswith(".gz") else ")") + "; no PubMed record")
        else:
            yield Problem(spath, "no_records", "no <PubmedArticle>, <MedlineCitation> or <DeleteCitation> "
                          "record found; is this a PubMed/MEDLINE XML file?")


_FIRST_PMID = re.compile(rb"<PMID[^>]*>\s*(\d+)\s*</PMID>")


def _checked_parse(path: str, tag: bytes, chunk: bytes, line: int, offset: int) -> Citation | Deletion | Problem:
    try:
        chunk.decode("utf-8")
    except UnicodeDecodeError as err:
        bad_line = line + chunk.count(b"\n", 0, err.start)
        return Problem(path, "invalid_utf8", f"{err.reason} in <{tag.decode()}> record starting at line {line}",
                       line=bad_line, byte_offset=offset + err.start)
    try:
        return _parse_record(tag, chunk, line)
    except ET.ParseError as err:
        err_line, err_col = err.position
        pmid = _FIRST_PMID.search(chunk)  # which citation is lost, for a look at it on PubMed
        return Problem(path, "malformed_xml", f"{err} in <{tag.decode()}> record starting at line {line}"
                       + (f" (PMID {pmid.group(1).decode()})" if pmid else ""),
                       line=line + err_line - 1, byte_offset=offset)
    except ValueError as err:
        return Problem(path, "malformed_record", str(err), line=line, byte_offset=offset)
