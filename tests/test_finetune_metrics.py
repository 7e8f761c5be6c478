"""BLURB metrics and the BLURB score (finetune/metrics.py).

Each metric is checked on a small example whose arithmetic is written out in the comments, on
its edge cases, and (property tests) against the reference implementation it must agree with
(seqeval, scikit-learn, numpy). The BLURB score is checked against every column of the paper's
Tables 6, 7, 9, 10 and 11: the per-dataset numbers must give the printed BLURB score.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from seqeval.metrics import f1_score as seqeval_f1
from seqeval.metrics import precision_score as seqeval_precision
from seqeval.metrics import recall_score as seqeval_recall
from seqeval.scheme import BILOU, IOB2
from sklearn.metrics import f1_score as sk_f1
from sklearn.preprocessing import MultiLabelBinarizer

from biomed_lm.finetune.metrics import (BLURB_DATASETS, BLURB_METRIC_OF, BLURB_TASK_OF, BLURB_TASK_TYPES, METRIC_IDS,
                                        BlurbScore, MeanStd, accuracy, binary_f1, blurb_score, canonical_dataset_name,
                                        compute_metric, entity_f1, mean_std, micro_f1_multilabel, micro_f1_positive,
                                        pearson, pico_token_macro_f1)
from biomed_lm.finetune.tagging import TagSequenceError, convert_tags, from_spans, is_lossless_to_io

PROPS = settings(max_examples=200, deadline=None)

# --------------------------------------------------------------------------- entity F1


def test_entity_f1_hand_example():
    gold = [["B-Chem", "I-Chem", "O", "B-Dis", "O"],
            ["O", "B-Dis", "I-Dis", "I-Dis"]]
    pred = [["B-Chem", "I-Chem", "O", "B-Dis", "I-Dis"],   # Dis (3,5) has the wrong end
            ["B-Chem", "B-Dis", "I-Dis", "I-Dis"]]         # Chem (0,1) is spurious
    # gold: Chem(0,2) Dis(3,4) | Dis(1,4)                    -> 3 entities
    # pred: Chem(0,2) Dis(3,5) | Chem(0,1) Dis(1,4)          -> 4 entities, 2 exact matches
    # P = 2/4, R = 2/3, F1 = 2*2 / (4 + 3) = 4/7
    result = entity_f1(gold, pred)
    assert result["precision"] == pytest.approx(1 / 2)
    assert result["recall"] == pytest.approx(2 / 3)
    assert result["score"] == pytest.approx(4 / 7)
    assert (result["n_gold"], result["n_pred"], result["n_correct"]) == (3, 4, 2)
    assert result["mode"] == "conlleval" and result["n_invalid_pred_sequences"] == 0


def test_entity_f1_needs_the_type_to_match():
    # Same span, wrong type: 0 correct of 1 predicted, 1 gold -> F1 0.
    assert entity_f1([["B-Chem", "O"]], [["B-Dis", "O"]])["score"] == 0.0


def test_strict_and_conlleval_differ_on_an_invalid_i():
    gold = [["B-X", "I-X", "O", "B-Y"]]
    pred = [["O", "I-X", "O", "B-Y"]]          # I-X at 1 continues nothing
    # strict (IOB2): the ill-formed chunk is no entity; pred = {Y(3,4)}:
    #   P = 1/1, R = 1/2, F1 = 2*1/(1+2) = 2/3
    strict = entity_f1(gold, pred, mode="strict")
    assert (strict["precision"], strict["recall"]) == (1.0, 0.5)
    assert strict["score"] == pytest.approx(2 / 3)
    assert strict["n_invalid_pred_sequences"] == 1
    # conlleval: I-X is read as B-X; pred = {X(1,2), Y(3,4)}: P = 1/2, R = 1/2, F1 = 1/2
    conll = entity_f1(gold, pred)
    assert (conll["precision"], conll["recall"], conll["score"]) == (0.5, 0.5, 0.5)
    assert conll["mode"] == "conlleval"
    # And the other way: a whole entity tagged I-X I-X is right for conlleval, absent for strict.
    gold, pred = [["B-X", "I-X", "O"]], [["I-X", "I-X", "O"]]
    assert entity_f1(gold, pred, mode="strict")["score"] == 0.0  # 0 predicted -> P = R = F1 = 0
    assert entity_f1(gold, pred)["score"] == 1.0                 # X(0,2) matches
    # Both readings agree with seqeval's own scorers.
    assert seqeval_f1(gold, pred, mode="strict", scheme=IOB2, zero_division=0) == 0.0
    assert seqeval_f1(gold, pred) == 1.0


def test_entity_f1_bioul_strict():
    gold = [["B-X", "L-X", "U-Y", "O"]]
    assert entity_f1(gold, gold, scheme="bioul")["score"] == 1.0
    pred = [["B-X", "I-X", "U-Y", "O"]]     # X never closed by L-X
    # strict: pred = {Y}: P = 1, R = 1/2, F1 = 2/3; conlleval: X(0,2) and Y both match: F1 = 1
    assert entity_f1(gold, pred, scheme="bioul", mode="strict")["score"] == pytest.approx(2 / 3)
    assert entity_f1(gold, pred, scheme="bioul")["score"] == 1.0


def test_the_default_is_conlleval_and_the_modes_differ_where_the_field_says():
    """Hand-made predictions on which seqeval's default (conlleval) and strict readings differ."""
    cases = [  # (scheme, gold, pred, conlleval F1, strict F1)
        # I- without B-: conlleval reads I-X as B-X (the entity is found), strict drops it
        ("bio", [["O", "B-X", "I-X", "O"]], [["O", "I-X", "I-X", "O"]], 1.0, 0.0),
        # a type change inside a span: conlleval splits it into X(1,2) and Y(2,3); strict keeps X
        # and drops the ill-formed I-Y, so it predicts one entity where conlleval predicts two
        ("bio", [["O", "B-X", "B-Y", "O"]], [["O", "B-X", "I-Y", "O"]], 1.0, 2 / 3),
        # BIOUL singletons: a lone B-X (never closed) and a lone L-X are entities for conlleval
        # (read as U-X), none for strict
        ("bioul", [["U-X", "O", "U-X"]], [["B-X", "O", "L-X"]], 1.0, 0.0),
        # a well-formed BIOUL singleton scores the same in both readings
        ("bioul", [["U-X", "O", "O"]], [["U-X", "O", "O"]], 1.0, 1.0),
    ]
    for scheme, gold, pred, conll, strict in cases:
        default = entity_f1(gold, pred, scheme=scheme)
        assert default["mode"] == "conlleval"
        assert default["score"] == pytest.approx(conll), (scheme, pred)
        assert entity_f1(gold, pred, scheme=scheme, mode="strict")["score"] == pytest.approx(strict), (scheme, pred)
    with pytest.raises(ValueError, match="conlleval, strict"):
        entity_f1([["B-X"]], [["B-X"]], mode="lenient")


