"""Pretraining data on disk: its format, and the loader that checks it before training.

The instances (written by :mod:`pretrain.instance_builder`) are a ``datasets`` dataset of
:data:`INSTANCE_SCHEMA` in Arrow shards. ``pretraining_data.json`` beside them records what the
trainer must check (the vocabulary's sha256, casing, special-token ids, ``max_seq_length``, the
pair task) and a summary (instances, tokens, length percentiles, padding, pair-label balance,
documents used and skipped); its presence marks the dataset as complete.
:func:`load_pretraining_data` checks all of that against the model and tokenizer before any
training starts.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Mapping

import pyarrow as pa

from biomed_lm.errors import BiomedLMError
from biomed_lm.pretrain.instance_recipe import PAIR_LABELS
from biomed_lm.pretrain.prepared_corpus import PretrainingDataError, refuse_recorded_damage
from biomed_lm.resources import read_json_object
from biomed_lm.tokenization.sources import damaged_arrow_file, damaged_shard_message

FORMAT_VERSION = 1  # bump when the instances or their metadata change meaning
METADATA_FILE = "pretraining_data.json"

# The training columns (what the collator reads) and the provenance column.
INSTANCE_COLUMNS = ("input_ids", "token_type_ids", "next_sentence_label", "word_starts")
DOCUMENT_COLUMN = "document"
_LIST_COLUMNS = ("input_ids", "token_type_ids", "word_starts")

INSTANCE_SCHEMA = pa.schema([
    ("input_ids", pa.list_(pa.int32())),        # [CLS] A [SEP] B [SEP], unpadded
    ("token_type_ids", pa.list_(pa.int8())),    # 0 up to and including the first [SEP], then 1
    ("next_sentence_label", pa.int8()),         # IS_NEXT, NOT_NEXT, or NO_NSP_LABEL
    ("word_starts", pa.list_(pa.int8())),       # 1 on a word's first piece, 0 on ## pieces and [CLS]/[SEP]
    (DOCUMENT_COLUMN, pa.int64()),              # the corpus row that A comes from
])

METADATA_KEYS = ("format_version", "tokenizer", "vocab_size", "vocab_sha256", "lowercase", "special_token_ids",
                 "max_seq_length", "nsp", "seed", "short_seq_prob", "dupe_factor", "corpus", "summary")


def vocabulary_fingerprint(tokenizer) -> str:
    """sha256 (hex) of the vocabulary's tokens in id order, one per line.

    For a BERT tokenizer directory this is the sha256 of its ``vocab.txt``. Two tokenizers with the
    same fingerprint map every token to the same id, so a model and its data agree; that is what
    the trainer and continual pretraining check. Takes a ``transformers`` or ``tokenizers``
    tokenizer (added tokens included)."""
    vocab = tokenizer.get_vocab()
    by_id = sorted(vocab.items(), key=lambda item: item[1])
    ids = [index for _, index in by_id]
    if ids != list(range(len(ids))):
        missing = sorted(set(range(max(ids, default=-1) + 1)) - set(ids))[:5]
        raise PretrainingDataError(f"vocabulary ids are not contiguous from 0 (missing e.g. {missing})")
    return hashlib.sha256("".join(token + "\n" for token, _ in by_id).encode("utf-8")).hexdigest()


def pair_task_of(metadata: Mapping[str, Any]) -> str:
    """The data's pair task; data made before pair tasks existed record only ``nsp`` (true/false)."""
    return metadata.get("pair_task") or ("nsp" if metadata.get("nsp") else "none")


# ----------------------------------------------------------------------------- the loader

def load_pretraining_data(path: str | os.PathLike, tokenizer=None, max_position_embeddings: int | None = None,
                          expect_pair: bool | None = None) -> tuple[Any, dict]:
    """Open pretraining data for training, after checking that it can be trained on.

    Raises :class:`PretrainingDataError`, naming the problem, when ``path`` is not such data, its
    columns are missing or misnamed, it is empty, ``tokenizer`` (a loaded tokenizer or a path) has
    another vocabulary or casing than the one the data was built with, the data's
    ``max_seq_length`` exceeds ``max_position_embeddings``, or ``expect_pair`` is true and the data
    has no pair labels (pair_task none). The metadata always has ``pair_task`` and ``pair_classes``
    (derived for data made before they existed). Returns ``(dataset, metadata)``; the dataset keeps the ``document``
    provenance column (the collator reads only :data:`INSTANCE_COLUMNS`).
    """
    p = Path(path)
    metadata = _read_metadata(p)
    refuse_recorded_damage(p, metadata.get("output_files"), "instance dataset", "launch/create_pretraining_data.py")
    dataset = _open_instances(p, (metadata.get("summary") or {}).get("instances"))
    if tokenizer is not None:
        _check_tokenizer(p, metadata, tokenizer)
    if max_position_embeddings is not None and metadata["max_seq_length"] > max_position_embeddings:
        raise PretrainingDataError(
            f"{p} has instances of up to {metadata['max_seq_length']} tokens (max_seq_length) but the model has "
            f"{max_position_embeddings} position embeddings; build the data with --max-seq-length "
            f"{max_position_embeddings} or less, or use a model with more positions")
    metadata["pair_task"] = pair_task_of(metadata)
    metadata.setdefault("pair_classes", len(PAIR_LABELS[metadata["pair_task"]]))
    if expect_pair and metadata["pair_task"] == "none":
        raise PretrainingDataError(f"{p} was built without sentence pairs (pair_task none) but training expects a "
                                   "pair objective; rebuild it with --pair-task nsp (or sop, drp) or train MLM only "
                                   "(--no-train-pair)")
    return dataset, metadata


