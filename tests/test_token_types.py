"""The one token-type rule (biomed_lm/token_types.py) both stages read."""

from __future__ import annotations

import pytest

from biomed_lm.token_types import takes_token_type_ids


@pytest.mark.parametrize("segment_embeddings, type_vocab_size, expected", [
    (True, 2, True),      # BERT, ALBERT, ELECTRA
    (True, 1, False),     # RoBERTa: one row, a second segment would index past it
    (True, 0, False),     # DeBERTa-v3: no token types
    (True, None, False),  # a config without the field (DistilBERT)
    (False, 2, False),    # GPT-2: no segment embeddings whatever the config says
])
def test_token_types_need_segment_embeddings_and_two_of_them(segment_embeddings, type_vocab_size, expected):
    assert takes_token_type_ids(segment_embeddings, type_vocab_size) is expected