def test_entity_f1_io():
    gold = [["I-X", "I-X", "O", "I-Y"]]
    pred = [["I-X", "O", "O", "I-Y"]]
    # gold {X(0,2), Y(3,4)}, pred {X(0,1), Y(3,4)}: 1 of 2 and 1 of 2 -> F1 = 1/2
    result = entity_f1(gold, pred, scheme="io")
    assert result["score"] == 0.5 and result["mode"] == "conlleval"


def test_an_io_run_is_scored_against_the_files_own_entities():
    """Gold converted to IO merges two touching entities of one type into one: an IO run that
    predicts that one span would score F1 1.0 against 2 real entities. Scored against the gold in
    BIO (``gold_scheme``), it finds 0 of the 2."""
    gold_bio = [["B-X", "B-X", "O", "B-Y"]]
    pred_io = [["I-X", "I-X", "O", "I-Y"]]
    merged = entity_f1([["I-X", "I-X", "O", "I-Y"]], pred_io, scheme="io")
    assert merged["score"] == 1.0
    result = entity_f1(gold_bio, pred_io, scheme="io", gold_scheme="bio")
    # gold {X(0,1), X(1,2), Y(3,4)}, pred {X(0,2), Y(3,4)}: 1 correct, P 1/2, R 1/3
    assert (result["precision"], result["recall"]) == (0.5, pytest.approx(1 / 3))
    assert result["gold_scheme"] == "bio" and result["scheme"] == "io"
    with pytest.raises(ValueError, match="gold sequence 0"):  # gold is checked in its own scheme
        entity_f1([["O", "I-X"]], [["O", "I-X"]], scheme="io", gold_scheme="bio")


def test_entity_f1_edge_cases():
    # No predicted entity: precision 0/0 -> 0, recall 0/1, F1 0 (never NaN).
    result = entity_f1([["B-X"]], [["O"]])
    assert (result["precision"], result["recall"], result["score"]) == (0.0, 0.0, 0.0)
    # No entity anywhere: 0 by the same convention.
    assert entity_f1([["O", "O"]], [["O", "O"]])["score"] == 0.0
    with pytest.raises(ValueError, match="no sequences"):
        entity_f1([], [])
    with pytest.raises(ValueError, match="2 sequences but pred has 1"):
        entity_f1([["O"], ["O"]], [["O"]])
    with pytest.raises(ValueError, match="sequence 1: gold has 2 tags but pred has 1"):
        entity_f1([["O"], ["O", "O"]], [["O"], ["O"]])
    with pytest.raises(TagSequenceError, match="gold sequence 0, position 1"):
        entity_f1([["O", "I-X"]], [["O", "O"]])
    with pytest.raises(TagSequenceError, match="pred sequence 0, position 0: tag 'U-X'"):
        entity_f1([["B-X"]], [["U-X"]])
    with pytest.raises(ValueError, match="sequence 0 is a str"):
        entity_f1(["B-X O"], ["B-X O"])


