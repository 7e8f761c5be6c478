"""Turn text sources and BLURB-format datasets into *instances*: the units a model reads.

The vocabulary report (:mod:`tokenization.coverage`) measures how long inputs become under each
vocabulary, so it needs to know what one input is. For a pretraining corpus an instance is a
document; for a fine-tuning dataset it is what the BLURB task feeds the model at once (a sentence
for NER, an example for relation extraction, a sentence pair for BIOSSES, question + context for
question answering). Each dataset format below says what its instance is, and the report prints it.

Words
    An instance is a list of *words*: BERT pre-tokenization units, casing untouched, as
    :class:`tokenization.words.WordSplitter` makes them. Pre-tokenized datasets (NER, PICO) are
    re-split the same way, as BERT would.

Dataset formats (``DATASET_FORMATS``; detected from the file content, or named by the user)
    ``ner``       ``token<TAB>tag``, a blank line between sentences (NCBI-disease, BC5CDR, JNLPBA, ...)
    ``pico``      CoNLL-like ``token POS O tag`` with ``-DOCSTART- (PMID)`` lines (EBM-NLP)
    ``gad``       ``sentence<TAB>label``, entities dummified, optional header (GAD; ChemProt as TSV)
    ``ddi``       JSON Lines with a ``masked`` (or ``text``/``sentence``) field (DDI; ChemProt as JSONL)
    ``biosses``   TSV with a header naming ``sentence1`` and ``sentence2`` (BLUE split or biosses_all)
    ``hoc``       JSON Lines with a ``sentences`` list (Hallmarks of Cancer)
    ``pubmedqa``  ``ori_pqal.json``: PMID -> {QUESTION, CONTEXTS, ...}
    ``bioasq``    ``label<TAB>question<TAB>ideal_answer``, optional header (BioASQ yes/no stand-in)

Dataset files are strict: a line that does not fit its format raises :class:`DatasetFormatError`
naming the file and the line, because a silently skipped line would make the report's numbers lie.
"""

from __future__ import annotations

import csv
import glob
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Callable, Iterable, Iterator, Mapping

from biomed_lm.errors import InputError  # noqa: F401  (re-exported: readers and scripts import it from here)
from biomed_lm.finetune.blurb import (LAYOUT_EBM_NLP, LAYOUT_PQAL_JSON, LAYOUT_RELATION_JSONL, LAYOUT_SENTENCE_LABEL_TSV,
                                      LAYOUT_SENTENCE_PAIR_TSV, LAYOUT_SENTENCES_JSONL, LAYOUT_TOKEN_TAGS,
                                      LAYOUT_YESNO_TSV)
from biomed_lm.tokenization.sources import (JSONL, XML, Problem, detect_format, is_prepared_corpus, iter_lines,
                                            iter_texts)
from biomed_lm.tokenization.words import WordSplitter

CORPUS = "corpus"
DATASET = "dataset"

# Files in a dataset directory that are documentation, never data.
NON_DATA_PREFIXES = ("license", "readme", "copying", "notice", "citation")
NON_DATA_SUFFIXES = (".md", ".rst", ".html", ".pdf", ".py", ".sh", ".yaml", ".yml", ".cfg", ".ini")
DETECTION_PEEK_LINES = 40  # non-blank lines a format is judged on


class DatasetFormatError(InputError):
    """A dataset file whose content does not fit its format, with the file and line."""

    def __init__(self, path: str | os.PathLike, line: int | None, message: str):
        self.path = str(path)
        self.line = line
        where = self.path if line is None else f"{self.path}, line {line}"
        super().__init__(f"{where}: {message}")


# ----------------------------------------------------------------------------- dataset readers

