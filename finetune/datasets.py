"""Readers for the 13 BLURB datasets by name, and one generic format per BLURB task type.

Fine-tuning needs more than the words the coverage report reads (:mod:`tokenization.instances`):
labels in a fixed order, the train/dev/test splits, and for relation extraction where the
entities are. This module turns each dataset, in the form it is distributed in, into typed
examples grouped in splits (:class:`BlurbDataset`), so the rest of the fine-tuning code never
sees a file format.

Task types and examples (the six of BLURB, the paper's section 2.3)
    ``ner``             :class:`TokenTaggingExample`  BC5-chem, BC5-disease, NCBI-disease, BC2GM, JNLPBA
    ``pico``            :class:`PicoExample`          EBM PICO
    ``relation``        :class:`RelationExample`      ChemProt, DDI, GAD
    ``similarity``      :class:`SentencePairExample`  BIOSSES
    ``classification``  :class:`DocumentExample`      HoC
    ``qa``              :class:`QAExample`            PubMedQA, BioASQ

Entry points
    :func:`load_blurb_dataset` reads one of the 13 datasets by name from its own directory;
    :func:`load_generic_dataset` reads a user's dataset in the generic format of a task type
    (``docs/datasets.md`` documents both).

Conventions
    * Character offsets are Python slices: ``text[entity.start:entity.end]`` (end exclusive). DDI
      writes inclusive ends (``"70-84"`` is 15 characters); they are converted on reading.
    * Splits that the data here does not provide are derived, never random at run time: a unit
      (abstract, question, document) goes to a split by the SHA-256 of ``(dataset, seed, unit id)``
      (:func:`seeded_partition`), so the same seed gives the same split on every machine and Python
      version, independent of file order. Every derivation is stated in :attr:`BlurbDataset.notes`.
    * Files are strict: a line that does not fit its format raises :class:`DatasetFormatError`
      naming the file, the line and the field, because a silently skipped example would make the
      benchmark numbers lie. The one repair is of DDI-style entity offsets a character or two off
      in the source (:func:`_entity_from_offsets`); each is listed in the notes.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from types import MappingProxyType
from typing import Callable, Iterable, Iterator, Mapping, Sequence, Union

from biomed_lm.errors import FinetuneError, InputError
from biomed_lm.finetune.relation_inputs import (PLACEHOLDER_PAIRS, TYPE_MAPS, PlaceholderPair,
                                                entities_from_placeholders, normalize_type, pair_from_placeholders)
from biomed_lm.tokenization.instances import DatasetFormatError as _InstanceFormatError
from biomed_lm.tokenization.instances import json_lines, numbered_lines

__all__ = [
    "NER", "PICO", "RELATION", "SIMILARITY", "CLASSIFICATION", "QA", "TASK_TYPES",
    "ENTITY_F1", "PICO_TOKEN_MACRO_F1", "MICRO_F1_POSITIVE", "F1_POSITIVE", "PEARSON", "MICRO_F1_MULTILABEL",
    "ACCURACY", "METRICS", "TRAIN", "DEV", "TEST", "SPLITS", "DEFAULT_SPLIT_SEED", "CARVED_DEV_FRACTION",
    "MAX_OFFSET_SHIFT", "DEFAULT_MAX_LENGTH", "QA_MAX_LENGTH", "PICO_ELEMENTS", "HOC_HALLMARKS", "HOC_BLURB_SIZES",
    "PUBMEDQA_BLURB_SIZES",
    "DatasetFormatError", "UnknownDatasetError", "MissingDatasetFileError",
    "TokenTaggingExample", "PicoExample", "Entity", "RelationExample", "SentencePairExample", "DocumentExample",
    "QAExample", "Example", "BlurbDataset", "DatasetSpec", "BLURB_DATASETS",
    "blurb_dataset_names", "canonical_dataset_name", "blurb_spec", "default_max_length", "load_blurb_dataset",
    "load_generic_dataset", "seeded_partition",
]

# ----------------------------------------------------------------------------------- constants

NER = "ner"
PICO = "pico"
RELATION = "relation"
SIMILARITY = "similarity"
CLASSIFICATION = "classification"
QA = "qa"
TASK_TYPES = (NER, PICO, RELATION, SIMILARITY, CLASSIFICATION, QA)

ENTITY_F1 = "entity_f1"                        # seqeval-style exact-span mention F1
PICO_TOKEN_MACRO_F1 = "pico_token_macro_f1"    # word-level F1 per PIO element, averaged over elements
MICRO_F1_POSITIVE = "micro_f1_positive"        # micro F1 over every label but the negative one
F1_POSITIVE = "f1_positive"                    # binary F1 of the positive label
PEARSON = "pearson"
MICRO_F1_MULTILABEL = "micro_f1_multilabel"    # micro F1 over (document, label) decisions
ACCURACY = "accuracy"
METRICS = (ENTITY_F1, PICO_TOKEN_MACRO_F1, MICRO_F1_POSITIVE, F1_POSITIVE, PEARSON, MICRO_F1_MULTILABEL,
           ACCURACY)

TRAIN, DEV, TEST = "train", "dev", "test"
SPLITS = (TRAIN, DEV, TEST)

DEFAULT_SPLIT_SEED = 42

# Sub-words per input when a run sets none (DatasetSpec.max_length holds each dataset's value). The
# paper (section 2.4) pads or truncates GAD to 128, ChemProt and DDI to 256 and QA to 512; it states
# no length for the other datasets, which get 128 (NER and PICO sentences are cut into windows,
# never dropped) except BIOSSES, 256, so that no pair is cut (4 of the 100 exceed 128 sub-words with
# bert-base-uncased's vocabulary), and HoC, 512, as its inputs are whole abstracts.
DEFAULT_MAX_LENGTH = 128
QA_MAX_LENGTH = 512
CARVED_DEV_FRACTION = Fraction(1, 10)  # the dev split carved from a training file where none is given

PICO_ELEMENTS = ("PAR", "INT", "OUT")  # participants, interventions, outcomes (EBM-NLP's names)
HOC_HALLMARKS = (  # the 10 top-level hallmarks of cancer, alphabetical (the order of the label ids)
    "Activating invasion and metastasis",
    "Avoiding immune destruction",
    "Cellular energetics",
    "Enabling replicative immortality",
    "Evading growth suppressors",
    "Genomic instability and mutation",
    "Inducing angiogenesis",
    "Resisting cell death",
    "Sustaining proliferative signaling",
    "Tumor promoting inflammation",
)
# BLURB's HoC split (paper, Table 3) in abstracts; applied as proportions to the abstracts present.
HOC_BLURB_SIZES = {TRAIN: 1295, DEV: 186, TEST: 371}
# BLURB's PubMedQA split of the 500 non-test questions.
PUBMEDQA_BLURB_SIZES = {TRAIN: 450, DEV: 50}

_SPLIT_STEMS = {TRAIN: ("train",), DEV: ("dev", "devel"), TEST: ("test",)}
_DOCSTART = "-DOCSTART-"
_TAG_PREFIXES = ("B", "I", "E", "S", "L", "U")  # BIO plus the BIOES/BILOU extras a generic file may use


# -------------------------------------------------------------------------------------- errors

class DatasetFormatError(_InstanceFormatError):
    """A dataset file whose content does not fit its format: the file, the line and the field.

    A subclass of :class:`tokenization.instances.DatasetFormatError`, so code that already catches
    that error (or :class:`InputError`) catches this one too. ``line`` is None for whole-file
    problems (an empty split); ``field`` names the offending column or JSON key when there is one.
    """

    def __init__(self, path: str | Path, line: int | None, message: str, field: str | None = None):
        self.field = field
        super().__init__(path, line, message if field is None else f"field {field!r}: {message}")


class UnknownDatasetError(FinetuneError, InputError):
    """A dataset name that is not one of the 13 BLURB datasets; the message lists the valid names."""


class MissingDatasetFileError(FinetuneError, InputError, FileNotFoundError):
    """A file a dataset needs is not in its directory; the message names the path expected."""


class _FieldError(Exception):
    """A bad value, raised by field parsers and turned into a :class:`DatasetFormatError` by the
    line reader that knows the file and line."""

    def __init__(self, field_name: str | None, message: str):
        super().__init__(message)
        self.field = field_name
        self.message = message


# ------------------------------------------------------------------------------------ examples

@dataclass(frozen=True)
class TokenTaggingExample:
    """A sentence of an NER dataset: its tokens and one BIO tag per token."""

    id: str
    tokens: tuple[str, ...]
    tags: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "tokens", tuple(self.tokens))
        object.__setattr__(self, "tags", tuple(self.tags))
        if len(self.tokens) != len(self.tags):
            raise ValueError(f"example {self.id!r}: {len(self.tokens)} tokens but {len(self.tags)} tags")


@dataclass(frozen=True)
class PicoExample:
    """A segment of an EBM PICO abstract: its tokens and, per token, the set of PIO elements it is
    part of. A set, not a tag, because in the original corpus a token may belong to several
    elements (a participant span containing an intervention); the empty set means none."""

    id: str
    tokens: tuple[str, ...]
    elements: tuple[frozenset[str], ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "tokens", tuple(self.tokens))
        object.__setattr__(self, "elements", tuple(frozenset(e) for e in self.elements))
        if len(self.tokens) != len(self.elements):
            raise ValueError(f"example {self.id!r}: {len(self.tokens)} tokens but {len(self.elements)} element sets")


@dataclass(frozen=True)
class Entity:
    """An entity mention of a relation example, located by character offsets into its ``text``.

    ``end`` is exclusive. ``spans`` holds the fragments of the mention: one ``(start, end)`` pair for
    a contiguous mention, several for a discontinuous one (DDI has "synthetic steroidal [estrogen
    and] progestogen"), in which case ``start``/``end`` cover the whole stretch and ``text`` is the
    annotated mention, not ``text[start:end]``.
    """

    start: int
    end: int
    type: str
    text: str
    spans: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        spans = tuple((int(a), int(b)) for a, b in self.spans) or ((self.start, self.end),)
        object.__setattr__(self, "spans", spans)
        if not 0 <= self.start < self.end:
            raise ValueError(f"entity {self.text!r}: offsets {self.start}-{self.end} are not a span")
        if spans[0][0] != self.start or spans[-1][1] != self.end \
                or any(a >= b for a, b in spans) or any(b > c for (_, b), (c, _) in zip(spans, spans[1:])):
            raise ValueError(f"entity {self.text!r}: fragments {spans} do not run in order "
                             f"from {self.start} to {self.end}")


@dataclass(frozen=True)
class RelationExample:
    """A sentence with a pair of entity mentions and the relation between them.

    ``masked_text`` is the sentence with the pair replaced by dummy tokens (``@GENE$``, ``@DRUG$``,
    ...), the input BLURB's standard model reads; it is None when the file gives no masked form.
    When a file ships only the dummified sentence (GAD, ChemProt as TSV) both texts are that
    sentence and ``entities`` is empty: where the entities were is not known.
    """

    id: str
    text: str
    masked_text: str | None
    entities: tuple[Entity, ...]
    label: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "entities", tuple(self.entities))


@dataclass(frozen=True)
class SentencePairExample:
    """Two sentences and their similarity score (BIOSSES: 0 = unrelated ... 4 = equivalent)."""

    id: str
    text_a: str
    text_b: str
    score: float


@dataclass(frozen=True)
class DocumentExample:
    """An abstract with its document-level labels. ``text`` is the sentences joined by one space
    (what the model reads); the sentences are kept for sentence-level analyses."""

    id: str
    text: str
    sentences: tuple[str, ...]
    labels: frozenset[str]

    def __post_init__(self) -> None:
        object.__setattr__(self, "sentences", tuple(self.sentences))
        object.__setattr__(self, "labels", frozenset(self.labels))


@dataclass(frozen=True)
class QAExample:
    """A question, the reference text that may answer it, and the answer label (yes/no[/maybe])."""

    id: str
    question: str
    context: str
    label: str


Example = Union[TokenTaggingExample, PicoExample, RelationExample, SentencePairExample, DocumentExample,
                QAExample]


@dataclass(frozen=True)
class BlurbDataset:
    """A dataset ready for fine-tuning: typed examples per split, its labels and its metric.

    ``labels`` is the fixed label order (a model's output ids): BIO tags for NER, PIO element names
    for PICO, relation/answer/hallmark names otherwise, empty for similarity (a regression).
    ``negative_label`` is the "no relation" label that the relation metrics leave out (None for
    other tasks). ``notes`` says where each split came from and how it differs from BLURB's.
    """

    name: str
    task_type: str
    metric: str
    labels: tuple[str, ...]
    splits: dict[str, list[Example]]
    notes: list[str]
    negative_label: str | None = None

    def sizes(self) -> dict[str, int]:
        """Examples per split, in split order."""
        return {split: len(examples) for split, examples in self.splits.items()}


# --------------------------------------------------------------------------------- line readers

@dataclass(frozen=True)
class _Row:
    """An example with the line it starts on (for duplicate-id errors), the unit a derived split
    keeps together (an abstract, a document, a question), and any repair its source needed."""

    example: Example
    line: int | None
    group: str
    correction: str | None = None  # what had to be repaired in the source, for the dataset's notes


def _tsv_rows(path: Path) -> Iterator[tuple[int, list[str]]]:
    """``(line_number, fields)`` for each non-blank line of a tab-separated file whose fields may be
    quoted CSV-style: pandas quotes a field that holds a tab, and BLUE's BIOSSES dev.tsv has one.
    A row is one line (no BLURB file has a field spanning lines), so errors name the exact line."""
    for line_no, line in numbered_lines(path, DatasetFormatError):
        if not line.strip():
            continue
        try:
            yield line_no, next(csv.reader([line], delimiter="\t", strict=True))
        except csv.Error as err:
            raise DatasetFormatError(path, line_no, f"not a valid TSV row (fields may be quoted with \"): {err}") \
                from None


def _plain_tsv_rows(path: Path) -> Iterator[tuple[int, list[str]]]:
    """``(line_number, fields)`` for each non-blank line split on tabs, with no quoting: the
    BLURB relation and QA files hold sentences that begin with quote marks."""
    for line_no, line in numbered_lines(path, DatasetFormatError):
        if line.strip():
            yield line_no, line.split("\t")


def _string(record: Mapping, key: str, *, required: bool = True, allow_empty: bool = False) -> str | None:
    value = record.get(key)
    if value is None:
        if required:
            raise _FieldError(key, f"missing (fields present: {', '.join(sorted(record)) or 'none'})")
        return None
    if not isinstance(value, str):
        raise _FieldError(key, f"expected a string, got {type(value).__name__}")
    value = value.rstrip("\r\n")
    if not allow_empty and not value.strip():
        raise _FieldError(key, "is empty")
    return value


def _one_of(record: Mapping, keys: Sequence[str], *, required: bool = True) -> tuple[str | None, str | None]:
    """The one string field among ``keys`` that the record has (``text`` or ``sentence``, ...)."""
    present = [k for k in keys if k in record]
    if len(present) > 1:
        raise _FieldError(present[1], f"give only one of {', '.join(map(repr, keys))}")
    if not present:
        if required:
            raise _FieldError(keys[0], f"missing: expected one of {', '.join(map(repr, keys))} "
                              f"(fields present: {', '.join(sorted(record)) or 'none'})")
        return None, None
    return present[0], _string(record, present[0])


def _record_id(record: Mapping, fallback: str) -> str:
    value = record.get("id")
    if value is None:
        return fallback
    if isinstance(value, bool) or not isinstance(value, (str, int)) or not str(value).strip():
        raise _FieldError("id", f"expected a non-empty string or integer, got {value!r}")
    return str(value).strip()


def _label_value(value: object, field_name: str = "label") -> str:
    """A label as a string; integers (GAD-style ``0``/``1`` in JSON) are accepted."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise _FieldError(field_name, f"expected a string, got {value!r}")
    text = str(value).strip()
    if not text:
        raise _FieldError(field_name, "is empty")
    return text


def _reraise(path: Path, line: int | None, err: _FieldError) -> DatasetFormatError:
    return DatasetFormatError(path, line, err.message, err.field)


# ---------------------------------------------------------------------------------------- labels

LabelCheck = Callable[[str], str]


def _closed_labels(labels: Sequence[str], *, case_insensitive: bool, field_name: str = "label") -> LabelCheck:
    """A check that maps a raw label to its canonical spelling or rejects it, listing the valid ones.

    BLURB specs match case-insensitively (ChemProt distributions write ``false`` and ``False``);
    labels a user passes to :func:`load_generic_dataset` match exactly.
    """
    table = {(label.casefold() if case_insensitive else label): label for label in labels}

    def check(raw: str) -> str:
        key = raw.strip().casefold() if case_insensitive else raw.strip()
        if key not in table:
            raise _FieldError(field_name, f"unknown label {raw!r} (expected one of: {', '.join(labels)})")
        return table[key]

    return check


def _open_labels(field_name: str = "label") -> LabelCheck:
    def check(raw: str) -> str:
        return _label_value(raw, field_name)

    return check


def _split_tag(tag: str) -> tuple[str, str | None]:
    """``("B", "Disease")`` for ``B-Disease``; ``("B", None)`` for a bare ``B``; ``("O", None)``."""
    prefix, dash, entity_type = tag.partition("-")
    if tag == "O":
        return "O", None
    if prefix not in _TAG_PREFIXES or (dash and not entity_type):
        raise _FieldError("tag", f"{tag!r} is not a BIO tag (O, B-TYPE, I-TYPE, or bare B/I)")
    return prefix, (entity_type if dash else None)


def _blurb_tag_check(entity_type: str, source_types: frozenset[str]) -> LabelCheck:
    """BIO tags of one BLURB NER dataset, mapped onto its single entity type.

    BLURB's NER tasks have one entity type each (JNLPBA's five are merged, as the paper does), and
    distributions spell it differently (``B-Disease``, ``B-GENE``, bare ``B``), so every accepted
    spelling becomes ``B-<type>``/``I-<type>``. A type outside ``source_types`` is an error: it
    means the file is another dataset (BC5CDR with both chemicals and diseases, say).
    """
    def check(raw: str) -> str:
        prefix, found = _split_tag(raw.strip())
        if prefix == "O":
            return "O"
        if prefix not in ("B", "I"):
            raise _FieldError("tag", f"{raw!r}: BLURB's NER files use BIO tags only")
        if found is not None and found.casefold() not in source_types:
            raise _FieldError("tag", f"{raw!r}: entity type {found!r} is not one of this dataset's "
                              f"({', '.join(sorted(source_types))})")
        return f"{prefix}-{entity_type}"

    return check


def _generic_tag_check(labels: Sequence[str] | None, *, by_entity_type: bool = False) -> LabelCheck:
    """A generic NER tag, checked against ``labels``: exactly, or (``by_entity_type``, labels read
    from the training file) by entity type, since a dev file may hold an ``I-X`` where training
    saw only ``B-X``."""
    if labels is not None and by_entity_type:
        known = {_split_tag(label)[1] for label in labels}

        def check_type(raw: str) -> str:
            tag = raw.strip()
            if _split_tag(tag)[1] not in known:
                raise _FieldError("tag", f"{tag!r}: entity type {_split_tag(tag)[1]!r} does not occur in the "
                                  f"training file (labels there: {', '.join(labels)})")
            return tag

        return check_type
    closed = _closed_labels(labels, case_insensitive=False, field_name="tag") if labels is not None else None

    def check(raw: str) -> str:
        tag = raw.strip()
        _split_tag(tag)
        return closed(tag) if closed is not None else tag

    return check


def _tag_order(tags: Iterable[str]) -> tuple[str, ...]:
    """Inferred NER labels: ``O`` first, then by entity type, ``B`` before ``I`` (then E, S, L, U)."""
    def key(tag: str) -> tuple:
        prefix, entity_type = _split_tag(tag)
        return (prefix != "O", entity_type or "", _TAG_PREFIXES.index(prefix) if prefix != "O" else -1)

    return tuple(sorted(set(tags) | {"O"}, key=key))


def _pico_check(elements: Sequence[str] | None, *, case_insensitive: bool) -> Callable[[str], frozenset[str]]:
    """A PICO tag (``O``, ``I-PAR``, ``PAR``, or several joined by ``|``) as the set of its elements."""
    closed = _closed_labels(elements, case_insensitive=case_insensitive, field_name="tag") \
        if elements is not None else None

    def check(raw: str) -> frozenset[str]:
        tag = raw.strip()
        if not tag:
            raise _FieldError("tag", "is empty")
        if tag == "O":
            return frozenset()
        found = set()
        for part in tag.split("|"):
            part = part.strip()
            name = part[2:] if part[:2] in ("B-", "I-") else part
            if not name or name == "O":
                raise _FieldError("tag", f"{raw!r}: {part!r} is not a PICO element (tags are O, or "
                                  "elements such as I-PAR joined by '|')")
            found.add(closed(name) if closed is not None else name)
        return frozenset(found)

    return check


# ----------------------------------------------------------------------------- token-per-line files

@dataclass(frozen=True)
class _TokenSentence:
    line: int
    index: int                 # sentence number in the file, from 0
    document: str | None       # PMID from "-DOCSTART- (PMID)", "doc<N>" from a bare -DOCSTART-, else None
    index_in_document: int
    tokens: tuple[str, ...]
    values: tuple


def _read_token_sentences(path: Path, parse: Callable[[str], tuple[str, object]]) -> list[_TokenSentence]:
    """Sentences of a one-token-per-line file: a blank line ends a sentence, ``-DOCSTART-`` opens a
    document (with its PMID in parentheses in EBM-NLP). ``parse`` turns a line into (token, value)."""
    sentences: list[_TokenSentence] = []
    document: str | None = None
    documents = 0
    in_document = 0
    start = 0
    tokens: list[str] = []
    values: list = []

    def flush() -> None:
        nonlocal tokens, values, in_document
        if tokens:
            sentences.append(_TokenSentence(start, len(sentences), document, in_document,
                                            tuple(tokens), tuple(values)))
            in_document += 1
            tokens, values = [], []

    for line_no, line in numbered_lines(path, DatasetFormatError):
        if not line.strip():
            flush()
            continue
        if line.startswith(_DOCSTART):
            flush()
            documents += 1
            match = re.search(r"\(([^()\s]+)\)", line)
            document = match.group(1) if match else f"doc{documents}"
            in_document = 0
            continue
        try:
            token, value = parse(line)
        except _FieldError as err:
            raise _reraise(path, line_no, err) from None
        if not tokens:
            start = line_no
        tokens.append(token)
        values.append(value)
    flush()
    return sentences


def _token(raw: str) -> str:
    token = raw.strip()
    if not token:
        raise _FieldError("token", "is empty")
    return token


def _ner_line_parser(tag_check: LabelCheck) -> Callable[[str], tuple[str, str]]:
    def parse(line: str) -> tuple[str, str]:
        fields = line.split("\t")
        if len(fields) != 2:
            raise _FieldError(None, f"expected 'token<TAB>tag' (2 tab-separated fields), got {len(fields)}: "
                              f"{line[:80]!r}")
        tag = fields[1].strip()
        if not tag:
            raise _FieldError("tag", "is empty")
        return _token(fields[0]), tag_check(tag)

    return parse


def _pico_line_parser(element_check: Callable[[str], frozenset[str]]) -> Callable[[str], tuple[str, frozenset]]:
    """EBM-NLP's ``token POS O tag`` (space-separated) or the generic ``token<TAB>tag``."""
    def parse(line: str) -> tuple[str, frozenset]:
        if "\t" in line:
            fields = line.split("\t")
            if len(fields) != 2:
                raise _FieldError(None, f"expected 'token<TAB>tag' (2 tab-separated fields), got {len(fields)}: "
                                  f"{line[:80]!r}")
        else:
            fields = line.split()
            if len(fields) != 4:
                raise _FieldError(None, f"expected 'token POS O tag' (4 space-separated fields) or "
                                  f"'token<TAB>tag', got {len(fields)} fields: {line[:80]!r}")
            fields = [fields[0], fields[3]]
        return _token(fields[0]), element_check(fields[1])

    return parse


def _read_ner(path: Path, tag_check: LabelCheck) -> list[_Row]:
    """One example per sentence; a derived split keeps a ``-DOCSTART-`` document together."""
    rows = []
    for s in _read_token_sentences(path, _ner_line_parser(tag_check)):
        example = TokenTaggingExample(f"{_split_stem(path)}-{s.index}", s.tokens, s.values)
        rows.append(_Row(example, s.line, s.document or f"sentence{s.index}"))
    return rows


def _read_pico(path: Path, element_check: Callable[[str], frozenset[str]]) -> list[_Row]:
    """One example per blank-line-separated segment, id ``PMID-k``; a derived split keeps an abstract
    together."""
    rows = []
    for s in _read_token_sentences(path, _pico_line_parser(element_check)):
        if s.document is not None:
            example_id, group = f"{s.document}-{s.index_in_document}", s.document
        else:
            example_id, group = f"{_split_stem(path)}-{s.index}", f"sentence{s.index}"
        rows.append(_Row(PicoExample(example_id, s.tokens, s.values), s.line, group))
    return rows


# ------------------------------------------------------------------------------- relation files

SentenceCheck = Callable[[str], str]


def _placeholder_check(pair: PlaceholderPair | None, rewrite: Callable[[str], str] | None = None,
                       hint: str = "") -> SentenceCheck:
    """A check that a pre-dummified sentence holds its entity pair the way fine-tuning will look for
    it (a BLURB dataset's ``pair``, or any two placeholders), after ``rewrite``; returns the sentence
    to keep. A sentence without its pair cannot be featurized, so it is refused here, with its line."""
    def check(text: str) -> str:
        if rewrite is not None:
            text = rewrite(text)
        try:
            if pair is None:
                entities_from_placeholders(text)
            else:
                pair_from_placeholders(text, pair)
        except ValueError as err:
            raise _FieldError("sentence", f"{err}{hint}") from None
        return text

    return check


def _read_relation_tsv(path: Path, label_check: LabelCheck, sentence_check: SentenceCheck) -> list[_Row]:
    """``sentence<TAB>label`` or ``id<TAB>sentence<TAB>label``, entities already dummified, with an
    optional header row (GAD's ``sentence<TAB>label``, BLUE's ``index<TAB>sentence<TAB>label``)."""
    rows: list[_Row] = []
    columns: dict[str, int] | None = None
    width = 0
    for line_no, fields in _plain_tsv_rows(path):
        if columns is None:
            names = [f.strip().lower() for f in fields]
            if "sentence" in names and "label" in names:
                id_column = next((names.index(n) for n in ("index", "id", "pmid") if n in names), None)
                columns = {"sentence": names.index("sentence"), "label": names.index("label")}
                if id_column is not None:
                    columns["id"] = id_column
                width = len(fields)
                continue
            if len(fields) not in (2, 3):
                raise DatasetFormatError(path, line_no, f"expected 'sentence<TAB>label' or "
                                         f"'id<TAB>sentence<TAB>label', got {len(fields)} fields")
            width = len(fields)
            columns = {"sentence": 0, "label": 1} if width == 2 else {"id": 0, "sentence": 1, "label": 2}
        if len(fields) != width:
            raise DatasetFormatError(path, line_no, f"expected {width} tab-separated fields like the first "
                                     f"row, got {len(fields)}")
        try:
            text = fields[columns["sentence"]].strip()
            if not text:
                raise _FieldError("sentence", "is empty")
            text = sentence_check(text)
            label = label_check(_label_value(fields[columns["label"]]))
            example_id = fields[columns["id"]].strip() if "id" in columns else f"{_split_stem(path)}-{line_no}"
            if not example_id:
                raise _FieldError("id", "is empty")
        except _FieldError as err:
            raise _reraise(path, line_no, err) from None
        rows.append(_Row(RelationExample(example_id, text, text, (), label), line_no, example_id))
    return rows


_OFFSETS = re.compile(r"\d+-\d+(?:;\d+-\d+)*")
MAX_OFFSET_SHIFT = 2  # how far a DDI-style offset may be off and still be corrected (see _entity_from_offsets)


def _squeeze(text: str) -> str:
    return "".join(text.split())


def _entity_from_offsets(entity: Mapping, text: str, key: str) -> tuple[Entity, str | None]:
    """A DDI-style entity ``{"text", "type", "offset": "start-end[;start-end...]"}``, and a description
    of the correction its offsets needed (None when they were right).

    DDI's ends are inclusive (checked against every sentence); a file with exclusive ends (some
    ChemProt conversions) is recognised by which reading makes the offsets point at the entity text.
    A discontinuous mention's fragments must spell the mention, whitespace aside. The DDI corpus
    itself has a few mentions whose offsets are one character off (the discontinuous "(R)-warfarin"
    of DDI-DrugBank.d216.s16 points one character early); when shifting all fragments by at most
    :data:`MAX_OFFSET_SHIFT` makes them spell the mention exactly, the shifted offsets are used and the
    correction is reported, so every offset kept points at its mention. Anything else is an error.
    """
    mention = _string(entity, "text")
    entity_type = _string(entity, "type")
    offset = entity.get("offset")
    if not isinstance(offset, str) or not _OFFSETS.fullmatch(offset.strip()):
        raise _FieldError(f"{key}.offset", f"expected 'start-end' (or fragments joined by ';'), got {offset!r}")
    pairs = [tuple(int(n) for n in part.split("-")) for part in offset.strip().split(";")]
    shifts = [0] + [sign * n for n in range(1, MAX_OFFSET_SHIFT + 1) for sign in (1, -1)]
    for shift in shifts:
        for inclusive in (True, False):
            spans = tuple((a + shift, b + shift + inclusive) for a, b in pairs)
            if any(a < 0 or a >= b or b > len(text) for a, b in spans) or \
                    any(b > c for (_, b), (c, _) in zip(spans, spans[1:])):
                continue
            found = [text[a:b] for a, b in spans]
            if (len(spans) == 1 and found[0] == mention) or \
                    (len(spans) > 1 and _squeeze("".join(found)) == _squeeze(mention)):
                correction = None if shift == 0 else \
                    f"{key} offset {offset} shifted by {shift:+d} to point at {mention!r}"
                return Entity(spans[0][0], spans[-1][1], entity_type, mention, spans), correction
    raise _FieldError(f"{key}.offset", f"{offset!r} does not point at {mention!r} in the sentence "
                      f"(it holds {text[pairs[0][0]:pairs[-1][1] + 1]!r} there)")


def _entity_from_span(entity: Mapping, text: str, key: str) -> tuple[Entity, None]:
    """A generic entity ``{"start", "end", "type"[, "text"]}`` with an exclusive ``end``; never corrected."""
    start, end = entity.get("start"), entity.get("end")
    for name, value in (("start", start), ("end", end)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise _FieldError(f"{key}.{name}", f"expected an integer character offset, got {value!r}")
    if not 0 <= start < end <= len(text):
        raise _FieldError(f"{key}.end", f"span {start}-{end} is not inside the text ({len(text)} characters)")
    if not text[start:end].strip():  # no token would cover it: the entity could not be located after tokenizing
        raise _FieldError(f"{key}.end", f"span {start}-{end} holds only whitespace ({text[start:end]!r})")
    entity_type = _string(entity, "type")
    mention = _string(entity, "text", required=False)
    if mention is not None and text[start:end] != mention:
        raise _FieldError(f"{key}.text", f"{mention!r} is not what the offsets point at "
                          f"({text[start:end]!r}; 'end' is exclusive)")
    return Entity(start, end, entity_type, text[start:end]), None


def _within(key: str, parse: Callable[[Mapping, str, str], tuple[Entity, str | None]], entity: object,
            text: str) -> tuple[Entity, str | None]:
    """``parse(entity, text, key)`` with the fields of its errors named inside ``key`` (``e1.type``)."""
    if not isinstance(entity, dict):
        raise _FieldError(key, "expected an object")
    try:
        return parse(entity, text, key)
    except _FieldError as err:
        name = err.field if err.field and err.field.startswith(f"{key}.") else \
            f"{key}.{err.field}" if err.field else key
        raise _FieldError(name, err.message) from None


def _relation_record(record: Mapping, fallback_id: str, label_check: LabelCheck,
                     type_map: Mapping[str, str] | None) -> tuple[RelationExample, str | None]:
    """The generic ``{"id", "text", "entities": [...], "label"}`` or DDI's ``{"id", "sentence",
    "masked", "e1", "e2", "label"}`` (one reader, so ChemProt and GAD may come in either shape), and
    the offset corrections it needed (None when none). Each entity type must make a placeholder
    (:func:`finetune.relation_inputs.normalize_type` with the dataset's ``type_map``), as
    dummifying will need it."""
    _, text = _one_of(record, ("text", "sentence"))
    _, masked = _one_of(record, ("masked_text", "masked"), required=False)
    if "entities" in record:
        raw = record["entities"]
        if not isinstance(raw, list):
            raise _FieldError("entities", "expected a list of objects {start, end, type}")
        keys = [f"entities[{i}]" for i in range(len(raw))]
        parsed = [_within(key, _entity_from_span, e, text) for key, e in zip(keys, raw)]
        if len(raw) != 2:  # a relation instance is one pair; which two of more would be a guess
            raise _FieldError("entities", f"expected the relation's two entities, got {len(raw)}")
    elif "e1" in record or "e2" in record:
        keys = ["e1", "e2"]
        parsed = [_within(key, _entity_from_offsets, record.get(key), text) for key in keys]
    else:
        raise _FieldError("entities", "missing: give 'entities' (a list of {start, end, type}) or 'e1' and 'e2'")
    for key, (entity, _) in zip(keys, parsed):
        try:
            normalize_type(entity.type, type_map)
        except ValueError as err:
            raise _FieldError(f"{key}.type", str(err)) from None
    if "label" not in record:
        raise _FieldError("label", "missing")
    label = label_check(_label_value(record["label"]))
    example = RelationExample(_record_id(record, fallback_id), text, masked, tuple(e for e, _ in parsed), label)
    corrections = [c for _, c in parsed if c is not None]
    return example, ("; ".join(corrections) if corrections else None)


def _read_relation_jsonl(path: Path, label_check: LabelCheck, type_map: Mapping[str, str] | None) -> list[_Row]:
    rows = []
    for line_no, record in json_lines(path, DatasetFormatError):
        try:
            example, correction = _relation_record(record, f"{_split_stem(path)}-{line_no}", label_check, type_map)
        except _FieldError as err:
            raise _reraise(path, line_no, err) from None
        rows.append(_Row(example, line_no, example.id, correction))
    return rows


def _read_relation(path: Path, label_check: LabelCheck, sentence_check: SentenceCheck,
                   type_map: Mapping[str, str] | None = None) -> list[_Row]:
    """A JSONL file (entities with offsets, types through ``type_map``) or a TSV file (pre-dummified
    sentences, each checked by ``sentence_check``)."""
    if path.name.lower().endswith(".jsonl"):
        return _read_relation_jsonl(path, label_check, type_map)
    return _read_relation_tsv(path, label_check, sentence_check)


def _correction_notes(path: Path, rows: Sequence[_Row]) -> list[str]:
    """One note per file listing the corrections its rows needed (none: no note)."""
    corrected = [row for row in rows if row.correction is not None]
    if not corrected:
        return []
    listed = "; ".join(f"line {row.line} ({row.example.id}): {row.correction}" for row in corrected[:10])
    more = f"; and {len(corrected) - 10} more" if len(corrected) > 10 else ""
    return [f"{path.name}: {len(corrected)} example(s) had entity offsets off by a character or two in the "
            f"source and were corrected: {listed}{more}"]


# ----------------------------------------------------------------------------- similarity files

_SIMILARITY_COLUMNS = {"text_a": ("sentence1", "text_a"), "text_b": ("sentence2", "text_b"),
                       "score": ("score", "mean_score")}


def _score(raw: str, score_range: tuple[float, float] | None) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise _FieldError("score", f"{raw!r} is not a number") from None
    if not math.isfinite(value):
        raise _FieldError("score", f"{raw!r} is not a finite number")
    if score_range is not None and not score_range[0] <= value <= score_range[1]:
        raise _FieldError("score", f"{value} is outside [{score_range[0]:g}, {score_range[1]:g}]")
    return value


def _read_similarity(path: Path, score_range: tuple[float, float] | None = None) -> list[_Row]:
    """``text_a<TAB>text_b<TAB>score``, or a TSV whose header names ``sentence1``/``sentence2``/``score``
    (BLUE's BIOSSES, whose ``old_index`` column, unique over the 100 pairs, becomes the id)."""
    rows: list[_Row] = []
    columns: dict[str, int] | None = None
    width = 0
    for line_no, fields in _tsv_rows(path):
        if columns is None:
            names = [f.strip().lower() for f in fields]
            found = {key: next((names.index(n) for n in aliases if n in names), None)
                     for key, aliases in _SIMILARITY_COLUMNS.items()}
            width = len(fields)
            if found["text_a"] is not None and found["text_b"] is not None:
                if found["score"] is None:
                    raise DatasetFormatError(path, line_no, "the header names the sentences but no "
                                             "'score' column", "score")
                columns = dict(found)
                id_column = next((names.index(n) for n in ("old_index", "id") if n in names), None)
                if id_column is not None:
                    columns["id"] = id_column
                continue
            if width != 3:
                raise DatasetFormatError(path, line_no, f"expected 'text_a<TAB>text_b<TAB>score' (3 fields) "
                                         f"or a header naming sentence1, sentence2 and score; got {width} fields")
            columns = {"text_a": 0, "text_b": 1, "score": 2}
        if len(fields) != width:
            raise DatasetFormatError(path, line_no, f"expected {width} tab-separated fields like the first "
                                     f"row, got {len(fields)}")
        try:
            texts = {}
            for key in ("text_a", "text_b"):
                texts[key] = fields[columns[key]].strip()
                if not texts[key]:
                    raise _FieldError(key, "is empty")
            score = _score(fields[columns["score"]].strip(), score_range)
            example_id = fields[columns["id"]].strip() if "id" in columns else f"{_split_stem(path)}-{line_no}"
            if not example_id:
                raise _FieldError("id", "is empty")
        except _FieldError as err:
            raise _reraise(path, line_no, err) from None
        rows.append(_Row(SentencePairExample(example_id, texts["text_a"], texts["text_b"], score),
                         line_no, example_id))
    return rows


# ------------------------------------------------------------------------- classification files

def _string_list(record: Mapping, key: str) -> list[str]:
    value = record.get(key)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _FieldError(key, f"expected a list of strings, got {type(value).__name__}")
    return value


def _hoc_labels(sentence_labels: object, sentences: int) -> frozenset[str]:
    """The abstract's hallmarks: the union over its sentences of each label's top-level hallmark.

    HoC labels sentences with paths in its 37-class taxonomy, ``Top--Sub--Leaf`` (a trailing ``--``
    marks the hallmark itself); the first segment is one of the 10 top-level hallmarks. ``NULL``
    marks a sentence with no hallmark and contributes nothing.
    """
    if not isinstance(sentence_labels, list) or len(sentence_labels) != sentences or \
            not all(isinstance(s, list) and all(isinstance(x, str) for x in s) for s in sentence_labels):
        raise _FieldError("sentence_labels", f"expected a list of {sentences} lists of strings, one per sentence")
    canonical = {h.casefold(): h for h in HOC_HALLMARKS}
    found = set()
    for labels in sentence_labels:
        for label in labels:
            top = label.split("--")[0].strip()
            if top.casefold() == "null":
                continue
            if top.casefold() not in canonical:
                raise _FieldError("sentence_labels", f"{label!r}: {top!r} is not one of the 10 hallmarks "
                                  f"({', '.join(HOC_HALLMARKS)})")
            found.add(canonical[top.casefold()])
    return frozenset(found)


def _hoc_record(record: Mapping) -> DocumentExample:
    """HoC JSON Lines: ``{"pmid", "sentences", "sentence_labels"[, "doc_hallmarks"]}``. The
    document-level hallmarks, when given, must agree with the sentence labels: a disagreement means
    the file was built with another mapping."""
    pmid = record.get("pmid")
    if isinstance(pmid, bool) or not isinstance(pmid, (str, int)) or not str(pmid).strip():
        raise _FieldError("pmid", f"expected a PMID, got {pmid!r}")
    sentences = [s.strip() for s in _string_list(record, "sentences")]
    if not sentences or not all(sentences):
        raise _FieldError("sentences", "expected a non-empty list of non-empty sentences")
    labels = _hoc_labels(record.get("sentence_labels"), len(sentences))
    if "doc_hallmarks" in record:
        given = {h.strip().casefold() for h in _string_list(record, "doc_hallmarks")}
        if given != {h.casefold() for h in labels}:
            raise _FieldError("doc_hallmarks", f"{sorted(given)} disagrees with the hallmarks of the sentence "
                              f"labels {sorted(labels)}")
    return DocumentExample(str(pmid).strip(), " ".join(sentences), tuple(sentences), labels)


def _generic_document(record: Mapping, fallback_id: str, label_check: LabelCheck) -> DocumentExample:
    """Generic classification JSON Lines: ``{"id", "text", "labels": [...]}`` (``sentences`` optional)."""
    text = _string(record, "text")
    sentences = tuple(s.strip() for s in _string_list(record, "sentences")) if "sentences" in record else (text,)
    raw = record.get("labels")
    if not isinstance(raw, list):
        raise _FieldError("labels", f"expected a list of labels (possibly empty), got {raw!r}")
    labels = frozenset(label_check(_label_value(v, "labels")) for v in raw)
    return DocumentExample(_record_id(record, fallback_id), text.strip(), sentences, labels)


def _read_documents(path: Path, parse: Callable[[Mapping, str], DocumentExample]) -> list[_Row]:
    rows = []
    for line_no, record in json_lines(path, DatasetFormatError):
        try:
            example = parse(record, f"{_split_stem(path)}-{line_no}")
        except _FieldError as err:
            raise _reraise(path, line_no, err) from None
        rows.append(_Row(example, line_no, example.id))
    return rows


# ------------------------------------------------------------------------------------- QA files

_YES_NO = {"1": "yes", "yes": "yes", "0": "no", "no": "no"}


def _read_qa_tsv(path: Path) -> list[_Row]:
    """The BioASQ yes/no stand-in: ``label<TAB>question<TAB>context`` with an optional header
    (``yesno_label``/``label``, ``question``, ``ideal_answer``/``context``); labels 1/0 or yes/no."""
    rows: list[_Row] = []
    columns: dict[str, int] | None = None
    for line_no, fields in _plain_tsv_rows(path):
        if columns is None:
            names = [f.strip().lower() for f in fields]
            if "question" in names:
                label = next((n for n in ("yesno_label", "label", "answer") if n in names), None)
                context = next((n for n in ("ideal_answer", "context", "passage", "text") if n in names), None)
                if label is None or context is None:
                    raise DatasetFormatError(path, line_no, "the header names 'question' but not both a label "
                                             "column (yesno_label, label) and a context column (ideal_answer, "
                                             "context)", "label" if label is None else "context")
                columns = {"label": names.index(label), "question": names.index("question"),
                           "context": names.index(context), "width": len(fields)}
                continue
            columns = {"label": 0, "question": 1, "context": 2, "width": 3}
        if len(fields) != columns["width"]:
            raise DatasetFormatError(path, line_no, f"expected {columns['width']} tab-separated fields "
                                     f"(label, question, context), got {len(fields)}")
        try:
            raw_label = fields[columns["label"]].strip().lower()
            if raw_label not in _YES_NO:
                raise _FieldError("label", f"{raw_label!r} is not a yes/no answer (1, 0, yes, no)")
            question, context = fields[columns["question"]].strip(), fields[columns["context"]].strip()
            for name, value in (("question", question), ("context", context)):
                if not value:
                    raise _FieldError(name, "is empty")
        except _FieldError as err:
            raise _reraise(path, line_no, err) from None
        example = QAExample(f"{_split_stem(path)}-{line_no}", question, context, _YES_NO[raw_label])
        rows.append(_Row(example, line_no, " ".join(question.casefold().split())))
    return rows


def _read_qa_jsonl(path: Path, label_check: LabelCheck) -> list[_Row]:
    """Generic QA JSON Lines: ``{"id", "question", "context", "label"}``."""
    rows = []
    for line_no, record in json_lines(path, DatasetFormatError):
        try:
            question, context = _string(record, "question"), _string(record, "context")
            if "label" not in record:
                raise _FieldError("label", "missing")
            example = QAExample(_record_id(record, f"{_split_stem(path)}-{line_no}"), question.strip(),
                                context.strip(), label_check(_label_value(record["label"])))
        except _FieldError as err:
            raise _reraise(path, line_no, err) from None
        rows.append(_Row(example, line_no, " ".join(question.casefold().split())))
    return rows


def _json_document(path: Path) -> tuple[object, list[str]]:
    """A whole-file JSON document and its lines (to point errors at an entry's line)."""
    lines = [line for _, line in numbered_lines(path, DatasetFormatError)]
    try:
        return json.loads("\n".join(lines)), lines
    except json.JSONDecodeError as err:
        raise DatasetFormatError(path, err.lineno, f"not valid JSON: {err.msg} at column {err.colno}") from None


def _key_lines(lines: Sequence[str], keys: Iterable[str]) -> dict[str, int]:
    """The line on which each of ``keys`` of a pretty-printed JSON object first appears as a key
    (best effort: a key not found this way gets no line, and errors name the entry instead)."""
    wanted = set(keys)
    found: dict[str, int] = {}
    for number, line in enumerate(lines, 1):
        for key in re.findall(r'"([^"\\]+)"\s*:', line):
            if key in wanted and key not in found:
                found[key] = number
    return found


def _read_pubmedqa(questions: Path, ground_truth: Path) -> tuple[list[_Row], set[str]]:
    """``ori_pqal.json`` (PMID -> {QUESTION, CONTEXTS, final_decision, ...}) as examples, and the
    PMIDs of ``test_ground_truth.json`` (PMID -> answer), whose answers must agree."""
    data, lines = _json_document(questions)
    if not isinstance(data, dict) or not data:
        raise DatasetFormatError(questions, 1, "expected a JSON object mapping PMIDs to questions")
    where = _key_lines(lines, data)
    labels = _closed_labels(("yes", "no", "maybe"), case_insensitive=True, field_name="final_decision")
    rows: list[_Row] = []
    for pmid, entry in data.items():
        line = where.get(pmid)
        try:
            if not isinstance(entry, dict):
                raise _FieldError(None, "expected an object")
            question = _string(entry, "QUESTION").strip()
            contexts = [c.strip() for c in _string_list(entry, "CONTEXTS")]
            if not contexts or not all(contexts):
                raise _FieldError("CONTEXTS", "expected a non-empty list of non-empty passages")
            label = labels(_label_value(entry.get("final_decision"), "final_decision"))
        except _FieldError as err:
            raise DatasetFormatError(questions, line, f"entry {pmid!r}: {err.message}", err.field) from None
        rows.append(_Row(QAExample(pmid, question, " ".join(contexts), label), line, pmid))
    truth, truth_lines = _json_document(ground_truth)
    if not isinstance(truth, dict) or not truth:
        raise DatasetFormatError(ground_truth, 1, "expected a JSON object mapping PMIDs to yes/no/maybe")
    truth_where = _key_lines(truth_lines, truth)
    by_id = {row.example.id: row.example for row in rows}
    for pmid, answer in truth.items():
        line = truth_where.get(pmid)
        if pmid not in by_id:
            raise DatasetFormatError(ground_truth, line, f"PMID {pmid!r} is not a question in {questions.name}")
        if not isinstance(answer, str) or answer.strip().lower() != by_id[pmid].label:
            raise DatasetFormatError(ground_truth, line, f"PMID {pmid!r}: answer {answer!r} disagrees with "
                                     f"final_decision {by_id[pmid].label!r} in {questions.name}")
    return rows, set(truth)


# ---------------------------------------------------------------------------------- file lookup

def _split_stem(path: Path) -> str:
    """``train``/``dev``/``devel``/``test`` for a split file (``gad_blurb_dev.tsv`` -> ``dev``), the
    file's stem otherwise; example ids that come from positions are prefixed with it."""
    stem = path.name.split(".")[0].lower()
    tail = re.split(r"[_-]", stem)[-1]
    return tail if any(tail in stems for stems in _SPLIT_STEMS.values()) else stem


def _find_split_file(data_dir: Path, split: str, extensions: Sequence[str]) -> Path | None:
    """The file of one split: ``<split>.<ext>`` (``devel`` also for dev), else a single file named
    ``*_<split>.<ext>`` (``gad_blurb_train.tsv``, ``bio_electra_yesno_test.tsv``).

    Exact names win, so BioBERT's ``train_dev.tsv`` beside ``devel.tsv`` is not taken for dev; two
    candidates of the same rank are an error rather than a guess.
    """
    files = [p for p in data_dir.iterdir() if p.is_file()]
    names = [(f"{stem}.{ext}", ext) for stem in _SPLIT_STEMS[split] for ext in extensions]
    exact = [p for p in files if p.name.lower() in {n for n, _ in names}]
    suffixed = [p for p in files if any(p.name.lower().endswith(f"{sep}{n}") for n, _ in names for sep in "_-")]
    for found in (exact, suffixed):
        if len(found) > 1:
            raise InputError(f"{data_dir}: more than one {split} file ({', '.join(sorted(p.name for p in found))}); "
                             "keep one")
        if found:
            return found[0]
    return None


def _expected(data_dir: Path, split: str, extensions: Sequence[str]) -> str:
    stems = _SPLIT_STEMS[split]
    options = " or ".join(f"{data_dir / f'{s}.{e}'}" for s in stems for e in extensions)
    return f"{options} (or a file named *_{stems[0]}.{extensions[0]})"


def _require(data_dir: Path, split: str, extensions: Sequence[str], dataset: str) -> Path:
    path = _find_split_file(data_dir, split, extensions)
    if path is None:
        raise MissingDatasetFileError(f"{dataset}: no {split} file: expected {_expected(data_dir, split, extensions)}")
    return path


def _require_file(path: Path, dataset: str) -> Path:
    if not path.is_file():
        raise MissingDatasetFileError(f"{dataset}: expected the file {path}")
    return path


def _check_dir(data_dir: str | Path, dataset: str) -> Path:
    path = Path(data_dir)
    if not path.is_dir():
        raise MissingDatasetFileError(f"{dataset}: no such directory: {path}")
    return path


def _finish(path: Path, rows: list[_Row]) -> list[_Row]:
    """A split file's rows, checked: not empty, ids unique (derived splits and predictions key on them)."""
    if not rows:
        raise DatasetFormatError(path, None, "holds no examples")
    seen: dict[str, int | None] = {}
    for row in rows:
        if row.example.id in seen:
            first = seen[row.example.id]
            raise DatasetFormatError(path, row.line, f"duplicate id {row.example.id!r}"
                                     + (f" (first on line {first})" if first is not None else ""), "id")
        seen[row.example.id] = row.line
    return rows


# ------------------------------------------------------------------------------- derived splits

def seeded_partition(units: Iterable[str], sizes: Mapping[str, int], rest: str, *, seed: int,
                     salt: str) -> dict[str, str]:
    """Assign each distinct unit id to a part: ``sizes[part]`` units to each named part, in the
    order given, and every other unit to ``rest``.

    Units are ranked by the SHA-256 of ``salt``, ``seed`` and the id, so the assignment depends on
    nothing else: not on file order, not on Python's hash seed, not on the platform; and adding a
    unit moves no other unit between parts except through the size cut-offs. ``salt`` (the dataset
    name) keeps two datasets with shared ids from being split alike.
    """
    distinct = sorted(set(units))
    if sum(sizes.values()) > len(distinct):
        raise InputError(f"{salt}: cannot carve {dict(sizes)} out of {len(distinct)} units")
    ranked = sorted(distinct, key=lambda u: (hashlib.sha256(f"{salt}\0{seed}\0{u}".encode()).digest(), u))
    assignment: dict[str, str] = {}
    position = 0
    for part, size in sizes.items():
        for unit in ranked[position:position + size]:
            assignment[unit] = part
        position += size
    for unit in ranked[position:]:
        assignment[unit] = rest
    return assignment


def _proportional_size(total: int, fraction: Fraction, *, leave: int = 1) -> int:
    """``round(total * fraction)`` (halves up, exact arithmetic), at least 1 and leaving ``leave``."""
    if total < leave + 1:
        raise InputError(f"cannot carve a split out of {total} units")
    return min(total - leave, max(1, math.floor(total * fraction + Fraction(1, 2))))


def _carve(rows: Sequence[_Row], assignment: Mapping[str, str], parts: Sequence[str]) -> dict[str, list[Example]]:
    """The examples of each part, in file order."""
    carved: dict[str, list[Example]] = {part: [] for part in parts}
    for row in rows:
        carved[assignment[row.group]].append(row.example)
    return carved


def _examples(rows: Sequence[_Row]) -> list[Example]:
    return [row.example for row in rows]


# --------------------------------------------------------------------------------- dataset specs

@dataclass(frozen=True)
class DatasetSpec:
    """One BLURB dataset: what it is, its labels and metric, and the files its directory holds.

    ``blurb_sizes`` are the paper's Table 3 counts (train, dev, test) in the paper's units: entity
    mentions for NER, PIO element tokens for PICO, examples otherwise. ``max_length`` is the
    sub-words per input a run uses unless told otherwise (see :data:`DEFAULT_MAX_LENGTH`); the
    sweep and a single run both read it here.
    """

    name: str
    title: str
    task_type: str
    metric: str
    labels: tuple[str, ...]
    layout: str
    blurb_sizes: tuple[int, int, int]
    loader: Callable[[DatasetSpec, Path, int, bool], BlurbDataset] = field(repr=False, compare=False)
    negative_label: str | None = None
    max_length: int = DEFAULT_MAX_LENGTH


def _dataset(spec: DatasetSpec, splits: dict[str, list[Example]], notes: list[str]) -> BlurbDataset:
    ordered = {split: splits[split] for split in SPLITS if split in splits}
    return BlurbDataset(spec.name, spec.task_type, spec.metric, spec.labels, ordered, notes, spec.negative_label)


def _ner_loader(entity_type: str, source_types: Iterable[str]) -> Callable:
    source = frozenset(t.casefold() for t in source_types)

    def load(spec: DatasetSpec, data_dir: Path, seed: int, allow_missing_train: bool) -> BlurbDataset:
        check = _blurb_tag_check(entity_type, source)
        dev_path = _require(data_dir, DEV, ("tsv",), spec.name)
        test_path = _require(data_dir, TEST, ("tsv",), spec.name)
        train_path = _find_split_file(data_dir, TRAIN, ("tsv",))
        dev_rows = _finish(dev_path, _read_ner(dev_path, check))
        splits = {TEST: _examples(_finish(test_path, _read_ner(test_path, check)))}
        notes = []
        if train_path is not None:
            splits[TRAIN] = _examples(_finish(train_path, _read_ner(train_path, check)))
            splits[DEV] = _examples(dev_rows)
            notes.append(f"splits as distributed: {train_path.name}, {dev_path.name}, {test_path.name}")
        elif not allow_missing_train:
            raise MissingDatasetFileError(
                f"{spec.name}: no train file: expected {_expected(data_dir, TRAIN, ('tsv',))}. "
                f"Pass allow_missing_train=True to train on a seeded part of {dev_path.name} instead "
                "(scores are then not comparable to BLURB's)")
        else:
            groups = [row.group for row in dev_rows]
            n_dev = _proportional_size(len(set(groups)), CARVED_DEV_FRACTION)
            carved = _carve(dev_rows, seeded_partition(groups, {DEV: n_dev}, TRAIN, seed=seed, salt=spec.name),
                            (TRAIN, DEV))
            splits.update(carved)
            notes.append(f"no train file: train and dev are carved from {dev_path.name} by document "
                         f"(-DOCSTART- block, or sentence where there is none): {n_dev} of {len(set(groups))} "
                         f"documents to dev, the rest to train, seed {seed}; test is {test_path.name}. "
                         "Scores are not comparable to BLURB's")
        if len(source) > 1:
            notes.append(f"entity types {', '.join(sorted(source))} merged into one type '{entity_type}', "
                         "as BLURB does (mention detection only)")
        return _dataset(spec, splits, notes)

    return load


def _load_pico(spec: DatasetSpec, data_dir: Path, seed: int, allow_missing_train: bool) -> BlurbDataset:
    extensions = ("txt", "tsv")
    check = _pico_check(PICO_ELEMENTS, case_insensitive=True)
    dev_path = _require(data_dir, DEV, extensions, spec.name)
    test_path = _require(data_dir, TEST, extensions, spec.name)
    train_path = _find_split_file(data_dir, TRAIN, extensions)
    dev_rows = _finish(dev_path, _read_pico(dev_path, check))
    splits = {TEST: _examples(_finish(test_path, _read_pico(test_path, check)))}
    notes = ["an example is a blank-line-separated segment of an abstract, id PMID-k; elements are "
             "PAR/INT/OUT sets per token (SciBERT's release has one tag per token: its sets hold at most "
             "one element, overlaps having been removed from the larger span)"]
    if train_path is not None:
        splits[TRAIN] = _examples(_finish(train_path, _read_pico(train_path, check)))
        splits[DEV] = _examples(dev_rows)
        notes.append(f"splits as distributed: {train_path.name}, {dev_path.name}, {test_path.name}")
    else:
        abstracts = [row.group for row in dev_rows]
        n_dev = _proportional_size(len(set(abstracts)), CARVED_DEV_FRACTION)
        splits.update(_carve(dev_rows, seeded_partition(abstracts, {DEV: n_dev}, TRAIN, seed=seed, salt=spec.name),
                             (TRAIN, DEV)))
        notes.append(f"no train file (EBM-NLP's crowd-labelled train set is not here): training uses "
                     f"{dev_path.name}: {n_dev} of its {len(set(abstracts))} abstracts are held out as dev, "
                     f"the rest is train, seed {seed}; test is the expert-labelled {test_path.name}. "
                     "Scores are not comparable to BLURB's")
    return _dataset(spec, splits, notes)


# ChemProt as BLURB distributes it writes the pair's mentions as the words BC6ENTC (the chemical) and
# BC6ENTG (the gene) where other distributions write @CHEMICAL$ and @GENE$. Reading them as those
# placeholders gives the model the same input from either file. Any other mention in the sentence is
# BC6OTHER there (its own words elsewhere): it is left as the word it is, because it is not part of
# the pair (a placeholder would make it look like one) and its original words are not in the file.
_BC6_PAIR_MARKERS = MappingProxyType({"BC6ENTC": "@CHEMICAL$", "BC6ENTG": "@GENE$"})
_BC6_PAIR_PATTERN = re.compile(r"BC6ENT[CG]", re.IGNORECASE)  # lower-cased copies exist too


def _load_relation(spec: DatasetSpec, data_dir: Path, seed: int, allow_missing_train: bool) -> BlurbDataset:
    check = _closed_labels(spec.labels, case_insensitive=True)
    bc6_sentences = 0

    def bc6_as_placeholders(text: str) -> str:
        nonlocal bc6_sentences
        text, replaced = _BC6_PAIR_PATTERN.subn(lambda m: _BC6_PAIR_MARKERS[m.group(0).upper()], text)
        bc6_sentences += replaced > 0
        return text

    if spec.name == "chemprot":
        sentence_check = _placeholder_check(PLACEHOLDER_PAIRS["chemprot"], bc6_as_placeholders,
                                            " (BC6ENTC/BC6ENTG are read as @CHEMICAL$/@GENE$)")
    else:
        sentence_check = _placeholder_check(PLACEHOLDER_PAIRS[spec.name])
    splits, names, corrections = {}, [], []
    for split in SPLITS:
        found = [p for p in (_find_split_file(data_dir, split, (ext,)) for ext in ("tsv", "jsonl")) if p is not None]
        if len(found) > 1:
            raise InputError(f"{spec.name}: both {found[0].name} and {found[1].name} hold the {split} split; keep one")
        if not found:
            raise MissingDatasetFileError(f"{spec.name}: no {split} file: expected "
                                          f"{_expected(data_dir, split, ('tsv', 'jsonl'))}")
        rows = _finish(found[0], _read_relation(found[0], check, sentence_check, TYPE_MAPS[spec.name]))
        splits[split] = _examples(rows)
        names.append(found[0].name)
        corrections.extend(_correction_notes(found[0], rows))
    notes = [f"splits as distributed: {', '.join(names)}", *corrections]
    if any(n.lower().endswith(".tsv") for n in names):
        notes.append("TSV files hold the dummified sentence only: text = masked_text, entity offsets unknown")
    if bc6_sentences:
        notes.append(f"{bc6_sentences} sentence(s) wrote the pair as BC6ENTC/BC6ENTG: read as @CHEMICAL$/@GENE$; "
                     "BC6OTHER (an entity outside the pair) is kept as the word it is")
    return _dataset(spec, splits, notes)


def _load_biosses(spec: DatasetSpec, data_dir: Path, seed: int, allow_missing_train: bool) -> BlurbDataset:
    splits, names = {}, []
    for split in SPLITS:
        path = _require(data_dir, split, ("tsv",), spec.name)
        splits[split] = _examples(_finish(path, _read_similarity(path, (0.0, 4.0))))
        names.append(f"{path.name} ({len(splits[split])})")
    notes = [f"splits as distributed: {', '.join(names)}. The files here are BLUE's 70/16/14 split of the 100 "
             "pairs; BLURB uses 64/16/20, so test scores are not directly comparable"]
    return _dataset(spec, splits, notes)


def _load_hoc(spec: DatasetSpec, data_dir: Path, seed: int, allow_missing_train: bool) -> BlurbDataset:
    def parse(record: Mapping, _fallback_id: str) -> DocumentExample:
        return _hoc_record(record)  # HoC ids are PMIDs, never positions

    given = {split: _find_split_file(data_dir, split, ("jsonl",)) for split in SPLITS}
    mapping_note = ("labels: an abstract's hallmarks are the union over its sentences of each sentence label's "
                    "top-level hallmark (the part before the first '--'); 'NULL' sentences add none; "
                    f"{len(HOC_HALLMARKS)} labels, micro F1 over (abstract, hallmark) decisions")
    if any(given.values()):
        missing = [s for s, p in given.items() if p is None]
        if missing:
            raise MissingDatasetFileError(f"{spec.name}: split files are incomplete: no {missing[0]} file: "
                                          f"expected {_expected(data_dir, missing[0], ('jsonl',))}")
        splits = {s: _examples(_finish(p, _read_documents(p, parse))) for s, p in given.items()}
        return _dataset(spec, splits, [f"splits as distributed: {', '.join(p.name for p in given.values())}",
                                       mapping_note])
    path = _require_file(data_dir / "hoc_combined.jsonl", spec.name)
    rows = _finish(path, _read_documents(path, parse))
    total = sum(HOC_BLURB_SIZES.values())
    n_test = _proportional_size(len(rows), Fraction(HOC_BLURB_SIZES[TEST], total), leave=2)
    n_dev = _proportional_size(len(rows) - n_test, Fraction(HOC_BLURB_SIZES[DEV], total - HOC_BLURB_SIZES[TEST]))
    assignment = seeded_partition([r.group for r in rows], {TEST: n_test, DEV: n_dev}, TRAIN, seed=seed,
                                  salt=spec.name)
    splits = _carve(rows, assignment, SPLITS)
    notes = [f"no official split here: {path.name}'s {len(rows)} abstracts are split by PMID in BLURB's "
             f"proportions {HOC_BLURB_SIZES[TRAIN]}/{HOC_BLURB_SIZES[DEV]}/{HOC_BLURB_SIZES[TEST]} -> "
             f"{len(splits[TRAIN])}/{len(splits[DEV])}/{len(splits[TEST])}, seed {seed}; the abstracts differ "
             "from BLURB's own split, so scores are close to but not exactly comparable", mapping_note]
    return _dataset(spec, splits, notes)


def _load_pubmedqa(spec: DatasetSpec, data_dir: Path, seed: int, allow_missing_train: bool) -> BlurbDataset:
    questions = _require_file(data_dir / "ori_pqal.json", spec.name)
    ground_truth = _require_file(data_dir / "test_ground_truth.json", spec.name)
    rows, test_ids = _read_pubmedqa(questions, ground_truth)
    rest = [row for row in rows if row.group not in test_ids]
    total = sum(PUBMEDQA_BLURB_SIZES.values())
    n_dev = _proportional_size(len(rest), Fraction(PUBMEDQA_BLURB_SIZES[DEV], total))
    assignment = {row.group: TEST for row in rows if row.group in test_ids}
    assignment.update(seeded_partition([r.group for r in rest], {DEV: n_dev}, TRAIN, seed=seed, salt=spec.name))
    splits = _carve(rows, assignment, SPLITS)
    notes = [f"test: the {len(test_ids)} PMIDs of {ground_truth.name}; the other {len(rest)} questions of "
             f"{questions.name} are split {len(splits[TRAIN])}/{len(splits[DEV])} train/dev by PMID, seed "
             f"{seed} (BLURB: 450/50, the PubMedQA authors' fold; the dev questions differ)",
             "context: the abstract's CONTEXTS passages joined with a space (the conclusion, LONG_ANSWER, "
             "is left out as in PubMedQA's reasoning-required setting); label: final_decision"]
    return _dataset(spec, splits, notes)


def _load_bioasq(spec: DatasetSpec, data_dir: Path, seed: int, allow_missing_train: bool) -> BlurbDataset:
    train_path = _require(data_dir, TRAIN, ("tsv",), spec.name)
    test_path = _require(data_dir, TEST, ("tsv",), spec.name)
    dev_path = _find_split_file(data_dir, DEV, ("tsv",))
    train_rows = _finish(train_path, _read_qa_tsv(train_path))
    splits = {TEST: _examples(_finish(test_path, _read_qa_tsv(test_path)))}
    notes = []
    if dev_path is not None:
        splits[TRAIN] = _examples(train_rows)
        splits[DEV] = _examples(_finish(dev_path, _read_qa_tsv(dev_path)))
        notes.append(f"splits as distributed: {train_path.name}, {dev_path.name}, {test_path.name}")
    else:
        questions = [row.group for row in train_rows]
        n_dev = _proportional_size(len(set(questions)), CARVED_DEV_FRACTION)
        splits.update(_carve(train_rows, seeded_partition(questions, {DEV: n_dev}, TRAIN, seed=seed, salt=spec.name),
                             (TRAIN, DEV)))
        notes.append(f"no dev file: {n_dev} of the {len(set(questions))} distinct questions of {train_path.name} "
                     f"are held out as dev (a repeated question stays on one side), seed {seed}; test is "
                     f"{test_path.name}")
    notes.append("context: the file's third column. In the BioASQ yes/no stand-in that is the ideal answer, "
                 "not BioASQ's reference snippets, so its scores are not comparable to BLURB's BioASQ")
    return _dataset(spec, splits, notes)


def _bio_labels(entity_type: str) -> tuple[str, ...]:
    return "O", f"B-{entity_type}", f"I-{entity_type}"


BLURB_DATASETS: Mapping[str, DatasetSpec] = MappingProxyType({spec.name: spec for spec in (
    DatasetSpec("bc5-chem", "BC5-chem", NER, ENTITY_F1, _bio_labels("Chemical"),
                "{train,devel,test}.tsv: token<TAB>tag (B-Chemical/I-Chemical/O, or bare B/I/O)",
                (5203, 5347, 5385), loader=_ner_loader("Chemical", ["chemical"])),
    DatasetSpec("bc5-disease", "BC5-disease", NER, ENTITY_F1, _bio_labels("Disease"),
                "{train,devel,test}.tsv: token<TAB>tag (B-Disease/I-Disease/O, or bare B/I/O)",
                (4182, 4244, 4424), loader=_ner_loader("Disease", ["disease"])),
    DatasetSpec("ncbi-disease", "NCBI-disease", NER, ENTITY_F1, _bio_labels("Disease"),
                "{train,devel,test}.tsv: token<TAB>tag (B-Disease/I-Disease/O, or bare B/I/O)",
                (5134, 787, 960), loader=_ner_loader("Disease", ["disease"])),
    DatasetSpec("bc2gm", "BC2GM", NER, ENTITY_F1, _bio_labels("GENE"),
                "{train,devel,test}.tsv: token<TAB>tag (B-GENE/I-GENE/O, or bare B/I/O)",
                (15197, 3061, 6325), loader=_ner_loader("GENE", ["gene"])),
    DatasetSpec("jnlpba", "JNLPBA", NER, ENTITY_F1, _bio_labels("Entity"),
                "{train,devel,test}.tsv: token<TAB>tag with types DNA, RNA, cell_line, cell_type, protein "
                "(merged into one type); -DOCSTART- lines between abstracts",
                (46750, 4551, 8662), loader=_ner_loader("Entity", ["DNA", "RNA", "cell_line", "cell_type", "protein"])),
    DatasetSpec("ebm-pico", "EBM PICO", PICO, PICO_TOKEN_MACRO_F1, PICO_ELEMENTS,
                "{dev,test}.txt (train.txt if present): 'token POS O tag' lines, tags I-PAR/I-INT/I-OUT/O, "
                "'-DOCSTART- (PMID)' before each abstract",
                (339167, 85321, 16364), loader=_load_pico),
    DatasetSpec("chemprot", "ChemProt", RELATION, MICRO_F1_POSITIVE,
                ("False", "CPR:3", "CPR:4", "CPR:5", "CPR:6", "CPR:9"),
                "{train,dev,test}.tsv (sentence<TAB>label, the pair as @CHEMICAL$/@GENE$ or BC6ENTC/BC6ENTG, "
                "optional header/id column) or {train,dev,test}.jsonl (DDI-style records)",
                (18035, 11268, 15745), loader=_load_relation, negative_label="False", max_length=256),
    DatasetSpec("ddi", "DDI", RELATION, MICRO_F1_POSITIVE,
                ("DDI-false", "DDI-mechanism", "DDI-effect", "DDI-advise", "DDI-int"),
                "{train,dev,test}.jsonl or ddi_blurb_{train,dev,test}.jsonl: {id, sentence, masked, e1, e2, label}, "
                "entity offsets 'start-end' with inclusive end (or .tsv like GAD)",
                (25296, 2496, 5716), loader=_load_relation, negative_label="DDI-false", max_length=256),
    DatasetSpec("gad", "GAD", RELATION, F1_POSITIVE, ("0", "1"),
                "{train,dev,test}.tsv or gad_blurb_{train,dev,test}.tsv: sentence<TAB>label (1/0), "
                "@GENE$/@DISEASE$ dummified, optional header",
                (4261, 535, 534), loader=_load_relation, negative_label="0", max_length=128),
    DatasetSpec("biosses", "BIOSSES", SIMILARITY, PEARSON, (),
                "{train,dev,test}.tsv: BLUE's TSV with a header naming sentence1, sentence2, score (fields may be "
                "quoted)",
                (64, 16, 20), loader=_load_biosses, max_length=256),
    DatasetSpec("hoc", "HoC", CLASSIFICATION, MICRO_F1_MULTILABEL, HOC_HALLMARKS,
                "hoc_combined.jsonl: {pmid, sentences, sentence_labels[, doc_hallmarks]} per abstract (split "
                "derived), or {train,dev,test}.jsonl in the same format",
                (1295, 186, 371), loader=_load_hoc, max_length=512),
    DatasetSpec("pubmedqa", "PubMedQA", QA, ACCURACY, ("yes", "no", "maybe"),
                "ori_pqal.json (PMID -> {QUESTION, CONTEXTS, final_decision, ...}) and test_ground_truth.json "
                "(PMID -> answer)",
                (450, 50, 500), loader=_load_pubmedqa, max_length=QA_MAX_LENGTH),
    DatasetSpec("bioasq", "BioASQ", QA, ACCURACY, ("yes", "no"),
                "{train,test}.tsv (dev.tsv optional) or *_train.tsv/*_test.tsv: label<TAB>question<TAB>context, "
                "labels 1/0 or yes/no, optional header",
                (670, 75, 140), loader=_load_bioasq, max_length=QA_MAX_LENGTH),
)})

_ALIASES = MappingProxyType({
    "bc5cdrchem": "bc5-chem", "bc5chemical": "bc5-chem", "bc5cdrchemical": "bc5-chem",
    "bc5cdrdisease": "bc5-disease", "ebmnlp": "ebm-pico", "ebmpico": "ebm-pico",
    "bioasqyesno": "bioasq", "bioasqyesnoproxy": "bioasq",
})


def _name_key(name: str) -> str:
    return re.sub(r"[-_\s]", "", name.strip().lower())


def blurb_dataset_names() -> tuple[str, ...]:
    """The 13 BLURB dataset names, in the paper's Table 3 order."""
    return tuple(BLURB_DATASETS)


def canonical_dataset_name(name: str) -> str:
    """The canonical name for ``name``: case and ``-``/``_`` do not matter (``NCBI_Disease`` is
    ``ncbi-disease``), and a few common spellings (``BC5CDR-chem``, ``EBM-NLP``) are accepted."""
    key = _name_key(name)
    by_key = {_name_key(n): n for n in BLURB_DATASETS}
    if key in by_key:
        return by_key[key]
    if key in _ALIASES:
        return _ALIASES[key]
    raise UnknownDatasetError(f"unknown BLURB dataset {name!r}; valid names: {', '.join(BLURB_DATASETS)}")


def blurb_spec(name: str) -> DatasetSpec:
    """The :class:`DatasetSpec` of a BLURB dataset name (see :func:`canonical_dataset_name`)."""
    return BLURB_DATASETS[canonical_dataset_name(name)]


def default_max_length(dataset: str, task_type: str | None = None) -> int:
    """Sub-words per input for a run that sets none: the BLURB dataset's own (:class:`DatasetSpec`),
    or for a generic dataset (``task_type`` given) its task type's: 512 for QA, else 128."""
    if task_type is not None:
        return QA_MAX_LENGTH if task_type == QA else DEFAULT_MAX_LENGTH
    return blurb_spec(dataset).max_length


def load_blurb_dataset(name: str, data_dir: str | Path, *, split_seed: int = DEFAULT_SPLIT_SEED,
                       allow_missing_train: bool = False) -> BlurbDataset:
    """Read one of the 13 BLURB datasets from its own directory (``.../ner/NCBI-disease``).

    ``split_seed`` fixes the splits that are derived rather than given (HoC; PubMedQA train/dev;
    BioASQ and EBM PICO dev; JNLPBA train/dev with ``allow_missing_train``). ``allow_missing_train``
    lets an NER dataset without a train file train on a seeded 90% of its dev file's documents
    instead of failing (JNLPBA here); the notes say so.
    """
    spec = blurb_spec(name)
    return spec.loader(spec, _check_dir(data_dir, spec.name), split_seed, allow_missing_train)


# ------------------------------------------------------------------------------ generic datasets

_GENERIC_EXTENSIONS = {NER: ("tsv",), PICO: ("tsv",), RELATION: ("jsonl", "tsv"), SIMILARITY: ("tsv",),
                       CLASSIFICATION: ("jsonl",), QA: ("jsonl",)}
_GENERIC_METRICS = {NER: ENTITY_F1, PICO: PICO_TOKEN_MACRO_F1, SIMILARITY: PEARSON,
                    CLASSIFICATION: MICRO_F1_MULTILABEL, QA: ACCURACY}


def _generic_reader(task_type: str, labels: Sequence[str] | None, *,
                    from_training_file: bool = False) -> Callable[[Path], list[_Row]]:
    label_check = _closed_labels(labels, case_insensitive=False) if labels is not None else _open_labels()
    if task_type == NER:
        tags = _generic_tag_check(labels, by_entity_type=from_training_file)
        return lambda path: _read_ner(path, tags)
    if task_type == PICO:
        elements = _pico_check(labels, case_insensitive=False)
        return lambda path: _read_pico(path, elements)
    if task_type == RELATION:
        return lambda path: _read_relation(path, label_check, _placeholder_check(None))
    if task_type == SIMILARITY:
        return _read_similarity
    if task_type == CLASSIFICATION:
        label_check = _closed_labels(labels, case_insensitive=False, field_name="labels") if labels is not None \
            else _open_labels("labels")
        return lambda path: _read_documents(path, lambda record, fallback: _generic_document(record, fallback,
                                                                                               label_check))
    return lambda path: _read_qa_jsonl(path, label_check)


def _inferred_labels(task_type: str, splits: Mapping[str, list[Example]]) -> tuple[str, ...]:
    examples = [e for split in splits.values() for e in split]
    if task_type == NER:
        return _tag_order(t for e in examples for t in e.tags)
    if task_type == PICO:
        return tuple(sorted({x for e in examples for s in e.elements for x in s}))
    if task_type == CLASSIFICATION:
        return tuple(sorted({x for e in examples for x in e.labels}))
    if task_type == SIMILARITY:
        return ()
    return tuple(sorted({e.label for e in examples}))


def _read_generic_splits(task_type: str, paths: Mapping[str, Path], labels: tuple[str, ...] | None
                         ) -> tuple[dict[str, list[_Row]], tuple[str, ...]]:
    """Every split's rows and the label set. Without given ``labels`` the training file defines
    them, and a dev or test label it lacks is an error naming its file and line: a typo there must
    not become a class the model never trained on (nor a silently lower score)."""
    if labels is not None:
        read = _generic_reader(task_type, labels)
        return {s: _finish(p, read(p)) for s, p in paths.items()}, labels
    rows = {TRAIN: _finish(paths[TRAIN], _generic_reader(task_type, None)(paths[TRAIN]))}
    labels = _inferred_labels(task_type, {TRAIN: _examples(rows[TRAIN])})
    read = _generic_reader(task_type, labels, from_training_file=True)
    rows.update({s: _finish(p, read(p)) for s, p in paths.items() if s != TRAIN})
    if task_type == NER:  # every tag spelling of the training file's entity types
        labels = _tag_order(t for r in rows.values() for e in _examples(r) for t in e.tags)
    return rows, labels


def load_generic_dataset(task_type: str, data_dir: str | Path, labels: Sequence[str] | None = None, *,
                         name: str | None = None, negative_label: str | None = None) -> BlurbDataset:
    """Read a user's dataset in the generic format of ``task_type`` from ``data_dir``.

    Files: ``train`` is required, ``dev`` (or ``devel``) and ``test`` are optional, each
    ``<split>.tsv`` or ``<split>.jsonl`` by task (``docs/datasets.md``). ``labels`` fixes the label
    order and rejects any other label (with its file and line); without it the labels are those of
    the training file, sorted (``O`` first for NER), and a dev/test label outside them (for NER: an
    entity type) is an error naming its file and line. For relation extraction, ``negative_label`` names the
    "no relation" label and makes the metric micro F1 over the other labels; without it the metric
    is accuracy. ``name`` defaults to the directory's name.
    """
    if task_type not in TASK_TYPES:
        raise InputError(f"unknown task type {task_type!r}; valid task types: {', '.join(TASK_TYPES)}")
    if labels is not None:
        labels = tuple(labels)
        if task_type == SIMILARITY and labels:
            raise InputError("similarity is a regression: it takes no labels")
        if len(set(labels)) != len(labels) or not all(isinstance(x, str) and x.strip() for x in labels):
            raise InputError(f"labels must be distinct non-empty strings, got {list(labels)}")
    data_dir = _check_dir(data_dir, name or str(data_dir))
    name = name or data_dir.name
    extensions = _GENERIC_EXTENSIONS[task_type]
    paths = {TRAIN: _require(data_dir, TRAIN, extensions, name)}
    paths.update({s: p for s in (DEV, TEST) if (p := _find_split_file(data_dir, s, extensions)) is not None})
    rows, labels = _read_generic_splits(task_type, paths, labels)
    splits = {s: _examples(r) for s, r in rows.items()}
    if task_type == RELATION:
        if negative_label is not None and negative_label not in labels:
            raise InputError(f"negative_label {negative_label!r} is not one of the labels ({', '.join(labels)})")
        metric = MICRO_F1_POSITIVE if negative_label is not None else ACCURACY
    elif negative_label is not None:
        raise InputError("negative_label applies to relation extraction only")
    else:
        metric = _GENERIC_METRICS[task_type]
    notes = [f"generic {task_type} format: {', '.join(f'{s}: {p.name}' for s, p in paths.items())}"]
    notes.extend(n for s, p in paths.items() for n in _correction_notes(p, rows[s]))
    missing = [s for s in SPLITS if s not in paths]
    if missing:
        notes.append(f"no {' or '.join(missing)} file")
    if task_type == RELATION and negative_label is None:
        notes.append("no negative_label given: the metric is accuracy")
    ordered = {s: splits[s] for s in SPLITS if s in splits}
    return BlurbDataset(name, task_type, metric, tuple(labels), ordered, notes, negative_label)
