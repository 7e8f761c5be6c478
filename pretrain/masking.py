"""Dynamic masking for BERT pretraining: pad stored instances into a batch and mask them afresh.

Instances are stored unmasked (``input_ids`` = ``[CLS] A [SEP] B [SEP]``, ``token_type_ids``,
``next_sentence_label``, ``word_starts``); the mask is drawn here, every time a batch is built,
from a ``torch.Generator`` the caller owns. The trainer seeds that generator from (seed, global
step, rank), so a run resumed at step k draws the masks of step k again, and every epoch sees new
ones (RoBERTa's dynamic masking, which Google's static, duplicated masks only approximate).

Rules (each one is checked by ``tests/test_masking.py``):

Candidates
    Only *real* tokens can be selected: not padding, not ``[CLS]``/``[SEP]``/``[PAD]``/``[MASK]``
    and not any other id in the special set (``[UNK]`` by default: predicting it teaches nothing).

Budget (exact count per sequence)
    ``n_mask = floor(p * n_real + 0.5)`` — round half *up*, not Python's banker's rounding, so
    0.15 x 10 = 1.5 gives 2 and 0.15 x 30 = 4.5 gives 5, whatever the binary value of 0.15 (a
    1e-9 nudge makes decimal ties round up; a product of a decimal rate with at most 8 digits
    and a count is never closer than that to a tie without being one). A sequence with at least
    one real token gets at least one mask when ``p > 0``; ``p = 0`` masks nothing.

Token-level masking (``whole_word=False``)
    Exactly ``n_mask`` real tokens per sequence, a uniformly random subset.

Whole-word masking (default)
    A word is a start piece and the ``##`` continuation pieces after it (``word_starts``); a
    continuation piece with no real token before it (a segment cut inside a word) starts a word of
    its own. Words are visited in a uniformly random order and each one is taken whole if it fits
    in what is left of the budget, else skipped — Google's ``create_pretraining_data.py`` greedy
    pass, computed here exactly, vectorized over the batch (:func:`greedy_fill`). So the count
    never exceeds ``n_mask``, equals it whenever every word is a single piece, and falls short
    only when no word left unselected fits in the remainder (e.g. ``n_mask = 1`` and every word
    has two or more pieces). Real text has enough single-piece words for that to be rare: on the
    embedded PubMed sample with bert-base-uncased's vocabulary, every one of 1,600 sequences of
    128 and 512 tokens hit ``n_mask`` exactly (``benchmarks/bench_masking.py`` measures it).

N-gram spans (``max_ngram > 1``, ALBERT's n-gram masking)
    The words of each sequence are cut into consecutive spans of n words, n drawn independently
    for each span with p(n) proportional to 1/n up to ``max_ngram`` (ALBERT: 3, so 6/11, 3/11,
    2/11); a span never crosses a token that cannot be selected ([SEP], padding). Spans then play
    the part of words above: a random order, taken whole if they fit, one replacement draw each.

Cap (``max_predictions``)
    The budget is at most ``max_predictions`` tokens (BERT's and ALBERT's ``max_predictions_per_seq``:
    20 at length 512 in BioALBERT's Table 3).

Replacement (80/10/10)
    Decided per *unit* — a word under whole-word masking (all its pieces get the same treatment),
    a token otherwise — independently, with probabilities
    ``mask_replace_prob`` ([MASK]), ``random_replace_prob`` (random token) and the rest (kept
    unchanged). The split is therefore exact in expectation over the batch, not per sequence:
    a sequence with two masked words cannot be split 80/10/10. Each randomly replaced piece gets
    its own id, drawn uniformly from ``random_token_ids`` (never a special or ``[unused*]`` id).
    Google's ``create_pretraining_data.py`` differs here: it selects whole words but decides
    80/10/10 for each piece on its own, so a word can come out half [MASK], half original. Per
    word is what masking the word means (the model never sees part of a selected word), and the
    share of [MASK] pieces is the same 80% in expectation.

Labels follow Hugging Face's convention: the original id where a token was selected (whatever its
replacement), ``-100`` elsewhere.

Randomness: each call draws a fixed number of values whose count depends only on the batch shape
(word order keys, replacement choices, random ids), so two calls with generators in the same state
give identical batches, and the generator always advances.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from itertools import chain
from typing import Any, Iterable, Mapping, Sequence, get_args

import numpy as np
import torch
from torch import Tensor

from biomed_lm.pretrain.config import DataArguments, MaskSchedule, PretrainConfigError

IGNORE_INDEX = -100
# Added to p * n before flooring, so decimal ties (0.15 x 30 = 4.5) round up despite binary floats.
_TIE_NUDGE = 1e-9
# Words the whole-word greedy pass visits beyond the largest budget before it needs the full order.
_VISIT_SLACK = 16
# bert-base-uncased's reserved [unused0]..[unused993]: in the vocabulary, never in text.
_UNUSED_TOKEN = re.compile(r"\[unused\d+\]")
# Keys of BertForPreTraining.forward a batch may carry; anything else stays out of the dict.
MODEL_INPUT_KEYS = ("input_ids", "attention_mask", "token_type_ids", "labels", "next_sentence_label")


def _check_probability(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], not {value}")


@dataclass
class MaskingConfig:
    """How tokens are chosen for the masked-language-model loss and what replaces them."""

    mlm_probability: float = field(default=0.15, metadata={
        "help": "share of the real (non-special) tokens of each sequence selected for prediction"})
    whole_word: bool = field(default=True, metadata={
        "help": "select whole words (all their ## pieces) instead of single tokens"})
    mask_replace_prob: float = field(default=0.8, metadata={
        "help": "share of the selected units (words or tokens) replaced by [MASK]"})
    random_replace_prob: float = field(default=0.1, metadata={
        "help": "share of the selected units replaced by random tokens; the rest stay unchanged"})
    max_ngram: int = field(default=1, metadata={
        "help": "whole-word masking of n-gram spans of up to this many words, n drawn with probability "
                "proportional to 1/n (ALBERT: 3); 1 masks single words"})
    max_predictions: int | None = field(default=None, metadata={
        "help": "at most this many tokens selected per sequence (max_predictions_per_seq: ALBERT's 20 at "
                "length 512; BERT's about length x rate); None: the rate alone decides"})

    def __post_init__(self) -> None:
        for name in ("mlm_probability", "mask_replace_prob", "random_replace_prob"):
            _check_probability(name, getattr(self, name))
        if self.max_ngram < 1 or (self.max_ngram > 1 and not self.whole_word):
            raise ValueError(f"max_ngram must be at least 1, and above 1 only with whole-word masking, not "
                             f"{self.max_ngram} (whole_word={self.whole_word})")
        if self.max_predictions is not None and self.max_predictions < 1:
            raise ValueError(f"max_predictions must be at least 1 (or None), not {self.max_predictions}")
        if self.mask_replace_prob + self.random_replace_prob > 1.0 + 1e-12:
            raise ValueError(f"mask_replace_prob + random_replace_prob must not exceed 1, not "
                             f"{self.mask_replace_prob} + {self.random_replace_prob}")


# ----------------------------------------------------------------------------- padding

def _as_list(value: Any) -> list:
    if hasattr(value, "tolist"):  # tensors, numpy arrays (datasets in torch/numpy format)
        return value.tolist()
    return value if isinstance(value, list) else list(value)


def _pad_field(rows: list[list], lengths: list[int], real: Tensor, fill: int, dtype: torch.dtype,
               name: str) -> Tensor:
    """One field of every instance, padded: all rows read into one flat array in a single pass
    (``np.fromiter``, several times faster than ``torch.tensor`` on nested lists) and scattered
    under the ``real`` mask — no per-row tensor is built."""
    row_lengths = [len(row) for row in rows]
    if row_lengths != lengths:
        bad = next(i for i, (a, b) in enumerate(zip(row_lengths, lengths)) if a != b)
        raise ValueError(f"instance {bad}: {name} has {row_lengths[bad]} entries but input_ids has {lengths[bad]}")
    flat = np.fromiter(chain.from_iterable(rows), dtype=np.int64, count=sum(lengths))
    out = torch.full(real.shape, fill, dtype=dtype)
    return out.masked_scatter_(real, torch.from_numpy(flat).to(dtype))


def pad_instances(features: Sequence[Mapping[str, Any]], pad_token_id: int,
                  pad_to_multiple_of: int | None = None) -> dict[str, Tensor]:
    """Pad stored instances into batch tensors, to the longest one (rounded up to a multiple of
    ``pad_to_multiple_of``, which keeps tensor-core shapes and limits recompilation).

    Returns ``input_ids`` (long, ``pad_token_id`` after the end), ``attention_mask`` (long, 1 on
    real positions), ``token_type_ids`` (long, 0 on padding; all 0 if the instances have none),
    ``word_starts`` (bool, False on padding) when the instances have it, and
    ``next_sentence_label`` (long, shape ``(batch,)``) when any instance has it (a missing one
    counts as -100, no NSP). Fields may be lists, numpy arrays or tensors.
    """
    if not features:
        raise ValueError("cannot pad an empty list of instances")
    if pad_to_multiple_of is not None and pad_to_multiple_of < 1:
        raise ValueError(f"pad_to_multiple_of must be >= 1, not {pad_to_multiple_of}")
    ids = [_as_list(f["input_ids"]) for f in features]
    lengths = [len(row) for row in ids]
    width = max(lengths)
    if pad_to_multiple_of:
        width = -(-width // pad_to_multiple_of) * pad_to_multiple_of
    real = torch.arange(width) < torch.tensor(lengths)[:, None]
    batch = {
        "input_ids": _pad_field(ids, lengths, real, pad_token_id, torch.long, "input_ids"),
        "attention_mask": real.long(),
    }
    if "token_type_ids" in features[0]:
        rows = [_as_list(f["token_type_ids"]) for f in features]
        batch["token_type_ids"] = _pad_field(rows, lengths, real, 0, torch.long, "token_type_ids")
    else:
        batch["token_type_ids"] = torch.zeros_like(batch["input_ids"])
    if "word_starts" in features[0]:
        rows = [_as_list(f["word_starts"]) for f in features]
        batch["word_starts"] = _pad_field(rows, lengths, real, 0, torch.bool, "word_starts")
    if any("next_sentence_label" in f for f in features):
        batch["next_sentence_label"] = torch.tensor(
            [int(f.get("next_sentence_label", IGNORE_INDEX)) for f in features], dtype=torch.long)
    return batch


# ----------------------------------------------------------------------------- selection

def masking_budget(n_real: Tensor, mlm_probability: float) -> Tensor:
    """Tokens to mask per sequence: ``floor(p * n_real + 0.5)``, at least 1 when ``n_real >= 1``
    and ``p > 0``, at most ``n_real`` (the module docstring says why half rounds up)."""
    _check_probability("mlm_probability", mlm_probability)
    n_real = n_real.long()
    budget = torch.floor(n_real.double() * mlm_probability + (0.5 + _TIE_NUDGE)).long()
    if mlm_probability > 0:
        budget = torch.maximum(budget, (n_real > 0).long())
    return torch.minimum(budget, n_real)


def greedy_fill(lengths: Tensor, budget: Tensor) -> Tensor:
    """Which units to take, visiting each row's units in order and taking a unit whenever it fits
    in what is left of that row's budget (Google's whole-word greedy pass, exactly).

    ``lengths`` is ``(batch, units)`` (0 = no unit there, never taken), ``budget`` is
    ``(batch,)``. Each vectorized pass takes the longest prefix of the still-eligible units (those
    that fit in the remainder) whose running length fits; the first eligible unit that did not fit
    is skipped for good (the remainder only shrinks). A unit the sequential greedy skips is never
    eligible later, so the passes reproduce it; each pass takes at least one unit in every row that
    can still take one, so at most ``1 + skips`` passes run — two or three on real text.
    """
    lengths = lengths.long()
    remaining = budget.long()[:, None]
    taken = torch.zeros(lengths.shape, dtype=torch.bool, device=lengths.device)
    open_ = lengths > 0  # not taken, and may still fit (the remainder only shrinks)
    while True:
        open_ &= lengths <= remaining
        if not bool(open_.any()):
            return taken
        running = torch.where(open_, lengths, 0).cumsum(1)
        take = open_ & (running <= remaining)
        taken |= take
        open_ &= ~take
        remaining = remaining - torch.where(take, lengths, 0).sum(1, keepdim=True)


def _largest(budget: Tensor) -> int:
    return int(budget.max()) if budget.numel() else 0


def _random_keys(candidate: Tensor, last: Tensor, generator: torch.Generator | None) -> Tensor:
    """Independent float64 sort keys, 2.0 (after every real key) where ``last``: sorting them gives
    a uniformly random order. float64 because a tie would bias the order: ~1e-11 chance in a row
    of 512, where float32 keys tie in ~1% of rows."""
    keys = torch.rand(candidate.shape, dtype=torch.float64, generator=generator, device=candidate.device)
    return keys.masked_fill_(last, 2.0)


def _select_tokens(candidate: Tensor, budget: Tensor, generator: torch.Generator | None) -> Tensor:
    """Exactly ``budget`` candidates per row, uniformly: the first ones of a random order, read off
    ``topk`` of the largest budget (a few times faster than a full argsort)."""
    keys = _random_keys(candidate, ~candidate, generator)
    first = torch.arange(_largest(budget), device=candidate.device)
    order = keys.topk(first.numel(), dim=1, largest=False).indices
    return torch.zeros_like(candidate).scatter_(1, order, first < budget[:, None])


def _select_words(word_start: Tensor, candidate: Tensor, budget: Tensor,
                  generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
    """Selected tokens ``(batch, length)`` and each token's word index (``length`` for
    non-candidates), words visited in a random order by :func:`greedy_fill`.

    The greedy pass rarely visits many more words than the budget has tokens, so it first runs on
    the first ``max budget + _VISIT_SLACK`` words of the order only (``topk``, cheaper than a full
    sort); if some row still has room that an unvisited word would fit, it reruns on the full
    order from the same keys. The result is the full-order greedy's either way.
    """
    rows, length = candidate.shape
    word_index = torch.where(candidate, word_start.long().cumsum(1) - 1, length)
    word_lengths = torch.zeros(rows, length + 1, dtype=torch.long, device=candidate.device)
    word_lengths = word_lengths.scatter_add_(1, word_index, torch.ones_like(word_index))[:, :length]
    keys = _random_keys(candidate, word_lengths == 0, generator)
    visit = min(length, _largest(budget) + _VISIT_SLACK)
    order = keys.topk(visit, dim=1, largest=False).indices
    lengths_in_order = word_lengths.gather(1, order)
    taken_in_order = greedy_fill(lengths_in_order, budget)
    if visit < length:
        room = budget - (lengths_in_order * taken_in_order).sum(1)
        unvisited = word_lengths.scatter(1, order, 0)
        if bool(((unvisited > 0) & (unvisited <= room[:, None])).any()):
            order = keys.argsort(dim=1)
            taken_in_order = greedy_fill(word_lengths.gather(1, order), budget)
    taken = torch.zeros(rows, length + 1, dtype=torch.bool, device=candidate.device)
    taken[:, :length].scatter_(1, order, taken_in_order)
    return taken.gather(1, word_index), word_index


def ngram_weights(max_ngram: int) -> Tensor:
    """ALBERT's n-gram length distribution: p(n) proportional to 1/n for n = 1..max_ngram."""
    weights = 1.0 / torch.arange(1, max_ngram + 1, dtype=torch.float64)
    return weights / weights.sum()


