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
from biomed_lm.tokenization.blurb_files import FILE_LAYOUTS, PQAL_JSON, DatasetFormatError, detect_file_layout
from biomed_lm.tokenization.sources import (JSONL, XML, Problem, detect_format, is_pattern, is_prepared_corpus,
                                            iter_lines, iter_texts, strict)
from biomed_lm.tokenization.words import WordSplitter

CORPUS = "corpus"
DATASET = "dataset"

# Files in a dataset directory that are documentation, never data.
NON_DATA_PREFIXES = ("license", "readme", "copying", "notice", "citation")
NON_DATA_SUFFIXES = (".md", ".rst", ".html", ".pdf", ".py", ".sh", ".yaml", ".yml", ".cfg", ".ini")
# A file named as one of these (or ending in _NAME: gad_blurb_train.tsv) is a data split: one that fits no
# layout is refused at its first bad line, never skipped (QA: a train.tsv with one bad line vanished).
SPLIT_NAMES = ("train", "dev", "devel", "test", "valid", "validation", "train_dev", "traindev")


# --------------------------------------------------------------------------------------- sources

@dataclass(frozen=True)
class DatasetFile:
    """A dataset file and its format: the name of its layout (:data:`tokenization.blurb_files.FILE_LAYOUTS`)."""

    path: str
    format: str


