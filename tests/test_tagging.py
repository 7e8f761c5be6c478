"""Tagging schemes (finetune/tagging.py): exact conversions, the conll repair, validation.

Property tests draw span sets and tag sequences from generators written independently of the
code under test (valid BIO/BIOUL sequences come from a small grammar, not from ``from_spans``),
and cross-check the lenient decoder against seqeval's default (conlleval) reading.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from seqeval.metrics.sequence_labeling import get_entities
from seqeval.scheme import BILOU, IOB2, Entities

from biomed_lm.finetune.tagging import (SCHEMES, TagSequenceError, convert_tags, from_spans, is_lossless_to_io,
                                        is_valid_tags, make_tag, normalize_scheme, repair_tags, split_tag, tag_labels,
                                        to_spans, validate_tags)

PROPS = settings(max_examples=300, deadline=None)
# "" is the bare-prefix type ("B", "I"); "gene-protein" checks that only the first hyphen splits.
TYPES = st.sampled_from(["X", "Y", "", "gene-protein"])


@st.composite
def span_sets(draw, max_len=25):
    """Random non-overlapping typed spans in a sequence: gaps of 0+ tokens, entities of 1+."""
    spans, pos = [], draw(st.integers(0, 3))
    for _ in range(draw(st.integers(0, 6))):
        width = draw(st.integers(1, 4))
        spans.append((pos, pos + width, draw(TYPES)))
        pos += width + draw(st.integers(0, 2))   # gap 0 makes entities adjacent
    length = pos + draw(st.integers(0, 3))
    return spans, length


@st.composite
def valid_bio(draw):
    """A valid BIO sequence from the grammar: O | B-t | I-t only right after B-t or I-t."""
    tags = []
    for _ in range(draw(st.integers(0, 25))):
        options = ["O", "B"]
        if tags and tags[-1] != "O":
            options.append("I")
        choice = draw(st.sampled_from(options))
        if choice == "O":
            tags.append("O")
        elif choice == "B":
            tags.append(make_tag("B", draw(TYPES)))
        else:
            tags.append(make_tag("I", split_tag(tags[-1])[1]))
    return tags


@st.composite
def valid_bioul(draw):
    """A valid BIOUL sequence: O | U-t | B-t (I-t)* L-t."""
    tags = []
    for _ in range(draw(st.integers(0, 8))):
        kind = draw(st.sampled_from(["O", "U", "BL"]))
        if kind == "O":
            tags.append("O")
            continue
        entity_type = draw(TYPES)
        if kind == "U":
            tags.append(make_tag("U", entity_type))
        else:
            inner = draw(st.integers(0, 3))
            tags += [make_tag("B", entity_type)] + [make_tag("I", entity_type)] * inner \
                + [make_tag("L", entity_type)]
    return tags


def any_tags(scheme):
    """Arbitrary (often invalid) sequences over the scheme's alphabet."""
    prefixes = {"bio": "BI", "bioul": "BILU", "io": "I"}[scheme]
    tag = st.one_of(st.just("O"), st.builds(make_tag, st.sampled_from(prefixes), TYPES))
    return st.lists(tag, max_size=25)


def seqeval_conll_spans(tags, scheme):
    """seqeval's default-mode entities as (start, end_exclusive, type); BILOU -> BIOES letters."""
    if scheme == "bioul":
        tags = [{"U": "S", "L": "E"}.get(t[:1], t[:1]) + t[1:] if t != "O" else t for t in tags]
    return sorted((s, e + 1, "" if t == "_" else t) for t, s, e in get_entities(list(tags)))


def seqeval_strict_spans(tags, scheme):
    entities = Entities([list(tags)], IOB2 if scheme == "bio" else BILOU).entities[0]
    return sorted((e.start, e.end, "" if e.tag == "_" else e.tag) for e in entities)


def adjacent_same_type(spans):
    return any(a[1] == b[0] and a[2] == b[2] for a, b in zip(spans, spans[1:]))


# --------------------------------------------------------------------------- examples


def test_encodings_of_one_example():
    # entities: "aspirin"(0,1,Chem) "heart attack"(2,4,Dis) "stroke risk factor"(4,7,Dis)
    spans = [(0, 1, "Chem"), (2, 4, "Dis"), (4, 7, "Dis")]
    assert from_spans(spans, 8, "bio") == \
        ["B-Chem", "O", "B-Dis", "I-Dis", "B-Dis", "I-Dis", "I-Dis", "O"]
    assert from_spans(spans, 8, "bioul") == \
        ["U-Chem", "O", "B-Dis", "L-Dis", "B-Dis", "I-Dis", "L-Dis", "O"]
    # IO cannot separate the two adjacent diseases: they merge into (2, 7).
    io = from_spans(spans, 8, "io")
    assert io == ["I-Chem", "O", "I-Dis", "I-Dis", "I-Dis", "I-Dis", "I-Dis", "O"]
    assert to_spans(io, "io") == [(0, 1, "Chem"), (2, 7, "Dis")]
    bio = from_spans(spans, 8, "bio")
    assert not is_lossless_to_io(bio)
    assert is_lossless_to_io(from_spans(spans[:2], 8, "bio"))


