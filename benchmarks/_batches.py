"""Synthetic masked pretraining batches shared by the step benchmarks (same shapes and masking as
real data, no corpus needed)."""

from __future__ import annotations

import torch


def synthetic_pretraining_batches(count: int, batch: int, seq: int, vocab_size: int, seed: int = 0) -> list[dict]:
    """``count`` BertForPreTraining batches: random ids framed by [CLS]=101/[SEP]=102, 15% masked."""
    from biomed_lm.pretrain.masking import MaskingConfig, mask_tokens

    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(count):
        ids = torch.randint(1000, vocab_size, (batch, seq), generator=generator)
        ids[:, 0], ids[:, -1] = 101, 102
        special = (ids == 101) | (ids == 102)
        masked, labels = mask_tokens(ids, torch.ones_like(ids, dtype=torch.bool), special, config=MaskingConfig(),
                                     mask_token_id=103, random_token_ids=torch.arange(1000, vocab_size),
                                     generator=generator)
        batches.append({"input_ids": masked, "attention_mask": torch.ones_like(ids),
                        "token_type_ids": torch.zeros_like(ids), "labels": labels,
                        "next_sentence_label": torch.randint(0, 2, (batch,), generator=generator)})
    return batches
