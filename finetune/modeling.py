"""Fine-tuning models for BLURB: a transformers encoder plus a task-specific head.

Each model is one ``nn.Module`` wrapping any encoder ``AutoModel`` loads (our from-scratch
checkpoints, continual-pretraining ones, external BERT, RoBERTa, ALBERT, ELECTRA, DeBERTa-v2 and
GPT-2 ones) and a head chosen among the modeling choices the PubMedBERT paper compares (section 2.4,
Tables 12-14). How each architecture's encoder is called (token types or not) and where its
sequence representation is read ([CLS], or GPT-2's last real token) is its entry in
:mod:`finetune.model_families`, read once when the model is built:

* :class:`TokenTaggingModel` — NER: one label per word, predicted at the word's first sub-word,
  with a linear layer (BLURB's standard), a BiLSTM, or a linear-chain :class:`CRF`.
* :class:`MultiTokenTaggingModel` — PICO: per word, one independent binary decision per element
  (participants, interventions, outcomes), because a token may belong to several elements and
  BLURB scores each element's token-level F1 separately.
* :class:`SequenceClassificationModel` — relation extraction, sentence similarity, document
  classification and question answering: a relation/sequence representation ([CLS], max-pooled
  entity mentions, or entity-start markers) and a linear layer, trained with cross-entropy
  (single label), binary cross-entropy (multi label, HoC) or mean squared error (BIOSSES).

Forward passes take tokenized tensors and return a small dataclass with ``logits`` and, when
labels are given, ``loss``. Labels use ``-100`` (:data:`IGNORE_INDEX`) for positions that carry no
target (non-first sub-words, special tokens, padding), as ``transformers`` does.

The heads read the encoder's last hidden states only. The encoder's NSP pooler is not used and
:func:`load_encoder` does not build it: BLURB uses the raw [CLS] state, and checkpoints trained
without NSP (or sentence-embedding models) carry an untrained or absent pooler; an unused pooler
would also leave parameters without gradients, which distributed data-parallel training rejects.
"""

from __future__ import annotations

import inspect
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from biomed_lm.finetune.model_families import SequenceToken, checkpoint_family

IGNORE_INDEX = -100

TaggingLayer = Literal["linear", "bilstm", "crf"]
Problem = Literal["single_label", "multi_label", "regression"]
Representation = Literal["cls", "mention_max_pool", "entity_start"]

TAGGING_LAYERS: tuple[str, ...] = get_args(TaggingLayer)
PROBLEMS: tuple[str, ...] = get_args(Problem)
REPRESENTATIONS: tuple[str, ...] = get_args(Representation)


def load_encoder(checkpoint: str | Path, **kwargs) -> nn.Module:
    """``AutoModel.from_pretrained(checkpoint)`` without the NSP pooler where the class has one.

    Keyword arguments go to ``from_pretrained`` (``attn_implementation``, ``dtype``, ...). The
    pooler is dropped only for classes whose constructor accepts ``add_pooling_layer`` (BERT,
    RoBERTa, ...); ELECTRA-style encoders have none and are loaded as they are.
    """
    from transformers import AutoConfig, AutoModel
    from transformers.models.auto.modeling_auto import MODEL_MAPPING

    from transformers.utils import logging as hf_logging

    config = AutoConfig.from_pretrained(checkpoint)
    model_class = MODEL_MAPPING[type(config)]
    if "add_pooling_layer" in inspect.signature(model_class.__init__).parameters:
        kwargs.setdefault("add_pooling_layer", False)
    # transformers prints a load report (the pooler and pretraining heads we leave out are
    # "unexpected") and a progress bar on every load, hundreds of times in a sweep; only weights
    # the encoder lacks matter, and they are reported below.
    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        model, info = AutoModel.from_pretrained(checkpoint, config=config, output_loading_info=True, **kwargs)
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        warnings.warn(f"{checkpoint}: {len(missing)} encoder weights are not in the checkpoint and start at random: "
                      f"{', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}", stacklevel=2)
    return model


