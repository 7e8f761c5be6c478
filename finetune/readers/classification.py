"""Readers of document-classification files: HoC (sentence-labelled abstracts) and the generic format."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

from biomed_lm.finetune.blurb import DEV, HOC_BLURB_SIZES, HOC_HALLMARKS, MICRO_F1_MULTILABEL, SPLITS, TEST, TRAIN, \
    BlurbEntry
from biomed_lm.finetune.readers.base import (GenericFormat, LabelCheck, MissingDatasetFileError, _carve,
                                             _closed_labels, _examples, _find_split_file, _finish, _label_value,
                                             _open_labels, _proportional_size, _record_id, _require_file, _Row,
                                             _split_stem, expected_split_file, make_dataset, seeded_partition)
from biomed_lm.finetune.readers.examples import BlurbDataset, DocumentExample
from biomed_lm.tokenization.blurb_files import FieldError, json_lines, read_sentences_jsonl, string_field, string_list

__all__ = ["load_hallmarks", "CLASSIFICATION_FORMAT"]


def _hoc_labels(sentence_labels: object, sentences: int) -> frozenset[str]:
    """The abstract's hallmarks: the union over its sentences of each label's top-level hallmark.

    HoC labels sentences with paths in its 37-class taxonomy, ``Top--Sub--Leaf`` (a trailing ``--``
    marks the hallmark itself); the first segment is one of the 10 top-level hallmarks. ``NULL``
    marks a sentence with no hallmark and contributes nothing.
    """
    if not isinstance(sentence_labels, list) or len(sentence_labels) != sentences or \
            not all(isinstance(s, list) and all(isinstance(x, str) for x in s) for s in sentence_labels):
        raise FieldError("sentence_labels", f"expected a list of {sentences} lists of strings, one per sentence")
    canonical = {h.casefold(): h for h in HOC_HALLMARKS}
    found = set()
    for labels in sentence_labels:
        for label in labels:
            top = label.split("--")[0].strip()
            if top.casefold() == "null":
                continue
            if top.casefold() not in canonical:
                raise FieldError("sentence_labels", f"{label!r}: {top!r} is not one of the 10 hallmarks "
                                 f"({', '.join(HOC_HALLMARKS)})")
            found.add(canonical[top.casefold()])
    return frozenset(found)


def _hoc_record(record: Mapping) -> DocumentExample:
    """HoC JSON Lines: ``{"pmid", "sentences", "sentence_labels"[, "doc_hallmarks"]}``. The
    document-level hallmarks, when given, must agree with the sentence labels: a disagreement means
    the file was built with another mapping."""
    pmid = record.get("pmid")
    if isinstance(pmid, bool) or not isinstance(pmid, (str, int)) or not str(pmid).strip():
        raise FieldError("pmid", f"expected a PMID, got {pmid!r}")
    sentences = [s.strip() for s in string_list(record, "sentences")]
    if not sentences or not all(sentences):
        raise FieldError("sentences", "expected a non-empty list of non-empty sentences")
    labels = _hoc_labels(record.get("sentence_labels"), len(sentences))
    if "doc_hallmarks" in record:
        given = {h.strip().casefold() for h in string_list(record, "doc_hallmarks")}
        if given != {h.casefold() for h in labels}:
            raise FieldError("doc_hallmarks", f"{sorted(given)} disagrees with the hallmarks of the sentence "
                             f"labels {sorted(labels)}")
    return DocumentExample(str(pmid).strip(), " ".join(sentences), tuple(sentences), labels)


def _generic_document(record: Mapping, fallback_id: str, label_check: LabelCheck) -> DocumentExample:
    """Generic classification JSON Lines: ``{"id", "text", "labels": [...]}`` (``sentences`` optional)."""
    text = string_field(record, "text")
    sentences = tuple(s.strip() for s in string_list(record, "sentences")) if "sentences" in record else (text,)
    raw = record.get("labels")
    if not isinstance(raw, list):
        raise FieldError("labels", f"expected a list of labels (possibly empty), got {raw!r}")
    labels = frozenset(label_check(_label_value(v, "labels")) for v in raw)
    return DocumentExample(_record_id(record, fallback_id), text.strip(), sentences, labels)


def _read_documents(path: Path, parse: Callable[[Mapping, str], DocumentExample],
                    records: Callable[[Path], Iterator[tuple[int, dict]]] = json_lines) -> list[_Row]:
    """One example per JSON Lines record: HoC's files are read by their layout's reader
    (``sentences_jsonl``), the generic format as plain JSON Lines."""
    rows = []
    for line_no, record in records(path):
        try:
            example = parse(record, f"{_split_stem(path)}-{line_no}")
        except FieldError as err:
            raise err.at(path, line_no) from None
        rows.append(_Row(example, line_no, example.id))
    return rows


def load_hallmarks(entry: BlurbEntry, data_dir: Path, seed: int, allow_missing_train: bool) -> BlurbDataset:
    def parse(record: Mapping, _fallback_id: str) -> DocumentExample:
        return _hoc_record(record)  # HoC ids are PMIDs, never positions

    given = {split: _find_split_file(data_dir, split, ("jsonl",)) for split in SPLITS}
    mapping_note = ("labels: an abstract's hallmarks are the union over its sentences of each sentence label's "
                    "top-level hallmark (the part before the first '--'); 'NULL' sentences add none; "
                    f"{len(HOC_HALLMARKS)} labels, micro F1 over (abstract, hallmark) decisions")
    if any(given.values()):
        missing = [s for s, p in given.items() if p is None]
        if missing:
            raise MissingDatasetFileError(f"{entry.name}: split files are incomplete: no {missing[0]} file: "
                                          f"expected {expected_split_file(data_dir, missing[0], ('jsonl',))}")
        splits = {s: _examples(_finish(p, _read_documents(p, parse, read_sentences_jsonl))) for s, p in given.items()}
        return make_dataset(entry, splits, [f"splits as distributed: {', '.join(p.name for p in given.values())}",
                                       mapping_note])
    path = _require_file(data_dir / "hoc_combined.jsonl", entry.name)
    rows = _finish(path, _read_documents(path, parse, read_sentences_jsonl))
    total = sum(HOC_BLURB_SIZES.values())
    n_test = _proportional_size(len(rows), Fraction(HOC_BLURB_SIZES[TEST], total), leave=2)
    n_dev = _proportional_size(len(rows) - n_test, Fraction(HOC_BLURB_SIZES[DEV], total - HOC_BLURB_SIZES[TEST]))
    assignment = seeded_partition([r.group for r in rows], {TEST: n_test, DEV: n_dev}, TRAIN, seed=seed,
                                  salt=entry.name)
    splits = _carve(rows, assignment, SPLITS)
    notes = [f"no official split here: {path.name}'s {len(rows)} abstracts are split by PMID in BLURB's "
             f"proportions {HOC_BLURB_SIZES[TRAIN]}/{HOC_BLURB_SIZES[DEV]}/{HOC_BLURB_SIZES[TEST]} -> "
             f"{len(splits[TRAIN])}/{len(splits[DEV])}/{len(splits[TEST])}, seed {seed}; the abstracts differ "
             "from BLURB's own split, so scores are close to but not exactly comparable", mapping_note]
    return make_dataset(entry, splits, notes, differs_from_blurb="its own seeded split of the abstracts")




def _generic_reader(labels: Sequence[str] | None, from_training_file: bool) -> Callable[[Path], list[_Row]]:
    label_check = _closed_labels(labels, case_insensitive=False, field_name="labels") if labels is not None \
        else _open_labels("labels")
    return lambda path: _read_documents(path, lambda record, fallback: _generic_document(record, fallback,
                                                                                           label_check))


CLASSIFICATION_FORMAT = GenericFormat(("jsonl",), _generic_reader,
                                      lambda examples: tuple(sorted({x for e in examples for x in e.labels})),
                                      MICRO_F1_MULTILABEL,
                                      label_uses=lambda row: [(label, row.line) for label in row.example.labels])
