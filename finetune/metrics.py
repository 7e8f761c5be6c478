"""The BLURB metrics (the paper's Table 3) and the BLURB score, as pure functions.

Every metric takes gold and predicted values as Python sequences or numpy arrays and returns a
dict whose ``"score"`` is the number BLURB reports for that dataset, as a **fraction** (0.8116,
not 81.16; Pearson's r lies in [-1, 1]), next to the counts it came from, so a score can be
checked by hand. Fractions are the one unit used inside the toolkit; the paper prints
percentages, and :meth:`BlurbScore.format` / :meth:`MeanStd.format` print them that way.

Conventions shared by all metrics
    * Empty input (no sequence, token, example or document) raises ValueError: a score of
      nothing is a bug upstream, not a number.
    * A ratio with a zero denominator is 0, never NaN (scikit-learn's ``zero_division=0``):
      no positive prediction gives precision 0 and F1 0, and a dataset with no gold positive and
      no predicted positive scores 0. So model selection on a dev set never meets a NaN.
    * F1 is ``2 * correct / (n_pred + n_gold)``, which equals ``2PR / (P + R)`` wherever that is
      defined and is 0 where it is not.
    * Gold and prediction must align one to one (same number of items; same length per
      sequence); a mismatch raises ValueError naming the first bad item. (These ValueErrors are
      :class:`biomed_lm.errors.InputError`s, the errors a caller fixes by changing an input.)

Metric ids (:func:`compute_metric`) and the BLURB datasets that use them
    ``entity_f1``            BC5-chem, BC5-disease, NCBI-disease, BC2GM, JNLPBA
    ``pico_token_macro_f1``  EBM PICO
    ``micro_f1_positive``    ChemProt (negative label "false"), DDI (negative "DDI-false")
    ``f1_positive``          GAD (the paper's "micro F1" of Table 3: with a single positive
                             class, micro F1 over the positive classes is that class's F1)
    ``pearson``              BIOSSES
    ``micro_f1_multilabel``  HoC
    ``accuracy``             PubMedQA, BioASQ

The BLURB score (section 2.3 and Table 6 of the paper) is the macro average over the six task
types of the mean score of each type's datasets, so the five NER datasets weigh as much together
as BIOSSES alone. :func:`blurb_score` reproduces every BLURB score the paper prints (Tables 6,
7, 9, 10, 11) from its per-dataset numbers to the printed two decimals; the plain mean of the 13
numbers would not (81.95 instead of PubMedBERT's 81.16).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Set
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping, NamedTuple, Sequence, get_args

import numpy as np
from scipy import stats
from seqeval.metrics.sequence_labeling import get_entities
from seqeval.scheme import BILOU, IOB2, Entities

from biomed_lm.errors import InputError
from biomed_lm.finetune.blurb import ACCURACY, ENTITY_F1, F1_POSITIVE, MICRO_F1_MULTILABEL, MICRO_F1_POSITIVE, PEARSON
from biomed_lm.finetune.blurb import METRIC_IDS as REGISTRY_METRIC_IDS
from biomed_lm.finetune.blurb import PICO_TOKEN_MACRO_F1
from biomed_lm.finetune.blurb import (BLURB_DATASETS, BLURB_METRIC_OF, BLURB_TASK_OF,  # noqa: F401
                                      BLURB_TASK_TYPES, canonical_dataset_name)
from biomed_lm.finetune.tagging import (OUTSIDE, TagSequenceError, is_valid_tags, normalize_scheme, split_tag,
                                        validate_tags)

# --------------------------------------------------------------------------- shared helpers


def _prf(n_correct: int, n_pred: int, n_gold: int) -> dict[str, Any]:
    """Precision, recall and F1 from counts, with the 0/0 -> 0 convention of the module doc."""
    return {
        "precision": n_correct / n_pred if n_pred else 0.0,
        "recall": n_correct / n_gold if n_gold else 0.0,
        "f1": 2 * n_correct / (n_pred + n_gold) if n_pred + n_gold else 0.0,
        "n_gold": int(n_gold),
        "n_pred": int(n_pred),
        "n_correct": int(n_correct),
    }


def _as_list(values: Any, what: str) -> list:
    """A 1-D sequence or array as a list of plain items (numpy scalars become Python ones)."""
    if isinstance(values, (str, bytes)) or isinstance(values, Mapping):
        raise InputError(f"{what} must be a sequence of labels, not a {type(values).__name__}")
    if isinstance(values, np.ndarray):
        if values.ndim != 1:
            raise InputError(f"{what} must be 1-D, not an array of shape {values.shape}")
        return values.tolist()
    return list(values)


def _paired(gold: Any, pred: Any) -> tuple[list, list]:
    gold_list, pred_list = _as_list(gold, "gold"), _as_list(pred, "pred")
    if len(gold_list) != len(pred_list):
        raise InputError(f"gold has {len(gold_list)} items but pred has {len(pred_list)}")
    if not gold_list:
        raise InputError("no examples to score (gold and pred are empty)")
    return gold_list, pred_list


def _check_labels_occur(labels: Iterable, gold: list, pred: list, role: str) -> None:
    """Refuse a positive/negative label that occurs nowhere: almost always a spelling mismatch
    (``"false"`` vs ``"False"``, ``1`` vs ``"1"``) that would silently change the score."""
    seen = set(gold) | set(pred)
    if not any(label in seen for label in labels):
        shown = ", ".join(sorted(map(repr, seen))[:20])
        raise InputError(f"the {role} label(s) {sorted(map(repr, labels))} occur in neither gold "
                         f"nor pred (labels seen: {shown}); check their spelling and type")


# --------------------------------------------------------------------------- NER


def _tag_sequences(seqs: Any, what: str) -> list[list[str]]:
    if isinstance(seqs, (str, bytes)):
        raise InputError(f"{what} must be a sequence of tag sequences, not a str")
    out = []
    for k, seq in enumerate(seqs):
        if isinstance(seq, (str, bytes)):
            raise InputError(f"{what} sequence {k} is a str; expected a sequence of tags")
        out.append(list(seq))
    return out


def _seqeval_entities(seqs: list[list[str]], scheme: str, mode: str) -> set[tuple]:
    """``(sequence index, start, end_exclusive, type)`` of every entity seqeval finds."""
    if mode == "strict":
        by_sentence = Entities(seqs, IOB2 if scheme == "bio" else BILOU).entities
        return {(e.sent_id, e.start, e.end, e.tag) for sentence in by_sentence for e in sentence}
    # conlleval reading. seqeval's default mode knows BIOES letters, not BILOU ones.
    rename = {"U": "S", "L": "E"}
    found = set()
    for k, seq in enumerate(seqs):
        if scheme == "bioul":
            seq = [rename.get(tag[:1], tag[:1]) + tag[1:] if tag != OUTSIDE else tag for tag in seq]
        found.update((k, start, end + 1, entity_type)
                     for entity_type, start, end in get_entities(seq))
    return found


#: How entity F1 reads ill-formed predicted chunks (:func:`entity_f1`).
NerF1Mode = Literal["conlleval", "strict"]
NER_F1_MODES: tuple[str, ...] = get_args(NerF1Mode)
#: The reading used unless a run says otherwise (here and ``FinetuneArgs.ner_f1_mode``).
DEFAULT_NER_F1_MODE: NerF1Mode = "conlleval"


def entity_f1(gold_tag_seqs: Sequence[Sequence[str]], pred_tag_seqs: Sequence[Sequence[str]],
              scheme: str = "bio", mode: str = DEFAULT_NER_F1_MODE, gold_scheme: str | None = None) -> dict[str, Any]:
    """Entity-level exact-match micro F1 (BLURB's NER metric), with precision and recall.

    An entity counts as correct only if its type, first and last token all match a gold entity;
    counts are pooled over all sequences and types (micro average), as in conlleval.

    ``mode="conlleval"`` (default) is seqeval's default mode, conlleval's reading and the one the
    field's numbers use (BLURB, the HF ``run_ner`` recipe): an ill-formed predicted chunk becomes
    an entity (an ``I-X`` that continues nothing is read as ``B-X``; a type change inside a span
    starts a new entity), the reading of :func:`finetune.tagging.to_spans`. ``mode="strict"``
    scores with seqeval's strict mode and the scheme's own grammar (``IOB2`` for BIO, ``BILOU``
    for BIOUL): an ill-formed chunk is no entity at all, so a model is not credited for tags its
    scheme forbids — lower scores on ill-formed predictions, which biases a tagging-scheme
    ablation toward IO. The two agree on valid sequences; ``n_invalid_pred_sequences`` says how
    many predictions they can disagree on. IO has no ill-formed sequences (a run of ``I-X`` is
    one entity), so it is always scored in the conlleval mode; the result's ``mode`` says which
    reading scored it.

    ``gold_scheme`` (default: ``scheme``) is the scheme the gold sequences are written in. The
    predictions of an IO run are scored against the file's own entities given in BIO
    (``scheme="io", gold_scheme="bio"``): gold converted to IO would merge an entity with the one of
    the same type that follows it, fewer and longer gold entities than the dataset has (NCBI-disease
    test: 955 of 960), and an IO run's F1 would not be comparable with a BIO run's (Table 13).

    Gold sequences must be valid in ``gold_scheme`` (TagSequenceError otherwise: a gold sequence the
    strict reading would silently truncate is a data bug). Tags outside the scheme's alphabet
    raise in gold and pred alike.
    """
    scheme = normalize_scheme(scheme)
    gold_scheme = scheme if gold_scheme is None else normalize_scheme(gold_scheme)
    if mode not in NER_F1_MODES:
        raise InputError(f"NER F1 mode must be one of {', '.join(NER_F1_MODES)}, not {mode!r}")
    gold = _tag_sequences(gold_tag_seqs, "gold")
    pred = _tag_sequences(pred_tag_seqs, "pred")
    if len(gold) != len(pred):
        raise InputError(f"gold has {len(gold)} sequences but pred has {len(pred)}")
    if not gold:
        raise InputError("no sequences to score (gold and pred are empty)")
    n_invalid = 0
    for k, (gold_seq, pred_seq) in enumerate(zip(gold, pred)):
        if len(gold_seq) != len(pred_seq):
            raise InputError(f"sequence {k}: gold has {len(gold_seq)} tags but pred has "
                             f"{len(pred_seq)}")
        try:
            validate_tags(gold_seq, gold_scheme)
        except TagSequenceError as err:
            raise TagSequenceError(f"gold sequence {k}, {err}", err.position) from None
        try:
            n_invalid += not is_valid_tags(pred_seq, scheme)
        except TagSequenceError as err:
            raise TagSequenceError(f"pred sequence {k}, {err}", err.position) from None
    mode = "conlleval" if scheme == "io" else mode
    # gold is valid in its scheme, where the two readings agree; IO has only the conlleval one
    gold_entities = _seqeval_entities(gold, gold_scheme, "conlleval" if gold_scheme == "io" else mode)
    pred_entities = _seqeval_entities(pred, scheme, mode)
    counts = _prf(len(gold_entities & pred_entities), len(pred_entities), len(gold_entities))
    return {"score": counts.pop("f1"), **counts, "n_sequences": len(gold),
            "n_invalid_pred_sequences": n_invalid, "scheme": scheme, "mode": mode,
            **({"gold_scheme": gold_scheme} if gold_scheme != scheme else {})}


# --------------------------------------------------------------------------- PICO


def _flat_binary(values: Any, what: str) -> np.ndarray:
    if isinstance(values, np.ndarray):
        array = values.ravel()
    else:
        items = list(values)
        if items and all(isinstance(item, (Sequence, np.ndarray)) and not isinstance(item, str)
                         for item in items):
            array = np.concatenate([np.asarray(item).ravel() for item in items])
        else:
            array = np.asarray(items)
    if array.size and not np.isin(array, (0, 1)).all():
        raise InputError(f"{what} must hold only 0/1 (or booleans)")
    return array.astype(bool)


def _token_elements(token: Any, elements: tuple[str, ...], where: str) -> set[str]:
    if isinstance(token, str):
        if token == OUTSIDE:
            return set()
        if token in elements:
            return {token}
        try:
            _, element = split_tag(token)
        except ValueError:
            element = None
        if element in elements:
            return {element}
        raise InputError(f"{where}: unknown PICO label {token!r} (elements: {', '.join(elements)}"
                         f"; 'O' or an empty set means none)")
    if isinstance(token, (Set, list, tuple)):
        found = set()
        for label in token:
            if label not in elements:
                raise InputError(f"{where}: unknown PICO element {label!r} in {token!r} "
                                 f"(elements: {', '.join(elements)})")
            found.add(label)
        return found
    raise InputError(f"{where}: a token's labels must be a str or a set of element names, "
                     f"not {type(token).__name__}")


def _pico_indicators(data: Any, elements: tuple[str, ...], what: str
                     ) -> tuple[dict[str, np.ndarray], list[int] | None]:
    """Per-element boolean token vectors and, for the nested form, each document's length."""
    if isinstance(data, Mapping):
        missing = [e for e in elements if e not in data]
        if missing:
            raise InputError(f"{what} has no array for element(s) {missing}")
        vectors = {e: _flat_binary(data[e], f"{what}[{e!r}]") for e in elements}
        lengths = {len(v) for v in vectors.values()}
        if len(lengths) > 1:
            raise InputError(f"{what}: the element arrays differ in length "
                             f"({ {e: len(v) for e, v in vectors.items()} })")
        return vectors, None
    if isinstance(data, (str, bytes)):
        raise InputError(f"{what} must be documents of per-token labels or a mapping "
                         f"element -> binary array, not a str")
    doc_lengths, columns = [], {e: [] for e in elements}
    for d, doc in enumerate(data):
        if isinstance(doc, (str, bytes)) or not isinstance(doc, (Sequence, np.ndarray)):
            raise InputError(f"{what} document {d} must be a sequence of per-token labels, not "
                             f"{type(doc).__name__} (nest flat token lists in a list: [tokens])")
        doc_lengths.append(len(doc))
        for t, token in enumerate(doc):
            labels = _token_elements(token, elements, f"{what} document {d}, token {t}")
            for e in elements:
                columns[e].append(e in labels)
    return {e: np.asarray(columns[e], dtype=bool) for e in elements}, doc_lengths


def pico_token_macro_f1(gold: Any, pred: Any, elements: Sequence[str] = ("PAR", "INT", "OUT")
                        ) -> dict[str, Any]:
    """BLURB's EBM PICO metric: word-level F1 of each PIO element, macro-averaged over elements.

    For each element, every token of the test set is one binary decision (in the element or
    not); true/false positives are pooled over all tokens of all abstracts, giving that element's
    F1; the score is the unweighted mean over the elements. This is what a public BLURB
    evaluation script computes (scikit-learn ``f1_score(average="macro", labels=[I-INT, I-OUT,
    I-PAR])`` over the concatenated tokens of the test set), generalised to tokens in several
    elements: the paper keeps the original EBM-NLP labels, where ~3% of PIO words lie in two
    overlapping elements, so a token's label is a *set*. With one label per token the two agree.

    ``gold`` and ``pred`` each take either form (they may differ):
      * documents of tokens, each token a set/list/tuple of element names or a str — an element
        name, a tag of it such as ``"I-PAR"``/``"B-PAR"``, or ``"O"`` for none; documents must
        then have equal lengths in gold and pred;
      * a mapping element -> 0/1 array over all tokens of the dataset (a 1-D array, or one
        array per document, concatenated in order).
    ``elements`` may not contain ``"O"``, which means "outside".
    """
    elements = tuple(elements)
    if not elements or len(set(elements)) != len(elements) or OUTSIDE in elements:
        raise InputError(f"elements must be distinct, non-empty and exclude 'O': {elements}")
    gold_vectors, gold_lengths = _pico_indicators(gold, elements, "gold")
    pred_vectors, pred_lengths = _pico_indicators(pred, elements, "pred")
    if gold_lengths is not None and pred_lengths is not None:
        if len(gold_lengths) != len(pred_lengths):
            raise InputError(f"gold has {len(gold_lengths)} documents but pred has "
                             f"{len(pred_lengths)}")
        for d, (g, p) in enumerate(zip(gold_lengths, pred_lengths)):
            if g != p:
                raise InputError(f"document {d}: gold has {g} tokens but pred has {p}")
    n_tokens = len(gold_vectors[elements[0]])
    if len(pred_vectors[elements[0]]) != n_tokens:
        raise InputError(f"gold has {n_tokens} tokens but pred has "
                         f"{len(pred_vectors[elements[0]])}")
    if n_tokens == 0:
        raise InputError("no tokens to score (gold and pred are empty)")
    per_element = {}
    for e in elements:
        g, p = gold_vectors[e], pred_vectors[e]
        per_element[e] = _prf(int(np.sum(g & p)), int(np.sum(p)), int(np.sum(g)))
    score = float(np.mean([per_element[e]["f1"] for e in elements]))
    return {"score": score, "per_element": per_element, "n_tokens": n_tokens,
            "elements": list(elements)}


# --------------------------------------------------------------------------- classification


def micro_f1_positive(gold_labels: Sequence, pred_labels: Sequence,
                      negative_labels: Any, label_set: Collection | None = None) -> dict[str, Any]:
    """Micro F1 over the positive classes (BLURB's ChemProt and DDI metric).

    Every label not in ``negative_labels`` is positive. precision = correct positive predictions
    / all positive predictions; recall = correct positive predictions / all gold positives; a
    positive prediction of the wrong positive class counts against both. Equal to scikit-learn's
    ``f1_score(average="micro", labels=<positive classes>)``. ChemProt: positives are CPR:3, 4,
    5, 6, 9, negative "false" (spelled ``"False"`` by finetune.datasets); DDI: the four
    interaction types, negative ``"DDI-false"``. ``negative_labels`` is one label or a
    collection; at least one of them must occur in gold or pred (a ValueError otherwise catches
    ``"false"`` passed for ``"False"``) — or, where the dataset's ``label_set`` is given (as the
    relation adapter gives it), be in that set: a split without a negative example then scores as
    scikit-learn scores it, not as an error.
    """
    gold, pred = _paired(gold_labels, pred_labels)
    negatives = set(negative_labels) if isinstance(negative_labels, Iterable) \
        and not isinstance(negative_labels, (str, bytes)) else {negative_labels}
    if not negatives:
        raise InputError("negative_labels is empty; use accuracy for micro F1 over all classes")
    if label_set is None:
        _check_labels_occur(negatives, gold, pred, "negative")
    elif not negatives <= set(label_set):
        raise InputError(f"negative label(s) {sorted(negatives - set(label_set), key=repr)} are not among the "
                         f"dataset's labels {sorted(label_set, key=repr)}")
    positives = sorted({label for label in gold + pred if label not in negatives}, key=repr)
    per_class = {}
    for label in positives:
        per_class[label] = _prf(sum(g == p == label for g, p in zip(gold, pred)),
                                pred.count(label), gold.count(label))
    counts = _prf(sum(g == p and g not in negatives for g, p in zip(gold, pred)),
                  sum(p not in negatives for p in pred), sum(g not in negatives for g in gold))
    return {"score": counts.pop("f1"), **counts, "per_class": per_class,
            "negative_labels": sorted(negatives, key=repr), "n_examples": len(gold)}


def binary_f1(gold: Sequence, pred: Sequence, positive: Any) -> dict[str, Any]:
    """F1 of the ``positive`` class (BLURB's GAD metric), with its precision and recall.

    ``positive`` is required. Where it occurs in neither gold nor pred, a ValueError catches a label
    of the wrong type (``1`` for GAD's ``"1"`` as finetune.datasets loads it) or spelling, which
    would otherwise score 0 silently; but when every item is one label of the positive's type, that
    label is the negative class and the split simply has no positive: F1 0, as the module's 0/0
    convention says (scikit-learn's ``zero_division=0``), not an error in the middle of a run.
    """
    gold_list, pred_list = _paired(gold, pred)
    seen = set(gold_list) | set(pred_list)
    # A lone label of the positive's type is read as the negative class: a split without positives
    # is far likelier than one whose every item is a misspelt positive.
    no_positive_anywhere = len(seen) == 1 and type(next(iter(seen))) is type(positive)
    if not no_positive_anywhere:
        _check_labels_occur([positive], gold_list, pred_list, "positive")
    counts = _prf(sum(g == p == positive for g, p in zip(gold_list, pred_list)),
                  pred_list.count(positive), gold_list.count(positive))
    return {"score": counts.pop("f1"), **counts, "positive": positive,
            "n_examples": len(gold_list)}


def accuracy(gold: Sequence, pred: Sequence) -> dict[str, Any]:
    """Fraction of exact label matches (BLURB's PubMedQA and BioASQ metric)."""
    gold_list, pred_list = _paired(gold, pred)
    n_correct = sum(g == p for g, p in zip(gold_list, pred_list))
    return {"score": n_correct / len(gold_list), "n_correct": n_correct,
            "n_examples": len(gold_list)}


def pearson(gold_scores: Sequence[float], pred_scores: Sequence[float]) -> dict[str, Any]:
    """Pearson's r between gold and predicted similarity scores (BLURB's BIOSSES metric).

    Needs at least two finite pairs (ValueError otherwise). r is undefined when either side is
    constant (a collapsed regressor predicting one value); the score is then 0 — no linear
    association is measured — with ``constant_input`` set, instead of scipy's NaN.
    """
    gold, pred = _paired(gold_scores, pred_scores)
    g = np.asarray(gold, dtype=float)
    p = np.asarray(pred, dtype=float)
    if len(g) < 2:
        raise InputError("Pearson's r needs at least two pairs")
    if not (np.isfinite(g).all() and np.isfinite(p).all()):
        raise InputError("gold and pred scores must be finite numbers")
    constant = bool(np.ptp(g) == 0 or np.ptp(p) == 0)
    if constant:
        return {"score": 0.0, "p_value": 1.0, "n_examples": len(g), "constant_input": True}
    result = stats.pearsonr(g, p)
    return {"score": float(result.statistic), "p_value": float(result.pvalue),
            "n_examples": len(g), "constant_input": False}


def _label_matrix(data: Any, labels: list, what: str) -> np.ndarray:
    if isinstance(data, np.ndarray) and data.ndim == 2:
        if data.shape[1] != len(labels):
            raise InputError(f"{what} has {data.shape[1]} columns for {len(labels)} labels")
        if data.size and not np.isin(data, (0, 1)).all():
            raise InputError(f"{what} must hold only 0/1 (or booleans)")
        return data.astype(bool)
    if isinstance(data, (str, bytes)):
        raise InputError(f"{what} must be a sequence of label sets, not a str")
    column = {label: j for j, label in enumerate(labels)}
    rows = []
    for d, doc_labels in enumerate(data):
        if isinstance(doc_labels, (str, bytes)) or not isinstance(
                doc_labels, (Set, list, tuple, np.ndarray)):
            raise InputError(f"{what} document {d}: expected a set/list of labels, not "
                             f"{doc_labels!r}")
        row = np.zeros(len(labels), dtype=bool)
        for label in (doc_labels.tolist() if isinstance(doc_labels, np.ndarray) else doc_labels):
            if label not in column:
                raise InputError(f"{what} document {d}: label {label!r} is not one of the "
                                 f"{len(labels)} labels given")
            row[column[label]] = True
        rows.append(row)
    return np.array(rows, dtype=bool).reshape(len(rows), len(labels))


def micro_f1_multilabel(gold_sets: Any, pred_sets: Any, labels: Sequence) -> dict[str, Any]:
    """Micro F1 over (document, label) decisions (BLURB's HoC metric).

    Each document has a set of labels (HoC: the ten top-level cancer hallmarks, at the abstract
    level); every (document, label) pair is one binary decision and true/false positives are
    pooled over all of them. The paper states this metric ("micro F1 across the ten cancer
    hallmarks ... evaluate on the abstract level"); BioGPT's HoC script (microsoft/BioGPT,
    examples/DC-HoC) also pools cells, though over an extra "empty" pseudo-class. Abstracts
    with no hallmark are kept: they contribute false positives only. (A later public BLURB
    evaluation script computes scikit-learn's *macro* F1 under the name ``average_micro_f1``;
    we follow the paper, and report the macro F1 over labels as a detail.)

    ``gold_sets``/``pred_sets``: a sequence of per-document label collections (a document
    without labels is an empty set), or a 2-D 0/1 array whose columns follow ``labels``. A label
    outside ``labels`` raises ValueError (drop pseudo-labels such as "empty" first).
    """
    labels = list(labels)
    if not labels or len(set(labels)) != len(labels):
        raise InputError("labels must be non-empty and distinct")
    g = _label_matrix(gold_sets, labels, "gold")
    p = _label_matrix(pred_sets, labels, "pred")
    if g.shape[0] != p.shape[0]:
        raise InputError(f"gold has {g.shape[0]} documents but pred has {p.shape[0]}")
    if g.shape[0] == 0:
        raise InputError("no documents to score (gold and pred are empty)")
    per_label = {label: _prf(int(np.sum(g[:, j] & p[:, j])), int(np.sum(p[:, j])),
                             int(np.sum(g[:, j])))
                 for j, label in enumerate(labels)}
    counts = _prf(int(np.sum(g & p)), int(np.sum(p)), int(np.sum(g)))
    return {"score": counts.pop("f1"), **counts,
            "macro_f1": float(np.mean([c["f1"] for c in per_label.values()])),
            "per_label": per_label, "n_documents": int(g.shape[0])}


# --------------------------------------------------------------------------- dispatch

METRICS: Mapping[str, Callable[..., dict[str, Any]]] = {
    ENTITY_F1: entity_f1,
    PICO_TOKEN_MACRO_F1: pico_token_macro_f1,
    MICRO_F1_POSITIVE: micro_f1_positive,
    F1_POSITIVE: binary_f1,
    PEARSON: pearson,
    MICRO_F1_MULTILABEL: micro_f1_multilabel,
    ACCURACY: accuracy,
}
assert tuple(METRICS) == REGISTRY_METRIC_IDS  # a function for every metric the registry names
METRIC_IDS = tuple(METRICS)


def compute_metric(metric_id: str, gold: Any, pred: Any, **kwargs: Any) -> dict[str, Any]:
    """Run the metric named ``metric_id`` (one of :data:`METRIC_IDS`) with its keyword arguments
    (``scheme=``, ``negative_labels=``, ``positive=``, ``labels=``, ...); the result is that
    metric's dict with ``"metric": metric_id`` added."""
    if metric_id not in METRICS:
        raise InputError(f"unknown metric {metric_id!r}: expected one of {', '.join(METRIC_IDS)}")
    return {"metric": metric_id, **METRICS[metric_id](gold, pred, **kwargs)}


# --------------------------------------------------------------------------- BLURB score

# Task families, datasets and their metrics are the registry's (finetune.blurb, pure data: scoring
# loads no reader); canonical_dataset_name is its one name lookup.

class MeanStd(NamedTuple):
    """Mean and sample standard deviation of one score over several runs (seeds)."""

    mean: float
    std: float
    n: int

    def format(self, scale: float = 100.0, digits: int = 2) -> str:
        """``"81.16 ± 0.42"`` (percent by default, as the paper prints); one run has no std."""
        if self.n == 1:
            return f"{self.mean * scale:.{digits}f} (1 run)"
        return f"{self.mean * scale:.{digits}f} ± {self.std * scale:.{digits}f}"


def mean_std(values: Iterable[float]) -> MeanStd:
    """Mean and *sample* standard deviation (``ddof=1``) of per-seed scores.

    The paper reports the average over 10 runs (BIOSSES, BioASQ, PubMedQA) or 5 (the others);
    the seeds are a sample of the run-to-run distribution, hence ddof=1. With one value the
    sample std is undefined and is NaN (formatted as "(1 run)"); no value, or a non-finite
    one, raises ValueError.
    """
    array = np.asarray([float(v) for v in values], dtype=float)
    if array.size == 0:
        raise InputError("mean_std needs at least one value")
    if not np.isfinite(array).all():
        raise InputError(f"mean_std got a non-finite value: {array.tolist()}")
    std = float(np.std(array, ddof=1)) if array.size > 1 else math.nan
    return MeanStd(float(np.mean(array)), std, int(array.size))


@dataclass(frozen=True)
class BlurbScore:
    """A BLURB score with what it was computed from. Scores are fractions.

    ``score`` is the macro average of ``task_scores`` (each the mean of its present datasets).
    When datasets or whole task types are missing the score is *partial*: it is not comparable
    with the paper's BLURB scores, and ``label``/``str()`` say so.
    """

    score: float
    task_scores: dict[str, float]
    dataset_scores: dict[str, float]
    missing_datasets: tuple[str, ...] = field(default=())
    missing_tasks: tuple[str, ...] = field(default=())

    @property
    def is_partial(self) -> bool:
        return bool(self.missing_datasets)

    @property
    def present_tasks(self) -> tuple[str, ...]:
        return tuple(self.task_scores)

    @property
    def label(self) -> str:
        if not self.is_partial:
            return "BLURB score"
        return (f"partial BLURB score ({len(self.dataset_scores)}/{len(BLURB_DATASETS)} datasets, "
                f"{len(self.task_scores)}/{len(BLURB_TASK_TYPES)} task types; not scored: "
                f"{', '.join(self.missing_datasets)})")

    def format(self, scale: float = 100.0, digits: int = 2) -> str:
        """One line, percent by default: ``"BLURB score 81.16"``."""
        return f"{self.label} {self.score * scale:.{digits}f}"

    def __str__(self) -> str:
        return self.format()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (fractions)."""
        return {"score": self.score, "partial": self.is_partial, "label": self.label,
                "task_scores": dict(self.task_scores), "dataset_scores": dict(self.dataset_scores),
                "missing_datasets": list(self.missing_datasets),
                "missing_tasks": list(self.missing_tasks)}


def _score_value(value: Any, dataset: str) -> float:
    if isinstance(value, MeanStd):
        value = value.mean
    elif isinstance(value, Mapping):
        if "score" not in value:
            raise InputError(f"{dataset}: a result mapping needs a 'score' key")
        value = value["score"]
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{dataset}: {value!r} is not a score") from None
    if not math.isfinite(number):
        raise InputError(f"{dataset}: score {number} is not finite")
    return number


def blurb_score(results: Mapping[str, Any], *, percent: bool = False,
                require_complete: bool = False) -> BlurbScore:
    """The BLURB score of per-dataset results: mean per task type, then mean over task types.

    ``results`` maps dataset names (any spelling :func:`canonical_dataset_name` accepts) to a
    score, a metric result dict (its ``"score"``) or a :class:`MeanStd` (its mean). Scores are
    fractions; pass ``percent=True`` for numbers printed as percentages (the paper's tables),
    which are divided by 100 — a value outside [-1, 1] without it raises ValueError, so the two
    units cannot be mixed by accident. Datasets that are absent are left out of their type's
    mean and types with no dataset out of the macro average; the result is then marked partial,
    or ``require_complete=True`` raises ValueError instead. Unknown or duplicate datasets raise.
    """
    if not results:
        raise InputError("no results: the BLURB score needs at least one dataset")
    bound = 100.0 if percent else 1.0
    dataset_scores: dict[str, float] = {}
    for name, value in results.items():
        dataset = canonical_dataset_name(name)
        if dataset in dataset_scores:
            raise InputError(f"{name!r} duplicates another entry for {dataset!r}")
        number = _score_value(value, dataset)
        if not -bound <= number <= bound:
            hint = "; pass percent=True for percentages" if not percent and abs(number) <= 100 \
                else ""
            raise InputError(f"{dataset}: score {number} is outside [-{bound:g}, {bound:g}]{hint}")
        dataset_scores[dataset] = number / bound
    ordered = {d: dataset_scores[d] for d in BLURB_DATASETS if d in dataset_scores}
    task_scores = {task: float(np.mean([ordered[d] for d in datasets if d in ordered]))
                   for task, datasets in BLURB_TASK_TYPES.items()
                   if any(d in ordered for d in datasets)}
    missing_datasets = tuple(d for d in BLURB_DATASETS if d not in ordered)
    missing_tasks = tuple(t for t in BLURB_TASK_TYPES if t not in task_scores)
    if require_complete and missing_datasets:
        raise InputError(f"incomplete BLURB results: missing {', '.join(missing_datasets)}")
    return BlurbScore(score=float(np.mean(list(task_scores.values()))), task_scores=task_scores,
                      dataset_scores=ordered, missing_datasets=missing_datasets,
                      missing_tasks=missing_tasks)
