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
"""

from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Iterator

from biomed_lm.tokenization.streams import Problem, StreamDamage, iter_blocks

READ_BLOCK = 1 << 22           # 4 MiB of decompressed XML per read
MAX_RECORD_BYTES = 1 << 26     # a record larger than 64 MiB is certainly damage, not a citation

RECORD_TAGS = (b"PubmedArticle", b"PubmedBookArticle", b"MedlineCitation", b"DeleteCitation")
_RECORD_START = re.compile(rb"<(PubmedArticle|PubmedBookArticle|MedlineCitation|DeleteCitation)(?=[\s/>])")
_YEAR = re.compile(r"\b(1[89]\d\d|20\d\d)\b")


@dataclass(frozen=True)
class Citation:
    """One citation: what pretraining needs from it, and where it came from."""

    pmid: str
    version: int
    title: str
    abstract: str
    abstract_sections: tuple[tuple[str, str], ...]  # (label, text) per AbstractText; label may be ""
    language: str
    year: int | None
    line: int

    def document_text(self, include_title: bool = True, section_labels: bool = False) -> str:
        body = self.abstract_text(section_labels)
        if include_title and self.title:
            return f"{self.title} {body}".strip()
        return body

    def abstract_text(self, section_labels: bool = False) -> str:
        if not section_labels:
            return self.abstract
        return " ".join(f"{label}: {text}" if label else text for label, text in self.abstract_sections)


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
    return " ".join("".join(element.itertext()).split())


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


def parse_medline_citation(citation: ET.Element, line: int) -> Citation:
    pmid_el = citation.find("PMID")
    if pmid_el is None or not _text(pmid_el):
        raise ValueError("MedlineCitation without a PMID")
    article = citation.find("Article")
    sections = _sections(article.find("Abstract") if article is not None else None)
    language = _text(article.find("Language")) if article is not None else ""
    year = _year(article.find("Journal/JournalIssue/PubDate") if article is not None else None,
                 article.find("ArticleDate") if article is not None else None,
                 citation.find("DateCompleted"), citation.find("DateCreated"))
    return Citation(
        pmid=_text(pmid_el),
        version=_version(pmid_el),
        title=_text(article.find("ArticleTitle")) if article is not None else "",
        abstract=" ".join(text for _, text in sections),
        abstract_sections=sections,
        language=language,
        year=year,
        line=line,
    )


def parse_book_document(document: ET.Element, line: int) -> Citation:
    pmid_el = document.find("PMID")
    if pmid_el is None or not _text(pmid_el):
        raise ValueError("BookDocument without a PMID")
    sections = _sections(document.find("Abstract"))
    title = _text(document.find("ArticleTitle")) or _text(document.find("Book/BookTitle"))
    return Citation(
        pmid=_text(pmid_el),
        version=_version(pmid_el),
        title=title,
        abstract=" ".join(text for _, text in sections),
        abstract_sections=sections,
        language=_text(document.find("Language")),
        year=_year(document.find("Book/PubDate"), document.find("DateRevised")),
        line=line,
    )


def _parse_record(tag: bytes, chunk: bytes, line: int) -> Citation | Deletion:
    if tag == b"PubmedArticle":
        # Only the MedlineCitation part is needed; skipping PubmedData (reference lists, history)
        # roughly halves the parsing work.
        start = chunk.find(b"<MedlineCitation")
        end = chunk.find(b"</MedlineCitation>")
        if start < 0 or end < 0:
            raise ValueError("PubmedArticle without a complete MedlineCitation")
        line += chunk.count(b"\n", 0, start)
        return parse_medline_citation(ET.fromstring(chunk[start:end + len(b"</MedlineCitation>")]), line)
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


def iter_pubmed_records(path: str | os.PathLike) -> Iterator[Citation | Deletion | Problem]:
    """Yield every citation and deletion in file order; damage is yielded as :class:`Problem`."""
    spath = str(path)
    if not os.path.isfile(path):
        yield Problem(spath, "missing", "no such file")
        return
    blocks = iter_blocks(path, READ_BLOCK)
    buf = b""
    buf_offset = 0      # byte offset (in the decompressed stream) of buf[0]
    lines_before = 0    # newlines in the stream before buf[0]
    pos = 0             # scanning position in buf
    eof = False
    found_any = False
    stream_error: str | None = None

    counted_to = 0      # newlines in buf[:counted_to] are counted in newlines_seen
    newlines_seen = 0

    def line_of(index: int) -> int:
        # Records are visited in increasing order, so count newlines incrementally (linear time).
        nonlocal counted_to, newlines_seen
        if index < counted_to:
            counted_to, newlines_seen = 0, lines_before
        newlines_seen += buf.count(b"\n", counted_to, index)
        counted_to = index
        return newlines_seen + 1

    while True:
        match = _RECORD_START.search(buf, pos)
        if match:
            tag = match.group(1)
            end_tag = b"</" + tag + b">"
            end = buf.find(end_tag, match.end())
            limit = end if end >= 0 else len(buf)
            # A new record starting before this one ends means this one is damaged. (A
            # MedlineCitation inside a PubmedArticle is part of it, not a new record.)
            next_start = _RECORD_START.search(buf, match.end(), limit)
            while next_start and tag == b"PubmedArticle" and next_start.group(1) == b"MedlineCitation":
                next_start = _RECORD_START.search(buf, next_start.end(), limit)
            if next_start:
                yield Problem(spath, "malformed_xml", f"<{tag.decode()}> record is not closed before the next "
                              "record starts; skipped it", line=line_of(match.start()),
                              byte_offset=buf_offset + match.start())
                pos = next_start.start()
                continue
            if end >= 0:
                record_end = end + len(end_tag)
                found_any = True
                yield _checked_parse(spath, tag, buf[match.start():record_end], line_of(match.start()),
                                     buf_offset + match.start())
                pos = record_end
                continue
            if len(buf) - match.start() > MAX_RECORD_BYTES:
                yield Problem(spath, "malformed_xml", f"<{tag.decode()}> record runs past {MAX_RECORD_BYTES} "
                              "bytes without closing; skipped it", line=line_of(match.start()),
                              byte_offset=buf_offset + match.start())
                pos = match.end()
                continue
        if eof:
            if match:
                detail = stream_error or "the file ends inside it"
                yield Problem(spath, "truncated_record", f"<{match.group(1).decode()}> record is incomplete: "
                              f"{detail}", line=line_of(match.start()), byte_offset=buf_offset + match.start())
            elif stream_error:
                yield Problem(spath, "truncated_or_corrupt_gzip", stream_error, line=line_of(len(buf)),
                              byte_offset=buf_offset + len(buf))
            break
        # Need more data. Drop what is consumed, but keep an open record, or a short tail in case a
        # start tag straddles the block boundary.
        keep_from = match.start() if match else max(pos, len(buf) - 64)
        lines_before = line_of(keep_from) - 1
        counted_to, newlines_seen = 0, lines_before
        buf_offset += keep_from
        buf = buf[keep_from:]
        pos = 0
        try:
            buf += next(blocks)
        except StopIteration:
            eof = True
        except StreamDamage as err:
            eof = True
            stream_error = str(err)

    if not found_any and stream_error is None:
        if buf_offset + len(buf) == 0:
            yield Problem(spath, "empty", "the file is empty (0 bytes" + (" after decompression)" if
                          spath.endswith(".gz") else ")") + "; no PubMed record")
        else:
            yield Problem(spath, "no_records", "no <PubmedArticle>, <MedlineCitation> or <DeleteCitation> "
                          "record found; is this a PubMed/MEDLINE XML file?")


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
        return Problem(path, "malformed_xml", f"{err} in <{tag.decode()}> record starting at line {line}",
                       line=line + err_line - 1, byte_offset=offset)
    except ValueError as err:
        return Problem(path, "malformed_record", str(err), line=line, byte_offset=offset)
