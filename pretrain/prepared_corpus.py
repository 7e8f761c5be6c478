"""A prepared corpus as the instance stage opens it: shared by :mod:`pretrain.instance_builder` (one
corpus) and :mod:`pretrain.mixture` (several), so neither imports the other."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa

from biomed_lm.errors import PretrainError
from biomed_lm.finished_output import damage_listed, damaged_file_lines, file_identity, read_record
from biomed_lm.tokenization.sources import damaged_arrow_file, damaged_shard_message


class PretrainingDataError(PretrainError, ValueError):
    """Inputs or pretraining data that cannot be used; the message names the path and the problem."""


def open_corpus(path: str | os.PathLike):
    """The prepared corpus at ``path`` (a saved ``datasets.Dataset`` with a ``sentences`` column)."""
    import datasets

    p = Path(path)
    if not p.exists():
        raise PretrainingDataError(f"corpus not found: {p}")
    if not p.is_dir():  # e.g. the raw text or XML itself, before prepare_corpus made a corpus of it
        raise PretrainingDataError(f"{p} is a file, not a prepared corpus (a folder); build one from it with "
                                   "launch/prepare_corpus.py")
    refuse_recorded_damage(p, (read_record(p / "summary.json") or {}).get("output_files"), "prepared corpus",
                           "launch/prepare_corpus.py")
    try:
        corpus = datasets.load_from_disk(str(p))
    except Exception as err:  # datasets raises FileNotFoundError or others for a non-dataset folder
        if damaged_arrow_file(p) is not None:
            raise PretrainingDataError(damaged_shard_message(p, "prepared corpus", "launch/prepare_corpus.py",
                                                             err)) from err
        raise PretrainingDataError(f"{p} is not a prepared corpus ({err}); build one with "
                                   "launch/prepare_corpus.py") from err
    if not isinstance(corpus, datasets.Dataset):
        raise PretrainingDataError(f"{p} holds several splits ({', '.join(corpus)}); give one split's folder")
    feature = corpus.features.get("sentences")
    if feature is None:
        raise PretrainingDataError(f"{p} is not a prepared corpus: no 'sentences' column (columns: "
                                   f"{', '.join(corpus.column_names)}); build one with launch/prepare_corpus.py")
    arrow_type = corpus.data.schema.field("sentences").type
    if not (pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type)) or \
            not (pa.types.is_string(arrow_type.value_type) or pa.types.is_large_string(arrow_type.value_type)):
        raise PretrainingDataError(f"{p}: the 'sentences' column must hold lists of strings, not {feature}")
    return corpus


def refuse_recorded_damage(folder: Path, recorded_files: Any, what: str, rebuild_with: str) -> None:
    """Refuse a saved dataset a file of which was deleted or resized since its stage recorded it (a deleted
    shard read as a bare FileNotFoundError), naming the files and the command that rebuilds it."""
    damage = damaged_file_lines(folder, recorded_files)
    if damage:
        raise PretrainingDataError(f"{folder}: {what} cannot be read: {damage_listed(damage)}; rebuild it with "
                                   f"{rebuild_with} --overwrite")


def files_identity(dataset) -> list[str]:
    """Path, size and modification time of each file behind a dataset (:func:`file_identity`'s, flat)."""
    return [str(value) for cache_file in dataset.cache_files
            for value in file_identity(cache_file["filename"]).values()]
