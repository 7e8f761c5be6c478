"""Building and writing pretraining instances: a prepared corpus and a tokenizer in, MLM instances
with a pair objective on disk out (:func:`create_pretraining_data`, behind
``launch/create_pretraining_data.py``).

This is BERT's ``create_pretraining_data.py`` re-implemented for ``datasets`` and fast tokenizers,
without the masking; which sentences make each instance is decided by the pure recipe in
:mod:`pretrain.instance_recipe`, and the format written is :mod:`pretrain.data`'s. Instances are
written in corpus order, not shuffled as in Google's code: the trainer reads them through a seeded
permutation (:mod:`pretrain.sampler`), which shuffles them anyway, every epoch anew.

Two ``datasets.map(batched=True, num_proc=...)`` stages. Stage 1 tokenizes the corpus once: all
sentences of a batch of documents in one fast-tokenizer call (text that spells a special token,
such as a literal "[SEP]", is tokenized as text, so the only [CLS] and [SEP] ids are the ones added
here), stored as token ids per sentence (2 bytes each for BERT-sized vocabularies). Stage 2 builds
the instances from those ids; a B from another document is read by index from the memory-mapped
tokenized corpus inside the worker, so no text is tokenized twice and no token is touched one by
one in Python. Every document's random choices come from its own generator,
``numpy.random.default_rng([seed, document, dupe])``, so the output depends on the corpus, the
tokenizer, the options and the seed, never on ``num_proc`` or the batch size; cross-document packs
stay inside groups of :data:`PACK_GROUP` documents for the same reason. DRP's links are resolved to
corpus rows once (:func:`build_link_index`) and memory-mapped by the workers. Both stages are cached
under fingerprints of what they depend on (a killed multi-process run reuses the finished worker
shards); ``tokenized_cache`` keeps stage 1 for the next run, so phase 2 (512 tokens) reuses the
tokenization of phase 1 (128). The instances are saved in Arrow shards of ``max_shard_size``, then
``pretraining_data.json`` is written with the options, the vocabulary, a summary and the name and
size of each saved file (a rerun finding one missing or resized calls the data damaged, not complete),
and the caches inside ``output_dir`` are removed. A ``mixture`` of several corpora (:mod:`pretrain.mixture`)
may replace ``corpus``; the metadata then records it.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from biomed_lm.atomic_files import write_json_atomically
from biomed_lm.finished_output import (changed_files, damaged_file_lines, damaged_output_message, dataclass_defaults,
                                       file_identity, other_output_message, read_record, saved_files_record,
                                       setting_change_lines, shard_size_problem)
from biomed_lm.pretrain.data import (DOCUMENT_COLUMN, FORMAT_VERSION, INSTANCE_SCHEMA, METADATA_FILE,
                                     load_tokenizer_or_fail, pair_task_of, vocabulary_fingerprint)
from biomed_lm.pretrain.instance_recipe import (LINKED_DOCUMENT, NO_PAIR_LABEL, NOT_NEXT, PAIR_LABELS,
                                                RANDOM_DOCUMENT, InstancePlan, Packing, PairTask,
                                                continuation_end, continuation_start, pack_documents, plan_document,
                                                truncation_cuts, word_boundary_markers, word_start_rule,
                                                word_start_table)
from biomed_lm.pretrain.prepared_corpus import PretrainingDataError, files_identity, open_corpus
from biomed_lm.run_lock import ARTIFACT_LOCK_FILE, acquire_run_lock
from biomed_lm.worker_lifetime import workers_die_with_this_process

WORK_DIR = "_work"
TOKENIZED_COLUMN = "sentence_ids"  # the tokenized corpus: per document, its usable sentences' token ids
PACK_GROUP = 256  # cross-document packs never span two groups of this many documents: output independent of batching


# ----------------------------------------------------------------------------- options

@dataclass
class PretrainingDataConfig:
    """Options of ``launch/create_pretraining_data.py`` (YAML keys and ``--flags`` alike)."""

    corpus: str = field(default="", metadata={
        "help": "prepared corpus directory (launch/prepare_corpus.py output: a dataset with a 'sentences' column); "
                "give this or mixture"})
    mixture: dict[str, Any] | None = field(default=None, metadata={
        "help": "several prepared corpora instead of corpus: {name: {corpus: DIR, weight: W}} (documents drawn at "
                "the normalized weights; by default the largest-share input once, the others to their share) or "
                "{name: {corpus: DIR, epochs: E}} (round(E x size) documents each); see pretrain/mixture.py"})
    mixture_documents: int = field(default=0, metadata={
        "help": "with a weighted mixture: its total documents (0: the largest-share input drawn once)", "min": 0})
    tokenizer: str = field(default="", metadata={"help": "tokenizer directory or vocab.txt (launch/build_vocab.py)"})
    output_dir: str = field(default="", metadata={"help": "where the instances and pretraining_data.json go"})
    max_seq_length: int = field(default=128, metadata={
        "help": "tokens per instance, [CLS]/[SEP] included (the paper: 128 in phase 1, then 512)", "min": 5})
    short_seq_prob: float = field(default=0.1, metadata={
        "help": "probability that an instance gets a random shorter target length in [2, max]",
        "min": 0, "max": 1})
    pair_task: PairTask = field(default="nsp", metadata={
        "help": "the A/B pair objective: nsp (BERT: B continues A or comes from another document), sop "
                "(ALBERT: two consecutive segments, swapped half the time), drp (LinkBERT: B contiguous, from a "
                "random document or from a document A's cites, a third each; the corpus needs links), none "
                "(one segment, MLM only)"})
    packing: Packing = field(default="document", metadata={
        "help": "with pair_task none: document (an instance never leaves its document) or cross-document "
                "(RoBERTa's full sentences: sentences packed up to the length across document ends, [SEP] "
                "between documents)"})
    dupe_factor: int = field(default=1, metadata={
        "help": "pass over each document this many times, each with other A/B pairings (masks are drawn "
                "at training time, so duplicates are not needed for new masks)", "min": 1})
    seed: int = field(default=12345, metadata={
        "help": "seed of every random choice (output is identical for a seed)", "min": 0})
    num_proc: int = field(default=0, metadata={"help": "worker processes (0: all CPU cores)", "min": 0})
    batch_size: int = field(default=256, metadata={
        "help": "documents tokenized together in one call (memory per worker grows with it)", "min": 1})
    tokenized_cache: str = field(default="", metadata={
        "help": "folder that keeps the tokenized corpus for later runs with the same corpus and tokenizer "
                "(phase 2 reuses phase 1's tokenization); default: inside output_dir, removed when done"})
    max_shard_size: str = field(default="500MB", metadata={
        "help": "size of each saved Arrow shard: a whole number and a unit (KB, MB, GB or KiB, MiB, GiB, ...)"})
    overwrite: bool = field(default=False, metadata={"help": "replace pretraining data already in output_dir"})

    def __post_init__(self) -> None:
        _check_shard_size(self.max_shard_size)  # here: save_to_disk reads it only once every instance is built

    def workers(self) -> int:
        return self.num_proc if self.num_proc > 0 else (os.cpu_count() or 1)

    def validate(self) -> None:
        if bool(self.corpus) == bool(self.mixture):
            raise PretrainingDataError(("no corpus given (--corpus, or a mixture)" if not self.corpus else
                                        "give exactly one of corpus or mixture, not both"))
        if self.mixture_documents and not self.mixture:
            raise PretrainingDataError("mixture_documents needs a mixture (it sets a weighted mixture's size)")
        for name in ("tokenizer", "output_dir"):
            if not getattr(self, name):
                raise PretrainingDataError(f"no {name} given (--{name.replace('_', '-')})")
        if self.max_seq_length < 5:
            raise PretrainingDataError(f"max_seq_length {self.max_seq_length} is too short: an instance needs "
                                       "[CLS], [SEP] and at least one token per segment (5 or more)")
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise PretrainingDataError(f"short_seq_prob must be in [0, 1], not {self.short_seq_prob}")
        if self.dupe_factor < 1:
            raise PretrainingDataError(f"dupe_factor must be at least 1, not {self.dupe_factor}")
        if self.batch_size < 1:
            raise PretrainingDataError(f"batch_size must be at least 1, not {self.batch_size}")
        if self.seed < 0:
            raise PretrainingDataError(f"seed must be non-negative (numpy seeds), not {self.seed}")
        if self.packing == "cross-document" and self.pair_task != "none":
            raise PretrainingDataError(f"packing 'cross-document' makes one-segment instances: it needs pair_task "
                                       f"none, not {self.pair_task!r}")
        _check_shard_size(self.max_shard_size)  # again: a caller may have set it after construction


def _check_shard_size(size: str) -> None:
    """Refuse a ``max_shard_size`` that ``save_to_disk`` would refuse (``abc``) or divide by (``0MB``)."""
    problem = shard_size_problem(size)
    if problem:
        raise PretrainingDataError(problem)


@dataclass(frozen=True)
class RecipeOptions:
    """The options that decide the instances (and so the cache fingerprint)."""

    max_seq_length: int
    short_seq_prob: float
    pair_task: str
    dupe_factor: int
    seed: int
    packing: str = "document"

    @property
    def max_num_tokens(self) -> int:
        """Tokens left for text once [CLS] and the [SEP]s are in."""
        return self.max_seq_length - (2 if self.pair_task == "none" else 3)

    @classmethod
    def from_config(cls, config: PretrainingDataConfig) -> "RecipeOptions":
        return cls(config.max_seq_length, config.short_seq_prob, config.pair_task, config.dupe_factor, config.seed,
                   config.packing)


# ----------------------------------------------------------------------------- the tokenizer

def pipeline_tokenizer(tokenizer):
    """A private copy of the fast tokenizer behind ``tokenizer`` (``transformers`` or ``tokenizers``),
    set up for building instances: no truncation, no padding, special-token text such as a
    literal "[SEP]" in an abstract tokenized as ordinary text, and a byte-level BPE's first word
    given its ``Ġ``: each sentence is tokenized on its own, and without it every sentence after a
    document's first lost the space before it (QA: ``field.Compared``, one word to whole-word masking)."""
    from tokenizers import Tokenizer

    from biomed_lm.tokenization.tokenizer_io import with_prefix_space

    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    if not isinstance(backend, Tokenizer):
        raise PretrainingDataError(f"a fast tokenizer is needed, not {type(tokenizer).__name__}")
    copy = Tokenizer.from_str(backend.to_str())
    copy.no_truncation()
    copy.no_padding()
    copy.encode_special_tokens = True
    with_prefix_space(copy)
    return copy


