"""Relation-extraction inputs: the paper's TransformInput choices (Table 14) and their tokenization.

A relation instance is a text with two entity mentions (half-open character spans and types).
Before tokenization the text is transformed in one of three ways:

* ``dummify`` (BLURB's standard) — each mention is replaced by a type placeholder ``@TYPE$``
  (``@GENE$``, ``@DISEASE$``, ``@CHEMICAL$``, ``@DRUG$``), so the model cannot memorize entity
  pairs. Types pass through a per-dataset map first (DDI's ``drug``/``drug_n``/``brand``/``group``
  are all ``DRUG``). Overlapping mentions become one combined placeholder, BLURB's
  ``@CHEM-GENE$``/``@DRUG-DRUG$`` convention.
* ``markers`` — each mention is wrapped in start/end markers, ``[E1] ... [/E1]`` for the first
  entity and ``[E2] ... [/E2]`` for the second; :func:`add_marker_tokens` makes them single
  (special) tokens, and the model's embeddings must then be resized to ``len(tokenizer)``.
* ``original`` — the text unchanged; the mentions are still located, for mention pooling. Texts
  distributed already dummified (GAD and ChemProt TSV files) go through ``original`` with the
  entities found by :func:`entities_from_placeholders`.

:func:`encode_relation_example` then tokenizes with a fast tokenizer and maps character spans
to token spans through the offset mapping. Every span here, character or token, is half-open
``[start, end)`` like a Python slice; token indices count the leading [CLS].

Entities are ordered: the first is E1 (``entity_spans[0]``, ``entity_starts[0]``), the second E2,
whatever their order in the text; directed relations (ChemProt: chemical → gene) depend on it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal, Protocol, get_args

from biomed_lm.errors import FinetuneError, InputError
from biomed_lm.finetune.blurb import BLURB, CHEMPROT_TYPE_MAP, DDI_TYPE_MAP, GAD_TYPE_MAP, PlaceholderPair  # noqa: F401

if TYPE_CHECKING:  # torch is imported where tensors are made, so the dataset readers can check placeholders
    import torch  # without loading it

Transformation = Literal["dummify", "markers", "original"]
TRANSFORMATIONS: tuple[str, ...] = get_args(Transformation)

ENTITY_MARKERS: tuple[str, str, str, str] = ("[E1]", "[/E1]", "[E2]", "[/E2]")

#: A BLURB placeholder: ``@GENE$``, ``@CHEMICAL$``, ``@CHEM-GENE$`` (overlapping mentions).
PLACEHOLDER_PATTERN = re.compile(r"@([A-Z][A-Z0-9_]*(?:-[A-Z][A-Z0-9_]*)?)\$")

# The BLURB datasets' placeholder pairs live in the registry (finetune.blurb); by dataset name here for
# callers that look them up.
PLACEHOLDER_PAIRS: Mapping[str, PlaceholderPair] = MappingProxyType(
    {e.name: e.placeholder_pair for e in BLURB.values() if e.placeholder_pair is not None})

#: The model inputs :func:`encode_relation_example` returns (the rest of its keys are flags).
MODEL_INPUT_KEYS: tuple[str, ...] = ("input_ids", "attention_mask", "token_type_ids", "entity_spans", "entity_starts")


class EntitiesDoNotFitError(FinetuneError, ValueError):
    """Both entities (with their markers) need more tokens than ``max_length`` leaves."""


class Mention(Protocol):
    """What the functions here read of an entity: any object with these attributes will do (the
    dataset loaders' entities too), so no conversion is needed between modules."""

    @property
    def start(self) -> int: ...

    @property
    def end(self) -> int: ...

    @property
    def type(self) -> str: ...


@dataclass(frozen=True)
class Entity:
    """A mention: half-open character span ``[start, end)`` in the original text and its type.

    A discontinuous mention (DDI offsets such as ``"42-60;75-85"``) is passed as its hull (the readers'
    entities also carry its fragments, ``spans``, which :func:`dummify` reads).
    """

    start: int
    end: int
    type: str = ""

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.end:
            raise InputError(f"an entity span needs 0 <= start < end, got [{self.start}, {self.end})")


def mentions_overlap(first: Mention, second: Mention) -> bool:
    """Whether two half-open character spans share a character."""
    return first.start < second.end and second.start < first.end


@dataclass(frozen=True)
class TransformedText:
    """The model's input text and, per entity (E1, E2), where it now is.

    ``spans``: the characters that represent the mention (its placeholder, or the mention text);
    ``starts``: the character span of the unit that opens the entity (its start marker, or the
    beginning of ``spans``), which the ``entity_start`` representation reads; ``extents``: all the
    characters that stand for the entity, markers included, which truncation must keep.
    """

    text: str
    spans: tuple[tuple[int, int], tuple[int, int]]
    starts: tuple[tuple[int, int], tuple[int, int]]
    extents: tuple[tuple[int, int], tuple[int, int]]


def normalize_type(entity_type: str, type_map: Mapping[str, str] | None = None) -> str:
    """A placeholder type: ``type_map[entity_type]`` (strict: unknown types are an error, so a
    forgotten type cannot silently become a new placeholder), or the type upper-cased without a map."""
    if type_map is None:
        normalized = entity_type.upper()
    elif entity_type in type_map:
        normalized = type_map[entity_type]
    else:
        raise InputError(f"entity type {entity_type!r} is not in the type map (known: {sorted(type_map)})")
    if not re.fullmatch(r"[A-Z][A-Z0-9_]*(-[A-Z][A-Z0-9_]*)?", normalized):
        raise InputError(f"placeholder type {normalized!r} (from {entity_type!r}) must be upper-case letters, "
                         "digits and underscores")
    return normalized


def placeholder(entity_type: str, type_map: Mapping[str, str] | None = None) -> str:
    """``@TYPE$`` for a raw entity type, e.g. ``placeholder("drug_n", DDI_TYPE_MAP) == "@DRUG$"``."""
    return f"@{normalize_type(entity_type, type_map)}$"


def overlap_placeholder(first: Mention, second: Mention, type_map: Mapping[str, str] | None = None) -> str:
    """One placeholder for two overlapping mentions: ``@T1-T2$`` from the normalized types, renamed
    by the type map when it lists the pair (ChemProt's ``CHEMICAL-GENE`` → ``@CHEM-GENE$``)."""
    joined = f"{normalize_type(first.type, type_map)}-{normalize_type(second.type, type_map)}"
    if type_map is not None and joined in type_map:
        joined = normalize_type(joined, type_map)
    return f"@{joined}$"


def _check_entities(text: str, entities: Sequence[Mention]) -> tuple[Mention, Mention]:
    if len(entities) != 2:
        raise InputError(f"a relation needs exactly two entities, got {len(entities)}")
    for entity in entities:
        if not 0 <= entity.start < entity.end:
            raise InputError(f"an entity span needs 0 <= start < end, got [{entity.start}, {entity.end})")
        if entity.end > len(text):
            raise InputError(f"entity span [{entity.start}, {entity.end}) runs past the text ({len(text)} characters)")
    return entities[0], entities[1]


def _replaced(entity: Mention) -> Entity:
    """The stretch a placeholder replaces: the mention, or a discontinuous mention's first fragment
    (DDI's ``spans``, "[live] or inactivated [vaccines]"), the rest kept, as BLURB's own dummified DDI
    sentences have it: "@DRUG$ or inactivated vaccines", and "@DRUG$ or @DRUG$" where the other
    mention is "inactivated vaccines" (every one of its pairs whose replaced stretches do not overlap)."""
    fragments = getattr(entity, "spans", ())
    return Entity(entity.start, fragments[0][1] if len(fragments) > 1 else entity.end, entity.type)


def dummify(text: str, entities: Sequence[Mention], type_map: Mapping[str, str] | None = None) -> TransformedText:
    """Replace each mention by its ``@TYPE$`` placeholder (overlapping mentions: one combined one)."""
    first, second = (_replaced(entity) for entity in _check_entities(text, entities))
    if mentions_overlap(first, second):
        start, end = min(first.start, second.start), max(first.end, second.end)
        token = overlap_placeholder(first, second, type_map)
        span = (start, start + len(token))
        return TransformedText(text[:start] + token + text[end:], (span, span), (span, span), (span, span))
    replacements = sorted(((entity.start, entity.end, placeholder(entity.type, type_map), index)
                           for index, entity in enumerate((first, second))))
    pieces: list[str] = []
    spans: list[tuple[int, int]] = [(0, 0), (0, 0)]
    cursor = length = 0
    for start, end, token, index in replacements:
        pieces.append(text[cursor:start])
        length += start - cursor
        spans[index] = (length, length + len(token))
        pieces.append(token)
        length += len(token)
        cursor = end
    pieces.append(text[cursor:])
    both = (spans[0], spans[1])
    return TransformedText("".join(pieces), both, both, both)


def insert_markers(text: str, entities: Sequence[Mention], markers: Sequence[str] = ENTITY_MARKERS) -> TransformedText:
    """Wrap E1 in ``markers[0] ... markers[1]`` and E2 in ``markers[2] ... markers[3]``.

    Markers are separated from the mention by a space (readability only: added tokens are split
    out wherever they stand). Where markers meet at one position, end markers come first
    (adjacent mentions: ``[/E1][E2]``), the outer mention opens first and closes last (nested
    mentions), and identical spans nest E2 inside E1; crossing mentions give crossing markers.
    A mention's span then covers any marker of the other entity inside it.
    """
    first, second = _check_entities(text, entities)
    if len(markers) != 4:
        raise InputError(f"markers must be (E1 start, E1 end, E2 start, E2 end), got {markers!r}")
    events = []
    for index, entity in enumerate((first, second)):
        events.append((entity.start, 1, -entity.end, index, "open"))
        events.append((entity.end, 0, -entity.start, -index, "close"))
    events.sort()
    pieces: list[str] = []
    cursor = length = 0
    mention_start, mention_end, open_span, close_end = [0, 0], [0, 0], [(0, 0), (0, 0)], [0, 0]
    for position, _, _, signed_index, kind in events:
        index = abs(signed_index)
        pieces.append(text[cursor:position])
        length += position - cursor
        cursor = position
        if kind == "open":
            marker = markers[2 * index]
            open_span[index] = (length, length + len(marker))
            piece = marker + " "
            mention_start[index] = length + len(piece)
        else:
            mention_end[index] = length
            piece = " " + markers[2 * index + 1]
            close_end[index] = length + len(piece)
        pieces.append(piece)
        length += len(piece)
    pieces.append(text[cursor:])
    spans = ((mention_start[0], mention_end[0]), (mention_start[1], mention_end[1]))
    extents = ((open_span[0][0], close_end[0]), (open_span[1][0], close_end[1]))
    return TransformedText("".join(pieces), spans, (open_span[0], open_span[1]), extents)


def transform_text(text: str, entities: Sequence[Mention], transformation: Transformation = "dummify",
                   type_map: Mapping[str, str] | None = None) -> TransformedText:
    """Apply one of :data:`TRANSFORMATIONS` to a relation instance's text."""
    if transformation == "dummify":
        return dummify(text, entities, type_map)
    if transformation == "markers":
        return insert_markers(text, entities)
    if transformation == "original":
        first, second = _check_entities(text, entities)
        spans = ((first.start, first.end), (second.start, second.end))
        return TransformedText(text, spans, spans, spans)
    raise InputError(f"transformation must be one of {TRANSFORMATIONS}, got {transformation!r}")


def entities_from_placeholders(text: str, type_order: Sequence[str] | None = None) -> tuple[Entity, Entity]:
    """The two entities of a pre-dummified text (GAD, ChemProt TSV): its ``@X$`` placeholders.

    Two placeholders give two entities in text order, or in ``type_order`` when given (ChemProt:
    ``("CHEMICAL", "GENE")`` makes the chemical E1 wherever it stands). A single combined
    placeholder (``@CHEM-GENE$``, overlapping mentions) gives both entities that one span, typed
    by its two halves in order (``type_order`` does not apply: the spans are the same).
    """
    found = [Entity(match.start(), match.end(), match.group(1)) for match in PLACEHOLDER_PATTERN.finditer(text)]
    if len(found) == 1 and "-" in found[0].type:
        first_type, second_type = found[0].type.split("-", 1)
        return (Entity(found[0].start, found[0].end, first_type), Entity(found[0].start, found[0].end, second_type))
    if len(found) != 2:
        raise InputError(f"expected two @TYPE$ placeholders (or one combined @A-B$), found {len(found)} in {text!r}")
    if type_order is not None:
        rank = {entity_type: position for position, entity_type in enumerate(type_order)}
        missing = [entity.type for entity in found if entity.type not in rank]
        if missing:
            raise InputError(f"placeholder types {missing} are not in type_order {list(type_order)}")
        found.sort(key=lambda entity: rank[entity.type])
    return found[0], found[1]


def pair_from_placeholders(text: str, pair: PlaceholderPair) -> tuple[Entity, Entity]:
    """A dataset's entity pair in a pre-dummified sentence, E1 first: exactly one placeholder of each
    of the pair's types (two ``@DRUG$`` for DDI), or its one overlap placeholder alone. Anything else
    (a missing or third placeholder, a type of another dataset) is a ValueError saying what was found,
    so a reader can refuse the line instead of training on a sentence without its pair."""
    found = [Entity(match.start(), match.end(), match.group(1)) for match in PLACEHOLDER_PATTERN.finditer(text)]
    types = [entity.type for entity in found]
    if types == [pair.overlap]:
        return Entity(found[0].start, found[0].end, pair.first), Entity(found[0].start, found[0].end, pair.second)
    if sorted(types) != sorted((pair.first, pair.second)):
        wanted = f"@{pair.first}$ and @{pair.second}$ (or one @{pair.overlap}$)"
        seen = ", ".join(f"@{t}$" for t in types) if types else "no placeholder"
        raise InputError(f"expected the entity pair as {wanted}, found {seen}")
    first = next(entity for entity in found if entity.type == pair.first)
    second = next(entity for entity in found if entity.type == pair.second and entity is not first)
    return first, second


def pair_or_one_from_placeholders(text: str, pair: PlaceholderPair) -> tuple[Entity, ...]:
    """The pair as :func:`pair_from_placeholders` finds it, or the one mention of a sentence that
    marks only one of the pair: a single placeholder of the pair's first or second type. BLURB's
    ChemProt TSV has such rows (the chemical left as its own words while ``BC6ENTG`` marks the gene:
    24 of 16,521 train, 6 dev and 15 test rows), and they are part of the benchmark's test set, so a
    reader keeps them and fine-tuning decides (see ``RelationAdapter``). Anything else (no
    placeholder, a third one, a type of another dataset) is still a ValueError."""
    found = [Entity(match.start(), match.end(), match.group(1)) for match in PLACEHOLDER_PATTERN.finditer(text)]
    if len(found) == 1 and found[0].type in (pair.first, pair.second):
        return (found[0],)
    try:
        return pair_from_placeholders(text, pair)
    except InputError as err:
        raise InputError(f"{err}; a sentence may also mark one of the pair alone") from None


def add_marker_tokens(tokenizer, markers: Sequence[str] = ENTITY_MARKERS) -> list[str]:
    """Add the entity markers to the tokenizer as special tokens; return the markers.

    Special added tokens are matched before normalization (so lower-casing tokenizers keep
    ``[E1]`` whole), split out wherever they stand, skipped by ``decode(skip_special_tokens=True)``
    and saved with the tokenizer. With byte-level BPE (RoBERTa, GPT-2: spaces are part of the
    tokens) each marker takes the space before it (``lstrip``), so no lone space token ("Ġ") is left
    before every marker; the word after a marker keeps its space and is split as inside running
    text. (WordPiece and SentencePiece drop or re-add that space themselves.) Markers already
    present are not added twice. Afterwards call ``model.resize_token_embeddings(len(tokenizer))``
    (the trainer does).
    """
    from tokenizers import AddedToken

    vocabulary = tokenizer.get_vocab()
    missing = [marker for marker in markers if marker not in vocabulary]
    if missing:
        lstrip = _spaces_in_tokens(tokenizer)
        tokenizer.add_tokens([AddedToken(marker, special=True, normalized=False, lstrip=lstrip) for marker in missing],
                             special_tokens=True)
    return list(markers)


def _spaces_in_tokens(tokenizer) -> bool:
    """Whether the tokenizer keeps spaces inside its tokens: a byte-level BPE pre-tokenizer."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return False
    return '"ByteLevel"' in json.dumps(json.loads(backend.to_str()).get("pre_tokenizer"))


def _token_range(offsets: Sequence[tuple[int, int]], start: int, end: int) -> tuple[int, int]:
    """The half-open range of tokens whose characters overlap ``[start, end)``."""
    touching = [index for index, (token_start, token_end) in enumerate(offsets)
                if token_end > start and token_start < end]
    if not touching:
        raise InputError(f"no token covers characters [{start}, {end})")
    return touching[0], touching[-1] + 1


def _window(num_tokens: int, budget: int, low: int, high: int) -> tuple[int, int]:
    """A ``budget``-token window of ``[0, num_tokens)`` around ``[low, high)``, context split evenly."""
    if num_tokens <= budget:
        return 0, num_tokens
    if high - low <= budget:
        start = max(0, low - (budget - (high - low)) // 2)
        start = min(start, num_tokens - budget)
    else:  # cannot keep both: keep the text from the earlier entity on
        start = low
    return start, start + budget


def _check_markers(tokenizer, content_ids: Sequence[int], starts: Sequence[tuple[int, int]]) -> None:
    """Each entity's start marker must be one token (the tokenizer knows the markers)."""
    marker_ids = tokenizer.convert_tokens_to_ids(list(ENTITY_MARKERS[0::2]))
    for index, (start, end) in enumerate(starts):
        if end - start != 1 or content_ids[start] != marker_ids[index]:
            raise InputError(f"{ENTITY_MARKERS[2 * index]} is not a single token: call "
                             "add_marker_tokens(tokenizer) and resize the model's embeddings")


def _place_entities(spans: Sequence[tuple[int, int]], starts: Sequence[tuple[int, int]], offset: int,
                    window_start: int, width: int) -> tuple[list[list[int]], list[int]]:
    """The entities' token spans and start tokens in the windowed sequence (after ``offset``
    special tokens), clipped into the window."""
    def place(position: int) -> int:  # content index → index in the windowed sequence
        return offset + min(max(position - window_start, 0), width - 1)

    entity_spans, entity_starts = [], []
    for (start, end), (start_token, _) in zip(spans, starts):
        clipped_start = place(start)
        clipped_end = max(place(end - 1) + 1, clipped_start + 1)
        entity_spans.append([clipped_start, clipped_end])
        entity_starts.append(place(start_token))
    return entity_spans, entity_starts


def _tokenized(text: str, tokenizer) -> tuple[list[int], list[tuple[int, int]], list[int], int, int]:
    """Input ids, character offsets and token types of ``text`` with special tokens, and where its
    content tokens (those covering characters; the special tokens around them cover none) begin and end."""
    encoding = tokenizer(text, add_special_tokens=True, truncation=False, verbose=False,
                         return_offsets_mapping=True, return_token_type_ids=True)
    input_ids, offsets = list(encoding["input_ids"]), [tuple(pair) for pair in encoding["offset_mapping"]]
    token_type_ids = list(encoding.get("token_type_ids") or [0] * len(input_ids))
    content = [index for index, (start, end) in enumerate(offsets) if end > start]
    if not content:
        raise InputError(f"the text has no tokens: {text!r}")
    return input_ids, offsets, token_type_ids, content[0], content[-1] + 1


def encode_relation_example(text: str, entities: Sequence[Mention], tokenizer,
                            transformation: Transformation = "dummify", max_length: int = 128, *,
                            type_map: Mapping[str, str] | None = None,
                            on_overflow: Literal["error", "clip"] = "error") -> dict:
    """Transform, tokenize and window one relation instance.

    Returns a dict of unpadded model inputs — ``input_ids``, ``attention_mask``, ``token_type_ids``
    (lists of ints), ``entity_spans`` (``[[s1, e1], [s2, e2]]``, half-open token spans of the
    mentions) and ``entity_starts`` (``[p1, p2]``, the start marker's token with ``markers``, else
    the first token of the mention or placeholder) — and two flags: ``truncated`` (tokens were
    cut) and ``entities_clipped`` (an entity is partly or wholly outside the window).

    Sequences longer than ``max_length`` keep a window that contains both entities (and their
    markers) with the leftover budget split between the context before and after them. When the
    entities alone need more, ``on_overflow="error"`` raises :class:`EntitiesDoNotFitError`;
    ``"clip"`` keeps the window starting at the earlier entity and clips the other entity's span
    into it (an entity wholly cut off points at the window's last token), so every instance still
    gets a prediction — what evaluation on a fixed test set needs.
    """
    if on_overflow not in ("error", "clip"):
        raise InputError(f"on_overflow must be 'error' or 'clip', got {on_overflow!r}")
    if not getattr(tokenizer, "is_fast", False):
        raise InputError("encode_relation_example needs a fast tokenizer (for its offset mapping)")
    transformed = transform_text(text, entities, transformation, type_map)
    input_ids, offsets, token_type_ids, first, last = _tokenized(transformed.text, tokenizer)
    prefix, suffix = input_ids[:first], input_ids[last:]
    content_ids, content_offsets = input_ids[first:last], offsets[first:last]
    budget = max_length - len(prefix) - len(suffix)
    if budget < 1:
        raise InputError(f"max_length {max_length} leaves no room next to {len(prefix) + len(suffix)} special tokens")

    spans = [_token_range(content_offsets, *span) for span in transformed.spans]
    starts = [_token_range(content_offsets, *span) for span in transformed.starts]
    if transformation == "markers":
        _check_markers(tokenizer, content_ids, starts)
    needed = [_token_range(content_offsets, *extent) for extent in transformed.extents]
    low, high = min(span[0] for span in needed), max(span[1] for span in needed)
    fits = high - low <= budget
    if not fits and on_overflow == "error":
        raise EntitiesDoNotFitError(f"the two entities span {high - low} tokens but max_length {max_length} leaves "
                                    f"{budget}; raise max_length or use on_overflow='clip'")
    window_start, window_end = _window(len(content_ids), budget, low, high)
    width = window_end - window_start
    entity_spans, entity_starts = _place_entities(spans, starts, len(prefix), window_start, width)
    ids = prefix + content_ids[window_start:window_end] + suffix
    types = (token_type_ids[:first] + token_type_ids[first + window_start:first + window_end]
             + token_type_ids[last:])
    return {
        "input_ids": ids,
        "attention_mask": [1] * len(ids),
        "token_type_ids": types,
        "entity_spans": entity_spans,
        "entity_starts": entity_starts,
        "truncated": width < len(content_ids),
        "entities_clipped": not fits,
    }


def collate_relation_features(features: Sequence[Mapping], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-pad a list of :func:`encode_relation_example` outputs into model-input tensors.

    Only :data:`MODEL_INPUT_KEYS` are kept (the flags are not model inputs); a ``labels`` key is
    stacked when every feature has one.
    """
    import torch

    if not features:
        raise InputError("cannot collate an empty batch")
    length = max(len(feature["input_ids"]) for feature in features)

    def pad(key: str, value: int) -> torch.Tensor:
        return torch.tensor([list(f[key]) + [value] * (length - len(f[key])) for f in features], dtype=torch.long)

    batch = {"input_ids": pad("input_ids", pad_token_id), "attention_mask": pad("attention_mask", 0),
             "token_type_ids": pad("token_type_ids", 0),
             "entity_spans": torch.tensor([f["entity_spans"] for f in features], dtype=torch.long),
             "entity_starts": torch.tensor([f["entity_starts"] for f in features], dtype=torch.long)}
    if all("labels" in feature for feature in features):
        batch["labels"] = torch.tensor([feature["labels"] for feature in features])
    return batch
