"""Typed examples, one class per task family, and :class:`BlurbDataset`, the readers' output.

The readers (:mod:`finetune.readers`) turn each dataset, in the form it is distributed in, into
these; the task adapters (:mod:`finetune.adapters`) turn them into model inputs, so no code past
the readers sees a file format.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Union

__all__ = ["TokenTaggingExample", "PicoExample", "Entity", "RelationExample", "SentencePairExample",
           "DocumentExample", "QAExample", "Example", "FlaggedRows", "BlurbDataset"]


@dataclass(frozen=True)
class TokenTaggingExample:
    """A sentence of an NER dataset: its tokens and one BIO tag per token."""

    id: str
    tokens: tuple[str, ...]
    tags: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "tokens", tuple(self.tokens))
        object.__setattr__(self, "tags", tuple(self.tags))
        if len(self.tokens) != len(self.tags):
            raise ValueError(f"example {self.id!r}: {len(self.tokens)} tokens but {len(self.tags)} tags")


@dataclass(frozen=True)
class PicoExample:
    """A segment of an EBM PICO abstract: its tokens and, per token, the set of PIO elements it is
    part of. A set, not a tag, because in the original corpus a token may belong to several
    elements (a participant span containing an intervention); the empty set means none."""

    id: str
    tokens: tuple[str, ...]
    elements: tuple[frozenset[str], ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "tokens", tuple(self.tokens))
        object.__setattr__(self, "elements", tuple(frozenset(e) for e in self.elements))
        if len(self.tokens) != len(self.elements):
            raise ValueError(f"example {self.id!r}: {len(self.tokens)} tokens but {len(self.elements)} element sets")


@dataclass(frozen=True)
class Entity:
    """An entity mention of a relation example, located by character offsets into its ``text``.

    ``end`` is exclusive. ``spans`` holds the fragments of the mention: one ``(start, end)`` pair for
    a contiguous mention, several for a discontinuous one (DDI has "synthetic steroidal [estrogen
    and] progestogen"), in which case ``start``/``end`` cover the whole stretch and ``text`` is the
    annotated mention, not ``text[start:end]``.
    """

    start: int
    end: int
    type: str
    text: str
    spans: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        spans = tuple((int(a), int(b)) for a, b in self.spans) or ((self.start, self.end),)
        object.__setattr__(self, "spans", spans)
        if not 0 <= self.start < self.end:
            raise ValueError(f"entity {self.text!r}: offsets {self.start}-{self.end} are not a span")
        if spans[0][0] != self.start or spans[-1][1] != self.end \
                or any(a >= b for a, b in spans) or any(b > c for (_, b), (c, _) in zip(spans, spans[1:])):
            raise ValueError(f"entity {self.text!r}: fragments {spans} do not run in order "
                             f"from {self.start} to {self.end}")


@dataclass(frozen=True)
class RelationExample:
    """A sentence with a pair of entity mentions and the relation between them.

    ``masked_text`` is the sentence with the pair replaced by dummy tokens (``@GENE$``, ``@DRUG$``,
    ...), the input BLURB's standard model reads; it is None when the file gives no masked form.
    When a file ships only the dummified sentence (GAD, ChemProt as TSV) both texts are that
    sentence and ``entities`` is empty: where the entities were is not known.
    """

    id: str
    text: str
    masked_text: str | None
    entities: tuple[Entity, ...]
    label: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "entities", tuple(self.entities))


@dataclass(frozen=True)
class SentencePairExample:
    """Two sentences and their similarity score (BIOSSES: 0 = unrelated ... 4 = equivalent)."""

    id: str
    text_a: str
    text_b: str
    score: float


@dataclass(frozen=True)
class DocumentExample:
    """An abstract with its document-level labels. ``text`` is the sentences joined by one space
    (what the model reads); the sentences are kept for sentence-level analyses."""

    id: str
    text: str
    sentences: tuple[str, ...]
    labels: frozenset[str]

    def __post_init__(self) -> None:
        object.__setattr__(self, "sentences", tuple(self.sentences))
        object.__setattr__(self, "labels", frozenset(self.labels))


@dataclass(frozen=True)
class QAExample:
    """A question, the reference text that may answer it, and the answer label (yes/no[/maybe])."""

    id: str
    question: str
    context: str
    label: str


Example = Union[TokenTaggingExample, PicoExample, RelationExample, SentencePairExample, DocumentExample,
                QAExample]


@dataclass(frozen=True)
class FlaggedRows:
    """Rows of one split file that a reader kept but fine-tuning may treat apart, located for the
    run's summary: the file's name and, by example id, the line each row is on."""

    file: str
    lines: Mapping[str, int]


@dataclass(frozen=True)
class BlurbDataset:
    """A dataset ready for fine-tuning: typed examples per split, its labels and its metric.

    ``labels`` is the fixed label order (a model's output ids): BIO tags for NER, PIO element names
    for PICO, relation/answer/hallmark names otherwise, empty for similarity (a regression).
    ``negative_label`` is the "no relation" label that the relation metrics leave out (None for
    other tasks). ``notes`` says where each split came from and how it differs from BLURB's;
    ``warnings`` what in the data looks like a mistake but was read as written (a training label
    seen too rarely to be a class, a BIO ``I-`` tag that continues no entity). ``one_entity_rows``
    (relation TSV files, per split) are the sentences that mark only one entity of the pair; the
    relation adapter decides what to do with them, by the run's representation.
    """

    name: str
    task_type: str
    metric: str
    labels: tuple[str, ...]
    splits: dict[str, list[Example]]
    notes: list[str]
    negative_label: str | None = None
    warnings: list[str] = field(default_factory=list)
    one_entity_rows: dict[str, FlaggedRows] = field(default_factory=dict)
    #: How this copy differs from the data BLURB scores (another split, a stand-in), in a few words; None
    #: when it is BLURB's. A sweep's BLURB score over such a dataset says so beside the score.
    differs_from_blurb: str | None = None

    def sizes(self) -> dict[str, int]:
        """Examples per split, in split order."""
        return {split: len(examples) for split, examples in self.splits.items()}

