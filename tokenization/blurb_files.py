"""BLURB's dataset files: the eight layouts its datasets are distributed in, and one reader per layout.

Why here. Two stages read these files: the coverage report (:mod:`tokenization.model_inputs`) wants the
texts a model would read, and fine-tuning (:mod:`finetune.readers`) wants typed examples with their
labels, splits and entities. Both read a file of a given layout with the one reader here, so the two
can never disagree on what a file holds. Tokenization is the lowest layer both stages import (and it
already reads text files: :mod:`tokenization.sources`), so the layouts live here and tokenization
imports nothing from fine-tuning. What a file *means* for a dataset (its label set, entity types,
splits, which layouts its files use) is the fine-tuning registry's, :mod:`finetune.blurb`, which
imports the layout names from this module.

A reader checks the layout: columns, header, JSON structure, non-empty tokens. It yields records with
the line each starts on, and its consumer checks the values (labels, tags, placeholders, scores) record
by record as they come, so an error names the first bad line of the file either way. Files are strict:
a line that does not fit raises :class:`DatasetFormatError` naming the file, the line and the field,
because a silently skipped line would make the coverage numbers and the benchmark scores lie.

Layouts (:data:`FILE_LAYOUTS`; a name says the shape of the file, not a dataset that uses it)
    ``token_tags``           ``token<TAB>tag``, a blank line between sentences, ``-DOCSTART-`` lines
                             between documents (BLURB's NER datasets)
    ``token_pos_chunk_tag``  CoNLL-like ``token POS O tag``, ``-DOCSTART- (PMID)`` per abstract (EBM-NLP)
    ``sentence_label_tsv``   ``sentence<TAB>label`` (or ``id<TAB>sentence<TAB>label``), the entity pair
                             already dummified, optional header
    ``relation_jsonl``       JSON Lines, one entity pair each: the (masked) sentence, the entities, the label
    ``sentence_pair_tsv``    TSV with ``sentence1``, ``sentence2`` and ``score`` columns (fields may be quoted)
    ``sentences_jsonl``      JSON Lines with a ``sentences`` list (one abstract each)
    ``pqal_json``            one JSON object: PMID -> {QUESTION, CONTEXTS, final_decision, ...}
    ``yesno_tsv``            ``label<TAB>question<TAB>context``, optional header
"""

from __future__ import annotations

import csv
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Callable, Iterable, Iterator, Mapping, Sequence

from biomed_lm.errors import InputError
from biomed_lm.tokenization.sources import Problem, iter_lines, json_error_words

__all__ = [
    "TOKEN_TAGS", "TOKEN_POS_CHUNK_TAG", "SENTENCE_LABEL_TSV", "RELATION_JSONL", "SENTENCE_PAIR_TSV",
    "SENTENCES_JSONL", "PQAL_JSON", "YESNO_TSV", "DatasetFormatError", "FieldError", "numbered_lines",
    "json_lines", "json_document", "key_lines", "plain_tsv_rows", "quoted_tsv_rows", "string_field", "string_list",
    "TokenSentence", "token_tag_fields", "token_pos_chunk_tag_fields", "read_token_sentences", "SentenceLabelRow",
    "read_sentence_label_tsv", "read_relation_jsonl", "RELATION_INPUT_FIELDS", "relation_input_text",
    "SentencePairRow", "read_sentence_pair_tsv", "read_sentences_jsonl", "PqalEntry", "read_pqal_json", "YesNoRow",
    "read_yesno_tsv", "FileLayout", "FILE_LAYOUTS", "detect_file_layout",
]

TOKEN_TAGS = "token_tags"
TOKEN_POS_CHUNK_TAG = "token_pos_chunk_tag"
SENTENCE_LABEL_TSV = "sentence_label_tsv"
RELATION_JSONL = "relation_jsonl"
SENTENCE_PAIR_TSV = "sentence_pair_tsv"
SENTENCES_JSONL = "sentences_jsonl"
PQAL_JSON = "pqal_json"
YESNO_TSV = "yesno_tsv"

DOCSTART = "-DOCSTART-"
DETECTION_PEEK_LINES = 40  # non-blank lines a layout is judged on


# ------------------------------------------------------------------------------------------ errors