@st.composite
def gold_and_pred(draw, scheme):
    """Valid gold sequences and arbitrary (often invalid) predictions of the same lengths."""
    n = draw(st.integers(1, 4))
    prefixes = {"bio": "BI", "bioul": "BILU", "io": "I"}[scheme]
    tag = st.one_of(st.just("O"), st.builds(lambda p, t: f"{p}-{t}", st.sampled_from(prefixes),
                                            st.sampled_from("XY")))
    gold, pred = [], []
    for _ in range(n):
        length = draw(st.integers(0, 12))
        spans, pos = [], 0
        while pos < length and draw(st.booleans()):
            start = draw(st.integers(pos, length - 1))
            end = draw(st.integers(start + 1, min(length, start + 3)))
            spans.append((start, end, draw(st.sampled_from("XY"))))
            pos = end
        gold.append(from_spans(spans, length, scheme))
        pred.append(draw(st.lists(tag, min_size=length, max_size=length)))
    return gold, pred


@PROPS
@given(st.sampled_from(["bio", "bioul", "io"]).flatmap(
    lambda s: st.tuples(st.just(s), gold_and_pred(s))), st.booleans())
def test_entity_f1_agrees_with_seqeval(data, strict):
    scheme, (gold, pred) = data
    result = entity_f1(gold, pred, scheme=scheme, mode="strict" if strict else "conlleval")
    if strict and scheme != "io":
        kw = {"mode": "strict", "scheme": IOB2 if scheme == "bio" else BILOU}
    else:
        kw = {}
        if scheme == "bioul":   # seqeval's default mode spells BILOU as BIOES
            ren = lambda s: [{"U": "S", "L": "E"}.get(t[0], t[0]) + t[1:] for t in s]  # noqa
            gold, pred = [ren(s) for s in gold], [ren(s) for s in pred]
    assert result["score"] == pytest.approx(seqeval_f1(gold, pred, zero_division=0, **kw))
    assert result["precision"] == pytest.approx(
        seqeval_precision(gold, pred, zero_division=0, **kw))
    assert result["recall"] == pytest.approx(seqeval_recall(gold, pred, zero_division=0, **kw))


@PROPS
@given(gold_and_pred("bio"))
def test_entity_f1_does_not_depend_on_the_encoding(data):
    # Valid gold and conll-repaired predictions carry the same entities in BIO and BIOUL, and in
    # IO whenever no two same-type entities touch.
    gold, pred = data
    conll = entity_f1(gold, pred, scheme="bio")["score"]
    to = lambda seqs, target: [convert_tags(s, "bio", target) for s in seqs]  # noqa: E731
    assert entity_f1(to(gold, "bioul"), to(pred, "bioul"), scheme="bioul")["score"] == \
        pytest.approx(conll)
    if all(is_lossless_to_io(s) for s in gold + pred):
        assert entity_f1(to(gold, "io"), to(pred, "io"), scheme="io")["score"] == \
            pytest.approx(conll)


# --------------------------------------------------------------------------- PICO


def test_pico_hand_example_with_overlapping_elements():
    gold = [[{"PAR"}, {"PAR", "INT"}, set(), {"OUT"}],   # token 1 is both P and I
            ["OUT", "O", "I-INT"]]                       # str labels, tags of elements too
    pred = [[{"PAR"}, {"PAR"}, {"INT"}, {"OUT"}],
            ["OUT", "OUT", "O"]]
    # PAR: gold {d0t0, d0t1}, pred {d0t0, d0t1}        -> 2 correct, F1 = 2*2/(2+2) = 1
    # INT: gold {d0t1, d1t2}, pred {d0t2}              -> 0 correct, F1 = 0
    # OUT: gold {d0t3, d1t0}, pred {d0t3, d1t0, d1t1}  -> 2 correct, F1 = 2*2/(3+2) = 4/5
    # macro = (1 + 0 + 0.8) / 3 = 0.6
    result = pico_token_macro_f1(gold, pred)
    assert result["score"] == pytest.approx(0.6)
    assert result["per_element"]["OUT"]["precision"] == pytest.approx(2 / 3)
    assert result["per_element"]["INT"]["f1"] == 0.0
    assert result["n_tokens"] == 7
    # The same data as per-element binary arrays over the 7 concatenated tokens.
    gold_arrays = {"PAR": [1, 1, 0, 0, 0, 0, 0], "INT": [0, 1, 0, 0, 0, 0, 1],
                   "OUT": np.array([0, 0, 0, 1, 1, 0, 0])}
    pred_arrays = {"PAR": [[1, 1, 0, 0], [0, 0, 0]],          # one array per document
                   "INT": [[0, 0, 1, 0], [0, 0, 0]], "OUT": [[0, 0, 0, 1], [1, 1, 0]]}
    assert pico_token_macro_f1(gold_arrays, pred_arrays)["score"] == pytest.approx(0.6)
    assert pico_token_macro_f1(gold, pred_arrays)["score"] == pytest.approx(0.6)


