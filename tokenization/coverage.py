"""How well vocabularies cover biomedical text: the numbers behind the paper's Tables 1 and 8.

PubMedBERT's case for an in-domain vocabulary rests on two observations: a general-domain
vocabulary shatters common biomedical terms into meaningless pieces (Table 1: *naloxone* becomes
``na ##lo ##xon ##e``), and so makes every input longer (Table 8: NCBI-disease sentences are 34.2
word pieces with BERT's vocabulary, 27.4 with PubMed's). This module measures both for any set of
tokenizers, on term lists, corpora and BLURB-format datasets, and writes a report a person can
read (``report.md``, with plots) and a program can consume (``report.json``).

Formats
    Three tokenizer formats can be compared with each other: WordPiece (BERT, ``##`` marks a
    continuation), SentencePiece (ALBERT, ``▁`` marks a word start; a tokenizer directory or a bare
    ``.model`` file) and byte-level BPE (RoBERTa, ``Ġ`` marks a piece after a space). Each is
    read through one adapter (:data:`FORMATS`, chosen from the tokenizer's pipeline) that knows how
    to segment a word with the format's own algorithm and how to write its tokens in WordPiece form
    for the overlap table; everything after segmentation is the same for all formats.

Definitions (they are printed in every report)
    word      a BERT pre-tokenization unit, one definition shared by all vocabularies
              (:class:`tokenization.words.WordSplitter`); each vocabulary applies its own
              normalizer (lowercasing when uncased) and WordPiece to it.
    input     what a model reads at once: a document of a corpus, a dataset example
              (:mod:`tokenization.model_inputs` says which for each format). ``report.json``'s
              keys call it by the report's older word, *instance* (``instances``,
              ``pieces_per_instance``), kept for the programs that read the file.
    pieces    the vocabulary's tokens for the word, without [CLS]/[SEP]. SentencePiece and byte-level
              BPE tell a word that follows a space from one that does not; a word is segmented as
              it follows a space (``▁``/``Ġ`` word start), a punctuation mark as attached to its
              neighbour (no marker), as they mostly are in running text. Summed over the words of
              a text this comes within about 1.5% of tokenizing the text itself (WordPiece: exactly).
    whole     a word tokenized to exactly one piece that is not [UNK].
    [UNK]     a word whose pieces include the unknown token (WordPiece maps an unknown word to a
              single [UNK]); [UNK] words are neither whole nor shattered.
    shattered a word tokenized to at least ``min_pieces`` pieces (2 by default).
    overlap   token sets compared as strings in WordPiece form (``▁x``/``Ġx`` -> ``x``, any other
              SentencePiece or BPE piece -> ``##x``, bytes decoded), reserved and special tokens
              left out; ``##x`` and ``x`` are different tokens, and so are ``The`` and ``the``.

Efficiency: the words of a source are counted first, and each distinct word is tokenized once per
vocabulary in a batch (Rust, parallel); every statistic is then arithmetic on counts, so a
5 MB corpus takes seconds. The statistics are pure functions of a :class:`WordSample` (the counted
words) and a :class:`Segmentation` (each distinct word's pieces under one vocabulary).
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import os
import re
import time
from array import array
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from functools import cached_property
from itertools import combinations, islice, permutations
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from biomed_lm.errors import InputError
from biomed_lm.tokenization.model_inputs import DATASET, DatasetFile, Source
from biomed_lm.tokenization.sources import is_prepared_corpus
from biomed_lm.tokenization.tokenizer_io import load_tokenizer, recorded_lowercase
from biomed_lm.tokenization.words import is_punctuation

LOG = logging.getLogger(__name__)

#: Histogram buckets of pieces per word occurrence; a word erased by normalization falls in none.
PIECE_BUCKETS = ("[UNK]", "1", "2", "3", "4", "5+")
#: Bracketed reserved tokens ([PAD], [CLS], [unused12]) carry no coverage information.
RESERVED_TOKEN = re.compile(r"\[[A-Za-z][A-Za-z_]*\d*\]\Z")
#: Below this share of tokens that lowercasing changes, an inferred "cased" deserves a second look.
SUSPICIOUS_UPPERCASE_SHARE = 0.01
#: BERT's usual maximum sequence lengths (fine-tuning at 128, PubMedQA/BioASQ and pretraining's phase 2 at 512):
#: the report gives the share of inputs that do not fit, [CLS] and [SEP] counted.
MAX_LENGTHS = (128, 512)
SEGMENT_BATCH = 8192
#: What a tokenizer directory must hold for the report to read it: the files AutoTokenizer builds a
#: WordPiece, byte-level BPE or SentencePiece (spiece.model, or another *.model) tokenizer from.
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "*.model")

WORD_DEFINITION = (
    "A word is a BERT pre-tokenization unit: the text is cleaned (control characters dropped, "
    "whitespace normalized), CJK characters are set apart, and it is split on whitespace and on every "
    "punctuation character (tokenizers' BertNormalizer without lowercasing, then BertPreTokenizer). "
    "The same words are used for every vocabulary; each vocabulary then applies its own normalizer "
    "(lowercasing and accent stripping when uncased) and segmentation (WordPiece, SentencePiece's "
    "unigram Viterbi or byte-level BPE) to each word. For WordPiece this gives exactly the pieces the "
    "tokenizer produces in running text; SentencePiece and byte-level BPE segment a word as it follows "
    "a space (word-start marker) and a punctuation mark as attached to its neighbour, which comes within "
    "about 1.5% of tokenizing the text itself.")
DEFINITIONS = {
    "pieces": "the vocabulary's tokens (WordPiece, SentencePiece or byte-level BPE pieces), without special tokens.",
    "whole": "a word tokenized to exactly one piece that is not [UNK].",
    "unk": "a word whose pieces include the unknown token; WordPiece maps a word it cannot spell to a "
           "single [UNK]. [UNK] words are neither whole nor shattered.",
    "shattered": "a word tokenized to at least min_pieces pieces (see settings).",
    "overlap": "token sets compared as strings in WordPiece form (a SentencePiece or byte-level BPE piece "
               "with its word-start marker as 'x', without it as '##x', bytes decoded), special and reserved "
               "bracketed tokens ([PAD], [UNK], [unused7], ...) left out; '##x' and 'x' are different tokens, "
               "and so are 'The' and 'the'.",
    "instance_pieces": "word pieces per model input (an instance, in report.json's keys): mean, median, "
                       "95th percentile and maximum over the inputs.",
    "inputs_over": "the share of model inputs longer than a maximum sequence length (128, 512 positions) once "
                   "[CLS] and [SEP] are added, which a model truncates; a pair input (BIOSSES, question + "
                   "context) takes one more [SEP], not counted.",
}


# ------------------------------------------------------------------------------- vocabularies

@dataclass(frozen=True)
class VocabularyInfo:
    """What the report says about a vocabulary: where it came from and how it treats case."""

    name: str
    path: str
    kind: str                       # "tokenizer directory", "vocab.txt file" or "SentencePiece .model file"
    size: int                       # every token, reserved ones included
    lowercase: bool                 # what its normalizer does, checked on the loaded tokenizer
    casing_source: str
    uppercase_tokens: int           # non-reserved tokens with an uppercase letter
    uppercase_examples: tuple[str, ...]
    notes: tuple[str, ...] = ()
    format: str = "wordpiece"       # a key of FORMATS


class WordPieceFormat:
    """The adapter of one tokenizer format: how it segments words and how its tokens read in
    WordPiece form. This one is WordPiece's (BERT): a word is tokenized by the whole pipeline, which
    gives exactly the pieces of running text, and tokens are already in WordPiece form. The other
    formats differ only in what they override; :data:`FORMATS` lists them."""

    name = "wordpiece"

    def __init__(self, engine: Any, unk_token: str) -> None:
        self.engine = engine
        self.unk_token = unk_token
        self.unk_id = engine.token_to_id(unk_token)

    def segment(self, texts: Sequence[str]) -> list[tuple[str, ...]]:
        """The pieces of each text (a word, or a term of several words), without special tokens;
        an unknown piece reads as the unknown token (a unigram model returns the text it covers)."""
        return self._encode(list(texts))

    def wordpiece_form(self, token: str) -> str | None:
        """``token`` as a WordPiece token (for overlaps), or None for one that stands for nothing."""
        return token

    def _encode(self, texts: list[str]) -> list[tuple[str, ...]]:
        pieces: list[tuple[str, ...]] = []
        for start in range(0, len(texts), SEGMENT_BATCH):
            for e in self.engine.encode_batch(texts[start:start + SEGMENT_BATCH], add_special_tokens=False):
                pieces.append(tuple(self.unk_token if i == self.unk_id else t for i, t in zip(e.ids, e.tokens)))
        return pieces

    def _model_pieces(self, text: str) -> tuple[str, ...]:
        """The model's own segmentation of an already pre-tokenized piece of text."""
        return tuple(self.unk_token if t.id == self.unk_id else t.value for t in self.engine.model.tokenize(text))


