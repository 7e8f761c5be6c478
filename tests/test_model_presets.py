"""The model presets against the parameter counts their authors publish."""

from __future__ import annotations

import pytest

from biomed_lm.pretrain.config import load_model_preset
from biomed_lm.pretrain.modeling import build_bert, count_parameters

BIOFORMER_VOCAB = 32_768  # 2**15, cased WordPiece (the Bioformer model cards)


@pytest.mark.parametrize("preset, vocab_size, expected, tolerance", [
    ("bert-base", 30_522, 110_106_428, 0),        # bert-base-uncased's BertForPreTraining
    ("bioformer-8l", BIOFORMER_VOCAB, 42_820_610, 0),   # the bioformer-8L model card's exact count
    ("bioformer-16l", BIOFORMER_VOCAB, 42_000_000, 0.02),  # "about 42 million"
])
def test_parameter_counts_match_the_published_ones(preset, vocab_size, expected, tolerance):
    fields = load_model_preset(preset)
    count = count_parameters(build_bert(fields, vocab_size, pad_token_id=0))
    print(f"{preset}: {count:,} parameters")
    assert abs(count - expected) <= tolerance * expected, f"{preset}: {count:,} parameters, published {expected:,}"


@pytest.mark.parametrize("preset, shape", [("bioformer-8l", (8, 512, 8, 2048)), ("bioformer-16l", (16, 384, 6, 1536))])
def test_bioformer_shapes(preset, shape):
    fields = load_model_preset(preset)
    assert (fields["num_hidden_layers"], fields["hidden_size"], fields["num_attention_heads"],
            fields["intermediate_size"]) == shape
    assert fields["max_position_embeddings"] == 512
    assert fields["hidden_size"] % fields["num_attention_heads"] == 0
