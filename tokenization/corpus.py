"""Corpus ingestion: PubMed XML, plain text and JSONL in; a clean, deduplicated, sentence-split
``datasets`` dataset out (one row per document: id, source, text, sentences, title, year, language).

The work runs in three stages, each resumable:

1. **Parse** every input file, in parallel, into its own Arrow shard under ``<output>/_work/parsed``
   (named by a fingerprint of the file and the parse options, so a re-run, or a later run that adds
   PubMed update files, parses only what is new). Damage becomes problems in the file's summary.
2. **Resolve** which record of each document survives, in input order, vectorized over the keys
   only: of the records of a PMID the highest ``Version`` wins, among equal versions the later
   one; ``<DeleteCitation>`` removes the PMIDs it names (only the version it names, when it names
   one) from the records before it; identical plain-text documents are kept once (first
   occurrence). Then the filters: empty abstract, language, fewer than ``min_words``
   whitespace-separated abstract words. Nothing kept at all raises :class:`NoUsableInput`.
3. **Build** the documents of the survivors with ``datasets.map(num_proc=...)`` (sentence
   splitting, cached) and save them to disk in shards.

``summary.json`` counts every record read and every record dropped, by reason, and lists each
problem with file, line and byte offset, and (``duplicate_files``) each input whose bytes equal an
earlier input's: its records are read again, the later copy wins, none is lost. ``output_files`` names each
file of the saved corpus with its size: a rerun finding one missing or resized refuses to call the corpus complete.

**Citation links** (for LinkBERT's document relation prediction). The dataset's ``links`` column,
``list<string>`` (``datasets`` feature ``List(Value("string"))``), holds for each document the PMIDs
it links to, as decimal strings in the form of the ``id`` column, each once, in document order
(PubMed's own links first, then those of ``links_file``), never the document's own id. Which
links: those whose type is in ``link_types`` (default ``["Cites", "ReferenceList"]``, the
citations: ``CommentsCorrections RefType="Cites"`` and the reference list's PMIDs; see
:mod:`tokenization.pubmed_xml` for every type), from the XML, from ``links_field`` of a JSONL
record (a list of PMIDs, type ``Cites``) and from ``links_file`` (lines
``citing_pmid<TAB>cited_pmid[<TAB>link type]``, type ``Cites`` without a third field; ``#``
comments and blank lines allowed; a bad line is a ``bad_link`` problem naming file and line, the
good lines are kept; a file with no usable line stops the run). A plain-text document has an empty
list. A listed PMID may be absent from the corpus: a consumer keeps the links whose PMID is the
``id`` of a document it has. ``summary.json``'s ``links`` section counts, over the kept documents:
documents with a link, links and resolvable links (whose PMID is the ``id`` of a kept document),
for the column and per link type (``by_type``, every type read, in the column or not), and the
links file's lines (``citing_not_in_corpus``: links whose citing PMID is no kept document).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Literal, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from biomed_lm.atomic_files import write_json_atomically
from biomed_lm.errors import TokenizationError
from biomed_lm.finished_output import (changed_files, damaged_file_lines, damaged_output_message, dataclass_defaults,
                                       file_identity, other_output_message, read_record, saved_files_record,
                                       setting_change_lines, shard_size_problem)
from biomed_lm.run_lock import ARTIFACT_LOCK_FILE, acquire_run_lock
from biomed_lm.tokenization.pubmed_xml import CITATION_LINK_TYPES, Deletion, canonical_pmid, iter_pubmed_records
from biomed_lm.tokenization.sentences import split_sentences, splitter_identity
from biomed_lm.tokenization.sources import (JSONL, TEXT, XML, Problem, corpus_files, input_format, iter_jsonl,
                                            iter_lines, json_type, sniff_binary)
from biomed_lm.worker_lifetime import workers_die_with_this_process

PARSED_SCHEMA = pa.schema([
    ("key", pa.int64()),          # PMID, or a negative 63-bit text hash for documents without one
    ("is_delete", pa.bool_()),
    ("id", pa.string()),
    ("source", pa.string()),
    ("line", pa.int64()),
    ("title", pa.string()),
    ("abstract", pa.string()),
    ("n_words", pa.int32()),      # whitespace-separated words of the abstract (the length filter)
    ("year", pa.int32()),
    ("language", pa.string()),
    ("version", pa.int32()),      # PubMed's PMID Version (1 when absent); for a delete, null = every version
    ("link_pmids", pa.list_(pa.int64())),   # every outgoing link of every type, in document order ...
    ("link_types", pa.list_(pa.string())),  # ... and the type of each ("Cites", "ReferenceList", ...)
])
PARSER_VERSION = 5  # bump when parsing changes, so cached shards are rebuilt (5: efetch indentation before markup)
LINKS_CHUNK = 100_000         # documents whose links are assembled at a time (memory stays flat)
FLUSH_ROWS = 20_000           # rows per Arrow record batch, at most ...
FLUSH_CHARS = 4_000_000       # ... and at most this much text, so memory stays flat per worker
SUMMARY_FILE = "summary.json"


@dataclass
class CorpusConfig:
    """Options of ``launch/prepare_corpus.py`` (YAML keys and ``--flags`` alike)."""

    inputs: list[str] = field(default_factory=list, metadata={
        "help": "PubMed XML (.xml/.xml.gz), text (one document per line) or JSONL files, directories "
                "or glob patterns, in release order (a later file's version of a PMID wins)"})
    output_dir: str = field(default="", metadata={"help": "where the dataset and summary.json are written"})
    min_words: int = field(default=128, metadata={
        "help": "drop documents whose abstract has fewer whitespace-separated words (the paper: 128)", "min": 0})
    include_title: bool = field(default=True, metadata={"help": "start each PubMed document with its title"})
    section_labels: bool = field(default=False, metadata={
        "help": "keep structured-abstract labels (\"METHODS: ...\") in the text"})
    languages: list[str] = field(default_factory=list, metadata={
        "help": "keep only citations in these PubMed language codes (e.g. eng); empty keeps all; "
                "documents without a language (text, JSONL) are not filtered"})
    text_field: str = field(default="text", metadata={"help": "JSONL field holding the document text"})
    id_field: str = field(default="", metadata={
        "help": "JSONL field holding a document id; numeric ids are PMIDs (latest version wins)"})
    link_types: list[str] = field(default_factory=lambda: list(CITATION_LINK_TYPES), metadata={
        "help": "link types whose PMIDs go into the links column: PubMed CommentsCorrections RefTypes "
                "(Cites, CommentOn, CommentIn, ErratumFor, RetractionOf, ...) and ReferenceList (the "
                "reference list); every type is counted in summary.json either way"})
    links_file: str = field(default="", metadata={
        "help": "more links, one per line: citing_pmid<TAB>cited_pmid[<TAB>link type, default Cites] "
                "(# comments allowed, optionally .gz); merged into the documents' links"})
    links_field: str = field(default="", metadata={
        "help": "JSONL field holding the PMIDs a document cites (a list; links of type Cites)"})
    num_proc: int = field(default=0, metadata={"help": "worker processes (0: all CPU cores)", "min": 0})
    max_shard_size: str = field(default="500MB", metadata={
        "help": "size of each saved Arrow shard: a whole number and a unit (KB, MB, GB or KiB, MiB, GiB, ...)"})
    format: Literal["auto", "xml", "text", "jsonl"] = field(default="auto", metadata={
        "help": "how to read input files whose suffix is not a known one (.xml, .txt, .text, .jsonl, .json, "
                ".ndjson, each optionally .gz): auto refuses them (reported, exit 1); xml, text or jsonl "
                "reads them so. Files with a known suffix are always read by their suffix"})
    overwrite: bool = field(default=False, metadata={
        "help": "replace an existing dataset in output_dir (parsed files are still reused)"})

    def __post_init__(self) -> None:
        _check_shard_size(self.max_shard_size)  # here, not when saving: that comes after every input is parsed

    def workers(self) -> int:
        return self.num_proc if self.num_proc > 0 else (os.cpu_count() or 1)

    def format_of(self, path: str | os.PathLike) -> str | None:
        """How ``path`` is read: by its suffix, else as ``format`` says; ``None``: refused."""
        return input_format(path, self.format)


class NoUsableInput(TokenizationError, ValueError):
    """Nothing could be kept from the inputs: no dataset was written. ``summary`` says why
    (it is also in ``<output_dir>/summary.json``)."""

    def __init__(self, message: str, summary: dict):
        super().__init__(message)
        self.summary = summary


# ----------------------------------------------------------------------------- stage 1: parse

def text_key(text: str) -> int:
    """A negative 63-bit hash of a document's text (PMIDs are positive, so the two never collide)."""
    digest = int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")
    return -(digest & 0x7FFF_FFFF_FFFF_FFFF) - 1