@dataclass(frozen=True)
class TokenizerInfo:
    """What the instances depend on about a tokenizer, and what the metadata records."""

    path: str
    vocab_size: int
    vocab_sha256: str
    lowercase: bool | None
    special_token_ids: dict[str, int]
    pipeline_json: str         # the fast tokenizer (normalizer, pre-tokenizer, model) as JSON
    word_starts: np.ndarray    # word_start_table of the vocabulary
    structural_ids: tuple[int, ...] = ()  # [CLS], [SEP], [PAD], [MASK]: never part of a word
    marks_word_starts: bool = False  # SentencePiece / byte-level BPE: words start at a marker, not at a non-##
    word_rule: str = ""        # instance_recipe.word_start_rule: part of the data's tokenizer identity

    @property
    def cls_id(self) -> int:
        return self.special_token_ids["cls"]

    @property
    def sep_id(self) -> int:
        return self.special_token_ids["sep"]


def describe_tokenizer(tokenizer, path: str = "") -> TokenizerInfo:
    """Read what :class:`TokenizerInfo` holds from a loaded ``transformers`` tokenizer."""
    pipeline = pipeline_tokenizer(tokenizer)
    specials = {name: getattr(tokenizer, f"{name}_token_id", None) for name in ("cls", "sep", "pad", "mask", "unk")}
    missing = [f"[{name.upper()}]" for name in ("cls", "sep") if specials[name] is None]
    if missing:
        raise PretrainingDataError(f"tokenizer {path} has no {' or '.join(missing)} token")
    specials = {name: int(value) for name, value in specials.items() if value is not None}
    vocab = tokenizer.get_vocab()
    structural = [specials[name] for name in ("cls", "sep", "pad", "mask") if name in specials]
    pipeline_json = pipeline.to_str()
    continuation_prefix, start_marker = word_boundary_markers(json.loads(pipeline_json))
    lowercase = (getattr(tokenizer, "init_kwargs", None) or {}).get("do_lower_case")
    return TokenizerInfo(path=path, vocab_size=len(vocab), vocab_sha256=vocabulary_fingerprint(tokenizer),
                         lowercase=lowercase if isinstance(lowercase, bool) else None, special_token_ids=specials,
                         pipeline_json=pipeline_json,
                         word_starts=word_start_table(vocab, structural, continuation_prefix, start_marker),
                         structural_ids=tuple(structural), marks_word_starts=start_marker is not None,
                         word_rule=word_start_rule(start_marker))


def load_tokenizer_info(path: str | os.PathLike) -> TokenizerInfo:
    p = Path(path)
    if not p.exists():
        raise PretrainingDataError(f"tokenizer not found: {p}")
    return describe_tokenizer(load_tokenizer_or_fail(p, PretrainingDataError), str(p))


