"""Readers of token-per-line files: NER (``token<TAB>tag``) and EBM PICO (``token POS O tag``).

A blank line ends a sentence (PICO: a segment of an abstract); ``-DOCSTART-`` opens a document, with
its PMID in parentheses in EBM-NLP. A derived split keeps a document together. The files are read
by their layouts' reader (:func:`tokenization.blurb_files.read_token_sentences`); this module checks
the tags.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

from biomed_lm.errors import InputError
from biomed_lm.finetune.blurb import DEV, ENTITY_F1, PICO_TOKEN_MACRO_F1, TEST, TRAIN, BlurbEntry
from biomed_lm.finetune.readers.base import (CARVED_DEV_FRACTION, GenericFormat, LabelCheck, MissingDatasetFileError,
                                             _carve, _closed_labels, _examples, _find_split_file, _finish,
                                             _proportional_size, _require, _Row, _split_stem, expected_split_file,
                                             make_dataset, seeded_partition)
from biomed_lm.finetune.readers.examples import BlurbDataset, Example, PicoExample, TokenTaggingExample
from biomed_lm.finetune.tagging import TagSequenceError, validate_tags
from biomed_lm.tokenization.blurb_files import (FieldError, read_token_sentences, token_pos_chunk_tag_fields,
                                                token_tag_fields)

__all__ = ["load_token_tags", "load_ebm_nlp", "NER_FORMAT", "PICO_FORMAT"]

_TAG_PREFIXES = ("B", "I", "E", "S", "L", "U")  # BIO plus the BIOES/BILOU extras a generic file may use


# ------------------------------------------------------------------------------------- tags

def _split_tag(tag: str) -> tuple[str, str | None]:
    """``("B", "Disease")`` for ``B-Disease``; ``("B", None)`` for a bare ``B``; ``("O", None)``."""
    prefix, dash, entity_type = tag.partition("-")
    if tag == "O":
        return "O", None
    if prefix not in _TAG_PREFIXES or (dash and not entity_type):
        raise FieldError("tag", f"{tag!r} is not a BIO tag (O, B-TYPE, I-TYPE, or bare B/I)")
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
            raise FieldError("tag", f"{raw!r}: BLURB's NER files use BIO tags only")
        if found is not None and found.casefold() not in source_types:
            raise FieldError("tag", f"{raw!r}: entity type {found!r} is not one of this dataset's "
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
                raise FieldError("tag", f"{tag!r}: entity type {_split_tag(tag)[1]!r} does not occur in the "
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
            raise FieldError("tag", "is empty")
        if tag == "O":
            return frozenset()
        found = set()
        for part in tag.split("|"):
            part = part.strip()
            name = part[2:] if part[:2] in ("B-", "I-") else part
            if not name or name == "O":
                raise FieldError("tag", f"{raw!r}: {part!r} is not a PICO element (tags are O, or "
                                 "elements such as I-PAR joined by '|')")
            found.add(closed(name) if closed is not None else name)
        return frozenset(found)

    return check


# ----------------------------------------------------------------------------- token-per-line files

def _ner_line_parser(tag_check: LabelCheck) -> Callable[[str], tuple[str, str]]:
    """A ``token_tags`` line, its tag checked."""
    def parse(line: str) -> tuple[str, str]:
        token, tag = token_tag_fields(line)
        return token, tag_check(tag)

    return parse


def _pico_line_parser(element_check: Callable[[str], frozenset[str]]) -> Callable[[str], tuple[str, frozenset]]:
    """A ``token_pos_chunk_tag`` line (EBM-NLP's ``token POS O tag``, or ``token<TAB>tag``), its tag
    read as a set of PIO elements."""
    def parse(line: str) -> tuple[str, frozenset]:
        token, tag = token_pos_chunk_tag_fields(line)
        return token, element_check(tag)

    return parse


def _read_ner(path: Path, tag_check: LabelCheck) -> list[_Row]:
    """One example per sentence; a derived split keeps a ``-DOCSTART-`` document together."""
    rows = []
    for s in read_token_sentences(path, _ner_line_parser(tag_check)):
        example = TokenTaggingExample(f"{_split_stem(path)}-{s.index}", s.tokens, s.values)
        rows.append(_Row(example, s.line, s.document or f"sentence{s.index}"))
    return rows


def _read_pico(path: Path, element_check: Callable[[str], frozenset[str]]) -> list[_Row]:
    """One example per blank-line-separated segment, id ``PMID-k``; a derived split keeps an abstract
    together."""
    rows = []
    for s in read_token_sentences(path, _pico_line_parser(element_check)):
        if s.document is not None:
            example_id, group = f"{s.document}-{s.index_in_document}", s.document
        else:
            example_id, group = f"{_split_stem(path)}-{s.index}", f"sentence{s.index}"
        rows.append(_Row(PicoExample(example_id, s.tokens, s.values), s.line, group))
    return rows


# ---------------------------------------------------------------------------------- loaders

CarveNote = Callable[[str, str, int, int, int], str]  # (dev file, test file, dev units, units, seed) -> note


def _carved_by_document(dev: str, test: str, n_dev: int, units: int, seed: int) -> str:
    return (f"no train file: train and dev are carved from {dev} by document (-DOCSTART- block, or sentence "
            f"where there is none): {n_dev} of {units} documents to dev, the rest to train, seed {seed}; test is "
            f"{test}. Scores are not comparable to BLURB's")


def _carved_by_abstract(dev: str, test: str, n_dev: int, units: int, seed: int) -> str:
    return (f"no train file (EBM-NLP's crowd-labelled train set is not here): training uses {dev}: {n_dev} of its "
            f"{units} abstracts are held out as dev, the rest is train, seed {seed}; test is the expert-labelled "
            f"{test}. Scores are not comparable to BLURB's")


def _train_or_carved(entry: BlurbEntry, data_dir: Path, extensions: Sequence[str], read: Callable[[Path], list[_Row]],
                     seed: int, carve_note: CarveNote) -> tuple[dict[str, list[Example]], list[str], str | None]:
    """Test and dev as given; train as given, or carved with dev out of the dev file (by document)
    when there is no train file. The notes say which, and how; the last item how that differs from BLURB."""
    dev_path = _require(data_dir, DEV, extensions, entry.name)
    test_path = _require(data_dir, TEST, extensions, entry.name)
    train_path = _find_split_file(data_dir, TRAIN, extensions)
    dev_rows = _finish(dev_path, read(dev_path))
    splits = {TEST: _examples(_finish(test_path, read(test_path)))}
    if train_path is not None:
        splits[TRAIN] = _examples(_finish(train_path, read(train_path)))
        splits[DEV] = _examples(dev_rows)
        return splits, [f"splits as distributed: {train_path.name}, {dev_path.name}, {test_path.name}"], None
    groups = [row.group for row in dev_rows]
    n_dev = _proportional_size(len(set(groups)), CARVED_DEV_FRACTION)
    splits.update(_carve(dev_rows, seeded_partition(groups, {DEV: n_dev}, TRAIN, seed=seed, salt=entry.name),
                         (TRAIN, DEV)))
    return (splits, [carve_note(dev_path.name, test_path.name, n_dev, len(set(groups)), seed)],
            f"no train file: train carved from {dev_path.name}")


def load_token_tags(entry: BlurbEntry, data_dir: Path, seed: int, allow_missing_train: bool) -> BlurbDataset:
    """A BLURB NER dataset: ``{train,devel,test}.tsv``, tags mapped onto the entry's one entity type.
    Without a train file it fails unless ``allow_missing_train`` (then train is carved from dev)."""
    source = frozenset(t.casefold() for t in entry.source_types)
    check = _blurb_tag_check(entry.entity_type, source)
    if not allow_missing_train and _find_split_file(data_dir, TRAIN, ("tsv",)) is None:
        dev_path = _require(data_dir, DEV, ("tsv",), entry.name)
        _require(data_dir, TEST, ("tsv",), entry.name)
        raise MissingDatasetFileError(
            f"{entry.name}: no train file: expected {expected_split_file(data_dir, TRAIN, ('tsv',))}. "
            f"Pass allow_missing_train=True to train on a seeded part of {dev_path.name} instead "
            "(scores are then not comparable to BLURB's)")
    warnings: list[str] = []

    def read(path: Path) -> list[_Row]:
        rows = _read_ner(path, check)
        warnings.extend(_orphan_inside_tags(path, rows))  # on the merged type: what is trained and scored
        return rows

    splits, notes, differs = _train_or_carved(entry, data_dir, ("tsv",), read, seed, _carved_by_document)
    if len(source) > 1:
        notes.append(f"entity types {', '.join(sorted(source))} merged into one type '{entry.entity_type}', "
                     "as BLURB does (mention detection only)")
    return make_dataset(entry, splits, notes, warnings, differs_from_blurb=differs)


def load_ebm_nlp(entry: BlurbEntry, data_dir: Path, seed: int, allow_missing_train: bool) -> BlurbDataset:
    """EBM PICO as SciBERT distributes it: ``{dev,test}.txt`` (train.txt if present; EBM-NLP's
    crowd-labelled train set is not, so train is carved from dev by abstract)."""
    check = _pico_check(entry.labels, case_insensitive=True)
    splits, notes, differs = _train_or_carved(entry, data_dir, ("txt", "tsv"), lambda path: _read_pico(path, check),
                                              seed, _carved_by_abstract)
    notes.insert(0, "an example is a blank-line-separated segment of an abstract, id PMID-k; elements are "
                    "PAR/INT/OUT sets per token (SciBERT's release has one tag per token: its sets hold at most "
                    "one element, overlaps having been removed from the larger span)")
    return make_dataset(entry, splits, notes, differs_from_blurb=differs)


# ---------------------------------------------------------------------------- generic formats

def _given_types_check(types: Sequence[str]) -> LabelCheck:
    """A generic NER tag whose entity type is one of the ``types`` a user gave (any tag prefix)."""
    tag_like = [t for t in types if _split_tag_or_none(t) is not None]
    if tag_like:
        raise InputError(f"NER labels are entity types (Chemical,Disease), or every tag including O; "
                         f"{', '.join(map(repr, tag_like))} look like tags")

    def check(raw: str) -> str:
        tag = raw.strip()
        prefix, entity_type = _split_tag(tag)
        if prefix != "O" and entity_type is None:
            raise FieldError("tag", f"{tag!r} names no entity type (the labels given are entity types: "
                             f"{', '.join(types)})")
        if prefix != "O" and entity_type not in types:
            raise FieldError("tag", f"{tag!r}: entity type {entity_type!r} is not one of the labels given "
                             f"({', '.join(types)})")
        return tag

    return check


def _split_tag_or_none(text: str) -> tuple[str, str | None] | None:
    """``_split_tag(text)`` for a prefixed tag (``B-Gene``), None for anything else (``Gene``, ``O``)."""
    try:
        prefix, entity_type = _split_tag(text)
    except FieldError:
        return None
    return (prefix, entity_type) if entity_type is not None else None


def _given_ner_labels(labels: tuple[str, ...], examples: Sequence[Example]) -> tuple[str, ...]:
    """Given tags (with ``O``) as given; given entity types as their tags, types in the order given:
    ``B-`` and ``I-`` of each, and any other prefix the files write (BIOES ``E-``/``S-``)."""
    if "O" in labels:
        return labels
    seen = {tag for example in examples for tag in example.tags}
    tags = ["O"]
    for entity_type in labels:
        own = {t for t in seen if _split_tag(t)[1] == entity_type} | {f"B-{entity_type}", f"I-{entity_type}"}
        tags.extend(sorted(own, key=lambda t: _TAG_PREFIXES.index(_split_tag(t)[0])))
    return tuple(tags)


def _mention_starts(row: _Row) -> Iterator[tuple[str, int]]:
    """``(entity type, line)`` of each mention of a sentence (its tokens are on consecutive lines)."""
    previous = None
    for offset, tag in enumerate(row.example.tags):
        prefix, entity_type = _split_tag(tag)
        if entity_type is not None and (prefix in ("B", "S", "U") or entity_type != previous):
            yield entity_type, row.line + offset
        previous = entity_type


def _span_starts(row: _Row) -> Iterator[tuple[str, int]]:
    """``(element, line)`` where each stretch of words holding a PICO element begins."""
    previous: frozenset[str] = frozenset()
    for offset, elements in enumerate(row.example.elements):
        for element in sorted(elements - previous):
            yield element, row.line + offset
        previous = elements


def _generic_ner_reader(labels: Sequence[str] | None, from_training_file: bool) -> Callable[[Path], list[_Row]]:
    # given labels without O are entity types (what users name); with O, every tag, checked exactly
    if labels is not None and not from_training_file and "O" not in labels:
        tags = _given_types_check(labels)
    else:
        tags = _generic_tag_check(labels, by_entity_type=from_training_file)
    return lambda path: _read_ner(path, tags)


def _generic_pico_reader(labels: Sequence[str] | None, from_training_file: bool) -> Callable[[Path], list[_Row]]:
    elements = _pico_check(labels, case_insensitive=False)
    return lambda path: _read_pico(path, elements)


#: Longer "sentences" than this in a NER file are most likely several run together (the longest in BLURB's
#: NER files: 208 tokens, JNLPBA's test set); one sentence of more than RUN_ON_SINGLE in a whole file too.
RUN_ON_TOKENS, RUN_ON_SINGLE = 300, 60


def _run_on_sentences(path: Path, rows: Sequence[_Row]) -> list[str]:
    """A warning when a NER file's sentences look run together: a sentence ends at a blank line, and a
    file without them is read as one sentence, which trains and scores without a word otherwise."""
    longest = max(rows, key=lambda row: len(row.example.tokens))
    size = len(longest.example.tokens)
    if size <= RUN_ON_TOKENS and not (len(rows) == 1 and size > RUN_ON_SINGLE):
        return []
    return [f"{path}: {len(rows)} sentence{'s' if len(rows) > 1 else ''}, the longest of {size} tokens (from line "
            f"{longest.line}): are blank lines between sentences missing? Each sentence ends with an empty line"]


def _is_bio_file(rows: Sequence[_Row]) -> bool:
    """Whether a NER file is written in BIO: some ``B-`` tag and no BIOES/BILOU prefix. A file without ``B-``
    is IO, where every entity begins with ``I-``, so an ``I-`` after ``O`` is no irregularity there."""
    prefixes = {tag.partition("-")[0] for row in rows for tag in row.example.tags}
    return "B" in prefixes and not prefixes & {"E", "S", "L", "U"}


def _orphan_inside_tags(path: Path, rows: Sequence[_Row]) -> list[str]:
    """A warning when sentences of a BIO file have an ``I-X`` that continues no entity (after ``O``, the
    sentence start or another type's tag): the gold is read as conlleval reads it, which a user who meant
    something else would otherwise never learn. One warning per file, however many sentences."""
    if not _is_bio_file(rows):
        return []
    found = []
    for index, row in enumerate(rows):
        try:
            validate_tags(row.example.tags, "bio")
        except TagSequenceError as err:
            found.append((index, row, err.position))
    if not found:
        return []
    index, row, position = found[0]
    tag = row.example.tags[position]
    after = repr(row.example.tags[position - 1]) if position else "the sentence start"
    where = f"line {row.line + position}" if row.line is not None else \
        f"sentence {index}, token {position} ({row.example.tokens[position]!r})"
    plural = "s have" if len(found) > 1 else " has"
    return [f"{path}: {len(found)} sentence{plural} an I- tag that continues no entity, the first at {where} "
            f"({tag!r} after {after}); read as conlleval and seqeval read it, the I- tag begins a new entity, "
            "so scores match the official scorer's"]


def _ner_shape_warnings(path: Path, rows: Sequence[_Row]) -> list[str]:
    return _run_on_sentences(path, rows) + _orphan_inside_tags(path, rows)


NER_FORMAT = GenericFormat(("tsv",), _generic_ner_reader,
                           lambda examples: _tag_order(t for e in examples for t in e.tags), ENTITY_F1,
                           labels_from_all_splits=True, given_labels=_given_ner_labels, label_uses=_mention_starts,
                           counted=("entity type", "mention"), shape_warnings=_ner_shape_warnings)
PICO_FORMAT = GenericFormat(("tsv",), _generic_pico_reader,
                            lambda examples: tuple(sorted({x for e in examples for s in e.elements for x in s})),
                            PICO_TOKEN_MACRO_F1, label_uses=_span_starts, counted=("element", "span"))