def test_bare_prefixes_are_the_empty_type():
    # Single-type corpora write "B"/"I" with no type; they decode to type "" and come back bare.
    tags = ["B", "I", "O", "B", "B"]
    assert to_spans(tags) == [(0, 2, ""), (3, 4, ""), (4, 5, "")]
    assert convert_tags(tags, "bio", "bioul") == ["B", "L", "O", "U", "U"]
    assert convert_tags(convert_tags(tags, "bio", "bioul"), "bioul", "bio") == tags


def test_type_is_everything_after_the_first_hyphen():
    assert split_tag("B-gene-protein") == ("B", "gene-protein")
    assert to_spans(["B-gene-protein", "I-gene-protein"]) == [(0, 2, "gene-protein")]


def test_adjacent_entities_of_different_types_survive_io():
    tags = ["B-X", "I-X", "B-Y", "O"]
    assert is_lossless_to_io(tags)
    assert convert_tags(convert_tags(tags, "bio", "io"), "io", "bio") == tags


def test_conll_repair_of_invalid_bio():
    # An I- that continues nothing starts an entity, as if it were B- (conlleval's reading).
    assert to_spans(["O", "I-X", "I-X", "O"]) == [(1, 3, "X")]
    assert repair_tags(["O", "I-X", "I-X", "O"]) == ["O", "B-X", "I-X", "O"]
    # A type change inside a run starts a new entity.
    assert repair_tags(["B-X", "I-Y", "I-Y"]) == ["B-X", "B-Y", "I-Y"]
    assert repair_tags(["I-X"]) == ["B-X"]


def test_conll_repair_of_invalid_bioul():
    # Unclosed B-X ends at its last token; an orphan L-X is a single-token entity; I-X after a
    # closed entity starts a new one.
    assert to_spans(["B-X", "O"], "bioul") == [(0, 1, "X")]
    assert to_spans(["B-X", "I-X"], "bioul") == [(0, 2, "X")]
    assert to_spans(["O", "L-X"], "bioul") == [(1, 2, "X")]
    assert to_spans(["U-X", "I-X", "L-X"], "bioul") == [(0, 1, "X"), (1, 3, "X")]
    assert repair_tags(["B-X", "O", "I-X"], "bioul") == ["U-X", "O", "U-X"]


def test_validate_names_the_position():
    validate_tags(["B-X", "I-X", "O", "B-Y"], "bio")
    with pytest.raises(TagSequenceError, match=r"position 2: 'I-X' continues no entity") as err:
        validate_tags(["B-X", "O", "I-X"], "bio")
    assert err.value.position == 2
    with pytest.raises(TagSequenceError, match=r"position 1: 'I-Y'.*follows 'B-X'"):
        validate_tags(["B-X", "I-Y"], "bio")
    with pytest.raises(TagSequenceError, match=r"position 0: 'I-X'.*sequence start"):
        validate_tags(["I-X"], "bio")
    with pytest.raises(TagSequenceError, match=r"position 1: the entity 'I-X' is not closed"):
        validate_tags(["B-X", "I-X", "O"], "bioul")
    with pytest.raises(TagSequenceError, match=r"position 0: .*'B-X'.*sequence end"):
        validate_tags(["B-X"], "bioul")
    with pytest.raises(TagSequenceError, match=r"position 1: 'L-X'"):
        validate_tags(["U-X", "L-X"], "bioul")
    # IO has no sequence constraint.
    validate_tags(["I-X", "I-Y", "O", "I-X"], "io")
    assert not is_valid_tags(["O", "I-X"], "bio") and is_valid_tags(["O", "I-X"], "io")


def test_tags_outside_the_alphabet_always_raise():
    with pytest.raises(TagSequenceError, match=r"position 1: tag 'U-X' is not a BIO tag"):
        to_spans(["O", "U-X"], "bio")
    with pytest.raises(TagSequenceError, match=r"not a IO tag"):
        convert_tags(["B-X"], "io", "bio")
    for bad in ["b-X", "B_X", "B-", "S-X", "", "OUT", None]:
        with pytest.raises(ValueError):
            to_spans([bad], "bioul")
    with pytest.raises(ValueError):
        is_valid_tags(["E-X"], "bioul")


def test_scheme_names():
    assert [normalize_scheme(s) for s in ("BIO", "iob2", "BILOU", "bioul", "IO")] == \
        ["bio", "bio", "bioul", "bioul", "io"]
    with pytest.raises(ValueError, match="rename S- to U-"):
        normalize_scheme("bioes")
    with pytest.raises(ValueError, match="unknown tagging scheme"):
        normalize_scheme("iob1")


