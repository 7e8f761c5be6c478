"""In-domain vocabularies: the first ingredient of PubMedBERT-style pretraining.

A general-domain vocabulary shatters biomedical terms ("lymphoma" becomes ``l ##ym ##ph ##oma``
in bert-base-uncased), which wastes sequence length and makes the model learn a term from pieces
shared with unrelated words. PubMedBERT's first finding is that a vocabulary learnt from PubMed
itself keeps such terms whole. This module learns one, in the exact format a model family consumes.

Three tokenizer formats (``format``):

``wordpiece`` (default)
    BERT's WordPiece: ``##`` marks word-internal pieces, greedy longest-match-first segmentation,
    BERT's special tokens; learnt by one of the two algorithms below.
``sentencepiece``
    ALBERT's (BioALBERT's "SentencePiece, 30k vocabulary"): a SentencePiece unigram LM
    (``model_type=unigram``) used with its own Viterbi segmentation, ``▁`` marking the piece that
    begins a word. The text is prepared as ``AlbertTokenizer`` prepares it (uncased: NFKD, accents
    stripped, lowercased; cased: case and accents kept), then SentencePiece's NFKC normalization.
    Special tokens as ALBERT's: ``<pad>`` 0, ``<unk>`` 1, ``[CLS]`` 2, ``[SEP]`` 3, ``[MASK]`` 4.
    The directory holds ``tokenizer.json`` (``AlbertTokenizer``) and the model (``spiece.model``).
    SentencePiece splits only on whitespace, so a piece may hold punctuation ("▁(", ")."); its
    seed pieces and EM run on the corpus's whitespace-separated chunks, counted (a chunk longer
    than 100 characters or holding a character outside the ``limit_alphabet`` most frequent is
    left out of training, as for WordPiece). ``min_frequency`` does not apply: the unigram LM
    prunes by likelihood.
``bytelevel-bpe``
    RoBERTa's: ``tokenizers``' byte-level BPE, ``Ġ`` marking a piece that follows a space; every
    byte is in the alphabet, so nothing is ever unknown (``limit_alphabet`` does not apply).
    Special tokens as roberta-base's: ``<s>`` 0, ``<pad>`` 1, ``</s>`` 2, ``<unk>`` 3, ``<mask>`` 4.
    ``add_prefix_space`` gives a text's first word the space the others have (RoBERTa: no). The
    directory holds ``vocab.json``, ``merges.txt`` and ``tokenizer.json`` (``RobertaTokenizer``;
    uncased, BERT's lowercasing and accent stripping in front, it is a ``PreTrainedTokenizerFast``).

``algorithm`` and ``special_token_layout`` say how a WordPiece vocabulary is learnt and laid out;
the other formats have their own, and a non-default value of either with them is refused. Two
algorithms produce WordPiece vocabularies:

``wordpiece`` (default)
    HF ``tokenizers``' ``WordPieceTrainer``: BPE-style merges over word counts, most frequent pair
    first; the vocabulary is the merged units, ``##`` marking word-internal pieces. This is what
    BERT and PubMedBERT ship as "WordPiece".

``unigram``
    A likelihood-based alternative. The PubMedBERT paper describes WordPiece as a BPE variant that
    chooses merges by unigram-LM likelihood; here the likelihood model is trained directly: a
    SentencePiece unigram LM (``model_type=unigram``) learns pieces from the same words, and is
    *exported* to the ``##`` WordPiece format. SentencePiece marks the piece that begins a word
    with ``▁``, WordPiece marks the pieces that continue one with ``##``: segmenting every corpus
    word with the unigram model, the piece that begins a word becomes the bare token (``▁dia`` ->
    ``dia``) and each word-internal piece becomes ``##piece`` (``bet`` -> ``##bet``). A piece the
    model uses right after a lone ``▁`` (its way of sharing one piece between word starts and
    word middles) begins the word, so it is kept bare. The vocabulary takes these tokens, most
    used first. What the export keeps is the *vocabulary*: at use time WordPiece's greedy
    longest-match-first decoding replaces the unigram model's Viterbi segmentation, so a word
    may be cut differently than the unigram model would cut it. The SentencePiece model is saved
    next to the vocabulary (``sentencepiece_unigram.model``) for anyone who wants the Viterbi
    segmentation itself. A unigram LM keeps only pieces it expects to use, so on a small corpus
    the vocabulary can stay below the requested size (the card records both sizes).

Both WordPiece algorithms start from one reading pass that counts words exactly as BERT's normalizer and
pre-tokenizer make them (lowercased with accents stripped when uncased; split on whitespace and
punctuation), so no vocabulary entry can cross a boundary BERT will put between words, and casing
is the one the model will see. Both give every character of the alphabet a bare and a ``##``
entry, as bert-base-uncased does, so WordPiece's greedy match can always fall back to
characters and never emits ``[UNK]`` for a known character. The word table grows with the corpus
(~5.9 n^0.55 distinct words in n bytes of PubMed text, benchmarks/README.md);
``max_distinct_words`` bounds it by dropping the rarest words while counting (word2vec's
ReduceVocab, :class:`_ChunkFolder`), and the card records the bound and what it dropped. Both
are deterministic: the same corpus and options give the same vocabulary, byte for byte. (HF's
``WordPieceTrainer`` alone is not: it numbers ``##`` characters in hash-map order and breaks ties
between equally frequent merges by those numbers, huggingface/tokenizers#1794. Here it is
given the counted words and the whole ``##`` alphabet up front, which fixes every id.)

WordPiece special tokens take BERT's conventional ids, in one of two layouts (``special_token_layout``):

* ``bert`` (default), bert-base-uncased's: ``[PAD]`` = 0, ``[unused0]``..``[unused98]`` = 1..99,
  ``[UNK]`` = 100, ``[CLS]`` = 101, ``[SEP]`` = 102, ``[MASK]`` = 103;
* ``compact``, PubMedBERT's released vocabulary: ``[PAD]`` ``[UNK]`` ``[CLS]`` ``[SEP]`` ``[MASK]`` = 0..4.

In every format ``vocab_size`` counts every entry, special and ``[unused]`` ones included. A small
corpus may not support the requested size; the vocabulary card records both the requested and the
actual size, the format, the casing and the library versions. Every format is deterministic: the
same corpus and options give the same files, byte for byte (the card's time stamps aside);
SentencePiece's EM sums counts per thread, so it always runs with ``SENTENCEPIECE_THREADS``
threads, whatever the machine. The output directory is written by
:mod:`tokenization.tokenizer_io`: it loads with ``transformers.AutoTokenizer.from_pretrained`` and
records its casing, so a cased vocabulary is never used lowercased by accident.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
import re
import time
from abc import ABC, abstractmethod
from collections import Counter
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Collection, Iterable, Iterator, Literal, Mapping, Sequence, get_args

from biomed_lm.errors import TokenizationError
from biomed_lm.run_lock import ARTIFACT_LOCK_FILE, acquire_run_lock
from biomed_lm.finished_output import (changed_files, dataclass_defaults, file_identity, other_output_message,
                                       read_record, setting_change_lines)
from biomed_lm.tokenization.sources import (SET_ASIDE, XML, Problem, corpus_files, detect_format,
                                            is_prepared_corpus, iter_texts)
from biomed_lm.tokenization.tokenizer_io import (ALBERT_SPECIAL_TOKENS, ROBERTA_SPECIAL_TOKENS,
                                                 SENTENCEPIECE_MODEL_FILE, SPECIAL_TOKENS, VOCAB_CARD,
                                                 albert_preprocessor, albert_tokenizer, bert_normalizer, bert_pipeline,
                                                 roberta_tokenizer, save_tokenizer_dir, save_transformers_dir)
from biomed_lm.tokenization.word_counts import (WORD_COUNTS_FILE, CountedCorpus, WordCountsError, counting_key,
                                                differences, load_counts, partial_name, save_counts)
from biomed_lm.tokenization.words import ASCII_WORD

logger = logging.getLogger(__name__)

Format = Literal["wordpiece", "sentencepiece", "bytelevel-bpe"]
Algorithm = Literal["wordpiece", "unigram"]
Layout = Literal["bert", "compact"]
FORMATS: tuple[str, ...] = get_args(Format)
ALGORITHMS: tuple[str, ...] = get_args(Algorithm)
LAYOUTS: tuple[str, ...] = get_args(Layout)
ALBERT_SPECIALS = tuple(ALBERT_SPECIAL_TOKENS.values())    # ids 0..4
ROBERTA_SPECIALS = tuple(ROBERTA_SPECIAL_TOKENS.values())  # ids 0..4
BYTE_ALPHABET_SIZE = 256

PAD, UNK, CLS, SEP, MASK = (SPECIAL_TOKENS[f"{name}_token"] for name in ("pad", "unk", "cls", "sep", "mask"))
CORE_SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)
CONTINUATION_PREFIX = "##"
# BERT's WordPiece turns a longer word into [UNK]; such words teach a vocabulary nothing usable.
MAX_INPUT_CHARS_PER_WORD = 100
# SentencePiece's word-start marker (U+2581).
WORD_START = "\u2581"
# SentencePiece's default (16) would forbid whole-word pieces such as "acetyltransferase" (17) or
# "hypercholesterolemia" (20), which a WordPiece vocabulary learnt from PubMed does keep.
UNIGRAM_MAX_PIECE_LENGTH = 32
UNIGRAM_MODEL_FILE = "sentencepiece_unigram.model"
# SentencePiece's unigram EM splits the sentences among its threads and sums their expected counts,
# so the model depends on the thread count (on the sample corpus 1, 2 and 8 threads give three
# different models); a fixed count makes it the same on every machine. The seed only matters for
# input sampling, which is off; it is fixed anyway.
SENTENCEPIECE_THREADS = 16
SENTENCEPIECE_SEED = 0
# Everything a tokenizer directory written here may hold; --overwrite replaces exactly these.
OUTPUT_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json",
                "added_tokens.json", VOCAB_CARD, UNIGRAM_MODEL_FILE, SENTENCEPIECE_MODEL_FILE, "vocab.json",
                "merges.txt")
_PROGRESS_EVERY = 1000  # documents between progress bar updates

# Characters Python's str.split() splits on although BERT's normalizer deletes them (they are
# control characters, removed before whitespace is looked at), so "ab\x0bcd" is one BERT word.
# tests/test_vocab.py checks this list against the real normalizer over all of Unicode.
_DELETED_NOT_SPLIT = "\x0b\x0c\x1c\x1d\x1e\x1f\x85"
_DELETED_NOT_SPLIT_RE = re.compile(f"[{re.escape(_DELETED_NOT_SPLIT)}]")
_DELETE_TABLE = str.maketrans("", "", _DELETED_NOT_SPLIT)


class VocabBuildError(TokenizationError, ValueError):
    """A vocabulary that cannot be built as asked; the message says why and what to change."""


class EmptyCorpusError(VocabBuildError):
    """The inputs yielded no text to learn from."""


class VocabSizeError(VocabBuildError):
    """The requested size cannot hold the special tokens and the character alphabet."""


class OutputExistsError(VocabBuildError):
    """The output directory already holds files and overwriting was not asked for."""


def format_special_tokens(config: "VocabConfig") -> list[str]:
    """The special tokens of the vocabulary ``config`` describes, in id order."""
    if config.format == "sentencepiece":
        return list(ALBERT_SPECIALS)
    if config.format == "bytelevel-bpe":
        return list(ROBERTA_SPECIALS)
    return special_tokens(config.special_token_layout)


def special_tokens(layout: str) -> list[str]:
    """The special tokens of ``layout`` in id order (token ``i`` of the list gets id ``i``)."""
    if layout == "bert":
        return [PAD, *(f"[unused{i}]" for i in range(99)), UNK, CLS, SEP, MASK]
    if layout == "compact":
        return list(CORE_SPECIAL_TOKENS)
    raise VocabBuildError(f"unknown special_token_layout {layout!r}; choose one of {', '.join(LAYOUTS)}")


@dataclass
class VocabConfig:
    """How to learn the vocabulary (where from and where to are arguments of :func:`build_vocab`)."""

    vocab_size: int = field(default=30522, metadata={
        "help": "total vocabulary size, special and [unused] tokens included (BERT: 30522)", "min": 1})
    cased: bool = field(default=False, metadata={
        "help": "keep case and accents; the default lowercases and strips accents like BERT uncased"})
    format: Format = field(default="wordpiece", metadata={
        "help": "wordpiece: BERT's ## WordPiece; sentencepiece: ALBERT's SentencePiece unigram model with its own "
                "segmentation (<pad> <unk> [CLS] [SEP] [MASK] = 0..4); bytelevel-bpe: RoBERTa's byte-level BPE "
                "(<s> <pad> </s> <unk> <mask> = 0..4)"})
    algorithm: Algorithm = field(default="wordpiece", metadata={
        "help": "format wordpiece only: wordpiece: HF WordPiece trainer; unigram: SentencePiece unigram LM "
                "exported to ## format"})
    special_token_layout: Layout = field(default="bert", metadata={
        "help": "format wordpiece only: bert: [PAD]=0 [unused0..98]=1..99 [UNK]=100 [CLS]=101 [SEP]=102 "
                "[MASK]=103; compact (PubMedBERT): [PAD] [UNK] [CLS] [SEP] [MASK] = 0..4"})
    add_prefix_space: bool = field(default=False, metadata={
        "help": "format bytelevel-bpe only: give a text's first word the leading space (Ġ) the other words have "
                "(RoBERTa: false)"})
    min_frequency: int = field(default=2, metadata={
        "help": "wordpiece and bytelevel-bpe: a pair must occur this often to be merged; unigram: a piece must "
                "be used this often in the unigram model's segmentation of the corpus; sentencepiece: not used",
        "min": 0})
    limit_alphabet: int | None = field(default=1000, metadata={
        "help": "keep at most this many distinct characters, the most frequent (null: all); bytelevel-bpe: "
                "not used (the alphabet is the 256 bytes)", "min": 1})
    max_distinct_words: int | None = field(default=None, metadata={
        "help": "wordpiece and sentencepiece: bound the word-count table to this many distinct words while "
                "counting, dropping the rarest (word2vec's ReduceVocab; null: exact counts, memory grows with "
                "the corpus); bytelevel-bpe: not used (its trainer counts words itself)", "min": 1})

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise VocabBuildError(f"unknown algorithm {self.algorithm!r}; choose one of {', '.join(ALGORITHMS)}")
        self._check_format()
        specials = format_special_tokens(self)
        n_special = len(specials) + (BYTE_ALPHABET_SIZE if self.format == "bytelevel-bpe" else 0)
        if self.vocab_size <= n_special:
            bytes_too = " and the 256 bytes" if self.format == "bytelevel-bpe" else ""
            what = (f"the {self.special_token_layout!r} layout alone takes" if self.format == "wordpiece" else
                    f"the {self.format} special tokens{bytes_too} alone take")
            raise VocabSizeError(f"vocab_size={self.vocab_size} leaves no room for text: {what} {n_special} ids")
        if self.min_frequency < 0:
            raise VocabBuildError(f"min_frequency must be >= 0, not {self.min_frequency}")
        if self.limit_alphabet is not None and self.limit_alphabet < 1:
            raise VocabBuildError(f"limit_alphabet must be >= 1 or null (no limit), not {self.limit_alphabet}")
        if self.max_distinct_words is not None and self.max_distinct_words < 1:
            raise VocabBuildError(f"max_distinct_words must be >= 1 or null (no bound), not {self.max_distinct_words}")

    def _check_format(self) -> None:
        """Refuse options that mean nothing for the chosen format (rather than ignore them)."""
        if self.format not in FORMATS:
            raise VocabBuildError(f"unknown format {self.format!r}; choose one of {', '.join(FORMATS)}")
        if self.format != "wordpiece" and self.algorithm != "wordpiece":
            raise VocabBuildError(
                f"algorithm {self.algorithm!r} chooses how a WordPiece vocabulary is learnt; format {self.format!r} "
                f"has its own ({'a SentencePiece unigram LM' if self.format == 'sentencepiece' else 'byte-level BPE'}"
                "): leave algorithm out")
        if self.format != "wordpiece" and self.special_token_layout != "bert":
            raise VocabBuildError(
                f"special_token_layout {self.special_token_layout!r} lays out BERT's special tokens; format "
                f"{self.format!r} uses {' '.join(format_special_tokens(self))} (ids 0..4): leave it out")
        if self.add_prefix_space and self.format != "bytelevel-bpe":
            raise VocabBuildError(f"add_prefix_space applies to format bytelevel-bpe only, not {self.format!r}")
        if self.max_distinct_words is not None and self.format == "bytelevel-bpe":
            raise VocabBuildError("max_distinct_words bounds the word counts of formats wordpiece and sentencepiece; "
                                  "format 'bytelevel-bpe' has tokenizers' BPE trainer count words itself: leave it out")

    @property
    def lowercase(self) -> bool:
        return not self.cased


@dataclass(frozen=True)
class TrainedVocab:
    """A learnt vocabulary with the BERT tokenizer built on it, and how it was learnt."""

    tokenizer: Any  # tokenizers.Tokenizer: the format's model and pipeline (WordPiece: BERT's)
    config: VocabConfig
    documents: int
    text_bytes: int
    seconds: float
    alphabet_size: int
    unigram_model: bytes | None = None  # the serialized SentencePiece model (algorithm unigram, format sentencepiece)
    distinct_words: int | None = None   # in the word table the trainer learnt from (bytelevel-bpe: not counted here)
    word_pruning: WordPruning | None = None  # what max_distinct_words dropped while counting
    # What limit_alphabet left out: (distinct characters, their occurrences in the counted words); each
    # word holding one becomes [UNK] under this vocabulary (None: not counted, bytelevel-bpe)
    alphabet_dropped: tuple[int, int] | None = None

    @property
    def vocab(self) -> list[str]:
        """Tokens in id order."""
        return vocab_in_id_order(self.tokenizer)

    def card(self) -> dict[str, Any]:
        """Build information for the vocabulary card (the saving function adds the actual size,
        the casing and the special token ids)."""
        import tokenizers
        import transformers

        cfg = self.config
        versions = {"tokenizers": tokenizers.__version__, "transformers": transformers.__version__}
        if self.unigram_model is not None:
            import sentencepiece

            versions["sentencepiece"] = sentencepiece.__version__
        return {
            "format": cfg.format,
            **_FORMAT_CARDS[cfg.format](cfg),
            "vocab_size_requested": cfg.vocab_size,
            "alphabet_size": self.alphabet_size,
            **self._word_counting_card(),
            "documents": self.documents,
            "text_bytes": self.text_bytes,
            "training_seconds": round(self.seconds, 3),
            "library_versions": versions,
        }

    def _word_counting_card(self) -> dict[str, Any]:
        if self.config.format == "bytelevel-bpe":
            return {}
        dropped = self.alphabet_dropped
        return {"max_distinct_words": self.config.max_distinct_words, "distinct_words": self.distinct_words,
                "word_pruning": None if self.word_pruning is None else self.word_pruning.card(),
                "alphabet_dropped": None if dropped is None else {"characters": dropped[0],
                                                                  "occurrences": dropped[1]}}


def _wordpiece_card(cfg: VocabConfig) -> dict[str, Any]:
    segmentation = "WordPiece greedy longest-match-first"
    if cfg.algorithm == "unigram":
        segmentation += (f"; vocabulary learnt by a SentencePiece unigram LM ({UNIGRAM_MODEL_FILE}) "
                         "and exported to ## format, its Viterbi segmentation is not used")
    return {"algorithm": cfg.algorithm, "segmentation": segmentation,
            "special_token_layout": cfg.special_token_layout, "min_frequency": cfg.min_frequency,
            "limit_alphabet": cfg.limit_alphabet}


def _sentencepiece_card(cfg: VocabConfig) -> dict[str, Any]:
    return {"algorithm": "unigram",
            "segmentation": "SentencePiece unigram LM, Viterbi (\u2581 marks a word start); ALBERT's text "
                            + ("preparation (NFKD, accents stripped, lowercased)" if cfg.lowercase else
                               "preparation (case and accents kept)") + ", then the model's NFKC normalization",
            "special_token_layout": "albert", "sentencepiece_model": SENTENCEPIECE_MODEL_FILE,
            "sentencepiece_threads": SENTENCEPIECE_THREADS, "max_piece_length": UNIGRAM_MAX_PIECE_LENGTH,
            "limit_alphabet": cfg.limit_alphabet}


def _bytelevel_bpe_card(cfg: VocabConfig) -> dict[str, Any]:
    return {"algorithm": "bpe",
            "segmentation": "byte-level BPE merges (\u0120 marks a piece after a space)"
                            + ("; BERT's lowercasing and accent stripping first" if cfg.lowercase else ""),
            "special_token_layout": "roberta", "add_prefix_space": cfg.add_prefix_space,
            "min_frequency": cfg.min_frequency}


_FORMAT_CARDS = {"wordpiece": _wordpiece_card, "sentencepiece": _sentencepiece_card,
                 "bytelevel-bpe": _bytelevel_bpe_card}


@dataclass(frozen=True)
class VocabBuildResult:
    """What :func:`build_vocab` wrote, and where; ``already_complete``: a finished build of the same
    command found there and left as it was (``trained`` is then read back from its files and card)."""

    output_dir: Path
    trained: TrainedVocab
    already_complete: bool = False
    skipped: SkippedRecords = field(default_factory=lambda: SkippedRecords())  # left out: the card's record
    skipped_inputs: tuple[str, ...] = ()  # files of an unknown suffix beside readable ones, not read
    text_field: str = "text"

    @property
    def skipped_records(self) -> tuple[str, ...]:
        """The skipped records named (the first of each reason)."""
        return tuple(self.skipped.listed)

    @property
    def has_problems(self) -> bool:
        """Whether anything the inputs hold was left out (a licence beside them is not): prepare_corpus's
        rule for its exit status 1."""
        return bool(self.skipped.total or self.skipped_inputs)

    def summary(self) -> str:
        t, cfg = self.trained, self.trained.config
        size = len(t.vocab)
        shortfall = "" if size == cfg.vocab_size else f" (requested {cfg.vocab_size}; the corpus supports no more)"
        kind = {"wordpiece": f"{cfg.algorithm} vocabulary ({cfg.special_token_layout} layout)",
                "sentencepiece": "SentencePiece unigram vocabulary (ALBERT's special tokens)",
                "bytelevel-bpe": f"byte-level BPE vocabulary (RoBERTa's special tokens, add_prefix_space "
                                 f"{str(cfg.add_prefix_space).lower()})"}[cfg.format]
        pruned = t.word_pruning
        bound = "" if pruned is None else (
            f"\nword table bounded to {pruned.max_distinct_words} distinct words: " + (
                f"{pruned.words} words ({pruned.occurrences} occurrences) seen at most {pruned.threshold} times dropped"
                if pruned.prunes else "nothing dropped"))
        left_out = "" if not t.alphabet_dropped or not t.alphabet_dropped[0] else (
            f"\nlimit_alphabet {cfg.limit_alphabet} left out {t.alphabet_dropped[0]} rarer characters "
            f"({t.alphabet_dropped[1]} occurrences): a word holding one is [UNK] under this vocabulary")
        skipped = "" if not self.skipped.total else f"\n{self.skipped.sentence(t.documents, self.text_field)}"
        not_read = "".join(f"\nnot read: {entry}" for entry in self.skipped_inputs)
        return (f"{size}-token {'cased' if cfg.cased else 'uncased'} {kind}{shortfall} written to {self.output_dir}\n"
                f"learnt from {t.documents} documents ({t.text_bytes / 1e6:.1f} MB of text) in {t.seconds:.1f} s"
                f"{bound}{left_out}{skipped}{not_read}")


def vocab_in_id_order(tokenizer) -> list[str]:
    """The tokens of a ``tokenizers.Tokenizer`` ordered by id; ids must run 0..n-1."""
    by_id = sorted(tokenizer.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1])
    if [i for _, i in by_id] != list(range(len(by_id))):
        raise VocabBuildError("vocabulary ids are not contiguous from 0")
    return [tok for tok, _ in by_id]


def build_wordpiece_tokenizer(vocab: Sequence[str], lowercase: bool):
    """A BERT tokenizer (``tokenizers.Tokenizer``) over ``vocab`` (tokens in id order).

    Both algorithms end here, so their outputs load and behave identically. Only the five core
    special tokens become added tokens; ``[unused*]`` entries stay ordinary vocabulary, as in
    bert-base-uncased.
    """
    from tokenizers import Tokenizer, models

    ids = {tok: i for i, tok in enumerate(vocab)}
    if len(ids) != len(vocab):
        dupes = sorted(t for t, n in Counter(vocab).items() if n > 1)
        raise VocabBuildError(f"duplicate vocabulary entries: {dupes[:10]}")
    missing = [t for t in CORE_SPECIAL_TOKENS if t not in ids]
    if missing:
        raise VocabBuildError(f"vocabulary lacks the special token(s) {missing}")
    tokenizer = Tokenizer(models.WordPiece(ids, unk_token=UNK, continuing_subword_prefix=CONTINUATION_PREFIX,
                                           max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD))
    tokenizer.add_special_tokens(list(CORE_SPECIAL_TOKENS))
    return bert_pipeline(tokenizer, lowercase=lowercase, max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD)


@dataclass
class WordPruning:
    """What a word-count bound dropped while counting (word2vec's ReduceVocab, see :class:`_ChunkFolder`)."""

    max_distinct_words: int
    threshold: int = 0    # the last prune dropped every word then counted at most this often (0: none ran)
    prunes: int = 0       # times the table went over the bound and was pruned
    words: int = 0        # words dropped (a word dropped, seen again and dropped again counts twice)
    occurrences: int = 0  # the occurrences those words had counted when dropped

    def card(self) -> dict[str, int]:
        return {"threshold": self.threshold, "prunes": self.prunes, "words_dropped": self.words,
                "occurrences_dropped": self.occurrences}


class _ChunkFolder(ABC):
    """Counts the whitespace-separated chunks of texts, and folds them into word counts every
    ``fold_every`` distinct chunks (each distinct chunk is split into words once, by ``_fold``), so
    memory follows the number of distinct words rather than of distinct chunks.

    The distinct words grow with the corpus (Heaps' law: ~5.9 n^0.55 words in n bytes of PubMed
    text), so with ``max_distinct_words`` the word table is bounded as word2vec bounds its vocabulary
    (ReduceVocab): whenever a fold leaves more distinct words than the bound, the words counted at
    most ``t`` times are dropped, for the smallest ``t`` above the previous one that brings the
    table within the bound (``t`` only grows, as word2vec's ``min_reduce``), logging what was
    dropped. Between folds the table grows by the new words of at most ``fold_every`` distinct
    chunks, so its peak is the bound plus that window's words. The window is not shrunk to the
    bound: every prune raises ``t``, so more frequent prunes drop more (benchmarks/README.md).
    Only input order decides what is dropped: the same texts in the same order give the same
    counts on any machine. A dropped word seen again starts from zero, so a surviving word's
    count may miss occurrences seen before its last drop (at most ``t`` each time).
    """

    def __init__(self, lowercase: bool, fold_every: int, max_distinct_words: int | None = None) -> None:
        self.lowercase = lowercase
        self._fold_every = fold_every
        self._chunks: Counter[str] = Counter()
        self._words: Counter[str] = Counter()
        self.pruning = None if max_distinct_words is None else WordPruning(max_distinct_words)

    def update(self, text: str) -> None:
        self._chunks.update(self._chunks_of(text))
        if len(self._chunks) >= self._fold_every:
            self._fold_and_bound()

    def counts(self) -> Counter[str]:
        """Word -> number of occurrences, over every text given so far (within the bound, if any)."""
        self._fold_and_bound()
        return self._words

    def _fold_and_bound(self) -> None:
        self._fold()
        if self.pruning is not None and len(self._words) > self.pruning.max_distinct_words:
            self._prune()

    def _prune(self) -> None:
        """Drop the rarest words until the table is within the bound (word2vec's ReduceVocab)."""
        words, record = self._words, self.pruning
        excess = len(words) - record.max_distinct_words
        # The smallest t above the last one with at least ``excess`` words counted <= t: what
        # word2vec's "drop <= t, t += 1" reaches, found in one pass over the count histogram.
        threshold, at_most = record.threshold + 1, 0
        for count, how_many in sorted(Counter(words.values()).items()):
            at_most += how_many
            if at_most >= excess:
                record.threshold = max(threshold, count)
                break
        rare = [word for word, n in words.items() if n <= record.threshold]
        occurrences = 0
        for word in rare:  # in place: a rebuilt dict would hold both tables at once
            occurrences += words.pop(word)
        record.prunes += 1
        record.words += len(rare)
        record.occurrences += occurrences
        logger.info("word table over max_distinct_words=%d: dropped the %d words seen at most %d times "
                    "(%d occurrences); %d distinct words left", record.max_distinct_words, len(rare),
                    record.threshold, occurrences, len(words))

    def _chunks_of(self, text: str) -> list[str]:
        return text.split()

    @abstractmethod
    def _fold(self) -> None:
        """Add the counted chunks' words to the word counts (each counter splits chunks its own way)."""


class BertWordCounter(_ChunkFolder):
    """Counts the words BERT's normalizer and pre-tokenizer make of a text, exactly, but about
    20 times faster than calling them on every document.

    Text is first split where BERT is certain to split (whitespace), and the distinct chunks are
    counted; only each distinct chunk is then normalized and pre-tokenized, and plain printable
    ASCII chunks (nearly all of PubMed) are split in Python, where BERT's rules reduce to
    "runs of letters and digits, and single punctuation characters". Chunk counts are folded
    into word counts every ``fold_every`` distinct chunks, so memory follows the number of
    distinct words rather than of distinct whitespace-separated strings.
    """

    def __init__(self, lowercase: bool, fold_every: int = 1_000_000, max_distinct_words: int | None = None) -> None:
        from tokenizers import pre_tokenizers

        super().__init__(lowercase, fold_every, max_distinct_words)
        self._normalizer = bert_normalizer(lowercase)
        self._pre_tokenizer = pre_tokenizers.BertPreTokenizer()

    def _chunks_of(self, text: str) -> list[str]:
        if _DELETED_NOT_SPLIT_RE.search(text):
            text = text.translate(_DELETE_TABLE)
        return text.split()

    def _fold(self) -> None:
        words = self._words
        for chunk, n in self._chunks.items():
            if chunk.isascii() and chunk.isprintable():
                if self.lowercase:
                    chunk = chunk.lower()
                if chunk.isalnum():
                    words[chunk] += n
                else:
                    for word in ASCII_WORD.findall(chunk):
                        words[word] += n
            else:
                normalized = self._normalizer.normalize_str(chunk)
                for word, _ in self._pre_tokenizer.pre_tokenize_str(normalized):
                    words[word] += n
        self._chunks.clear()


class ChunkCounter(_ChunkFolder):
    """Counts the whitespace-separated chunks of texts as ALBERT prepares them (the words
    SentencePiece learns from: it never puts a piece across whitespace).

    Like :class:`BertWordCounter`, the raw chunks are counted first and each distinct chunk is
    prepared once (``AlbertTokenizer``'s preparation is character by character, so preparing a
    chunk and splitting it again gives the words of the prepared text). For printable ASCII the
    preparation is two replacements and, uncased, ``lower()``; the tests hold this to the
    ``tokenizers`` normalizer."""

    def __init__(self, lowercase: bool, fold_every: int = 1_000_000, max_distinct_words: int | None = None) -> None:
        super().__init__(lowercase, fold_every, max_distinct_words)
        self._normalizer = albert_preprocessor(lowercase)

    def prepare(self, chunk: str) -> str:
        """ALBERT's preparation of one chunk."""
        if chunk.isascii() and chunk.isprintable():
            chunk = chunk.replace("``", '"').replace("''", '"')
            return chunk.lower() if self.lowercase else chunk
        return self._normalizer.normalize_str(chunk)

    def _fold(self) -> None:
        words = self._words
        for chunk, n in self._chunks.items():
            for word in self.prepare(chunk).split():
                words[word] += n
        self._chunks.clear()


def alphabet_of(word_counts: Mapping[str, int], limit: int | None,
                stats: "_ReadStats | None" = None) -> set[str]:
    """The characters of the words, keeping the ``limit`` most frequent (as WordPieceTrainer's
    ``limit_alphabet`` does); ``None`` keeps them all. ``stats`` gets what was left out."""
    chars: Counter[str] = Counter()
    for word, n in word_counts.items():
        for ch in word:
            chars[ch] += n
    ranked = sorted(chars.items(), key=lambda kv: (-kv[1], kv[0]))
    kept = ranked if limit is None else ranked[:limit]
    if stats is not None:
        dropped = ranked[len(kept):]
        stats.alphabet_dropped = (len(dropped), sum(n for _, n in dropped))
    return {ch for ch, _ in kept}


def trainable_words(word_counts: Mapping[str, int], alphabet: Collection[str]) -> dict[str, int]:
    """The words a vocabulary can learn from: WordPiece turns a word longer than
    ``MAX_INPUT_CHARS_PER_WORD`` or holding a character outside the alphabet into ``[UNK]``
    whatever the vocabulary, and a word holding SentencePiece's marker ``▁`` would be misread by
    the unigram trainer. (Format sentencepiece leaves out the same words: noise such as long
    sequences or URLs, and rare characters, which then become ``<unk>``.)"""
    allowed = set(alphabet)
    return {w: n for w, n in word_counts.items()
            if len(w) <= MAX_INPUT_CHARS_PER_WORD and WORD_START not in w and allowed.issuperset(w)}


def check_room(vocab_size: int, specials: Sequence[str], alphabet: Collection[str]) -> None:
    """Raise :class:`VocabSizeError` unless ``vocab_size`` holds the special tokens and every
    alphabet character bare and as ``##c``."""
    needed = len(specials) + 2 * len(alphabet)
    if needed > vocab_size:
        raise VocabSizeError(
            f"vocab_size={vocab_size} is too small: the {len(specials)} special tokens and the "
            f"{len(alphabet)}-character alphabet (each character bare and as ##c) already take {needed} "
            f"entries; raise vocab_size or lower limit_alphabet")


def wordpiece_merges(word_counts: Mapping[str, int], alphabet: Collection[str], specials: Sequence[str],
                     config: VocabConfig, *, progress: bool = False) -> list[str]:
    """Tokens HF's ``WordPieceTrainer`` learns from the counted words, in merge order (the special
    tokens and the alphabet's single characters excluded).

    The trainer counts words itself, so each word is handed to it as often as it occurs; the text
    is already BERT-normalized and split, so its pipeline only splits on whitespace. Every ``##c``
    is passed in before training (as a reserved token) and the alphabet as ``initial_alphabet``:
    with every character id fixed up front, ties between equally frequent merges break the same
    way on every run.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from tqdm.auto import tqdm

    chars = sorted(alphabet)
    reserved = [*specials, *(CONTINUATION_PREFIX + ch for ch in chars)]
    tokenizer = Tokenizer(models.WordPiece(unk_token=UNK, continuing_subword_prefix=CONTINUATION_PREFIX,
                                           max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.WordPieceTrainer(
        vocab_size=config.vocab_size, min_frequency=config.min_frequency, special_tokens=reserved,
        initial_alphabet=chars, limit_alphabet=len(chars), continuing_subword_prefix=CONTINUATION_PREFIX,
        show_progress=False)
    logger.info("learning WordPiece merges from %d distinct words", len(word_counts))
    # The trainer reads every occurrence again (it counts words itself): on full PubMed the longest part
    # after the reading, so it has a bar of its own, in words handed over.
    with tqdm(total=sum(word_counts.values()), desc="WordPiece trainer", unit=" words", unit_scale=True,
              disable=not progress) as bar:
        tokenizer.train_from_iterator(_counted_out(_repeated_words(word_counts), bar), trainer=trainer)
    learnt = vocab_in_id_order(tokenizer)
    fixed = set(reserved) | set(chars)
    if set(learnt[:len(fixed)]) != fixed:
        raise VocabBuildError("the WordPiece trainer did not put the reserved tokens and the alphabet first")
    return learnt[len(fixed):]


def spm_pieces_to_wordpieces(pieces: Sequence[str]) -> list[str]:
    """One word's SentencePiece segmentation in WordPiece form: the piece that begins the word
    (``▁`` prefix) becomes the bare token, word-internal pieces get ``##``.

    ``["▁diabet", "es"]`` -> ``["diabet", "##es"]``. The unigram model may also cut off the
    word-start marker alone (``["▁", "were"]``), sharing one piece between word starts and word
    middles; the piece after it then begins the word: ``["were"]``.
    """
    if not pieces:
        return []
    first, rest = pieces[0], list(pieces[1:])
    if not first.startswith(WORD_START):
        raise VocabBuildError(f"not a word's segmentation (no {WORD_START!r} word start): {list(pieces)}")
    first = first[len(WORD_START):]
    if not first:
        if not rest:
            return []
        first, rest = rest[0], rest[1:]
    return [first, *(CONTINUATION_PREFIX + piece for piece in rest)]


def unigram_wordpiece_usage(model_proto: bytes, word_counts: Mapping[str, int], batch: int = 100_000) -> Counter[str]:
    """How often each WordPiece-form token occurs when a SentencePiece unigram model segments the
    words (Viterbi), weighted by the words' counts: the tokens the likelihood model actually uses,
    in the position (word start or word middle) it uses them in."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=model_proto)
    usage: Counter[str] = Counter()
    words = list(word_counts)
    for start in range(0, len(words), batch):
        chunk = words[start:start + batch]
        for word, pieces in zip(chunk, sp.encode(chunk, out_type=str, num_threads=_cpu_count())):
            n = word_counts[word]
            for token in spm_pieces_to_wordpieces(pieces):
                usage[token] += n
    return usage


def assemble_vocab(candidates: Mapping[str, float], alphabet: Collection[str], specials: Sequence[str],
                   vocab_size: int) -> list[str]:
    """A WordPiece vocabulary in id order: ``specials``, every alphabet character bare and as
    ``##c``, then the candidates with the highest value (ties by token) until ``vocab_size``
    entries. Candidates using a character outside the alphabet are left out (WordPiece could
    never produce them)."""
    check_room(vocab_size, specials, alphabet)
    chars = sorted(alphabet)
    vocab = [*specials, *chars, *(CONTINUATION_PREFIX + ch for ch in chars)]
    seen = set(vocab)
    allowed = set(chars)
    for token, _ in sorted(candidates.items(), key=lambda kv: (-kv[1], kv[0])):
        if len(vocab) >= vocab_size:
            break
        body = token[len(CONTINUATION_PREFIX):] if token.startswith(CONTINUATION_PREFIX) else token
        if token in seen or not body or not allowed.issuperset(body):
            continue
        vocab.append(token)
        seen.add(token)
    return vocab


@dataclass(frozen=True)
class Counting:
    """Where a build's word counts come from: ``reuse`` (counted before; ``texts`` are then not read), or a
    reading pass whose counts go to ``on_counted`` before training (to be saved: :mod:`.word_counts`)."""

    reuse: CountedCorpus | None = None
    on_counted: Callable[[CountedCorpus], None] | None = None


def train_vocab(texts: Iterable[str], config: VocabConfig, *, progress: bool = False,
                counting: Counting = Counting()) -> TrainedVocab:
    """Learn a vocabulary from document texts and build its tokenizer in ``config.format``
    (nothing is written but what ``counting.on_counted`` writes)."""
    start = time.perf_counter()
    stats = _ReadStats()
    tokenizer, alphabet_size, model = _TRAINERS[config.format](_metered(texts, stats, progress), stats, config,
                                                               progress=progress, counting=counting)
    return TrainedVocab(tokenizer=tokenizer, config=config, documents=stats.documents, text_bytes=stats.text_bytes,
                        seconds=time.perf_counter() - start, alphabet_size=alphabet_size, unigram_model=model,
                        distinct_words=stats.distinct_words, word_pruning=stats.word_pruning,
                        alphabet_dropped=stats.alphabet_dropped)


def _counted(counter, texts: Iterable[str], stats: "_ReadStats", counting: Counting) -> Counter[str]:
    """Feed ``texts`` to a word counter (or take ``counting.reuse``, reading nothing); its counts, or
    :class:`EmptyCorpusError` if there is nothing."""
    if counting.reuse is not None:
        word_counts = counting.reuse.counts
        stats.documents, stats.text_bytes = counting.reuse.documents, counting.reuse.text_bytes
        pruning = counting.reuse.word_pruning
        stats.word_pruning = None if pruning is None else WordPruning(**pruning)
    else:
        for text in texts:
            counter.update(text)
        word_counts = counter.counts()
        stats.word_pruning = counter.pruning
        if counting.on_counted is not None and word_counts:
            counting.on_counted(CountedCorpus(counts=word_counts, documents=stats.documents,
                                              text_bytes=stats.text_bytes, skipped_records=(),
                                              word_pruning=None if counter.pruning is None
                                              else asdict(counter.pruning)))
    stats.distinct_words = len(word_counts)
    if stats.documents == 0:
        raise EmptyCorpusError("no documents to learn from")
    if not word_counts:
        raise EmptyCorpusError(f"the {stats.documents} documents read contain no words")
    return word_counts


def _train_wordpiece(texts: Iterable[str], stats: "_ReadStats", config: VocabConfig, *,
                     progress: bool = False, counting: Counting) -> tuple[Any, int, bytes | None]:
    """Format wordpiece: count BERT's words, learn (algorithm), assemble in the layout's id order."""
    word_counts = _counted(BertWordCounter(config.lowercase, max_distinct_words=config.max_distinct_words), texts,
                           stats, counting)
    specials = special_tokens(config.special_token_layout)
    alphabet = alphabet_of(word_counts, config.limit_alphabet, stats)
    check_room(config.vocab_size, specials, alphabet)  # before the long part
    candidates, unigram_model = _learn(trainable_words(word_counts, alphabet), alphabet, specials, config,
                                       progress=progress)
    vocab = assemble_vocab(candidates, alphabet, specials, config.vocab_size)
    return build_wordpiece_tokenizer(vocab, lowercase=config.lowercase), len(alphabet), unigram_model


def _train_sentencepiece(texts: Iterable[str], stats: "_ReadStats", config: VocabConfig, *,
                         progress: bool = False, counting: Counting) -> tuple[Any, int, bytes]:
    """Format sentencepiece: count the whitespace-separated chunks of the text as ALBERT prepares
    it, train a SentencePiece unigram model on them, and wrap it in ALBERT's tokenizer (SentencePiece
    trains on the distinct chunks, without a bar: ``progress`` covers the reading)."""
    chunks = _counted(ChunkCounter(config.lowercase, max_distinct_words=config.max_distinct_words), texts, stats,
                      counting)
    alphabet = alphabet_of(chunks, config.limit_alphabet, stats)
    needed = len(ALBERT_SPECIALS) + len(alphabet)
    if needed > config.vocab_size:
        raise VocabSizeError(f"vocab_size={config.vocab_size} is too small: the {len(ALBERT_SPECIALS)} special tokens "
                             f"and the {len(alphabet)}-character alphabet already take {needed} pieces; raise "
                             "vocab_size or lower limit_alphabet")
    words = trainable_words(chunks, alphabet)
    if not words:
        raise EmptyCorpusError(f"none of the {len(chunks)} distinct words read is short enough to learn from "
                               f"(at most {MAX_INPUT_CHARS_PER_WORD} characters)")
    model = train_sentencepiece_model(words, config.vocab_size)
    return albert_tokenizer(model, lowercase=config.lowercase).backend_tokenizer, len(alphabet), model


def _train_bytelevel_bpe(texts: Iterable[str], stats: "_ReadStats", config: VocabConfig, *,
                         progress: bool = False, counting: Counting) -> tuple[Any, int, None]:
    """Format bytelevel-bpe: ``tokenizers``' BPE trainer on the documents, byte-level pre-tokenized,
    the 256 bytes as its alphabet and RoBERTa's special tokens first (its trainer counts the words
    itself: ``counting`` does not apply)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    if config.lowercase:  # BERT uncased's lowercasing and accent stripping, nothing else
        tokenizer.normalizer = normalizers.BertNormalizer(clean_text=False, handle_chinese_chars=False,
                                                          strip_accents=True, lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=config.add_prefix_space)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=config.vocab_size, min_frequency=config.min_frequency,
                                  special_tokens=list(ROBERTA_SPECIALS), show_progress=progress,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer=trainer)
    if stats.documents == 0:
        raise EmptyCorpusError("no documents to learn from")
    if not stats.has_text:
        raise EmptyCorpusError(f"the {stats.documents} documents read contain no words")
    fast = roberta_tokenizer(tokenizer, lowercase=config.lowercase, add_prefix_space=config.add_prefix_space)
    return fast.backend_tokenizer, BYTE_ALPHABET_SIZE, None


_TRAINERS = {"wordpiece": _train_wordpiece, "sentencepiece": _train_sentencepiece,
             "bytelevel-bpe": _train_bytelevel_bpe}


def _learn(words: Mapping[str, int], alphabet: Collection[str], specials: Sequence[str],
           config: VocabConfig, *, progress: bool = False) -> tuple[dict[str, float], bytes | None]:
    """Candidate tokens beyond the alphabet, each with a rank value (higher is kept first), and
    the unigram model when there is one."""
    budget = config.vocab_size - len(specials) - 2 * len(alphabet)
    if not words or budget == 0:
        return {}, None
    if config.algorithm == "wordpiece":
        merged = wordpiece_merges(words, alphabet, specials, config, progress=progress)
        return {token: -rank for rank, token in enumerate(merged)}, None  # in merge order
    # Single-character pieces map onto the alphabet entries already reserved, and a piece may be
    # used both at word starts and in word middles: ask for enough pieces to fill the budget;
    # the least used are cut when it overflows.
    model = train_unigram_model(words, budget + 2 * len(alphabet) + 2)
    usage = unigram_wordpiece_usage(model, words)
    return {token: n for token, n in usage.items() if n >= config.min_frequency}, model


def build_vocab(inputs: Sequence[str | os.PathLike], output_dir: str | os.PathLike, config: VocabConfig | None = None,
                *, text_field: str = "text", overwrite: bool = False, progress: bool = False,
                word_counts_from: str | os.PathLike | None = None) -> VocabBuildResult:
    """Learn a vocabulary from prepared corpora or raw text/JSONL/PubMed XML files and write it
    as a tokenizer directory (``AutoTokenizer``-loadable, casing recorded, vocabulary card).

    Everything that can be checked before the long read is checked first: the inputs exist, no
    other build holds the output directory (:mod:`biomed_lm.run_lock`), and it is empty but for
    that lock (or ``overwrite`` is set, which replaces the tokenizer files listed in
    ``OUTPUT_FILES`` and leaves any other file alone). A directory that holds a finished vocabulary
    is left as it is when this call built it (:func:`finished_vocab`: the result says
    ``already_complete``), and refused otherwise, naming what differs.

    The word counts are saved in ``output_dir`` before training and reused by a rerun; ``word_counts_from``
    (another build's directory or counts file, of the same inputs) skips the reading (:mod:`.word_counts`).
    """
    config = config or VocabConfig()
    names = [str(p) for p in inputs]
    if not names:
        raise EmptyCorpusError("no inputs given")
    skipped = _check_inputs(names)
    out = Path(output_dir)
    _check_not_a_file(out)  # refused before the lock would make the folder
    with acquire_run_lock(out, ARTIFACT_LOCK_FILE):  # a second build into out is refused until this one ends
        if not overwrite and (out / VOCAB_CARD).is_file():  # read under the lock: another build may have just ended
            return finished_vocab(names, out, config, text_field)
        _check_output_dir(out, overwrite)
        identity = inputs_identity(names)  # before reading: a file changed meanwhile differs from it next time
        unreadable = SkippedRecords()  # a damaged line costs that line, named, as prepare_corpus does
        counting = _counting(out, config, text_field, identity, word_counts_from, unreadable)
        try:
            texts = texts_naming_empty_files(names, text_field, lambda p: _skip(p, unreadable))
            trained = train_vocab(texts, config, progress=progress, counting=counting)
        except EmptyCorpusError as err:
            cause = unreadable.cause(text_field)
            raise EmptyCorpusError(f"no text to learn from in {', '.join(names)} "
                                   f"(text field {text_field!r}): {err}{f'; {cause}' if cause else ''}") from err
        for name in OUTPUT_FILES:
            (out / name).unlink(missing_ok=True)
        card = {**trained.card(), "config": asdict(config), "inputs": names, "input_files": identity,
                "skipped_inputs": [p.describe() for p in skipped], **unreadable.card(),
                "text_field": text_field, "word_counts": _counts_card(counting, word_counts_from),
                "created_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
        save_trained(trained, out, card)
    return VocabBuildResult(output_dir=out, trained=trained, skipped=unreadable, text_field=text_field,
                            skipped_inputs=_not_read(skipped))


#: The skipped records logged one by one; the rest are counted at the end.
LOGGED_SKIPS = 20
#: The skipped records the card names for each reason; the rest are counted (QA: a card listing each of 20k
#: records reached megabytes, and would reach gigabytes on a 36M-record corpus with the wrong text field).
LISTED_SKIPS_PER_REASON = 20
_NOT_LISTED = re.compile(r"\.\.\. and (\d+) more (\S+) record\(s\), not listed\Z")
_REASON = re.compile(r"^.*?: ([a-z][a-z0-9_]*): ")
_FIELDS_PRESENT = re.compile(r"fields present: ([^)]*)\)")


@dataclass
class SkippedRecords:
    """What a build could not read and left out: how many of each reason (a Problem's ``reason``), and the
    first :data:`LISTED_SKIPS_PER_REASON` of each, described (file, line, reason, message)."""

    counts: dict[str, int] = field(default_factory=dict)
    listed: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def add(self, reason: str, description: str, times: int = 1) -> None:
        """Count ``times`` records of ``reason``; ``description`` (one of them) is listed while there is room."""
        if self.counts.get(reason, 0) < LISTED_SKIPS_PER_REASON and description:
            self.listed.append(description)
        self.counts[reason] = self.counts.get(reason, 0) + times

    def recorded(self) -> tuple[str, ...]:
        """The listed records, then a line for each reason's records not listed (what the word counts keep)."""
        shown = Counter(_reason_of(entry) for entry in self.listed)
        rest = [f"... and {n - shown[reason]} more {reason} record(s), not listed"
                for reason, n in self.counts.items() if n > shown[reason]]
        return (*self.listed, *rest)

    def extend_recorded(self, entries: Iterable[str]) -> None:
        """Add what :meth:`recorded` gave (or an older build's full list of descriptions)."""
        for entry in entries:
            more = _NOT_LISTED.match(entry)
            if more:
                self.counts[more.group(2)] = self.counts.get(more.group(2), 0) + int(more.group(1))
            else:
                self.add(_reason_of(entry), entry)

    def card(self) -> dict[str, Any]:
        """The vocabulary card's record: the list (bounded), the counts, and whether the list is all of them."""
        return {"skipped_records": list(self.listed), "skipped_record_counts": dict(self.counts),
                "skipped_records_truncated": self.total > len(self.listed),
                "skipped_records_listed": f"the first {LISTED_SKIPS_PER_REASON} of each reason"}

    @classmethod
    def from_card(cls, card: Mapping[str, Any]) -> SkippedRecords:
        """A card's record (one that predates the counts: its full list)."""
        skipped = cls()
        skipped.extend_recorded(card.get("skipped_records", ()))
        if isinstance(card.get("skipped_record_counts"), dict):
            skipped.counts = dict(card["skipped_record_counts"])
        return skipped

    def sentence(self, documents: int, text_field: str) -> str:
        """How many records were left out and why, and the likely cause (for the summary)."""
        by_reason = ", ".join(f"{reason} {n:,}" for reason, n in sorted(self.counts.items(), key=lambda kv: -kv[1]))
        cause = self.cause(text_field)
        return (f"{self.total:,} record(s) or file(s) left out beside the {documents:,} documents read ({by_reason}; "
                f"{VOCAB_CARD}'s skipped_records names the first {LISTED_SKIPS_PER_REASON} of each), the first: "
                f"{self.listed[0] if self.listed else 'not listed'}" + (f"\nlikely cause: {cause}" if cause else ""))

    def cause(self, text_field: str) -> str | None:
        """What most likely made the most frequent reason's records unreadable, and what to do, or None."""
        if not self.counts:
            return None
        reason = max(self.counts, key=self.counts.get)
        n = self.counts[reason]
        if reason == "missing_field":
            fields = sorted({name.strip() for entry in self.listed for match in _FIELDS_PRESENT.findall(entry)
                             for name in match.split(",") if name.strip() and name.strip() != "none"})
            return (f"{n:,} JSON record(s) have no field {text_field!r}: if their text is in another field, pass "
                    f"--text-field naming it (their fields: {', '.join(fields) or 'none'})")
        if reason == "wrong_type":
            return f"in {n:,} JSON record(s) the field {text_field!r} is not a string: pass --text-field naming " \
                   "the field that holds the text"
        if reason == "empty":
            files = [entry.split(": empty: ")[0] for entry in self.listed if ": empty: " in entry]
            return f"{n:,} input file(s) are empty: {', '.join(files)}" + (", ..." if n > len(files) else "")
        return None


def _reason_of(description: str) -> str:
    """The reason in a Problem's description (``path, line N: reason: message``)."""
    match = _REASON.match(description)
    return match.group(1) if match else "unreadable"


def _counting(out: Path, config: VocabConfig, text_field: str, identity: list[dict[str, Any]],
              source: str | os.PathLike | None, unreadable: SkippedRecords) -> Counting:
    """Where this build's counts come from: ``source`` (refused when it counted other inputs or options), the
    counts an earlier run of this build left in ``out`` (recounted when they differ), or a reading pass whose
    counts are saved in ``out``. Reused counts bring the records their reading skipped into ``unreadable``."""
    if config.format == "bytelevel-bpe":
        if source is not None:
            raise VocabBuildError("word_counts_from: format 'bytelevel-bpe' has tokenizers' BPE trainer count the "
                                  "words itself: leave it out")
        return Counting()
    key = counting_key(counter="bert" if config.format == "wordpiece" else "chunk", lowercase=config.lowercase,
                       max_distinct_words=config.max_distinct_words, text_field=text_field, input_files=identity)
    reuse = _counts_from(Path(source), key) if source is not None else _own_counts(out / WORD_COUNTS_FILE, key)
    if reuse is not None:
        unreadable.extend_recorded(reuse.skipped_records)
        logger.info("reusing the counts of %d distinct words from %d documents (%.1f MB of text): the inputs are "
                    "not read again", len(reuse.counts), reuse.documents, reuse.text_bytes / 1e6)
        return Counting(reuse=reuse)

    def save(corpus: CountedCorpus) -> None:  # the reading has ended: unreadable is complete
        try:
            save_counts(out / WORD_COUNTS_FILE, key, replace(corpus, skipped_records=unreadable.recorded()))
        except OSError as err:  # a full disk: the counts are a convenience, the hours of reading are not lost
            logger.warning("the word counts were not saved (%s): training goes on; a rerun reads the inputs again", err)
    return Counting(on_counted=save)


def _counts_from(path: Path, key: Mapping[str, Any]) -> CountedCorpus:
    path = path / WORD_COUNTS_FILE if path.is_dir() else path
    if not path.is_file():
        raise FileNotFoundError(f"word_counts_from: no word counts at {path}")
    changes = differences(path, key)
    if changes is None:
        raise WordCountsError(f"word_counts_from: {path} is not a word-counts file of this toolkit")
    if changes:
        raise WordCountsError(f"word_counts_from: {path} holds the counts of other inputs or options, so this "
                              "vocabulary would not be the one these inputs give: " + "; ".join(changes))
    return load_counts(path)


def _own_counts(path: Path, key: Mapping[str, Any]) -> CountedCorpus | None:
    """The counts an earlier run of this build saved in its output directory, or None (recount) when there are
    none, they are another corpus's or options', or the file is damaged."""
    changes = differences(path, key) if path.is_file() else None
    if changes:
        logger.info("recounting: %s holds counts of other inputs or options (%s)", path, "; ".join(changes))
    if changes is None or changes:
        return None
    try:
        return load_counts(path)
    except WordCountsError as err:
        logger.warning("recounting: %s", err)
        return None


def _counts_card(counting: Counting, source: str | os.PathLike | None) -> dict[str, Any] | None:
    if counting.reuse is None and counting.on_counted is None:
        return None  # bytelevel-bpe: counted by its trainer
    if source is not None:
        return {"reused_from": str(Path(source).resolve())}
    return {"file": WORD_COUNTS_FILE, "reused": counting.reuse is not None}


def _skip(problem: Problem, unreadable: SkippedRecords) -> None:
    unreadable.add(problem.reason, problem.describe())
    if unreadable.total <= LOGGED_SKIPS:
        logger.warning("skipped: %s%s", problem.describe(),
                       " (the next are counted, not logged)" if unreadable.total == LOGGED_SKIPS else "")


def _not_read(skipped_inputs: Sequence[Problem]) -> tuple[str, ...]:
    """The skipped input files that may be data (an unknown suffix), not a licence or README beside them:
    what prepare_corpus counts as a problem."""
    return tuple(problem.describe() for problem in skipped_inputs if problem.reason != "not_corpus")


def texts_naming_empty_files(names: Sequence[str], text_field: str,
                             on_problem: Callable[[Problem], None]) -> Iterator[str]:
    """The documents of the inputs (:func:`tokenization.sources.iter_texts`), and an ``empty`` problem for a
    file in which nothing could be read and nothing was damaged, as prepare_corpus names it (an empty file
    was left out without a word)."""
    for name in names:
        if is_prepared_corpus(name):
            yield from iter_texts(name, text_field=text_field, on_problem=on_problem)
            continue
        for path in corpus_files([name])[0]:
            found = damaged = False

            def note(problem: Problem) -> None:
                nonlocal damaged
                damaged = True
                on_problem(problem)

            for text in iter_texts(str(path), text_field=text_field, on_problem=note):
                if not found and text and not text.isspace():
                    found = True
                yield text
            # PubMed XML without an abstract (an update file of deletions only) is not empty: prepare_corpus agrees
            if not found and not damaged and (path.stat().st_size == 0 or detect_format(path) != XML):
                on_problem(Problem(str(path), "empty", "the file is empty (0 bytes)" if path.stat().st_size == 0
                                   else "no document in it (blank lines or empty texts only)"))


def inputs_identity(names: Sequence[str]) -> list[dict[str, Any]]:
    """What a rerun compares of the inputs, in input order: each file's identity (path, size, modification
    time: :func:`biomed_lm.finished_output.file_identity`) of those the raw inputs name, and for a prepared corpus
    its folder with its own files' (its dataset and summary; not its ``_work`` folder or hidden lock)."""
    identity: list[dict[str, Any]] = []
    for name in names:
        if is_prepared_corpus(name):
            files = sorted(p for p in Path(name).iterdir() if p.is_file() and not p.name.startswith("."))
            identity.append({"path": str(Path(name).resolve()), "files": [file_identity(p) for p in files]})
        else:
            identity += [file_identity(path) for path in corpus_files([name])[0]]
    return identity


def vocab_settings(config: Mapping[str, Any], text_field: Any) -> dict[str, Any]:
    """What decides a vocabulary besides its inputs: the options of :class:`VocabConfig` (one a card predates
    takes its default, what such cards were built with) and the text field read."""
    return {**dataclass_defaults(VocabConfig), **config, "text_field": text_field}


def finished_vocab(names: Sequence[str], out: Path, config: VocabConfig, text_field: str) -> VocabBuildResult:
    """The vocabulary in ``out``, ``already_complete``, when this build made it: the same input files (path,
    size, modification time), options and text field as its card records. OutputExistsError otherwise,
    naming what differs, or why the card cannot tell."""
    card = read_record(out / VOCAB_CARD)
    if card is None or not {"config", "input_files"} <= set(card):
        why = (f"without a readable {VOCAB_CARD}" if card is None else
               f"whose {VOCAB_CARD} predates the record of its inputs and options")
        raise OutputExistsError(f"{out} already holds a vocabulary {why}, so this command cannot tell whether it "
                                "built it; pass --overwrite to replace the tokenizer files in it")
    current = vocab_settings(asdict(config), text_field)
    changes = setting_change_lines(vocab_settings(card["config"], card.get("text_field")), current, "vocabulary")
    changes += changed_files(card["input_files"], inputs_identity(names), "inputs")
    if changes:
        raise OutputExistsError(other_output_message(out, "a vocabulary", changes))
    return VocabBuildResult(output_dir=out, trained=_trained_from_card(out, card, config), already_complete=True,
                            skipped=SkippedRecords.from_card(card), text_field=text_field,
                            skipped_inputs=tuple(entry for entry in card.get("skipped_inputs", ())
                                                 if ": not_corpus: " not in entry))


def _trained_from_card(out: Path, card: Mapping[str, Any], config: VocabConfig) -> TrainedVocab:
    """A finished build's :class:`TrainedVocab`, from its ``tokenizer.json``, model file and card."""
    from tokenizers import Tokenizer

    model = {"wordpiece": UNIGRAM_MODEL_FILE, "sentencepiece": SENTENCEPIECE_MODEL_FILE}.get(config.format)
    pruning = card.get("word_pruning")
    return TrainedVocab(
        tokenizer=Tokenizer.from_file(str(out / "tokenizer.json")), config=config, documents=card["documents"],
        text_bytes=card["text_bytes"], seconds=card["training_seconds"], alphabet_size=card["alphabet_size"],
        unigram_model=(out / model).read_bytes() if model and (out / model).is_file() else None,
        distinct_words=card.get("distinct_words"),
        alphabet_dropped=(card["alphabet_dropped"]["characters"], card["alphabet_dropped"]["occurrences"])
        if card.get("alphabet_dropped") else None,
        word_pruning=None if pruning is None else WordPruning(
            config.max_distinct_words, pruning["threshold"], pruning["prunes"], pruning["words_dropped"],
            pruning["occurrences_dropped"]))


def save_trained(trained: TrainedVocab, out: Path, card: dict[str, Any]) -> None:
    """Write a trained vocabulary as its format's tokenizer directory, with ``card``. The card is the last
    file written (the model files go first): its presence marks a finished build (:func:`finished_vocab`)."""
    cfg = trained.config
    out.mkdir(parents=True, exist_ok=True)
    if cfg.format == "wordpiece":
        if trained.unigram_model is not None:
            card["unigram_model"] = UNIGRAM_MODEL_FILE
            (out / UNIGRAM_MODEL_FILE).write_bytes(trained.unigram_model)
        with tokenizers_write(out / "tokenizer.json"):
            save_tokenizer_dir(trained.tokenizer, out, lowercase=cfg.lowercase, card=card)
    elif cfg.format == "sentencepiece":
        fast = albert_tokenizer(trained.unigram_model, lowercase=cfg.lowercase)
        (out / SENTENCEPIECE_MODEL_FILE).write_bytes(trained.unigram_model)
        with tokenizers_write(out / "tokenizer.json"):
            save_transformers_dir(fast, out, cfg.lowercase, ALBERT_SPECIALS, card)
    else:
        from tokenizers import Tokenizer

        fast = roberta_tokenizer(Tokenizer.from_str(trained.tokenizer.to_str()), lowercase=cfg.lowercase,
                                 add_prefix_space=cfg.add_prefix_space)
        with tokenizers_write(f"{out / 'vocab.json'} or {out / 'merges.txt'}"):  # it does not say which
            fast.backend_tokenizer.model.save(str(out))  # vocab.json, merges.txt
        with tokenizers_write(out / "tokenizer.json"):
            save_transformers_dir(fast, out, cfg.lowercase, ROBERTA_SPECIALS, card)


_OS_ERROR_CODE = re.compile(r"os error (\d+)")


@contextmanager
def tokenizers_write(target: str | os.PathLike) -> Iterator[None]:
    """Around a save through the ``tokenizers`` library: it reports a failed write (a full disk) as a plain
    ``Exception``, "No space left on device (os error 28)", which the entry scripts would let through as a
    traceback. Re-raise it as the ``OSError`` it is, naming ``target``, the file being written; the
    toolkit's own errors, ``ValueError`` and a real ``OSError`` pass unchanged."""
    try:
        yield
    except Exception as err:
        if type(err) is not Exception:
            raise
        code = _OS_ERROR_CODE.search(str(err))
        number = int(code.group(1)) if code else None
        raise OSError(number, os.strerror(number) if number is not None else str(err), str(target)) from err


# --- internals -------------------------------------------------------------------------------

@dataclass
class _ReadStats:
    documents: int = 0
    text_bytes: int = 0
    has_text: bool = False  # some document holds more than whitespace
    distinct_words: int | None = None  # set by the word counting (formats wordpiece and sentencepiece)
    word_pruning: WordPruning | None = None
    alphabet_dropped: tuple[int, int] | None = None  # set with the alphabet (see TrainedVocab)


def _metered(texts: Iterable[str], stats: _ReadStats, progress: bool) -> Iterator[str]:
    """The texts, counted into ``stats`` (documents, UTF-8 bytes) and shown by a tqdm bar."""
    from tqdm.auto import tqdm

    with tqdm(desc="reading documents", unit=" docs", unit_scale=True, disable=not progress) as bar:
        for text in texts:
            stats.documents += 1
            stats.text_bytes += len(text) if text.isascii() else len(text.encode("utf-8"))
            if not stats.has_text and text and not text.isspace():
                stats.has_text = True
            if stats.documents % _PROGRESS_EVERY == 0:
                bar.set_postfix_str(f"{stats.text_bytes / 1e6:.1f} MB", refresh=False)
                bar.update(_PROGRESS_EVERY)
            yield text
        bar.set_postfix_str(f"{stats.text_bytes / 1e6:.1f} MB", refresh=False)
        bar.update(stats.documents % _PROGRESS_EVERY)
    logger.info("read %d documents (%.1f MB of text)", stats.documents, stats.text_bytes / 1e6)


def _counted_out(batches: Iterator[tuple[list[str], int]], bar) -> Iterator[list[str]]:
    """The batches of :func:`_repeated_words`, each counted on ``bar`` (in words) as it is handed over."""
    for batch, words in batches:
        yield batch
        bar.update(words)


def _repeated_words(word_counts: Mapping[str, int], batch_chars: int = 1 << 16) -> Iterator[tuple[list[str], int]]:
    """Each word as often as it occurs, space-separated, in batches of about ``batch_chars``, each with the
    number of words it holds.

    Small batches: ``tokenizers`` buffers 256 of these strings ahead of its threads, and each
    thread splits a whole string into owned words at once, so with 1 MiB batches the trainer's
    peak grew with the words' counts (25 MB of PubMed text, counts x1/x4/x16: 165/340/490 MiB);
    with 64 KiB it is 78/84/89 MiB, the words' own structures, at the same speed."""
    batch: list[str] = []
    size = words = 0
    for word, n in word_counts.items():
        per_text = max(1, batch_chars // (len(word) + 1))
        while n > 0:
            k = min(n, per_text)
            batch.append((word + " ") * k)
            size += k * (len(word) + 1)
            words += k
            n -= k
            if size >= batch_chars:
                yield batch, words
                batch, size, words = [], 0, 0
    if batch:
        yield batch, words


def train_unigram_model(word_counts: Mapping[str, int], vocab_size: int) -> bytes:
    """Train a SentencePiece unigram LM on counted BERT words and return the serialized model.

    SentencePiece's own normalization and splitting are switched off: the words are already
    BERT-normalized and must not be split further (by script or digits). The words go in as
    SentencePiece's TSV input (``sentence<TAB>count``), see :func:`_unigram_training_lines`.
    """
    import io

    import sentencepiece as spm

    logger.info("training a SentencePiece unigram model on %d distinct words", len(word_counts))
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=_unigram_training_lines(word_counts), input_format="tsv",
            model_writer=model, model_type="unigram", vocab_size=vocab_size, hard_vocab_limit=False,
            character_coverage=1.0, normalization_rule_name="identity", add_dummy_prefix=True,
            remove_extra_whitespaces=False, split_by_whitespace=True, split_by_unicode_script=False,
            split_by_number=False, split_digits=False, byte_fallback=False,
            max_sentencepiece_length=UNIGRAM_MAX_PIECE_LENGTH, max_sentence_length=1 << 16,
            unk_id=0, bos_id=-1, eos_id=-1, pad_id=-1, num_threads=SENTENCEPIECE_THREADS, minloglevel=2)
    except (RuntimeError, OSError) as err:
        raise VocabBuildError(f"SentencePiece unigram training failed: {err}") from err
    return model.getvalue()


def train_sentencepiece_model(word_counts: Mapping[str, int], vocab_size: int) -> bytes:
    """Train ALBERT's kind of SentencePiece unigram model on counted (ALBERT-prepared) words and
    return it serialized: ``<pad>`` ``<unk>`` ``[CLS]`` ``[SEP]`` ``[MASK]`` at ids 0..4 (the last
    three control symbols, never produced from text), SentencePiece's own NFKC normalization
    (saved in the model, applied again at use time), its default splitting rules (no piece across
    whitespace, scripts or digits), and ``vocab_size`` pieces in all, fewer if the corpus cannot
    support them. Same TSV input as :func:`train_unigram_model`."""
    import io

    import sentencepiece as spm

    logger.info("training a SentencePiece unigram model on %d distinct words", len(word_counts))
    pad, unk, *control = ALBERT_SPECIALS
    model = io.BytesIO()
    spm.set_random_generator_seed(SENTENCEPIECE_SEED)
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=_unigram_training_lines(word_counts), input_format="tsv", model_writer=model,
            model_type="unigram", vocab_size=vocab_size, hard_vocab_limit=False, character_coverage=1.0,
            normalization_rule_name="nmt_nfkc", byte_fallback=False, max_sentencepiece_length=UNIGRAM_MAX_PIECE_LENGTH,
            max_sentence_length=1 << 16, pad_id=0, pad_piece=pad, unk_id=1, unk_piece=unk, bos_id=-1, eos_id=-1,
            control_symbols=control, num_threads=SENTENCEPIECE_THREADS, minloglevel=2)
    except (RuntimeError, OSError) as err:
        raise VocabBuildError(f"SentencePiece training failed: {err}") from err
    return model.getvalue()


def _unigram_training_lines(word_counts: Mapping[str, int]) -> Iterator[str]:
    """TSV lines that give SentencePiece every word exactly as often as it occurs, and let a
    repeated word become a candidate piece.

    SentencePiece merges identical lines and draws its candidate pieces from substrings that occur
    at least twice in the (merged) text; one line per distinct word would make a whole word a
    candidate only if it happens to be part of another word, so "hypertension" would be learnt
    as "hypertensi" + "on". So a word seen ``n`` times appears ``r = 1 + floor(log2 n)`` times on
    its line (``word word ...<TAB>n // r``, plus a line for the remainder): the likelihood still
    counts it exactly ``n`` times, and a frequent word is a candidate whose rank grows with its
    frequency, while the text SentencePiece holds stays proportional to the number of distinct
    words (not to the corpus).
    """
    for word, n in word_counts.items():
        repeats = min(n, n.bit_length())
        per_line, remainder = divmod(n, repeats)
        yield f"{' '.join([word] * repeats)}\t{per_line}"
        if remainder:
            yield f"{' '.join([word] * remainder)}\t1"


def _check_inputs(names: Sequence[str]) -> list[Problem]:
    """Refuse an input that is missing or holds nothing readable; the files of an unknown suffix beside
    readable ones (a README in a folder of abstracts) are returned, to be named, and are not read
    (:func:`tokenization.sources.corpus_files`, the rule prepare_corpus follows)."""
    problems, skipped = [], []
    for name in names:
        if is_prepared_corpus(name):
            continue
        files, found = corpus_files([name])
        problems += [problem for problem in found if problem.reason not in SET_ASIDE or not files]
        skipped += [problem for problem in found if problem.reason in SET_ASIDE and files]
    if problems:
        raise FileNotFoundError("cannot read the inputs: " + "; ".join(p.describe() for p in problems))
    for problem in skipped:
        logger.warning("skipped %s", problem.describe())
    return skipped


def _check_not_a_file(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise OutputExistsError(f"output path {out} exists and is not a directory")


def _check_output_dir(out: Path, overwrite: bool) -> None:
    _check_not_a_file(out)
    # The lock, and the counts an unfinished run of this build saved (a rerun reuses them).
    allowed = {ARTIFACT_LOCK_FILE, WORD_COUNTS_FILE, partial_name(WORD_COUNTS_FILE)}
    if out.is_dir() and any(p.name not in allowed for p in out.iterdir()) and not overwrite:
        raise OutputExistsError(f"output directory {out} exists and is not empty; "
                                "pass --overwrite to replace the tokenizer files in it")


def _cpu_count() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)