class DatasetFormatError(InputError):
    """A dataset file whose content does not fit its layout: the file, the line and the field.

    ``line`` is None for whole-file problems (an empty split); ``field`` names the offending column
    or JSON key when there is one."""

    def __init__(self, path: str | os.PathLike, line: int | None, message: str, field: str | None = None):
        self.path = str(path)
        self.line = line
        self.field = field
        self.message = message  # without the file and line, for a caller that says more about them
        where = self.path if line is None else f"{self.path}, line {line}"
        super().__init__(f"{where}: {message if field is None else f'field {field!r}: {message}'}")


class FieldError(Exception):
    """A bad value, raised where a field is parsed and turned into a :class:`DatasetFormatError` by the
    reader that knows the file and the line (:meth:`at`)."""

    def __init__(self, field_name: str | None, message: str):
        super().__init__(message)
        self.field = field_name
        self.message = message

    def at(self, path: Path, line: int | None) -> DatasetFormatError:
        return DatasetFormatError(path, line, self.message, self.field)


# ------------------------------------------------------------------------------ lines and fields

def numbered_lines(path: Path) -> Iterator[tuple[int, str]]:
    """``(line_number, line)`` of a UTF-8 (optionally gzipped) file, ``\\r\\n`` and a leading byte-order
    mark removed; undecodable content raises :class:`DatasetFormatError` naming the line."""
    for item in iter_lines(path):
        if isinstance(item, Problem):
            raise DatasetFormatError(path, item.line, f"{item.reason}: {item.message}")
        line_no, line = item
        yield line_no, (line[1:] if line_no == 1 and line.startswith("\ufeff") else line)


def json_lines(path: Path) -> Iterator[tuple[int, dict]]:
    """``(line_number, object)`` for each non-blank line of a JSON Lines file; a line that is not a JSON
    object raises :class:`DatasetFormatError` naming the file and line."""
    for line_no, line in numbered_lines(path):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise DatasetFormatError(path, line_no, f"not valid JSON: {json_error_words(err)}"
                                     f"{_one_object_per_line(line)}") from None
        if not isinstance(record, dict):
            raise DatasetFormatError(path, line_no, f"expected a JSON object, got {type(record).__name__}"
                                     f"{_one_object_per_line(line)}")
        yield line_no, record


def json_document(path: Path) -> tuple[object, list[str]]:
    """A whole-file JSON document and its lines (to point errors at an entry's line)."""
    lines = [line for _, line in numbered_lines(path)]
    try:
        return json.loads("\n".join(lines)), lines
    except json.JSONDecodeError as err:
        raise DatasetFormatError(path, err.lineno, f"not valid JSON: {json_error_words(err)}") from None


def _one_object_per_line(line: str) -> str:
    """A hint where a JSON Lines line looks like the start of a JSON array or of an object spread over lines."""
    start = line.strip()
    if start.startswith("[") or start == "{":
        return ("; a JSON Lines file holds one JSON object per line, not a JSON array or an object spread over "
                "several lines")
    return ""


def key_lines(lines: Sequence[str], keys: Iterable[str], first_line: int = 1) -> dict[str, int]:
    """The line on which each of ``keys`` of a pretty-printed JSON object first appears as a key
    (best effort: a key not found this way gets no line, and errors name the entry instead);
    ``lines`` start at line ``first_line`` of the file."""
    wanted = set(keys)
    found: dict[str, int] = {}
    for number, line in enumerate(lines, first_line):
        for key in re.findall(r'"([^"\\]+)"\s*:', line):
            if key in wanted and key not in found:
                found[key] = number
    return found


def plain_tsv_rows(path: Path) -> Iterator[tuple[int, list[str]]]:
    """``(line_number, fields)`` for each non-blank line split on tabs, with no quoting: the BLURB
    relation and QA files hold sentences that begin with quote marks."""
    for line_no, line in numbered_lines(path):
        if line.strip():
            yield line_no, line.split("\t")


