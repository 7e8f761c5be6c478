"""The relation-extraction adapter: :func:`finetune.relation_inputs.encode_relation_example`,
windowed around the two entities (``on_overflow="clip"``, so every test instance is scored; clipped
ones are counted in the run record's input stats), under a sequence-classification head that reads
the representation ``args.relation_representation``.

Rows that mark one entity of the pair only (BLURB's ChemProt TSV has some; the reader keeps and
locates them) follow one rule. With the ``cls`` representation on the sentence as given (not
``markers``) they are classified as given, as BLURB's reference code does: [CLS] does not need the
second mention. Any other representation or transformation needs both mentions: such a training row
is skipped, and a dev/test row is still predicted but scored as the negative label ("no relation"),
so every test row counts and scores stay comparable with the paper's. ``run.json``'s
``input_details.one_entity_rows`` and the run's log give the counts per split and the first lines.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from biomed_lm.finetune.adapters.base import TaskAdapter
from biomed_lm.finetune.blurb import F1_POSITIVE, RELATION, TRAIN, blurb_entry
from biomed_lm.finetune.modeling import SequenceClassificationModel
from biomed_lm.finetune.readers.base import LISTED_LINES, listed_lines
from biomed_lm.finetune.relation_inputs import (MODEL_INPUT_KEYS, add_marker_tokens, collate_relation_features,
                                                encode_relation_example, entities_from_placeholders,
                                                pair_or_one_from_placeholders)

__all__ = ["RelationAdapter"]


class RelationAdapter(TaskAdapter):
    """A BLURB dataset's entity-type map and placeholder pair come from its registry entry; a generic
    dataset (``args.task_type`` set) has neither (its reader checked any two placeholders)."""

    family = RELATION
    options = ("relation_transformation", "relation_representation")
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
        # Why a one-entity row cannot be represented; None: [CLS] reads the sentence as given.
        self.one_entity_obstacle = (
            f"representation {args.relation_representation} needs both entities"
            if args.relation_representation != "cls" else
            "transformation markers needs both entities" if args.relation_transformation == "markers" else None)

    def _text_and_entities(self, example) -> tuple[str, Sequence, str, Any, bool]:
        """The text, its entity pair, the transformation and the type map for one example, and
        whether the sentence marks one entity of the pair only."""
        if example.entities:
            return example.text, example.entities, self.args.relation_transformation, self.type_map, False
        # distributed already dummified: the placeholders are the mentions
        text = example.text
        entities = pair_or_one_from_placeholders(text, self.pair) if self.pair else entities_from_placeholders(text)
        if len(entities) == 1:  # the one mention stands for both, so the window keeps it; no markers to place
            return text, (entities[0], entities[0]), "original", None, True
        transformation = "original" if self.args.relation_transformation == "dummify" \
            else self.args.relation_transformation
        return text, entities, transformation, None, False

    def featurize(self, examples: Sequence) -> list[dict]:
        features = []
        for example in examples:
            text, entities, transformation, type_map, one_entity = self._text_and_entities(example)
            feature = encode_relation_example(text, entities, self.tokenizer, transformation, self.max_length,
                                              type_map=type_map, on_overflow="clip")
            self.stats["entities_clipped"] += int(feature["entities_clipped"])
            self.stats["truncated"] += int(feature["truncated"])
            feature["labels"] = self.label_index[example.label]
            # not a model input (collate keeps MODEL_INPUT_KEYS): predictions() reads it
            feature["scored_as_negative"] = one_entity and self.one_entity_obstacle is not None
            features.append(feature)
        return features

    def select(self, split: str, examples: Sequence) -> list:
        """All examples, except one-entity training rows that the run cannot represent; records the
        one-entity rows of the split and what is done with them."""
        flagged = self.dataset.one_entity_rows.get(split)
        ids = [e.id for e in examples if e.id in flagged.lines] if flagged is not None else []
        if not ids:
            return list(examples)
        handled = "classified as given" if self.one_entity_obstacle is None else \
            "skipped" if split == TRAIN else f"predicted as {self.dataset.negative_label}"
        self.details.setdefault("one_entity_rows", {})[split] = {
            "file": flagged.file, "rows": len(ids), "first_lines": [flagged.lines[i] for i in ids[:LISTED_LINES]],
            "handled": handled}
        return [e for e in examples if e.id not in flagged.lines] if handled == "skipped" else list(examples)

    def summary(self) -> list[str]:
        rows = self.details.get("one_entity_rows")
        if not rows:
            return []
        groups: dict[str, list[str]] = {}
        for split, found in rows.items():
            where = f"{found['file']} {listed_lines(found['first_lines'], found['rows'])}"
            groups.setdefault(found["handled"], []).append(f"{split} {found['rows']} ({where})")
        handled = "; ".join(f"{', '.join(splits)}: {how}" for how, splits in groups.items())
        why = f"; {self.one_entity_obstacle}" if self.one_entity_obstacle else \
            f" (representation {self.args.relation_representation})"
        return [f"rows marking one entity of the pair: {handled}{why}"]

    def predictions(self, examples: Sequence, features: Sequence[dict], outputs: Sequence) -> list:
        predicted = super().predictions(examples, features, outputs)
        return [self.dataset.negative_label if feature.get("scored_as_negative") else label
                for feature, label in zip(features, predicted)]

    def prediction_row(self, index: int, example, gold: Any, predicted: Any) -> dict[str, Any]:
        # the sentence as the file gives it (dummified or plain); the model's own input may carry markers
        row = {"index": index, "id": example.id, "sentence": example.text, "gold": gold, "predicted": predicted}
        if self.one_entity_obstacle is not None and self._text_and_entities(example)[4]:
            # predictions() put the negative label in place of the model's: the row says so and why
            row["scored_as_negative"] = f"the sentence marks one entity of the pair; {self.one_entity_obstacle}"
        return row

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
        return {"negative_labels": negative, "label_set": list(self.labels)}