def ngram_starts(word_start: Tensor, previous_is_candidate: Tensor, max_ngram: int,
                 generator: torch.Generator | None) -> Tensor:
    """Word starts thinned to n-gram span starts: each row's words are cut into consecutive spans
    whose lengths in words are drawn independently from :func:`ngram_weights`; a span never crosses
    a token that cannot be selected ([SEP], padding). The spans then act as the words of whole-word
    masking: visited in a random order, taken whole if they fit, one 80/10/10 draw each. Draws
    ``rows x length`` values whatever the text, keeping the draw count a function of the shape."""
    rows, length = word_start.shape
    cdf = ngram_weights(max_ngram).cumsum(0).to(word_start.device)
    draws = torch.rand(rows, length, dtype=torch.float64, generator=generator, device=word_start.device)
    span_words = torch.searchsorted(cdf, draws).clamp(max=max_ngram - 1) + 1  # n for a span starting here
    starts = torch.zeros_like(word_start)
    left = torch.zeros(rows, dtype=torch.long, device=word_start.device)  # words still to join the open span
    for j in range(length):  # a scan over positions, vectorized over the batch
        new_span = word_start[:, j] & ((left <= 0) | ~previous_is_candidate[:, j])
        starts[:, j] = new_span
        left = torch.where(new_span, span_words[:, j] - 1, left - word_start[:, j].long())
    return starts