def quoted_tsv_rows(path: Path) -> Iterator[tuple[int, list[str]]]:
    """``(line_number, fields)`` for each non-blank line of a tab-separated file whose fields may be
    quoted CSV-style: pandas quotes a field that holds a tab, and BLUE's BIOSSES dev.tsv has one.
    A row is one line (no BLURB file has a field spanning lines), so errors name the exact line."""
    for line_no, line in numbered_lines(path):
        if not line.strip():
            continue
        try:
            yield line_no, next(csv.reader([line], delimiter="\t", strict=True))
        except csv.Error as err:
            raise DatasetFormatError(path, line_no, f"not a valid TSV row (fields may be quoted with \"): {err}") \
                from None


def string_field(record: Mapping, key: str, *, required: bool = True, allow_empty: bool = False) -> str | None:
    """``record[key]``, a string (``\\r\\n`` at its end removed); :class:`FieldError` when it is missing
    (unless not ``required``), not a string, or blank (unless ``allow_empty``)."""
    value = record.get(key)
    if value is None:
        if required:
            raise FieldError(key, f"missing (fields present: {', '.join(sorted(record)) or 'none'})")
        return None
    if not isinstance(value, str):
        raise FieldError(key, f"expected a string, got {type(value).__name__}")
    value = value.rstrip("\r\n")
    if not allow_empty and not value.strip():
        raise FieldError(key, "is empty")
    return value


def string_list(record: Mapping, key: str) -> list[str]:
    """``record[key]``, a list of strings; :class:`FieldError` otherwise."""
    value = record.get(key)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise FieldError(key, f"expected a list of strings, got {type(value).__name__}")
    return value


# ------------------------------------------------------------------- token_tags, token_pos_chunk_tag

@dataclass(frozen=True)
class TokenSentence:
    """A sentence of a one-token-per-line file (for EBM-NLP, a blank-line-separated segment of an abstract)."""

    line: int                  # the line of its first token
    index: int                 # sentence number in the file, from 0
    document: str | None       # PMID from "-DOCSTART- (PMID)", "doc<N>" from a bare -DOCSTART-, else None
    index_in_document: int
    tokens: tuple[str, ...]
    values: tuple              # one per token: what the line parser made of the token's tag


def _token(raw: str) -> str:
    token = raw.strip()
    if not token:
        raise FieldError("token", "is empty")
    return token


def token_tag_fields(line: str) -> tuple[str, str]:
    """A ``token_tags`` line: ``token<TAB>tag``, both non-empty."""
    fields = line.split("\t")
    if len(fields) != 2:
        raise FieldError(None, f"expected 'token<TAB>tag' (2 tab-separated fields), got {len(fields)}: {line[:80]!r}")
    tag = fields[1].strip()
    if not tag:
        raise FieldError("tag", "is empty")
    return _token(fields[0]), tag


def token_pos_chunk_tag_fields(line: str) -> tuple[str, str]:
    """A ``token_pos_chunk_tag`` line: EBM-NLP's ``token POS O tag`` (space-separated), or
    ``token<TAB>tag``; the token and the (unchecked) tag."""
    if "\t" in line:
        fields = line.split("\t")
        if len(fields) != 2:
            raise FieldError(None, f"expected 'token<TAB>tag' (2 tab-separated fields), got {len(fields)}: "
                             f"{line[:80]!r}")
    else:
        fields = line.split()
        if len(fields) != 4:
            raise FieldError(None, f"expected 'token POS O tag' (4 space-separated fields) or "
                             f"'token<TAB>tag', got {len(fields)} fields: {line[:80]!r}")
        fields = [fields[0], fields[3]]
    return _token(fields[0]), fields[1]


def read_token_sentences(path: Path, parse: Callable[[str], tuple[str, object]] = token_tag_fields
                         ) -> Iterator[TokenSentence]:
    """Sentences of a one-token-per-line file: a blank line ends a sentence, ``-DOCSTART-`` opens a
    document (with its PMID in parentheses in EBM-NLP). ``parse`` turns a line into (token, value),
    raising :class:`FieldError`: a layout's fields function, or fine-tuning's, which checks the tag too."""
    document: str | None = None
    documents = index = in_document = start = 0
    tokens: list[str] = []
    values: list = []
    for line_no, line in numbered_lines(path):
        boundary = not line.strip() or line.startswith(DOCSTART)
        if boundary and tokens:
            yield TokenSentence(start, index, document, in_document, tuple(tokens), tuple(values))
            index, in_document, tokens, values = index + 1, in_document + 1, [], []
        if not line.strip():
            continue
        if line.startswith(DOCSTART):
            documents += 1
            match = re.search(r"\(([^()\s]+)\)", line)
            document = match.group(1) if match else f"doc{documents}"
            in_document = 0
            continue
        try:
            token, value = parse(line)
        except FieldError as err:
            raise err.at(path, line_no) from None
        if not tokens:
            start = line_no
        tokens.append(token)
        values.append(value)
    if tokens:
        yield TokenSentence(start, index, document, in_document, tuple(tokens), tuple(values))


