"""Readers of yes/no(/maybe) question-answering files: PubMedQA's ``ori_pqal.json``, the BioASQ
yes/no stand-in (TSV), and the generic JSON Lines format."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Callable, Sequence

from biomed_lm.finetune.blurb import ACCURACY, DEV, PUBMEDQA_BLURB_SIZES, SPLITS, TEST, TRAIN, BlurbEntry
from biomed_lm.finetune.readers.base import (CARVED_DEV_FRACTION, GenericFormat, LabelCheck, _carve, _closed_labels,
                                             _examples, _find_split_file, _finish, _label_value, _open_labels,
                                             _proportional_size, _record_id, _require, _require_file, _Row,
                                             _split_stem, make_dataset, seeded_partition)
from biomed_lm.finetune.readers.examples import BlurbDataset, QAExample
from biomed_lm.tokenization.blurb_files import (DatasetFormatError, FieldError, json_document, json_lines, key_lines,
                                                read_pqal_json, read_yesno_tsv, string_field)

__all__ = ["load_pqal", "load_yesno_tsv", "QA_FORMAT"]

_YES_NO = {"1": "yes", "yes": "yes", "0": "no", "no": "no"}


def _read_qa_tsv(path: Path) -> list[_Row]:
    """The BioASQ yes/no stand-in, a ``yesno_tsv`` file (:func:`tokenization.blurb_files.read_yesno_tsv`):
    ``label<TAB>question<TAB>context`` with an optional header; labels 1/0 or yes/no."""
    rows: list[_Row] = []
    for row in read_yesno_tsv(path):
        try:
            raw_label = row.label.strip().lower()
            if raw_label not in _YES_NO:
                raise FieldError("label", f"{raw_label!r} is not a yes/no answer (1, 0, yes, no)")
            question, context = row.question.strip(), row.context.strip()
            for name, value in (("question", question), ("context", context)):
                if not value:
                    raise FieldError(name, "is empty")
        except FieldError as err:
            raise err.at(path, row.line) from None
        example = QAExample(f"{_split_stem(path)}-{row.line}", question, context, _YES_NO[raw_label])
        rows.append(_Row(example, row.line, " ".join(question.casefold().split())))
    return rows


def _read_qa_jsonl(path: Path, label_check: LabelCheck) -> list[_Row]:
    """Generic QA JSON Lines: ``{"id", "question", "context", "label"}``."""
    rows = []
    for line_no, record in json_lines(path):
        try:
            question, context = string_field(record, "question"), string_field(record, "context")
            if "label" not in record:
                raise FieldError("label", "missing")
            example = QAExample(_record_id(record, f"{_split_stem(path)}-{line_no}"), question.strip(),
                                context.strip(), label_check(_label_value(record["label"])))
        except FieldError as err:
            raise err.at(path, line_no) from None
        rows.append(_Row(example, line_no, " ".join(question.casefold().split())))
    return rows


def _read_pubmedqa(questions: Path, ground_truth: Path) -> tuple[list[_Row], set[str]]:
    """``ori_pqal.json`` (a ``pqal_json`` file, :func:`tokenization.blurb_files.read_pqal_json`) as
    examples, and the PMIDs of ``test_ground_truth.json`` (PMID -> answer), whose answers must agree."""
    labels = _closed_labels(("yes", "no", "maybe"), case_insensitive=True, field_name="final_decision")
    rows: list[_Row] = []
    for entry in read_pqal_json(questions):
        try:
            if not entry.contexts or not all(entry.contexts):
                raise FieldError("CONTEXTS", "expected a non-empty list of non-empty passages")
            label = labels(_label_value(entry.record.get("final_decision"), "final_decision"))
        except FieldError as err:
            raise DatasetFormatError(questions, entry.line_of(err.field), f"entry {entry.pmid!r}: {err.message}",
                                     err.field) from None
        rows.append(_Row(QAExample(entry.pmid, entry.question, " ".join(entry.contexts), label), entry.line,
                         entry.pmid))
    truth, truth_lines = json_document(ground_truth)
    if not isinstance(truth, dict) or not truth:
        raise DatasetFormatError(ground_truth, 1, "expected a JSON object mapping PMIDs to yes/no/maybe")
    truth_where = key_lines(truth_lines, truth)
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
    return make_dataset(entry, splits, notes, differs_from_blurb="a stand-in: ideal answers as the context")



def _generic_reader(labels: Sequence[str] | None, from_training_file: bool) -> Callable[[Path], list[_Row]]:
    label_check = _closed_labels(labels, case_insensitive=False) if labels is not None else _open_labels()
    return lambda path: _read_qa_jsonl(path, label_check)


QA_FORMAT = GenericFormat(("jsonl",), _generic_reader, lambda examples: tuple(sorted({e.label for e in examples})),
                          ACCURACY)
