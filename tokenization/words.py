"""Words as BERT sees them: the units its WordPiece tokenizer is applied to.

A word is a BERT pre-tokenization unit: the text is cleaned (control characters dropped, every
whitespace character made a space), CJK characters are set apart, and the result is split on
whitespace and on every punctuation character. This is ``tokenizers``' ``BertNormalizer``
(without lowercasing or accent stripping) followed by its ``BertPreTokenizer``. Casing is left
alone on purpose, so one definition serves every vocabulary: each vocabulary lowercases (or not)
when it tokenizes a word. Vocabulary training (:mod:`tokenization.vocab`) and the coverage report
(:mod:`tokenization.coverage`) both count words this way.
"""

from __future__ import annotations

import re
import unicodedata

# BERT's cleaning and splitting restricted to ASCII, where they are two regular expressions: clean_text
# drops the control characters (tab, newline and carriage return are whitespace instead), and each of
# the 32 ASCII punctuation characters (Python's string.punctuation) is a word of its own.
ASCII_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
ASCII_WORD = re.compile(r"[!-/:-@\[-`{-~]|[^\s!-/:-@\[-`{-~]+")


class WordSplitter:
    """Split text into BERT pre-tokenization units, casing untouched (see the module docstring).

    :meth:`pre_tokenize` is the reference: ``tokenizers``' BertNormalizer and BertPreTokenizer.
    Calling the splitter gives the same words, but takes a regular-expression path for ASCII text
    (most of PubMed), which is about five times faster than building Python objects for every
    word out of the Rust pre-tokenizer; the tests hold the two paths equal.
    """

    def __init__(self) -> None:
        from tokenizers import normalizers, pre_tokenizers

        self._normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                      strip_accents=False, lowercase=False)
        self._pre_tokenizer = pre_tokenizers.BertPreTokenizer()

    def pre_tokenize(self, text: str) -> list[str]:
        return [word for word, _ in self._pre_tokenizer.pre_tokenize_str(self._normalizer.normalize_str(text))]

    def __call__(self, text: str) -> list[str]:
        if text.isascii():
            return ASCII_WORD.findall(ASCII_CONTROL.sub("", text))
        return self.pre_tokenize(text)


def is_punctuation(word: str) -> bool:
    """Whether ``word`` is a punctuation mark BERT splits off as a word of its own: one character,
    ASCII punctuation or symbol (as BERT counts ``$``, ``+``, ``^``) or Unicode category P*."""
    if len(word) != 1:
        return False
    cp = ord(word)
    return 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126 or \
        unicodedata.category(word).startswith("P")
