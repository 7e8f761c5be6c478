"""The dataset API by its first address: ``from biomed_lm.finetune.datasets import load_blurb_dataset``.

Nothing is defined here. What a BLURB dataset *is* (name, task family, labels, metric, files, the
paper's settings) lives in the registry, :mod:`finetune.blurb`; the readers live by task family in
:mod:`finetune.readers` (``docs/datasets.md`` documents the formats).
"""

from __future__ import annotations

from biomed_lm.finetune.blurb import (ACCURACY, CLASSIFICATION, DEFAULT_MAX_LENGTH, DEV, ENTITY_F1, F1_POSITIVE,
                                      HOC_BLURB_SIZES, HOC_HALLMARKS, MICRO_F1_MULTILABEL, MICRO_F1_POSITIVE, NER,
                                      PEARSON, PICO, PICO_ELEMENTS, PICO_TOKEN_MACRO_F1, PUBMEDQA_BLURB_SIZES, QA,
                                      QA_MAX_LENGTH, RELATION, SIMILARITY, SPLITS, TASK_TYPES, TEST, TRAIN,
                                      UnknownDatasetError, blurb_dataset_names, canonical_dataset_name,
                                      default_max_length)
# BLURB is the mapping name -> entry and BLURB_DATASETS the tuple of names, here as in the registry.
from biomed_lm.finetune.blurb import BLURB, BLURB_DATASETS
from biomed_lm.finetune.blurb import METRIC_IDS as METRICS
from biomed_lm.finetune.blurb import BlurbEntry as DatasetSpec
from biomed_lm.finetune.blurb import blurb_entry as blurb_spec
from biomed_lm.finetune.readers import (CARVED_DEV_FRACTION, DEFAULT_SPLIT_SEED, MAX_OFFSET_SHIFT, BlurbDataset,
                                        DatasetFormatError, DocumentExample, Entity, Example, MissingDatasetFileError,
                                        PicoExample, QAExample, RelationExample, SentencePairExample,
                                        TokenTaggingExample, load_blurb_dataset, load_generic_dataset,
                                        seeded_partition)

__all__ = [
    "NER", "PICO", "RELATION", "SIMILARITY", "CLASSIFICATION", "QA", "TASK_TYPES",
    "ENTITY_F1", "PICO_TOKEN_MACRO_F1", "MICRO_F1_POSITIVE", "F1_POSITIVE", "PEARSON", "MICRO_F1_MULTILABEL",
    "ACCURACY", "METRICS", "TRAIN", "DEV", "TEST", "SPLITS", "DEFAULT_SPLIT_SEED", "CARVED_DEV_FRACTION",
    "MAX_OFFSET_SHIFT", "DEFAULT_MAX_LENGTH", "QA_MAX_LENGTH", "PICO_ELEMENTS", "HOC_HALLMARKS", "HOC_BLURB_SIZES",
    "PUBMEDQA_BLURB_SIZES",
    "DatasetFormatError", "UnknownDatasetError", "MissingDatasetFileError",
    "TokenTaggingExample", "PicoExample", "Entity", "RelationExample", "SentencePairExample", "DocumentExample",
    "QAExample", "Example", "BlurbDataset", "DatasetSpec", "BLURB", "BLURB_DATASETS",
    "blurb_dataset_names", "canonical_dataset_name", "blurb_spec", "default_max_length", "load_blurb_dataset",
    "load_generic_dataset", "seeded_partition",
]