def _fingerprint(path: Path, config: CorpusConfig) -> str:
    stat = path.stat()
    parts = [str(path.resolve()), str(stat.st_size), str(stat.st_mtime_ns), str(PARSER_VERSION),
             str(config.format_of(path)), str(config.section_labels), config.text_field, config.id_field,
             config.links_field]
    return hashlib.sha1("\0".join(parts).encode()).hexdigest()[:20]


def _rows_from_file(path: Path, config: CorpusConfig, counts: dict, problems: list) -> Iterator[dict]:
    """Parsed rows of one file; problems and counts are collected on the side."""
    fmt = config.format_of(path) or TEXT
    binary = sniff_binary(path)
    if binary is not None:
        expected = {XML: "PubMed XML", JSONL: "JSON Lines", TEXT: "UTF-8 text"}[fmt]
        problems.append(Problem(str(path), "binary", f"{binary}; expected {expected}, so the file was "
                                "not read").to_dict())
        return
    if fmt == XML:
        yield from _xml_rows(path, config, counts, problems)
    else:
        yield from _line_rows(path, fmt, config, counts, problems)


def _xml_rows(path: Path, config: CorpusConfig, counts: dict, problems: list) -> Iterator[dict]:
    """Citations and deletions of a PubMed XML file, keyed by PMID."""
    source = path.name
    for item in iter_pubmed_records(path):
        if isinstance(item, Problem):
            problems.append(item.to_dict())
        elif isinstance(item, Deletion):
            counts["deletions"] += len(item.pmids)
            for i, pmid in enumerate(item.pmids):
                key = int(pmid) if pmid.isdigit() else text_key("pmid:" + pmid)
                yield {"key": key, "is_delete": True, "id": pmid, "source": source, "line": item.line,
                       "version": item.version_of(i)}
        else:
            counts["citations"] += 1
            counts["links_skipped"] += item.skipped_links
            key = int(item.pmid) if item.pmid.isdigit() else text_key("pmid:" + item.pmid)
            yield {"key": key, "is_delete": False, "id": item.pmid, "source": source, "line": item.line,
                   "title": item.title, "abstract": item.abstract_text(config.section_labels, separator="\n"),
                   "n_words": len(item.abstract.split()), "year": item.year, "language": item.language,
                   "version": item.version,
                   "link_pmids": [int(pmid) for pmids in item.links.values() for pmid in pmids],
                   "link_types": [link_type for link_type, pmids in item.links.items() for _ in pmids]}


def _line_rows(path: Path, fmt: str, config: CorpusConfig, counts: dict, problems: list) -> Iterator[dict]:
    """Documents of a text file (one a line) or JSON Lines file, keyed by their id field when it is a
    PMID, else by their text."""
    source = path.name
    if fmt == JSONL:
        items = ((it if isinstance(it, Problem) else (it[0], it[1][config.text_field], it[1]))
                 for it in iter_jsonl(path, config.text_field))
    else:
        items = ((it if isinstance(it, Problem) else (it[0], it[1], None)) for it in iter_lines(path))
    documents = damaged = 0
    for item in items:
        if isinstance(item, Problem):
            problems.append(item.to_dict())
            damaged += 1
            continue
        line, text, record = item
        text = " ".join(text.split())
        if not text:
            counts["empty_lines"] += 1
            continue
        counts["documents"] += 1
        documents += 1
        doc_id = f"{source}:{line}"
        key, version = text_key(text), None
        if record is not None and config.id_field and record.get(config.id_field) is not None:
            doc_id = str(record[config.id_field])
            if doc_id.isdigit():
                key, version = int(doc_id), 1
        links = _jsonl_links(record, doc_id, config, (path, line), counts, problems) if record is not None else []
        yield {"key": key, "is_delete": False, "id": doc_id, "source": source, "line": line, "title": "",
               "abstract": text, "n_words": len(text.split()), "year": None, "language": "", "version": version,
               "link_pmids": links, "link_types": ["Cites"] * len(links)}
    if not documents and not damaged:  # as an XML file without a record is: a problem, not silence
        problems.append(_empty_file_problem(path, fmt, config, counts["empty_lines"]).to_dict())