def _read_metadata(p: Path) -> dict:
    """``pretraining_data.json`` of the data at ``p``, with every key and this code's format version."""
    if not p.is_dir():
        raise PretrainingDataError(f"pretraining data not found: {p}")
    meta_path = p / METADATA_FILE
    if not meta_path.is_file():
        raise PretrainingDataError(f"{p} is not pretraining data: it has no {METADATA_FILE} (build it with "
                                   "launch/create_pretraining_data.py; a run that did not finish leaves none)")
    metadata = read_json_object(meta_path, PretrainingDataError, "pretraining-data metadata file")
    missing = [key for key in METADATA_KEYS if key not in metadata]
    if missing:
        raise PretrainingDataError(f"{meta_path}: metadata lacks {', '.join(missing)}")
    if metadata["format_version"] != FORMAT_VERSION:
        raise PretrainingDataError(f"{p} has format version {metadata['format_version']}; this code reads "
                                   f"version {FORMAT_VERSION}: rebuild it with launch/create_pretraining_data.py")
    return metadata


def _open_instances(p: Path, recorded: int | None):
    """The instance dataset at ``p``: one split, the expected columns, as many rows as ``recorded``."""
    import datasets

    if recorded == 0:
        raise PretrainingDataError(f"{p} holds no instances (its metadata records 0)")
    try:
        dataset = datasets.load_from_disk(str(p))
    except Exception as err:
        if damaged_arrow_file(p) is None:
            raise PretrainingDataError(f"{p}: cannot load the instance dataset: {type(err).__name__}: {err}") from err
        raise PretrainingDataError(damaged_shard_message(p, "instance dataset", "launch/create_pretraining_data.py",
                                                         err)) from err
    if not isinstance(dataset, datasets.Dataset):
        raise PretrainingDataError(f"{p} holds several splits ({', '.join(dataset)}), not one instance dataset")
    _check_schema(dataset.features, p)
    if len(dataset) == 0:
        raise PretrainingDataError(f"{p} holds no instances")
    if recorded != len(dataset):
        raise PretrainingDataError(f"{p} holds {len(dataset):,} instances but its metadata records {recorded}; "
                                   "the dataset is incomplete or was changed: rebuild it")
    return dataset


def _check_schema(features, origin: Path) -> None:
    import datasets

    missing = [name for name in INSTANCE_COLUMNS if name not in features]
    if missing:
        raise PretrainingDataError(f"{origin}: not pretraining instances: missing column(s) {', '.join(missing)} "
                                   f"(found: {', '.join(features) or 'none'}; expected: {', '.join(INSTANCE_COLUMNS)})")

    def is_int(feature) -> bool:
        return isinstance(feature, datasets.Value) and pa.types.is_integer(feature.pa_type)

    for name in INSTANCE_COLUMNS:
        feature = features[name]
        if name in _LIST_COLUMNS:
            inner = getattr(feature, "feature", None)
            ok = isinstance(feature, (datasets.List, datasets.LargeList)) and is_int(inner)
            kind = "lists of integers"
        else:
            ok, kind = is_int(feature), "integers"
        if not ok:
            raise PretrainingDataError(f"{origin}: column '{name}' must hold {kind}, not {feature}")


def load_tokenizer_or_fail(path: str | os.PathLike, error: type[BiomedLMError]):
    """The tokenizer at ``path`` (:func:`tokenization.tokenizer_io.load_tokenizer`), or ``error``
    "cannot load the tokenizer at {path}: {ErrorType}: {message}": transformers and tokenizers raise many
    kinds for a damaged or foreign folder (a JSONDecodeError, a plain Exception), and a user fixes each by
    the path. The toolkit's own errors already say what is wrong there and pass as they are."""
    from biomed_lm.tokenization.tokenizer_io import load_tokenizer

    try:
        return load_tokenizer(path)
    except BiomedLMError:
        raise
    except Exception as err:
        raise error(f"cannot load the tokenizer at {path}: {type(err).__name__}: {err}") from err


def _check_tokenizer(p: Path, metadata: dict, tokenizer) -> None:
    """Refuse a tokenizer (loaded, or a path) with another vocabulary or casing than the data's."""
    if isinstance(tokenizer, (str, os.PathLike)):
        tokenizer = load_tokenizer_or_fail(tokenizer, PretrainingDataError)
    fingerprint = vocabulary_fingerprint(tokenizer)
    if fingerprint != metadata["vocab_sha256"]:
        raise PretrainingDataError(
            f"{p} was built with another vocabulary: the data's has {metadata['vocab_size']:,} tokens "
            f"(sha256 {metadata['vocab_sha256'][:16]}…, from {metadata['tokenizer']}), the given tokenizer's "
            f"{len(tokenizer.get_vocab()):,} tokens (sha256 {fingerprint[:16]}…); token ids would not match")
    lowercase = (getattr(tokenizer, "init_kwargs", None) or {}).get("do_lower_case")
    recorded_casing = metadata["lowercase"]
    if isinstance(lowercase, bool) and isinstance(recorded_casing, bool) and lowercase != recorded_casing:
        raise PretrainingDataError(
            f"{p} was built {'uncased' if metadata['lowercase'] else 'cased'} but the given tokenizer is "
            f"{'uncased' if lowercase else 'cased'}: same vocabulary, different text normalization")
