"""What every dataset reader shares: errors, line and field parsing, label checks, finding a split's
file, and splits derived by a seeded hash.

Conventions (all readers)
    * Character offsets are Python slices: ``text[entity.start:entity.end]`` (end exclusive). DDI
      writes inclusive ends (``"70-84"`` is 15 characters); they are converted on reading.
    * Splits that the data here does not provide are derived, never random at run time: a unit
      (abstract, question, document) goes to a split by the SHA-256 of ``(dataset, seed, unit id)``
      (:func:`seeded_partition`), so the same seed gives the same split on every machine and Python
      version, independent of file order. Every derivation is stated in :attr:`BlurbDataset.notes`.
    * Files are strict: a line that does not fit its format raises :class:`DatasetFormatError`
      naming the file, the line and the field, because a silently skipped example would make the
      benchmark numbers lie. The one repair is of DDI-style entity offsets a character or two off
      in the source (:func:`finetune.readers.relation.entity_from_offsets`); each is listed in the notes.
      BLURB relation rows that mark one entity of the pair only are kept and listed, for fine-tuning
      to handle by its rule (:mod:`finetune.adapters.relation`).
    * A generic training label used fewer than :data:`RARE_LABEL_COUNT` times is read as written
      and reported in :attr:`BlurbDataset.warnings`: it may be a typo.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

from biomed_lm.errors import FinetuneError, InputError
from biomed_lm.finetune.blurb import DEV, SPLITS, TEST, TRAIN, BlurbEntry
from biomed_lm.finetune.readers.examples import BlurbDataset, Example
from biomed_lm.resources import places_looked, resolve_path
# The files' layouts and their readers are tokenization's, shared with the coverage report; the readers
# of finetune/ check what the records mean for a dataset (labels, entities, splits).
from biomed_lm.tokenization.blurb_files import DatasetFormatError, FieldError, string_field

DEFAULT_SPLIT_SEED = 42
CARVED_DEV_FRACTION = Fraction(1, 10)  # the dev split carved from a training file where none is given
_SPLIT_STEMS = {TRAIN: ("train",), DEV: ("dev", "devel"), TEST: ("test",)}

#: A reader of one BLURB dataset's directory: (entry, directory, split seed, allow_missing_train) -> dataset.
Loader = Callable[[BlurbEntry, Path, int, bool], BlurbDataset]

# -------------------------------------------------------------------------------------- errors

class MissingDatasetFileError(FinetuneError, InputError, FileNotFoundError):
    """A file a dataset needs is not in its directory; the message names the path expected."""


# --------------------------------------------------------------------------------- line readers

@dataclass(frozen=True)
class _Row:
    """An example with the line it starts on (for duplicate-id errors), the unit a derived split
    keeps together (an abstract, a document, a question), and any repair its source needed."""

    example: Example
    line: int | None
    group: str
    correction: str | None = None  # what had to be repaired in the source, for the dataset's notes


def _one_of(record: Mapping, keys: Sequence[str], *, required: bool = True) -> tuple[str | None, str | None]:
    """The one string field among ``keys`` that the record has (``text`` or ``sentence``, ...)."""
    present = [k for k in keys if k in record]
    if len(present) > 1:
        raise FieldError(present[1], f"give only one of {', '.join(map(repr, keys))}")
    if not present:
        if required:
            raise FieldError(keys[0], f"missing: expected one of {', '.join(map(repr, keys))} "
                             f"(fields present: {', '.join(sorted(record)) or 'none'})")
        return None, None
    return present[0], string_field(record, present[0])


def _record_id(record: Mapping, fallback: str) -> str:
    value = record.get("id")
    if value is None:
        return fallback
    if isinstance(value, bool) or not isinstance(value, (str, int)) or not str(value).strip():
        raise FieldError("id", f"expected a non-empty string or integer, got {value!r}")
    return str(value).strip()


def _label_value(value: object, field_name: str = "label") -> str:
    """A label as a string; integers (GAD-style ``0``/``1`` in JSON) are accepted."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise FieldError(field_name, f"expected a string, got {value!r}")
    text = str(value).strip()
    if not text:
        raise FieldError(field_name, "is empty")
    return text


LISTED_LINES = 10  # the first line numbers a note or a run summary lists; the count says how many in all


def listed_lines(lines: Sequence[int], count: int) -> str:
    """``line 8`` / ``lines 8, 9`` / ``lines 8, 9, ... (and 14 more)``: the first of ``count`` lines."""
    shown = lines[:LISTED_LINES]
    more = f" (and {count - len(shown)} more)" if count > len(shown) else ""
    return f"line{'s' if count > 1 else ''} {', '.join(map(str, shown))}{more}"


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
            raise FieldError(field_name, f"unknown label {raw!r} (expected one of: {', '.join(labels)})")
        return table[key]

    return check


def _open_labels(field_name: str = "label") -> LabelCheck:
    def check(raw: str) -> str:
        return _label_value(raw, field_name)

    return check


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


def expected_split_file(data_dir: Path, split: str, extensions: Sequence[str]) -> str:
    stems = _SPLIT_STEMS[split]
    options = " or ".join(f"{data_dir / f'{s}.{e}'}" for s in stems for e in extensions)
    return f"{options} (or a file named *_{stems[0]}.{extensions[0]})"


