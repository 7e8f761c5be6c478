"""Tagging schemes for token classification (NER, PICO): BIO, BIOUL and IO, and exact conversions.

The paper (section 2.4.2, Table 13) fine-tunes NER with three schemes and finds the differences
minuscule; comparing them honestly needs conversions that change only the encoding, never the
entities. Everything here goes through one representation, the *span*: ``(start, end, type)``
with ``end`` exclusive, so a conversion is
``from_spans(to_spans(tags, source), len(tags), target)``.

Tags
    ``"O"`` (outside), or a prefix letter, a hyphen and the entity type: ``"B-Chemical"``. The type
    is everything after the first hyphen (``"B-gene-protein"`` has type ``"gene-protein"``). A bare
    prefix (``"B"``, ``"I"``) is a tag of the empty type ``""``, as in single-type corpora that
    write no type; it round-trips as such.

Schemes (prefixes allowed)
    ``bio`` (IOB2: ``B`` begins every entity, ``I`` continues it; ``O``) — the paper's standard.
    ``bioul`` (``B`` begins, ``I`` continues, ``L`` is the Last token of a multi-token entity,
    ``U`` a Unit-length entity; ``O``) — BILOU, also written BIOES (``S``/``E`` for ``U``/``L``).
    The paper's sentence defining BIOUL swaps U and L; we use the standard meaning above, which is
    also seqeval's ``BILOU``. ``io`` (``I`` for every entity token; ``O``).
    Names are case-insensitive; ``iob2`` and ``bilou`` are accepted aliases.

Losslessness
    BIO and BIOUL both encode any set of non-overlapping typed spans exactly, so BIO -> BIOUL ->
    BIO returns every *valid* BIO sequence unchanged (and vice versa). IO cannot mark where an
    entity begins, so two entities of the same type that touch (``end`` of one == ``start`` of the
    next) merge into one. Conversion to IO is therefore lossless exactly when no two adjacent
    entities share a type (:func:`is_lossless_to_io`); otherwise ``convert_tags(..., target="io")``
    still succeeds and returns the merged encoding — it is the IO encoding, and refusing it would
    make IO fine-tuning impossible. Adjacent entities of *different* types survive IO.

Invalid sequences and the conll convention
    Predicted sequences are often ill-formed: BIO ``I-X`` after ``O`` or after a different type;
    BIOUL ``B-X``/``I-X`` not closed by ``L-X``, or ``I-X``/``L-X`` that continues nothing.
    :func:`to_spans` reads them the way conlleval (and seqeval's default mode) does: a token
    whose prefix cannot continue the entity before it starts a new entity (``I-X`` is read as
    ``B-X``, an orphan ``L-X`` as ``U-X``), and an entity left open ends at its last token (an
    unclosed ``B-X`` is read as ``U-X``). So every conversion doubles as a repair
    (:func:`repair_tags`), and a converted sequence is always valid in its target scheme.
    :func:`validate_tags` refuses instead of repairing, naming the first bad position. Tags
    outside the scheme's alphabet (``U-X`` in BIO, malformed strings) are always an error, never
    repaired: they mean the caller passed the wrong scheme.
"""

from __future__ import annotations

import operator
from typing import Iterable, Literal, Sequence, get_args

from biomed_lm.errors import FinetuneError, InputError

OUTSIDE = "O"
Scheme = Literal["bio", "bioul", "io"]
SCHEMES: tuple[str, ...] = get_args(Scheme)
#: The names a config or flag may give a scheme by: the schemes, then the aliases users carry.
SchemeName = Literal[Scheme, "iob2", "bilou"]
_ALIASES = {**{scheme: scheme for scheme in SCHEMES}, "iob2": "bio", "bilou": "bioul"}
assert tuple(_ALIASES) == get_args(SchemeName)  # every name has its scheme
_PREFIXES = {"bio": ("B", "I"), "bioul": ("B", "I", "L", "U"), "io": ("I",)}
# Prefixes that can extend the entity of the previous token, and those that close their entity.
_CONTINUE = frozenset({"I", "L"})
_CLOSE = frozenset({"L", "U"})
# Prefixes after which the entity is still open (so an I/L of the same type may follow).
_OPEN = frozenset({"B", "I"})

Span = tuple[int, int, str]


class TagSequenceError(FinetuneError, ValueError):
    """A tag sequence that breaks its scheme; ``position`` is the index of the offending tag."""

    def __init__(self, message: str, position: int):
        super().__init__(message)
        self.position = position


def normalize_scheme(scheme: str) -> str:
    """The canonical name (``"bio"``, ``"bioul"`` or ``"io"``) of a scheme name or alias."""
    key = str(scheme).strip().lower()
    if key not in _ALIASES:
        hint = " (BIOES/IOBES: rename S- to U- and E- to L-, then use 'bioul')" \
            if key in ("bioes", "iobes") else ""
        aliases = ", ".join(name for name in _ALIASES if name not in SCHEMES)
        raise InputError(f"unknown tagging scheme {scheme!r}: expected one of "
                         f"{', '.join(SCHEMES)} (aliases: {aliases}){hint}")
    return _ALIASES[key]