# ------------------------------------------------------------------------------ sentence_label_tsv

@dataclass(frozen=True)
class SentenceLabelRow:
    """A row of a ``sentence_label_tsv`` file, its fields as written (``id`` None when it has no id column)."""

    line: int
    id: str | None
    sentence: str
    label: str


def _sentence_label_columns(path: Path, line_no: int, fields: list[str]) -> tuple[dict[str, int], bool]:
    """The columns of the file, from its first row, and whether that row is a header."""
    names = [f.strip().lower() for f in fields]
    if "sentence" in names:
        if "label" not in names:
            raise DatasetFormatError(path, line_no, "the header names a 'sentence' column but no 'label' column",
                                     "label")
        columns = {"sentence": names.index("sentence"), "label": names.index("label")}
        id_column = next((names.index(n) for n in ("index", "id", "pmid") if n in names), None)
        return ({**columns, "id": id_column} if id_column is not None else columns), True
    if len(fields) not in (2, 3):
        raise DatasetFormatError(path, line_no, "expected 'sentence<TAB>label' or 'id<TAB>sentence<TAB>label', "
                                 f"got {len(fields)} fields")
    return ({"sentence": 0, "label": 1} if len(fields) == 2 else {"id": 0, "sentence": 1, "label": 2}), False


def _rows_by_column(path: Path, rows: Iterable[tuple[int, list[str]]],
                    columns_of: Callable[[Path, int, list[str]], tuple[dict[str, int], bool]]
                    ) -> Iterator[tuple[int, list[str], dict[str, int]]]:
    """Each data row of a TSV with the column positions its first row gives (``columns_of``: the
    positions, and whether that row is a header, which is skipped); every row as wide as the first."""
    columns: dict[str, int] | None = None
    width = 0
    for line_no, fields in rows:
        if columns is None:
            columns, header = columns_of(path, line_no, fields)
            width = len(fields)
            if header:
                continue
        if len(fields) != width:
            raise DatasetFormatError(path, line_no, f"expected {width} tab-separated fields like the first "
                                     f"row, got {len(fields)}")
        yield line_no, fields, columns


def read_sentence_label_tsv(path: Path) -> Iterator[SentenceLabelRow]:
    """``sentence<TAB>label`` or ``id<TAB>sentence<TAB>label`` with an optional header row naming
    ``sentence`` and ``label`` (GAD's ``sentence<TAB>label``, BLUE's ``index<TAB>sentence<TAB>label``);
    every row as wide as the first."""
    for line_no, fields, columns in _rows_by_column(path, plain_tsv_rows(path), _sentence_label_columns):
        yield SentenceLabelRow(line_no, fields[columns["id"]] if "id" in columns else None,
                               fields[columns["sentence"]], fields[columns["label"]])


# ---------------------------------------------------------------------------------- relation_jsonl

#: Where a ``relation_jsonl`` record holds the input a model reads, first found first: the sentence
#: with its entity pair dummified (BLURB's input), else the sentence itself.
RELATION_INPUT_FIELDS = ("masked", "masked_text", "text", "sentence")


def read_relation_jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    """``(line_number, record)`` of a ``relation_jsonl`` file: DDI's ``{id, sentence, masked, e1, e2,
    label}`` or the generic ``{id, text, entities, label}``. Fine-tuning reads the entities and the
    label (:mod:`finetune.readers.relation`); :func:`relation_input_text` is the text a model reads."""
    return json_lines(path)


def relation_input_text(record: Mapping) -> str:
    """The first string of :data:`RELATION_INPUT_FIELDS` that ``record`` holds; :class:`FieldError` if none."""
    text = next((record[k] for k in RELATION_INPUT_FIELDS if isinstance(record.get(k), str)), None)
    if text is None:
        raise FieldError(None, f"no string field {', '.join(map(repr, RELATION_INPUT_FIELDS))} "
                         f"(fields present: {', '.join(sorted(record)) or 'none'})")
    return text