def test_pico_edge_cases():
    with pytest.raises(ValueError, match="no tokens"):
        pico_token_macro_f1([[]], [[]])
    with pytest.raises(ValueError, match="document 0: gold has 2 tokens but pred has 1"):
        pico_token_macro_f1([["O", "O"]], [["O"]])
    with pytest.raises(ValueError, match="unknown PICO label 'COMP'"):
        pico_token_macro_f1([["COMP"]], [["O"]])
    with pytest.raises(ValueError, match="unknown PICO element 'P'"):
        pico_token_macro_f1([[{"P"}]], [["O"]])
    with pytest.raises(ValueError, match="document 0 must be a sequence"):
        pico_token_macro_f1(["PAR", "O"], ["PAR", "O"])        # flat tokens, not documents
    with pytest.raises(ValueError, match="exclude 'O'"):
        pico_token_macro_f1([["P"]], [["P"]], elements=("P", "I", "O"))
    with pytest.raises(ValueError, match="no array for element"):
        pico_token_macro_f1({"PAR": [1]}, [["PAR"]])
    with pytest.raises(ValueError, match="only 0/1"):
        pico_token_macro_f1({"PAR": [2], "INT": [0], "OUT": [0]}, [["PAR"]])
    # Nothing predicted: every element F1 is 0.
    assert pico_token_macro_f1([["PAR", "INT", "OUT"]], [["O", "O", "O"]])["score"] == 0.0


@PROPS
@given(st.lists(st.tuples(st.sampled_from(["O", "PAR", "INT", "OUT"]),
                          st.sampled_from(["O", "PAR", "INT", "OUT"])), min_size=1, max_size=40))
def test_pico_equals_the_blurb_evaluator_on_single_label_tokens(pairs):
    # The public BLURB evaluator: sklearn macro F1 over the element labels of all tokens.
    gold, pred = [p[0] for p in pairs], [p[1] for p in pairs]
    expected = sk_f1(gold, pred, average="macro", labels=["PAR", "INT", "OUT"], zero_division=0)
    assert pico_token_macro_f1([gold], [pred])["score"] == pytest.approx(expected)


# --------------------------------------------------------------------------- relation extraction


def test_micro_f1_positive_chemprot_example():
    gold = ["CPR:3", "CPR:4", "false", "CPR:9", "false", "CPR:3"]
    pred = ["CPR:3", "CPR:3", "CPR:4", "CPR:9", "false", "CPR:3"]
    # positive predictions: 0 (CPR:3 ok) 1 (CPR:3, gold CPR:4) 2 (CPR:4, gold false) 3 (ok) 5 (ok)
    #   -> 5 predicted, 3 correct; gold positives: 0 1 3 5 -> 4
    # P = 3/5, R = 3/4, F1 = 2*3/(5+4) = 2/3   (accuracy would be 4/6: it credits false=false)
    result = micro_f1_positive(gold, pred, negative_labels="false")
    assert (result["precision"], result["recall"]) == (pytest.approx(3 / 5), pytest.approx(3 / 4))
    assert result["score"] == pytest.approx(2 / 3)
    # CPR:3: gold {0, 5}, pred {0, 1, 5}, correct 2 -> P 2/3, R 1, F1 4/5
    assert result["per_class"]["CPR:3"]["f1"] == pytest.approx(4 / 5)
    assert accuracy(gold, pred)["score"] == pytest.approx(4 / 6)
    assert result["score"] == pytest.approx(
        sk_f1(gold, pred, average="micro", labels=["CPR:3", "CPR:4", "CPR:9"]))


def test_micro_f1_positive_ddi_and_edge_cases():
    gold = ["DDI-effect", "DDI-mechanism", "DDI-false", "DDI-int"]
    pred = ["DDI-effect", "DDI-false", "DDI-false", "DDI-advise"]
    # pred positives 0 (ok), 3 (wrong) -> 2, 1 correct; gold positives 0 1 3 -> 3
    # P = 1/2, R = 1/3, F1 = 2*1/(2+3) = 2/5
    assert micro_f1_positive(gold, pred, ["DDI-false"])["score"] == pytest.approx(2 / 5)
    # No positive prediction: P = 0/0 -> 0, F1 = 0.
    result = micro_f1_positive(["CPR:3", "false"], ["false", "false"], "false")
    assert (result["precision"], result["recall"], result["score"]) == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="occur in neither gold nor pred"):
        micro_f1_positive(["CPR:3", "false"], ["false", "false"], "False")
    with pytest.raises(ValueError, match="no examples"):
        micro_f1_positive([], [], "false")
    with pytest.raises(ValueError, match="2 items but pred has 1"):
        micro_f1_positive(["a", "b"], ["a"], "b")
    # Integer labels and numpy arrays work.
    assert micro_f1_positive(np.array([1, 0, 2]), np.array([1, 0, 0]), 0)["score"] == \
        pytest.approx(2 / 3)   # pred positives {0}, gold positives {0, 2}: 2*1/(1+2)