def mask_tokens(input_ids: Tensor, word_starts: Tensor | None, special_mask: Tensor, *,
                config: MaskingConfig, mask_token_id: int, random_token_ids: Tensor,
                generator: torch.Generator | None, mlm_probability: float | None = None
                ) -> tuple[Tensor, Tensor]:
    """Mask a padded batch; returns ``(masked_input_ids, labels)`` and leaves the inputs untouched.

    ``special_mask`` is True where a token may never be selected (special tokens and padding);
    ``word_starts`` is True on the first piece of each word (only read under whole-word masking);
    ``random_token_ids`` is the 1-D tensor of ids a random replacement draws from, uniformly;
    ``mlm_probability`` overrides ``config.mlm_probability`` for this call (masking-rate schedules).
    The rules are in the module docstring.
    """
    if input_ids.dim() != 2 or special_mask.shape != input_ids.shape:
        raise ValueError(f"input_ids and special_mask must be (batch, length) alike, not "
                         f"{tuple(input_ids.shape)} and {tuple(special_mask.shape)}")
    p = config.mlm_probability if mlm_probability is None else float(mlm_probability)
    rows, length = input_ids.shape
    device = input_ids.device
    candidate = ~special_mask.bool()
    budget = masking_budget(candidate.sum(1), p)
    if config.max_predictions is not None:
        budget = budget.clamp(max=config.max_predictions)
    if config.whole_word:
        if word_starts is None or word_starts.shape != input_ids.shape:
            raise ValueError("whole-word masking needs word_starts shaped like input_ids")
        previous_is_candidate = torch.nn.functional.pad(candidate[:, :-1], (1, 0), value=False)
        word_start = candidate & (word_starts.bool() | ~previous_is_candidate)
        if config.max_ngram > 1:
            word_start = ngram_starts(word_start, previous_is_candidate, config.max_ngram, generator)
        selected, word_index = _select_words(word_start, candidate, budget, generator)
        # One draw per word, read by each of its pieces: a word is treated as a whole.
        choice = torch.rand(rows, length + 1, generator=generator, device=device).gather(1, word_index)
    else:
        selected = _select_tokens(candidate, budget, generator)
        choice = torch.rand(rows, length, generator=generator, device=device)
    to_mask = selected & (choice < config.mask_replace_prob)
    masked = input_ids.masked_fill(to_mask, mask_token_id)
    if config.random_replace_prob > 0:
        if random_token_ids.numel() == 0:
            raise ValueError("random_replace_prob > 0 but random_token_ids is empty")
        to_randomize = selected & ~to_mask & (choice < config.mask_replace_prob + config.random_replace_prob)
        draws = torch.randint(random_token_ids.numel(), (rows * length,), generator=generator, device=device)
        # index_select, not pool[draws]: advanced indexing is ~100x slower on small CPU tensors.
        replacements = random_token_ids.to(device).index_select(0, draws).view(rows, length)
        masked = torch.where(to_randomize, replacements, masked)
    labels = input_ids.masked_fill(~selected, IGNORE_INDEX)
    return masked, labels