def numbered_lines(path: Path, error: type[DatasetFormatError] | None = None) -> Iterator[tuple[int, str]]:
    """``(line_number, line)`` of a UTF-8 (optionally gzipped) file, ``\\r\\n`` and a leading byte-order
    mark removed; undecodable content raises ``error`` (a :class:`DatasetFormatError` class) naming the line."""
    error = error or DatasetFormatError
    for item in iter_lines(path):
        if isinstance(item, Problem):
            raise error(path, item.line, f"{item.reason}: {item.message}")
        line_no, line = item
        yield line_no, (line[1:] if line_no == 1 and line.startswith("\ufeff") else line)


def json_lines(path: Path, error: type[DatasetFormatError] | None = None) -> Iterator[tuple[int, dict]]:
    """``(line_number, object)`` for each non-blank line of a JSON Lines file; a line that is not a JSON
    object raises ``error`` naming the file and line."""
    error = error or DatasetFormatError
    for line_no, line in numbered_lines(path, error):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise error(path, line_no, f"not valid JSON: {err.msg} at column {err.colno}") from None
        if not isinstance(record, dict):
            raise error(path, line_no, f"expected a JSON object, got {type(record).__name__}")
        yield line_no, record


def _tsv_header(fields: list[str], wanted: Iterable[str]) -> dict[str, int] | None:
    """Column positions of ``wanted`` names if ``fields`` is a header row naming all of them."""
    lowered = [f.strip().lower() for f in fields]
    if all(name in lowered for name in wanted):
        return {name: lowered.index(name) for name in lowered}
    return None


def _read_token_lines(path: Path, separator: str | None, width: int, layout: str) -> Iterator[str]:
    """One token per line (its first field); a blank line or ``-DOCSTART-`` ends a sentence."""
    tokens: list[str] = []
    for line_no, line in numbered_lines(path):
        if not line.strip() or line.startswith("-DOCSTART-"):
            if tokens:
                yield " ".join(tokens)
                tokens = []
            continue
        fields = line.split(separator)
        if len(fields) != width or not fields[0].strip():
            raise DatasetFormatError(path, line_no, f"expected '{layout}' ({width} fields), got "
                                     f"{len(fields)}: {line[:80]!r}")
        tokens.append(fields[0])
    if tokens:
        yield " ".join(tokens)


def read_ner(path: Path) -> Iterator[str]:
    """``token<TAB>tag`` lines; a blank line (or ``-DOCSTART-``) ends a sentence. Instance: a sentence."""
    return _read_token_lines(path, "\t", 2, "token<TAB>tag")


def read_pico(path: Path) -> Iterator[str]:
    """``token POS O tag`` lines, abstracts opened by ``-DOCSTART- (PMID)``, blank lines between
    sentences. Instance: a sentence (the unit of the paper's Table 8, 30.7 BERT pieces on average)."""
    return _read_token_lines(path, None, 4, "token POS O tag")


def read_gad(path: Path) -> Iterator[str]:
    """``sentence<TAB>label`` (or any TSV whose header names a ``sentence`` column). Instance: an example."""
    column, width = 0, 2
    for line_no, line in numbered_lines(path):
        if not line.strip():
            continue
        fields = line.split("\t")
        if line_no == 1:
            header = _tsv_header(fields, ["sentence"])
            if header is not None:
                column, width = header["sentence"], len(fields)
                continue
        if len(fields) != width or not fields[column].strip():
            raise DatasetFormatError(path, line_no, f"expected {width} tab-separated fields with a "
                                     f"sentence in field {column + 1}, got {len(fields)}: {line[:80]!r}")
        yield fields[column]


def read_bioasq(path: Path) -> Iterator[str]:
    """``label<TAB>question<TAB>ideal_answer``, optional header. Instance: question + answer text."""
    question, context, width = 1, 2, 3
    for line_no, line in numbered_lines(path):
        if not line.strip():
            continue
        fields = line.split("\t")
        if line_no == 1:
            header = _tsv_header(fields, ["question"])
            if header is not None:
                named = [c for c in ("ideal_answer", "answer", "context", "passage", "text") if c in header]
                if not named:
                    raise DatasetFormatError(path, line_no, "the header names a 'question' column but no "
                                             "'ideal_answer', 'answer', 'context', 'passage' or 'text' column")
                question, context, width = header["question"], header[named[0]], len(fields)
                continue
        if len(fields) != width:
            raise DatasetFormatError(path, line_no, f"expected {width} tab-separated fields "
                                     f"(label, question, ideal_answer), got {len(fields)}: {line[:80]!r}")
        yield f"{fields[question]}\n{fields[context]}"


