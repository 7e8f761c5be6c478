"""Readers of yes/no(/maybe) question-answering files: PubMedQA's ``ori_pqal.json``, the BioASQ
yes/no stand-in (TSV), and the generic JSON Lines format."""

from __future__ import annotations

import json
import re
from fractions import Fraction
from pathlib import Path
from typing import Callable, Iterable, Sequence

from biomed_lm.finetune.blurb import ACCURACY, DEV, PUBMEDQA_BLURB_SIZES, SPLITS, TEST, TRAIN, BlurbEntry
from biomed_lm.finetune.readers.base import (CARVED_DEV_FRACTION, DatasetFormatError, GenericFormat, LabelCheck,
                                             _carve, _closed_labels, _examples, _FieldError, _find_split_file,
                                             _finish, _label_value, _open_labels, _plain_tsv_rows, _proportional_size,
                                             _record_id, _require, _require_file, _reraise, _Row, _split_stem,
                                             _string, json_lines, make_dataset, numbered_lines, seeded_partition)
from biomed_lm.finetune.readers.classification import _string_list
from biomed_lm.finetune.readers.examples import BlurbDataset, QAExample

__all__ = ["load_pqal", "load_yesno_tsv", "QA_FORMAT"]

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


def load_pqal(entry: BlurbEntry, data_dir: Path, seed: int, allow_missing_train: bool) -> BlurbDataset:
    questions = _require_file(data_dir / "ori_pqal.json", entry.name)
    ground_truth = _require_file(data_dir / "test_ground_truth.json", entry.name)
    rows, test_ids = _read_pubmedqa(questions, ground_truth)
    rest = [row for row in rows if row.group not in test_ids]
    total = sum(PUBMEDQA_BLURB_SIZES.values())
    n_dev = _proportional_size(len(rest), Fraction(PUBMEDQA_BLURB_SIZES[DEV], total))
    assignment = {row.group: TEST for row in rows if row.group in test_ids}
    assignment.update(seeded_partition([r.group for r in rest], {DEV: n_dev}, TRAIN, seed=seed, salt=entry.name))
    splits = _carve(rows, assignment, SPLITS)
    notes = [f"test: the {len(test_ids)} PMIDs of {ground_truth.name}; the other {len(rest)} questions of "
             f"{questions.name} are split {len(splits[TRAIN])}/{len(splits[DEV])} train/dev by PMID, seed "
             f"{seed} (BLURB: 450/50, the PubMedQA authors' fold; the dev questions differ)",
             "context: the abstract's CONTEXTS passages joined with a space (the conclusion, LONG_ANSWER, "
             "is left out as in PubMedQA's reasoning-required setting); label: final_decision"]
    return make_dataset(entry, splits, notes)


def load_yesno_tsv(entry: BlurbEntry, data_dir: Path, seed: int, allow_missing_train: bool) -> BlurbDataset:
    train_path = _require(data_dir, TRAIN, ("tsv",), entry.name)
    test_path = _require(data_dir, TEST, ("tsv",), entry.name)
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
        splits.update(_carve(train_rows, seeded_partition(questions, {DEV: n_dev}, TRAIN, seed=seed, salt=entry.name),
                             (TRAIN, DEV)))
        notes.append(f"no dev file: {n_dev} of the {len(set(questions))} distinct questions of {train_path.name} "
                     f"are held out as dev (a repeated question stays on one side), seed {seed}; test is "
                     f"{test_path.name}")
    notes.append("context: the file's third column. In the BioASQ yes/no stand-in that is the ideal answer, "
                 "not BioASQ's reference snippets, so its scores are not comparable to BLURB's BioASQ")
    return make_dataset(entry, splits, notes)



def _generic_reader(labels: Sequence[str] | None, from_training_file: bool) -> Callable[[Path], list[_Row]]:
    label_check = _closed_labels(labels, case_insensitive=False) if labels is not None else _open_labels()
    return lambda path: _read_qa_jsonl(path, label_check)


QA_FORMAT = GenericFormat(("jsonl",), _generic_reader, lambda examples: tuple(sorted({e.label for e in examples})),
                          ACCURACY)
