"""Is this a checkpoint we can fine-tune? Checked once, before any data is featurized or any run starts.

A fine-tuning run on the wrong inputs does not crash, it scores: a directory without tokenizer
files used to get a 5-token tokenizer (every word ``[UNK]``) and a BLURB table; a vocabulary of
another model trained on, its ids indexing the wrong rows. So :func:`check_model` refuses, with
an :class:`~biomed_lm.errors.InputError` naming the file:

- a pretraining *run* directory is resolved to its final export ``model/``; without one the
  error names the newest checkpoint export (``checkpoints/step-N/hf``) to use instead;
- ``config.json`` must parse, a weights file must exist and be whole (its size matches what its
  header promises), its embedding matrix must have ``config.vocab_size`` rows;
- tokenizer files must exist and give a fast tokenizer whose size is the embedding matrix's (or
  that size rounded up for tensor cores), unless ``resize_embeddings`` says to resize;
- the tokenizer is prepared for the checkpoint's family (:mod:`finetune.model_families`:
  the prefix space of byte-level BPE, GPT-2's pad token and EOS framing), and the special tokens the
  family's inputs use ([CLS], [SEP], [PAD], [UNK]; GPT-2: EOS, pad, unk) must be in the vocabulary;
- a checkpoint class that is not its family's encoder (an ELECTRA generator) is refused.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from biomed_lm.errors import InputError
from biomed_lm.finetune.model_families import CheckpointFamily, checkpoint_family, prepare_tokenizer
from biomed_lm.positions import usable_positions as usable_positions_of_table
from biomed_lm.resources import read_json_object

CONFIG_FILE = "config.json"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json",
                "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model", "sentencepiece.bpe.model",
                   "tokenizer.model")
# Embedding matrices are often padded to a multiple of these (MosaicBERT: 30,522 -> 30,528) so
# the output projection runs on tensor cores; the extra rows are never indexed.
_PADDING_MULTIPLES = (8, 64, 128)
_EMBEDDING_KEY = re.compile(r"(^|\.)(word_embeddings|embed_tokens|wte)\.weight$")


@dataclass
class CheckedModel:
    """A checkpoint that passed :func:`check_model`: where it is and the tokenizer to use with it."""

    directory: Path
    tokenizer: Any
    embedding_rows: int
    tokenizer_size: int
    resize_to: int | None = None  # resize the embeddings to this many rows before training
    notes: list[str] = field(default_factory=list)
    family: CheckpointFamily = field(default_factory=lambda: checkpoint_family(None))
    #: the longest input its position embeddings take, and how that was read (None: no absolute positions)
    positions: tuple[int, str] | None = None

    def record(self) -> dict[str, Any]:
        """What ``run.json`` keeps of the check (the family under its record key ``model_family``)."""
        return {"directory": str(self.directory), "model_family": self.family.name,
                "embedding_rows": self.embedding_rows, "tokenizer_size": self.tokenizer_size,
                "resized_to": self.resize_to, "notes": list(self.notes)}


def check_model(path: str | Path, *, resize_embeddings: bool = False) -> CheckedModel:
    """Check the checkpoint at ``path`` (a model directory or a pretraining run directory)."""
    directory, notes = resolve_model_dir(path)
    config = _read_config(directory)
    rows = int(config["vocab_size"]) if isinstance(config.get("vocab_size"), int) else None
    if rows is None:
        raise InputError(f"{directory / CONFIG_FILE}: no integer vocab_size; not a transformers encoder config")
    family = checkpoint_family(config.get("model_type"))
    _check_encoder_class(config, family, directory)
    _check_weights(directory, rows)
    tokenizer = _load_tokenizer(directory, family)
    notes += prepare_tokenizer(tokenizer, family)
    checked = CheckedModel(directory, tokenizer, rows, len(tokenizer), notes=notes, family=family,
                           positions=usable_positions(config, family))
    _check_special_tokens(tokenizer, directory, family)
    _match_vocabulary(checked, resize_embeddings)
    return checked


def usable_positions(config: dict[str, Any], family: CheckpointFamily) -> tuple[int, str] | None:
    """The longest input the checkpoint's position embeddings take, with how it was read; None where the config
    names none or the model adds no absolute positions (DeBERTa-v2's relative attention)."""
    table = config.get("max_position_embeddings", config.get("n_positions"))
    if not isinstance(table, int) or config.get("position_biased_input") is False:
        return None
    pad = config.get("pad_token_id")
    if family.positions_after_padding and isinstance(pad, int):
        return (usable_positions_of_table(table, True, pad),
                f"max_position_embeddings {table}, less the padding id {pad} + 1 (RoBERTa's positions)")
    return table, f"max_position_embeddings {table}"


def check_input_length(max_length: int, explicit: bool, checked: CheckedModel) -> None:
    """Refuse inputs longer than the checkpoint's positions before any training (QA: --max-length 514 on a RoBERTa
    export, whose 514 positions take 512 tokens, ended in an index error inside transformers)."""
    if checked.positions is None or max_length <= checked.positions[0]:
        return
    limit, how = checked.positions
    what = f"--max-length {max_length}" if explicit else f"this dataset's default max_length {max_length}"
    raise InputError(f"{what} is longer than the {checked.directory} checkpoint takes: {limit} tokens ({how}); "
                     f"pass --max-length {limit} or less")


# ------------------------------------------------------------------------------ the directory

def resolve_model_dir(path: str | Path) -> tuple[Path, list[str]]:
    """The directory holding ``config.json``: ``path`` itself, or a run directory's ``model/``."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"model checkpoint directory not found: {path}")
    if not path.is_dir():
        raise InputError(f"{path} is a file; give the checkpoint directory that holds {CONFIG_FILE}")
    if (path / CONFIG_FILE).is_file():
        return path, []
    if (path / "model" / CONFIG_FILE).is_file():
        return path / "model", [f"{path} is a pretraining run directory: using its export {path / 'model'}"]
    if (path / "hf" / CONFIG_FILE).is_file():
        raise InputError(f"{path} holds no {CONFIG_FILE}: it looks like a pretraining checkpoint; its transformers "
                         f"export is {path / 'hf'}: pass that to fine-tune it")
    exports = sorted(path.glob("checkpoints/step-*/hf"), key=_step_of)
    if exports:
        raise InputError(f"{path} holds no {CONFIG_FILE}: it looks like a pretraining run that has not finished "
                         f"(no model/ export). Its newest checkpoint export is {exports[-1]}; pass that to "
                         "fine-tune it, or finish the run")
    raise InputError(f"{path} holds no {CONFIG_FILE}: not a checkpoint directory (expected a transformers "
                     "export: config.json, weights and tokenizer files)")


def _step_of(export: Path) -> int:
    digits = export.parent.name.removeprefix("step-")
    return int(digits) if digits.isdigit() else -1


def _read_config(directory: Path) -> dict[str, Any]:
    path = directory / CONFIG_FILE
    return read_json_object(path, InputError, "model configuration")


def _check_encoder_class(config: dict[str, Any], family: CheckpointFamily, directory: Path) -> None:
    for architecture in config.get("architectures") or ():
        if architecture in family.not_encoders:
            raise InputError(f"{directory / CONFIG_FILE}: {architecture} is {family.not_encoders[architecture]}")


# -------------------------------------------------------------------------------- the weights

def _check_weights(directory: Path, rows: int) -> None:
    present = [directory / name for name in WEIGHT_FILES if (directory / name).is_file()]
    if not present:
        raise InputError(f"{directory}: no weights file (expected one of {', '.join(WEIGHT_FILES)})")
    weights = present[0]
    if weights.name.endswith(".index.json"):
        shapes = _sharded_shapes(weights)
    elif weights.suffix == ".safetensors":
        shapes = _safetensors_shapes(weights)
    else:
        shapes = _torch_shapes(weights)
    embedding = [(name, shape) for name, shape in shapes.items() if _EMBEDDING_KEY.search(name)]
    if embedding and embedding[0][1][0] != rows:
        name, shape = embedding[0]
        raise InputError(f"{weights}: {name} has {shape[0]} rows but {directory / CONFIG_FILE} says vocab_size "
                         f"{rows}; the config and the weights come from different models")


def _safetensors_shapes(path: Path) -> dict[str, list[int]]:
    """Tensor shapes from a safetensors header, after checking that the file holds every byte the
    header promises (a truncated copy is the usual way a checkpoint breaks)."""
    size = path.stat().st_size
    try:
        with path.open("rb") as handle:
            (header_length,) = struct.unpack("<Q", handle.read(8))
            if header_length > size - 8:
                raise ValueError(f"header of {header_length} bytes in a {size}-byte file")
            header = json.loads(handle.read(header_length))
        tensors = {k: v for k, v in header.items() if k != "__metadata__"}
        needed = 8 + header_length + max((v["data_offsets"][1] for v in tensors.values()), default=0)
    except (struct.error, ValueError, KeyError, TypeError) as err:
        raise InputError(f"{path}: not a readable safetensors file ({err})") from None
    if size < needed:
        raise InputError(f"{path}: truncated ({size} bytes, its header needs {needed}); copy the checkpoint again")
    return {name: list(info["shape"]) for name, info in tensors.items()}


def _torch_shapes(path: Path) -> dict[str, list[int]]:
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - zip, pickle and EOF errors alike mean "damaged"
        raise InputError(f"{path}: cannot be loaded ({type(err).__name__}: {err})") from None
    return {name: list(tensor.shape) for name, tensor in state.items() if hasattr(tensor, "shape")}


def _sharded_shapes(index: Path) -> dict[str, list[int]]:
    try:
        shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise InputError(f"{index}: not a readable weights index ({err})") from None
    shapes: dict[str, list[int]] = {}
    for shard in shards:
        if not (index.parent / shard).is_file():
            raise InputError(f"{index}: names the shard {shard}, which is missing")
        read = _safetensors_shapes if shard.endswith(".safetensors") else _torch_shapes
        shapes.update(read(index.parent / shard))
    return shapes


# ------------------------------------------------------------------------------ the tokenizer

def _load_tokenizer(directory: Path, family: CheckpointFamily):
    if not any((directory / name).is_file() for name in TOKENIZER_FILES):
        raise InputError(f"{directory}: no tokenizer files (expected one of {', '.join(TOKENIZER_FILES)}); "
                         "save the vocabulary the model was pretrained with into it")
    from transformers import AutoTokenizer

    from biomed_lm.tokenization.tokenizer_io import CasingMismatchError, align_wordpiece_casing, directory_casing

    try:
        tokenizer = AutoTokenizer.from_pretrained(directory, **family.tokenizer_kwargs())
    except Exception as err:  # noqa: BLE001 - a damaged tokenizer file surfaces as many error types
        raise InputError(f"{directory}: the tokenizer cannot be loaded ({type(err).__name__}: {err})") from None
    try:  # a folder of vocab.txt alone is lowercased by AutoTokenizer's default, cased vocabulary or not
        align_wordpiece_casing(tokenizer, directory, directory_casing(directory))
    except CasingMismatchError as err:
        raise InputError(str(err)) from None
    except (OSError, ValueError) as err:  # a damaged vocab_card.json, which AutoTokenizer does not read
        raise InputError(f"{directory}: cannot tell its vocabulary's casing ({type(err).__name__}: {err})") from None
    if not getattr(tokenizer, "is_fast", False):
        raise InputError(f"{directory}: a fast tokenizer (tokenizer.json or vocab.txt) is needed for word alignment")
    return tokenizer


def _check_special_tokens(tokenizer, directory: Path, family: CheckpointFamily) -> None:
    vocabulary = tokenizer.get_vocab()
    for kind in family.special_tokens:
        token = getattr(tokenizer, f"{kind}_token", None)
        if token is None:
            raise InputError(f"{directory}: the tokenizer defines no {kind} token; fine-tuning inputs of a "
                             f"{family.name} model need {', '.join(family.special_tokens)}")
        if token not in vocabulary:
            raise InputError(f"{directory}: the tokenizer's {kind} token {token!r} is not in its vocabulary")


def _match_vocabulary(checked: CheckedModel, resize_embeddings: bool) -> None:
    rows, size = checked.embedding_rows, checked.tokenizer_size
    if size == rows:
        return
    if size < rows and any(rows == -(-size // m) * m for m in _PADDING_MULTIPLES):
        checked.notes.append(f"embeddings padded: {rows} rows for {size} tokens (the extra rows are never used)")
        return
    if resize_embeddings:
        checked.resize_to = size
        checked.notes.append(f"embeddings resized from {rows} to {size} rows (resize_embeddings); "
                             + ("the new rows start at random" if size > rows else "the last rows are dropped"))
        return
    raise InputError(f"{checked.directory}: the tokenizer has {size} tokens but the model's embeddings have {rows} "
                     f"rows ({CONFIG_FILE} vocab_size): the tokenizer is not the one this model was trained with. "
                     "Put the pretraining vocabulary into the directory, or pass --resize_embeddings to resize "
                     "the embeddings to the tokenizer")