# ------------------------------------------------------------------------------- sentence_pair_tsv

@dataclass(frozen=True)
class SentencePairRow:
    """A row of a ``sentence_pair_tsv`` file, its fields as written (``id`` None without an id column)."""

    line: int
    id: str | None
    text_a: str
    text_b: str
    score: str


_SENTENCE_PAIR_COLUMNS = {"text_a": ("sentence1", "text_a"), "text_b": ("sentence2", "text_b"),
                          "score": ("score", "mean_score")}


def _sentence_pair_columns(path: Path, line_no: int, fields: list[str]) -> tuple[dict[str, int], bool]:
    """The columns of the file, from its first row, and whether that row is a header."""
    names = [f.strip().lower() for f in fields]
    found = {key: next((names.index(n) for n in aliases if n in names), None)
             for key, aliases in _SENTENCE_PAIR_COLUMNS.items()}
    if found["text_a"] is not None and found["text_b"] is not None:
        if found["score"] is None:
            raise DatasetFormatError(path, line_no, "the header names the sentences but no 'score' column", "score")
        id_column = next((names.index(n) for n in ("old_index", "id") if n in names), None)
        return ({**found, "id": id_column} if id_column is not None else dict(found)), True
    if len(fields) != 3:
        raise DatasetFormatError(path, line_no, f"expected 'text_a<TAB>text_b<TAB>score' (3 fields) or a header "
                                 f"naming sentence1, sentence2 and score; got {len(fields)} fields")
    return {"text_a": 0, "text_b": 1, "score": 2}, False


def read_sentence_pair_tsv(path: Path) -> Iterator[SentencePairRow]:
    """``text_a<TAB>text_b<TAB>score``, or a TSV whose header names ``sentence1``/``sentence2``/``score``
    (BLUE's BIOSSES, whose ``old_index`` column, unique over the 100 pairs, is the id); every row as
    wide as the first."""
    for line_no, fields, columns in _rows_by_column(path, quoted_tsv_rows(path), _sentence_pair_columns):
        yield SentencePairRow(line_no, fields[columns["id"]] if "id" in columns else None,
                              fields[columns["text_a"]], fields[columns["text_b"]], fields[columns["score"]])


# --------------------------------------------------------------------------------- sentences_jsonl

def read_sentences_jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    """``(line_number, record)`` of a ``sentences_jsonl`` file: HoC's ``{pmid, sentences,
    sentence_labels[, doc_hallmarks]}``, one abstract a line. ``string_list(record, "sentences")`` is
    its sentences; fine-tuning reads the labels (:mod:`finetune.readers.classification`)."""
    return json_lines(path)


# -------------------------------------------------------------------------------------- pqal_json

@dataclass(frozen=True)
class PqalEntry:
    """A question of PubMedQA's ``ori_pqal.json``: its PMID, the line its key is on (None if not
    found), the question and context passages (stripped), the entry as written (for its answer) and
    the line of each of its fields (what an error about a field names)."""

    pmid: str
    line: int | None
    question: str
    contexts: tuple[str, ...]
    record: Mapping
    field_lines: Mapping[str, int] = field(default_factory=dict)

    def line_of(self, name: str | None) -> int | None:
        """The line field ``name`` is on, else the entry's."""
        return self.field_lines.get(name, self.line) if name else self.line


def read_pqal_json(path: Path) -> Iterator[PqalEntry]:
    """``ori_pqal.json``: one JSON object mapping PMIDs to ``{QUESTION, CONTEXTS, ...}``; each entry's
    ``QUESTION`` a non-empty string and its ``CONTEXTS`` a list of strings."""
    data, lines = json_document(path)
    if not isinstance(data, dict) or not data:
        raise DatasetFormatError(path, 1, "expected a JSON object mapping PMIDs to questions")
    where = key_lines(lines, data)
    starts = sorted(where.values())
    for pmid, entry in data.items():
        line = where.get(pmid)
        fields = _entry_field_lines(lines, line, starts, entry)
        try:
            if not isinstance(entry, dict):
                raise FieldError(None, "expected an object")
            question = string_field(entry, "QUESTION").strip()
            contexts = tuple(c.strip() for c in string_list(entry, "CONTEXTS"))
        except FieldError as err:
            raise DatasetFormatError(path, fields.get(err.field, line), f"entry {pmid!r}: {err.message}",
                                     err.field) from None
        yield PqalEntry(pmid, line, question, contexts, entry, fields)


