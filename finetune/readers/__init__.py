"""Dataset readers, by task family: the 13 BLURB datasets by name, and one generic format per family.

Fine-tuning needs more than the words the coverage report reads (:mod:`tokenization.model_inputs`):
labels in a fixed order, the train/dev/test splits, and for relation extraction where the entities
are. Both read a file with the reader of its layout (:mod:`tokenization.blurb_files`); the readers
here check what its records mean for a dataset and turn each dataset, in the form it is distributed
in, into typed examples grouped in splits (:class:`BlurbDataset`), so the rest of the fine-tuning
code never sees a file format.

Modules (one per file family; :mod:`.base` holds what they share)
    :mod:`.tagging`         NER ``token<TAB>tag`` and EBM PICO ``token POS O tag`` files
    :mod:`.relation`        pre-dummified TSV and JSON Lines with entity offsets
    :mod:`.similarity`      sentence-pair TSV
    :mod:`.classification`  HoC and generic document JSON Lines
    :mod:`.qa`              PubMedQA JSON, the BioASQ yes/no TSV, generic QA JSON Lines

Entry points
    :func:`load_blurb_dataset` reads a BLURB dataset by name from its own directory, with the loader
    its registry entry names (:data:`LOADERS`, :mod:`finetune.blurb`); :func:`load_generic_dataset`
    reads a user's dataset in the generic format of a task family (:data:`GENERIC_FORMATS`).
    ``docs/datasets.md`` documents both.
"""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType
from typing import Mapping, Sequence

from biomed_lm.errors import InputError
from biomed_lm.finetune.blurb import (CLASSIFICATION, DEV, MICRO_F1_POSITIVE, ACCURACY, NER, PICO, QA, RELATION,
                                      SIMILARITY, SPLITS, TASK_TYPES, TEST, TRAIN, blurb_entry)
from biomed_lm.finetune.readers.base import (CARVED_DEV_FRACTION, DEFAULT_SPLIT_SEED, RARE_LABEL_COUNT,
                                             GenericFormat, Loader, MissingDatasetFileError,
                                             _check_dir, _correction_notes, _examples, _find_split_file, _finish,
                                             _require, _Row, expected_split_file, rare_label_warnings,
                                             seeded_partition)
from biomed_lm.finetune.readers.classification import CLASSIFICATION_FORMAT, load_hallmarks
from biomed_lm.finetune.readers.examples import (BlurbDataset, DocumentExample, Entity, Example, PicoExample,
                                                 QAExample, RelationExample, SentencePairExample, TokenTaggingExample)
from biomed_lm.finetune.readers.qa import QA_FORMAT, load_pqal, load_yesno_tsv
from biomed_lm.finetune.readers.relation import MAX_OFFSET_SHIFT, RELATION_FORMAT, load_relation
from biomed_lm.finetune.readers.similarity import SIMILARITY_FORMAT, load_blue_similarity
from biomed_lm.finetune.readers.tagging import NER_FORMAT, PICO_FORMAT, load_ebm_nlp, load_token_tags
from biomed_lm.tokenization.blurb_files import DatasetFormatError

__all__ = ["LOADERS", "GENERIC_FORMATS", "load_blurb_dataset", "load_generic_dataset", "seeded_partition",
           "expected_split_file",
           "DatasetFormatError", "MissingDatasetFileError", "DEFAULT_SPLIT_SEED", "CARVED_DEV_FRACTION",
           "RARE_LABEL_COUNT",
           "MAX_OFFSET_SHIFT", "BlurbDataset", "Example", "TokenTaggingExample", "PicoExample", "Entity",
           "RelationExample", "SentencePairExample", "DocumentExample", "QAExample"]

#: The readers a registry entry's ``loader`` names.
LOADERS: Mapping[str, Loader] = MappingProxyType({
    "token_tags": load_token_tags, "pio_tags": load_ebm_nlp, "relation": load_relation,
    "blue_similarity": load_blue_similarity, "hallmarks": load_hallmarks, "pqal": load_pqal,
    "yesno_tsv": load_yesno_tsv,
})

#: Task family -> how its generic files are read.
GENERIC_FORMATS: Mapping[str, GenericFormat] = MappingProxyType({
    NER: NER_FORMAT, PICO: PICO_FORMAT, RELATION: RELATION_FORMAT, SIMILARITY: SIMILARITY_FORMAT,
    CLASSIFICATION: CLASSIFICATION_FORMAT, QA: QA_FORMAT,
})
assert tuple(GENERIC_FORMATS) == TASK_TYPES  # one generic format per task family


def load_blurb_dataset(name: str, data_dir: str | Path, *, split_seed: int = DEFAULT_SPLIT_SEED,
                       allow_missing_train: bool = False) -> BlurbDataset:
    """Read one of the 13 BLURB datasets from its own directory (``.../ner/NCBI-disease``).

    ``split_seed`` fixes the splits that are derived rather than given (HoC; PubMedQA train/dev;
    BioASQ and EBM PICO dev; JNLPBA train/dev with ``allow_missing_train``). ``allow_missing_train``
    lets an NER dataset without a train file train on a seeded 90% of its dev file's documents
    instead of failing (JNLPBA here); the notes say so.
    """
    entry = blurb_entry(name)
    return LOADERS[entry.loader](entry, _check_dir(data_dir, entry.name), split_seed, allow_missing_train)