def _require(data_dir: Path, split: str, extensions: Sequence[str], dataset: str) -> Path:
    path = _find_split_file(data_dir, split, extensions)
    if path is None:
        raise MissingDatasetFileError(f"{dataset}: no {split} file: expected "
                                      f"{expected_split_file(data_dir, split, extensions)}")
    return path


def _require_file(path: Path, dataset: str) -> Path:
    if not path.is_file():
        raise MissingDatasetFileError(f"{dataset}: expected the file {path}")
    return path


def _check_dir(data_dir: str | Path, dataset: str) -> Path:
    path = resolve_path(data_dir)  # data/blurb/... is the shipped slice from any directory
    if path.is_file():
        raise MissingDatasetFileError(f"{dataset}: {path} is a file; data_dir is the directory that holds the "
                                      "split files (train, dev, test)")
    if not path.is_dir():
        raise MissingDatasetFileError(f"{dataset}: no such directory: {path}{places_looked(path)}")
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



def make_dataset(entry: BlurbEntry, splits: dict[str, list[Example]], notes: list[str],
                 warnings: Sequence[str] = (), differs_from_blurb: str | None = None) -> BlurbDataset:
    """A BLURB dataset's splits (in split order) with its registry facts."""
    ordered = {split: splits[split] for split in SPLITS if split in splits}
    return BlurbDataset(entry.name, entry.task_type, entry.metric, entry.labels, ordered, notes, entry.negative_label,
                        list(warnings), differs_from_blurb=differs_from_blurb)


def _correction_notes(path: Path, rows: Sequence[_Row]) -> list[str]:
    """One note per file listing the corrections its rows needed (none: no note)."""
    corrected = [row for row in rows if row.correction is not None]
    if not corrected:
        return []
    listed = "; ".join(f"line {row.line} ({row.example.id}): {row.correction}" for row in corrected[:10])
    more = f"; and {len(corrected) - 10} more" if len(corrected) > 10 else ""
    return [f"{path.name}: {len(corrected)} example(s) had entity offsets off by a character or two in the "
            f"source and were corrected: {listed}{more}"]



# ------------------------------------------------------------------------------ generic formats

@dataclass(frozen=True)
class GenericFormat:
    """How a task family's generic files are read (:func:`finetune.readers.load_generic_dataset`).

    ``reader(labels, from_training_file)`` gives a path -> rows reader that checks labels against
    ``labels`` (None: any label; ``from_training_file``: labels read from the training file, so a
    reader may compare by entity type); ``inferred_labels`` orders the labels of examples read
    without given labels; ``metric`` is the family's metric, None where ``negative_label`` decides
    (relation: micro F1 without it, else accuracy). ``takes_labels`` is False for a regression, and
    ``labels_from_all_splits`` re-infers the labels over every split (NER: every tag spelling of the
    training file's entity types). ``given_labels(labels, examples)`` is the label order of files
    read with given labels (those labels; NER given entity types: their tags). ``label_uses(row)``
    yields ``(label, line)`` for each use of a label that :func:`rare_label_warnings` counts, and
    ``counted`` names the label and the unit of a use in its warning (NER: an entity type per mention).
    ``shape_warnings(path, rows)`` reports what in a split file's shape looks like a mistake (NER:
    sentences run together where the blank lines between them are missing).
    """

    extensions: tuple[str, ...]
    reader: Callable[[Sequence[str] | None, bool], Callable[[Path], list[_Row]]]
    inferred_labels: Callable[[Sequence[Example]], tuple[str, ...]]
    metric: str | None
    takes_labels: bool = True
    labels_from_all_splits: bool = False
    given_labels: Callable[[tuple[str, ...], Sequence[Example]], tuple[str, ...]] = lambda labels, examples: labels
    label_uses: Callable[[_Row], Iterable[tuple[str, int]]] = lambda row: [(row.example.label, row.line)]
    counted: tuple[str, str] = ("label", "example")
    shape_warnings: Callable[[Path, Sequence[_Row]], list[str]] = lambda path, rows: []


# A label the training file uses fewer times than this is reported (not refused: a rare class may be
# real). A typo is typically on one line or two, and a real class with fewer than 3 training
# examples can hardly be learned, so the warning costs little; a user who means such a class says
# so with --labels, which silences it.
RARE_LABEL_COUNT = 3


def rare_label_warnings(form: GenericFormat, path: Path, rows: Sequence[_Row]) -> list[str]:
    """One warning per label that the training file ``path`` uses fewer than :data:`RARE_LABEL_COUNT`
    times, naming the file and the lines, since a typo there would otherwise become a class."""
    lines: dict[str, list[int]] = {}
    for row in rows:
        for label, line in form.label_uses(row):
            lines.setdefault(label, []).append(line)
    what, unit = form.counted
    article = "an" if what[0] in "aeiou" else "a"
    return [f"{path}: {what} {label!r} is seen in only {len(found)} training {unit}{'s' if len(found) > 1 else ''} "
            f"({listed_lines(found, len(found))}); {article} {what} seen fewer than {RARE_LABEL_COUNT} times may be "
            "a typo: state the label set with --labels"
            for label, found in sorted(lines.items()) if len(found) < RARE_LABEL_COUNT]
