"""Turn text sources and BLURB-format datasets into *model inputs*: the units a model reads at once.

The vocabulary report (:mod:`tokenization.coverage`) measures how long inputs become under each
vocabulary, so it needs to know what one input is. For a pretraining corpus a model input is a
document; for a fine-tuning dataset it is what the BLURB task feeds the model at once (a sentence
for NER, an example for relation extraction, a sentence pair for BIOSSES, question + context for
question answering). Each file layout says what its model input is, and the report prints it.
(Pretraining's *instances*, :mod:`pretrain.instance_builder`, are another thing: the training
sequences it builds from a corpus's documents.)

Words
    A model input is a list of *words*: BERT pre-tokenization units, casing untouched, as
    :class:`tokenization.words.WordSplitter` makes them. Pre-tokenized datasets (NER, PICO) are
    re-split the same way, as BERT would.

Dataset files
    A dataset file is read by the reader of its layout (:mod:`tokenization.blurb_files`, the one set
    of readers fine-tuning uses too): ``token_tags``, ``token_pos_chunk_tag``, ``sentence_label_tsv``,
    ``relation_jsonl``, ``sentence_pair_tsv``, ``sentences_jsonl``, ``pqal_json``, ``yesno_tsv``,
    detected from the file's content or named by the user (the report calls a layout the file's
    *format*). Files are strict: a line that does not fit its layout raises
    :class:`DatasetFormatError` naming the file and the line, because a silently skipped line would
    make the report's numbers lie.

Corpus files
    Text, JSON Lines and PubMed XML files are read as strictly: a binary file, a line that is not
    UTF-8, a JSON line without its text field or a damaged XML record is an :class:`InputError`
    naming the file and the line (training a vocabulary and prepare_corpus skip and list them, which
    suits a model's text; here the numbers would silently leave them out). A prepared corpus is read
    as it is.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from biomed_lm.errors import InputError
from biomed_lm.resources import resolve_path, resolve_pattern
from biomed_lm.tokenization.blurb_files import DatasetFormatError  # noqa: F401  (where the report's callers catch it)
from biomed_lm.tokenization.blurb_files import FILE_LAYOUTS, detect_file_layout
from biomed_lm.tokenization.sources import (JSONL, XML, detect_format, is_pattern, is_prepared_corpus, iter_texts,
                                            strict)
from biomed_lm.tokenization.words import WordSplitter

CORPUS = "corpus"
DATASET = "dataset"

# Files in a dataset directory that are documentation, never data.
NON_DATA_PREFIXES = ("license", "readme", "copying", "notice", "citation")
NON_DATA_SUFFIXES = (".md", ".rst", ".html", ".pdf", ".py", ".sh", ".yaml", ".yml", ".cfg", ".ini")


# --------------------------------------------------------------------------------------- sources

@dataclass(frozen=True)
class DatasetFile:
    """A dataset file and its format: the name of its layout (:data:`tokenization.blurb_files.FILE_LAYOUTS`)."""

    path: str
    format: str


@dataclass(frozen=True)
class Source:
    """Where the report's model inputs come from: a corpus (documents) or a dataset (task inputs).

    ``files`` lists a dataset's files with their formats; ``skipped`` the files of a dataset
    directory that fit no format, or of a corpus folder whose suffix says no format (with why). A corpus
    is read by :func:`tokenization.sources.iter_texts`.
    """

    name: str
    kind: str
    path: str
    model_input: str  # what one model input is ("one sentence"), for the report
    files: tuple[DatasetFile, ...] = ()
    skipped: tuple[str, ...] = ()
    text_field: str = "text"

    def texts(self) -> Iterator[str]:
        """The text of each model input, in order."""
        if self.kind == CORPUS:
            try:
                yield from iter_texts(self.path, text_field=self.text_field, on_problem=strict)
            except (OSError, ValueError) as err:
                raise InputError(f"corpus {self.name!r}: {err}") from err
            return
        for item in self.files:
            yield from FILE_LAYOUTS[item.format].texts(Path(item.path))

    def inputs(self, texts: Iterable[str] | None = None) -> Iterator[list[str]]:
        """Each model input as its list of words (see the module docstring for what a word is); ``texts``
        are this source's texts when the caller has read them already."""
        split = WordSplitter()
        for text in self.texts() if texts is None else texts:
            yield split(text)


