"""How many tokens an encoder's absolute position embeddings take: the one rule pretraining and
fine-tuning share.

A BERT-style model numbers its positions from row 0 of its position-embedding table, so a table of
``max_position_embeddings`` rows takes that many tokens. RoBERTa numbers them from the row after its
padding id (``pad_token_id + 1``), keeping the rows before it unused, so its table of 514 rows takes
512 tokens. Which architectures number after the padding id is each stage's family table's fact
(:mod:`biomed_lm.pretrain.families`, :mod:`biomed_lm.finetune.model_families`).
"""

from __future__ import annotations

__all__ = ["position_offset", "usable_positions"]


def position_offset(positions_after_padding: bool, pad_token_id: int | None) -> int:
    """Position-embedding rows before the first position: ``pad_token_id + 1`` where positions are numbered
    after the padding id (a missing id counts as 0), else 0."""
    return (pad_token_id or 0) + 1 if positions_after_padding else 0


def usable_positions(table_rows: int, positions_after_padding: bool, pad_token_id: int | None) -> int:
    """The longest input a position table of ``table_rows`` rows takes."""
    return int(table_rows) - position_offset(positions_after_padding, pad_token_id)