def read_biosses(path: Path) -> Iterator[str]:
    """A TSV whose header names ``sentence1`` and ``sentence2`` (fields may be quoted). Instance: the pair."""
    lines = (text + "\n" for _, text in numbered_lines(path))
    reader = csv.reader(lines, delimiter="\t")
    header_row = next(reader, None)
    header = _tsv_header(header_row or [], ["sentence1", "sentence2"])
    if header is None:
        raise DatasetFormatError(path, 1, "expected a header row naming 'sentence1' and 'sentence2'")
    width = len(header_row)
    for row in reader:
        if not any(f.strip() for f in row):
            continue
        if len(row) != width:
            raise DatasetFormatError(path, reader.line_num, f"expected {width} tab-separated fields "
                                     f"as in the header, got {len(row)}")
        yield f"{row[header['sentence1']]}\n{row[header['sentence2']]}"


def read_ddi(path: Path) -> Iterator[str]:
    """JSON Lines; the ``masked`` sentence (entities dummified, what BLURB feeds the model), else
    ``text`` or ``sentence``. Instance: an example (one entity pair)."""
    for line_no, record in json_lines(path):
        text = next((record[k] for k in ("masked", "text", "sentence") if isinstance(record.get(k), str)), None)
        if text is None:
            raise DatasetFormatError(path, line_no, "no string field 'masked', 'text' or 'sentence' "
                                     f"(fields present: {', '.join(sorted(record)) or 'none'})")
        yield text


def read_hoc(path: Path) -> Iterator[str]:
    """JSON Lines with a ``sentences`` list. Instance: a sentence (the unit of the paper's Table 8,
    40.6 BERT pieces on average; hallmark labels are annotated per sentence)."""
    for line_no, record in json_lines(path):
        sentences = record.get("sentences")
        if not isinstance(sentences, list) or not all(isinstance(s, str) for s in sentences):
            raise DatasetFormatError(path, line_no, "expected a 'sentences' field holding a list of strings")
        yield from (s for s in sentences if s.strip())


def read_pubmedqa(path: Path) -> Iterator[str]:
    """``ori_pqal.json``: an object mapping PMIDs to {QUESTION, CONTEXTS}. Instance: question + contexts."""
    text = "\n".join(line for _, line in numbered_lines(path))
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise DatasetFormatError(path, err.lineno, f"not valid JSON: {err.msg} at column {err.colno}") from None
    if not isinstance(data, dict):
        raise DatasetFormatError(path, None, "expected a JSON object mapping PMIDs to questions")
    for key, entry in data.items():
        question = entry.get("QUESTION") if isinstance(entry, dict) else None
        contexts = entry.get("CONTEXTS") if isinstance(entry, dict) else None
        if not isinstance(question, str) or not isinstance(contexts, list) \
                or not all(isinstance(c, str) for c in contexts):
            raise DatasetFormatError(path, None, f"entry {key!r}: expected a string 'QUESTION' and a "
                                     "list of strings 'CONTEXTS'")
        yield "\n".join([question, *contexts])


@dataclass(frozen=True)
class DatasetFormat:
    """A dataset file layout: its name, what a file looks like, what one instance is, its reader."""

    name: str
    layout: str
    instance: str
    reader: Callable[[Path], Iterator[str]] = field(repr=False, compare=False)