# ----------------------------------------------------------------------------- collator

class MaskedBatch(dict):
    """A batch for ``BertForPreTraining(**batch)`` (only keys its ``forward`` accepts) that also
    says which masking rate produced it, as the ``mlm_probability`` attribute, so a rate schedule
    can be logged without a key the model would reject."""

    mlm_probability: float

    def __init__(self, tensors: Mapping[str, Tensor], mlm_probability: float) -> None:
        super().__init__(tensors)
        self.mlm_probability = mlm_probability


def random_token_pool(vocab_size: int, exclude: Iterable[int]) -> Tensor:
    """Every id in ``range(vocab_size)`` not in ``exclude``: what a random replacement draws from."""
    pool = torch.arange(vocab_size, dtype=torch.long)
    excluded = torch.tensor(sorted(set(int(i) for i in exclude)), dtype=torch.long)
    pool = pool[~torch.isin(pool, excluded)]
    if pool.numel() == 0:
        raise ValueError("every id is excluded from random replacement")
    return pool


class PretrainingCollator:
    """Pads stored instances and masks them afresh on every call (see the module docstring).

    ``__call__(features, generator=None, mlm_probability=None)`` returns a :class:`MaskedBatch`.
    Pass the trainer's generator (seeded from seed, step and rank) for reproducible masks; without
    one the collator uses its own, seeded from ``seed`` and, inside a DataLoader worker, the worker
    id (so workers never repeat each other's masks).
    """

    def __init__(self, *, pad_token_id: int, cls_token_id: int, sep_token_id: int, mask_token_id: int,
                 vocab_size: int, special_token_ids: Iterable[int] = (),
                 exclude_from_random: Iterable[int] | None = None, config: MaskingConfig | None = None,
                 pad_to_multiple_of: int | None = None, seed: int = 0) -> None:
        """``special_token_ids``: ids never selected besides [PAD]/[CLS]/[SEP]/[MASK].
        ``exclude_from_random``: ids a random replacement never produces; default: the special ids."""
        self.config = config if config is not None else MaskingConfig()
        self.pad_token_id = pad_token_id
        self.mask_token_id = mask_token_id
        self.pad_to_multiple_of = pad_to_multiple_of
        self.seed = seed
        special = {pad_token_id, cls_token_id, sep_token_id, mask_token_id, *map(int, special_token_ids)}
        self.special_ids = torch.tensor(sorted(special), dtype=torch.long)
        excluded = special if exclude_from_random is None else special | {int(i) for i in exclude_from_random}
        self.random_token_ids = random_token_pool(vocab_size, excluded)
        self._generator: torch.Generator | None = None
        self._generator_owner: int | None = None

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, config: MaskingConfig | None = None, *,
                       exclude_from_random: Iterable[int] | None = None,
                       pad_to_multiple_of: int | None = None, seed: int = 0) -> "PretrainingCollator":
        """Ids from a Hugging Face tokenizer. Never selected: all its special tokens
        (``all_special_ids``, [UNK] included). Never a random replacement, by default: those and every
        ``[unusedN]`` entry of its vocabulary (bert layout ids 1..99), which text never contains."""
        special = set(tokenizer.all_special_ids)
        if exclude_from_random is None:
            exclude_from_random = special | {i for token, i in tokenizer.get_vocab().items()
                                             if _UNUSED_TOKEN.fullmatch(token)}
        return cls(pad_token_id=tokenizer.pad_token_id, cls_token_id=tokenizer.cls_token_id,
                   sep_token_id=tokenizer.sep_token_id, mask_token_id=tokenizer.mask_token_id,
                   vocab_size=len(tokenizer), special_token_ids=special, exclude_from_random=exclude_from_random,
                   config=config, pad_to_multiple_of=pad_to_multiple_of, seed=seed)

    def _default_generator(self) -> torch.Generator:
        info = torch.utils.data.get_worker_info()
        owner = -1 if info is None else info.id
        if self._generator is None or self._generator_owner != owner:
            self._generator = torch.Generator().manual_seed((self.seed * 1_000_003 + owner + 1) % (1 << 63))
            self._generator_owner = owner
        return self._generator

    def __call__(self, features: Sequence[Mapping[str, Any]], generator: torch.Generator | None = None,
                 mlm_probability: float | None = None) -> MaskedBatch:
        p = self.config.mlm_probability if mlm_probability is None else float(mlm_probability)
        batch = pad_instances(features, self.pad_token_id, self.pad_to_multiple_of)
        input_ids = batch["input_ids"]
        special_mask = torch.isin(input_ids, self.special_ids) | ~batch["attention_mask"].bool()
        masked, labels = mask_tokens(
            input_ids, batch.get("word_starts"), special_mask, config=self.config,
            mask_token_id=self.mask_token_id, random_token_ids=self.random_token_ids,
            generator=generator if generator is not None else self._default_generator(), mlm_probability=p)
        batch["input_ids"], batch["labels"] = masked, labels
        return MaskedBatch({key: batch[key] for key in MODEL_INPUT_KEYS if key in batch}, p)


