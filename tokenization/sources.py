"""Input discovery and line-oriented readers shared by ingestion, vocabulary building and reports.

Three kinds of input are understood, each optionally gzip-compressed:

* PubMed/MEDLINE XML (``.xml``, ``.xml.gz``), parsed by :mod:`tokenization.pubmed_xml`;
* JSON Lines (``.jsonl``, ``.json``, ``.ndjson``) with a text field;
* plain text with one document per line (``.txt``, ``.text``).

:func:`input_format` knows only those suffixes (:data:`SUFFIXES`, each optionally followed by
``.gz``) and answers ``None`` for any other, so that a CSV or an image is not read as text.
:func:`corpus_files` holds every stage that reads raw input to one rule: such a file found in a
folder or by a pattern is set aside and named (a ``unknown_format`` problem), as is a licence or
documentation file there (``not_corpus``, by its name: :data:`NOT_CORPUS`), and the other files are
read; ``prepare_corpus``, ``build_vocab`` and ``vocab_report`` refuse an input only when nothing in it
can be read.

A *prepared corpus* (the output directory of ``launch/prepare_corpus.py``, a ``datasets`` dataset
saved to disk) is also accepted wherever text is read.

Readers never raise on damaged content: they yield :class:`Problem` records that say where the
damage is, and carry on with the next line, so nothing that was good is lost.
"""

from __future__ import annotations

import glob
import json
import os
import re
from pathlib import Path
from typing import Callable, Iterable, Iterator

from biomed_lm.errors import InputError
from biomed_lm.resources import resolve_path, resolve_pattern
from biomed_lm.tokenization.pubmed_xml import Citation, iter_pubmed_records
from biomed_lm.tokenization.streams import Problem, StreamDamage, iter_blocks

XML = "pubmed-xml"
JSONL = "jsonl"
TEXT = "text"


#: The suffixes whose format is known (each may be followed by ``.gz``), in the order they are listed.
SUFFIXES = {".xml": XML, ".txt": TEXT, ".text": TEXT, ".jsonl": JSONL, ".json": JSONL, ".ndjson": JSONL}
#: ``--format`` choices other than ``auto`` -> the format they name.
FORMAT_NAMES = {"xml": XML, "text": TEXT, "jsonl": JSONL}
#: Checksum files published beside data files (PubMed's ``.xml.gz.md5``): skipped when a directory
#: or a glob pattern is expanded, as hidden files are.
SIDECAR_SUFFIXES = (".md5", ".sha1", ".sha256", ".sha512")
#: What a data folder ships beside its text (the embedded sample's LICENSE-*.txt): a text or markdown file (or
#: one without a suffix) whose name begins with one of these words, found in a folder or by a pattern, is set
#: aside and named, not read as text (:func:`is_documentation`). A JSONL or XML file is data whatever its name.
NOT_CORPUS = re.compile(r"(licen[cs]es?|copying|readme|notice)(?![a-z0-9])", re.IGNORECASE)
DOCUMENTATION_SUFFIXES = ("", ".txt", ".text", ".md", ".rst")
#: The reasons of the files a folder or pattern held that are set aside and named, not read; an input
#: that holds nothing else is refused.
SET_ASIDE = ("unknown_format", "not_corpus")


def detect_format(path: str | os.PathLike) -> str:
    """The format of ``path`` by its suffix; anything not XML or JSONL is read as text."""
    return input_format(path) or TEXT


def input_format(path: str | os.PathLike, fallback: str = "auto") -> str | None:
    """The format of ``path`` by its suffix (:data:`SUFFIXES`, optionally ``.gz``); for any other
    suffix the format that ``fallback`` names (``xml``, ``text``, ``jsonl``), or ``None`` for ``auto``."""
    name = Path(path).name.lower()
    if name.endswith(".gz"):
        name = name[:-3]
    for suffix, fmt in SUFFIXES.items():
        if name.endswith(suffix):
            return fmt
    return FORMAT_NAMES.get(fallback)


