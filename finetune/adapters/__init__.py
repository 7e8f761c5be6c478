"""Task adapters, one per task family, looked up by the family's name (:func:`adapter_for`).

========================  =====================================  ==========================================
family                    adapter                                 input -> head
========================  =====================================  ==========================================
``ner``                   :class:`TokenTaggingAdapter`           word windows -> linear / BiLSTM / CRF tags
``pico``                  :class:`PicoAdapter`                   word windows -> one sigmoid per element
``relation``              :class:`RelationAdapter`               dummified / marked pair -> CLS or entities
``similarity``            :class:`SimilarityAdapter`             sentence pair -> regression
``classification``        :class:`DocumentClassificationAdapter` document -> one sigmoid per label
``qa``                    :class:`QAAdapter`                     question + context -> answer label
========================  =====================================  ==========================================

The interface is :class:`finetune.adapters.base.TaskAdapter`. Adding a task family is one subclass
and one entry in :data:`ADAPTERS` (and a generic reader in :data:`finetune.readers.GENERIC_FORMATS`).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

from biomed_lm.finetune.adapters.base import TaskAdapter
from biomed_lm.finetune.adapters.relation import RelationAdapter
from biomed_lm.finetune.adapters.sequence import DocumentClassificationAdapter, QAAdapter, SimilarityAdapter
from biomed_lm.finetune.adapters.tagging import PicoAdapter, TokenTaggingAdapter
from biomed_lm.finetune.blurb import TASK_TYPES, UnknownTaskFamilyError

__all__ = ["ADAPTERS", "adapter_for", "TaskAdapter", "TokenTaggingAdapter", "PicoAdapter", "RelationAdapter",
           "SimilarityAdapter", "DocumentClassificationAdapter", "QAAdapter"]

ADAPTERS: Mapping[str, type[TaskAdapter]] = MappingProxyType({adapter.family: adapter for adapter in (
    TokenTaggingAdapter, PicoAdapter, RelationAdapter, SimilarityAdapter, DocumentClassificationAdapter, QAAdapter)})
assert tuple(ADAPTERS) == TASK_TYPES  # one adapter per task family, in the registry's order


def adapter_for(task_type: str) -> type[TaskAdapter]:
    """The adapter class of a task family; an unknown family is an error naming the valid ones."""
    try:
        return ADAPTERS[task_type]
    except KeyError:
        raise UnknownTaskFamilyError(f"no task adapter for {task_type!r}; valid task types: "
                                     f"{', '.join(ADAPTERS)}") from None