# ------------------------------------------------------------------------- masking-rate schedules

MASK_SCHEDULES: tuple[str, ...] = get_args(MaskSchedule)  # ("constant", "stepwise", "linear"), defined once


@dataclass(frozen=True)
class MaskRateSchedule:
    """How the masking rate moves over training (the paper's masking-rate ablation).

    ``constant``: ``start`` throughout (BERT's 15%). ``stepwise``: ``stages`` equal stretches of
    training, the rate rising in equal steps from ``start`` to ``end`` (the paper: 5% → 25% by +5%
    every 20% of training is ``start=0.05, end=0.25, stages=5``). ``linear``: a straight line from
    ``start`` at the first step to ``end`` at the last (e.g. decreasing 30% → 15%).
    """

    kind: MaskSchedule = "constant"
    start: float = 0.15
    end: float = 0.15
    stages: int = 5

    def __post_init__(self) -> None:
        if self.kind not in MASK_SCHEDULES:
            raise ValueError(f"unknown masking schedule {self.kind!r}; choose one of {MASK_SCHEDULES}")
        for name in ("start", "end"):
            _check_probability(f"masking schedule {name}", getattr(self, name))
        if self.stages < 1:
            raise ValueError("a stepwise masking schedule needs at least one stage")

    def rate(self, step: int, total_steps: int) -> float:
        """The masking rate of optimizer step ``step`` (0-based) of ``total_steps``."""
        if self.kind == "constant" or total_steps <= 1:
            return self.start
        fraction = min(max(step / total_steps, 0.0), 1.0)
        if self.kind == "stepwise":
            if self.stages == 1:
                return self.start
            stage = min(int(fraction * self.stages), self.stages - 1)
            return self.start + (self.end - self.start) * stage / (self.stages - 1)
        return self.start + (self.end - self.start) * min(step / (total_steps - 1), 1.0)