def _describe_corpus_input(path: str, text_field: str) -> str:
    if is_prepared_corpus(path):
        return f"one document (a row of the prepared corpus, column {text_field!r})"
    fmt = detect_format(path) if os.path.isfile(path) else None
    if fmt == XML:
        return "one PubMed citation (title + abstract)"
    if fmt == JSONL:
        return f"one document (a JSON Lines record's {text_field!r} field)"
    if fmt is None:
        return ("one document (a line of plain text, a JSON Lines record's "
                f"{text_field!r} field, or a PubMed citation's title + abstract)")
    return "one document (a line of plain text)"


def corpus_source(name: str, path: str | os.PathLike, text_field: str = "text") -> Source:
    """A pretraining corpus: a prepared corpus directory, text/JSONL/PubMed XML files, a directory of
    them or a glob pattern. Model input: a document."""
    spath = resolve_pattern(str(path)) if is_pattern(str(path)) else str(resolve_path(path))  # data/sample/...
    if is_pattern(spath):
        if not any(os.path.isfile(m) for m in glob.glob(spath, recursive=True)):
            raise InputError(f"corpus {name!r}: the pattern {spath} matches no file")
    elif not os.path.exists(spath):
        raise InputError(f"corpus {name!r}: no such file or directory: {spath}")
    return Source(name=name, kind=CORPUS, path=spath, model_input=_describe_corpus_input(spath, text_field),
                  text_field=text_field)


def _is_documentation(path: Path) -> bool:
    lowered = path.name.lower()
    return lowered.startswith(NON_DATA_PREFIXES) or lowered.endswith(NON_DATA_SUFFIXES)


def dataset_source(name: str, path: str | os.PathLike, fmt: str | None = None) -> Source:
    """A BLURB-format dataset file, or a directory meaning all its data files (recursively, sorted).

    ``fmt`` names a :data:`FILE_LAYOUTS` entry for every file; without it each file's format is
    detected from its content. In a directory, files that fit no format (a license, a ground-truth
    map) are skipped and listed; a single file that fits none is an error.
    """
    if fmt is not None and fmt not in FILE_LAYOUTS:
        raise InputError(f"dataset {name!r}: unknown format {fmt!r}; known formats: {', '.join(FILE_LAYOUTS)}")
    p = Path(path)
    if p.is_file():
        candidates = [p]
    elif p.is_dir():
        candidates = sorted(f for f in p.rglob("*") if f.is_file() and not f.name.startswith(".")
                            and not _is_documentation(f))
    else:
        raise InputError(f"dataset {name!r}: no such file or directory: {p}")
    files: list[DatasetFile] = []
    skipped: list[str] = []
    for candidate in candidates:
        detected = fmt or detect_file_layout(candidate)
        if detected is not None:
            files.append(DatasetFile(str(candidate), detected))
        elif p.is_file():
            raise InputError(f"dataset {name!r}: cannot tell the format of {candidate}; name it with "
                             f"--dataset-format {name}=FORMAT (one of: {', '.join(FILE_LAYOUTS)})")
        else:
            skipped.append(f"{candidate}: fits no dataset format")
    if not files:
        raise InputError(f"dataset {name!r}: no dataset file found in {p}"
                         + (f" (skipped: {'; '.join(skipped)})" if skipped else ""))
    formats = sorted({f.format for f in files})
    if len(formats) == 1:
        model_input = FILE_LAYOUTS[formats[0]].model_input
    else:
        model_input = "; ".join(f"{f} files: {FILE_LAYOUTS[f].model_input}" for f in formats)
    return Source(name=name, kind=DATASET, path=str(p), model_input=model_input,
                  files=tuple(files), skipped=tuple(skipped))