def split_tag(tag: str) -> tuple[str, str]:
    """``(prefix, type)`` of a tag: ``"B-Gene"`` -> ``("B", "Gene")``, ``"O"`` -> ``("O", "")``,
    bare ``"I"`` -> ``("I", "")``. Raises ValueError for anything that is not a tag of some scheme
    (the scheme's own alphabet is checked by the callers that know it)."""
    if not isinstance(tag, str):
        raise InputError(f"a tag must be a str, not {type(tag).__name__} ({tag!r})")
    if tag == OUTSIDE:
        return OUTSIDE, ""
    prefix, sep, entity_type = tag[:1], tag[1:2], tag[2:]
    if prefix not in ("B", "I", "L", "U") or (sep and sep != "-") or (sep and not entity_type):
        raise InputError(f"malformed tag {tag!r}: expected 'O', a prefix B/I/L/U, or "
                         f"prefix-TYPE such as 'B-Chemical'")
    return prefix, entity_type


def make_tag(prefix: str, entity_type: str) -> str:
    """The tag for a prefix and a type; the empty type gives a bare prefix (``"B"``)."""
    if prefix == OUTSIDE:
        return OUTSIDE
    return f"{prefix}-{entity_type}" if entity_type else prefix


def tag_labels(entity_types: Iterable[str], scheme: str = "bio") -> list[str]:
    """The label set of a token classifier for these entity types: ``"O"`` first, then each type's
    tags in the scheme's prefix order, types in the order given (so label ids are reproducible).
    """
    scheme = normalize_scheme(scheme)
    types = list(dict.fromkeys(entity_types))
    for entity_type in types:
        if not isinstance(entity_type, str):
            raise InputError(f"an entity type must be a str, not {entity_type!r}")
    return [OUTSIDE] + [make_tag(p, t) for t in types for p in _PREFIXES[scheme]]


def _parse(tags: Sequence[str], scheme: str) -> list[tuple[str, str]]:
    """Split every tag, refusing tags outside the scheme's alphabet (with their position)."""
    allowed = _PREFIXES[scheme]
    parsed = []
    for i, tag in enumerate(tags):
        try:
            prefix, entity_type = split_tag(tag)
        except ValueError as err:
            raise TagSequenceError(f"position {i}: {err}", i) from None
        if prefix != OUTSIDE and prefix not in allowed:
            raise TagSequenceError(
                f"position {i}: tag {tag!r} is not a {scheme.upper()} tag (allowed prefixes: "
                f"{', '.join(allowed + (OUTSIDE,))})", i)
        parsed.append((prefix, entity_type))
    return parsed


def _first_error(tags: Sequence[str], scheme: str) -> TagSequenceError | None:
    parsed = _parse(tags, scheme)
    n = len(parsed)
    for i, (prefix, entity_type) in enumerate(parsed):
        if prefix in _CONTINUE and scheme != "io":
            prev_prefix, prev_type = parsed[i - 1] if i else (OUTSIDE, "")
            if prev_prefix not in _OPEN or prev_type != entity_type:
                previous = repr(tags[i - 1]) if i else "the sequence start"
                return TagSequenceError(
                    f"position {i}: {tags[i]!r} continues no entity of type {entity_type!r} "
                    f"(it follows {previous}); the conll convention starts a new entity here", i)
        if scheme == "bioul" and prefix in _OPEN:
            next_prefix, next_type = parsed[i + 1] if i + 1 < n else (OUTSIDE, "")
            if next_prefix not in _CONTINUE or next_type != entity_type:
                following = repr(tags[i + 1]) if i + 1 < n else "the sequence end"
                return TagSequenceError(
                    f"position {i}: the entity {tags[i]!r} is not closed by "
                    f"{make_tag('L', entity_type)!r} (it is followed by {following}); "
                    f"the conll convention ends it here", i)
    return None


def validate_tags(tags: Sequence[str], scheme: str = "bio") -> None:
    """Raise :class:`TagSequenceError` (a ValueError) at the first tag that breaks ``scheme``.

    Checked: every tag is in the scheme's alphabet; BIO and BIOUL ``I-X``/``L-X`` follow a
    ``B-X`` or ``I-X``; BIOUL ``B-X``/``I-X`` are followed by ``I-X`` or ``L-X``. IO has no
    sequence constraint. Gold annotations should pass; predictions may not (see the module doc).
    """
    error = _first_error(tags, normalize_scheme(scheme))
    if error is not None:
        raise error


def is_valid_tags(tags: Sequence[str], scheme: str = "bio") -> bool:
    """Whether :func:`validate_tags` would pass. Tags outside the alphabet still raise."""
    return _first_error(tags, normalize_scheme(scheme)) is None