def test_from_spans_rejects_bad_spans():
    with pytest.raises(ValueError, match="overlap"):
        from_spans([(0, 3, "X"), (2, 4, "Y")], 5)
    with pytest.raises(ValueError, match="overlap"):
        from_spans([(1, 2, "X"), (1, 2, "X")], 5)
    with pytest.raises(ValueError, match="outside a sequence of length 3"):
        from_spans([(2, 4, "X")], 3)
    with pytest.raises(ValueError, match="empty"):
        from_spans([(2, 2, "X")], 3)
    with pytest.raises(ValueError, match="must be ints"):
        from_spans([(0.0, 1, "X")], 3)
    with pytest.raises(ValueError, match="non-negative int"):
        from_spans([], -1)
    # Unsorted input and numpy integers are fine.
    assert from_spans([(np.int64(3), np.int64(4), "Y"), (0, 2, "X")], np.int64(4)) == \
        ["B-X", "I-X", "O", "B-Y"]
    assert from_spans([], 0) == []


def test_tag_labels():
    assert tag_labels(["Chem", "Dis"], "bio") == ["O", "B-Chem", "I-Chem", "B-Dis", "I-Dis"]
    assert tag_labels(["Chem"], "bioul") == ["O", "B-Chem", "I-Chem", "L-Chem", "U-Chem"]
    assert tag_labels([""], "io") == ["O", "I"]


# --------------------------------------------------------------------------- properties


@PROPS
@given(span_sets(), st.sampled_from(["bio", "bioul"]))
def test_spans_round_trip_exactly_in_bio_and_bioul(data, scheme):
    spans, length = data
    tags = from_spans(spans, length, scheme)
    assert len(tags) == length
    validate_tags(tags, scheme)
    assert to_spans(tags, scheme) == spans


@PROPS
@given(span_sets())
def test_spans_round_trip_in_io_iff_no_adjacent_same_type(data):
    spans, length = data
    tags_io = from_spans(spans, length, "io")
    decoded = to_spans(tags_io, "io")
    bio = from_spans(spans, length, "bio")
    assert is_lossless_to_io(bio) == (not adjacent_same_type(spans))
    if not adjacent_same_type(spans):
        assert decoded == spans
    else:
        # Lossy exactly by merging: the same tokens are covered, with the same types.
        assert decoded != spans
        covered = lambda ss: sorted((i, t) for s, e, t in ss for i in range(s, e))  # noqa: E731
        assert covered(decoded) == covered(spans)


@PROPS
@given(valid_bio())
def test_bio_to_bioul_to_bio_is_identity(tags):
    validate_tags(tags, "bio")
    bioul = convert_tags(tags, "bio", "bioul")
    validate_tags(bioul, "bioul")
    assert convert_tags(bioul, "bioul", "bio") == tags
    assert repair_tags(tags, "bio") == tags


@PROPS
@given(valid_bioul())
def test_bioul_to_bio_to_bioul_is_identity(tags):
    validate_tags(tags, "bioul")
    assert convert_tags(convert_tags(tags, "bioul", "bio"), "bio", "bioul") == tags


@PROPS
@given(st.sampled_from(SCHEMES).flatmap(lambda s: st.tuples(st.just(s), any_tags(s))),
       st.sampled_from(SCHEMES))
def test_decoding_any_sequence(data, target):
    scheme, tags = data
    spans = to_spans(tags, scheme)
    # Spans are sorted, in bounds, never overlap, and keep the types of the tags.
    assert spans == sorted(spans)
    assert all(0 <= s < e <= len(tags) for s, e, _ in spans)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    assert {t for _, _, t in spans} == {split_tag(tag)[1] for tag in tags if tag != "O"}
    # Every token inside an entity tag is covered by exactly one span of its type.
    for i, tag in enumerate(tags):
        covering = [t for s, e, t in spans if s <= i < e]
        assert covering == ([] if tag == "O" else [split_tag(tag)[1]])
    # The lenient decoder is conlleval's reading (seqeval default mode).
    assert spans == seqeval_conll_spans(tags, scheme)
    # Conversion repairs: the output is valid in the target scheme.
    converted = convert_tags(tags, scheme, target)
    validate_tags(converted, target)
    if target != "io" or not adjacent_same_type(spans):
        assert to_spans(converted, target) == spans


@PROPS
@given(st.sampled_from(["bio", "bioul"]).flatmap(lambda s: st.tuples(st.just(s), any_tags(s))))
def test_valid_means_strict_and_conll_readings_agree(data):
    # seqeval's strict mode drops exactly the chunks validate_tags objects to.
    scheme, tags = data
    agree = seqeval_strict_spans(tags, scheme) == seqeval_conll_spans(tags, scheme)
    assert is_valid_tags(tags, scheme) == agree
    assert repair_tags(tags, scheme) == tags if agree else repair_tags(tags, scheme) != tags
