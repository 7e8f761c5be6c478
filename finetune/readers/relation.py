"""Readers of relation-extraction files: pre-dummified TSV (GAD, ChemProt as TSV) and JSON Lines
with entity offsets (DDI, ChemProt as JSONL, the generic format).

A sentence a reader keeps must hold its entity pair the way fine-tuning will look for it, and every
entity type must map to a placeholder (:func:`finetune.relation_inputs.normalize_type` with the
dataset's type map), so a file that could not be featurized is refused here, with its line. The
exception is a BLURB TSV sentence that marks one of its pair alone, as 45 rows of BLURB's ChemProt
do: it is kept and listed (``BlurbDataset.one_entity_rows``, a note), and fine-tuning handles it by
the rule of :mod:`finetune.adapters.relation`.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Callable, Mapping, Sequence

from biomed_lm.errors import InputError
from biomed_lm.finetune.blurb import SPLITS, BlurbEntry, PlaceholderPair
from biomed_lm.finetune.readers.base import (GenericFormat, LabelCheck, MissingDatasetFileError, _closed_labels,
                                             _correction_notes, _examples, _find_split_file, _finish, _label_value,
                                             _one_of, _open_labels, _record_id, _Row, _split_stem,
                                             expected_split_file, listed_lines, make_dataset)
from biomed_lm.finetune.readers.examples import BlurbDataset, Entity, FlaggedRows, RelationExample
from biomed_lm.finetune.relation_inputs import (entities_from_placeholders, normalize_type,
                                                pair_or_one_from_placeholders)
from biomed_lm.tokenization.blurb_files import FieldError, read_relation_jsonl, read_sentence_label_tsv, string_field

__all__ = ["load_relation", "RELATION_FORMAT", "MAX_OFFSET_SHIFT"]

SentenceCheck = Callable[[str], str]


def _placeholder_check(pair: PlaceholderPair | None, rewrite: Callable[[str], str] | None = None,
                       hint: str = "") -> SentenceCheck:
    """A check that a pre-dummified sentence holds its entity pair the way fine-tuning will look for
    it (a BLURB dataset's ``pair``, or any two placeholders), after ``rewrite``; returns the sentence
    to keep. A BLURB sentence may mark one of its pair alone, as some distributed rows do (kept, see
    :func:`_one_entity_rows`); anything else cannot be featurized, so it is refused here, with its line."""
    def check(text: str) -> str:
        if rewrite is not None:
            text = rewrite(text)
        try:
            if pair is None:
                entities_from_placeholders(text)
            else:
                pair_or_one_from_placeholders(text, pair)
        except ValueError as err:
            raise FieldError("sentence", f"{err}{hint}") from None
        return text

    return check


def _read_relation_tsv(path: Path, label_check: LabelCheck, sentence_check: SentenceCheck) -> list[_Row]:
    """A ``sentence_label_tsv`` file (:func:`tokenization.blurb_files.read_sentence_label_tsv`): GAD's
    ``sentence<TAB>label``, BLUE's ``index<TAB>sentence<TAB>label``, entities already dummified."""
    rows: list[_Row] = []
    for row in read_sentence_label_tsv(path):
        try:
            text = row.sentence.strip()
            if not text:
                raise FieldError("sentence", "is empty")
            text = sentence_check(text)
            label = label_check(_label_value(row.label))
            example_id = row.id.strip() if row.id is not None else f"{_split_stem(path)}-{row.line}"
            if not example_id:
                raise FieldError("id", "is empty")
        except FieldError as err:
            raise err.at(path, row.line) from None
        rows.append(_Row(RelationExample(example_id, text, text, (), label), row.line, example_id))
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
    mention = string_field(entity, "text")
    entity_type = string_field(entity, "type")
    offset = entity.get("offset")
    if not isinstance(offset, str) or not _OFFSETS.fullmatch(offset.strip()):
        raise FieldError(f"{key}.offset", f"expected 'start-end' (or fragments joined by ';'), got {offset!r}")
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
    raise FieldError(f"{key}.offset", f"{offset!r} does not point at {mention!r} in the sentence "
                     f"(it holds {text[pairs[0][0]:pairs[-1][1] + 1]!r} there)")


def _entity_from_span(entity: Mapping, text: str, key: str) -> tuple[Entity, None]:
    """A generic entity ``{"start", "end", "type"[, "text"]}`` with an exclusive ``end``; never corrected."""
    start, end = entity.get("start"), entity.get("end")
    for name, value in (("start", start), ("end", end)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise FieldError(f"{key}.{name}", f"expected an integer character offset, got {value!r}")
    if not 0 <= start < end <= len(text):
        raise FieldError(f"{key}.end", f"span {start}-{end} is not inside the text ({len(text)} characters)")
    if not text[start:end].strip():  # no token would cover it: the entity could not be located after tokenizing
        raise FieldError(f"{key}.end", f"span {start}-{end} holds only whitespace ({text[start:end]!r})")
    entity_type = string_field(entity, "type")
    mention = string_field(entity, "text", required=False)
    if mention is not None and text[start:end] != mention:
        raise FieldError(f"{key}.text", f"{mention!r} is not what the offsets point at "
                         f"({text[start:end]!r}; 'end' is exclusive)")
    return Entity(start, end, entity_type, text[start:end]), None


def _within(key: str, parse: Callable[[Mapping, str, str], tuple[Entity, str | None]], entity: object,
            text: str) -> tuple[Entity, str | None]:
    """``parse(entity, text, key)`` with the fields of its errors named inside ``key`` (``e1.type``)."""
    if not isinstance(entity, dict):
        raise FieldError(key, "expected an object")
    try:
        return parse(entity, text, key)
    except FieldError as err:
        name = err.field if err.field and err.field.startswith(f"{key}.") else \
            f"{key}.{err.field}" if err.field else key
        raise FieldError(name, err.message) from None


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
            raise FieldError("entities", "expected a list of objects {start, end, type}")
        keys = [f"entities[{i}]" for i in range(len(raw))]
        parsed = [_within(key, _entity_from_span, e, text) for key, e in zip(keys, raw)]
        if len(raw) != 2:  # a relation instance is one pair; which two of more would be a guess
            raise FieldError("entities", f"expected the relation's two entities, got {len(raw)}")
    elif "e1" in record or "e2" in record:
        keys = ["e1", "e2"]
        parsed = [_within(key, _entity_from_offsets, record.get(key), text) for key in keys]
    else:
        raise FieldError("entities", "missing: give 'entities' (a list of {start, end, type}) or 'e1' and 'e2'")
    for key, (entity, _) in zip(keys, parsed):
        try:
            normalize_type(entity.type, type_map)
        except ValueError as err:
            raise FieldError(f"{key}.type", str(err)) from None
    if "label" not in record:
        raise FieldError("label", "missing")
    label = label_check(_label_value(record["label"]))
    example = RelationExample(_record_id(record, fallback_id), text, masked, tuple(e for e, _ in parsed), label)
    corrections = [c for _, c in parsed if c is not None]
    return example, ("; ".join(corrections) if corrections else None)


def _read_relation_jsonl(path: Path, label_check: LabelCheck, type_map: Mapping[str, str] | None) -> list[_Row]:
    rows = []
    for line_no, record in read_relation_jsonl(path):
        try:
            example, correction = _relation_record(record, f"{_split_stem(path)}-{line_no}", label_check, type_map)
        except FieldError as err:
            raise err.at(path, line_no) from None
        rows.append(_Row(example, line_no, example.id, correction))
    return rows


def _read_relation(path: Path, label_check: LabelCheck, sentence_check: SentenceCheck,
                   type_map: Mapping[str, str] | None = None) -> list[_Row]:
    """A JSONL file (entities with offsets, types through ``type_map``) or a TSV file (pre-dummified
    sentences, each checked by ``sentence_check``)."""
    if path.name.lower().endswith(".jsonl"):
        return _read_relation_jsonl(path, label_check, type_map)
    return _read_relation_tsv(path, label_check, sentence_check)



class _PairMarkers:
    """Words a dataset's files write for the pair's mentions (ChemProt's BC6ENTC/BC6ENTG), read as
    the placeholders other distributions write; counts the sentences that needed it."""

    def __init__(self, entry: BlurbEntry) -> None:
        self.markers, self.other = dict(entry.pair_markers), entry.other_mention_marker
        self.pattern = re.compile("|".join(map(re.escape, self.markers)), re.IGNORECASE) if self.markers else None
        self.sentences = 0

    def rewrite(self, text: str) -> str:
        text, replaced = self.pattern.subn(lambda m: self.markers[m.group(0).upper()], text)
        self.sentences += replaced > 0
        return text

    def hint(self) -> str:
        return f" ({'/'.join(self.markers)} are read as {'/'.join(self.markers.values())})"

    def note(self) -> str:
        other = f"; {self.other} (an entity outside the pair) is kept as the word it is" if self.other else ""
        return (f"{self.sentences} sentence(s) wrote the pair as {'/'.join(self.markers)}: read as "
                f"{'/'.join(self.markers.values())}{other}")


def _one_entity_rows(path: Path, rows: Sequence[_Row], pair: PlaceholderPair | None) -> FlaggedRows | None:
    """The file's pre-dummified sentences that mark one entity of the pair only, by id with their lines."""
    if pair is None:
        return None
    lines = {row.example.id: row.line for row in rows
             if not row.example.entities and len(pair_or_one_from_placeholders(row.example.text, pair)) == 1}
    return FlaggedRows(path.name, lines) if lines else None


def _one_entity_note(flagged: Mapping[str, FlaggedRows]) -> str:
    listed = ", ".join(f"{rows.file} {len(rows.lines)} ({listed_lines(list(rows.lines.values()), len(rows.lines))})"
                       for rows in flagged.values())
    return f"rows that mark only one entity of the pair (kept; fine-tuning decides, see docs/datasets.md): {listed}"


def load_relation(entry: BlurbEntry, data_dir: Path, seed: int, allow_missing_train: bool) -> BlurbDataset:
    """A BLURB relation dataset: one ``.tsv`` or ``.jsonl`` file per split (not both)."""
    check = _closed_labels(entry.labels, case_insensitive=True)
    markers = _PairMarkers(entry)
    sentence_check = _placeholder_check(entry.placeholder_pair, markers.rewrite, markers.hint()) \
        if markers.pattern else _placeholder_check(entry.placeholder_pair)
    splits, names, corrections, flagged = {}, [], [], {}
    for split in SPLITS:
        found = [p for p in (_find_split_file(data_dir, split, (ext,)) for ext in ("tsv", "jsonl")) if p is not None]
        if len(found) > 1:
            raise InputError(f"{entry.name}: both {found[0].name} and {found[1].name} hold the {split} split; keep one")
        if not found:
            raise MissingDatasetFileError(f"{entry.name}: no {split} file: expected "
                                          f"{expected_split_file(data_dir, split, ('tsv', 'jsonl'))}")
        rows = _finish(found[0], _read_relation(found[0], check, sentence_check, entry.type_map))
        splits[split] = _examples(rows)
        names.append(found[0].name)
        corrections.extend(_correction_notes(found[0], rows))
        if (one_entity := _one_entity_rows(found[0], rows, entry.placeholder_pair)) is not None:
            flagged[split] = one_entity
    notes = [f"splits as distributed: {', '.join(names)}", *corrections]
    if any(n.lower().endswith(".tsv") for n in names):
        notes.append("TSV files hold the dummified sentence only: text = masked_text, entity offsets unknown")
    if markers.sentences:
        notes.append(markers.note())
    if flagged:
        notes.append(_one_entity_note(flagged))
    return dataclasses.replace(make_dataset(entry, splits, notes), one_entity_rows=flagged)


def _generic_reader(labels: Sequence[str] | None, from_training_file: bool) -> Callable[[Path], list[_Row]]:
    label_check = _closed_labels(labels, case_insensitive=False) if labels is not None else _open_labels()
    return lambda path: _read_relation(path, label_check, _placeholder_check(None))


RELATION_FORMAT = GenericFormat(("jsonl", "tsv"), _generic_reader,
                                lambda examples: tuple(sorted({e.label for e in examples})), None)