def _read_generic_splits(form: GenericFormat, paths: Mapping[str, Path], labels: tuple[str, ...] | None
                         ) -> tuple[dict[str, list[_Row]], tuple[str, ...]]:
    """Every split's rows and the label set. Given ``labels`` are checked in every split and fix the
    order (:attr:`GenericFormat.given_labels`). Without them the training file defines the labels,
    and a dev or test label it lacks is an error naming its file and line: a typo there must not
    become a class the model never trained on (nor a silently lower score)."""
    if labels is not None:
        read = form.reader(labels, False)
        rows = {s: _finish(p, read(p)) for s, p in paths.items()}
        return rows, form.given_labels(labels, [e for r in rows.values() for e in _examples(r)])
    rows = {TRAIN: _finish(paths[TRAIN], form.reader(None, False)(paths[TRAIN]))}
    labels = form.inferred_labels(_examples(rows[TRAIN]))
    read = form.reader(labels, True)
    rows.update({s: _finish(p, read(p)) for s, p in paths.items() if s != TRAIN})
    if form.labels_from_all_splits:
        labels = form.inferred_labels([e for r in rows.values() for e in _examples(r)])
    return rows, labels


def _checked_labels(task_type: str, form: GenericFormat, labels: Sequence[str] | None) -> tuple[str, ...] | None:
    if labels is None:
        return None
    labels = tuple(labels)
    if not form.takes_labels and labels:
        raise InputError(f"--labels does not apply to {task_type}: it is a regression (a score per example), "
                         "with no label set")
    if len(set(labels)) != len(labels) or not all(isinstance(x, str) and x.strip() for x in labels):
        raise InputError(f"labels must be distinct non-empty strings, got {list(labels)}")
    return labels


def _generic_metric(form: GenericFormat, labels: Sequence[str], negative_label: str | None) -> tuple[str, list[str]]:
    """The metric and what to note about it: the family's, or for a family whose metric depends on a
    "no relation" label, micro F1 without ``negative_label`` (accuracy when none is given)."""
    if form.metric is not None:
        if negative_label is not None:
            raise InputError("negative_label applies to relation extraction only")
        return form.metric, []
    if negative_label is None:
        return ACCURACY, ["no negative_label given: the metric is accuracy"]
    if negative_label not in labels:
        raise InputError(f"negative_label {negative_label!r} is not one of the labels ({', '.join(labels)})")
    return MICRO_F1_POSITIVE, []


def load_generic_dataset(task_type: str, data_dir: str | Path, labels: Sequence[str] | None = None, *,
                         name: str | None = None, negative_label: str | None = None) -> BlurbDataset:
    """Read a user's dataset in the generic format of ``task_type`` from ``data_dir``.

    Files: ``train`` is required, ``dev`` (or ``devel``) and ``test`` are read where present (fine-tuning
    needs both), each ``<split>.tsv`` or ``<split>.jsonl`` by task (``docs/datasets.md``). ``labels`` fixes the label
    order and rejects any other label in any split (with its file and line); for NER it names the
    entity types (their tags follow, in that order), or every tag including ``O``. Without it the
    labels are those of the training file, sorted (``O`` first for NER), a dev/test label outside
    them (for NER: an entity type) is an error naming its file and line, and a training label used
    fewer than :data:`RARE_LABEL_COUNT` times is a warning (``warnings``) naming the file and its
    lines. For relation extraction, ``negative_label`` names the "no relation" label and makes the
    metric micro F1 over the other labels; without it the metric is accuracy. ``name`` defaults to
    the directory's name.
    """
    if task_type not in GENERIC_FORMATS:
        raise InputError(f"unknown task type {task_type!r}; valid task types: {', '.join(GENERIC_FORMATS)}")
    form = GENERIC_FORMATS[task_type]
    labels = _checked_labels(task_type, form, labels)
    data_dir = _check_dir(data_dir, name or str(data_dir))
    name = name or data_dir.name
    paths = {TRAIN: _require(data_dir, TRAIN, form.extensions, name)}
    paths.update({s: p for s in (DEV, TEST) if (p := _find_split_file(data_dir, s, form.extensions)) is not None})
    stated = labels is not None
    rows, labels = _read_generic_splits(form, paths, labels)
    # a stated label set is not second-guessed; one read from the training file may hold a typo
    warnings = [] if stated or not form.takes_labels else rare_label_warnings(form, paths[TRAIN], rows[TRAIN])
    warnings += [w for s, p in paths.items() for w in form.shape_warnings(p, rows[s])]
    metric, metric_notes = _generic_metric(form, labels, negative_label)
    notes = [f"generic {task_type} format: {', '.join(f'{s}: {p.name}' for s, p in paths.items())}"]
    notes.extend(n for s, p in paths.items() for n in _correction_notes(p, rows[s]))
    missing = [s for s in SPLITS if s not in paths]
    if missing:
        notes.append(f"no {' or '.join(missing)} file")
    notes.extend(metric_notes)
    ordered = {s: _examples(rows[s]) for s in SPLITS if s in rows}
    return BlurbDataset(name, task_type, metric, tuple(labels), ordered, notes, negative_label, warnings)