def _entry_field_lines(lines: Sequence[str], start: int | None, starts: Sequence[int], entry: object) -> dict[str, int]:
    """The line of each of ``entry``'s keys, looked for between the entry's own key line ``start`` and the
    next entry's (none where the entry's line is unknown or it is not an object)."""
    if start is None or not isinstance(entry, dict):
        return {}
    end = next((line for line in starts if line > start), len(lines) + 1)
    return key_lines(lines[start - 1:end - 1], entry, first_line=start)


# -------------------------------------------------------------------------------------- yesno_tsv

@dataclass(frozen=True)
class YesNoRow:
    """A row of a ``yesno_tsv`` file, its fields as written."""

    line: int
    label: str
    question: str
    context: str


def _yesno_columns(path: Path, line_no: int, fields: list[str]) -> tuple[dict[str, int], bool]:
    """The columns of the file, from its first row, and whether that row is a header."""
    names = [f.strip().lower() for f in fields]
    if "question" not in names:
        return {"label": 0, "question": 1, "context": 2, "width": 3}, False
    label = next((n for n in ("yesno_label", "label", "answer") if n in names), None)
    context = next((n for n in ("ideal_answer", "context", "passage", "text") if n in names), None)
    if label is None or context is None:
        raise DatasetFormatError(path, line_no, "the header names 'question' but not both a label column "
                                 "(yesno_label, label) and a context column (ideal_answer, context)",
                                 "label" if label is None else "context")
    return {"label": names.index(label), "question": names.index("question"), "context": names.index(context),
            "width": len(fields)}, True


def read_yesno_tsv(path: Path) -> Iterator[YesNoRow]:
    """The BioASQ yes/no stand-in: ``label<TAB>question<TAB>context`` with an optional header naming
    ``question``, a label column (``yesno_label``/``label``) and a context column (``ideal_answer``/``context``)."""
    columns: dict[str, int] | None = None
    for line_no, fields in plain_tsv_rows(path):
        if columns is None:
            columns, header = _yesno_columns(path, line_no, fields)
            if header:
                continue
        if len(fields) != columns["width"]:
            raise DatasetFormatError(path, line_no, f"expected {columns['width']} tab-separated fields "
                                     f"(label, question, context), got {len(fields)}")
        yield YesNoRow(line_no, fields[columns["label"]], fields[columns["question"]], fields[columns["context"]])


# ------------------------------------------------------------------------------- texts, by layout
# What the coverage report measures: the text of each model input, what the task feeds the model at once.

def _token_sentence_texts(parse: Callable[[str], tuple[str, object]]) -> Callable[[Path], Iterator[str]]:
    return lambda path: (" ".join(s.tokens) for s in read_token_sentences(path, parse))


def _relation_texts(path: Path) -> Iterator[str]:
    for line_no, record in read_relation_jsonl(path):
        try:
            yield relation_input_text(record)
        except FieldError as err:
            raise err.at(path, line_no) from None


def _sentences_texts(path: Path) -> Iterator[str]:
    for line_no, record in read_sentences_jsonl(path):
        try:
            sentences = string_list(record, "sentences")
        except FieldError as err:
            raise err.at(path, line_no) from None
        yield from (s for s in sentences if s.strip())


@dataclass(frozen=True)
class FileLayout:
    """A dataset file layout: its name, what a file looks like, what one model input is (what the
    task feeds the model at once), and the texts of a file's model inputs."""

    name: str
    shape: str
    model_input: str
    texts: Callable[[Path], Iterator[str]] = field(repr=False, compare=False)


