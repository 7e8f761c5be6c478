"""The relation-extraction adapter: :func:`finetune.relation_inputs.encode_relation_example`,
windowed around the two entities (``on_overflow="clip"``, so every test instance is scored; clipped
ones are counted in the run record's input stats), under a sequence-classification head that reads
the representation ``args.relation_representation``."""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from biomed_lm.finetune.adapters.base import TaskAdapter
from biomed_lm.finetune.blurb import F1_POSITIVE, RELATION, blurb_entry
from biomed_lm.finetune.modeling import SequenceClassificationModel
from biomed_lm.finetune.relation_inputs import (MODEL_INPUT_KEYS, add_marker_tokens, collate_relation_features,
                                                encode_relation_example, entities_from_placeholders,
                                                pair_from_placeholders)

__all__ = ["RelationAdapter"]


class RelationAdapter(TaskAdapter):
    """A BLURB dataset's entity-type map and placeholder pair come from its registry entry; a generic
    dataset (``args.task_type`` set) has neither (its reader checked any two placeholders)."""

    family = RELATION
    input_keys = MODEL_INPUT_KEYS

    def __init__(self, args, dataset, tokenizer) -> None:
        super().__init__(args, dataset, tokenizer)
        entry = blurb_entry(dataset.name) if args.task_type is None else None
        self.type_map = entry.type_map if entry is not None else None
        self.pair = entry.placeholder_pair if entry is not None else None
        self.label_index = {label: i for i, label in enumerate(self.labels)}
        self.stats.update(entities_clipped=0, truncated=0)
        if args.relation_transformation == "markers":
            add_marker_tokens(tokenizer)

    def _text_and_entities(self, example) -> tuple[str, Sequence, str, Any]:
        """The text, its entity pair, the transformation and the type map for one example."""
        if example.entities:
            return example.text, example.entities, self.args.relation_transformation, self.type_map
        # distributed already dummified: the placeholders are the mentions
        text = example.text
        entities = pair_from_placeholders(text, self.pair) if self.pair else entities_from_placeholders(text)
        transformation = "original" if self.args.relation_transformation == "dummify" \
            else self.args.relation_transformation
        return text, entities, transformation, None

    def featurize(self, examples: Sequence) -> list[dict]:
        features = []
        for example in examples:
            text, entities, transformation, type_map = self._text_and_entities(example)
            feature = encode_relation_example(text, entities, self.tokenizer, transformation, self.max_length,
                                              type_map=type_map, on_overflow="clip")
            self.stats["entities_clipped"] += int(feature["entities_clipped"])
            self.stats["truncated"] += int(feature["truncated"])
            feature["labels"] = self.label_index[example.label]
            features.append(feature)
        return features

    def collate(self, features: Sequence[dict]) -> dict[str, torch.Tensor]:
        return collate_relation_features(features, self.pad_id)

    def build_head(self, encoder: nn.Module) -> nn.Module:
        return SequenceClassificationModel(encoder, len(self.labels), "single_label",
                                           self.args.relation_representation, self.args.dropout)

    def metric_kwargs(self) -> dict[str, Any]:
        negative = self.dataset.negative_label
        if negative is None:
            return {}
        if self.dataset.metric == F1_POSITIVE:
            return {"positive": next(label for label in self.labels if label != negative)}
        return {"negative_labels": negative}
