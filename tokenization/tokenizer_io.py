"""Saving and loading BERT WordPiece tokenizers, with casing recorded explicitly.

A tokenizer directory written here holds ``tokenizer.json`` (the fast tokenizer, whose normalizer
lowercases or not), ``vocab.txt`` (one token per line, line number = id), ``tokenizer_config.json``
(``do_lower_case`` for ``transformers``) and ``vocab_card.json`` (how it was built). Casing lives in
all three, so a cased vocabulary cannot be used lowercased by accident: :func:`load_tokenizer`
refuses a casing request that contradicts what the directory records.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from biomed_lm.errors import TokenizationError

SPECIAL_TOKENS = {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]",
                  "sep_token": "[SEP]", "mask_token": "[MASK]"}
VOCAB_CARD = "vocab_card.json"


class CasingMismatchError(TokenizationError, ValueError):
    """Raised when a caller asks for a casing the tokenizer was not built with."""


def bert_normalizer(lowercase: bool):
    """BERT's text normalizer: drop control characters, space out CJK ideographs and, when
    uncased, lowercase and strip accents (strip_accents follows lowercase, exactly as BERT's
    BasicTokenizer does). Vocabulary training uses the same object, so a vocabulary is always
    learnt from text normalized the way it will be tokenized."""
    from tokenizers import normalizers

    return normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                      strip_accents=None, lowercase=lowercase)


def bert_pipeline(tokenizer, lowercase: bool, max_input_chars_per_word: int = 100):
    """Give a ``tokenizers.Tokenizer`` with a WordPiece model BERT's normalizer, pre-tokenizer,
    post-processor ([CLS] A [SEP] B [SEP] with segment ids) and decoder."""
    from tokenizers import decoders, pre_tokenizers, processors

    tokenizer.normalizer = bert_normalizer(lowercase)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    cls_id = tokenizer.token_to_id("[CLS]")
    sep_id = tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)])
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    return tokenizer


def save_tokenizer_dir(tokenizer, out_dir: str | os.PathLike, lowercase: bool,
                       card: dict[str, Any] | None = None, model_max_length: int = 512) -> Path:
    """Write a ``tokenizers.Tokenizer`` (WordPiece, BERT pipeline) as a directory that
    ``transformers.AutoTokenizer.from_pretrained`` loads, with casing recorded."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    missing = [t for t in SPECIAL_TOKENS.values() if tokenizer.token_to_id(t) is None]
    if missing:
        raise ValueError(f"tokenizer lacks the special token(s) {missing}")
    tokenizer.save(str(out / "tokenizer.json"))
    vocab = tokenizer.get_vocab()
    by_id = sorted(vocab.items(), key=lambda kv: kv[1])
    if [i for _, i in by_id] != list(range(len(by_id))):
        raise ValueError("vocabulary ids are not contiguous from 0; cannot write vocab.txt")
    (out / "vocab.txt").write_text("".join(tok + "\n" for tok, _ in by_id), encoding="utf-8")
    config = {
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": lowercase,
        "strip_accents": None,
        "tokenize_chinese_chars": True,
        "model_max_length": model_max_length,
        **SPECIAL_TOKENS,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    (out / "special_tokens_map.json").write_text(json.dumps(SPECIAL_TOKENS, indent=2) + "\n", encoding="utf-8")
    full_card = {"lowercase": lowercase, "vocab_size": len(by_id),
                 "special_token_ids": {t: vocab[t] for t in SPECIAL_TOKENS.values()}, **(card or {})}
    (out / VOCAB_CARD).write_text(json.dumps(full_card, indent=2) + "\n", encoding="utf-8")
    return out


def infer_lowercase_from_vocab(vocab_file: str | os.PathLike) -> bool:
    """An uncased vocabulary was learnt from lowercased text, so lowercasing changes none of its
    tokens; a cased one has tokens that lowercasing changes ("RecA"). Symbols such as "ϒ" or "ℂ"
    count as uppercase for ``str.isupper`` but have no lowercase form, so they are no evidence of
    casing (the released PubMedBERT vocabulary contains 49 of them)."""
    with open(vocab_file, encoding="utf-8") as handle:
        for line in handle:
            token = line.rstrip("\n")
            if token.startswith("[") and token.endswith("]"):
                continue
            if token != token.lower():
                return False
    return True


def recorded_lowercase(path: str | os.PathLike) -> bool | None:
    """The casing a tokenizer directory records (vocab card, then tokenizer_config), or None."""
    p = Path(path)
    for name, key in ((VOCAB_CARD, "lowercase"), ("tokenizer_config.json", "do_lower_case")):
        f = p / name
        if f.is_file():
            value = json.loads(f.read_text(encoding="utf-8")).get(key)
            if isinstance(value, bool):
                return value
    return None


def load_tokenizer(path: str | os.PathLike, lowercase: bool | None = None):
    """Load a BERT tokenizer from a directory or a bare ``vocab.txt``.

    ``lowercase=None`` uses what the directory records (or, for a bare vocab file, infers it: a
    vocabulary with uppercase tokens is cased). An explicit ``lowercase`` that contradicts the
    recorded casing raises :class:`CasingMismatchError`.
    """
    from transformers import AutoTokenizer, BertTokenizer

    p = Path(path)
    if p.is_dir():
        recorded = recorded_lowercase(p)
        if recorded is None and (p / "vocab.txt").is_file():
            recorded = infer_lowercase_from_vocab(p / "vocab.txt")
        if lowercase is not None and recorded is not None and lowercase != recorded:
            raise CasingMismatchError(
                f"{p} was built {'uncased' if recorded else 'cased'}; refusing to use it "
                f"{'lowercased' if lowercase else 'cased'}")
        tok = AutoTokenizer.from_pretrained(str(p))
        effective = recorded if recorded is not None else lowercase
    elif p.is_file():
        effective = infer_lowercase_from_vocab(p) if lowercase is None else lowercase
        # BertTokenizer(path) — the positional form; BertTokenizer(vocab_file=...) silently builds
        # a 5-token vocabulary in transformers 5.
        tok = BertTokenizer(str(p), do_lower_case=effective)
    else:
        raise FileNotFoundError(f"tokenizer not found: {p} (expected a directory or a vocab.txt file)")
    tok.init_kwargs["do_lower_case"] = effective
    return tok
