"""Sentence splitting for biomedical abstracts (segments A/B of next-sentence prediction).

The splitter is Bling Fire's sentence breaker (``blingfire.text_to_sentences``): a compiled
finite-state model from Microsoft that handles decimals ("2.5 mg"), "et al.", "e.g.", "i.v.",
"approx.", "vs." and bracketed citations correctly, at ~9,000 abstracts/s on one core (pySBD, the
best pure-Python rule-based alternative, manages ~80/s and splits after "approx." and "et al.";
punkt needs model data that cannot be fetched offline). Its few misses on biomedical text are
sentence breaks after an abbreviation that ends in a period ("Dr. Jones", "Fig. 2", "S. aureus");
:func:`split_sentences` rejoins those with a short, documented list. The README compares the
options on examples.
"""

from __future__ import annotations

import re

#: Bump when the splitting changes: a corpus's cached sentences are rebuilt (tokenization/corpus.py).
SPLITTER_VERSION = 2

# Abbreviations that (almost) never end a sentence, so a break Bling Fire puts after one is undone.
# Deliberately short: units ("min.", "h.") and "etc.", "i.v." often do end sentences. Matched as written:
# all capitals are other words in biomedicine ("MS." multiple sclerosis or mass spectrometry, "MR.", "DR.").
CONTINUING_ABBREVIATIONS = frozenset("""
    Dr. Mr. Mrs. Ms. Prof. Fig. Figs. Ref. Refs. Eq. Eqs. fig. figs. ref. refs. eq. eqs.
    approx. cf. vs. e.g. i.e. viz.
""".split())
# Lowercase, and only before what cannot start a sentence: "et al. (2019)", "ca. 5 mg". "et al. Our results"
# is a break, and "Ca." calcium, "Al." aluminium (QA: both rejoined sentences when matched in any case).
CONTINUING_BEFORE_LOWERCASE = frozenset({"al.", "ca."})

# "E. coli", "S. aureus": a single capital letter and a period, followed by a lowercase word.
_GENUS_INITIAL = re.compile(r"(?:^|\s)[A-Z]\.$")
_STARTS_LOWER = re.compile(r"^[a-z]")
_STARTS_MID_SENTENCE = re.compile(r"^[a-z0-9(\[]")


def _continues(previous: str, following: str) -> bool:
    last = previous.rsplit(None, 1)[-1] if previous.split() else ""
    if last in CONTINUING_ABBREVIATIONS:
        return True
    if last in CONTINUING_BEFORE_LOWERCASE:
        return bool(_STARTS_MID_SENTENCE.match(following))
    return bool(_GENUS_INITIAL.search(previous) and _STARTS_LOWER.match(following))


def split_sentences(text: str) -> list[str]:
    """Split one document into sentences (whitespace inside each sentence is kept as given). A line break
    always ends a sentence: the corpus puts one between a structured abstract's sections, whose last
    sentence need not end in a period ("... undergoing IVF" then "None.")."""
    import blingfire  # compiled extension: imported on first use, not at package import

    return [sentence for part in text.split("\n") for sentence in _split_part(part, blingfire)]


def splitter_identity() -> str:
    """What the sentences depend on besides the text: this module's rules and Bling Fire's model."""
    import importlib.metadata

    return f"{SPLITTER_VERSION}/blingfire-{importlib.metadata.version('blingfire')}"


def _split_part(text: str, blingfire) -> list[str]:
    text = text.strip()
    if not text:
        return []
    pieces = [p.strip() for p in blingfire.text_to_sentences(text).split("\n") if p.strip()]
    sentences: list[str] = []
    for piece in pieces:
        if sentences and _continues(sentences[-1], piece):
            sentences[-1] = f"{sentences[-1]} {piece}"
        else:
            sentences.append(piece)
    return sentences
