"""Corpus mixtures: pretraining instances drawn from several prepared corpora at chosen proportions.

The paper's Table 5 compares pretraining on PubMed abstracts alone with PubMed + PMC full text. A
mixture names its inputs, each a prepared corpus (``launch/prepare_corpus.py`` output) with either
a sampling ``weight`` or a number of ``epochs``, never both kinds in one mixture::

    mixture:
      pubmed: {corpus: runs/corpus/pubmed, weight: 0.7}
      pmc: {corpus: runs/corpus/pmc, weight: 0.3}

How many documents each input gives (:func:`document_counts`):

* **weights** (normalized to sum to 1): the mixture holds ``total`` documents, each input its share
  by largest-remainder apportionment (so the shares are exact to one document). ``total`` is
  ``mixture_documents`` when given; otherwise the size that uses the largest-share input exactly
  once (its size over its share): every document of the main corpus is seen once, the others are
  sampled down, or repeated, to their share.
* **epochs**: input *i* gives ``round(epochs_i × size_i)`` documents (2 = every document twice,
  0.5 = a random half).

An input giving ``count`` documents of its ``size`` repeats every document ``count // size``
times and adds a random ``count % size`` of them without replacement (so no document is repeated
more than once more than another). The chosen rows of all inputs are then shuffled together, so
that NotNext partners and cross-document packs mix the inputs. Every draw comes from
``numpy.random.default_rng([seed, MIXTURE_STREAM, ...])``: the mixture is the same for a seed
and differs with another one, whatever ``num_proc``.

The mixture is a view (an indices mapping over the inputs' concatenation), not a copy of the text;
only the columns that every input has are kept. Its identity (the inputs' files, the rows drawn)
fingerprints the tokenization cache, so another seed or weight never reuses a stale tokenization.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

import numpy as np

from biomed_lm.config import unknown_keys_message
from biomed_lm.pretrain.prepared_corpus import PretrainingDataError, files_identity, open_corpus

MixtureMode = Literal["weight", "epochs"]
MIXTURE_STREAM = 0x6D6978  # "mix": keeps these draws apart from the recipe's per-document streams
INPUT_KEYS = ("corpus", "weight", "epochs")


@dataclass(frozen=True)
class MixtureInput:
    """One named input of a mixture: a prepared corpus and its weight or its epochs."""

    name: str
    corpus: str
    weight: float | None = None
    epochs: float | None = None


@dataclass(frozen=True)
class MixedCorpus:
    """A mixture, opened: the dataset to build instances from, what was drawn, and its identity."""

    dataset: Any                 # datasets.Dataset (an indices mapping over the inputs' concatenation)
    record: dict[str, Any]        # pretraining_data.json's "mixture": mode, documents, corpus (a description),
                                  # inputs (name, corpus, weight or epochs, documents in it, documents_drawn)
    identity: list[str]           # fingerprint parts for the tokenization cache


# ------------------------------------------------------------------------------ validation

def _positive(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise PretrainingDataError(f"{where} must be a positive number, not {value!r}")
    return float(value)


def parse_mixture(spec: Any, where: str = "mixture") -> tuple[MixtureInput, ...]:
    """The inputs of a ``mixture:`` mapping (name -> {corpus, weight | epochs}), checked; ``where``
    prefixes errors (``mixture.pmc.weight must be a positive number, not 0``)."""
    if not isinstance(spec, Mapping) or not spec:
        raise PretrainingDataError(f"{where} must map input names to {{corpus: DIR, weight: W}} or "
                                   f"{{corpus: DIR, epochs: E}}, not {spec!r}")
    inputs = [_parse_input(str(name), value, f"{where}.{name}") for name, value in spec.items()]
    modes = {name: mixture_mode_of(item) for name, item in zip(spec, inputs)}
    if len(set(modes.values())) > 1:
        raise PretrainingDataError(f"{where}: weight and epochs are exclusive: give every input a weight or every "
                                   f"input epochs (here: {', '.join(f'{n} {m}' for n, m in modes.items())})")
    return tuple(inputs)


def _parse_input(name: str, value: Any, where: str) -> MixtureInput:
    if not isinstance(value, Mapping):
        raise PretrainingDataError(f"{where} must be a mapping {{corpus: DIR, weight: W}}, not {value!r}")
    unknown = unknown_keys_message(value, INPUT_KEYS, where)
    if unknown:
        raise PretrainingDataError(unknown)
    corpus = value.get("corpus")
    if not isinstance(corpus, str) or not corpus:
        raise PretrainingDataError(f"{where}.corpus is required: a prepared corpus directory")
    if ("weight" in value) == ("epochs" in value):
        raise PretrainingDataError(f"{where}: give exactly one of weight or epochs")
    kind = "weight" if "weight" in value else "epochs"
    return MixtureInput(name, corpus, **{kind: _positive(value[kind], f"{where}.{kind}")})


def mixture_mode_of(item: MixtureInput) -> MixtureMode:
    return "weight" if item.weight is not None else "epochs"


# ------------------------------------------------------------------------- counts (pure)

def apportion(total: int, weights: Sequence[float]) -> list[int]:
    """``total`` split by ``weights`` (largest remainder, ties to the earlier input): each share is
    within one of ``total × weight / sum``, and the shares add up to ``total`` exactly."""
    norm = sum(weights)
    exact = [total * w / norm for w in weights]
    counts = [math.floor(x) for x in exact]
    by_remainder = sorted(range(len(weights)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in by_remainder[:total - sum(counts)]:
        counts[i] += 1
    return counts


def default_total(sizes: Sequence[int], weights: Sequence[float]) -> int:
    """The mixture size that draws the largest-share input exactly once (the first such on a tie)."""
    main = max(range(len(weights)), key=lambda i: (weights[i], -i))
    return round(sizes[main] * sum(weights) / weights[main])


def document_counts(sizes: Sequence[int], *, weights: Sequence[float] | None = None,
                    epochs: Sequence[float] | None = None, total: int = 0) -> list[int]:
    """Documents each input gives: by ``weights`` (``total`` of them, or :func:`default_total`), or
    by ``epochs`` (``round(epochs × size)``; ``total`` must then be 0)."""
    if (weights is None) == (epochs is None):
        raise ValueError("give weights or epochs")
    if epochs is not None:
        if total:
            raise PretrainingDataError("mixture_documents applies to weights only; with epochs each input's size "
                                       "times its epochs sets the total")
        return [round(e * n) for e, n in zip(epochs, sizes)]
    return apportion(total or default_total(sizes, weights), weights)


def draw_rows(size: int, count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` rows of an input of ``size`` documents: every row ``count // size`` times, plus a
    random ``count % size`` rows without replacement (repeats are as even as can be)."""
    full, rest = divmod(count, size)
    extra = np.sort(rng.choice(size, rest, replace=False)) if rest else np.empty(0, np.int64)
    return np.concatenate([np.tile(np.arange(size, dtype=np.int64), full), extra.astype(np.int64)])