# --------------------------------------------------------------------------------------------
# Shared helpers
# --------------------------------------------------------------------------------------------


def check_prefix_mask(mask: torch.Tensor, name: str) -> None:
    """Raise unless every row of ``mask`` is ``True`` on a prefix and ``False`` after it.

    The BiLSTM packs sequences by length and the CRF runs over the first ``n`` words, so both
    need right-padded (left-aligned) masks; a left-padded batch would silently be misread.
    """
    if mask.dim() != 2:
        raise ValueError(f"{name} must be [batch, length], got shape {tuple(mask.shape)}")
    mask = mask.bool()
    if bool((mask[:, 1:] & ~mask[:, :-1]).any()):
        raise ValueError(f"{name} must be right-padded: True on a prefix of each row, then False")


def gather_words(values: torch.Tensor, word_mask: torch.Tensor,
                 padding_value: float | int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Pack the positions selected by ``word_mask`` to the left of a dense tensor.

    ``values`` is ``[batch, tokens, ...]`` and ``word_mask`` ``[batch, tokens]`` (first sub-word of
    each word). Returns ``(dense, dense_mask)``: ``dense`` is ``[batch, words, ...]`` where
    ``words`` is the largest word count in the batch, holding each row's selected values in their
    original order followed by ``padding_value``; ``dense_mask`` is ``[batch, words]``, a prefix
    mask. Differentiable with respect to ``values``.
    """
    word_mask = word_mask.bool()
    counts = word_mask.sum(dim=1)
    num_words = int(counts.max()) if counts.numel() else 0
    batch_index, token_index = word_mask.nonzero(as_tuple=True)
    rank = word_mask.long().cumsum(dim=1)[batch_index, token_index] - 1
    dense = values.new_full((values.shape[0], num_words, *values.shape[2:]), padding_value)
    dense[batch_index, rank] = values[batch_index, token_index]
    dense_mask = torch.arange(num_words, device=values.device)[None, :] < counts[:, None]
    return dense, dense_mask


def _word_mask(word_mask: torch.Tensor | None, labels: torch.Tensor | None) -> torch.Tensor:
    """The first-sub-word positions: given explicitly, or wherever a label is not ignored."""
    if word_mask is not None:
        return word_mask.bool()
    if labels is None:
        raise ValueError("pass word_mask (first sub-word of each word) or labels (-100 elsewhere)")
    if labels.dim() == 3:  # multi-label: [batch, tokens, elements]
        return (labels != IGNORE_INDEX).any(dim=-1)
    return labels != IGNORE_INDEX


def _split_rows(values: torch.Tensor, mask: torch.Tensor) -> list[list]:
    """Per row, the entries of ``values`` on the row's prefix ``mask`` as nested Python lists."""
    lengths = mask.sum(dim=1).tolist()
    rows = values.tolist()
    return [row[:length] for row, length in zip(rows, lengths)]


def sequence_states(hidden: torch.Tensor, attention_mask: torch.Tensor | None,
                    token: SequenceToken = "first") -> torch.Tensor:
    """The ``[batch, H]`` sequence representation of ``hidden`` ``[batch, tokens, H]``: the first
    token's state ([CLS], ``token="first"``), or the last real token's (``"last"``: a left-to-right
    decoder such as GPT-2, whose last token is the only one that has seen the whole input). "Real"
    is read from the right-padded ``attention_mask``, never from the pad id (GPT-2 pads with EOS,
    which also closes every input)."""
    if token == "first":
        return hidden[:, 0]
    if attention_mask is None:
        return hidden[:, -1]
    check_prefix_mask(attention_mask, "attention_mask")
    last = (attention_mask.long().sum(dim=1) - 1).clamp(min=0)
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]