def suffix_of(path: str | os.PathLike) -> str:
    """The suffix that decided (or failed to decide) the format, for messages: ``.csv``, ``.csv.gz``."""
    name = Path(path).name
    gz = name.lower().endswith(".gz") and len(name) > 3
    suffix = Path(name[:-3] if gz else name).suffix
    return (suffix + (".gz" if gz else "")) or "no suffix"


def accepted_suffixes() -> str:
    return ", ".join(SUFFIXES) + " (each optionally .gz)"


# Magic numbers of binary formats that get renamed or misplaced among text inputs.
_MAGIC = ((b"\x89PNG\r\n\x1a\n", "a PNG image"), (b"\xff\xd8\xff", "a JPEG image"), (b"GIF8", "a GIF image"),
          (b"%PDF-", "a PDF document"), (b"PK\x03\x04", "a ZIP archive (or .docx/.xlsx)"),
          (b"\x1f\x8b", "gzip-compressed data"),
          (b"BZh", "bzip2-compressed data"), (b"\xfd7zXZ\x00", "xz-compressed data"),
          (b"(\xb5/\xfd", "zstd-compressed data"), (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive"))
SNIFF_BYTES = 8192


def sniff_binary(path: str | os.PathLike) -> str | None:
    """Why the (decompressed) start of ``path`` is binary rather than text, or ``None``: a known
    magic number, or a NUL byte in the first 8 KiB (git's test; UTF-16 text fails it too). Damage
    and missing files are left to the readers, which report them with a line number."""
    blocks = iter_blocks(path, SNIFF_BYTES)
    try:
        head = next(blocks, b"")[:SNIFF_BYTES]
    except (OSError, StreamDamage):
        return None
    finally:
        blocks.close()
    for magic, what in _MAGIC:
        if head.startswith(magic) and (magic != b"BZh" or head[4:10] == b"1AY&SY"):
            if magic == b"\x1f\x8b":
                what += " (compressed twice?)" if str(path).endswith(".gz") else " (give the file a .gz suffix)"
            return f"the content is {what}, not text"
    nul = head.find(b"\0")
    if nul >= 0:
        return f"NUL byte at byte {nul}: binary data, or text in UTF-16/UTF-32 (convert it to UTF-8)"
    return _mostly_not_utf8(head)


def _mostly_not_utf8(head: bytes) -> str | None:
    """Why a file whose first lines are mostly not UTF-8 is in another encoding, or None. One such line among
    many is a damaged line, left out and named by the readers; most of them is a file in Latin-1 or
    Windows-1252, which read line by line kept only its ASCII lines (QA: 34 of 100, and 66 warnings)."""
    lines = [line for line in head.split(b"\n")[:-1] if line.strip()]  # the last may be cut mid-character
    bad = 0
    for line in lines:
        try:
            line.decode("utf-8")
        except UnicodeDecodeError:
            bad += 1
    if bad >= 3 and bad * 2 >= len(lines):
        return (f"{bad} of its first {len(lines)} lines are not UTF-8: text in another encoding, such as Latin-1 "
                "or Windows-1252 (convert it to UTF-8, e.g. iconv -f latin1 -t utf-8)")
    return None


def is_prepared_corpus(path: str | os.PathLike) -> bool:
    """True for a directory written by ``Dataset.save_to_disk`` (what prepare_corpus produces)."""
    p = Path(path)
    return p.is_dir() and (p / "dataset_info.json").is_file() and (p / "state.json").is_file()


def is_pattern(spec: str) -> bool:
    """Whether an input spec is a glob pattern (expanded by :func:`expand_inputs`) rather than a path."""
    return any(ch in spec for ch in "*?[")


def unknown_format_problem(path: str | os.PathLike, how_to_read: str) -> Problem:
    """The one wording of a file whose suffix says no format; ``how_to_read`` says what would read it."""
    return Problem(str(path), "unknown_format",
                   f"unknown suffix {suffix_of(path)!r}, not read; accepted: {accepted_suffixes()}; {how_to_read}")


#: What reads a file of another suffix, for the stages without a --format option.
PREPARE_IT_FIRST = "launch/prepare_corpus.py --format text, jsonl or xml prepares a corpus from it"


def corpus_files(specs: Iterable[str], format_of=input_format,
                 how_to_read: str = PREPARE_IT_FIRST) -> tuple[list[Path], list[Problem]]:
    """:func:`expand_inputs`, then each file whose format ``format_of`` does not know set aside as an
    ``unknown_format`` problem (a README or a CSV in a folder of abstracts is not read as text)."""
    files, problems = expand_inputs(specs)
    unknown = [path for path in files if format_of(path) is None]
    problems += [unknown_format_problem(path, how_to_read) for path in unknown]
    return [path for path in files if format_of(path) is not None], problems


def expand_inputs(specs: Iterable[str]) -> tuple[list[Path], list[Problem]]:
    """Turn files, directories and glob patterns into an ordered, de-duplicated list of files.

    Order matters for PubMed updates (a later file's version of a citation wins), so each spec keeps
    its position and the files it expands to are sorted by name: PubMed's zero-padded file names
    (baseline ``pubmed26n0001`` ... then the updates) sort into release order. Specs that match nothing are
    reported as problems rather than silently dropped. A directory or pattern skips hidden files and
    checksum files (:data:`SIDECAR_SUFFIXES`); a file named on its own is always listed.
    """
    files: list[Path] = []
    problems: list[Problem] = []
    seen: set[Path] = set()
    for spec in specs:
        # the shipped sample (data/sample/..., data/sample/*.txt) from any directory
        spec = resolve_pattern(spec) if is_pattern(spec) else str(resolve_path(spec))
        if is_pattern(spec):
            matches = sorted((m for m in glob.glob(spec, recursive=True)
                              if os.path.isfile(m) and not m.lower().endswith(SIDECAR_SUFFIXES)))
            matches = _set_aside_documentation(matches, problems)
            if not matches:
                problems.append(Problem(spec, "missing", "the pattern matched no file"))
        elif os.path.isdir(spec):
            if is_prepared_corpus(spec):
                problems.append(Problem(spec, "unsupported", "this is a prepared corpus, not raw input; "
                                        "pass the raw PubMed/text files it was built from"))
                continue
            inside = sorted(str(p.parent) for p in Path(spec).rglob("dataset_info.json")
                            if is_prepared_corpus(p.parent))
            if inside:  # its Arrow shards and JSON files would be read as text (QA: a 283-token vocabulary, exit 0)
                problems.append(Problem(spec, "unsupported", f"the folder holds a prepared corpus ({inside[0]}); "
                                        "pass that corpus folder itself, or the raw files"))
                continue
            matches = sorted((str(p) for p in Path(spec).rglob("*") if p.is_file() and not p.name.startswith(".")
                              and not p.name.lower().endswith(SIDECAR_SUFFIXES)))
            matches = _set_aside_documentation(matches, problems)
            if not matches:
                problems.append(Problem(spec, "missing", "the directory contains no file"))
        elif os.path.isfile(spec):
            matches = [spec]
        else:
            problems.append(Problem(spec, "missing", "no such file or directory"))
            matches = []
        for m in matches:
            p = Path(m).resolve()
            if p not in seen:
                seen.add(p)
                files.append(Path(m))
    return files, problems


def is_documentation(name: str) -> bool:
    """Whether a file found in a folder is a licence or readme rather than corpus text, by its name."""
    return bool(NOT_CORPUS.match(name)) and Path(name).suffix.lower() in DOCUMENTATION_SUFFIXES


def _set_aside_documentation(matches: list[str], problems: list[Problem]) -> list[str]:
    """``matches`` without the licence and documentation files (:data:`NOT_CORPUS`), each named in ``problems``."""
    kept = []
    for match in matches:
        if is_documentation(Path(match).name):
            problems.append(Problem(match, "not_corpus", "a licence or documentation file by its name, not read as "
                                    "corpus text (name the file itself to read it)"))
        else:
            kept.append(match)
    return kept


def iter_lines(path: str | os.PathLike) -> Iterator[tuple[int, str] | Problem]:
    """Yield ``(line_number, text)`` for each line of a (possibly gzipped) UTF-8 file.

    A line that is not valid UTF-8 becomes a :class:`Problem` and reading continues with the next
    line; a truncated or corrupt gzip stream ends the file with a :class:`Problem` after every
    complete line before the damage has been yielded.
    """
    spath = str(path)
    offset = 0      # byte offset of the start of the pending (incomplete) line
    line_no = 0
    pending = b""

    def decoded(raw: bytes) -> tuple[int, str] | Problem:
        try:  # a byte-order mark opens some files saved by Windows editors: not text (QA: it stayed in the document)
            return line_no, raw.decode("utf-8-sig" if line_no == 1 else "utf-8").rstrip("\r\n")
        except UnicodeDecodeError as err:
            return Problem(spath, "invalid_utf8", f"{err.reason} at column {err.start + 1}",
                           line=line_no, byte_offset=offset + err.start)

    try:
        for block in iter_blocks(path):
            lines = (pending + block).split(b"\n")
            pending = lines.pop()
            for raw in lines:
                line_no += 1
                yield decoded(raw)
                offset += len(raw) + 1
        if pending:
            line_no += 1
            yield decoded(pending)
    except FileNotFoundError:
        yield Problem(spath, "missing", "no such file")
    except StreamDamage as err:
        yield Problem(spath, "truncated_or_corrupt_gzip", f"{err}; the {line_no} complete lines before "
                      f"it were kept, the partial line after them was dropped", line=line_no + 1, byte_offset=offset)


def iter_jsonl(path: str | os.PathLike, text_field: str) -> Iterator[tuple[int, dict] | Problem]:
    """Yield ``(line_number, record)`` for JSON Lines; bad lines and missing fields are problems."""
    spath = str(path)
    for item in iter_lines(path):
        if isinstance(item, Problem):
            yield item
            continue
        line_no, line = item
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            yield Problem(spath, "invalid_json", json_error_words(err), line=line_no)
            continue
        if not isinstance(record, dict):
            yield Problem(spath, "invalid_json", f"the line is {json_type(record)}, expected a JSON object",
                          line=line_no)
        elif text_field not in record:
            yield Problem(spath, "missing_field", f"no field {text_field!r} "
                          f"(fields present: {', '.join(sorted(record)) or 'none'})", line=line_no)
        elif not isinstance(record[text_field], str):
            yield Problem(spath, "wrong_type", f"field {text_field!r} is {json_type(record[text_field])}, "
                          "expected a string", line=line_no)
        else:
            yield line_no, record


def json_error_words(err: json.JSONDecodeError) -> str:
    """json's reason and where on its line: ``Expecting value at column 26`` (every reader words it so)."""
    at = "" if err.msg.endswith(" at") else " at"  # json's "Unterminated string starting at" says it
    return f"{err.msg}{at} column {err.colno}"


def json_type(value: object) -> str:
    """A decoded JSON value's type, in words: ``a list``, ``an object``, ``a number``, ``null``..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "a list" if isinstance(value, list) else "an object"


def damaged_arrow_file(folder: str | os.PathLike) -> Path | None:
    """The first ``*.arrow`` file of ``folder`` (a saved ``datasets`` dataset) that pyarrow cannot read to
    the end, or None: what a loader names after ``load_from_disk`` failed, as pyarrow's error ("Expected to
    be able to read N bytes for message body") names no file. ``datasets`` writes the Arrow stream format;
    memory-mapped, the batches are checked without reading their bodies into memory."""
    import pyarrow as pa

    for path in sorted(Path(folder).glob("*.arrow")):
        try:
            with pa.memory_map(str(path)) as source:
                for _ in pa.ipc.open_stream(source):
                    pass
        except (pa.ArrowException, OSError):
            return path
    return None


def damaged_shard_message(folder: str | os.PathLike, what: str, rebuild_with: str, err: BaseException) -> str:
    """The one sentence every loader says when ``datasets`` cannot read the saved dataset ``folder`` (``what``:
    "prepared corpus", "instance dataset"): the damaged shard named where one is found (pyarrow's error names no
    file), the script that rebuilds it, and the library's own words last."""
    shard = damaged_arrow_file(folder)
    which = f"its shard {shard.name} is damaged or truncated" if shard else "a damaged or truncated shard?"
    return (f"{folder}: {what} cannot be read: {which}; rebuild it with {rebuild_with} --overwrite "
            f"({type(err).__name__}: {err})")


def _prepared_corpus_texts(spec: str, text_field: str, batch_size: int) -> Iterator[str]:
    """The ``text_field`` column of the prepared corpus at ``spec``; a damaged shard (pyarrow's
    OSError, which names no file) is reported as an :class:`InputError` naming the corpus and the shard."""
    from datasets import load_from_disk

    try:
        dataset = load_from_disk(spec)
        if text_field not in dataset.column_names:
            raise InputError(f"{spec}: prepared corpus has no column {text_field!r} "
                             f"(columns: {', '.join(dataset.column_names)})")
        for batch in dataset.select_columns([text_field]).iter(batch_size=batch_size):
            yield from batch[text_field]
    except FileNotFoundError:
        raise
    except OSError as err:
        raise InputError(damaged_shard_message(spec, "prepared corpus", "launch/prepare_corpus.py", err)) from err


def iter_texts(specs: str | os.PathLike | Iterable[str | os.PathLike], text_field: str = "text",
               batch_size: int = 1000, on_problem: Callable[[Problem], None] | None = None) -> Iterator[str]:
    """Yield document texts from prepared corpora, text, JSONL or PubMed XML inputs (for training
    vocabularies and for reports). What cannot be read — a damaged record or line, a JSON line without its
    text field, a binary file under a text name — is skipped and handed to ``on_problem`` (build_vocab lists
    it, vocab_report refuses the input: :func:`strict`); without one it is skipped silently, as benchmarks
    want. Files of an unknown suffix in a folder or pattern are skipped too: the callers name them first
    (:func:`corpus_files`)."""
    if isinstance(specs, (str, os.PathLike)):
        specs = [specs]
    for spec in specs:
        spec = str(spec)
        if is_prepared_corpus(spec):
            yield from _prepared_corpus_texts(spec, text_field, batch_size)
            continue
        files, problems = corpus_files([spec])  # the callers have named the files of unknown suffix
        missing = [problem for problem in problems if problem.reason not in SET_ASIDE]
        if missing:
            raise FileNotFoundError("; ".join(p.describe() for p in missing))
        for path in files:
            for item in _file_texts(path, text_field):
                if isinstance(item, Problem):
                    if on_problem is not None:
                        on_problem(item)
                else:
                    yield item


def strict(problem: Problem) -> None:
    """An ``on_problem`` for :func:`iter_texts` that stops at the first thing it could not read."""
    hint = " (launch/prepare_corpus.py leaves such lines out and lists them)" if problem.line else ""
    raise ValueError(problem.describe() + hint)


def _file_texts(path: Path, text_field: str) -> Iterator[str | Problem]:
    """One raw file's documents in order, and a :class:`Problem` where something could not be read."""
    binary = sniff_binary(path)
    if binary is not None:
        yield Problem(str(path), "binary", f"{binary}, so the file was not read")
        return
    fmt = input_format(path)
    if fmt == XML:
        for item in iter_pubmed_records(path):
            if isinstance(item, Problem):
                yield item
            elif isinstance(item, Citation) and (item.title or item.abstract):
                yield item.document_text()
    elif fmt == JSONL:
        for item in iter_jsonl(path, text_field):
            yield item if isinstance(item, Problem) else item[1][text_field]
    else:
        for item in iter_lines(path):
            if isinstance(item, Problem):
                yield item
            elif item[1].strip():
                yield item[1]