class _MarkedFormat(WordPieceFormat, ABC):
    """A format that marks word starts (``marker``) instead of continuations: a word is segmented as
    it follows a space (:meth:`as_word`), a punctuation mark as attached to its neighbour
    (:meth:`attached`), as they mostly are in running text; a term of several words takes the
    pipeline as it is."""

    marker = ""

    def segment(self, texts: Sequence[str]) -> list[tuple[str, ...]]:
        pieces = self._encode([self.as_word(t) for t in texts])
        return [self.attached(t) if is_punctuation(t) else p for t, p in zip(texts, pieces)]

    def as_word(self, text: str) -> str:
        return text

    @abstractmethod
    def attached(self, word: str) -> tuple[str, ...]:
        """The pieces of a punctuation mark that follows a word without a space (each format's own)."""

    def normalized(self, word: str) -> str:
        normalizer = self.engine.normalizer
        return normalizer.normalize_str(word) if normalizer is not None else word

    def wordpiece_form(self, token: str) -> str | None:
        text = self.text_of(token)
        if text.startswith(self.marker):
            return text[len(self.marker):] or None
        return "##" + text

    def text_of(self, token: str) -> str:
        return token


class SentencePieceFormat(_MarkedFormat):
    """SentencePiece (ALBERT): the unigram model's Viterbi segmentation, ``▁`` before each word
    (the pipeline's Metaspace pre-tokenizer puts it there)."""

    name = "sentencepiece"
    marker = "\u2581"

    def attached(self, word: str) -> tuple[str, ...]:
        text = self.normalized(word).strip()
        return self._model_pieces(text) if text else ()


class ByteLevelBPEFormat(_MarkedFormat):
    """Byte-level BPE (RoBERTa): merges over the bytes of the word, ``Ġ`` (a space byte) before
    each word. Tokens are byte strings; their WordPiece form is the text they decode to."""

    name = "bytelevel-bpe"
    marker = " "  # Ġ, as the decoded text of a token reads it

    def __init__(self, engine: Any, unk_token: str) -> None:
        from tokenizers import decoders, pre_tokenizers

        super().__init__(engine, unk_token)
        self._bytes = pre_tokenizers.ByteLevel(add_prefix_space=False)
        self._decoder = decoders.ByteLevel()

    def as_word(self, text: str) -> str:
        return " " + text

    def attached(self, word: str) -> tuple[str, ...]:
        splits = self._bytes.pre_tokenize_str(self.normalized(word))
        return tuple(piece for split, _ in splits for piece in self._model_pieces(split))

    def text_of(self, token: str) -> str:
        text = self._decoder.decode([token])
        return token if "\ufffd" in text else text  # part of a character: kept as bytes


#: Tokenizer format -> its adapter.
FORMATS: dict[str, type[WordPieceFormat]] = {
    "wordpiece": WordPieceFormat, "sentencepiece": SentencePieceFormat, "bytelevel-bpe": ByteLevelBPEFormat}


def detect_format(pipeline: Mapping[str, Any]) -> str:
    """The format of a fast tokenizer from its JSON: a WordPiece model, a Metaspace (``▁``)
    pre-tokenizer or a ByteLevel (``Ġ``) one; anything else is refused."""
    model = (pipeline.get("model") or {}).get("type")
    pre = pipeline.get("pre_tokenizer") or {}
    steps = {step.get("type") for step in (pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre])}
    if model == "WordPiece":
        return "wordpiece"
    if "Metaspace" in steps:
        return "sentencepiece"
    if "ByteLevel" in steps:
        return "bytelevel-bpe"
    raise InputError(f"unsupported tokenizer: a {model} model with pre-tokenizer(s) {sorted(filter(None, steps))}; "
                     "the report reads WordPiece, SentencePiece (Metaspace) and byte-level BPE tokenizers")


@dataclass(frozen=True, eq=False)
class Vocabulary:
    """A loaded tokenizer, ready to segment words: ``tokens`` holds its non-reserved tokens in
    WordPiece form, ``engine`` a ``tokenizers.Tokenizer`` copy with padding and truncation turned
    off and ``adapter`` its format's :class:`WordPieceFormat`."""

    info: VocabularyInfo
    tokens: frozenset[str]
    unk_token: str
    engine: Any = field(repr=False)
    adapter: WordPieceFormat | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return self.info.name

    def segment(self, texts: Sequence[str]) -> list[tuple[str, ...]]:
        """The pieces of each text (a word, or a term of several words), without special tokens."""
        adapter = self.adapter or WordPieceFormat(self.engine, self.unk_token)
        return adapter.segment(texts)


def _normalizer_lowercases(engine: Any) -> bool:
    normalizer = engine.normalizer
    return normalizer is not None and normalizer.normalize_str("A") == "a"


def _describe_casing(path: Path, requested: bool | None, actual: bool, claimed: object,
                     uppercase: Sequence[str], n_tokens: int) -> tuple[str, tuple[str, ...]]:
    """Where a vocabulary's casing came from, and notes on anything that looks wrong with it."""
    notes: list[str] = []
    vocab_file = path / "vocab.txt" if path.is_dir() else path
    if requested is not None:
        source = "set explicitly"
    elif path.is_dir() and recorded_lowercase(path) is not None:
        source = "recorded in the tokenizer directory"
    elif vocab_file.is_file():
        source = f"inferred from {vocab_file.name}: {len(uppercase):,} of {n_tokens:,} tokens change when lowercased"
        if not actual and len(uppercase) < SUSPICIOUS_UPPERCASE_SHARE * n_tokens:
            notes.append(f"inferred cased from only {len(uppercase)} token(s) that lowercasing changes "
                         f"(e.g. {', '.join(repr(t) for t in uppercase[:5])}); if this vocabulary is "
                         "uncased, set its casing explicitly")
    else:
        source = "from the normalizer in tokenizer.json"
    if isinstance(claimed, bool) and claimed != actual:
        notes.append(f"the configuration says do_lower_case={claimed} but the tokenizer's normalizer "
                     f"{'lowercases' if actual else 'keeps case'}; the report follows the normalizer")
    return source, tuple(notes)


