"""Readers of sentence-pair similarity files (BIOSSES as BLUE distributes it, and the generic format)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Sequence

from biomed_lm.finetune.blurb import PEARSON, SPLITS, BlurbEntry
from biomed_lm.finetune.readers.base import (GenericFormat, _examples, _finish, _require, _Row, _split_stem,
                                             make_dataset)
from biomed_lm.finetune.readers.examples import BlurbDataset, SentencePairExample
from biomed_lm.tokenization.blurb_files import FieldError, read_sentence_pair_tsv

__all__ = ["load_blue_similarity", "SIMILARITY_FORMAT"]

def _score(raw: str, score_range: tuple[float, float] | None) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise FieldError("score", f"{raw!r} is not a number") from None
    if not math.isfinite(value):
        raise FieldError("score", f"{raw!r} is not a finite number")
    if score_range is not None and not score_range[0] <= value <= score_range[1]:
        raise FieldError("score", f"{value} is outside [{score_range[0]:g}, {score_range[1]:g}]")
    return value


def _read_similarity(path: Path, score_range: tuple[float, float] | None = None) -> list[_Row]:
    """A ``sentence_pair_tsv`` file (:func:`tokenization.blurb_files.read_sentence_pair_tsv`):
    ``text_a<TAB>text_b<TAB>score``, or BLUE's BIOSSES TSV naming ``sentence1``/``sentence2``/``score``."""
    rows: list[_Row] = []
    for row in read_sentence_pair_tsv(path):
        try:
            texts = {"text_a": row.text_a.strip(), "text_b": row.text_b.strip()}
            for key, text in texts.items():
                if not text:
                    raise FieldError(key, "is empty")
            score = _score(row.score.strip(), score_range)
            example_id = row.id.strip() if row.id is not None else f"{_split_stem(path)}-{row.line}"
            if not example_id:
                raise FieldError("id", "is empty")
        except FieldError as err:
            raise err.at(path, row.line) from None
        rows.append(_Row(SentencePairExample(example_id, texts["text_a"], texts["text_b"], score), row.line,
                         example_id))
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
    return make_dataset(entry, splits, notes, differs_from_blurb="BLUE's 70/16/14 split, not BLURB's 64/16/20")


def _generic_reader(labels: Sequence[str] | None, from_training_file: bool) -> Callable[[Path], list[_Row]]:
    return _read_similarity


SIMILARITY_FORMAT = GenericFormat(("tsv",), _generic_reader, lambda examples: (), PEARSON, takes_labels=False)