#: The attention implementations that take :func:`padding_bias` as it is.
PREPARED_MASK_ATTENTION = ("sdpa", "eager")


def padding_bias(attention_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The ``[batch, tokens]`` padding mask as the ``[batch, 1, 1, tokens]`` additive mask transformers
    builds for SDPA and eager attention (0 on real tokens, ``dtype``'s lowest value on padding), which
    it takes prepared as it is. Given the 2D mask it would first read it back to see whether every
    token is real (to drop the mask): a wait for the device in every forward."""
    return (1.0 - attention_mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min


class _EncoderModel(nn.Module):
    """Owns the encoder: runs it, and resizes its embeddings when marker tokens are added.

    The encoder's checkpoint family (:func:`finetune.model_families.checkpoint_family` of its
    ``config.model_type``) says whether it is given ``token_type_ids`` (:attr:`token_types`) and
    where the sequence representation is read (:attr:`sequence_token`).
    """

    def __init__(self, encoder: nn.Module):
        super().__init__()
        self.encoder = encoder
        self.checkpoint_family = checkpoint_family(getattr(encoder.config, "model_type", None))
        self.token_types = self.checkpoint_family.takes_token_type_ids(encoder.config)
        self.sequence_token: SequenceToken = self.checkpoint_family.sequence_token
        self.prepared_mask = (self.checkpoint_family.prepared_mask
                              and getattr(encoder.config, "_attn_implementation", None) in PREPARED_MASK_ATTENTION)

    @property
    def hidden_size(self) -> int:
        return int(self.encoder.config.hidden_size)

    def resize_token_embeddings(self, num_tokens: int) -> nn.Embedding:
        """Grow the encoder's vocabulary, e.g. to ``len(tokenizer)`` after entity markers are added."""
        return self.encoder.resize_token_embeddings(num_tokens)

    def _encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None) -> torch.Tensor:
        if self.prepared_mask:
            attention_mask = padding_bias(attention_mask, self.encoder.dtype)
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None and self.token_types:
            inputs["token_type_ids"] = token_type_ids
        return self.encoder(**inputs).last_hidden_state


