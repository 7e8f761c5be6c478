"""Readers of sentence-pair similarity files (BIOSSES as BLUE distributes it, and the generic format)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Sequence

from biomed_lm.finetune.blurb import PEARSON, SPLITS, BlurbEntry
from biomed_lm.finetune.readers.base import (DatasetFormatError, GenericFormat, _examples, _FieldError, _finish,
                                             _require, _reraise, _Row, _split_stem, _tsv_rows, make_dataset)
from biomed_lm.finetune.readers.examples import BlurbDataset, SentencePairExample

__all__ = ["load_blue_similarity", "SIMILARITY_FORMAT"]

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



def load_blue_similarity(entry: BlurbEntry, data_dir: Path, seed: int, allow_missing_train: bool) -> BlurbDataset:
    """BIOSSES: BLUE's ``{train,dev,test}.tsv``, scores in [0, 4]."""
    splits, names = {}, []
    for split in SPLITS:
        path = _require(data_dir, split, ("tsv",), entry.name)
        splits[split] = _examples(_finish(path, _read_similarity(path, (0.0, 4.0))))
        names.append(f"{path.name} ({len(splits[split])})")
    notes = [f"splits as distributed: {', '.join(names)}. The files here are BLUE's 70/16/14 split of the 100 "
             "pairs; BLURB uses 64/16/20, so test scores are not directly comparable"]
    return make_dataset(entry, splits, notes)


def _generic_reader(labels: Sequence[str] | None, from_training_file: bool) -> Callable[[Path], list[_Row]]:
    return _read_similarity


SIMILARITY_FORMAT = GenericFormat(("tsv",), _generic_reader, lambda examples: (), PEARSON, takes_labels=False)