# ------------------------------------------------------------------ stage 1: tokenization

@dataclass(frozen=True)
class TokenizedDocuments:
    """The usable sentences (at least one token) of a list of documents, flattened.

    Sentence ``k`` is ``ids[sentence_offsets[k]:sentence_offsets[k + 1]]``; document ``d`` owns
    sentences ``document_offsets[d]`` to ``document_offsets[d + 1]``. A document's sentences are
    contiguous in ``ids``, so any run of them is one slice. On disk (the tokenized corpus) this is
    one ``list<list<uint16|int32>>`` Arrow column, converted both ways without a Python loop."""

    ids: np.ndarray               # uint16 or int32
    sentence_offsets: np.ndarray  # int64, one more than there are usable sentences
    document_offsets: np.ndarray  # int64, one more than there are documents

    @property
    def num_documents(self) -> int:
        return len(self.document_offsets) - 1

    def num_sentences(self, document: int) -> int:
        return int(self.document_offsets[document + 1] - self.document_offsets[document])

    def sentence_lengths(self, document: int) -> list[int]:
        first, last = self.document_offsets[document], self.document_offsets[document + 1]
        return np.diff(self.sentence_offsets[first:last + 1]).tolist()

    def span(self, document: int, start: int, end: int) -> tuple[int, int]:
        """Token offsets in ``ids`` of the document's sentences ``[start, end)``."""
        first = self.document_offsets[document]
        return int(self.sentence_offsets[first + start]), int(self.sentence_offsets[first + end])

    def to_arrow(self, id_type: pa.DataType) -> pa.ListArray:
        sentences = pa.ListArray.from_arrays(pa.array(self.sentence_offsets, pa.int64()).cast(pa.int32()),
                                             pa.array(self.ids, id_type))
        return pa.ListArray.from_arrays(pa.array(self.document_offsets, pa.int64()).cast(pa.int32()), sentences)

    @classmethod
    def from_arrow(cls, column: pa.Array | pa.ChunkedArray) -> "TokenizedDocuments":
        documents = _single_chunk(column)
        sentences = documents.flatten()  # flatten() honours slicing; .values would not
        document_offsets = documents.offsets.to_numpy().astype(np.int64)
        sentence_offsets = sentences.offsets.to_numpy().astype(np.int64)
        return cls(ids=sentences.flatten().to_numpy(zero_copy_only=False),
                   sentence_offsets=sentence_offsets - sentence_offsets[0],
                   document_offsets=document_offsets - document_offsets[0])