def to_spans(tags: Sequence[str], scheme: str = "bio") -> list[Span]:
    """The entities of a tag sequence as ``(start, end_exclusive, type)``, sorted by start.

    Valid sequences decode exactly; invalid ones by the conll convention of the module doc (a tag
    that cannot continue the previous entity starts a new one; an open entity ends at its last
    token). Spans never overlap. Raises TagSequenceError for tags outside the scheme's alphabet.
    """
    parsed = _parse(tags, normalize_scheme(scheme))
    spans: list[Span] = []
    start, open_type, is_open = 0, "", False
    for i, (prefix, entity_type) in enumerate(parsed):
        if prefix == OUTSIDE:
            if is_open:
                spans.append((start, i, open_type))
                is_open = False
            continue
        continues = is_open and prefix in _CONTINUE and entity_type == open_type
        if not continues:
            if is_open:
                spans.append((start, i, open_type))
            start, open_type, is_open = i, entity_type, True
        if prefix in _CLOSE:
            spans.append((start, i + 1, open_type))
            is_open = False
    if is_open:
        spans.append((start, len(parsed), open_type))
    return spans


def _checked_spans(spans: Iterable[Sequence], length: int) -> list[Span]:
    checked = []
    for span in spans:
        if len(span) != 3:
            raise InputError(f"a span is (start, end_exclusive, type), not {span!r}")
        start, end, entity_type = span
        try:
            if isinstance(start, bool) or isinstance(end, bool):
                raise TypeError
            start, end = operator.index(start), operator.index(end)
        except TypeError:
            raise InputError(f"span {tuple(span)!r}: start and end must be ints") from None
        if not isinstance(entity_type, str):
            raise InputError(f"span {tuple(span)!r}: the type must be a str")
        if not 0 <= start < end <= length:
            raise InputError(f"span {tuple(span)!r} is empty or outside a sequence of length "
                             f"{length} (need 0 <= start < end <= length)")
        checked.append((start, end, entity_type))
    checked.sort()
    for before, after in zip(checked, checked[1:]):
        if after[0] < before[1]:
            raise InputError(f"spans {before!r} and {after!r} overlap; a flat tag sequence "
                             f"cannot encode overlapping entities")
    return checked


def from_spans(spans: Iterable[Sequence], length: int, scheme: str = "bio") -> list[str]:
    """The tag sequence of ``length`` tokens that encodes ``spans`` in ``scheme``.

    Spans may come in any order but must lie in ``[0, length)``, be non-empty and not overlap
    (ValueError otherwise). In IO, adjacent spans of the same type merge (see the module doc).
    """
    scheme = normalize_scheme(scheme)
    try:
        if isinstance(length, bool):
            raise TypeError
        length = operator.index(length)
    except TypeError:
        raise InputError(f"length must be a non-negative int, not {length!r}") from None
    if length < 0:
        raise InputError(f"length must be a non-negative int, not {length!r}")
    tags = [OUTSIDE] * length
    for start, end, entity_type in _checked_spans(spans, length):
        if scheme == "io":
            tags[start:end] = [make_tag("I", entity_type)] * (end - start)
        elif scheme == "bioul" and end - start == 1:
            tags[start] = make_tag("U", entity_type)
        else:
            tags[start] = make_tag("B", entity_type)
            tags[start + 1:end] = [make_tag("I", entity_type)] * (end - start - 1)
            if scheme == "bioul":
                tags[end - 1] = make_tag("L", entity_type)
    return tags


def convert_tags(tags: Sequence[str], source: str, target: str) -> list[str]:
    """Re-encode a tag sequence from scheme ``source`` to scheme ``target``.

    Exact for valid input between BIO and BIOUL; to IO exact iff :func:`is_lossless_to_io`.
    Invalid input is repaired by the conll convention on the way (call :func:`validate_tags`
    first to refuse it instead); the result is always valid in ``target``.
    """
    return from_spans(to_spans(tags, source), len(tags), target)


def repair_tags(tags: Sequence[str], scheme: str = "bio") -> list[str]:
    """The valid sequence of the same scheme that the conll convention reads ``tags`` as
    (``["O", "I-X", "I-X"]`` -> ``["O", "B-X", "I-X"]`` in BIO). Valid input comes back equal."""
    return convert_tags(tags, scheme, scheme)


def is_lossless_to_io(tags: Sequence[str], scheme: str = "bio") -> bool:
    """Whether converting ``tags`` to IO keeps every entity: true iff no entity ends exactly where
    another entity of the same type begins (``B-X B-X`` or ``I-X B-X`` in BIO)."""
    spans = to_spans(tags, scheme)
    return all(not (before[1] == after[0] and before[2] == after[2])
               for before, after in zip(spans, spans[1:]))