def unused_masking_settings(data: DataArguments) -> list[str]:
    """A line for each masking-schedule setting the schedule in use ignores (QA: ``--mask-schedule constant
    --mask-rate-end 0.3`` trained at a constant rate without a word). Said rather than refused: an ablation's
    YAML sets the end rate for its scheduled level and runs its constant level with the same file."""
    lines = []
    if data.mask_schedule == "constant" and data.mask_rate_end is not None \
            and data.mask_rate_end != data.mlm_probability:
        lines.append(f"mask_rate_end {data.mask_rate_end:g} has no effect with mask_schedule constant: every step "
                     f"masks mlm_probability {data.mlm_probability:g} (stepwise or linear end at mask_rate_end)")
    default_stages = next(f.default for f in fields(data) if f.name == "mask_schedule_stages")
    if data.mask_schedule != "stepwise" and data.mask_schedule_stages != default_stages:
        lines.append(f"mask_schedule_stages {data.mask_schedule_stages} has no effect with mask_schedule "
                     f"{data.mask_schedule}: only a stepwise schedule has stages")
    return lines


def mask_rate_schedule(data: DataArguments) -> MaskRateSchedule:
    """The masking-rate schedule the data arguments describe."""
    end = data.mlm_probability if data.mask_rate_end is None else data.mask_rate_end
    try:
        return MaskRateSchedule(kind=data.mask_schedule, start=data.mlm_probability, end=end,
                                stages=data.mask_schedule_stages)
    except ValueError as err:
        raise PretrainConfigError(str(err)) from err