def _single_chunk(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(column, pa.ChunkedArray):
        return column.combine_chunks() if column.num_chunks else pa.array([], column.type)
    return column


def encode_documents(tokenizer, documents: pa.Array | pa.ChunkedArray | Sequence[Sequence[str]]) -> TokenizedDocuments:
    """Tokenize every sentence of ``documents`` (lists of sentences) in one batched call.

    ``tokenizer`` is a ``tokenizers.Tokenizer`` (see :func:`pipeline_tokenizer`); no special tokens
    are added. Sentences that give no token (blank, or only characters the normalizer drops) are
    left out; a document without any usable sentence has none."""
    if not isinstance(documents, (pa.Array, pa.ChunkedArray)):
        documents = pa.array(documents, type=pa.list_(pa.string()))
    documents = _single_chunk(documents)
    counts = documents.value_lengths().fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    texts = [text or "" for text in documents.flatten().to_pylist()]
    encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
    id_lists = [encoding.ids for encoding in encode(texts, add_special_tokens=False)] if texts else []
    lengths = np.fromiter(map(len, id_lists), dtype=np.int64, count=len(id_lists))
    ids = np.fromiter(chain.from_iterable(id_lists), dtype=np.int32, count=int(lengths.sum()))
    usable = lengths > 0
    owner = np.repeat(np.arange(len(counts)), counts)
    per_document = np.bincount(owner[usable], minlength=len(counts))
    return TokenizedDocuments(ids=ids,
                              sentence_offsets=np.concatenate([[0], np.cumsum(lengths[usable])]).astype(np.int64),
                              document_offsets=np.concatenate([[0], np.cumsum(per_document)]).astype(np.int64))


def token_id_type(vocab_size: int) -> pa.DataType:
    """Token ids of the tokenized corpus take 2 bytes when the vocabulary allows (BERT's 30,522 does)."""
    return pa.uint16() if vocab_size <= 1 << 16 else pa.int32()


@dataclass
class SentenceTokenizer:
    """Stage 1, a batched ``datasets.map`` function: corpus rows (an Arrow table with a ``sentences``
    column) in, their usable sentences' token ids out (column ``sentence_ids``), all sentences of
    the batch tokenized in one call. Pickles as JSON, so each worker builds its own tokenizer."""

    pipeline_json: str
    id_type: pa.DataType
    _tokenizer: Any = field(default=None, init=False, repr=False, compare=False)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_tokenizer": None}

    def __call__(self, batch: pa.Table) -> pa.Table:
        if self._tokenizer is None:
            from tokenizers import Tokenizer

            self._tokenizer = pipeline_tokenizer(Tokenizer.from_str(self.pipeline_json))
        documents = encode_documents(self._tokenizer, batch.column("sentences"))
        return pa.table({TOKENIZED_COLUMN: documents.to_arrow(self.id_type)})


def _fingerprint(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode("utf-8")).hexdigest()[:20]


def tokenize_corpus(corpus, info: TokenizerInfo, cache_dir: str | os.PathLike, num_proc: int = 1,
                    batch_size: int = 256, identity: Sequence[str] | None = None):
    """Stage 1: every usable sentence of the corpus as token ids (column ``sentence_ids``, one row
    per corpus row), through ``datasets.map(num_proc=...)``; cached in ``cache_dir`` under a
    fingerprint of the corpus files and the tokenizer pipeline, so a later run with the same
    corpus and tokenizer (phase 2 after phase 1, another seed) skips tokenization altogether.
    ``identity`` stands for the files' identity where the corpus is a view (a mixture's rows)."""
    import datasets

    fingerprint = "tokenized-" + _fingerprint(str(FORMAT_VERSION), info.pipeline_json,
                                              *(identity or files_identity(corpus)))
    id_type = token_id_type(info.vocab_size)
    features = datasets.Features({TOKENIZED_COLUMN: datasets.List(datasets.List(datasets.Value(str(id_type))))})
    tokenized = corpus.select_columns(["sentences"]).with_format("arrow").map(
        SentenceTokenizer(info.pipeline_json, id_type), batched=True, batch_size=batch_size,
        remove_columns=["sentences"], features=features, num_proc=num_proc if num_proc > 1 else None,
        cache_file_name=str(Path(cache_dir) / f"{fingerprint}.arrow"), new_fingerprint=fingerprint,
        load_from_cache_file=True, desc="tokenize sentences")
    return tokenized.with_format("arrow")


# ------------------------------------------------------------------------ the link index (drp)

#: Documents whose links are resolved at a time (memory: their links, ~60 bytes each while resolved).
LINK_BATCH_DOCUMENTS = 100_000


class LinkIndex:
    """DRP's links as corpus rows: for each document, the rows of the corpus documents it links to
    (itself never), in CSR form (``offsets``, ``rows``) saved as ``.npy`` files and memory-mapped by
    each worker on first use (pickling carries the paths, not the arrays)."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = str(folder)
        self._arrays: tuple[np.ndarray, np.ndarray] | None = None

    def rows(self, document: int) -> np.ndarray:
        if self._arrays is None:
            self._arrays = tuple(np.load(Path(self.folder) / f"drp_link_{name}.npy", mmap_mode="r")
                                 for name in ("offsets", "rows"))
        offsets, rows = self._arrays
        return np.asarray(rows[offsets[document]:offsets[document + 1]])

    def __getstate__(self) -> dict:
        return {"folder": self.folder, "_arrays": None}


def build_link_index(corpus, folder: Path, batch_documents: int = LINK_BATCH_DOCUMENTS) -> tuple[LinkIndex, dict]:
    """The corpus's ``links`` (PMIDs, see :mod:`tokenization.corpus`) resolved to rows of the corpus
    (links to documents it does not hold are dropped), vectorized; and counts for the summary.

    Memory follows the documents, not the links: the sorted PMIDs (three int64 arrays of the
    corpus's length) stay in memory, the links are resolved ``batch_documents`` documents at a time
    and their rows appended to a file (a PubMed citation's reference list runs to dozens of PMIDs)."""
    if "links" not in corpus.column_names:
        raise PretrainingDataError("pair_task drp needs citation links: the corpus has no 'links' column (prepare "
                                   "it from PubMed XML with launch/prepare_corpus.py, or give --links-file there)")
    if corpus._indices is not None:  # a mixture's rows: a view; read just its ids and links
        corpus = corpus.select_columns(["id", "links"]).flatten_indices(keep_in_memory=True)
    table = corpus.with_format("arrow").data.table
    pmids = _as_pmids(table.column("id").combine_chunks())
    order = np.argsort(pmids, kind="stable")
    by_pmid = pmids[order]
    counts = np.zeros(len(pmids), dtype=np.int64)
    folder.mkdir(parents=True, exist_ok=True)
    raw, links = folder / "drp_link_rows.raw", 0
    with raw.open("wb") as out:
        for start in range(0, len(pmids), batch_documents):
            column = table.column("links").slice(start, batch_documents).combine_chunks()
            targets = _as_pmids(column.flatten())
            owner = start + np.repeat(np.arange(len(column)), column.value_lengths().fill_null(0).to_numpy(
                zero_copy_only=False))
            at = np.clip(np.searchsorted(by_pmid, targets), 0, len(pmids) - 1)
            rows = order[at]
            keep = (targets >= 0) & (pmids[rows] == targets) & (rows != owner)
            counts[start:start + len(column)] += np.bincount(owner[keep] - start, minlength=len(column))
            rows[keep].astype(np.int64).tofile(out)
            links += len(targets)
    np.save(folder / "drp_link_offsets.npy", np.concatenate([[0], np.cumsum(counts)]).astype(np.int64))
    _raw_to_npy(raw, folder / "drp_link_rows.npy")
    pa.default_memory_pool().release_unused()  # the workers forked next would inherit what the pool kept
    stats = {"links": links, "links_in_corpus": int(counts.sum()),
             "documents_with_links_in_corpus": int((counts > 0).sum())}
    return LinkIndex(folder), stats


def _raw_to_npy(raw: Path, npy: Path) -> None:
    """An int64 ``.npy`` file of a raw int64 file's values, copied through memory maps; ``raw`` removed."""
    values = np.fromfile(raw, dtype=np.int64) if raw.stat().st_size == 0 else np.memmap(raw, dtype=np.int64, mode="r")
    written = np.lib.format.open_memmap(npy, mode="w+", dtype=np.int64, shape=(len(values),))
    written[:] = values
    written.flush()
    del written, values
    raw.unlink()


def _as_pmids(strings: pa.Array) -> np.ndarray:
    """int64 PMIDs of decimal strings; -1 for anything else."""
    digits = pc.fill_null(pc.utf8_is_digit(strings), False)
    return pc.cast(pc.if_else(digits, strings, "-1"), pa.int64()).to_numpy(zero_copy_only=False)


# ------------------------------------------------------------------- stage 2: the instances

class _InstanceWriter:
    """Collects instances as slices of token arrays; turns them into one Arrow table per batch."""

    def __init__(self, info: TokenizerInfo) -> None:
        self.info = info
        self.cls = np.array([info.cls_id], dtype=np.int32)
        self.sep = np.array([info.sep_id], dtype=np.int32)
        self.pieces: list[np.ndarray] = []
        self.first: list[int] = []    # [CLS] A [SEP]
        self.second: list[int] = []   # B [SEP]
        self.labels: list[int] = []
        self.documents: list[int] = []

    def add(self, a: np.ndarray, b: np.ndarray | None, label: int, document: int) -> None:
        """``[CLS] a [SEP] b [SEP]``, or ``[CLS] a [SEP]`` when ``b`` is None."""
        self.pieces += [self.cls, a, self.sep] if b is None else [self.cls, a, self.sep, b, self.sep]
        self.first.append(len(a) + 2)
        self.second.append(0 if b is None else len(b) + 1)
        self.labels.append(label)
        self.documents.append(document)

    def table(self) -> pa.Table:
        first = np.asarray(self.first, dtype=np.int64)
        second = np.asarray(self.second, dtype=np.int64)
        lengths = first + second
        offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
        ids = np.concatenate(self.pieces).astype(np.int32) if self.pieces else np.zeros(0, dtype=np.int32)
        segments = np.repeat(np.tile(np.array([0, 1], dtype=np.int8), len(lengths)),
                             np.column_stack([first, second]).ravel())
        columns = {
            "input_ids": pa.ListArray.from_arrays(offsets, pa.array(ids, pa.int32())),
            "token_type_ids": pa.ListArray.from_arrays(offsets, pa.array(segments, pa.int8())),
            "next_sentence_label": pa.array(np.asarray(self.labels, dtype=np.int8)),
            "word_starts": pa.ListArray.from_arrays(offsets, pa.array(self._word_starts(ids), pa.int8())),
            DOCUMENT_COLUMN: pa.array(np.asarray(self.documents, dtype=np.int64)),
        }
        return pa.Table.from_pydict(columns, schema=INSTANCE_SCHEMA)

    def _word_starts(self, ids: np.ndarray) -> np.ndarray:
        """The vocabulary's word starts; where the vocabulary marks starts (``▁``, ``Ġ``), also every
        token right after [CLS] or [SEP]: a segment starts with a sentence, so with a word, but byte-level
        BPE without a prefix space gives a text's first word no marker. (WordPiece needs no such rule:
        a ``##`` piece first is a word cut by truncation, and stays a continuation.)"""
        starts = self.info.word_starts[ids]
        if not self.info.marks_word_starts:
            return starts
        special = np.isin(ids, np.asarray(self.info.structural_ids, dtype=np.int64))
        after_special = np.zeros_like(special)
        after_special[1:] = special[:-1]
        starts[after_special & ~special] = 1
        return starts


@dataclass
class InstanceBuilder:
    """Stage 2, the batched ``datasets.map`` function: rows of the tokenized corpus (an Arrow table
    with a ``sentence_ids`` column) and their row indices in, an Arrow table of instances out.

    ``tokenized`` is the whole tokenized corpus (Arrow format, memory-mapped): the documents that
    NotNext segments come from are read from it by index, already tokenized. Nothing in a batch
    touches tokens one by one in Python: segments are slices of flat id arrays."""

    tokenized: Any
    info: TokenizerInfo
    options: RecipeOptions
    links: Any = None  # DRP: the corpus rows each document links to (LinkIndex)

    def _read(self, rows: Sequence[int]) -> TokenizedDocuments:
        return TokenizedDocuments.from_arrow(self.tokenized[list(rows)].column(TOKENIZED_COLUMN))

    def _other_sources(self, plans: Sequence[tuple[InstancePlan, int]]
                       ) -> list[tuple[tuple[TokenizedDocuments, int], int]]:
        """``((tokenized documents, row), label)`` of the document each ``(plan, its document)`` with a
        B from another document takes it from, all read in one go. A draw without a usable sentence
        moves on to the next document that has one (cyclically, never the plan's own),
        deterministically; a linked B that moves so is then a random one, and labelled so."""
        wanted = sorted({plan.other_document for plan, _ in plans})
        others = self._read(wanted)
        found = {document: (others, row) for row, document in enumerate(wanted)}
        n = len(self.tokenized)
        sources = []
        for plan, document in plans:
            candidate, steps = plan.other_document, 0
            while found[candidate][0].num_sentences(found[candidate][1]) == 0:
                candidate, steps = (candidate + 1) % n, steps + 1
                if candidate == document:
                    candidate, steps = (candidate + 1) % n, steps + 1
                if steps >= n:
                    raise PretrainingDataError(f"pair_task {self.options.pair_task} needs at least 2 documents "
                                               "with text (or use pair_task none)")
                if candidate not in found:
                    found[candidate] = (self._read([candidate]), 0)
            moved = candidate != plan.other_document and plan.label == LINKED_DOCUMENT
            sources.append((found[candidate], RANDOM_DOCUMENT if moved else plan.label))
        return sources

    def _linked(self, document: int) -> Sequence[int]:
        return self.links.rows(document) if self.links is not None else ()

    def _plans(self, docs: TokenizedDocuments, indices: Sequence[int]) -> list[tuple]:
        """``(row, document, generator, plans)`` per document of the batch and dupe."""
        opts, jobs = self.options, []
        for row, document in enumerate(indices):
            lengths = docs.sentence_lengths(row)
            if not lengths:
                continue  # no usable sentence: the document is skipped (counted in the summary)
            linked = self._linked(document) if opts.pair_task == "drp" else ()
            for dupe in range(opts.dupe_factor):
                rng = np.random.default_rng([opts.seed, document, dupe])
                plans = plan_document(lengths, rng, max_num_tokens=opts.max_num_tokens,
                                      short_seq_prob=opts.short_seq_prob, pair_task=opts.pair_task,
                                      document_index=document, num_documents=len(self.tokenized), linked=linked)
                jobs.append((row, document, rng, plans))
        return jobs

    def __call__(self, batch: pa.Table, indices: Sequence[int]) -> pa.Table:
        if self.options.packing == "cross-document":
            return self._packs(indices)
        docs = TokenizedDocuments.from_arrow(batch.column(TOKENIZED_COLUMN))
        jobs = self._plans(docs, indices)
        others = [(plan, document) for _, document, _, plans in jobs for plan in plans if plan.is_random_next]
        sources = iter(self._other_sources(others) if others else [])
        writer = _InstanceWriter(self.info)
        for row, document, rng, plans in jobs:
            for plan in plans:
                a, b, label = _segments(docs, row, plan, sources)
                # Each document's generator continues here, so truncation is as reproducible as the plans.
                front_a, back_a, front_b, back_b = truncation_cuts(len(a), 0 if b is None else len(b),
                                                                   self.options.max_num_tokens, rng)
                writer.add(a[front_a:len(a) - back_a], None if b is None else b[front_b:len(b) - back_b],
                           label, document)
        return writer.table()

    def _packs(self, indices: Sequence[int]) -> pa.Table:
        """Cross-document packing: this batch builds every group of :data:`PACK_GROUP` documents whose
        first document it holds (reading the rest of the group from the tokenized corpus), so no
        pack depends on how the corpus was split into batches or workers."""
        opts, n = self.options, len(self.tokenized)
        writer = _InstanceWriter(self.info)
        for first in sorted(i for i in indices if i % PACK_GROUP == 0):
            group = self._read(range(first, min(first + PACK_GROUP, n)))
            sep = np.array([self.info.sep_id], dtype=group.ids.dtype)
            lengths = [group.sentence_lengths(r) for r in range(group.num_documents)]
            for dupe in range(opts.dupe_factor):
                rng = np.random.default_rng([opts.seed, first // PACK_GROUP, dupe])
                for pack in pack_documents(lengths, rng, max_num_tokens=opts.max_num_tokens,
                                           short_seq_prob=opts.short_seq_prob):
                    ids = _pack_ids(group, pack, sep)
                    front, back, _, _ = truncation_cuts(len(ids), 0, opts.max_num_tokens, rng)
                    writer.add(ids[front:len(ids) - back], None, NO_PAIR_LABEL, first + pack[0][0])
        return writer.table()


def _segments(docs: TokenizedDocuments, row: int, plan: InstancePlan, sources) -> tuple[np.ndarray, Any, int]:
    """A's and B's token ids (B None for a one-segment instance) and the pair label, as ``plan`` says;
    ``sources`` yields the other document (and label) of each plan whose B comes from one."""
    a0, a1 = docs.span(row, plan.a_start, plan.a_end)
    a = docs.ids[a0:a1]
    if plan.is_random_next:
        (source, source_row), label = next(sources)
        other_lengths = source.sentence_lengths(source_row)
        start = continuation_start(len(other_lengths), plan.other_start)
        end = continuation_end(other_lengths, start, plan.target_b_length)
        b0, b1 = source.span(source_row, start, end)
        return a, source.ids[b0:b1], label
    if not plan.has_b:
        return a, None, plan.label
    b0, b1 = docs.span(row, plan.a_end, plan.b_end)
    b = docs.ids[b0:b1]
    return (b, a, plan.label) if plan.swapped else (a, b, plan.label)


def _pack_ids(docs: TokenizedDocuments, pack: Sequence[tuple[int, int, int]], sep: np.ndarray) -> np.ndarray:
    parts = []
    for index, (document, start, end) in enumerate(pack):
        if index:
            parts.append(sep)
        first, last = docs.span(document, start, end)
        parts.append(docs.ids[first:last])
    return np.concatenate(parts)


def build_instances(tokenized, info: TokenizerInfo, options: RecipeOptions, cache_dir: str | os.PathLike,
                    num_proc: int = 1, batch_size: int = 256, links: LinkIndex | None = None):
    """Stage 2: the instances of a tokenized corpus (:data:`INSTANCE_SCHEMA`), through
    ``datasets.map(num_proc=...)``, cached in ``cache_dir`` under a fingerprint of the tokenized
    corpus and the recipe options."""
    import datasets

    fingerprint = "instances-" + _fingerprint(tokenized._fingerprint, json.dumps(asdict(options), sort_keys=True))
    instances = tokenized.map(
        InstanceBuilder(tokenized=tokenized, info=info, options=options, links=links), batched=True,
        batch_size=batch_size,
        with_indices=True, remove_columns=[TOKENIZED_COLUMN],
        features=datasets.Features.from_arrow_schema(INSTANCE_SCHEMA), num_proc=num_proc if num_proc > 1 else None,
        cache_file_name=str(Path(cache_dir) / f"{fingerprint}.arrow"), new_fingerprint=fingerprint,
        load_from_cache_file=True, desc=f"build instances (max_seq_length {options.max_seq_length})")
    return instances.with_format(None)


# ----------------------------------------------------------------------------- summary

def _percentile(histogram: np.ndarray, q: float) -> int:
    """Nearest-rank percentile ``q`` (0..100) of the values a histogram counts."""
    total = int(histogram.sum())
    rank = max(1, math.ceil(q / 100 * total))
    return int(np.searchsorted(np.cumsum(histogram), rank))


def summarize(instances, num_documents: int, max_seq_length: int, pair_task: str, progress: bool = True,
              used_documents: np.ndarray | None = None) -> dict:
    """Counts and length statistics of an instance dataset, read in Arrow record batches (memory:
    one batch, a length histogram and one bit per corpus document). ``used_documents`` (a bool per
    corpus document) stands in for the instances' first documents where packs span several."""
    from tqdm.auto import tqdm

    histogram = np.zeros(max_seq_length + 1, dtype=np.int64)
    used = np.zeros(num_documents, dtype=bool)
    label_counts = np.zeros(len(PAIR_LABELS[pair_task]) + 1, dtype=np.int64)  # the last: NO_PAIR_LABEL
    table = instances.data.table if hasattr(instances.data, "table") else instances.data
    bar = tqdm(total=table.num_rows, desc="summarize", unit="instance", disable=not progress)
    for record_batch in table.to_batches(max_chunksize=65_536):
        lengths = pc.list_value_length(record_batch.column("input_ids")).to_numpy(zero_copy_only=False)
        histogram += np.bincount(lengths, minlength=len(histogram))[:len(histogram)]
        labels = record_batch.column("next_sentence_label").to_numpy(zero_copy_only=False).astype(np.int64)
        label_counts += np.bincount(np.where(labels < 0, len(label_counts) - 1, labels), minlength=len(label_counts))
        used[record_batch.column(DOCUMENT_COLUMN).to_numpy()] = True
        bar.update(record_batch.num_rows)
    bar.close()
    if used_documents is not None:
        used = used_documents
    count = int(histogram.sum())
    tokens = int(np.dot(histogram, np.arange(len(histogram))))
    used_count = int(used.sum())
    return {
        "instances": count,
        "tokens": tokens,
        "length": {
            "mean": round(tokens / count, 2) if count else 0.0,
            "min": int(np.flatnonzero(histogram)[0]) if count else 0,
            **{f"p{q}": _percentile(histogram, q) if count else 0 for q in (5, 25, 50, 75, 90, 95, 99)},
            "max": int(np.flatnonzero(histogram)[-1]) if count else 0,
        },
        "padding_fraction": round(1 - tokens / (count * max_seq_length), 4) if count else 0.0,
        "not_next_fraction": round(int(label_counts[NOT_NEXT]) / count, 4) if pair_task == "nsp" and count else None,
        "pair_labels": {name: int(n) for name, n in zip((*PAIR_LABELS[pair_task], "none"), label_counts) if n},
        "documents": {"total": num_documents, "used": used_count, "skipped": num_documents - used_count},
        "instances_per_document": round(count / used_count, 3) if used_count else 0.0,
    }


def _documents_with_text(tokenized) -> np.ndarray:
    """A bool per corpus document: has at least one usable sentence (what packing uses)."""
    column = tokenized.with_format("arrow").data.table.column(TOKENIZED_COLUMN)
    return pc.list_value_length(column).to_numpy(zero_copy_only=False) > 0


def format_summary(metadata: Mapping[str, Any]) -> str:
    """The summary a person reads at the end of a run."""
    s = metadata["summary"]
    length, docs = s["length"], s["documents"]
    lines = [
        f"pretraining data: {metadata.get('output_dir', '')}",
        f"  max_seq_length {metadata['max_seq_length']}, {_pair_description(metadata)}, "
        f"short_seq_prob {metadata['short_seq_prob']}, dupe_factor {metadata['dupe_factor']}, seed {metadata['seed']}",
        f"  documents: {docs['total']:,} in the corpus, {docs['used']:,} used, {docs['skipped']:,} skipped "
        f"(no usable sentence)",
        f"  instances: {s['instances']:,} ({s['instances_per_document']} per document), tokens: {s['tokens']:,}",
        f"  length: mean {length['mean']}, min {length['min']}, p5 {length['p5']}, p25 {length['p25']}, "
        f"p50 {length['p50']}, p75 {length['p75']}, p90 {length['p90']}, p99 {length['p99']}, max {length['max']}",
        f"  padding if padded to {metadata['max_seq_length']}: {100 * s['padding_fraction']:.1f}% of positions",
    ]
    if s.get("pair_labels") and pair_task_of(metadata) != "none":
        total = sum(s["pair_labels"].values())
        lines.append(f"  {pair_task_of(metadata).upper()} labels: " + ", ".join(
            f"{name} {100 * n / total:.1f}%" for name, n in s["pair_labels"].items()))
    casing = {True: "uncased", False: "cased"}.get(metadata["lowercase"], "casing unknown")
    lines.append(f"  vocabulary: {metadata['vocab_size']:,} tokens, {casing}, "
                 f"sha256 {metadata['vocab_sha256'][:16]}…")
    return "\n".join(lines)


def _pair_description(metadata: Mapping[str, Any]) -> str:
    task = pair_task_of(metadata)
    if task == "none":
        packed = metadata.get("packing") == "cross-document"
        return "MLM only (one segment" + (", packed across documents)" if packed else ")")
    return {"nsp": "NSP pairs", "sop": "SOP pairs", "drp": "DRP pairs"}[task]


# ----------------------------------------------------------------------------- the job

def create_pretraining_data(config: PretrainingDataConfig, progress: bool = True) -> dict:
    """Build the instances and ``pretraining_data.json``; returns the metadata (summary included).

    Where ``output_dir`` already holds finished data (and ``overwrite`` is not set), nothing is built: its
    metadata comes back, with ``already_complete`` set, when this command built it (the same corpus files,
    tokenizer and options, :func:`finished_data`), else PretrainingDataError names what differs."""
    config.validate()
    out = Path(config.output_dir)
    workers_die_with_this_process()  # a killed build leaves no tokenizing or instance worker behind
    with acquire_run_lock(out, ARTIFACT_LOCK_FILE):  # before anything in out is read: a second build into it is refused
        return _create_pretraining_data(config, out, progress)


def _create_pretraining_data(config: PretrainingDataConfig, out: Path, progress: bool) -> dict:
    """:func:`create_pretraining_data` into ``out``, whose lock this process holds."""
    import datasets

    started = time.perf_counter()
    corpus, mixed = _checked_corpus(config, out)
    corpus_name = mixed.record["corpus"] if mixed else config.corpus
    info = load_tokenizer_info(config.tokenizer)
    options = RecipeOptions.from_config(config)
    identity = inputs_identity(corpus, info)
    if (out / METADATA_FILE).is_file() and not config.overwrite:
        return finished_data(config, out, identity)
    if len(corpus) == 0:
        raise PretrainingDataError(f"the corpus {corpus_name} has no documents")
    if config.pair_task in ("nsp", "drp") and len(corpus) < 2:
        raise PretrainingDataError(f"the corpus {corpus_name} has 1 document; pair_task {config.pair_task} "
                                   "draws other documents and needs at least 2 (or use --pair-task none)")
    work = out / WORK_DIR
    token_cache = Path(config.tokenized_cache) if config.tokenized_cache else work
    for folder in (work, token_cache):
        folder.mkdir(parents=True, exist_ok=True)
    num_proc = max(1, min(config.workers(), len(corpus)))
    bars_were_disabled = datasets.are_progress_bars_disabled()
    if not progress:
        datasets.disable_progress_bars()
    try:
        tokenized = tokenize_corpus(corpus, info, token_cache, num_proc, config.batch_size,
                                    mixed.identity if mixed else None)
        links, link_stats = build_link_index(corpus, work) if config.pair_task == "drp" else (None, None)
        instances = build_instances(tokenized, info, options, work, num_proc, config.batch_size, links)
        used = _documents_with_text(tokenized) if config.packing == "cross-document" else None
        summary = summarize(instances, len(corpus), config.max_seq_length, config.pair_task, progress=progress,
                            used_documents=used)
        if link_stats is not None:
            summary["links"] = link_stats
        if summary["instances"] == 0:
            raise PretrainingDataError(f"no instances: none of the {len(corpus):,} documents of {corpus_name} "
                                       "has a sentence that tokenizes to anything")
        for stale in _dataset_files(out):  # only once the new instances exist
            stale.unlink()
        instances.save_to_disk(str(out), max_shard_size=config.max_shard_size)
    finally:
        if not progress and not bars_were_disabled:
            datasets.enable_progress_bars()

    metadata = _metadata(config, out, info, len(corpus), summary, seconds=time.perf_counter() - started,
                         mixture=mixed.record if mixed else None)
    metadata["inputs_identity"] = identity
    metadata["output_files"] = saved_files_record(out)  # a shard cut off or deleted since is damage to a rerun
    # Written last and atomically: its presence is what marks the dataset as complete.
    write_json_atomically(out / METADATA_FILE, metadata)
    _remove_cache(instances)  # the saved shards hold everything now
    if token_cache == work:
        _remove_cache(tokenized)  # a --tokenized-cache folder keeps it for the next run
    for index_file in work.glob("drp_link_*.npy"):
        index_file.unlink()
    _remove_empty_work_dir(work)
    return metadata


def _checked_corpus(config: PretrainingDataConfig, out: Path):
    """The corpus and the mixture (None without one), once the output folder is known to be usable
    for this build (its size is checked after the tokenizer, by the caller)."""
    if out.exists() and not out.is_dir():
        raise PretrainingDataError(f"output_dir {out} exists and is not a directory")
    existing = _dataset_files(out) if out.is_dir() else []
    if existing and not config.overwrite and not (out / METADATA_FILE).is_file():  # finished data: finished_data
        raise PretrainingDataError(f"{out} already holds a dataset ({existing[0].name}); "
                                   "pass --overwrite to replace it")
    if config.mixture:  # several corpora, drawn at their weights (pretrain/mixture.py)
        from biomed_lm.pretrain.mixture import open_mixture

        mixed = open_mixture(config.mixture, config.seed, config.mixture_documents)
        corpus, sources = mixed.dataset, [item["corpus"] for item in mixed.record["inputs"]]
    else:
        mixed, corpus, sources = None, open_corpus(config.corpus), [config.corpus]
    if any(out.resolve() == Path(source).resolve() for source in sources):
        raise PretrainingDataError(f"output_dir {out} is the corpus itself; choose another folder")
    return corpus, mixed


def _dataset_files(out: Path) -> list[Path]:
    names = [METADATA_FILE, "state.json", "dataset_info.json"]
    return [out / n for n in names if (out / n).exists()] + sorted(out.glob("data-*.arrow"))


def _metadata(config: PretrainingDataConfig, out: Path, info, corpus_documents: int, summary: dict, seconds: float,
              mixture: dict | None = None) -> dict:
    """What ``pretraining_data.json`` records: the recipe, the vocabulary, the summary, the versions."""
    import datasets
    import tokenizers
    import transformers

    return {
        "format_version": FORMAT_VERSION,
        "output_dir": str(out),
        "tokenizer": str(Path(config.tokenizer).resolve()),
        "vocab_size": info.vocab_size,
        "vocab_sha256": info.vocab_sha256,
        "lowercase": info.lowercase,
        "special_token_ids": info.special_token_ids,
        "max_seq_length": config.max_seq_length,
        "nsp": config.pair_task == "nsp",  # kept for readers older than pair_task
        "pair_task": config.pair_task,
        "pair_classes": len(PAIR_LABELS[config.pair_task]),
        "packing": config.packing,
        "seed": config.seed,
        "short_seq_prob": config.short_seq_prob,
        "dupe_factor": config.dupe_factor,
        "corpus": mixture["corpus"] if mixture else str(Path(config.corpus).resolve()),
        "corpus_documents": corpus_documents,
        **({"mixture": mixture} if mixture else {}),  # its inputs, weights or epochs, documents drawn
        "columns": list(INSTANCE_SCHEMA.names),
        "labels": {**{name: index for index, name in enumerate(PAIR_LABELS[config.pair_task])},
                   "no_pair_label": NO_PAIR_LABEL},
        "summary": summary,
        "config": asdict(config),
        "created_utc": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        "seconds": round(seconds, 2),
        "library_versions": {"datasets": datasets.__version__, "tokenizers": tokenizers.__version__,
                             "transformers": transformers.__version__, "numpy": np.__version__},
    }


# ----------------------------------------------------------------- finished data: what a rerun compares

#: PretrainingDataConfig fields that do not decide the instances: where they go, how many processes and
#: documents per batch build them (the output depends on neither: tests/test_num_proc_invariance.py),
#: where the tokenization is cached, whether to replace; the corpus (a mixture's corpora) and the tokenizer
#: are compared by their files and pipeline instead of by how the command names them.
_NOT_DATA_SETTINGS = ("corpus", "tokenizer", "output_dir", "num_proc", "batch_size", "tokenized_cache", "overwrite")


def inputs_identity(corpus, info: TokenizerInfo) -> dict:
    """``pretraining_data.json``'s ``inputs_identity``: the data format's version, the corpus files (path,
    size, modification time: every corpus of a mixture) and the sha256 of the tokenizer's whole pipeline
    (normalizer, pre-tokenizer, vocabulary), with the word-start rule read from it where there is one
    beside the vocabulary's markers (SentencePiece's: data built before it differs)."""
    tokenizer = info.pipeline_json + (f"\n{info.word_rule}" if info.word_rule else "")
    return {"format_version": FORMAT_VERSION,
            "corpus_files": [file_identity(item["filename"]) for item in corpus.cache_files],
            "tokenizer_sha256": hashlib.sha256(tokenizer.encode("utf-8")).hexdigest()}


def data_settings(values: Mapping[str, Any]) -> dict:
    """The options (of a PretrainingDataConfig as a dict) that decide the instances; one a record predates
    takes its default, what such records were built with. A mixture's corpora count by their files."""
    settings = {k: v for k, v in {**dataclass_defaults(PretrainingDataConfig), **values}.items()
                if k not in _NOT_DATA_SETTINGS}
    if isinstance(settings.get("mixture"), Mapping):
        settings["mixture"] = {name: {k: v for k, v in dict(item).items() if k != "corpus"}
                               if isinstance(item, Mapping) else item for name, item in settings["mixture"].items()}
    return settings


def finished_data(config: PretrainingDataConfig, out: Path, identity: Mapping[str, Any]) -> dict:
    """The metadata of the data in ``out``, with ``already_complete`` set, when this command built it: the
    same corpus files, tokenizer pipeline, data format and options. PretrainingDataError otherwise, naming
    what differs, why the metadata cannot tell, or which saved file is missing or has another size than when it
    was saved (metadata written before sizes were recorded is not checked so)."""
    metadata = read_record(out / METADATA_FILE)
    if not isinstance(metadata, dict) or not isinstance(metadata.get("inputs_identity"), dict) \
            or not isinstance(metadata.get("config"), dict):
        why = "cannot be read" if not isinstance(metadata, dict) else "predates the record of its inputs and options"
        raise PretrainingDataError(f"{out} already holds pretraining data whose {METADATA_FILE} {why}, so this "
                                   "command cannot tell whether it built it; pass --overwrite to rebuild it")
    damage = damaged_file_lines(out, metadata.get("output_files"))
    if damage:
        raise PretrainingDataError(damaged_output_message(out, "pretraining data", damage))
    changes = setting_change_lines(data_settings(metadata["config"]), data_settings(asdict(config)), "data")
    changes += _changed_inputs(metadata, identity, config)
    if changes:
        raise PretrainingDataError(other_output_message(out, "pretraining data", changes))
    return {**metadata, "already_complete": True}


def _changed_inputs(metadata: Mapping[str, Any], identity: Mapping[str, Any], config: PretrainingDataConfig
                    ) -> list[str]:
    """What differs between the corpus, tokenizer and format the data was built from and this command's."""
    recorded = metadata["inputs_identity"]
    changes = []
    if recorded.get("format_version") != identity["format_version"]:
        changes.append(f"format_version: {recorded.get('format_version')} in the finished data, "
                       f"{identity['format_version']} now")
    changes += changed_files(recorded.get("corpus_files") or [], identity["corpus_files"], "corpus")
    if recorded.get("tokenizer_sha256") != identity["tokenizer_sha256"]:
        now = str(Path(config.tokenizer).resolve())
        before = metadata.get("tokenizer")
        changes.append(f"tokenizer: {before} in the finished data, {now} now" if before != now else
                       f"tokenizer: {now} changed since the data was built (its vocabulary or pipeline, "
                       "or the word starts read from it)")
    return changes


def _remove_cache(dataset) -> None:
    for cache_file in dataset.cache_files:
        Path(cache_file["filename"]).unlink(missing_ok=True)


def _remove_empty_work_dir(work: Path) -> None:
    for leftover in work.glob("tmp*"):  # datasets' temporary files from a killed worker
        if leftover.is_file():
            leftover.unlink()
    try:
        work.rmdir()
    except OSError:
        pass  # something else lives there (another fingerprint's cache); leave it