FILE_LAYOUTS: Mapping[str, FileLayout] = MappingProxyType({layout.name: layout for layout in (
    FileLayout(TOKEN_TAGS, "token<TAB>tag, blank line between sentences", "one sentence",
               _token_sentence_texts(token_tag_fields)),
    # a sentence: the unit of the paper's Table 8 (30.7 BERT pieces on average for EBM PICO)
    FileLayout(TOKEN_POS_CHUNK_TAG, "token POS O tag, -DOCSTART- (PMID) per abstract", "one sentence",
               _token_sentence_texts(token_pos_chunk_tag_fields)),
    FileLayout(SENTENCE_LABEL_TSV, "sentence<TAB>label (optional header)",
               "one example: a sentence with its entity pair dummified",
               lambda path: (row.sentence for row in read_sentence_label_tsv(path))),
    FileLayout(RELATION_JSONL, "JSON Lines with a masked/text/sentence field",
               "one example: the masked sentence of one entity pair", _relation_texts),
    FileLayout(SENTENCE_PAIR_TSV, "TSV with sentence1/sentence2 columns", "one sentence pair (sentence1 + sentence2)",
               lambda path: (f"{row.text_a}\n{row.text_b}" for row in read_sentence_pair_tsv(path))),
    # a sentence: the unit of the paper's Table 8 (40.6 BERT pieces on average for HoC, labelled per sentence)
    FileLayout(SENTENCES_JSONL, "JSON Lines with a sentences list", "one sentence", _sentences_texts),
    FileLayout(PQAL_JSON, "JSON object PMID -> {QUESTION, CONTEXTS}", "one question + all its contexts",
               lambda path: ("\n".join([e.question, *e.contexts]) for e in read_pqal_json(path))),
    FileLayout(YESNO_TSV, "label<TAB>question<TAB>ideal_answer (optional header)",
               "one question + its ideal answer (the stand-in's context)",
               lambda path: (f"{row.question}\n{row.context}" for row in read_yesno_tsv(path))),
)})


# ---------------------------------------------------------------------------------------- detection

def _tsv_header(fields: list[str], wanted: Iterable[str]) -> bool:
    """Whether ``fields`` is a header row naming every one of ``wanted``."""
    lowered = [f.strip().lower() for f in fields]
    return all(name in lowered for name in wanted)


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
            return SENTENCES_JSONL
        if isinstance(record.get("masked"), str) or (isinstance(record.get("sentence"), str) and "label" in record):
            return RELATION_JSONL
        first_value = next(iter(record.values()), None)
        if isinstance(first_value, dict) and "QUESTION" in first_value:
            return PQAL_JSON
        return None
    # A pretty-printed JSON document: PubMedQA's if its first entry has a question.
    return PQAL_JSON if '"QUESTION"' in "\n".join(lines) else None


def _detect_tsv(content: list[str]) -> str | None:
    fields = content[0].split("\t")
    if _tsv_header(fields, ["sentence1", "sentence2"]):
        return SENTENCE_PAIR_TSV
    if _tsv_header(fields, ["question"]):
        return YESNO_TSV
    if _tsv_header(fields, ["sentence"]):
        return SENTENCE_LABEL_TSV
    if all(len(line.split("\t")) == 2 for line in content):
        # NER tokens hold no spaces; a sentence_label_tsv's first field is a whole sentence.
        sentences = sum(" " in line.split("\t")[0].strip() for line in content)
        return SENTENCE_LABEL_TSV if sentences > len(content) // 2 else TOKEN_TAGS
    if all(len(line.split("\t")) == 3 for line in content) \
            and all(line.split("\t")[0].strip().lower() in ("0", "1", "yes", "no") for line in content):
        return YESNO_TSV
    if all(len(line.split()) == 4 and "\t" not in line for line in content):
        return TOKEN_POS_CHUNK_TAG
    return None


def detect_file_layout(path: str | os.PathLike) -> str | None:
    """The :data:`FILE_LAYOUTS` name that fits the file's first lines, or None if none does."""
    content = _peek_lines(Path(path))
    if not content:
        return None
    first = content[0]
    if first.lstrip().startswith("{"):
        return _detect_json(content)
    if first.startswith(DOCSTART):
        body = next((line for line in content if not line.startswith(DOCSTART)), None)
        if body is None:
            return None
        return TOKEN_TAGS if len(body.split("\t")) == 2 else TOKEN_POS_CHUNK_TAG if len(body.split()) == 4 else None
    return _detect_tsv(content)