def load_vocabulary(name: str, path: str | os.PathLike, lowercase: bool | None = None) -> Vocabulary:
    """Load a tokenizer directory (WordPiece, SentencePiece or byte-level BPE), a bare ``vocab.txt``
    or a bare SentencePiece ``.model`` file with :func:`load_tokenizer`.

    ``lowercase=None`` takes the casing the directory records, or infers it from the vocabulary;
    a value sets it explicitly (and must agree with what a directory records). The casing reported
    is what the loaded tokenizer's normalizer actually does.
    """
    p = Path(path)
    if not p.exists():
        raise InputError(f"tokenizer {name!r}: no such file or directory: {p}")
    if p.is_dir() and not any(next(p.glob(pattern), None) for pattern in TOKENIZER_FILES):
        # transformers would answer that it needs sentencepiece or tiktoken, which is not the problem
        raise InputError(f"tokenizer {name!r}: {p} holds no tokenizer: looked for {', '.join(TOKENIZER_FILES)}")
    try:
        tokenizer = load_tokenizer(p, lowercase=lowercase)
    except (OSError, ValueError) as err:
        raise InputError(f"tokenizer {name!r}: cannot load {p}: {err}") from err
    engine, fmt = _engine_of(name, p, tokenizer)
    unk = tokenizer.unk_token or getattr(engine.model, "unk_token", None) or "[UNK]"
    adapter = FORMATS[fmt](engine, unk)
    vocab = engine.get_vocab(with_added_tokens=True)
    ordered = [token for token, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    special = set(getattr(tokenizer, "all_special_tokens", ()))
    forms = (adapter.wordpiece_form(t) for t in ordered if t not in special and not RESERVED_TOKEN.match(t))
    content = list(dict.fromkeys(t for t in forms if t))
    uppercase = [t for t in content if t != t.lower()]  # the same evidence load_tokenizer infers from
    actual = _normalizer_lowercases(engine)

    casing_source, notes = _describe_casing(p, lowercase, actual, tokenizer.init_kwargs.get("do_lower_case"),
                                            uppercase, len(content))
    info = VocabularyInfo(name=name, path=str(path), kind=_kind(p), size=len(ordered), lowercase=actual,
                          casing_source=casing_source, uppercase_tokens=len(uppercase),
                          uppercase_examples=tuple(uppercase[:5]), notes=notes, format=fmt)
    return Vocabulary(info=info, tokens=frozenset(content), unk_token=unk, engine=engine, adapter=adapter)


def _engine_of(name: str, path: Path, tokenizer: Any) -> tuple[Any, str]:
    """A private copy of the tokenizer's fast backend (no padding, no truncation) and its format."""
    from tokenizers import Tokenizer

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise InputError(f"tokenizer {name!r}: {path} has no fast (tokenizers) backend to segment with")
    pipeline = backend.to_str()
    try:
        fmt = detect_format(json.loads(pipeline))
        if fmt == "wordpiece":
            _check_wordpiece(path, json.loads(pipeline).get("model") or {})
    except InputError as err:
        raise InputError(f"tokenizer {name!r}: {path}: {err}") from err
    engine = Tokenizer.from_str(pipeline)
    engine.no_padding()
    engine.no_truncation()
    return engine, fmt


def _check_wordpiece(path: Path, model: Mapping[str, Any]) -> None:
    """Refuse a WordPiece model without its unknown token. Any text file loads as a vocab.txt (one
    token per line; the special tokens become added tokens), so prose, an empty file or a JSON file
    would only fail on the first word the model cannot spell, deep inside the report."""
    vocab, unk = model.get("vocab") or {}, model.get("unk_token") or "[UNK]"
    if unk in vocab:
        return
    if path.is_file() and not path.read_text(encoding="utf-8", errors="replace").strip():
        raise InputError("not a WordPiece vocabulary: the file is empty")
    form = " (one token per line)" if path.is_file() else ""
    hint = "; a tokenizer.json is read from its directory" if path.suffix == ".json" else ""
    raise InputError(f"not a WordPiece vocabulary{form}: no {unk} token among its {len(vocab):,} token(s){hint}")


def _kind(path: Path) -> str:
    if path.is_dir():
        return "tokenizer directory"
    return "SentencePiece .model file" if path.suffix == ".model" else "vocab.txt file"


# ------------------------------------------------------------------------------------- terms

@dataclass(frozen=True)
class Term:
    text: str
    category: str | None = None


def parse_terms(lines: Iterable[str], origin: str = "<terms>") -> list[Term]:
    """Parse a term list: one ``term<TAB>category`` per line, the category optional, ``#`` starts a
    comment line, blank lines are ignored. A term may contain spaces (it is then several words and
    never whole); only a TAB separates the category."""
    terms: list[Term] = []
    for line_no, raw in enumerate(lines, start=1):
        line = raw.rstrip("\r\n")
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        fields = line.split("\t")
        if len(fields) > 2:
            raise InputError(f"{origin}, line {line_no}: expected 'term<TAB>category', got {len(fields)} "
                             "tab-separated fields")
        text = fields[0].strip()
        category = fields[1].strip() if len(fields) == 2 and fields[1].strip() else None
        if not text:
            raise InputError(f"{origin}, line {line_no}: the term is empty")
        terms.append(Term(text, category))
    return terms


def read_terms(path: str | os.PathLike) -> list[Term]:
    p = Path(path)
    if not p.is_file():
        raise InputError(f"term file not found: {p}")
    data = p.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:  # a binary or Latin-1 file: say where, as parse_terms does for a bad line
        line = data.count(b"\n", 0, err.start) + 1
        raise InputError(f"{p}, line {line}: not UTF-8 text ({err.reason} at byte {err.start}); a term file "
                         "is UTF-8 lines of 'term<TAB>category'") from err
    terms = parse_terms(io.StringIO(text, newline=None), origin=str(p))  # lines as open() splits them
    if not terms:
        raise InputError(f"{p}: the term file lists no term")
    return terms


@dataclass(frozen=True)
class TermRow:
    term: str
    category: str | None
    pieces: Mapping[str, tuple[str, ...]]   # vocabulary name -> pieces
    whole: Mapping[str, bool]


@dataclass(frozen=True)
class TermTable:
    source: str
    rows: tuple[TermRow, ...]
    whole_counts: Mapping[str, int]


def is_whole(pieces: Sequence[str], unk_token: str) -> bool:
    return len(pieces) == 1 and pieces[0] != unk_token


def term_table(terms: Sequence[Term], vocabularies: Sequence[Vocabulary], source: str = "") -> TermTable:
    """Each term's pieces under each vocabulary, and whether it stays whole (paper's Table 1)."""
    texts = [t.text for t in terms]
    segmented = {v.name: v.segment(texts) for v in vocabularies}
    unk = {v.name: v.unk_token for v in vocabularies}
    rows = tuple(TermRow(term=t.text, category=t.category,
                         pieces={name: segmented[name][i] for name in segmented},
                         whole={name: is_whole(segmented[name][i], unk[name]) for name in segmented})
                 for i, t in enumerate(terms))
    counts = {name: sum(row.whole[name] for row in rows) for name in segmented}
    return TermTable(source=source, rows=rows, whole_counts=counts)


# ------------------------------------------------------------------------- counting and pieces

@dataclass(frozen=True, eq=False)
class WordSample:
    """The words of a source, counted: ``words`` are the distinct words in first-seen order,
    ``counts`` their frequencies over every model input read. The input-length statistics need each
    input's words, which for a whole corpus would grow with it (bench_scale.py projected 57 GiB
    for PubMed's 20 GB when every word was kept), so those are kept for a uniform sample of at most
    :data:`LENGTH_SAMPLE` inputs (every input of a smaller source): ``occurrences`` their words as
    indices into ``words``, input after input, and ``input_ends`` where each ends in ``occurrences``."""

    words: tuple[str, ...]
    counts: np.ndarray
    occurrences: np.ndarray
    input_ends: np.ndarray
    n_inputs: int
    capped: bool = False

    @property
    def n_words(self) -> int:
        return int(self.counts.sum())

    @property
    def sampled_inputs(self) -> int:
        return len(self.input_ends)


#: Model inputs whose words count_words keeps for the length percentiles (a seeded reservoir sample):
#: at BERT-like abstracts of ~250 words, about 100 MB whatever the corpus.
LENGTH_SAMPLE = 100_000
#: Word ids buffered before they are added to the counts (4 MB of int32).
_COUNT_CHUNK = 1 << 20


def count_words(inputs: Iterable[Sequence[str]], max_inputs: int | None = None,
                length_sample: int = LENGTH_SAMPLE, seed: int = 0) -> WordSample:
    """Count the words of model ``inputs`` (each a list of words), reading at most ``max_inputs``,
    in memory that grows with the distinct words only: every word is counted, and the words of a
    uniform sample of ``length_sample`` inputs (reservoir sampling, seeded) are kept."""
    index: dict[str, int] = {}
    counts = np.zeros(0, dtype=np.int64)
    pending = array("i")  # int32 word ids: 4 bytes a word in the buffer and the sample
    kept: list[array] = []
    rng = np.random.default_rng(seed)
    read, capped = 0, False
    for words in inputs:
        if max_inputs is not None and read >= max_inputs:
            capped = True
            break
        ids = array("i", [index.setdefault(word, len(index)) for word in words])
        read += 1
        pending.extend(ids)
        if len(kept) < length_sample:
            kept.append(ids)
        elif (slot := int(rng.integers(read))) < length_sample:
            kept[slot] = ids
        if len(pending) >= _COUNT_CHUNK:
            counts, pending = _add_counts(counts, pending, len(index)), array("i")
    counts = _add_counts(counts, pending, len(index))
    ends = np.cumsum([len(ids) for ids in kept], dtype=np.int64)
    occurrences = np.frombuffer(b"".join(ids.tobytes() for ids in kept), dtype=np.int32).astype(np.int64)
    return WordSample(words=tuple(index), counts=counts, occurrences=occurrences, input_ends=ends,
                      n_inputs=read, capped=capped)


def _add_counts(counts: np.ndarray, word_ids: array, distinct: int) -> np.ndarray:
    added = np.bincount(np.frombuffer(word_ids, dtype=np.int32), minlength=distinct) if word_ids \
        else np.zeros(distinct, dtype=np.int64)
    return np.pad(counts, (0, distinct - len(counts))) + added


@dataclass(frozen=True, eq=False)
class Segmentation:
    """Each distinct word's pieces under one vocabulary, aligned with ``WordSample.words``."""

    vocabulary: str
    pieces: tuple[tuple[str, ...], ...]
    unk_token: str

    @cached_property
    def lengths(self) -> np.ndarray:
        return np.fromiter((len(p) for p in self.pieces), dtype=np.int64, count=len(self.pieces))

    @cached_property
    def unknown(self) -> np.ndarray:
        unk = self.unk_token
        return np.fromiter((unk in p for p in self.pieces), dtype=bool, count=len(self.pieces))


def segment_sample(vocabulary: Vocabulary, sample: WordSample,
                   on_segmented: Callable[[int], None] | None = None) -> Segmentation:
    """Tokenize each distinct word of ``sample`` once with ``vocabulary``; ``on_segmented`` is told
    how many words each batch held (a progress bar's update)."""
    pieces: list[tuple[str, ...]] = []
    # Batches of the size the adapters encode at once: reporting progress costs no parallelism.
    for start in range(0, len(sample.words), SEGMENT_BATCH):
        batch = sample.words[start:start + SEGMENT_BATCH]
        pieces.extend(vocabulary.segment(batch))
        if on_segmented is not None:
            on_segmented(len(batch))
    return Segmentation(vocabulary.name, tuple(pieces), vocabulary.unk_token)


def _ratio(numerator: float, denominator: float) -> float:
    return float(numerator) / float(denominator) if denominator else 0.0


@dataclass(frozen=True)
class SourceStats:
    """One vocabulary on one source. Fractions are of word occurrences unless named ``distinct``.
    The field names are report.json's keys, where an *instance* is a model input."""

    vocabulary: str
    pieces: int
    pieces_per_word: float
    pieces_per_instance: float
    instance_pieces_median: float
    instance_pieces_p95: float
    instance_pieces_max: int
    length_instances: int                  # the inputs median, p95 and max are of (count_words' sample)
    length_sampled: bool                   # fewer than every input read: a uniform sample of them
    whole_words: int
    whole_fraction: float
    distinct_whole_fraction: float
    unk_words: int
    unk_rate: float
    erased_words: int                      # words the normalizer erases entirely (e.g. a lone accent)
    inputs_over: Mapping[str, float]       # str(max length) -> share of inputs (of the length sample) too long
    piece_histogram: Mapping[str, float]   # PIECE_BUCKETS -> fraction of word occurrences


def source_statistics(sample: WordSample, segmentation: Segmentation) -> SourceStats:
    """Table 8's input length and the coverage statistics of one vocabulary on one source."""
    if len(segmentation.pieces) != len(sample.words):
        raise ValueError("the segmentation does not belong to this sample (different word counts)")
    lengths, unknown, counts = segmentation.lengths, segmentation.unknown, sample.counts
    words = sample.n_words
    pieces = int((counts * lengths).sum())
    per_occurrence = np.concatenate(([0], np.cumsum(lengths[sample.occurrences])))
    starts = np.concatenate((np.zeros(1, dtype=np.int64), sample.input_ends[:-1]))[:sample.sampled_inputs]
    per_input = per_occurrence[sample.input_ends] - per_occurrence[starts]
    whole = (lengths == 1) & ~unknown
    histogram = {"[UNK]": int(counts[unknown].sum()), "1": int(counts[whole].sum())}
    for k in (2, 3, 4):
        histogram[str(k)] = int(counts[(lengths == k) & ~unknown].sum())
    histogram["5+"] = int(counts[(lengths >= 5) & ~unknown].sum())
    has_inputs = len(per_input) > 0
    return SourceStats(
        vocabulary=segmentation.vocabulary,
        pieces=pieces,
        pieces_per_word=_ratio(pieces, words),
        pieces_per_instance=_ratio(pieces, sample.n_inputs),
        instance_pieces_median=float(np.median(per_input)) if has_inputs else 0.0,
        instance_pieces_p95=float(np.percentile(per_input, 95)) if has_inputs else 0.0,
        instance_pieces_max=int(per_input.max()) if has_inputs else 0,
        length_instances=sample.sampled_inputs,
        length_sampled=sample.sampled_inputs < sample.n_inputs,
        whole_words=histogram["1"],
        whole_fraction=_ratio(histogram["1"], words),
        distinct_whole_fraction=_ratio(int(whole.sum()), len(sample.words)),
        unk_words=histogram["[UNK]"],
        unk_rate=_ratio(histogram["[UNK]"], words),
        erased_words=int(counts[lengths == 0].sum()),
        inputs_over={str(n): _ratio(int((per_input + 2 > n).sum()), len(per_input)) for n in MAX_LENGTHS},
        piece_histogram={bucket: _ratio(histogram[bucket], words) for bucket in PIECE_BUCKETS},
    )


@dataclass(frozen=True)
class ShatteredWord:
    """A word as both vocabularies see it: ``word`` its most frequent form, ``variants`` its other forms
    (``Cats`` beside ``cats`` where both vocabularies lowercase), ``count`` the occurrences of them all."""

    word: str
    count: int
    pieces: tuple[str, ...]
    variants: tuple[str, ...] = ()


@dataclass(frozen=True)
class ShatteredWords:
    """Words ``shattered_by`` splits into at least ``min_pieces`` pieces while ``kept_whole_by``
    keeps them whole: how many (distinct, occurrences) and the ``top`` most frequent."""

    shattered_by: str
    kept_whole_by: str
    min_pieces: int
    distinct_words: int
    occurrences: int
    occurrence_fraction: float
    top: tuple[ShatteredWord, ...]


def shattered_words(sample: WordSample, shattering: Segmentation, keeping: Segmentation,
                    min_pieces: int = 2, top: int = 20) -> ShatteredWords:
    """The words ``shattering`` splits into ``>= min_pieces`` pieces and ``keeping`` keeps whole,
    most frequent first (ties by word). Words that both vocabularies segment alike are one word to
    them (``Cats`` and ``cats`` when both lowercase): one entry, counted together, so that a word is
    neither listed twice nor ranked by a share of its occurrences."""
    if min_pieces < 2:
        raise ValueError(f"min_pieces must be at least 2 (a word in one piece is not shattered), got {min_pieces}")
    mask = ((shattering.lengths >= min_pieces) & ~shattering.unknown
            & (keeping.lengths == 1) & ~keeping.unknown)
    chosen = np.flatnonzero(mask)
    counts, words = sample.counts, sample.words
    groups: dict[tuple, list[int]] = {}  # pieces in both: the word as the two vocabularies see it
    for i in chosen.tolist():
        groups.setdefault((shattering.pieces[i], keeping.pieces[i]), []).append(i)
    entries = []
    for members in groups.values():
        # most frequent form first, then the one lowercasing leaves alone, then by spelling
        members.sort(key=lambda i: (-int(counts[i]), words[i] != words[i].lower(), words[i]))
        entries.append((int(counts[members].sum()), members))
    entries.sort(key=lambda entry: (-entry[0], words[entry[1][0]]))
    occurrences = int(counts[chosen].sum())
    return ShatteredWords(
        shattered_by=shattering.vocabulary, kept_whole_by=keeping.vocabulary, min_pieces=min_pieces,
        distinct_words=len(groups), occurrences=occurrences,
        occurrence_fraction=_ratio(occurrences, sample.n_words),
        top=tuple(ShatteredWord(words[m[0]], count, shattering.pieces[m[0]], tuple(words[i] for i in m[1:]))
                  for count, m in entries[:max(top, 0)]))


# ------------------------------------------------------------------------------------ overlap

@dataclass(frozen=True)
class VocabularyOverlap:
    a: str
    b: str
    size_a: int
    size_b: int
    shared: int
    jaccard: float
    a_covered_by_b: float   # share of a's tokens that b also has
    b_covered_by_a: float


def vocabulary_overlap(a: str, tokens_a: frozenset[str] | set[str], b: str,
                       tokens_b: frozenset[str] | set[str]) -> VocabularyOverlap:
    """Count and Jaccard of the shared tokens, and how much of each set the other covers (two empty
    sets are identical: 1.0)."""
    shared = len(tokens_a & tokens_b)
    union = len(tokens_a | tokens_b)
    return VocabularyOverlap(a=a, b=b, size_a=len(tokens_a), size_b=len(tokens_b), shared=shared,
                             jaccard=_ratio(shared, union) if union else 1.0,
                             a_covered_by_b=_ratio(shared, len(tokens_a)) if tokens_a else 1.0,
                             b_covered_by_a=_ratio(shared, len(tokens_b)) if tokens_b else 1.0)


# ------------------------------------------------------------------------------------- report

@dataclass(frozen=True)
class ReportSettings:
    min_pieces: int = 2             # a word is shattered at this many pieces or more
    top_words: int = 20             # rows of each shattered-words table
    max_instances: int | None = None  # model inputs read per source; None reads everything

    def __post_init__(self) -> None:
        if self.min_pieces < 2:
            raise InputError(f"min_pieces must be at least 2, got {self.min_pieces}")
        if self.top_words < 0:
            raise InputError(f"top_words must be 0 or more, got {self.top_words}")
        if self.max_instances is not None and self.max_instances < 1:
            raise InputError(f"max_instances must be at least 1, got {self.max_instances}")


@dataclass(frozen=True)
class SourceReport:
    """One source in the report; ``instance`` says what one model input is and ``instances`` how many
    were read (report.json's keys)."""

    name: str
    kind: str
    path: str
    instance: str
    files: tuple[DatasetFile, ...]
    skipped: tuple[str, ...]
    capped: bool
    instances: int
    words: int
    distinct_words: int
    stats: tuple[SourceStats, ...]
    shattered: tuple[ShatteredWords, ...]

    def stats_for(self, vocabulary: str) -> SourceStats:
        return next(s for s in self.stats if s.vocabulary == vocabulary)


@dataclass(frozen=True)
class CoverageReport:
    settings: ReportSettings
    vocabularies: tuple[VocabularyInfo, ...]
    terms: TermTable | None
    overlaps: tuple[VocabularyOverlap, ...]
    sources: tuple[SourceReport, ...]
    word_definition: str = WORD_DEFINITION
    definitions: Mapping[str, str] = field(default_factory=lambda: dict(DEFINITIONS))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def analyse_sample(sample: WordSample, vocabularies: Sequence[Vocabulary], settings: ReportSettings,
                   on_segmented: Callable[[int], None] | None = None,
                   ) -> tuple[tuple[SourceStats, ...], tuple[ShatteredWords, ...]]:
    """Statistics per vocabulary and shattered words for every ordered pair of vocabularies;
    ``on_segmented`` is told of the words segmented, batch after batch (see :func:`segment_sample`)."""
    segmentations = [segment_sample(v, sample, on_segmented) for v in vocabularies]
    stats = tuple(source_statistics(sample, s) for s in segmentations)
    shattered = tuple(shattered_words(sample, a, b, settings.min_pieces, settings.top_words)
                      for a, b in permutations(segmentations, 2))
    return stats, shattered


#: With progress shown, a dataset whose files hold at most this many bytes is parsed whole before its words are
#: counted, its number of model inputs the bar's total (BLURB's largest file is a few MB; the texts are held).
COUNTED_DATASET_BYTES = 64 << 20


def expected_inputs(source: Source, max_inputs: int | None = None) -> int | None:
    """How many model inputs reading ``source`` will give, where that is cheap to know (a dataset of
    at most :data:`COUNTED_DATASET_BYTES`, a prepared corpus's row count, the ``max_inputs`` cap);
    None where only reading the source would tell (raw corpus files)."""
    known = _known_input_count(source, max_inputs)
    if max_inputs is None:
        return known
    return max_inputs if known is None else min(known, max_inputs)


def _known_input_count(source: Source, max_inputs: int | None) -> int | None:
    """The number of ``source``'s model inputs (up to ``max_inputs``), or None where it is costly or
    cannot be had: the count never fails, the read that follows reports what is wrong with the source
    (and only if it gets that far: a cap may stop it before a damaged line)."""
    try:
        if _countable_dataset(source):
            return sum(1 for _ in islice(source.texts(), max_inputs))
        if is_prepared_corpus(source.path):
            from datasets import load_from_disk

            return load_from_disk(source.path).num_rows  # memory-mapped: no row is read
    except (OSError, ValueError):  # InputError and DatasetFormatError are ValueErrors
        return None
    return None


def _countable_dataset(source: Source) -> bool:
    """A dataset whose files hold at most :data:`COUNTED_DATASET_BYTES`: cheap to count (and to hold) before
    it is read."""
    try:
        return source.kind == DATASET and sum(os.path.getsize(f.path) for f in source.files) <= COUNTED_DATASET_BYTES
    except OSError:  # a file gone since the source was listed: the read names it
        return False


def _progress_bar(show: bool, **options: Any):
    """A tqdm bar on stderr, or one that shows nothing. It is cleared when closed: the summary line
    logged after each source keeps the counts and the time."""
    from tqdm.auto import tqdm

    return tqdm(disable=not show, leave=False, **options)


def read_source(source: Source, max_inputs: int | None = None, progress: bool = False) -> WordSample:
    """Count the words of ``source``'s model inputs (:func:`count_words`), shown by a bar of inputs read."""
    texts, total = None, None
    if progress and _countable_dataset(source):
        # parsed once, held (at most COUNTED_DATASET_BYTES of files): its length is the bar's total;
        # one text past the cap, which count_words reads to tell whether the source held more
        texts = list(islice(source.texts(), None if max_inputs is None else max_inputs + 1))
        total = len(texts) if max_inputs is None else min(len(texts), max_inputs)
    elif progress:
        total = expected_inputs(source, max_inputs)
    with _progress_bar(progress, desc=f"{source.name}: reading", unit="input", total=total) as bar:
        # count_words reads one input past the cap to tell whether the source held more: not shown
        return count_words(_shown(source.inputs(texts), bar, max_inputs), max_inputs)


def _shown(inputs: Iterable[Sequence[str]], bar: Any, limit: int | None) -> Iterable[Sequence[str]]:
    """The inputs, each counted on ``bar`` up to ``limit``."""
    for read, words in enumerate(inputs, start=1):
        if limit is None or read <= limit:
            bar.update()
        yield words


def source_report(source: Source, vocabularies: Sequence[Vocabulary], settings: ReportSettings,
                  progress: bool = False) -> SourceReport:
    """One source's statistics; ``progress`` shows bars on stderr while its inputs are read and its
    distinct words segmented."""
    started = time.perf_counter()
    sample = read_source(source, settings.max_instances, progress)
    if sample.n_inputs == 0:
        raise InputError(f"{source.kind} {source.name!r}: no model input read from {source.path}")
    with _progress_bar(progress, desc=f"{source.name}: segmenting", unit="word",
                       total=len(sample.words) * len(vocabularies)) as bar:
        stats, shattered = analyse_sample(sample, vocabularies, settings, bar.update)
    LOG.info("%s: %s model inputs, %s words, %s distinct (%.1f s)", source.name, f"{sample.n_inputs:,}",
             f"{sample.n_words:,}", f"{len(sample.words):,}", time.perf_counter() - started)
    return SourceReport(name=source.name, kind=source.kind, path=source.path, instance=source.model_input,
                        files=source.files, skipped=source.skipped, capped=sample.capped,
                        instances=sample.n_inputs, words=sample.n_words, distinct_words=len(sample.words),
                        stats=stats, shattered=shattered)


def build_report(vocabularies: Sequence[Vocabulary], sources: Sequence[Source] = (),
                 terms: Sequence[Term] = (), terms_source: str = "",
                 settings: ReportSettings = ReportSettings(), progress: bool = False) -> CoverageReport:
    """Compare ``vocabularies`` on a term list and on each source; ``progress`` shows tqdm bars on
    stderr while each source is read and segmented (see :func:`source_report`)."""
    if not vocabularies:
        raise InputError("no tokenizer to report on")
    for what, names in (("tokenizer", [v.name for v in vocabularies]), ("source", [s.name for s in sources])):
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise InputError(f"{what} name(s) used twice: {', '.join(duplicates)}")
    if terms and TERMS_PLOT_KEY in {s.name for s in sources}:  # report.json's plots map keys both by name
        raise InputError(f"source name {TERMS_PLOT_KEY!r} is the term table's in the report: name the source "
                         f"otherwise ({TERMS_PLOT_KEY}2=PATH)")
    return CoverageReport(
        settings=settings,
        vocabularies=tuple(v.info for v in vocabularies),
        terms=term_table(terms, vocabularies, terms_source) if terms else None,
        overlaps=tuple(vocabulary_overlap(a.name, a.tokens, b.name, b.tokens)
                       for a, b in combinations(vocabularies, 2)),
        sources=tuple(source_report(s, vocabularies, settings, progress) for s in sources),
    )


# ---------------------------------------------------------------------------------- rendering

def _cell(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _code(text: str) -> str:
    """A Markdown code span that survives backticks and table pipes."""
    fence = "``" if "`" in text else "`"
    pad = " " if fence == "``" else ""
    return f"{fence}{pad}{text.replace('|', chr(92) + '|')}{pad}{fence}"


def _table(header: Sequence[str], rows: Iterable[Sequence[str]], align: str = "") -> list[str]:
    """A GitHub Markdown table; ``align`` holds 'l' or 'r' per column (default: first l, rest r)."""
    align = align or "l" + "r" * (len(header) - 1)
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines + [""]


def _pieces(pieces: Sequence[str]) -> str:
    return _code(" ".join(pieces)) if pieces else "(nothing)"


def _relative(value: float, baseline: float) -> str:
    return f" ({(value / baseline - 1):+.1%})" if baseline else ""


def render_markdown(report: CoverageReport, plots: Mapping[str, str] | None = None) -> str:
    """``report.md``: the tables a person reads. ``plots`` maps a source name (or ``"terms"``) to
    the image file shown with it."""
    plots = plots or {}
    names = [v.name for v in report.vocabularies]
    out: list[str] = ["# Vocabulary coverage report", ""]
    out += [f"Vocabularies compared: {', '.join(_code(n) for n in names)}. "
            "Definitions are at the end of this report; every number is also in `report.json`.", ""]
    out += _vocabularies_section(report.vocabularies)
    if report.terms is not None:
        out += _terms_section(report.terms, names, plots.get(TERMS_PLOT_KEY))
    if report.sources:
        out += _lengths_section(report.sources, names)
    if report.overlaps:
        out += _overlap_section(report.overlaps)
    for source in report.sources:
        out += _source_section(source, names, plots.get(source.name))
    out += _definitions_section(report)
    return "\n".join(out)


def _vocabularies_section(vocabularies) -> list[str]:
    out = ["## Vocabularies", ""]
    out += _table(["name", "format", "tokens", "casing", "casing from", "source"],
                  ([_code(v.name), v.format, f"{v.size:,}", "uncased" if v.lowercase else "cased",
                    _cell(v.casing_source), f"{_code(v.path)} ({v.kind})"] for v in vocabularies), "llrlll")
    for v in vocabularies:
        out += [f"- **{v.name}**: {_cell(note)}" for note in v.notes]
    if any(v.notes for v in vocabularies):
        out.append("")
    return out


def _terms_section(table, names: list[str], plot: str | None) -> list[str]:
    out = ["## Biomedical terms (the paper's Table 1)", ""]
    out += [f"Terms from {_code(table.source)}. ✓: the term is a single token of the vocabulary "
            "(kept whole); otherwise the word pieces it is split into.", ""]
    rows = [[_cell(r.term), _cell(r.category or ""),
             *["✓" if r.whole[n] else _pieces(r.pieces[n]) for n in names]] for r in table.rows]
    rows.append(["**kept whole**", "", *[f"**{table.whole_counts[n]}/{len(table.rows)}**" for n in names]])
    out += _table(["term", "category", *map(_code, names)], rows, "ll" + "l" * len(names))
    if plot:
        out += [f"![word pieces per term]({plot})", ""]
    return out


def _lengths_section(sources, names: list[str]) -> list[str]:
    """Input length per source and vocabulary (Table 8), then pieces per word, whole words, [UNK]."""
    baseline = names[0]
    out = ["## Average input length in word pieces (the paper's Table 8)", ""]
    out += [f"Mean word pieces per model input, without [CLS]/[SEP]; in parentheses the change against "
            f"{_code(baseline)}.", ""]
    rows = []
    for s in sources:
        base = s.stats_for(baseline).pieces_per_instance
        rows.append([_cell(s.name), _cell(s.instance), *[
            f"{s.stats_for(n).pieces_per_instance:.1f}" + (_relative(s.stats_for(n).pieces_per_instance, base)
                                                           if n != baseline else "") for n in names]])
    out += _table(["source", "model input", *map(_code, names)], rows, "ll" + "r" * len(names))
    for title, metric, fmt in (("Word pieces per word", "pieces_per_word", "{:.3f}"),
                               ("Words kept whole (share of word occurrences)", "whole_fraction", "{:.1%}"),
                               ("[UNK] rate (share of word occurrences)", "unk_rate", "{:.2%}")):
        out += [f"### {title}", ""]
        out += _table(["source", *map(_code, names)],
                      ([_cell(s.name), *[fmt.format(getattr(s.stats_for(n), metric)) for n in names]]
                       for s in sources))
    out += [f"### Inputs longer than {_max_lengths()} positions (share of model inputs)", "",
            "With [CLS] and [SEP] added: the inputs a model of that maximum length truncates "
            "(of a uniform sample where a source says so in its section).", ""]
    out += _table(["source", *map(_code, names)],
                  ([_cell(s.name), *[_shares_over(s.stats_for(n)) for n in names]] for s in sources))
    return out


def _overlap_section(overlaps) -> list[str]:
    out = ["## Vocabulary overlap", ""]
    out += ["Reserved tokens ([PAD], [unused0], ...) left out; \"A in B\" is the share of A's tokens "
            "that B also has.", ""]
    out += _table(["A", "B", "tokens A", "tokens B", "shared", "Jaccard", "A in B", "B in A"],
                  ([_code(o.a), _code(o.b), f"{o.size_a:,}", f"{o.size_b:,}", f"{o.shared:,}",
                    f"{o.jaccard:.3f}", f"{o.a_covered_by_b:.1%}", f"{o.b_covered_by_a:.1%}"]
                   for o in overlaps), "llrrrrrr")
    return out


def _source_section(s, names: list[str], plot: str | None) -> list[str]:
    """One source: where it was read from, its statistics per vocabulary, the shattered words."""
    out = [f"## Source: {_cell(s.name)}", "", f"- {s.kind}: {_code(s.path)}"]
    out += [f"  - {_code(f.path)} (format {_code(f.format)})" for f in s.files]
    out += [f"  - skipped {_cell(skipped)}" for skipped in s.skipped]
    out += [f"- model input: {_cell(s.instance)}",
            f"- {s.instances:,} model inputs{' (capped by the per-source limit)' if s.capped else ''}, "
            f"{s.words:,} words, {s.distinct_words:,} distinct words", ""]
    out += _table(["statistic", *map(_code, names)], _source_statistics({n: s.stats_for(n) for n in names}))
    if plot:
        out += [f"![word pieces per word: {_cell(s.name)}]({plot})", ""]
    for sh in s.shattered:
        out += _shattered_section(sh)
    return out


def _max_lengths() -> str:
    return " / ".join(map(str, MAX_LENGTHS))


def _shares_over(stat: SourceStats) -> str:
    return " / ".join(f"{stat.inputs_over[str(n)]:.1%}" for n in MAX_LENGTHS)


def _length_sample_note(stat: Mapping[str, Any]) -> str:
    first = next(iter(stat.values()), None)
    return f", of a uniform sample of {first.length_instances:,} inputs" if first and first.length_sampled else ""


def _source_statistics(stat: Mapping[str, Any]) -> list[list[str]]:
    names = list(stat)
    rows = [
        ["word pieces", *[f"{stat[n].pieces:,}" for n in names]],
        ["pieces per word", *[f"{stat[n].pieces_per_word:.3f}" for n in names]],
        ["pieces per input (mean)", *[f"{stat[n].pieces_per_instance:.1f}" for n in names]],
        ["pieces per input (median / p95 / max" + _length_sample_note(stat) + ")",
         *[f"{stat[n].instance_pieces_median:g} / {stat[n].instance_pieces_p95:.1f} / "
           f"{stat[n].instance_pieces_max:,}" for n in names]],
        [f"inputs over {_max_lengths()} positions ([CLS] + pieces + [SEP]{_length_sample_note(stat)})",
         *[_shares_over(stat[n]) for n in names]],
        ["words kept whole (1 piece)", *[f"{stat[n].whole_fraction:.1%}" for n in names]],
        ["distinct words kept whole", *[f"{stat[n].distinct_whole_fraction:.1%}" for n in names]],
        ["words → [UNK]", *[f"{stat[n].unk_words:,} ({stat[n].unk_rate:.2%})" for n in names]],
    ]
    rows += [[f"words in {bucket} pieces", *[f"{stat[n].piece_histogram[bucket]:.1%}" for n in names]]
             for bucket in PIECE_BUCKETS if bucket not in ("[UNK]", "1")]
    if any(stat[n].erased_words for n in names):
        rows.append(["words erased by normalization", *[f"{stat[n].erased_words:,}" for n in names]])
    return rows


def _shattered_section(sh) -> list[str]:
    out = [f"### Words {_code(sh.shattered_by)} shatters but {_code(sh.kept_whole_by)} keeps whole", ""]
    out += [f"{sh.distinct_words:,} distinct words, {sh.occurrences:,} occurrences "
            f"({sh.occurrence_fraction:.1%} of all words) are split into ≥ {sh.min_pieces} pieces by "
            f"{_code(sh.shattered_by)} and are a single token of {_code(sh.kept_whole_by)}; forms that both "
            "segment alike (`Cats`, `cats` when both lowercase) are one word."
            + (" The most frequent:" if sh.top else ""), ""]
    if sh.top:
        out += _table(["word", "count", f"pieces in {_code(sh.shattered_by)}"],
                      ([_word_and_variants(w), f"{w.count:,}", _pieces(w.pieces)] for w in sh.top), "lrl")
    return out


def _word_and_variants(word: ShatteredWord, shown: int = 3) -> str:
    if not word.variants:
        return _code(word.word)
    more = f", {len(word.variants) - shown:,} more" if len(word.variants) > shown else ""
    return f"{_code(word.word)} (also {', '.join(_code(v) for v in word.variants[:shown])}{more})"


def _definitions_section(report: CoverageReport) -> list[str]:
    out = ["## Definitions", "", f"- **word**: {WORD_DEFINITION}"]
    out += [f"- **{key.replace('_', ' ')}**: {text}" for key, text in report.definitions.items()]
    out += [f"- **settings**: shattered at ≥ {report.settings.min_pieces} pieces; top "
            f"{report.settings.top_words} words per table; "
            + (f"at most {report.settings.max_instances:,} model inputs per source."
               if report.settings.max_instances else "every model input of every source read."), ""]
    return out


# ------------------------------------------------------------------------------------- plots

def _figure(width: float, height: float):
    """A matplotlib figure on the Agg canvas, without pyplot (no global backend state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _grouped_bars(ax, labels: Sequence[str], series: Mapping[str, Sequence[float]]) -> None:
    width = 0.8 / max(len(series), 1)
    positions = np.arange(len(labels))
    for i, (name, values) in enumerate(series.items()):
        ax.bar(positions + (i - (len(series) - 1) / 2) * width, values, width, label=name)
    ax.set_xticks(positions, labels)
    ax.legend()
    ax.grid(axis="y", alpha=0.3)


def plot_piece_distribution(source: SourceReport, path: str | os.PathLike) -> Path:
    """Grouped bars: the share of word occurrences in 1, 2, 3, 4, 5+ pieces (and [UNK]) per vocabulary."""
    figure = _figure(7.5, 4.2)
    ax = figure.add_subplot()
    series = {f"{s.vocabulary} ({s.pieces_per_word:.2f} pieces/word)":
              [100 * s.piece_histogram[b] for b in PIECE_BUCKETS] for s in source.stats}
    _grouped_bars(ax, list(PIECE_BUCKETS), series)
    ax.set_xlabel("word pieces per word")
    ax.set_ylabel("% of word occurrences")
    ax.set_title(f"{source.name}: {source.words:,} words in {source.instances:,} model inputs")
    figure.savefig(path, dpi=120, format="png")  # whatever the suffix: write_report renders to a temporary name
    return Path(path)


def plot_term_pieces(table: TermTable, path: str | os.PathLike) -> Path:
    """Grouped bars: the number of pieces of each term under each vocabulary (1 = whole)."""
    names = list(table.whole_counts)
    figure = _figure(max(7.0, 0.45 * len(table.rows) * max(len(names), 1) ** 0.5 + 2), 4.5)
    ax = figure.add_subplot()
    series = {f"{n} ({table.whole_counts[n]}/{len(table.rows)} whole)": [len(r.pieces[n]) for r in table.rows]
              for n in names}
    _grouped_bars(ax, [r.term for r in table.rows], series)
    ax.tick_params(axis="x", labelrotation=60)
    ax.set_ylabel("word pieces")
    ax.set_title("Word pieces per term")
    figure.savefig(path, dpi=120, format="png")  # whatever the suffix: write_report renders to a temporary name
    return Path(path)


# ------------------------------------------------------------------------------------ writing

@dataclass(frozen=True)
class ReportFiles:
    markdown: Path
    json: Path
    plots: tuple[Path, ...]
    removed: tuple[Path, ...] = ()  # plots of an earlier report in the folder that this one has not


REPORT_MARKDOWN = "report.md"
REPORT_JSON = "report.json"
TERMS_PLOT = "terms_pieces.png"
TERMS_PLOT_KEY = "terms"  # the term table's entry in report.json's plots map, beside the sources' names
#: The names write_report gives its plots (the terms plot, one plot per source): only files so named
#: are ever removed from a report folder, whatever an earlier report.json lists.
OWN_PLOT = re.compile(r"(terms_pieces|pieces_per_word_[A-Za-z0-9._-]+)\.png\Z")


def _file_stem(name: str, taken: set[str]) -> str:
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "source"
    candidate, n = stem, 2
    while candidate in taken:
        candidate, n = f"{stem}_{n}", n + 1
    taken.add(candidate)
    return candidate


def source_plot_names(sources: Sequence[SourceReport]) -> list[str]:
    """The file name of each source's plot, in order, each its own (:data:`OWN_PLOT`)."""
    taken: set[str] = set()
    return [f"pieces_per_word_{_file_stem(source.name, taken)}.png" for source in sources]


def previous_plots(output_dir: str | os.PathLike) -> set[str]:
    """The plots an earlier report wrote into ``output_dir``: those its report.json lists or, without a
    report.json that lists them, the files named as the report names its plots (:data:`OWN_PLOT`)."""
    out = Path(output_dir)
    try:
        recorded = json.loads((out / REPORT_JSON).read_text(encoding="utf-8")).get("plots")
    except (OSError, ValueError, AttributeError):  # none, unreadable, or not a JSON object
        recorded = None
    if isinstance(recorded, dict):
        return {name for name in recorded.values() if isinstance(name, str) and OWN_PLOT.match(name)}
    return {path.name for path in out.iterdir() if OWN_PLOT.match(path.name)} if out.is_dir() else set()


class _StagedFiles:
    """Files written under temporary names in one folder and moved into place together
    (:meth:`publish`, in the order they were staged): a report interrupted while it renders leaves
    the earlier report whole, with no half-written file; temporary files left unpublished are removed."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.staged: list[tuple[Path, Path]] = []  # (temporary, final)

    def path_for(self, name: str) -> Path:
        """Where to write the file that will be published as ``name``."""
        temporary = self.folder / f".{name}.partial"
        self.staged.append((temporary, self.folder / name))
        return temporary

    def write_text(self, name: str, text: str) -> None:
        self.path_for(name).write_text(text, encoding="utf-8")

    def publish(self) -> None:
        for temporary, final in self.staged:
            os.replace(temporary, final)

    def __enter__(self) -> "_StagedFiles":
        return self

    def __exit__(self, *exc: object) -> None:
        for temporary, _ in self.staged:
            temporary.unlink(missing_ok=True)


def _remove_plots(folder: Path, names: Iterable[str]) -> tuple[Path, ...]:
    """Remove the named plots from ``folder``; a name that is not a plot's (:data:`OWN_PLOT`), or
    not a file there, is left alone."""
    removed = []
    for name in sorted(names):
        path = folder / name
        if OWN_PLOT.match(name) and path.is_file():
            path.unlink()
            removed.append(path)
    return tuple(removed)


def write_report(report: CoverageReport, output_dir: str | os.PathLike) -> ReportFiles:
    """Write ``report.md``, ``report.json`` and the PNG plots into ``output_dir``, and remove the plots
    an earlier report wrote there that this one has not (sources no longer reported on), so that the
    folder holds one report. Other files in the folder are left alone."""
    out = Path(output_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise InputError(f"cannot create the report folder {out}: {err.strerror or err}") from err
    earlier = previous_plots(out)
    terms_plots = [TERMS_PLOT] if report.terms is not None else []
    source_plots = source_plot_names(report.sources)
    plots = {TERMS_PLOT_KEY: TERMS_PLOT} if report.terms is not None else {}  # what report.md and .json show
    plots.update((source.name, name) for source, name in zip(report.sources, source_plots))
    data = report.to_dict()
    data["plots"] = plots
    with _StagedFiles(out) as staged:
        if report.terms is not None:
            plot_term_pieces(report.terms, staged.path_for(TERMS_PLOT))
        for source, name in zip(report.sources, source_plots):
            plot_piece_distribution(source, staged.path_for(name))
        # report.md last: it never shows a plot that is not in place yet
        staged.write_text(REPORT_JSON, json.dumps(data, indent=2, ensure_ascii=False) + "\n")
        staged.write_text(REPORT_MARKDOWN, render_markdown(report, plots))
        staged.publish()
    removed = _remove_plots(out, earlier - {*terms_plots, *source_plots})
    return ReportFiles(markdown=out / REPORT_MARKDOWN, json=out / REPORT_JSON,
                       plots=tuple(out / name for name in terms_plots + source_plots), removed=removed)