@dataclass(frozen=True)
class Source:
    """Where the report's model inputs come from: a corpus (documents) or a dataset (task inputs).

    ``files`` lists a dataset's files with their formats; ``skipped`` the files of a dataset directory
    that are not data (documentation, empty, fitting no format and not looking like data), or of a corpus
    folder whose suffix says no format (with why). A corpus
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


def looks_like_split(path: Path) -> bool:
    """Whether a file's name says it is a data split: ``train.tsv``, ``devel.tsv``, ``gad_blurb_test.tsv``,
    ``train_dev.tsv`` (BLURB's names, finetune.blurb), not ``test_ground_truth.json``."""
    stem = path.name.lower().split(".")[0]
    return any(stem == split or stem.endswith((f"_{split}", f"-{split}")) for split in SPLIT_NAMES)


@dataclass(frozen=True)
class LayoutFit:
    """How far a layout's reader gets through a file: the model inputs it read and its first error (None: the
    whole file fits)."""

    layout: str
    inputs: int
    error: DatasetFormatError | None

    def progress(self, first_line: int) -> int:
        """How much of the file the reader accepted before its first error: lines from the file's first line
        of content on, or for a whole-file JSON document (whose lines are not records) its entries read."""
        if self.layout == PQAL_JSON or self.error is None or self.error.line is None:
            return self.inputs
        return self.error.line - first_line


def layout_fit(path: Path, layout: str) -> LayoutFit:
    """Read ``path`` with ``layout``'s reader up to its first bad line."""
    inputs = 0
    try:
        for _ in FILE_LAYOUTS[layout].texts(path):
            inputs += 1
    except DatasetFormatError as err:
        return LayoutFit(layout, inputs, err)
    return LayoutFit(layout, inputs, None)


def nearest_fit(path: Path, layouts: Iterable[str]) -> LayoutFit | None:
    """Of ``layouts``, one that reads the whole file, else the one whose reader gets furthest before its first
    error (the first such in ``layouts`` order), or None when every reader stops at once."""
    first_line = next((item[0] for item in iter_lines(path) if not isinstance(item, Problem) and item[1].strip()), 1)
    fits = [layout_fit(path, layout) for layout in layouts]
    whole = [fit for fit in fits if fit.error is None]
    if whole:
        return whole[0]
    fits = [fit for fit in fits if fit.progress(first_line) > 0]
    return max(fits, key=lambda fit: fit.progress(first_line), default=None)


def _refusal(fit: LayoutFit, why: str, what_to_do: str) -> DatasetFormatError:
    """The first bad line of a file that ``fit`` says is data in its layout, with why it is read so."""
    err = fit.error
    return DatasetFormatError(err.path, err.line, f"{err.message}; {why}: {what_to_do}", err.field)


def _undetected_file(name: str, path: Path, folder_layouts: set[str]) -> DatasetFile | None:
    """A file of a dataset folder whose first lines fit no layout: read with the layout of the folder's other
    files when that reads it whole, refused at its first bad line when it looks like data (a split's name, or
    that layout fits its start), None (skipped) when it is clearly not data (a ground-truth map)."""
    fit = nearest_fit(path, sorted(folder_layouts))
    if fit is not None and fit.error is None:
        return DatasetFile(str(path), fit.layout)
    siblings = " and ".join(sorted(folder_layouts))
    not_data = f"fix the line (or move the file out of {path.parent} if it is not data)"
    if fit is not None:
        raise _refusal(fit, f"the folder's other files are {siblings}, and this file's lines before this one "
                            f"fit {fit.layout} too", not_data)
    if not looks_like_split(path):
        return None
    fit = nearest_fit(path, FILE_LAYOUTS)
    if fit is not None and fit.error is not None:
        raise _refusal(fit, f"the file's name says it is a data split, and its lines before this one fit "
                            f"{fit.layout}", not_data)
    raise DatasetFormatError(path, None, f"its name says it is a data split, but its first lines fit no dataset "
                             f"format{f' (the folder holds {siblings} files)' if siblings else ''}: name its format "
                             f"with --dataset-format {name}=FORMAT (one of: {', '.join(FILE_LAYOUTS)})")


def _undetected_single_file(name: str, path: Path) -> InputError:
    """Why a dataset given as one file that fits no layout is refused: its first bad line where a layout fits
    its start, else that its format cannot be told."""
    fit = nearest_fit(path, FILE_LAYOUTS)
    if fit is not None and fit.error is not None:
        return _refusal(fit, f"its lines before this one fit {fit.layout}, so its format could not be detected",
                        f"fix the line, or name the format with --dataset-format {name}=FORMAT if it is another")
    return InputError(f"dataset {name!r}: cannot tell the format of {path}; name it with "
                      f"--dataset-format {name}=FORMAT (one of: {', '.join(FILE_LAYOUTS)})")


def _is_empty(path: Path) -> bool:
    """True for a file without a line of content (undecodable lines count as content: they are named later)."""
    return not any(isinstance(item, Problem) or item[1].strip() for item in iter_lines(path))


def _folder_files(name: str, folder: Path, fmt: str | None) -> tuple[list[DatasetFile], list[str]]:
    """A dataset folder's data files (recursively, sorted) with their formats, and what was skipped and why:
    documentation by its name, empty files, and a file that fits no layout and does not look like data."""
    files: list[DatasetFile] = []
    skipped: list[str] = []
    undetected: list[Path] = []
    for candidate in sorted(f for f in folder.rglob("*") if f.is_file() and not f.name.startswith(".")):
        if _is_documentation(candidate):
            skipped.append(f"{candidate}: documentation, not data")
        elif _is_empty(candidate):
            skipped.append(f"{candidate}: empty")
        elif (layout := fmt or detect_file_layout(candidate)) is not None:
            files.append(DatasetFile(str(candidate), layout))
        else:
            undetected.append(candidate)
    folder_layouts = {item.format for item in files}
    for candidate in undetected:  # judged against the layouts of all the others
        found = _undetected_file(name, candidate, folder_layouts)
        if found is None:
            skipped.append(f"{candidate}: fits no dataset format and does not look like data")
        else:
            files.append(found)
    return sorted(files, key=lambda item: item.path), skipped


def dataset_source(name: str, path: str | os.PathLike, fmt: str | None = None) -> Source:
    """A BLURB-format dataset file, or a directory meaning all its data files (recursively, sorted).

    ``fmt`` names a :data:`FILE_LAYOUTS` entry for every file; without it each file's format is
    detected from its content. In a directory, documentation (a licence, a README) and files that fit
    no format and do not look like data (a ground-truth map) are skipped and listed; a file that looks
    like data (a split's name, or the start of the other files' layout) but has a bad line is refused
    naming that line, as is a single file that fits none.
    """
    if fmt is not None and fmt not in FILE_LAYOUTS:
        raise InputError(f"dataset {name!r}: unknown format {fmt!r}; known formats: {', '.join(FILE_LAYOUTS)}")
    p = Path(path)
    if p.is_file():
        layout = fmt or detect_file_layout(p)
        if layout is None:
            raise _undetected_single_file(name, p)
        files, skipped = [DatasetFile(str(p), layout)], []
    elif p.is_dir():
        files, skipped = _folder_files(name, p, fmt)
    else:
        raise InputError(f"dataset {name!r}: no such file or directory: {p}")
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