def test_micro_f1_positive_with_the_label_set_scores_a_split_without_a_negative():
    """A split whose gold and predictions hold no negative raised (the negative could be misspelt); with the
    dataset's labels, as the relation adapter passes them, it scores as scikit-learn does, and a misspelt
    negative is still refused."""
    labels = ["CPR:3", "CPR:4", "False"]
    assert micro_f1_positive(["CPR:3"], ["CPR:4"], "False", label_set=labels)["score"] == 0.0 == \
        sk_f1(["CPR:3"], ["CPR:4"], average="micro", labels=["CPR:3", "CPR:4"], zero_division=0)
    assert micro_f1_positive(["CPR:3", "CPR:4"], ["CPR:3", "CPR:3"], "False", label_set=labels)["score"] == \
        pytest.approx(sk_f1(["CPR:3", "CPR:4"], ["CPR:3", "CPR:3"], average="micro", labels=["CPR:3", "CPR:4"]))
    with pytest.raises(ValueError, match=r"negative label\(s\) \['false'\] are not among the dataset's labels"):
        micro_f1_positive(["CPR:3"], ["CPR:4"], "false", label_set=labels)


def test_binary_f1_gad_example():
    gold = [1, 1, 0, 0, 1]
    pred = [1, 0, 1, 1, 1]
    # TP = 2 (items 0, 4); predicted positives 4; gold positives 3
    # P = 2/4, R = 2/3, F1 = 2*2/(4+3) = 4/7
    result = binary_f1(gold, pred, positive=1)
    assert (result["precision"], result["recall"]) == (0.5, pytest.approx(2 / 3))
    assert result["score"] == pytest.approx(4 / 7)
    assert binary_f1([1, 0], [0, 0], 1)["score"] == 0.0          # no positive prediction
    with pytest.raises(ValueError, match="positive label"):
        binary_f1(gold, pred, positive="1")                      # wrong type: caught


def test_binary_f1_scores_a_split_without_any_positive_as_zero():
    # A dev/test split with no gold positive, scored for a model that predicts none: F1 is 0 by the
    # module's 0/0 convention (scikit-learn's zero_division=0), not an error that stops the run.
    result = binary_f1(["0", "0", "0"], ["0", "0", "0"], positive="1")
    assert (result["score"], result["n_gold"], result["n_pred"]) == (0.0, 0, 0)
    assert result["score"] == sk_f1(["0"] * 3, ["0"] * 3, pos_label="1", labels=["0", "1"], zero_division=0)
    # The guard against a misspelt positive still holds where the labels seen say so: another type,
    # or two labels of which neither is the positive.
    with pytest.raises(ValueError, match="positive label"):
        binary_f1([0, 0], [0, 0], positive="0")
    with pytest.raises(ValueError, match="positive label"):
        binary_f1(["0", "1"], ["0", "0"], positive="yes")


@PROPS
@given(st.lists(st.tuples(st.sampled_from(["false", "A", "B", "C"]),
                          st.sampled_from(["false", "A", "B", "C"])), min_size=1, max_size=40))
def test_positive_f1s_agree_with_sklearn(pairs):
    gold, pred = [p[0] for p in pairs], [p[1] for p in pairs]
    assume("false" in gold + pred)
    positives = sorted({x for x in gold + pred if x != "false"})
    assume(positives)
    assert micro_f1_positive(gold, pred, "false")["score"] == pytest.approx(
        sk_f1(gold, pred, average="micro", labels=positives, zero_division=0))
    assume("A" in gold + pred)
    assert binary_f1(gold, pred, "A")["score"] == pytest.approx(
        sk_f1(gold, pred, average=None, labels=["A"], zero_division=0)[0])


# --------------------------------------------------------------------------- similarity, QA


def test_pearson_hand_example():
    # x = 1 2 3 4, y = 1 3 2 4: deviations (-1.5 -0.5 0.5 1.5) and (-1.5 0.5 -0.5 1.5)
    # sum dx*dy = 2.25 - 0.25 - 0.25 + 2.25 = 4; sum dx^2 = sum dy^2 = 5 -> r = 4/5
    assert pearson([1, 2, 3, 4], [1, 3, 2, 4])["score"] == pytest.approx(0.8)
    assert pearson([1, 2, 3, 4], [2, 4, 6, 8])["score"] == pytest.approx(1.0)
    assert pearson(np.array([0.0, 4.0]), np.array([4.0, 0.0]))["score"] == pytest.approx(-1.0)


def test_pearson_edge_cases():
    constant = pearson([1, 2, 3], [2.5, 2.5, 2.5])
    assert constant["score"] == 0.0 and constant["constant_input"] is True
    with pytest.raises(ValueError, match="at least two"):
        pearson([1.0], [1.0])
    with pytest.raises(ValueError, match="finite"):
        pearson([1.0, float("nan")], [1.0, 2.0])


@PROPS
@given(st.lists(st.tuples(st.floats(-5, 5), st.floats(-5, 5)), min_size=3, max_size=30))
def test_pearson_agrees_with_numpy(pairs):
    g, p = np.array(pairs).T
    assume(np.ptp(g) > 1e-3 and np.ptp(p) > 1e-3)
    assert pearson(g, p)["score"] == pytest.approx(np.corrcoef(g, p)[0, 1], abs=1e-9)