class _TokenFeaturizer(nn.Module):
    """Dropout on the encoder states, then optionally a BiLSTM (hidden/2 per direction).

    The BiLSTM runs over the real sub-word tokens only (packed by ``attention_mask`` length), so
    its backward direction does not start in the padding and outputs do not depend on how much
    padding the batch has.
    """

    def __init__(self, hidden_size: int, bilstm: bool, dropout: float):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.lstm = (nn.LSTM(hidden_size, hidden_size // 2, batch_first=True, bidirectional=True)
                     if bilstm else None)
        self.output_size = 2 * (hidden_size // 2) if bilstm else hidden_size

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.dropout(hidden)
        if self.lstm is None:
            return hidden
        check_prefix_mask(attention_mask, "attention_mask")
        lengths = attention_mask.bool().sum(dim=1).clamp(min=1).cpu()
        packed = pack_padded_sequence(hidden, lengths, batch_first=True, enforce_sorted=False)
        output, _ = pad_packed_sequence(self.lstm(packed)[0], batch_first=True, total_length=hidden.shape[1])
        return self.dropout(output)


# --------------------------------------------------------------------------------------------
# CRF
# --------------------------------------------------------------------------------------------


class CRF(nn.Module):
    """A linear-chain conditional random field over ``num_tags`` tags.

    The score of a tag path ``y`` for emissions ``E`` (length ``n``) is
    ``start[y_0] + sum_i E[i, y_i] + sum_{i>0} T[y_{i-1}, y_i] + end[y_{n-1}]`` with learned
    ``T = transitions`` (from row tag to column tag) and ``start``/``end`` transitions, and
    ``log p(y | E) = score(y) - log Z`` where ``log Z`` (the log-sum-exp of all path scores) comes
    from the forward algorithm, vectorized over the batch and the tags. :meth:`decode` is Viterbi.

    Masks are ``[batch, length]`` prefix masks (right padding). A sequence with no positions has
    log-likelihood 0 and decodes to ``[]``. Computation is in float32 whatever the emissions'
    dtype, so mixed-precision training does not lose the partition function to rounding.
    """

    def __init__(self, num_tags: int):
        super().__init__()
        if num_tags < 1:
            raise ValueError(f"num_tags must be positive, got {num_tags}")
        self.num_tags = num_tags
        # Small uniform initialization (as in common CRF implementations): near-zero transitions
        # leave the emissions in charge at the start of fine-tuning.
        self.start_transitions = nn.Parameter(torch.empty(num_tags).uniform_(-0.1, 0.1))
        self.end_transitions = nn.Parameter(torch.empty(num_tags).uniform_(-0.1, 0.1))
        self.transitions = nn.Parameter(torch.empty(num_tags, num_tags).uniform_(-0.1, 0.1))

    def _check(self, emissions: torch.Tensor, mask: torch.Tensor, tags: torch.Tensor | None = None) -> None:
        if emissions.dim() != 3 or emissions.shape[2] != self.num_tags:
            raise ValueError(f"emissions must be [batch, length, {self.num_tags}], got {tuple(emissions.shape)}")
        if mask.shape != emissions.shape[:2]:
            raise ValueError(f"mask shape {tuple(mask.shape)} != emissions' {tuple(emissions.shape[:2])}")
        if tags is not None:
            if tags.shape != mask.shape:
                raise ValueError(f"tags shape {tuple(tags.shape)} != mask's {tuple(mask.shape)}")
            valid = tags[mask]
            if bool(((valid < 0) | (valid >= self.num_tags)).any()):
                raise ValueError(f"tags under the mask must lie in [0, {self.num_tags})")
        check_prefix_mask(mask, "mask")

    def forward(self, emissions: torch.Tensor, tags: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Log-likelihood ``log p(tags | emissions)`` of each sequence, shape ``[batch]``.

        ``tags`` outside the mask are ignored (they may be ``-100``).
        """
        mask = mask.bool()
        self._check(emissions, mask, tags)
        emissions = emissions.float()
        return self._path_score(emissions, tags, mask) - self._log_partition(emissions, mask)

    log_likelihood = forward

    def _path_score(self, emissions: torch.Tensor, tags: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        batch, length, _ = emissions.shape
        if length == 0:
            return emissions.new_zeros(batch)
        tags = tags.masked_fill(~mask, 0).long()
        maskf = mask.float()
        emitted = emissions.gather(2, tags.unsqueeze(2)).squeeze(2)  # [batch, length]
        score = (emitted * maskf).sum(dim=1)
        transition = self.transitions.float()[tags[:, :-1], tags[:, 1:]]  # [batch, length - 1]
        score = score + (transition * maskf[:, 1:]).sum(dim=1)
        lengths = mask.sum(dim=1)
        last_tag = tags.gather(1, (lengths - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
        boundary = self.start_transitions.float()[tags[:, 0]] + self.end_transitions.float()[last_tag]
        return score + boundary * (lengths > 0).float()

    def _log_partition(self, emissions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        batch, length, _ = emissions.shape
        if length == 0:
            return emissions.new_zeros(batch)
        transitions = self.transitions.float()
        alpha = self.start_transitions.float() + emissions[:, 0]  # [batch, tags]
        for i in range(1, length):
            # alpha'[b, j] = logsumexp_k(alpha[b, k] + T[k, j]) + E[b, i, j]
            step = torch.logsumexp(alpha.unsqueeze(2) + transitions.unsqueeze(0), dim=1) + emissions[:, i]
            alpha = torch.where(mask[:, i].unsqueeze(1), step, alpha)
        log_z = torch.logsumexp(alpha + self.end_transitions.float(), dim=1)
        return log_z * mask[:, 0].float()

    @torch.no_grad()
    def decode(self, emissions: torch.Tensor, mask: torch.Tensor) -> list[list[int]]:
        """The highest-scoring tag path of each sequence (Viterbi), as lists of the masked length."""
        mask = mask.bool()
        self._check(emissions, mask)
        batch, length, _ = emissions.shape
        if length == 0:
            return [[] for _ in range(batch)]
        emissions = emissions.float()
        transitions = self.transitions.float()
        score = self.start_transitions.float() + emissions[:, 0]
        backpointers = []
        for i in range(1, length):
            candidates = score.unsqueeze(2) + transitions.unsqueeze(0)  # [batch, from, to]
            best, best_from = candidates.max(dim=1)
            backpointers.append(best_from)
            score = torch.where(mask[:, i].unsqueeze(1), best + emissions[:, i], score)
        lengths = mask.sum(dim=1)
        current = (score + self.end_transitions.float()).argmax(dim=1)  # the tag at position n - 1
        path = torch.zeros(batch, length, dtype=torch.long, device=emissions.device)
        for i in range(length - 1, -1, -1):
            if i < length - 1:
                # Positions at or past a sequence's last one keep its best final tag.
                previous = backpointers[i].gather(1, current.unsqueeze(1)).squeeze(1)
                current = torch.where(i < lengths - 1, previous, current)
            path[:, i] = current
        return _split_rows(path, mask)


# --------------------------------------------------------------------------------------------
# Token tagging (NER, PICO)
# --------------------------------------------------------------------------------------------


@dataclass
class TokenTaggingOutput:
    """``logits``: ``[batch, tokens, labels]`` scores at every sub-word (the CRF's emissions for
    ``layer="crf"``); ``loss``: a scalar when labels were given, else ``None``."""

    logits: torch.Tensor
    loss: torch.Tensor | None = None


class TokenTaggingModel(_EncoderModel):
    """Word-level tagging (BIO / BIOUL / IO tags) predicted at each word's first sub-word.

    ``labels`` are ``[batch, tokens]`` with the word's tag at its first sub-word and ``-100`` at
    every other position. ``word_mask`` (first sub-words) defaults to ``labels != -100``; pass it
    explicitly to decode without labels.

    * ``linear``: dropout + Linear on each token; token-level cross-entropy over labelled positions.
    * ``bilstm``: a BiLSTM over the sub-word sequence (hidden/2 per direction), then Linear.
    * ``crf``: Linear emissions, gathered at the first sub-word positions into a dense
      ``[batch, words]`` sequence, and a :class:`CRF` over the words, so transitions connect
      consecutive *words* (a B-tag's next sub-word is no step of the chain). The loss is the
      negative log-likelihood summed over sequences and divided by the number of words: the same
      per-word scale as the linear head's cross-entropy, so one learning rate serves all layers.
    """

    def __init__(self, encoder: nn.Module, num_labels: int, layer: TaggingLayer = "linear", dropout: float = 0.1):
        super().__init__(encoder)
        if layer not in TAGGING_LAYERS:
            raise ValueError(f"layer must be one of {TAGGING_LAYERS}, got {layer!r}")
        if num_labels < 1:
            raise ValueError(f"num_labels must be positive, got {num_labels}")
        self.layer = layer
        self.num_labels = num_labels
        self.featurizer = _TokenFeaturizer(self.hidden_size, bilstm=layer == "bilstm", dropout=dropout)
        self.classifier = nn.Linear(self.featurizer.output_size, num_labels)
        self.crf = CRF(num_labels) if layer == "crf" else None

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                word_mask: torch.Tensor | None = None) -> TokenTaggingOutput:
        hidden = self._encode(input_ids, attention_mask, token_type_ids)
        logits = self.classifier(self.featurizer(hidden, attention_mask))
        loss = None if labels is None else self._loss(logits, labels, word_mask)
        return TokenTaggingOutput(logits=logits, loss=loss)

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor, word_mask: torch.Tensor | None) -> torch.Tensor:
        if self.crf is None:
            return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)
        words = _word_mask(word_mask, labels)
        emissions, mask = gather_words(logits, words)
        tags, _ = gather_words(labels, words, padding_value=IGNORE_INDEX)
        if bool((tags[mask] == IGNORE_INDEX).any()):
            raise ValueError("every position of word_mask needs a label for the CRF (found -100)")
        num_words = mask.sum()
        if int(num_words) == 0:  # keeps the head in the graph for data-parallel gradient reduction
            return logits.sum() * 0.0
        return -self.crf(emissions, tags, mask).sum() / num_words

    def decode_logits(self, logits: torch.Tensor, word_mask: torch.Tensor) -> list[list[int]]:
        """Per sequence, the predicted label of each word (Viterbi for the CRF, argmax otherwise).

        Takes the ``logits`` of a forward pass, so evaluation runs the encoder once for both the
        loss and the predictions.
        """
        emissions, mask = gather_words(logits.detach(), word_mask.bool())
        if self.crf is not None:
            return self.crf.decode(emissions, mask)
        return _split_rows(emissions.argmax(dim=-1), mask)

    @torch.no_grad()
    def decode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
               token_type_ids: torch.Tensor | None = None, word_mask: torch.Tensor | None = None,
               labels: torch.Tensor | None = None) -> list[list[int]]:
        """Per sequence, the predicted label of each word (first sub-word positions).

        Runs the model as it is set: call ``model.eval()`` first to turn dropout off.
        """
        words = _word_mask(word_mask, labels)
        return self.decode_logits(self.forward(input_ids, attention_mask, token_type_ids).logits, words)


class MultiTokenTaggingModel(_EncoderModel):
    """PICO tagging: per word, an independent yes/no for each element (P, I, O).

    BLURB's PICO metric is the token-level F1 of each element, macro-averaged; the elements are
    annotated independently and a token may carry several of them. One sigmoid per element
    (binary cross-entropy) models exactly that, and a token outside every element is the all-zero
    vector. (The EBM-NLP release BLURB distributes holds one tag per token; the one-hot targets it
    gives are a special case. Training a softmax over IO tags with :class:`TokenTaggingModel` is
    the alternative when a CRF over the tags is wanted.)

    ``labels`` are ``[batch, tokens, elements]`` with 0/1 at first sub-words and ``-100`` in every
    entry of the other positions; the loss is the mean BCE over the labelled entries.
    """

    def __init__(self, encoder: nn.Module, num_elements: int, layer: Literal["linear", "bilstm"] = "linear",
                 dropout: float = 0.1):
        super().__init__(encoder)
        if layer not in ("linear", "bilstm"):
            raise ValueError(f"layer must be 'linear' or 'bilstm' for multi-label tagging, got {layer!r}")
        if num_elements < 1:
            raise ValueError(f"num_elements must be positive, got {num_elements}")
        self.layer = layer
        self.num_elements = num_elements
        self.featurizer = _TokenFeaturizer(self.hidden_size, bilstm=layer == "bilstm", dropout=dropout)
        self.classifier = nn.Linear(self.featurizer.output_size, num_elements)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> TokenTaggingOutput:
        hidden = self._encode(input_ids, attention_mask, token_type_ids)
        logits = self.classifier(self.featurizer(hidden, attention_mask))
        loss = None
        if labels is not None:
            if labels.shape != logits.shape:
                raise ValueError(f"labels must be [batch, tokens, {self.num_elements}], got {tuple(labels.shape)}")
            # The mean over the labelled entries, as a masked sum (no entry: 0, with zero gradients):
            # selecting them would make the host wait for the device to count them.
            keep = labels != IGNORE_INDEX
            targets = torch.where(keep, labels, 0).float()
            entries = F.binary_cross_entropy_with_logits(logits.float(), targets, reduction="none")
            loss = (entries * keep).sum() / keep.sum().clamp(min=1)
        return TokenTaggingOutput(logits=logits, loss=loss)

    @staticmethod
    def decode_logits(logits: torch.Tensor, word_mask: torch.Tensor, threshold: float = 0.5) -> list[list[list[int]]]:
        """Per sequence, per word, the 0/1 decision for each element (probability > ``threshold``)."""
        if not 0.0 < threshold < 1.0:
            raise ValueError(f"threshold must be a probability in (0, 1), got {threshold}")
        logit_threshold = torch.logit(torch.tensor(threshold)).item()
        decisions = (logits.detach() > logit_threshold).long()
        dense, mask = gather_words(decisions, word_mask.bool())
        return _split_rows(dense, mask)

    @torch.no_grad()
    def decode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
               token_type_ids: torch.Tensor | None = None, word_mask: torch.Tensor | None = None,
               labels: torch.Tensor | None = None, threshold: float = 0.5) -> list[list[list[int]]]:
        """Per sequence, per word (first sub-word), the 0/1 decision for each element."""
        words = _word_mask(word_mask, labels)
        logits = self.forward(input_ids, attention_mask, token_type_ids).logits
        return self.decode_logits(logits, words, threshold)


# --------------------------------------------------------------------------------------------
# Sequence classification / regression (RE, similarity, document classification, QA)
# --------------------------------------------------------------------------------------------


@dataclass
class SequenceClassificationOutput:
    """``logits``: ``[batch, num_labels]``; ``loss``: a scalar when labels were given, else ``None``."""

    logits: torch.Tensor
    loss: torch.Tensor | None = None


def max_pool_spans(hidden: torch.Tensor, spans: torch.Tensor) -> torch.Tensor:
    """Max over each span's tokens: ``hidden`` ``[batch, tokens, H]``, ``spans`` ``[batch, k, 2]``
    half-open ``[start, end)`` token indices → ``[batch, k, H]``. Spans must be non-empty."""
    if spans.dim() != 3 or spans.shape[2] != 2:
        raise ValueError(f"spans must be [batch, k, 2], got {tuple(spans.shape)}")
    start, end = spans[..., 0], spans[..., 1]
    if bool(((end <= start) | (start < 0) | (end > hidden.shape[1])).any()):
        raise ValueError(f"every span must satisfy 0 <= start < end <= {hidden.shape[1]}")
    positions = torch.arange(hidden.shape[1], device=hidden.device)
    inside = (positions >= start.unsqueeze(-1)) & (positions < end.unsqueeze(-1))  # [batch, k, tokens]
    floor = torch.finfo(hidden.dtype).min
    masked = hidden.unsqueeze(1).masked_fill(~inside.unsqueeze(-1), floor)  # [batch, k, tokens, H]
    return masked.amax(dim=2)


def gather_positions(hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``hidden`` ``[batch, tokens, H]`` at ``positions`` ``[batch, k]`` → ``[batch, k, H]``."""
    if positions.dim() != 2:
        raise ValueError(f"positions must be [batch, k], got {tuple(positions.shape)}")
    if bool(((positions < 0) | (positions >= hidden.shape[1])).any()):
        raise ValueError(f"positions must lie in [0, {hidden.shape[1]})")
    index = positions.long().unsqueeze(-1).expand(-1, -1, hidden.shape[2])
    return hidden.gather(1, index)


class SequenceClassificationModel(_EncoderModel):
    """A sequence (or relation) representation, dropout and a linear layer.

    Representations (the paper's Table 14):

    * ``cls`` — the top-layer [CLS] state (BLURB's standard for every sequence task). It is the raw
      hidden state, not BERT's NSP pooler (tanh dense layer): our checkpoints may be pretrained
      without NSP, external ones may ship no trained pooler, and BLURB fine-tunes on [CLS] itself.
      A decoder has no [CLS]: for GPT-2 it is the state of the last real token (the EOS that closes
      the input; :func:`sequence_states`, :mod:`finetune.model_families`).
    * ``mention_max_pool`` — the two entity mentions' token states, each max-pooled over its span,
      concatenated (``entity_spans`` ``[batch, 2, 2]``: half-open ``[start, end)`` token indices).
    * ``entity_start`` — the states at the two entity-start marker tokens, concatenated
      (``entity_starts`` ``[batch, 2]``).

    Losses (the paper uses cross-entropy for classification and MSE for regression):
    ``single_label`` — cross-entropy, labels ``[batch]`` class ids; ``multi_label`` (HoC) —
    binary cross-entropy with logits, labels ``[batch, num_labels]`` 0/1; ``regression``
    (BIOSSES) — mean squared error, labels ``[batch]`` (with ``num_labels=1``) or
    ``[batch, num_labels]``.
    """

    def __init__(self, encoder: nn.Module, num_labels: int, problem: Problem = "single_label",
                 representation: Representation = "cls", dropout: float = 0.1):
        super().__init__(encoder)
        if problem not in PROBLEMS:
            raise ValueError(f"problem must be one of {PROBLEMS}, got {problem!r}")
        if representation not in REPRESENTATIONS:
            raise ValueError(f"representation must be one of {REPRESENTATIONS}, got {representation!r}")
        if num_labels < 1:
            raise ValueError(f"num_labels must be positive, got {num_labels}")
        self.num_labels = num_labels
        self.problem = problem
        self.representation = representation
        self.dropout = nn.Dropout(dropout)
        width = self.hidden_size * (1 if representation == "cls" else 2)
        self.classifier = nn.Linear(width, num_labels)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                entity_spans: torch.Tensor | None = None,
                entity_starts: torch.Tensor | None = None) -> SequenceClassificationOutput:
        hidden = self._encode(input_ids, attention_mask, token_type_ids)
        features = self.dropout(self.represent(hidden, entity_spans, entity_starts, attention_mask))
        logits = self.classifier(features)
        loss = None if labels is None else self._loss(logits, labels)
        return SequenceClassificationOutput(logits=logits, loss=loss)

    def represent(self, hidden: torch.Tensor, entity_spans: torch.Tensor | None = None,
                  entity_starts: torch.Tensor | None = None,
                  attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The ``[batch, width]`` features the classifier reads, from the encoder's hidden states
        (``attention_mask`` places the last real token for families that read it)."""
        if self.representation == "cls":
            return sequence_states(hidden, attention_mask, self.sequence_token)
        if self.representation == "mention_max_pool":
            if entity_spans is None:
                raise ValueError("representation 'mention_max_pool' needs entity_spans [batch, 2, 2]")
            return max_pool_spans(hidden, entity_spans).flatten(1)
        if entity_starts is None:
            raise ValueError("representation 'entity_start' needs entity_starts [batch, 2]")
        return gather_positions(hidden, entity_starts).flatten(1)

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = logits.float()
        if self.problem == "single_label":
            return F.cross_entropy(logits, labels.view(-1).long(), ignore_index=IGNORE_INDEX)
        if self.problem == "multi_label":
            return F.binary_cross_entropy_with_logits(logits, labels.view_as(logits).float())
        return F.mse_loss(logits, labels.view_as(logits).float())

    def predict(self, logits: torch.Tensor) -> torch.Tensor:
        """Predictions from logits: class ids ``[batch]`` (single label), 0/1 ``[batch, labels]``
        (multi label, probability > 0.5), or scores (regression; ``[batch]`` when one output)."""
        logits = logits.detach()
        if self.problem == "single_label":
            return logits.argmax(dim=-1)
        if self.problem == "multi_label":
            return (logits > 0).long()
        return logits.squeeze(-1) if self.num_labels == 1 else logits
