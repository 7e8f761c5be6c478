"""A vocabulary build's word counts on disk, so the reading pass runs once per corpus.

Counting is the part of a build that reads the corpus: hours on the full PubMed baseline, where the
trainer then takes minutes. ``build_vocab`` writes the counts into its output directory
(:data:`WORD_COUNTS_FILE`) as soon as they are complete, before training, and a rerun of the same
command (after a crash, a full disk or a kill in the trainer) takes them from there instead of reading
again. ``--word-counts-from FILE`` takes another build's counts: a vocabulary-size ablation reads the
corpus once. Counts are reused only for the same input files (path, size, modification time), the
same counter (the format's) and the same counting options; otherwise the file is recounted (its own
directory) or refused, naming what differs (a file given by name).

The file is gzip text: a first line ``#`` + JSON (the key and the reading's statistics), then one
``word<TAB>count`` line per word in the counter's order, so a build from reused counts trains on
exactly what a fresh count gives (the same vocabulary, byte for byte).
"""

from __future__ import annotations

import gzip
import io
import json
import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from biomed_lm.atomic_files import partial_path, replaced_when_done
from biomed_lm.errors import TokenizationError
from biomed_lm.finished_output import changed_files, setting_change_lines

logger = logging.getLogger(__name__)

WORD_COUNTS_FILE = "word_counts.tsv.gz"
FORMAT_VERSION = 1


class WordCountsError(TokenizationError, ValueError):
    """A word-counts file that cannot be used for this build (named, with what differs)."""


@dataclass(frozen=True)
class CountedCorpus:
    """What one reading pass gives a build: the counts and the reading's statistics."""

    counts: Counter[str]
    documents: int
    text_bytes: int
    word_pruning: dict[str, Any] | None  # WordPruning's fields, or None when the table was not bounded
    skipped_records: tuple[str, ...]


def counting_key(*, counter: str, lowercase: bool, max_distinct_words: int | None, text_field: str,
                 input_files: list[dict[str, Any]]) -> dict[str, Any]:
    """Everything that decides the counts: the counter (``bert`` words or whitespace ``chunk``\\ s), its
    options, the text field read and the input files' identities (:func:`vocab.inputs_identity`)."""
    return {"counter": counter, "lowercase": lowercase, "max_distinct_words": max_distinct_words,
            "text_field": text_field, "input_files": input_files}


def save_counts(path: Path, key: Mapping[str, Any], corpus: CountedCorpus) -> None:
    """Write ``corpus`` under ``key`` to ``path`` atomically (a temporary file renamed over it)."""
    header = {"version": FORMAT_VERSION, "key": dict(key), "documents": corpus.documents,
              "text_bytes": corpus.text_bytes, "word_pruning": corpus.word_pruning,
              "skipped_records": list(corpus.skipped_records)}
    # Level 1: the file is written once per corpus and read back at once; level 6 triples the write time.
    # No time stamp in the gzip header: the same counts give the same bytes. The partial file is hidden:
    # tokenizer loaders scanning the folder pass over it.
    with replaced_when_done(path, hidden=True) as partial, open(partial, "wb") as raw, \
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=1, mtime=0) as packed, \
            io.TextIOWrapper(packed, encoding="utf-8", newline="\n") as out:
        out.write("#" + json.dumps(header) + "\n")
        out.writelines(f"{word}\t{n}\n" for word, n in corpus.counts.items())
    logger.info("saved the counts of %d distinct words to %s", len(corpus.counts), path)


def partial_name(name: str) -> str:
    """The file a save writes before it is renamed into place."""
    return partial_path(name, hidden=True).name


def differences(path: Path, key: Mapping[str, Any]) -> list[str] | None:
    """Why the counts in ``path`` are not this build's (one line each; empty: they are), or None when there is
    no readable counts file there."""
    header = _header(path)
    if header is None:
        return None
    recorded = header.get("key", {})
    settings = {name: value for name, value in key.items() if name != "input_files"}
    return (setting_change_lines(recorded, settings, "word counts")
            + changed_files(recorded.get("input_files", []), key["input_files"], "inputs"))


def load_counts(path: Path) -> CountedCorpus:
    """The counts in ``path``; :class:`WordCountsError` naming the file and line for a damaged one."""
    header = _header(path)
    if header is None:
        raise WordCountsError(f"{path}: not a word-counts file of this toolkit (its first line is not the header)")
    counts: Counter[str] = Counter()
    number = 1
    try:
        with gzip.open(path, "rt", encoding="utf-8", newline="\n") as lines:
            next(lines)
            for number, line in enumerate(lines, start=2):
                word, tab, n = line.rstrip("\n").rpartition("\t")
                if not tab or not word or not n.isdigit():
                    raise WordCountsError(f"{path}, line {number}: expected 'word<TAB>count', got {line[:80]!r}")
                counts[word] = int(n)
    except (OSError, EOFError, UnicodeDecodeError) as err:  # cut short, a bad CRC: damage, not a file-system error
        raise WordCountsError(f"{path}: damaged after line {number} ({type(err).__name__}: {err})") from err
    return CountedCorpus(counts=counts, documents=header["documents"], text_bytes=header["text_bytes"],
                         word_pruning=header.get("word_pruning"),
                         skipped_records=tuple(header.get("skipped_records", ())))


def _header(path: Path) -> dict[str, Any] | None:
    try:
        with gzip.open(path, "rt", encoding="utf-8", newline="\n") as lines:
            first = lines.readline()
    except (OSError, EOFError, UnicodeDecodeError):
        return None
    if not first.startswith("#"):
        return None
    try:
        header = json.loads(first[1:])
    except ValueError:
        return None
    return header if isinstance(header, dict) and header.get("version") == FORMAT_VERSION else None