def test_accuracy_hand_example():
    # yes=yes, no!=yes, maybe=maybe, yes!=no -> 2/4
    result = accuracy(["yes", "no", "maybe", "yes"], ["yes", "yes", "maybe", "no"])
    assert (result["score"], result["n_correct"], result["n_examples"]) == (0.5, 2, 4)
    with pytest.raises(ValueError, match="no examples"):
        accuracy([], [])


# --------------------------------------------------------------------------- HoC


def test_micro_f1_multilabel_hand_example():
    labels = ["GS", "TPI", "RI"]
    gold = [{"GS"}, {"TPI", "RI"}, set()]
    pred = [{"GS", "RI"}, ["TPI"], ("GS",)]
    # (document, label) cells: gold positives GS/d0 TPI/d1 RI/d1 -> 3
    #   pred positives GS/d0 RI/d0 TPI/d1 GS/d2 -> 4; correct GS/d0 TPI/d1 -> 2
    # P = 2/4, R = 2/3, F1 = 2*2/(4+3) = 4/7
    result = micro_f1_multilabel(gold, pred, labels)
    assert (result["precision"], result["recall"]) == (0.5, pytest.approx(2 / 3))
    assert result["score"] == pytest.approx(4 / 7)
    # per label: GS 2*1/(2+1) = 2/3, TPI 1, RI 0 -> macro (2/3 + 1 + 0)/3 = 5/9
    assert result["macro_f1"] == pytest.approx(5 / 9)
    # The same as 0/1 matrices with columns in label order.
    g = np.array([[1, 0, 0], [0, 1, 1], [0, 0, 0]])
    p = np.array([[1, 0, 1], [0, 1, 0], [1, 0, 0]])
    assert micro_f1_multilabel(g, p, labels)["score"] == pytest.approx(4 / 7)
    assert micro_f1_multilabel(g, p, labels)["score"] == pytest.approx(
        sk_f1(g, p, average="micro"))


def test_micro_f1_multilabel_edge_cases():
    with pytest.raises(ValueError, match="'empty' is not one of the 2 labels"):
        micro_f1_multilabel([{"empty"}], [set()], ["GS", "RI"])
    with pytest.raises(ValueError, match="no documents"):
        micro_f1_multilabel([], [], ["GS"])
    with pytest.raises(ValueError, match="expected a set/list of labels"):
        micro_f1_multilabel(["GS"], [{"GS"}], ["GS"])
    with pytest.raises(ValueError, match="3 columns for 2 labels"):
        micro_f1_multilabel(np.zeros((1, 3)), np.zeros((1, 3)), ["a", "b"])
    # Nothing predicted: 0.
    assert micro_f1_multilabel([{"GS"}], [set()], ["GS"])["score"] == 0.0


@PROPS
@given(st.lists(st.tuples(st.sets(st.sampled_from("abcd")), st.sets(st.sampled_from("abcd"))),
                min_size=1, max_size=20))
def test_micro_f1_multilabel_agrees_with_sklearn(docs):
    labels = list("abcd")
    gold, pred = [d[0] for d in docs], [d[1] for d in docs]
    binarize = MultiLabelBinarizer(classes=labels).fit_transform
    assert micro_f1_multilabel(gold, pred, labels)["score"] == pytest.approx(
        sk_f1(binarize(gold), binarize(pred), average="micro", zero_division=0))


# --------------------------------------------------------------------------- dispatch


def test_compute_metric_dispatches_every_id():
    cases = {
        "entity_f1": ([["B-X"]], [["B-X"]], {"scheme": "bio"}),
        "pico_token_macro_f1": ([["PAR", "INT", "OUT"]], [["PAR", "INT", "OUT"]], {}),
        "micro_f1_positive": (["a", "false"], ["a", "false"], {"negative_labels": "false"}),
        "f1_positive": ([1, 0], [1, 0], {"positive": 1}),
        "pearson": ([1, 2, 3], [1, 2, 3], {}),
        "micro_f1_multilabel": ([{"a"}], [{"a"}], {"labels": ["a"]}),
        "accuracy": ([1], [1], {}),
    }
    assert set(cases) == set(METRIC_IDS)
    for metric_id, (gold, pred, kw) in cases.items():
        result = compute_metric(metric_id, gold, pred, **kw)
        assert result["metric"] == metric_id
        assert result["score"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="unknown metric 'f1'"):
        compute_metric("f1", [1], [1])


def test_every_blurb_dataset_has_a_task_type_and_a_metric():
    assert len(BLURB_DATASETS) == 13 and len(BLURB_TASK_TYPES) == 6
    assert set(BLURB_METRIC_OF) == set(BLURB_DATASETS) == set(BLURB_TASK_OF)
    assert set(BLURB_METRIC_OF.values()) == set(METRIC_IDS)


