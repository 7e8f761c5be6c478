"""Where a pretraining run's weights start: from scratch, or from a general-domain BERT.

The paper (Table 9) compares three starting points, and so does this module:

``scratch``
    Random initialization with the in-domain vocabulary (PubMedBERT): ``build_bert`` with the
    given tokenizer's size and [PAD] id; ``model_fields`` (a preset) gives the architecture.

``continual``
    A general-domain checkpoint (bert-base-uncased; here the packaged all-MiniLM-L6-v2) trained on
    with its *own* vocabulary (BioBERT). The architecture is the checkpoint's: ``model_fields`` are
    not applied, and any field that disagrees with the checkpoint is reported (and logged) as
    ignored, because a preset can only describe a *fresh* model and silently mixing the two would
    misdescribe the run. The tokenizer the run uses must be the checkpoint's vocabulary
    (same ``vocabulary_fingerprint`` as the tokenizer saved in the checkpoint directory, same
    casing): instances made with another vocabulary index other embedding rows, which trains
    without error and learns nothing sensible, so it is refused before training.
    Weights the checkpoint lacks are initialized by ``transformers`` (a sentence-embedding
    ``BertModel`` such as all-MiniLM-L6-v2 has no MLM transform, MLM bias or NSP head) and listed
    in :attr:`InitReport.newly_initialized`. A checkpoint missing anything *else* (embeddings,
    encoder layers) is refused: that would be a random model wearing a checkpoint's name.

``continual-new-vocab``
    The general-domain weights with the in-domain vocabulary (Table 9, second column). Every
    tensor that does not depend on the vocabulary is copied from the checkpoint; the two that do,
    the word embeddings (to which the MLM decoder is tied) and the MLM output bias
    ``cls.predictions.bias`` (one logit offset per token), are rebuilt row by row for the new
    vocabulary:

    * a token present in both vocabularies (the same string: "insulin", "##ing", "[CLS]",
      "[unused5]") keeps its old row, bit for bit;
    * any other token starts from the **mean of the old rows of the pieces the old tokenizer
      splits it into** ("naloxone" → na ##lo ##xon ##e). The string is normalized by the *old*
      tokenizer's own normalizer first (so a cased in-domain "Insulin" becomes the uncased model's
      "insulin") and split by its pre-tokenizer; a continuation token "##xyz" is segmented the way
      WordPiece continues inside a word (greedy longest match over "##"-prefixed pieces from the
      first character on), which is exactly how the old tokenizer would split "xyz" when it
      follows other characters of a word. Pieces that come out as [UNK] carry nothing about the
      string and are left out of the mean. The bias row is built from the same pieces
      (:class:`PieceSplitter` is the rule, inspectable on its own).
      Why the mean of pieces: the general model has only ever seen this string as those
      pieces, so their mean is the input closest to what it already understands for the word:
      a new token starts near the general model's representation of it rather than at an
      arbitrary point, its row lies among the rows the encoder was trained on (same scale and
      region, unlike a random row), and through the tied decoder its MLM logit starts comparable
      to those of its pieces;
    * the **fallback**: a token the old tokenizer can only map to [UNK] (a character missing from
      the old vocabulary) and a special or placeholder token absent from the old vocabulary
      (the new tokenizer's special tokens, ``[unused7]``-style ``[...]`` tokens) has no pieces
      to average; it starts from the mean of the old rows of ordinary tokens (special and
      ``[...]`` placeholder rows excluded: those were never or rarely trained and would pull the
      mean towards the random initialization). The mean row is the neutral choice: the old
      [UNK] row would make every such token look "unknown" to the encoder from step one.

    :class:`InitReport` counts the copied, built and fallback rows.

Model families. Everything above is said of BERT; the other families (:mod:`pretrain.families`)
go through the same three modes with their own class, names and heads: the checkpoint's
``model_type`` must be the family's (``albert`` for ``--architecture albert``), the tensors it may
lack are the family's heads and pooler, and the vocabulary tensors are the family's word
embeddings and MLM bias (ALBERT's are E-wide, not H-wide; the rule is the same).
``continual-new-vocab`` needs a WordPiece tokenizer in the checkpoint (ALBERT's own releases ship
SentencePiece ones, which :class:`PieceSplitter` refuses by name).

The pair head. ``pair_task`` (the run's trained pair objective, see
:func:`pretrain.families.resolve_pair_objective`) sizes it: BERT with ``drp`` gets a 3-way head,
newly initialized unless the checkpoint is a DRP export with its head saved beside it
(``pair_head.safetensors``), which is then restored.

Random parts (everything in ``scratch``, the missing heads in the continual modes) come from
torch's global generator: seed it before calling (the trainer does, identically on every rank).
All returned models are plain ``transformers`` modules of the family's class (``BertForPreTraining``
for BERT) with tied output embeddings and ``architectures`` naming that class:
``save_pretrained`` output loads with it (BERT's also with ``BertForMaskedLM``) and ``AutoModel``.
Everything is float32, whatever the checkpoint's storage dtype (mixed precision is DeepSpeed's
business).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, get_args

import torch

from biomed_lm.errors import PretrainError
from biomed_lm.pretrain.config import InitMode
from biomed_lm.pretrain.data import vocabulary_fingerprint
from biomed_lm.pretrain.families import BERT, ModelFamily, get_family
from biomed_lm.resources import read_json_object
from biomed_lm.tokenization.tokenizer_io import load_tokenizer

if TYPE_CHECKING:
    from transformers import BertConfig, BertForPreTraining

LOG = logging.getLogger(__name__)

INIT_MODES: tuple[str, ...] = get_args(InitMode)  # pretrain.config's Literal, defined once
SCRATCH, CONTINUAL, CONTINUAL_NEW_VOCAB = INIT_MODES

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json")
# Config fields that never come from a model preset (the tokenizer decides them).
TOKENIZER_FIELDS = frozenset({"vocab_size", "pad_token_id"})
_PLACEHOLDER = re.compile(r"\[[^\[\]\s]+\]")


class InitializationError(PretrainError, ValueError):
    """The requested initialization cannot work; raised before any training, naming the cause."""


@dataclass
class InitReport:
    """What :func:`initialize_model` did, for the run log and the run's recorded config.

    Row counts refer to the word-embedding matrix (the MLM bias follows the same rows):
    ``copied_rows`` came unchanged from the checkpoint, ``built_rows`` are means of the old
    pieces of a new token, ``fallback_rows`` (listed in ``fallback_tokens``) the mean old row.
    In ``scratch`` mode all three are 0 and ``newly_initialized`` lists every parameter."""

    mode: str
    checkpoint: str | None
    vocab_size: int
    checkpoint_vocab_size: int | None = None
    newly_initialized: list[str] = field(default_factory=list)
    copied_rows: int = 0
    built_rows: int = 0
    fallback_rows: int = 0
    fallback_tokens: list[str] = field(default_factory=list)
    ignored_model_fields: dict[str, Any] = field(default_factory=dict)
    unused_checkpoint_keys: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        """One paragraph for the run log."""
        if self.mode == SCRATCH:
            return (f"Initialization: scratch — all {len(self.newly_initialized)} parameter tensors randomly "
                    f"initialized, vocabulary of {self.vocab_size} tokens (the given tokenizer's).")
        parts = [f"Initialization: {self.mode} from {self.checkpoint}"]
        if self.mode == CONTINUAL:
            parts.append(f"with the checkpoint's own vocabulary ({self.vocab_size} tokens, all "
                         f"{self.copied_rows} embedding rows from the checkpoint)")
        else:
            sample = ", ".join(self.fallback_tokens[:5]) + (", …" if len(self.fallback_tokens) > 5 else "")
            parts.append(
                f"with a new vocabulary of {self.vocab_size} tokens (checkpoint: {self.checkpoint_vocab_size}): "
                f"{self.copied_rows} embedding rows copied (shared tokens), {self.built_rows} built as the mean "
                f"of the old tokenizer's pieces, {self.fallback_rows} set to the mean old embedding"
                + (f" ({sample})" if self.fallback_tokens else ""))
        text = " ".join(parts) + ". "
        if self.newly_initialized:
            text += (f"Not in the checkpoint, newly initialized: {', '.join(self.newly_initialized)}. ")
        else:
            text += "Every parameter came from the checkpoint. "
        if self.ignored_model_fields:
            fields = ", ".join(f"{k}={v['requested']!r} (checkpoint: {v['checkpoint']!r})"
                               for k, v in self.ignored_model_fields.items())
            text += f"Model preset fields ignored (the architecture is the checkpoint's): {fields}. "
        if self.unused_checkpoint_keys:
            text += f"Checkpoint tensors not used: {', '.join(self.unused_checkpoint_keys)}. "
        return text.strip()


@contextlib.contextmanager
def quiet_loading() -> Iterator[None]:
    """transformers' loading report (missing and unexpected keys, its progress bar) silenced for the block:
    for a model whose weights are about to be replaced (a resumed run's)."""
    from transformers.utils import logging as hf_logging

    level, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def _sequence_token_ids(config, tokenizer) -> None:
    """The ids a config names for a sequence's start and end (RoBERTa's and ALBERT's configs carry
    ``bos_token_id``/``eos_token_id``; BERT's none), set from the tokenizer the model is trained with: the
    configs' defaults are ids of RoBERTa's and ALBERT's own vocabularies, which another vocabulary (a
    WordPiece one) gives to other tokens (QA: the export said bos 0 = [PAD], eos 2 = [unused1])."""
    for name, roles in (("bos_token_id", ("bos", "cls")), ("eos_token_id", ("eos", "sep"))):
        if getattr(config, name, None) is None:
            continue
        token_id = next((i for i in (getattr(tokenizer, f"{role}_token_id", None) for role in roles)
                         if i is not None), None)
        if token_id is not None:
            setattr(config, name, int(token_id))


def initialize_model(mode: str, *, tokenizer, model_fields: dict | None = None, init_checkpoint: str | None = None,
                     attn_implementation: str = "sdpa", architecture: str = "bert", pair_task: str | None = None
                     ) -> tuple[BertForPreTraining, InitReport]:
    """A model of ``architecture``'s family (``BertForPreTraining`` for BERT) to start pretraining
    from, and an :class:`InitReport`.

    ``tokenizer`` is the tokenizer the run trains with (the one its instances were made with).
    ``model_fields`` (the family's config fields from a preset) are required for ``scratch`` and only
    compared with the checkpoint's config in the continual modes. ``init_checkpoint`` is a
    general-domain checkpoint directory of the family (config, weights, tokenizer) for the continual
    modes and must be absent for ``scratch``. ``pair_task`` sizes the pair head (None: the class's
    own head; see :meth:`pretrain.families.ModelFamily.set_pair_task`). Raises
    :class:`InitializationError` before loading any weights when the combination cannot work."""
    family = get_family(architecture)
    if mode not in INIT_MODES:
        raise InitializationError(f"unknown initialization mode {mode!r}; choose one of {', '.join(INIT_MODES)}")
    if mode == SCRATCH:
        if init_checkpoint:
            raise InitializationError(
                f"mode 'scratch' initializes randomly but an init_checkpoint was given ({init_checkpoint}); "
                f"use mode 'continual' or 'continual-new-vocab' to start from it, or drop the checkpoint")
        if model_fields is None:
            raise InitializationError("mode 'scratch' needs model_fields (a model preset) for the architecture")
        model = family.build(model_fields, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                             attn_implementation=attn_implementation, pair_task=pair_task)
        _sequence_token_ids(model.config, tokenizer)
        return model, InitReport(mode=mode, checkpoint=None, vocab_size=len(tokenizer),
                                 newly_initialized=[name for name, _ in model.named_parameters()])

    if not init_checkpoint:
        raise InitializationError(f"mode {mode!r} starts from a general-domain {family.title} checkpoint; "
                                  f"give init_checkpoint (a directory with config, weights and tokenizer)")
    path = Path(init_checkpoint)
    config = load_checkpoint_config(path, architecture)
    old_tokenizer = _checkpoint_tokenizer(path)
    if config.vocab_size < len(old_tokenizer):
        raise InitializationError(f"{path}: the model has {config.vocab_size} embedding rows but its tokenizer "
                                  f"has {len(old_tokenizer)} tokens; the checkpoint is inconsistent: resize its "
                                  "embeddings to the tokenizer first (transformers' resize_token_embeddings, then "
                                  "save_pretrained), or start from its weights with your own tokenizer through "
                                  "--init continual-new-vocab")
    ignored = _conflicting_fields(model_fields or {}, config)
    if ignored:
        LOG.warning("initialization %s: model preset fields ignored, the architecture is the checkpoint's: %s",
                    mode, ignored)

    if mode == CONTINUAL:
        _require_same_vocabulary(tokenizer, old_tokenizer, path)
        model, newly, unused = _load_pretraining_model(path, attn_implementation, family, pair_task)
        return model, InitReport(mode=mode, checkpoint=str(path), vocab_size=config.vocab_size,
                                 checkpoint_vocab_size=config.vocab_size, newly_initialized=newly,
                                 copied_rows=config.vocab_size, ignored_model_fields=ignored,
                                 unused_checkpoint_keys=unused)

    old_model, newly, unused = _load_pretraining_model(path, attn_implementation, family, pair_task)
    model, rows = _transplant_vocabulary(old_model, old_tokenizer, tokenizer, attn_implementation, family, pair_task)
    return model, InitReport(mode=mode, checkpoint=str(path), vocab_size=len(tokenizer),
                             checkpoint_vocab_size=len(old_tokenizer), newly_initialized=newly,
                             copied_rows=rows.copied, built_rows=rows.built, fallback_rows=len(rows.fallback),
                             fallback_tokens=rows.fallback, ignored_model_fields=ignored,
                             unused_checkpoint_keys=unused)


def load_checkpoint_config(init_checkpoint: str | Path, architecture: str = "bert") -> BertConfig:
    """The config (``BertConfig`` for BERT) of a checkpoint directory, after checking the directory
    is a usable checkpoint of ``architecture``'s family (config of its model_type, weights,
    tokenizer). Cheap (no weights are read), so a trainer can check e.g. the positions against its
    data before loading."""
    family = get_family(architecture)
    if not init_checkpoint:  # Path("") is ".": the message would name the working directory, not the option
        raise InitializationError(f"no init_checkpoint given: the continual modes start from a general-domain "
                                  f"{family.title} checkpoint directory (--init-checkpoint DIR, with config.json, "
                                  f"weights and the tokenizer)")
    path = Path(init_checkpoint)
    if not path.exists():
        raise InitializationError(f"init_checkpoint {path} does not exist")
    if not path.is_dir():
        raise InitializationError(f"init_checkpoint {path} is not a directory (expected a checkpoint directory "
                                  f"with config.json, weights and the tokenizer)")
    missing = []
    if not (path / "config.json").is_file():
        missing.append("config.json")
    if not any((path / name).is_file() for name in WEIGHT_FILES):
        missing.append("weights (" + " or ".join(WEIGHT_FILES) + ")")
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        missing.append("tokenizer (" + " or ".join(TOKENIZER_FILES) + ")")
    if missing:
        raise InitializationError(f"init_checkpoint {path} is not a {family.title} checkpoint directory: it has no "
                                  + ", no ".join(missing))
    raw = read_json_object(path / "config.json", InitializationError, "model configuration")
    model_type = raw.get("model_type")
    if model_type != family.model_type:
        raise InitializationError(f"init_checkpoint {path} is not a {family.title} checkpoint: config.json has "
                                  f"model_type {model_type!r}, expected {family.model_type!r} (--architecture "
                                  f"{family.name})")
    return family.transformers_class(family.config_class).from_pretrained(str(path), local_files_only=True)


class PieceSplitter:
    """How the old (checkpoint's) tokenizer splits the tokens of a new vocabulary.

    ``splitter.pieces(token)`` is the list of old vocabulary pieces for a token, [UNK] pieces left
    out: the token's text is normalized and pre-tokenized with the old tokenizer's own pipeline,
    then split by greedy longest-match-first WordPiece over the old vocabulary; a token starting
    with ``continuation_prefix`` (the new vocabulary's, "##" for BERT) is split as the continuation
    of a word, i.e. its first piece is itself a "##" piece. An empty list means the old tokenizer
    has nothing but [UNK] for it. The old vocabulary is looked up once, at construction (a
    vocabulary transplant splits tens of thousands of tokens)."""

    def __init__(self, old_tokenizer):
        backend = old_tokenizer.backend_tokenizer
        model = backend.model
        prefix = getattr(model, "continuing_subword_prefix", None)
        if prefix is None:
            raise InitializationError(f"the checkpoint's tokenizer is not WordPiece ({type(model).__name__}); "
                                      f"continual-new-vocab needs a BERT WordPiece tokenizer")
        self._vocab = old_tokenizer.get_vocab()
        self._prefix = prefix
        self._normalizer, self._pre_tokenizer = backend.normalizer, backend.pre_tokenizer
        self._max_chars = model.max_input_chars_per_word

    def pieces(self, token: str, continuation_prefix: str = "##") -> list[str]:
        """The old pieces of ``token`` (empty: nothing but [UNK]); see the class docstring."""
        continuation = (bool(continuation_prefix) and token.startswith(continuation_prefix)
                        and len(token) > len(continuation_prefix))
        text = token[len(continuation_prefix):] if continuation else token
        if self._normalizer is not None:
            text = self._normalizer.normalize_str(text)
        if self._pre_tokenizer is not None:
            words = [word for word, _ in self._pre_tokenizer.pre_tokenize_str(text)]
        else:
            words = text.split()
        pieces: list[str] = []
        for i, word in enumerate(words):
            pieces += _greedy_wordpiece(word, self._vocab, self._prefix, continuation=continuation and i == 0,
                                        max_chars=self._max_chars)
        return pieces


def _greedy_wordpiece(word: str, vocab: dict[str, int], prefix: str, *, continuation: bool,
                      max_chars: int) -> list[str]:
    """BERT's WordPiece on one word: longest vocabulary match first, then "##" pieces; a word that
    cannot be covered, or is longer than ``max_chars``, is one [UNK] (returned as no pieces).
    With ``continuation`` the word is the inside of a longer word, so it starts with a "##" piece."""
    if len(word) > max_chars:
        return []
    pieces, start = [], 0
    while start < len(word):
        end = len(word)
        while end > start:
            candidate = word[start:end]
            if start > 0 or continuation:
                candidate = prefix + candidate
            if candidate in vocab:
                break
            end -= 1
        if end == start:
            return []
        pieces.append(candidate)
        start = end
    return pieces


@dataclass
class _Rows:
    copied: int
    built: int
    fallback: list[str]


def _transplant_vocabulary(old_model, old_tokenizer, new_tokenizer, attn_implementation: str,
                           family: ModelFamily = BERT, pair_task: str | None = None):
    """A model with ``old_model``'s weights and ``new_tokenizer``'s vocabulary (rules: module doc)."""
    import torch.nn.functional as F

    new_tokens = _tokens_by_id(new_tokenizer, "the run's tokenizer")
    old_tokens = _tokens_by_id(old_tokenizer, "the checkpoint's tokenizer")
    old_ids = {token: i for i, token in enumerate(old_tokens)}
    new_specials = set(new_tokenizer.all_special_tokens)
    new_prefix = getattr(new_tokenizer.backend_tokenizer.model, "continuing_subword_prefix", None) or "##"
    splitter = PieceSplitter(old_tokenizer)

    copy_src, copy_dst, bag_ids, bag_offsets, bag_dst, fallback_dst, fallback = [], [], [], [], [], [], []
    for new_id, token in enumerate(new_tokens):
        if token in old_ids:
            copy_src.append(old_ids[token])
            copy_dst.append(new_id)
            continue
        pieces = [] if _is_placeholder(token, new_specials) else splitter.pieces(token, new_prefix)
        if pieces:
            bag_offsets.append(len(bag_ids))
            bag_ids += [old_ids[p] for p in pieces]
            bag_dst.append(new_id)
        else:
            fallback_dst.append(new_id)
            fallback.append(token)

    old_specials = set(old_tokenizer.all_special_tokens)
    ordinary = [i for i, token in enumerate(old_tokens) if not _is_placeholder(token, old_specials)]
    config = copy.deepcopy(old_model.config)
    config.vocab_size = len(new_tokens)
    config.pad_token_id = new_tokenizer.pad_token_id
    _sequence_token_ids(config, new_tokenizer)
    config.architectures = [family.model_class]
    model = family.transformers_class(family.model_class)._from_config(config, attn_implementation=attn_implementation)
    family.set_pair_task(model, pair_task)  # the head old_model was given, so its tensors fit

    old_state, new_state = old_model.state_dict(), model.state_dict()
    word_embeddings, mlm_bias = family.vocabulary_tensors[:2]
    with torch.no_grad():
        for name, tensor in new_state.items():
            if name in family.vocabulary_tensors:
                continue
            if name not in old_state or old_state[name].shape != tensor.shape:
                raise InitializationError(f"cannot transplant {name}: the checkpoint's tensor is "
                                          f"{tuple(old_state[name].shape) if name in old_state else 'absent'}, "
                                          f"the new model's {tuple(tensor.shape)}")
            tensor.copy_(old_state[name])
        for name in (word_embeddings, mlm_bias):
            old = old_state[name].float()
            table = old if old.dim() == 2 else old[:, None]
            rows = torch.empty((len(new_tokens), table.shape[1]), dtype=table.dtype)
            rows[copy_dst] = table[copy_src]
            if bag_dst:
                rows[bag_dst] = F.embedding_bag(torch.tensor(bag_ids), table, torch.tensor(bag_offsets), mode="mean")
            if fallback_dst:
                rows[fallback_dst] = table[ordinary].mean(dim=0)
            # In place, so the decoder weight and bias stay tied to these parameters.
            new_state[name].copy_(rows if old.dim() == 2 else rows[:, 0])
    return model, _Rows(copied=len(copy_dst), built=len(bag_dst), fallback=fallback)


def _is_placeholder(token: str, special_tokens: set[str]) -> bool:
    """Special tokens and ``[...]`` placeholders ([unused7]): their text means nothing to split."""
    return token in special_tokens or bool(_PLACEHOLDER.fullmatch(token))


def _tokens_by_id(tokenizer, what: str) -> list[str]:
    by_id = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    if [i for _, i in by_id] != list(range(len(tokenizer))):
        raise InitializationError(f"{what}: vocabulary ids are not contiguous from 0 to {len(tokenizer) - 1}")
    return [token for token, _ in by_id]


def _checkpoint_tokenizer(path: Path):
    try:
        return load_tokenizer(path)
    except (OSError, ValueError) as err:
        raise InitializationError(f"cannot load the tokenizer saved in {path}: {err}") from err


def _lowercases(tokenizer) -> bool | None:
    value = tokenizer.init_kwargs.get("do_lower_case")
    return value if isinstance(value, bool) else None


def _require_same_vocabulary(tokenizer, old_tokenizer, path: Path) -> None:
    """Continual pretraining keeps the checkpoint's embeddings, so the run must use its vocabulary."""
    if vocabulary_fingerprint(tokenizer) != vocabulary_fingerprint(old_tokenizer):
        raise InitializationError(
            f"mode 'continual' keeps the checkpoint's vocabulary, but the run's tokenizer ({len(tokenizer)} tokens) "
            f"is not the one saved in {path} ({len(old_tokenizer)} tokens): make the pretraining instances with "
            f"the tokenizer in {path}, or use mode 'continual-new-vocab' to continue with the in-domain vocabulary")
    mine, theirs = _lowercases(tokenizer), _lowercases(old_tokenizer)
    if mine is not None and theirs is not None and mine != theirs:
        raise InitializationError(
            f"mode 'continual': the run's tokenizer is {'uncased' if mine else 'cased'} but the checkpoint {path} "
            f"was trained {'uncased' if theirs else 'cased'}; load the tokenizer from {path} as it is")


def _conflicting_fields(model_fields: dict, config) -> dict[str, dict[str, Any]]:
    """Preset fields whose value differs from the checkpoint's config (they are not applied)."""
    return {name: {"requested": value, "checkpoint": getattr(config, name, None)}
            for name, value in model_fields.items()
            if name not in TOKENIZER_FIELDS and getattr(config, name, None) != value}


def _load_pretraining_model(path: Path, attn_implementation: str, family: ModelFamily = BERT,
                            pair_task: str | None = None):
    """The family's class (``BertForPreTraining``) from a checkpoint, the parameters it had to
    initialize, and the checkpoint tensors it did not use. Refuses a checkpoint missing more than
    heads and pooler. The pair head is sized for ``pair_task``: one that does not fit is replaced by
    a new head (listed as newly initialized; the checkpoint's, if it had one, as unused), and a head
    saved beside a DRP export (``pair_head.safetensors``) is restored."""
    try:
        model, info = family.transformers_class(family.model_class).from_pretrained(
            str(path), attn_implementation=attn_implementation, output_loading_info=True,
            local_files_only=True, dtype=torch.float32)
    except (OSError, ValueError, RuntimeError) as err:
        raise InitializationError(f"cannot load {family.title} weights from {path}: {err}") from err
    # from_pretrained returns a model in eval mode, and nothing after it switched it back: every run continued in
    # the checkpoint's own vocabulary trained without dropout (QA 2026-11-29)
    model.train()
    if info.get("mismatched_keys"):
        raise InitializationError(f"{path}: tensors whose shape does not match the config: "
                                  f"{sorted(map(str, info['mismatched_keys']))}")
    newly = _newly_initialized(model, info.get("missing_keys", ()))
    essential = sorted(name for name in newly if not name.startswith(family.initializable))
    if essential:
        raise InitializationError(
            f"{path} lacks weights a continued model needs (they would start random): {', '.join(essential[:8])}"
            + (f" and {len(essential) - 8} more" if len(essential) > 8 else "")
            + f"; is it a {family.title} checkpoint with the usual parameter names?")
    unused = sorted(map(str, info.get("unexpected_keys", ())))
    head = family.pair_head_of(model)
    head_names = [f"{family.pair_head}.{name}" for name, _ in head.named_parameters()] if head is not None else []
    if family.set_pair_task(model, pair_task):
        unused += [name for name in head_names if name not in newly]  # the checkpoint's head, of another size
        newly.update(head_names)
    newly.difference_update(family.load_pair_head(model, path))
    model.config.architectures = [family.model_class]
    order = {name: i for i, (name, _) in enumerate(model.named_parameters())}
    return model, sorted(newly, key=order.__getitem__), unused


def _newly_initialized(model, missing_keys) -> set[str]:
    """The parameters behind ``from_pretrained``'s missing keys. Tied tensors are reported under every
    alias (cls.predictions.decoder.bias is cls.predictions.bias); each parameter is named once, as
    named_parameters does."""
    canonical = {id(p): name for name, p in model.named_parameters()}
    newly = set()
    for key in missing_keys:
        try:
            newly.add(canonical[id(model.get_parameter(key))])
        except AttributeError:  # a buffer (e.g. position ids): computed, not learnt
            continue
    return newly