def _jsonl_links(record: dict, doc_id: str, config: CorpusConfig, where: tuple[Path, int], counts: dict,
                 problems: list) -> list[int]:
    """The PMIDs in a JSONL record's ``links_field`` (a list of numbers or digit strings), each once,
    without the document's own id; entries that are not PMIDs are counted in ``links_skipped``."""
    value = record.get(config.links_field) if config.links_field else None
    if value is None:
        return []
    if not isinstance(value, list):
        problems.append(Problem(str(where[0]), "wrong_type", f"field {config.links_field!r} is {json_type(value)}, "
                                "expected a list of PMIDs; the document is kept without links",
                                line=where[1]).to_dict())
        return []
    own = canonical_pmid(doc_id)
    links: dict[int, None] = {}
    for entry in value:
        pmid = canonical_pmid(str(entry)) if isinstance(entry, (int, str)) and not isinstance(entry, bool) else None
        if pmid is None:
            counts["links_skipped"] += 1
        elif pmid != own:
            links[int(pmid)] = None
    return list(links)


def _empty_file_problem(path: Path, fmt: str, config: CorpusConfig, empty_lines: int) -> Problem:
    size = path.stat().st_size
    if size == 0 or empty_lines == 0:
        what = "the file is empty" + (" (0 bytes)" if size == 0 else
                                      " (no line with content)" if fmt == JSONL else " (0 bytes after decompression)")
    else:
        what = (f"no document in it: {empty_lines} " +
                (f"records with an empty {config.text_field!r}" if fmt == JSONL else "blank lines"))
    return Problem(str(path), "empty", what)


