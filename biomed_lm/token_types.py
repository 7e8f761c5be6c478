"""When an encoder is given ``token_type_ids``: the one rule pretraining and fine-tuning share.

A sentence pair is told apart by its token types (0 up to and including the first [SEP], then 1),
which the encoder adds to each position as a row of its segment embeddings. That works only for an
architecture that has segment embeddings *and* a model with at least two rows of them
(``config.type_vocab_size``): RoBERTa keeps one row (a pair's second segment would index a row that
does not exist), DeBERTa-v3 none, and GPT-2 has no segment embeddings at all (its forward accepts
``token_type_ids`` but looks them up in the *word* embeddings, adding the vectors of tokens 0 and 1
to every position). Such encoders get no token types; the pair's separators and positions still
tell its segments apart.

Which architectures have segment embeddings is each stage's family table's fact
(:mod:`biomed_lm.pretrain.families`, :mod:`biomed_lm.finetune.model_families`); the size is the
model's config.
"""

from __future__ import annotations

__all__ = ["takes_token_type_ids"]


def takes_token_type_ids(segment_embeddings: bool, type_vocab_size: int | None) -> bool:
    """Whether an encoder is given ``token_type_ids``: its architecture has segment embeddings
    (``segment_embeddings``) and the model has at least two of them (``type_vocab_size``; None or 0
    for a config without the field)."""
    return bool(segment_embeddings) and int(type_vocab_size or 0) >= 2