def mixture_rows(sizes: Sequence[int], counts: Sequence[int], seed: int) -> np.ndarray:
    """Rows of the inputs' concatenation that make the mixture, shuffled together (deterministic for
    ``seed``: input i draws from stream ``[seed, MIXTURE_STREAM, i + 1]``, the shuffle from ``0``)."""
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    parts = [offset + draw_rows(size, count, np.random.default_rng([seed, MIXTURE_STREAM, i + 1]))
             for i, (size, count, offset) in enumerate(zip(sizes, counts, offsets))]
    rows = np.concatenate(parts) if parts else np.empty(0, np.int64)
    np.random.default_rng([seed, MIXTURE_STREAM, 0]).shuffle(rows)
    return rows


# ------------------------------------------------------------------------------- the job

def _open_input(item: MixtureInput, where: str):
    try:
        return open_corpus(item.corpus)
    except PretrainingDataError as err:
        raise PretrainingDataError(f"{where}.{item.name}.corpus: {err}") from None


def _common_columns(corpora: Sequence[Any]) -> list[str]:
    """The columns every input has with the same type ('sentences' always: open_corpus checked it)."""
    first = corpora[0].features
    return [name for name in corpora[0].column_names
            if all(name in c.features and c.features[name] == first[name] for c in corpora[1:])]


def open_mixture(spec: Mapping[str, Any], seed: int, total: int = 0, where: str = "mixture") -> MixedCorpus:
    """The mixture of ``spec`` (a ``mixture:`` mapping) for ``seed``; ``total`` is
    ``mixture_documents`` (0: the default size). Errors name the field and the input."""
    import datasets

    inputs = parse_mixture(spec, where)
    corpora = [_open_input(item, where) for item in inputs]
    for item, corpus in zip(inputs, corpora):
        if len(corpus) == 0:
            raise PretrainingDataError(f"{where}.{item.name}.corpus: the corpus {item.corpus} has no documents")
    sizes = [len(c) for c in corpora]
    weighted = mixture_mode_of(inputs[0]) == "weight"
    counts = document_counts(sizes, total=total, **({"weights": [i.weight for i in inputs]} if weighted
                                                    else {"epochs": [i.epochs for i in inputs]}))
    rows = mixture_rows(sizes, counts, seed)
    columns = _common_columns(corpora)
    joined = datasets.concatenate_datasets([c.select_columns(columns) for c in corpora])
    dataset = joined.select(rows, keep_in_memory=True)  # the indices only; never a file in a corpus folder
    record = {"mode": mixture_mode_of(inputs[0]), "documents": int(sum(counts)), "mixture_documents": total,
              "inputs": [{**{k: v for k, v in asdict(item).items() if v is not None},
                          "corpus": str(Path(item.corpus).resolve()), "documents": size, "documents_drawn": count}
                         for item, size, count in zip(inputs, sizes, counts)]}
    record["corpus"] = describe_mixture(record)
    digest = hashlib.sha256(rows.tobytes()).hexdigest()[:20]
    identity = [part for c in corpora for part in files_identity(c)] + ["mixture", ",".join(columns), digest]
    return MixedCorpus(dataset, record, identity)


def describe_mixture(record: Mapping[str, Any]) -> str:
    """The ``corpus`` entry of a mixture's metadata: ``mixture: pubmed=/abs/path, pmc=/abs/path``."""
    return "mixture: " + ", ".join(f"{item['name']}={item['corpus']}" for item in record["inputs"])


def format_mixture(record: Mapping[str, Any]) -> str:
    """One line for the summary: each input's documents drawn of its documents, and its weight or epochs."""
    return "  mixture: " + ", ".join(
        f"{i['name']} {i['documents_drawn']:,} of {i['documents']:,} "
        f"({'weight ' + format(i['weight'], 'g') if 'weight' in i else 'epochs ' + format(i['epochs'], 'g')})"
        for i in record["inputs"])