def test_blurb_tables_match_the_dataset_registry():
    # The loaders (finetune/datasets.py) and the scorer must name datasets, task types and
    # metrics alike, or a loaded dataset would be scored with the wrong metric or grouped wrong.
    datasets = pytest.importorskip("biomed_lm.finetune.datasets")
    assert datasets.blurb_dataset_names() == BLURB_DATASETS
    assert tuple(BLURB_TASK_TYPES) == datasets.TASK_TYPES
    assert set(datasets.METRICS) == set(METRIC_IDS)
    for name in BLURB_DATASETS:
        spec = datasets.blurb_spec(name)
        assert (spec.task_type, spec.metric) == (BLURB_TASK_OF[name], BLURB_METRIC_OF[name])


# --------------------------------------------------------------------------- BLURB score

DATASET_ROWS = ["BC5-chem", "BC5-disease", "NCBI-disease", "BC2GM", "JNLPBA", "EBM PICO",
                "ChemProt", "DDI", "GAD", "BIOSSES", "HoC", "PubMedQA", "BioASQ"]
# (table, column, the 13 per-dataset test scores in DATASET_ROWS order, printed BLURB score)
PAPER_COLUMNS = [
    ("6", "BERT uncased", [89.25, 81.44, 85.67, 80.90, 77.69, 72.34, 71.86, 80.04, 80.41, 82.68,
                           80.20, 51.62, 70.36], 76.11),
    ("6", "BERT cased", [89.99, 79.92, 85.87, 81.23, 77.51, 71.70, 71.54, 79.34, 79.61, 81.40,
                         80.12, 49.96, 74.44], 75.86),
    ("6", "RoBERTa", [89.43, 80.65, 86.62, 80.90, 77.86, 73.02, 72.98, 79.52, 80.63, 81.25,
                      79.66, 52.84, 75.20], 76.46),
    ("6", "BioBERT", [92.85, 84.70, 89.13, 83.82, 78.55, 73.18, 76.14, 80.88, 82.36, 89.52,
                      81.54, 60.24, 84.14], 80.34),
    ("6", "SciBERT uncased", [92.49, 84.54, 88.10, 83.36, 78.68, 73.12, 75.24, 81.06, 82.38,
                              86.25, 80.66, 57.38, 78.86], 78.86),
    ("6", "SciBERT cased", [92.51, 84.70, 88.25, 83.36, 78.51, 73.06, 75.00, 81.22, 81.34, 87.15,
                            81.16, 51.40, 74.22], 78.14),
    ("6", "ClinicalBERT", [90.80, 83.04, 86.32, 81.71, 78.07, 72.06, 72.04, 78.20, 80.48, 91.23,
                           80.74, 49.08, 68.50], 77.29),
    ("6", "BlueBERT", [91.19, 83.69, 88.04, 81.87, 77.71, 72.54, 71.46, 77.78, 79.15, 85.38,
                       80.48, 48.44, 68.71], 76.27),
    ("6", "PubMedBERT", [93.33, 85.62, 87.82, 84.52, 79.10, 73.38, 77.24, 82.36, 83.96, 92.30,
                         82.32, 55.84, 87.56], 81.16),
    ("7", "Wiki+Books WordPiece", [93.20, 85.00, 88.39, 83.65, 78.83, 73.30, 75.04, 81.30, 83.02,
                                   91.36, 81.76, 52.20, 73.69], 79.16),
    ("7", "Wiki+Books WholeWord", [93.31, 85.28, 88.53, 83.93, 78.77, 73.52, 76.70, 82.60, 82.42,
                                   91.79, 81.74, 55.92, 76.41], 79.96),
    ("7", "PubMed WordPiece", [92.96, 84.72, 87.26, 83.19, 78.63, 73.44, 75.72, 80.84, 81.74,
                               92.45, 80.38, 54.76, 78.51], 79.62),
    ("9", "Wiki+Books->PubMed, PubMed vocab", [93.41, 85.43, 87.60, 84.03, 79.01, 73.80, 77.05,
                                               81.96, 82.47, 89.93, 83.14, 54.84, 79.00], 80.03),
    ("9", "PubMed half time", [93.05, 85.02, 87.77, 84.11, 78.98, 73.74, 76.69, 81.21, 82.8,
                               92.12, 82.13, 55.28, 79.43], 80.23),
    ("10", "PubMed+PMC", [93.36, 85.62, 88.34, 84.39, 78.90, 73.64, 76.96, 83.56, 84.08, 90.39,
                          82.16, 61.02, 83.43], 81.01),
    ("10", "PubMed+PMC longer", [93.34, 85.76, 88.04, 84.37, 79.16, 73.72, 76.80, 82.06, 82.90,
                                 92.31, 82.62, 60.02, 87.20], 81.50),
    ("11", "+ adversarial", [93.17, 85.48, 87.99, 84.07, 79.18, 72.92, 77.04, 83.62, 83.54, 94.11,
                             82.20, 53.30, 82.71], 80.77),
]