DATASET_FORMATS: Mapping[str, DatasetFormat] = MappingProxyType({f.name: f for f in (
    DatasetFormat(LAYOUT_TOKEN_TAGS, "token<TAB>tag, blank line between sentences", "one sentence", read_ner),
    DatasetFormat(LAYOUT_EBM_NLP, "token POS O tag, -DOCSTART- (PMID) per abstract", "one sentence", read_pico),
    DatasetFormat(LAYOUT_SENTENCE_LABEL_TSV, "sentence<TAB>label (optional header)",
                  "one example: a sentence with its entity pair dummified", read_gad),
    DatasetFormat(LAYOUT_RELATION_JSONL, "JSON Lines with a masked/text/sentence field",
                  "one example: the masked sentence of one entity pair", read_ddi),
    DatasetFormat(LAYOUT_SENTENCE_PAIR_TSV, "TSV with sentence1/sentence2 columns",
                  "one sentence pair (sentence1 + sentence2)",
                  read_biosses),
    DatasetFormat(LAYOUT_SENTENCES_JSONL, "JSON Lines with a sentences list", "one sentence", read_hoc),
    DatasetFormat(LAYOUT_PQAL_JSON, "JSON object PMID -> {QUESTION, CONTEXTS}", "one question + all its contexts",
                  read_pubmedqa),
    DatasetFormat(LAYOUT_YESNO_TSV, "label<TAB>question<TAB>ideal_answer (optional header)",
                  "one question + its ideal answer (the stand-in's context)", read_bioasq),
)})


# ------------------------------------------------------------------------------ format detection

def _peek_lines(path: Path) -> list[str]:
    """The first non-blank lines of a file (undecodable lines are left out: detection only)."""
    lines: list[str] = []
    for item in iter_lines(path):
        if isinstance(item, Problem):
            continue
        if item[1].strip():
            lines.append(item[1])
            if len(lines) == DETECTION_PEEK_LINES:
                break
    return lines


def _detect_json(lines: list[str]) -> str | None:
    try:
        record = json.loads(lines[0])
    except json.JSONDecodeError:
        record = None
    if isinstance(record, dict):
        if isinstance(record.get("sentences"), list):
            return LAYOUT_SENTENCES_JSONL
        if isinstance(record.get("masked"), str) or (isinstance(record.get("sentence"), str) and "label" in record):
            return LAYOUT_RELATION_JSONL
        first_value = next(iter(record.values()), None)
        if isinstance(first_value, dict) and "QUESTION" in first_value:
            return LAYOUT_PQAL_JSON
        return None
    # A pretty-printed JSON document: PubMedQA if its first entry has a question.
    head = "\n".join(lines)
    return LAYOUT_PQAL_JSON if '"QUESTION"' in head else None


def detect_dataset_format(path: str | os.PathLike) -> str | None:
    """The :data:`DATASET_FORMATS` name that fits the file's first lines, or None if none does."""
    content = _peek_lines(Path(path))
    if not content:
        return None
    first = content[0]
    if first.lstrip().startswith("{"):
        return _detect_json(content)
    if first.startswith("-DOCSTART-"):
        body = next((line for line in content if not line.startswith("-DOCSTART-")), None)
        if body is None:
            return None
        return LAYOUT_TOKEN_TAGS if len(body.split("\t")) == 2 else LAYOUT_EBM_NLP if len(body.split()) == 4 else None
    fields = first.split("\t")
    if _tsv_header(fields, ["sentence1", "sentence2"]) is not None:
        return LAYOUT_SENTENCE_PAIR_TSV
    if _tsv_header(fields, ["question"]) is not None:
        return LAYOUT_YESNO_TSV
    if _tsv_header(fields, ["sentence"]) is not None:
        return LAYOUT_SENTENCE_LABEL_TSV
    if all(len(line.split("\t")) == 2 for line in content):
        # NER tokens hold no spaces; GAD's first field is a whole sentence.
        sentences = sum(" " in line.split("\t")[0].strip() for line in content)
        return LAYOUT_SENTENCE_LABEL_TSV if sentences > len(content) // 2 else LAYOUT_TOKEN_TAGS
    if all(len(line.split("\t")) == 3 for line in content) \
            and all(line.split("\t")[0].strip().lower() in ("0", "1", "yes", "no") for line in content):
        return LAYOUT_YESNO_TSV
    if all(len(line.split()) == 4 and "\t" not in line for line in content):
        return LAYOUT_EBM_NLP
    return None


