"""BERT's instance recipe, pure: a document's sentence lengths and a generator in, the plan of its
instances out (which sentences make A and B, where B comes from, the pair label), plus truncation,
cross-document packing and the vocabulary's word-start table. Nothing here reads or writes data:
:mod:`pretrain.instance_builder` applies these plans to the tokenized corpus.

Instances are stored unmasked: masks are drawn afresh for every batch by the collator
(:mod:`pretrain.masking`), so ``dupe_factor`` (default 1) only adds other A/B pairings of the same text.

The recipe, per document (a list of sentences, title first):

1. Sentences are added to a chunk until it holds at least ``target`` tokens or the document ends.
   ``target`` is ``max_num_tokens`` (``max_seq_length`` - 3 with NSP, - 2 without); with
   probability ``short_seq_prob`` it is a uniform draw from ``[2, max_num_tokens]`` instead, so
   the model also sees short inputs (fine-tuning tasks are often short).
2. With NSP, the chunk is cut at a random sentence boundary into A and B. Half the time (always
   when the chunk is a single sentence) B is replaced by text from a random *other* document,
   starting at a random sentence and long enough to fill the target (NotNext); the chunk's
   sentences after A are then put back, to start the next chunk, so no text is wasted.
   Otherwise B is the rest of the chunk: the true continuation (IsNext).
   The other pair objectives (``pair_task``) label the chunk's A/B pair differently:
   **sop** (ALBERT's sentence-order prediction): A and B are always the chunk's two consecutive
   parts, swapped half the time (label SWAPPED, else IN_ORDER); a one-sentence chunk takes the next
   sentence too, and a document's lone last sentence makes a one-segment instance without a label
   (ALBERT's code would give it a B from another document, which is NSP, not SOP). **drp**
   (LinkBERT's document relation prediction): B is the rest of the chunk (CONTIGUOUS), text from a
   random other document (RANDOM_DOCUMENT) or text from a document A's document cites
   (LINKED_DOCUMENT), uniformly among those the chunk can have; links come from the corpus's
   ``links`` column (:mod:`tokenization.corpus`), resolved to corpus rows by
   :func:`pretrain.instance_builder.build_link_index`.
   **none**: the whole chunk is one segment (MLM only); with ``packing: cross-document`` sentences
   are instead packed up to the length across document ends, [SEP] between documents, as RoBERTa's
   FULL-SENTENCES (:func:`pack_documents`).
3. While A + B is longer than ``max_num_tokens``, one token is removed from the longer segment
   (B on a tie), at its front or its back with equal probability.
4. The instance is ``[CLS] A [SEP] B [SEP]`` (``[CLS] A [SEP]`` for one segment), unpadded; the pair
   label is in ``next_sentence_label`` whatever the objective (:data:`PAIR_LABELS`).

So an instance never spans two documents, except for a NotNext B, which by design comes from
another one. A one-sentence chunk has no boundary to cut at, so its B is always NotNext, as in
BERT: the NSP balance is one half for every chunk that can be split, and overall a little above
it, by how often a chunk is a lone sentence (typically a document's last one). Wikipedia articles
make that rare; PubMed abstracts, two to four instances each at 128 tokens, do not: about 57-59%
of their instances are NotNext. The summary reports the measured balance.

Where this recipe departs from Google's code, it is on purpose:

* the short target is drawn for every instance, not once per document: ``short_seq_prob`` is then
  what it says, the fraction of instances with a short target (a per-document draw makes every
  instance of one abstract short, and more of them);
* the other document is drawn uniformly from the other documents (Google retries 10 times to
  avoid the current one); a draw without a usable sentence moves on to the next document that has
  one, deterministically (the builder does that, once the other document has been read);
* truncation draws how many of a segment's removed tokens come off its front as one binomial
  count: the same distribution as Google's token-by-token coin flips, in O(1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Mapping, NamedTuple, Sequence, get_args

import numpy as np

from biomed_lm.pretrain.prepared_corpus import PretrainingDataError

# The pair objective an instance's A/B pair is labelled for (column next_sentence_label holds the label):
PairTask = Literal["nsp", "sop", "drp", "none"]
PAIR_TASKS: tuple[str, ...] = get_args(PairTask)
IS_NEXT, NOT_NEXT = 0, 1          # nsp (BERT; transformers' convention: 0 = B continues A)
IN_ORDER, SWAPPED = 0, 1          # sop (ALBERT; transformers' sentence_order_label: 0 = original order)
CONTIGUOUS, RANDOM_DOCUMENT, LINKED_DOCUMENT = 0, 1, 2  # drp (LinkBERT's document relation prediction)
NO_PAIR_LABEL = -100              # ignored by the loss: pair_task none, and a SOP chunk with no order to swap
NO_NSP_LABEL = NO_PAIR_LABEL
#: Each pair task's label names, in label order.
PAIR_LABELS: dict[str, tuple[str, ...]] = {"nsp": ("is_next", "not_next"), "sop": ("in_order", "swapped"),
                                           "drp": ("contiguous", "random", "linked"), "none": ()}
Packing = Literal["document", "cross-document"]


# ----------------------------------------------------------------------------- pair plans

class InstancePlan(NamedTuple):
    """One instance of a document, in sentences (indices into the document's usable sentences).

    A is sentences ``[a_start, a_end)``. A contiguous B is ``[a_end, b_end)``; ``swapped`` (SOP) puts
    it before A. A B from another document (NSP's NotNext, DRP's random and linked) comes from
    ``other_document``, starting at sentence ``floor(other_start * n)`` of its ``n`` sentences and
    taking sentences until it has ``target_b_length`` tokens (:func:`continuation_start`,
    :func:`continuation_end`); a fraction stands in for the index because ``n`` is only known once
    the other document has been read. One-segment instances have ``b_end == a_end`` and
    ``other_document`` -1. ``label`` is the pair label (:data:`PAIR_LABELS`), or NO_PAIR_LABEL.
    """

    a_start: int
    a_end: int
    b_end: int
    other_document: int = -1
    other_start: float = 0.0
    target_b_length: int = 0
    label: int = NO_PAIR_LABEL
    swapped: bool = False

    @property
    def is_random_next(self) -> bool:
        """B comes from another document (random or linked)."""
        return self.other_document >= 0

    @property
    def has_b(self) -> bool:
        return self.is_random_next or self.b_end > self.a_end

    def next_sentence(self) -> int:
        """The first sentence of the document this instance does not use: where the next chunk starts."""
        return self.a_end if self.is_random_next else self.b_end


def draw_target_length(rng: np.random.Generator, max_num_tokens: int, short_seq_prob: float) -> int:
    """``max_num_tokens``, or with probability ``short_seq_prob`` a uniform length in ``[2, max_num_tokens]``
    (shorter inputs like those of fine-tuning tasks, without wasting much of the corpus's text)."""
    if rng.random() < short_seq_prob:
        return int(rng.integers(2, max_num_tokens, endpoint=True))
    return max_num_tokens


def plan_document(sentence_lengths: Sequence[int], rng: np.random.Generator, *, max_num_tokens: int,
                  short_seq_prob: float = 0.1, pair_task: str = "nsp", document_index: int = 0,
                  num_documents: int = 1, linked: Sequence[int] = ()) -> list[InstancePlan]:
    """The instances of one document, given the token count of each of its usable sentences.

    Pure: sentence lengths and a generator in, plans out (steps 1 and 2 of the module docstring).
    Every length must be positive. NSP and DRP draw other documents: they need ``num_documents >= 2``
    and pick among the ``num_documents - 1`` documents other than ``document_index``; DRP's linked
    B comes from one of ``linked`` (the rows of the documents this one cites).
    """
    if pair_task not in PAIR_TASKS:
        raise PretrainingDataError(f"unknown pair_task {pair_task!r}; choose one of {', '.join(PAIR_TASKS)}")
    if pair_task in ("nsp", "drp") and num_documents < 2:
        raise PretrainingDataError(f"pair_task {pair_task} draws other documents and needs at least 2 "
                                   "(or use pair_task none)")
    n = len(sentence_lengths)
    plans: list[InstancePlan] = []
    start = 0
    while start < n:
        target = draw_target_length(rng, max_num_tokens, short_seq_prob)
        end, tokens = start, 0
        while end < n and tokens < target:
            tokens += sentence_lengths[end]
            end += 1
        chunk = _Chunk(sentence_lengths, start, end, target, rng)
        if pair_task == "nsp":
            plan = _nsp_plan(chunk, document_index, num_documents)
        elif pair_task == "sop":
            plan = _sop_plan(chunk)
        elif pair_task == "drp":
            plan = _drp_plan(chunk, document_index, num_documents, linked)
        else:
            plan = InstancePlan(start, end, end)
        plans.append(plan)
        start = plan.next_sentence()
    return plans


@dataclass
class _Chunk:
    """Sentences ``[start, end)`` of a document gathered to a target length, and the generator."""

    lengths: Sequence[int]
    start: int
    end: int
    target: int
    rng: np.random.Generator

    @property
    def size(self) -> int:
        return self.end - self.start

    def split(self) -> int:
        """Where A ends: a random sentence boundary inside the chunk (after its one sentence if it has one)."""
        return self.start + (int(self.rng.integers(1, self.size)) if self.size >= 2 else 1)

    def from_other(self, a_end: int, other: int, label: int) -> InstancePlan:
        """A from this chunk up to ``a_end``, B from document ``other``, filling the target."""
        len_a = int(sum(self.lengths[self.start:a_end]))
        return InstancePlan(self.start, a_end, a_end, other, float(self.rng.random()), self.target - len_a, label)


def _other_document(rng: np.random.Generator, document_index: int, num_documents: int) -> int:
    other = int(rng.integers(num_documents - 1))
    return other + (other >= document_index)  # every document but this one, uniformly


def _nsp_plan(chunk: _Chunk, document_index: int, num_documents: int) -> InstancePlan:
    """BERT: B continues A, or half the time (always for a one-sentence chunk) comes from another document."""
    a_end = chunk.split()
    if chunk.size == 1 or chunk.rng.random() < 0.5:
        return chunk.from_other(a_end, _other_document(chunk.rng, document_index, num_documents), NOT_NEXT)
    return InstancePlan(chunk.start, a_end, chunk.end, label=IS_NEXT)


def _sop_plan(chunk: _Chunk) -> InstancePlan:
    """ALBERT: two consecutive segments of the document, swapped half the time. A one-sentence chunk
    takes the next sentence too; a document's lone last sentence has no order to predict and makes
    a one-segment instance (NO_PAIR_LABEL), where ALBERT's code would draw B from another document."""
    if chunk.size == 1 and chunk.end < len(chunk.lengths):
        chunk.end += 1
    if chunk.size == 1:
        return InstancePlan(chunk.start, chunk.end, chunk.end)
    a_end = chunk.split()
    swapped = bool(chunk.rng.random() < 0.5)
    return InstancePlan(chunk.start, a_end, chunk.end, label=SWAPPED if swapped else IN_ORDER, swapped=swapped)


def _drp_plan(chunk: _Chunk, document_index: int, num_documents: int, linked: Sequence[int]) -> InstancePlan:
    """LinkBERT: B contiguous, from a random document, or from a linked (cited) one, uniformly among
    the relations this chunk can have (no contiguous B for a one-sentence chunk, no linked B for a
    document without links in the corpus)."""
    relations = (([CONTIGUOUS] if chunk.size >= 2 else []) + [RANDOM_DOCUMENT]
                 + ([LINKED_DOCUMENT] if len(linked) else []))
    relation = relations[int(chunk.rng.integers(len(relations)))]
    a_end = chunk.split()
    if relation == CONTIGUOUS:
        return InstancePlan(chunk.start, a_end, chunk.end, label=CONTIGUOUS)
    if relation == LINKED_DOCUMENT:
        return chunk.from_other(a_end, int(linked[int(chunk.rng.integers(len(linked)))]), LINKED_DOCUMENT)
    return chunk.from_other(a_end, _other_document(chunk.rng, document_index, num_documents), RANDOM_DOCUMENT)


# ----------------------------------------------------------------------------- packing

def pack_documents(sentence_lengths: Sequence[Sequence[int]], rng: np.random.Generator, *, max_num_tokens: int,
                   short_seq_prob: float = 0.0) -> list[list[tuple[int, int, int]]]:
    """RoBERTa's full-sentence packing of consecutive documents (pure): each pack a list of runs
    ``(document, first sentence, end sentence)`` in corpus order, consecutive sentences across
    document ends, one [SEP] between the runs of two documents (counted in the length). A pack closes
    before a sentence that would overflow its target (:func:`draw_target_length`); a sentence longer
    than the target alone makes a pack of its own, which the caller truncates."""
    packs: list[list[tuple[int, int, int]]] = []
    current: list[tuple[int, int, int]] = []
    tokens, target = 0, draw_target_length(rng, max_num_tokens, short_seq_prob)
    for document, lengths in enumerate(sentence_lengths):
        for k, length in enumerate(lengths):
            cost = length + (1 if current and current[-1][0] != document else 0)
            if current and tokens + cost > target:
                packs.append(current)
                current, tokens, cost = [], 0, length
                target = draw_target_length(rng, max_num_tokens, short_seq_prob)
            if current and current[-1][0] == document:
                current[-1] = (document, current[-1][1], k + 1)
            else:
                current.append((document, k, k + 1))
            tokens += cost
    if current:
        packs.append(current)
    return packs


# ------------------------------------------------------------------ B from another document

def continuation_start(num_sentences: int, start_fraction: float) -> int:
    """The sentence a NotNext B starts at: ``floor(start_fraction * num_sentences)`` (``start_fraction``
    in [0, 1)), every sentence of the other document equally likely, as in Google's code."""
    return min(int(start_fraction * num_sentences), max(num_sentences - 1, 0))


def continuation_end(sentence_lengths: Sequence[int], start: int, target_length: int) -> int:
    """Where a NotNext B that starts at sentence ``start`` ends: after the first sentence that brings
    it to ``target_length`` tokens and to at least one token, or at the document's end. Lengths
    may be 0 (a sentence with no token), which B simply passes over."""
    tokens = 0
    for end in range(start, len(sentence_lengths)):
        tokens += sentence_lengths[end]
        if tokens >= target_length and tokens > 0:
            return end + 1
    return len(sentence_lengths)


# ----------------------------------------------------------------------------- truncation

def truncation_amounts(len_a: int, len_b: int, max_num_tokens: int) -> tuple[int, int]:
    """How many tokens BERT's truncation removes from A and from B: one at a time from the longer
    segment (B on a tie) until ``len_a + len_b <= max_num_tokens``. Closed form, O(1)."""
    excess = len_a + len_b - max_num_tokens
    if excess <= 0:
        return 0, 0
    gap = abs(len_a - len_b)
    from_longer = min(excess, gap)
    rest = excess - from_longer  # removed alternately once the two are equal, B first
    cut_a = (from_longer if len_a > len_b else 0) + rest // 2
    cut_b = (from_longer if len_b > len_a else 0) + rest - rest // 2
    return cut_a, cut_b


def truncation_cuts(len_a: int, len_b: int, max_num_tokens: int,
                    rng: np.random.Generator) -> tuple[int, int, int, int]:
    """``(front_a, back_a, front_b, back_b)``: tokens to remove from each end of A and B.

    Each removed token leaves the front or the back with probability 1/2, as in Google's code; the
    number that leaves a segment's front is therefore one binomial draw. No draw is made for a
    segment that is not cut."""
    cut_a, cut_b = truncation_amounts(len_a, len_b, max_num_tokens)
    front_a = int(rng.binomial(cut_a, 0.5)) if cut_a else 0
    front_b = int(rng.binomial(cut_b, 0.5)) if cut_b else 0
    return front_a, cut_a - front_a, front_b, cut_b - front_b


# ----------------------------------------------------------------------------- word starts

SENTENCEPIECE_MARKER = "\u2581"  # ▁
#: The pieces ALBERT's create_pretraining_data counts as words of their own in a SentencePiece vocabulary
#: (its _is_start_piece_sp): ASCII punctuation and the euro and pound signs.
_ALBERT_PUNCTUATION = frozenset('!"#$%&()*+,-./:;?@[\\]^_`{|}~€£')
_ASCII_LETTERS = frozenset("abcdefghijklmnopqrstuvwxyz")


def starts_sentencepiece_word(piece: str) -> bool:
    """ALBERT's rule for a SentencePiece piece: a word starts at ``▁``, at a ``<...>`` symbol, at a
    punctuation piece, and at a piece holding any character that is not an ASCII letter or punctuation
    (digits, Greek, accents: "foreign characters" are whole words there). Without it, punctuation stays
    glued to the word before it (``▁( standard / d evi ant ) :`` one word: 1.456 pieces a word on the
    sample against 1.215, the longest 32 pieces against 15), which n-gram masking then rarely fits."""
    return (piece.startswith((SENTENCEPIECE_MARKER, "<")) or piece in _ALBERT_PUNCTUATION
            or not all(c.lower() in _ASCII_LETTERS or c in _ALBERT_PUNCTUATION for c in piece))


def word_start_rule(start_marker: str | None) -> str:
    """The name of the rule :func:`word_start_table` applies beside the markers ("" for WordPiece and
    byte-level BPE); it is part of an instance folder's tokenizer identity."""
    return "albert-start-pieces" if start_marker == SENTENCEPIECE_MARKER else ""


def word_start_table(vocab: Mapping[str, int], special_ids: Sequence[int],
                     continuation_prefix: str | None = "##", start_marker: str | None = None) -> np.ndarray:
    """``int8`` per token id: 1 if the token can start a word, 0 for continuation pieces and for
    ``special_ids``. WordPiece marks continuations (``continuation_prefix``, ``##``); SentencePiece
    (``▁``) and byte-level BPE (``Ġ``) mark word starts instead (``start_marker``): there a token
    without the marker continues a word, except that SentencePiece follows ALBERT's rule
    (:func:`starts_sentencepiece_word`), as byte-level BPE follows fairseq's (the marker alone).
    Pass the structural specials ([CLS], [SEP], [PAD], [MASK]), not [UNK]: an [UNK] stands for a
    whole word of the text, so it starts one."""
    table = np.ones(max(vocab.values(), default=-1) + 1, dtype=np.int8)
    for token, index in vocab.items():
        if start_marker == SENTENCEPIECE_MARKER:
            table[index] = starts_sentencepiece_word(token)
        elif start_marker is not None:
            table[index] = token.startswith(start_marker)
        elif continuation_prefix and token.startswith(continuation_prefix):
            table[index] = 0
    table[np.asarray(list(special_ids), dtype=np.int64)] = 0
    return table


def word_boundary_markers(pipeline: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """``(continuation_prefix, start_marker)`` of a fast tokenizer's JSON: WordPiece's ``##`` (or the
    model's own prefix), SentencePiece's Metaspace replacement (``▁``) or byte-level BPE's ``Ġ``;
    ``(None, None)`` when the vocabulary marks no word boundary (every token then starts a word)."""
    model = pipeline.get("model") or {}
    if model.get("type") == "WordPiece" or model.get("continuing_subword_prefix"):
        return model.get("continuing_subword_prefix") or "##", None
    pre = pipeline.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    for step in steps:
        if step.get("type") == "Metaspace":
            return None, step.get("replacement") or "\u2581"
        if step.get("type") == "ByteLevel":
            return None, "\u0120"
    return None, None