def test_pubmedbert_blurb_score_from_table_6():
    scores = dict(zip(DATASET_ROWS, PAPER_COLUMNS[8][2]))
    result = blurb_score(scores, percent=True)
    # NER (93.33+85.62+87.82+84.52+79.10)/5 = 86.078; PICO 73.38;
    # RE (77.24+82.36+83.96)/3 = 81.1867; similarity 92.30; classification 82.32;
    # QA (55.84+87.56)/2 = 71.70; BLURB = 486.9647/6 = 81.1608 -> printed 81.16
    assert result.task_scores["ner"] == pytest.approx(0.86078)
    assert result.task_scores["relation"] == pytest.approx(2.4356 / 3)
    assert result.task_scores["qa"] == pytest.approx(0.7170)
    assert result.score == pytest.approx(0.811608, abs=1e-6)
    assert round(result.score * 100, 2) == 81.16
    assert not result.is_partial and str(result) == "BLURB score 81.16"
    # The unweighted mean of the 13 datasets would be 81.95: the grouping is what matters.
    assert round(float(np.mean(PAPER_COLUMNS[8][2])), 2) == 81.95


@pytest.mark.parametrize("table, column, values, printed", PAPER_COLUMNS,
                         ids=[f"table{t}-{c}" for t, c, _, _ in PAPER_COLUMNS])
def test_every_printed_blurb_score_is_reproduced(table, column, values, printed):
    # Inputs are rounded to 0.01, so the exact mean can differ from the paper's by at most
    # 0.005 before the paper's own rounding: every column lands on the printed value.
    score = blurb_score(dict(zip(DATASET_ROWS, values)), percent=True).score * 100
    assert abs(score - printed) <= 0.005 + 1e-9


def test_partial_blurb_score_is_labelled():
    # Table 13's three NER datasets (BIO column): only the NER type is present.
    result = blurb_score({"BC5-chem": 0.9333, "BC5-disease": 0.8562, "JNLPBA": 0.7910})
    assert result.is_partial
    assert result.present_tasks == ("ner",)
    assert result.score == pytest.approx((0.9333 + 0.8562 + 0.7910) / 3)
    assert set(result.missing_datasets) == set(BLURB_DATASETS) - {"bc5-chem", "bc5-disease",
                                                                  "jnlpba"}
    assert "pico" in result.missing_tasks and "ner" not in result.missing_tasks
    assert result.label.startswith("partial BLURB score (3/13 datasets, 1/6 task types; "
                                   "not scored: ncbi-disease, bc2gm, ")
    assert str(result).startswith("partial BLURB score") and str(result).endswith("86.02")
    assert result.to_dict()["partial"] is True
    with pytest.raises(ValueError, match="incomplete BLURB results"):
        blurb_score({"BC5-chem": 0.9333}, require_complete=True)
    # Missing datasets inside a present type: the type mean uses the present ones only.
    two_types = blurb_score({"chemprot": 0.7, "hoc": 0.8, "ddi": 0.8})
    assert two_types.task_scores == {"relation": pytest.approx(0.75),
                                     "classification": pytest.approx(0.8)}
    assert two_types.score == pytest.approx((0.75 + 0.8) / 2)


def test_blurb_score_inputs():
    # Result dicts and MeanStd are accepted; names in any common spelling.
    result = blurb_score({"bc5cdr_chem": {"score": 0.9}, "BIOSESSES": mean_std([0.8, 0.9]),
                          "EBM-NLP": 0.7})
    assert result.dataset_scores == {"bc5-chem": 0.9, "ebm-pico": 0.7,
                                     "biosses": pytest.approx(0.85)}
    with pytest.raises(ValueError, match="pass percent=True"):
        blurb_score({"hoc": 82.32})
    with pytest.raises(ValueError, match="outside"):
        blurb_score({"hoc": 182.0}, percent=True)
    with pytest.raises(ValueError, match="duplicates"):
        blurb_score({"BC2GM": 0.8, "bc2gm": 0.8})
    with pytest.raises(ValueError, match="unknown BLURB dataset"):
        blurb_score({"mednli": 0.8})
    with pytest.raises(ValueError, match="no results"):
        blurb_score({})
    with pytest.raises(ValueError, match="not finite"):
        blurb_score({"hoc": float("nan")})
    # Pearson may be negative.
    assert blurb_score({"biosses": -0.2}).score == pytest.approx(-0.2)
    assert canonical_dataset_name("NCBI_disease") == "ncbi-disease"
    assert isinstance(result, BlurbScore)


def test_mean_std_uses_the_sample_std():
    # mean (0.80 + 0.82 + 0.84)/3 = 0.82; squared deviations 0.0004, 0, 0.0004
    # sample variance 0.0008 / (3 - 1) = 0.0004 -> std 0.02 (population std would be 0.0163)
    result = mean_std([0.80, 0.82, 0.84])
    assert result.mean == pytest.approx(0.82) and result.std == pytest.approx(0.02)
    assert result.n == 3 and result.format() == "82.00 ± 2.00"
    single = mean_std([0.5])
    assert math.isnan(single.std) and single.format() == "50.00 (1 run)"
    assert isinstance(single, MeanStd)
    with pytest.raises(ValueError, match="at least one"):
        mean_std([])
    with pytest.raises(ValueError, match="non-finite"):
        mean_std([0.5, float("inf")])