# --------------------------------------------------------------------------------------- sources

@dataclass(frozen=True)
class DatasetFile:
    path: str
    format: str


@dataclass(frozen=True)
class Source:
    """Where the report's instances come from: a corpus (documents) or a dataset (task inputs).

    ``files`` lists a dataset's files with their formats; ``skipped`` the files of a dataset
    directory that fit no format (with why). A corpus is read by :func:`tokenization.sources.iter_texts`.
    """

    name: str
    kind: str
    path: str
    instance: str
    files: tuple[DatasetFile, ...] = ()
    skipped: tuple[str, ...] = ()
    text_field: str = "text"

    def texts(self) -> Iterator[str]:
        """The text of each instance, in order."""
        if self.kind == CORPUS:
            try:
                yield from iter_texts(self.path, text_field=self.text_field)
            except (OSError, ValueError) as err:
                raise InputError(f"corpus {self.name!r}: {err}") from err
            return
        for item in self.files:
            yield from DATASET_FORMATS[item.format].reader(Path(item.path))

    def instances(self) -> Iterator[list[str]]:
        """Each instance as its list of words (see the module docstring for what a word is)."""
        split = WordSplitter()
        for text in self.texts():
            yield split(text)


def _describe_corpus_instance(path: str, text_field: str) -> str:
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
    them or a glob pattern. Instance: a document."""
    spath = str(path)
    if any(ch in spath for ch in "*?["):
        if not any(os.path.isfile(m) for m in glob.glob(spath, recursive=True)):
            raise InputError(f"corpus {name!r}: the pattern {spath} matches no file")
    elif not os.path.exists(spath):
        raise InputError(f"corpus {name!r}: no such file or directory: {spath}")
    return Source(name=name, kind=CORPUS, path=spath, instance=_describe_corpus_instance(spath, text_field),
                  text_field=text_field)


def _is_documentation(path: Path) -> bool:
    lowered = path.name.lower()
    return lowered.startswith(NON_DATA_PREFIXES) or lowered.endswith(NON_DATA_SUFFIXES)


def dataset_source(name: str, path: str | os.PathLike, fmt: str | None = None) -> Source:
    """A BLURB-format dataset file, or a directory meaning all its data files (recursively, sorted).

    ``fmt`` names a :data:`DATASET_FORMATS` entry for every file; without it each file's format is
    detected from its content. In a directory, files that fit no format (a license, a ground-truth
    map) are skipped and listed; a single file that fits none is an error.
    """
    if fmt is not None and fmt not in DATASET_FORMATS:
        raise InputError(f"dataset {name!r}: unknown format {fmt!r}; known formats: {', '.join(DATASET_FORMATS)}")
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
        detected = fmt or detect_dataset_format(candidate)
        if detected is not None:
            files.append(DatasetFile(str(candidate), detected))
        elif p.is_file():
            raise InputError(f"dataset {name!r}: cannot tell the format of {candidate}; name it with "
                             f"--dataset-format {name}=FORMAT (one of: {', '.join(DATASET_FORMATS)})")
        else:
            skipped.append(f"{candidate}: fits no dataset format")
    if not files:
        raise InputError(f"dataset {name!r}: no dataset file found in {p}"
                         + (f" (skipped: {'; '.join(skipped)})" if skipped else ""))
    formats = sorted({f.format for f in files})
    if len(formats) == 1:
        instance = DATASET_FORMATS[formats[0]].instance
    else:
        instance = "; ".join(f"{f} files: {DATASET_FORMATS[f].instance}" for f in formats)
    return Source(name=name, kind=DATASET, path=str(p), instance=instance,
                  files=tuple(files), skipped=tuple(skipped))