def parse_file(path: Path, shard_path: Path, config: CorpusConfig,
               on_rows: Callable[[int], None] | None = None) -> dict:
    """Parse one input file into an Arrow stream shard; returns (and stores beside it) its summary.
    ``on_rows`` is told the rows parsed so far at each record batch written (a bar's progress inside a file)."""
    counts = {"citations": 0, "deletions": 0, "documents": 0, "empty_lines": 0, "links_skipped": 0}
    problems: list[dict] = []
    tmp = shard_path.with_suffix(".arrow.tmp")
    columns: dict[str, list] = {name: [] for name in PARSED_SCHEMA.names}
    rows = 0
    pending_chars = 0
    started = time.perf_counter()
    with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_stream(sink, PARSED_SCHEMA) as writer:
        def flush() -> None:
            if columns["key"]:
                writer.write_batch(pa.record_batch([pa.array(columns[n], type=PARSED_SCHEMA.field(n).type)
                                                    for n in PARSED_SCHEMA.names], schema=PARSED_SCHEMA))
                for values in columns.values():
                    values.clear()
                if on_rows is not None:
                    on_rows(rows)

        for row in _rows_from_file(path, config, counts, problems):
            for name in PARSED_SCHEMA.names:
                columns[name].append(row.get(name))
            rows += 1
            pending_chars += len(row.get("abstract") or "") + len(row.get("title") or "")
            if len(columns["key"]) >= FLUSH_ROWS or pending_chars >= FLUSH_CHARS:
                flush()
                pending_chars = 0
        flush()
    os.replace(tmp, shard_path)
    summary = {"path": str(path), "format": config.format_of(path) or TEXT, "rows": rows,
               "bytes": path.stat().st_size, "seconds": round(time.perf_counter() - started, 3),
               **counts, "problems": problems}
    shard_path.with_suffix(".json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
    return summary


def _parse_job(args: tuple[str, str, CorpusConfig]) -> dict:
    path, shard, config = args
    return parse_file(Path(path), Path(shard), config)


def parse_inputs(files: list[Path], work_dir: Path, config: CorpusConfig,
                 log: Callable[[str], None] | None = None) -> list[tuple[Path, dict]]:
    """Stage 1: (shard path, summary) per input file, in input order; finished files are reused
    (and ``log`` told how many, so a resumed run says what it did not redo)."""
    from tqdm.auto import tqdm

    parsed_dir = work_dir / "parsed"
    parsed_dir.mkdir(parents=True, exist_ok=True)
    shards = [parsed_dir / f"{_fingerprint(p, config)}.arrow" for p in files]
    summaries: dict[Path, dict] = {}
    todo = []
    for path, shard in zip(files, shards):
        marker = shard.with_suffix(".json")
        if shard.is_file() and marker.is_file():
            summaries[shard] = json.loads(marker.read_text(encoding="utf-8"))
        else:
            todo.append((str(path), str(shard), config))
    if summaries and log is not None:
        log(f"resuming: {len(summaries)} of {len(files)} files already parsed in {work_dir}")
    if todo:
        bar = tqdm(total=len(todo), desc="parse", unit="file")
        workers = min(config.workers(), len(todo))
        docs = 0
        if workers <= 1:  # in this process: the bar moves inside a file too (one large file is one worker's)
            def in_file(rows: int) -> None:
                bar.set_postfix(rows_in_file=rows, docs=docs)
            results = (parse_file(Path(path), Path(shard), job_config, on_rows=in_file)
                       for path, shard, job_config in todo)
        else:
            pool = ProcessPoolExecutor(max_workers=workers)
            results = pool.map(_parse_job, todo)
        try:
            for (_, shard, _), summary in zip(todo, results):
                summaries[Path(shard)] = summary
                docs += summary["citations"] + summary["documents"]
                bar.set_postfix(docs=docs, problems=sum(len(s["problems"]) for s in summaries.values()))
                bar.update()
        except BaseException:
            if workers > 1:
                _stop_workers(pool)
            raise
        finally:
            bar.close()
        if workers > 1:
            pool.shutdown()
    return [(shard, summaries[shard]) for shard in shards]


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """End a pool now, on Ctrl-C or a failure: ``shutdown()`` would parse every file still queued first
    (its workers ignore SIGINT: ``biomed_lm.worker_lifetime``). A file cut off is parsed again next time
    (its shard is written whole or not at all).

    The pool's manager thread is then waited for: it closes its wake-up pipe as it ends, and Python 3.11's
    exit hook, writing to that pipe, raced the close and printed a ``Bad file descriptor`` traceback after
    the stage's one line (seen once in CI)."""
    processes = list((pool._processes or {}).values())  # private, but Python 3.11 has no terminate_workers()
    manager = pool._executor_manager_thread
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.terminate()
    if manager is not None:
        manager.join(timeout=30)


# --------------------------------------------------------------------------- stage 2: resolve



def resolve(keys: np.ndarray, is_delete: np.ndarray, n_words: np.ndarray, language_ok: np.ndarray,
            min_words: int, versions: np.ndarray | None = None) -> tuple[np.ndarray, dict[str, int], dict[str, int]]:
    """Which parsed rows become documents, why each other document row was dropped, and the funnel
    (document rows -> unique documents -> with an abstract -> kept).

    Rows are in input order. A delete row removes the rows of its PMID before it: of its version
    when it names one (``versions > 0``), of every version otherwise (``versions`` 0 or absent).
    Among the rows of a PMID (key >= 0) that no delete removed, the highest version wins and,
    among equal versions, the last row; for a text hash (key < 0) the first occurrence is kept.
    Pure and vectorized: arrays in, a boolean keep-mask and counts out.
    """
    versions = np.zeros(len(keys), dtype=np.int64) if versions is None else np.asarray(versions, dtype=np.int64)
    deleted, final = _deleted_and_winners(keys, is_delete, versions)
    document = ~is_delete
    counts: dict[str, int] = {}
    counts["deleted"] = int(np.sum(deleted))
    replaced = document & ~deleted & ~final
    counts["superseded"] = int(np.sum(replaced & (keys >= 0)))
    counts["duplicate_text"] = int(np.sum(replaced & (keys < 0)))
    candidate = document & final
    empty = candidate & (n_words == 0)
    counts["empty_abstract"] = int(np.sum(empty))
    wrong_language = candidate & ~empty & ~language_ok
    counts["language"] = int(np.sum(wrong_language))
    short = candidate & ~empty & language_ok & (n_words < min_words)
    counts["too_short"] = int(np.sum(short))
    keep = candidate & ~empty & language_ok & ~short
    funnel = {"document_rows": int(document.sum()), "unique_documents": int(candidate.sum()),
              "with_abstract": int(np.sum(candidate & ~empty)), "kept": int(keep.sum())}
    return keep, counts, funnel


def _group_max(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Each sorted row's group maximum of ``values`` (groups begin where ``starts`` is True)."""
    if not len(values):
        return values
    begin = np.flatnonzero(starts)
    return np.repeat(np.maximum.reduceat(values, begin), np.diff(np.append(begin, len(values))))


def _deleted_and_winners(keys: np.ndarray, is_delete: np.ndarray, versions: np.ndarray
                         ) -> tuple[np.ndarray, np.ndarray]:
    """Per row in input order: removed by a later delete, and the winner of its key (see :func:`resolve`)."""
    n = len(keys)
    position = np.arange(n, dtype=np.int64)
    # One sort by (key, version, position): rows of a key are contiguous, and within it those of a version.
    order = np.lexsort((position, versions, keys))
    k, v, d = keys[order], versions[order], is_delete[order]
    key_start = np.ones(n, dtype=bool)
    key_start[1:] = k[1:] != k[:-1]
    pair_start = key_start.copy()
    pair_start[1:] |= v[1:] != v[:-1]

    sorted_position = position[order]
    delete_all = _group_max(np.where(d & (v <= 0), sorted_position, -1), key_start)
    delete_version = _group_max(np.where(d & (v > 0), sorted_position, -1), pair_start)
    removed = ~d & (sorted_position < np.maximum(delete_all, delete_version))
    live = ~d & ~removed
    # The winner of each key among its live rows: the last in sort order for a PMID (highest
    # version, then latest), the first for a text hash (earliest).
    index = np.arange(n, dtype=np.int64)
    last_live = _group_max(np.where(live, index, -1), key_start)
    first_live = -_group_max(np.where(live, -index, -n - 1), key_start)
    winner_sorted = live & (index == np.where(k >= 0, last_live, first_live))

    deleted = np.zeros(n, dtype=bool)
    deleted[order] = removed
    final = np.zeros(n, dtype=bool)
    final[order] = winner_sorted
    return deleted, final


def _read_columns(shards: list[Path], names: list[str]) -> pa.Table:
    tables = []
    for shard in shards:
        with pa.memory_map(str(shard)) as source:
            tables.append(pa.ipc.open_stream(source).read_all().select(names))
    return pa.concat_tables(tables) if tables else PARSED_SCHEMA.empty_table().select(names)


# ----------------------------------------------------------------------------- links

LINKS_FILE_FORMAT = "citing_pmid<TAB>cited_pmid (optionally <TAB>link type)"


@dataclass
class LinksFile:
    """The links of a ``links_file``: parallel arrays, one entry per good line (self-links left out)."""

    path: str
    citing: np.ndarray                  # int64 PMIDs
    cited: np.ndarray                   # int64 PMIDs
    type_codes: np.ndarray              # int32 indices into type_names
    type_names: list[str]
    self_links: int = 0

    def summary(self) -> dict:
        return {"path": self.path, "links_read": int(len(self.citing)), "self_links": self.self_links}


def _link_line(text: str) -> tuple[int, int, str] | str | None:
    """One line of a links file: ``(citing, cited, link type)``, ``None`` for a blank or ``#``
    line, or what is wrong with it."""
    text = text.strip()
    if not text or text.startswith("#"):
        return None
    fields = [f.strip() for f in text.split("\t")]
    if len(fields) not in (2, 3):
        return f"{len(fields)} tab-separated field(s), expected {LINKS_FILE_FORMAT}"
    pmids = []
    for name, value in zip(("citing_pmid", "cited_pmid"), fields):
        pmid = canonical_pmid(value)
        if pmid is None:
            return (f"field {name} {value[:40]!r} is not a PMID (a positive decimal number); "
                    f"expected {LINKS_FILE_FORMAT}")
        pmids.append(int(pmid))
    link_type = fields[2] if len(fields) == 3 else "Cites"
    if not link_type:
        return "field 3 (the link type) is empty"
    return pmids[0], pmids[1], link_type


def read_links_file(path: str) -> tuple[LinksFile, list[Problem]]:
    """Read a links file. A bad line is a ``bad_link`` problem naming file and line, and the good
    lines are kept; a missing file, or one whose every link line is bad, raises TokenizationError."""
    from array import array

    if not os.path.isfile(path):
        raise TokenizationError(f"links_file {path}: no such file")
    citing, cited, codes = array("q"), array("q"), array("i")
    names: dict[str, int] = {}
    problems: list[Problem] = []
    self_links = 0
    for item in iter_lines(path):
        if isinstance(item, Problem):
            problems.append(item)
            continue
        parsed = _link_line(item[1])
        if isinstance(parsed, str):
            problems.append(Problem(path, "bad_link", f"{parsed}; the line was skipped", line=item[0]))
        elif parsed is not None and parsed[0] == parsed[1]:
            self_links += 1
        elif parsed is not None:
            citing.append(parsed[0])
            cited.append(parsed[1])
            codes.append(names.setdefault(parsed[2], len(names)))
    if not citing and problems:
        first = problems[0].describe().removesuffix("; the line was skipped")
        raise TokenizationError(f"links_file {path}: not one usable link ({len(problems)} bad line(s)); the first: "
                                f"{first}")
    if not citing and not self_links:
        problems.append(Problem(path, "empty", f"the links file has no link line ({LINKS_FILE_FORMAT})"))
    links = LinksFile(path, np.frombuffer(citing, dtype=np.int64), np.frombuffer(cited, dtype=np.int64),
                      np.frombuffer(codes, dtype=np.int32), list(names), self_links)
    return links, problems


def _members(values: np.ndarray, sorted_keys: np.ndarray) -> np.ndarray:
    """Which of ``values`` are in ``sorted_keys`` (sorted once, searched per chunk: no hash set rebuilt)."""
    if not len(sorted_keys):
        return np.zeros(len(values), dtype=bool)
    at = np.minimum(np.searchsorted(sorted_keys, values), len(sorted_keys) - 1)
    return sorted_keys[at] == values


def _first_rows(table: pa.Table, keys: list[str]) -> pa.Table:
    """The first row of each distinct ``keys`` combination, in table order."""
    if not table.num_rows:
        return table
    rows = table.append_column("row", pa.array(np.arange(table.num_rows, dtype=np.int64)))
    first = rows.group_by(keys, use_threads=False).aggregate([("row", "min")]).column("row_min").to_numpy()
    return table.take(np.sort(first))


class _LinkCounts:
    """What ``summary.json`` says about links, summed over chunks of documents."""

    def __init__(self, column_types: list[str]):
        self.column = {"link_types": column_types, "documents_with_links": 0, "links": 0, "resolvable": 0}
        self.by_type: dict[str, dict[str, int]] = {}

    def add(self, links: pa.Table, column: pa.Table, per_document: np.ndarray) -> None:
        self.column["documents_with_links"] += int(np.count_nonzero(per_document))
        self.column["links"] += column.num_rows
        self.column["resolvable"] += int(pc.sum(column["resolvable"]).as_py() or 0)
        if not links.num_rows:
            return
        grouped = links.group_by("type", use_threads=False).aggregate(
            [("doc", "count_distinct"), ("pmid", "count"), ("resolvable", "sum")]).to_pylist()
        for row in grouped:
            entry = self.by_type.setdefault(row["type"], {"documents": 0, "links": 0, "resolvable": 0})
            entry["documents"] += row["doc_count_distinct"]
            entry["links"] += row["pmid_count"]
            entry["resolvable"] += int(row["resolvable_sum"] or 0)

    def summary(self) -> dict:
        return {**self.column, "by_type": dict(sorted(self.by_type.items(), key=lambda kv: -kv[1]["links"]))}


def document_links(shards: list[Path], keep: np.ndarray, config: CorpusConfig, links_file: LinksFile | None
                   ) -> tuple[pa.ChunkedArray, dict]:
    """The ``links`` column of the kept documents (in their order) and the ``links`` counts of
    ``summary.json``, assembled :data:`LINKS_CHUNK` documents at a time."""
    table = _read_columns(shards, ["key", "link_pmids", "link_types"])
    kept_rows = np.flatnonzero(keep)
    keys = table.column("key").take(kept_rows).to_numpy()
    sorted_keys = np.sort(keys[keys >= 0])
    file_doc, file_order, extra = _file_links_by_document(links_file, keys)
    counts = _LinkCounts(list(config.link_types))
    chunks = []
    for start in range(0, len(kept_rows), LINKS_CHUNK):
        stop = min(start + LINKS_CHUNK, len(kept_rows))
        part = table.take(kept_rows[start:stop])
        lo, hi = np.searchsorted(file_doc, [start, stop])
        from_file = None
        if links_file is not None and hi > lo:
            rows = file_order[lo:hi]
            types = pa.DictionaryArray.from_arrays(pa.array(links_file.type_codes[rows]),
                                                   pa.array(links_file.type_names, pa.string()))
            from_file = (file_doc[lo:hi] - start, links_file.cited[rows], types.cast(pa.string()))
        chunks.append(_links_of_chunk(part, from_file, sorted_keys, config.link_types, counts))
    summary = counts.summary()
    if links_file is not None:
        summary["links_file"] = links_file.summary() | extra
    return pa.chunked_array(chunks, type=pa.list_(pa.string())), summary


def _file_links_by_document(links_file: LinksFile | None, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, dict]:
    """For each link of ``links_file`` whose citing PMID is a kept document: that document's
    position (sorted), the link's row in the file (in the same order), and how many were not."""
    if links_file is None or not len(links_file.citing):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), {"citing_not_in_corpus": 0}
    by_key = np.argsort(keys, kind="stable")
    at = np.minimum(np.searchsorted(keys[by_key], links_file.citing), max(len(keys) - 1, 0))
    found = (keys[by_key][at] == links_file.citing) if len(keys) else np.zeros(len(at), dtype=bool)
    rows = np.flatnonzero(found)
    doc = by_key[at[rows]]
    order = np.argsort(doc, kind="stable")
    return doc[order], rows[order], {"citing_not_in_corpus": int(len(found) - len(rows))}


def _links_of_chunk(part: pa.Table, from_file: tuple | None, sorted_keys: np.ndarray, column_types: list[str],
                    counts: _LinkCounts) -> pa.ListArray:
    """The ``links`` lists of one chunk of documents; its counts are added to ``counts``."""
    pmid_lists = part.column("link_pmids").combine_chunks()
    doc = np.asarray(pc.list_parent_indices(pmid_lists), dtype=np.int64)
    pmid = np.asarray(pc.list_flatten(pmid_lists), dtype=np.int64)
    types = pc.list_flatten(part.column("link_types").combine_chunks())
    if from_file is not None:
        doc, pmid = np.concatenate([doc, from_file[0]]), np.concatenate([pmid, from_file[1]])
        types = pa.concat_arrays([types, from_file[2]])
    order = np.argsort(doc, kind="stable")  # a document's own links first, then the file's
    links = pa.table({"doc": doc[order], "pmid": pmid[order], "type": types.take(pa.array(order))})
    links = _first_rows(links, ["doc", "type", "pmid"])
    links = links.append_column("resolvable", pa.array(_members(links.column("pmid").to_numpy(), sorted_keys)))
    wanted = pc.is_in(links.column("type"), value_set=pa.array(list(column_types), pa.string()))
    column = _first_rows(links.filter(wanted), ["doc", "pmid"])
    per_document = np.bincount(column.column("doc").to_numpy(), minlength=part.num_rows)
    counts.add(links, column, per_document)
    offsets = np.concatenate([[0], np.cumsum(per_document)]).astype(np.int32)
    values = pc.cast(column.column("pmid"), pa.string()).combine_chunks()
    return pa.ListArray.from_arrays(pa.array(offsets), values)


def build_documents(batch: dict, include_title: bool) -> dict:
    """Batched ``datasets.map`` function: parsed rows -> documents with sentences."""
    texts, sentences = [], []
    for title, abstract in zip(batch["title"], batch["abstract"]):
        body = split_sentences(abstract)
        if include_title and title:
            texts.append(f"{title} {abstract}")
            sentences.append([title] + body)
        else:
            texts.append(abstract)
            sentences.append(body)
    return {"text": texts, "sentences": sentences}


def prepare_corpus(config: CorpusConfig, log: Callable[[str], None] | None = None) -> dict:
    """Run the three stages; returns the summary (also written to ``<output_dir>/summary.json``).

    Where ``output_dir`` already holds a corpus (and ``overwrite`` is not set), nothing is built: the
    summary of that corpus comes back, with ``already_complete`` set, when this command built it (the
    same input files and settings, :func:`finished_corpus`), else FileExistsError names what differs.
    ``log`` hears what a resumed run reuses and what it cleans up."""
    if not config.inputs:
        raise TokenizationError("no inputs given")
    if not config.output_dir:
        raise TokenizationError("no output_dir given")
    _check_shard_size(config.max_shard_size)
    out = Path(config.output_dir)
    workers_die_with_this_process()  # a killed run leaves no parsing or splitting worker behind
    with acquire_run_lock(out, ARTIFACT_LOCK_FILE):  # before anything in out is read: a second run on it is refused
        if (out / "state.json").exists() and not config.overwrite:
            return finished_corpus(config, out)
        return _prepare_corpus(config, out, log or _quiet)


def _quiet(_line: str) -> None:
    """The ``log`` of a caller that wants no progress lines."""


def _input_files(config: CorpusConfig) -> tuple[list[Path], list[Problem]]:
    """The files the inputs name, in input order, and the inputs that name none or are refused."""
    return corpus_files(config.inputs, config.format_of,
                        "--format text, jsonl or xml reads files of other suffixes that way")


def _prepare_corpus(config: CorpusConfig, out: Path, log: Callable[[str], None]) -> dict:
    """The three stages into ``out``, whose lock this process holds."""
    work = out / "_work"
    started = time.perf_counter()
    remove_stale_temporary_files(work, log)  # the lock is ours: any there are a killed run's

    files, input_problems = _input_files(config)
    input_problems, set_aside = _set_aside(input_problems, files, log)
    identity = inputs_identity(config, files)  # before parsing: a file changed meanwhile differs from it next time
    links_file = None
    if config.links_file:  # read first: a missing or unusable links file stops the run before any parsing
        links_file, link_problems = read_links_file(config.links_file)
        input_problems += link_problems
    duplicates = find_duplicate_files(files)
    parsed = parse_inputs(files, work, config, log)
    shards = [shard for shard, _ in parsed]
    keep, dropped, funnel = _resolve_shards(shards, config)
    links = {}
    if funnel["kept"]:
        column, links = document_links(shards, keep, config, links_file)
        _build_documents(shards, keep, funnel["kept"], work, out, config, column, log)
    summary = _summary(config, out, files, input_problems, parsed, dropped, funnel, time.perf_counter() - started)
    summary["links"] = links
    summary["set_aside"] = set_aside
    summary["duplicate_files"] = duplicates
    summary["inputs_identity"] = identity
    if funnel["kept"]:  # what a rerun checks the corpus against: a shard cut off or deleted since is damage
        summary["output_files"] = saved_files_record(out)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomically(out / SUMMARY_FILE, summary)  # a killed run never leaves half a summary
    if not funnel["kept"]:
        raise NoUsableInput(summary["error"], summary)
    return summary


def _set_aside(input_problems: list[Problem], files: list[Path], log: Callable[[str], None]
               ) -> tuple[list[Problem], list[dict]]:
    """``input_problems`` without the licence and documentation files a folder held beside readable ones, and
    those files (logged): they are expected there, not damage, so the run's status stays 0. Where nothing else
    is readable they stay problems, so the refusal names them."""
    found = [p for p in input_problems if p.reason == "not_corpus"]
    if not files:
        return input_problems, []
    for problem in found:
        log(f"not read: {problem.describe()}")
    return [p for p in input_problems if p.reason != "not_corpus"], [problem.to_dict() for problem in found]


def remove_stale_temporary_files(work: Path, log: Callable[[str], None]) -> None:
    """Remove what a killed run left half-written in ``work``: ``datasets``' temporary files (``tmp*``, its
    sentence splitting writes through them) and parsed shards cut off (``parsed/*.tmp``). Called under the
    run lock, so no live run owns them; they are never reused, only take space (19.5 MB seen)."""
    stale = [p for p in [*work.glob("tmp*"), *work.glob("parsed/*.tmp")] if p.is_file()]
    if not stale:
        return
    size = sum(p.stat().st_size for p in stale)
    for path in stale:
        path.unlink()
    files = f"{len(stale)} temporary file{'s' if len(stale) != 1 else ''}"
    log(f"removed {files} ({size / 1e6:.1f} MB) an interrupted run left in {work}")


def find_duplicate_files(files: list[Path]) -> list[dict]:
    """Inputs whose bytes equal an earlier input's: ``[{"path", "same_as"}]`` in input order. Their
    records are still read (the later copy supersedes the earlier one, so no record is lost); only
    files of equal size are hashed."""
    by_size: dict[int, list[Path]] = {}
    for path in files:
        try:
            by_size.setdefault(path.stat().st_size, []).append(path)
        except OSError:  # parsing reports it
            pass
    first_of: dict[tuple[int, str], Path] = {}
    duplicates: dict[Path, Path] = {}
    for size, group in by_size.items():
        if len(group) < 2:
            continue
        for path in group:
            digest = hashlib.sha256()
            try:
                with open(path, "rb") as handle:
                    for block in iter(lambda: handle.read(1 << 20), b""):
                        digest.update(block)
            except OSError:  # unreadable: parsing reports it
                continue
            original = first_of.setdefault((size, digest.hexdigest()), path)
            if original is not path:
                duplicates[path] = original
    return [{"path": str(p), "same_as": str(duplicates[p])} for p in files if p in duplicates]


def _resolve_shards(shards: list[Path], config: CorpusConfig) -> tuple[np.ndarray, dict[str, int], dict[str, int]]:
    """Stage 2 on the parsed shards: :func:`resolve` with the language filter applied."""
    table = _read_columns(shards, ["key", "is_delete", "n_words", "language", "version"])
    keys = table.column("key").to_numpy()
    is_delete = table.column("is_delete").to_numpy(zero_copy_only=False)
    n_words = table.column("n_words").fill_null(0).to_numpy()
    # A document without a version (text) sorts as 0, a delete without one (every version) as 0 too.
    versions = table.column("version").fill_null(0).to_numpy()
    if config.languages:
        # Text and JSONL documents carry no language; the filter applies to those that do.
        language_ok = _any_language_in(table.column("language").fill_null(""), config.languages)
    else:
        language_ok = np.ones(len(keys), dtype=bool)
    return resolve(keys, is_delete, n_words, language_ok, config.min_words, versions)


def _any_language_in(languages: pa.ChunkedArray, wanted: Sequence[str]) -> np.ndarray:
    """Per document: whether one of its space-separated language codes is ``wanted``, or it has none (text,
    JSONL). Arrow compute, not numpy: 36M Python strings would cost gigabytes."""
    codes = pc.split_pattern(languages.combine_chunks(), " ")
    found = pc.is_in(pc.list_flatten(codes), value_set=pa.array(list(wanted) + [""], type=pa.string()))
    hits = np.bincount(pc.list_parent_indices(codes).to_numpy(), weights=found.to_numpy(zero_copy_only=False),
                       minlength=len(languages))
    return hits > 0


def _build_documents(shards: list[Path], keep: np.ndarray, n_kept: int, work: Path, out: Path,
                     config: CorpusConfig, links: pa.ChunkedArray, log: Callable[[str], None]) -> None:
    """Stage 3: the surviving rows, sentence-split, saved as the corpus dataset in ``out``."""
    import datasets

    # Arrow stream shards load memory-mapped; select keeps only the surviving rows.
    parsed_ds = datasets.concatenate_datasets([datasets.Dataset.from_file(str(s)) for s in shards])
    kept_rows = np.flatnonzero(keep)
    survivors = parsed_ds.select(kept_rows)
    # The cache of sentence-split documents is named after exactly what goes into it (which
    # parsed files, which of their rows, how documents are built), so a run with other inputs
    # (say, one more update file) never picks up a stale cache.
    recipe = hashlib.sha1("\0".join([*(s.name for s in shards), str(config.include_title), str(PARSER_VERSION),
                                     splitter_identity()]).encode() + kept_rows.tobytes()).hexdigest()[:16]
    num_proc = min(config.workers(), max(1, n_kept // 500))
    cache_file = work / f"documents-{recipe}.arrow"
    if _documents_cached(cache_file, num_proc):
        log(f"resuming: the {n_kept} documents were already split into sentences in {work}")
    documents = survivors.map(
        build_documents, batched=True, batch_size=500, num_proc=num_proc,
        fn_kwargs={"include_title": config.include_title},
        remove_columns=["key", "is_delete", "line", "abstract", "n_words", "link_pmids", "link_types"],
        cache_file_name=str(cache_file), desc="split sentences")
    documents = documents.add_column("links", links, new_fingerprint=f"{recipe}-links")
    documents = documents.select_columns(["id", "source", "text", "sentences", "title", "year", "language", "links"])
    # The summary of the corpus being replaced goes first: a run killed while saving leaves a corpus
    # that no summary describes, which a rerun refuses, never one it would take for finished.
    (out / SUMMARY_FILE).unlink(missing_ok=True)
    documents.save_to_disk(str(out), max_shard_size=config.max_shard_size)
    for stale in work.glob("documents-*.arrow"):
        if not stale.name.startswith(f"documents-{recipe}"):
            stale.unlink()


def _documents_cached(cache_file: Path, num_proc: int) -> bool:
    """Whether ``datasets`` will load the sentence-split documents from ``cache_file`` (with several
    processes, one file per process: ``documents-<recipe>_00000_of_00002.arrow``, ...)."""
    if num_proc <= 1:
        return cache_file.is_file()
    return all(cache_file.with_name(f"{cache_file.stem}_{rank:05d}_of_{num_proc:05d}{cache_file.suffix}").is_file()
               for rank in range(num_proc))


def _summary(config: CorpusConfig, out: Path, files: list[Path], input_problems: list[Problem], parsed: list,
             dropped: dict[str, int], funnel: dict[str, int], seconds: float) -> dict:
    """What ``summary.json`` says: what was read, kept and dropped, every problem, and why nothing
    was kept when nothing was."""
    problems = [p.to_dict() for p in input_problems] + [p for _, s in parsed for p in s["problems"]]
    totals = {k: sum(s.get(k, 0) for _, s in parsed)
              for k in ("citations", "deletions", "documents", "empty_lines", "links_skipped")}
    summary = {
        "output_dir": str(out),
        "documents_kept": funnel["kept"],
        "read": {"files": len(files), **totals},
        "funnel": funnel,
        "dropped": dropped,
        "filters": {"min_words": config.min_words, "languages": config.languages},
        "problems": problems,
        "problem_counts": _count_by(problems, "reason"),
        "files": [{k: v for k, v in s.items() if k != "problems"} | {"problems": len(s["problems"])}
                  for _, s in parsed],
        "config": asdict(config),
        "seconds": round(seconds, 2),
    }
    if not funnel["kept"]:
        summary["warning"] = "no document survived; nothing was saved"
        summary["error"] = _why_nothing_kept(config, summary)
    return summary


def _check_shard_size(size: str) -> None:
    """Refuse a ``max_shard_size`` that ``save_to_disk`` would refuse or divide by (``0MB``), before any input
    is parsed: when the config is built, and again when a run starts (a caller may have set it since)."""
    problem = shard_size_problem(size)
    if problem:
        raise TokenizationError(problem)


def _why_nothing_kept(config: CorpusConfig, summary: dict) -> str:
    """The message of :class:`NoUsableInput`: which inputs gave nothing, and why."""
    inputs = ", ".join(config.inputs)
    if not summary["funnel"]["document_rows"]:
        reasons: dict[str, list[str]] = {}
        for problem in summary["problems"]:
            reasons.setdefault(problem["path"], [])
            if problem["reason"] not in reasons[problem["path"]]:
                reasons[problem["path"]].append(problem["reason"])
        for entry in summary["files"]:  # read without a problem, yet no document: deletions only, say
            reasons.setdefault(entry["path"], ["no document"])
        listed = "; ".join(f"{path}: {', '.join(why)}" for path, why in list(reasons.items())[:10])
        more = f"; and {len(reasons) - 10} more (see summary.json)" if len(reasons) > 10 else ""
        return (f"no usable input: not one document could be read from {inputs} "
                f"(every input is empty, missing, refused or damaged: {listed}{more}); no dataset was written")
    dropped = ", ".join(f"{reason} {count}" for reason, count in summary["dropped"].items() if count)
    return (f"no document survived: {summary['funnel']['document_rows']} document rows were read from {inputs} "
            f"and all were dropped ({dropped}; --min-words {config.min_words}"
            + (f", --languages {' '.join(config.languages)}" if config.languages else "")
            + "); no dataset was written")


def _count_by(items: list[dict], key: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for item in items:
        counts[item[key]] = counts.get(item[key], 0) + 1
    return counts


# ------------------------------------------------------------ a finished corpus: what a rerun compares
#
# A rerun of a finished command is told so and exits 0 (the data stages as pretrain and finetune do); a
# command that would build another corpus is refused, naming what differs (biomed_lm.finished_output).

#: CorpusConfig fields that do not decide the corpus: where it goes, how many workers build it (the rows
#: do not depend on it, tests/test_num_proc_invariance.py), whether to replace one; the inputs and the
#: links file are compared by their files' identity instead of by how the command spells them.
_NOT_CORPUS_SETTINGS = ("inputs", "output_dir", "num_proc", "overwrite", "links_file")
#: Settings that are sets: their order decides nothing.
_SET_SETTINGS = ("languages", "link_types")


def inputs_identity(config: CorpusConfig, files: Sequence[Path]) -> dict:
    """``summary.json``'s ``inputs_identity``: the parser's version and each input file's (and the links
    file's) :func:`file_identity`, in input order (a later file's version of a PMID wins)."""
    return {"parser_version": PARSER_VERSION, "sentence_splitter": splitter_identity(),
            "files": [file_identity(path) for path in files], "links_file": _links_file_identity(config)}


def _links_file_identity(config: CorpusConfig) -> dict | None:
    if not config.links_file or not os.path.isfile(config.links_file):
        return None
    return file_identity(config.links_file)


def corpus_settings(values: Mapping[str, Any]) -> dict:
    """The settings (of a CorpusConfig as a dict) that decide the corpus; one a record predates takes its
    default, which is what such records were built with."""
    settings = {k: v for k, v in {**dataclass_defaults(CorpusConfig), **values}.items()
                if k not in _NOT_CORPUS_SETTINGS}
    for name in _SET_SETTINGS:
        settings[name] = sorted(set(settings[name]))
    return settings


def finished_corpus(config: CorpusConfig, out: Path) -> dict:
    """The summary of the corpus in ``out``, with ``already_complete`` set, when ``config`` built it: the
    same input files (path, size, modification time), links file, parser and settings. FileExistsError
    otherwise, naming what differs, or why the corpus's record cannot tell; TokenizationError where a file of
    the saved corpus is missing or has another size than when it was saved (a summary written before sizes
    were recorded is not checked so)."""
    summary = read_record(out / SUMMARY_FILE)
    unknown = _why_unknown_corpus(summary)
    if unknown:
        raise FileExistsError(f"{out} already holds a prepared corpus {unknown}, so this command cannot tell "
                              "whether it built it; pass --overwrite to rebuild it")
    damage = damaged_file_lines(out, summary.get("output_files"))
    if damage:
        raise TokenizationError(damaged_output_message(out, "a prepared corpus", damage))
    changes = _corpus_changes(summary, config)
    if changes:
        raise FileExistsError(other_output_message(out, "a prepared corpus", changes))
    return {**summary, "already_complete": True}


def _why_unknown_corpus(summary: dict | None) -> str:
    """Why a corpus's summary cannot say which command built it; empty when it can."""
    if summary is None:
        return f"without a readable {SUMMARY_FILE} (a run stopped while saving it?)"
    if not summary.get("documents_kept"):
        return f"that its {SUMMARY_FILE} does not describe (the last run there kept no document)"
    if not isinstance(summary.get("inputs_identity"), dict):
        return f"whose {SUMMARY_FILE} predates the record of its input files"
    return ""


def _corpus_changes(summary: dict, config: CorpusConfig) -> list[str]:
    """What differs between the corpus ``summary`` describes and the one ``config`` builds."""
    recorded = summary["inputs_identity"]
    changes = setting_change_lines(corpus_settings(summary.get("config") or {}), corpus_settings(asdict(config)),
                               "corpus")
    if recorded.get("parser_version") != PARSER_VERSION:
        changes.append(f"parser_version: {recorded.get('parser_version')} in the finished corpus, "
                       f"{PARSER_VERSION} now (this version parses inputs differently)")
    if recorded.get("sentence_splitter", splitter_identity()) != splitter_identity():
        changes.append(f"sentence_splitter: {recorded['sentence_splitter']} in the finished corpus, "
                       f"{splitter_identity()} now (sentences are split differently)")
    files, _ = _input_files(config)
    changes += changed_files(recorded.get("files") or [], [file_identity(path) for path in files], "inputs")
    links_before, links_now = recorded.get("links_file"), _links_file_identity(config)
    changes += changed_files([links_before] if links_before else [], [links_now] if links_now else [], "links_file")
    return changes
