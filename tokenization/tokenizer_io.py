"""Saving and loading tokenizers (BERT WordPiece, ALBERT SentencePiece, RoBERTa byte-level BPE),
with casing recorded explicitly.

A WordPiece directory written here holds ``tokenizer.json`` (the fast tokenizer, whose normalizer
lowercases or not), ``vocab.txt`` (one token per line, line number = id), ``tokenizer_config.json``
(``do_lower_case`` for ``transformers``) and ``vocab_card.json`` (how it was built). Casing lives in
all three, so a cased vocabulary cannot be used lowercased by accident: :func:`load_tokenizer`
refuses a casing request that contradicts what the directory records.

The two other formats are written by the ``transformers`` class of their model family, so
``AutoTokenizer`` rebuilds exactly the pipeline that was saved:

* SentencePiece (:func:`albert_tokenizer`): ``AlbertTokenizer`` over a SentencePiece unigram model,
  ``tokenizer.json`` + ``tokenizer_config.json`` + the model itself (``spiece.model``, ALBERT's name).
  ALBERT's text preparation (`````` and ``''`` to ``"``; when uncased, NFKD, accents stripped and
  lowercased: :func:`albert_preprocessor`) runs first, then the model's own normalization (its
  precompiled NFKC map), then its Viterbi segmentation; ``▁`` marks a word start. Special tokens as
  ALBERT's: ``<pad>`` 0, ``<unk>`` 1, ``[CLS]`` 2, ``[SEP]`` 3, ``[MASK]`` 4.
* Byte-level BPE (:func:`roberta_tokenizer`): ``RobertaTokenizer`` (``vocab.json``, ``merges.txt``,
  ``tokenizer.json``); ``Ġ`` marks a word start. Special tokens as roberta-base's: ``<s>`` 0,
  ``<pad>`` 1, ``</s>`` 2, ``<unk>`` 3, ``<mask>`` 4. RoBERTa's pipeline has no normalizer, so an
  uncased byte-level BPE tokenizer (BERT's lowercasing and accent stripping in front) is saved as
  a generic ``PreTrainedTokenizerFast``, which ``transformers`` loads from ``tokenizer.json`` as is.

:func:`load_tokenizer` also takes a bare SentencePiece ``.model`` file (ALBERT's pipeline around it).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from biomed_lm.errors import TokenizationError

SPECIAL_TOKENS = {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]",
                  "sep_token": "[SEP]", "mask_token": "[MASK]"}
# ALBERT's special tokens, in id order (albert-base-v2's spiece.model: <pad> 0, <unk> 1, [CLS] 2, ...).
ALBERT_SPECIAL_TOKENS = {"pad_token": "<pad>", "unk_token": "<unk>", "cls_token": "[CLS]",
                         "sep_token": "[SEP]", "mask_token": "[MASK]"}
# RoBERTa's special tokens, in id order (roberta-base: <s> 0, <pad> 1, </s> 2, <unk> 3, <mask> 4).
ROBERTA_SPECIAL_TOKENS = {"bos_token": "<s>", "pad_token": "<pad>", "eos_token": "</s>",
                          "unk_token": "<unk>", "mask_token": "<mask>"}
ROBERTA_ROLES = {**ROBERTA_SPECIAL_TOKENS, "cls_token": "<s>", "sep_token": "</s>"}
VOCAB_CARD = "vocab_card.json"
SENTENCEPIECE_MODEL_FILE = "spiece.model"  # ALBERT's name for it
MODEL_MAX_LENGTH = 512
# A SentencePiece piece of one of these types is text; the others are <unk> and control symbols.
_SPM_TEXT_PIECE_TYPES = (1, 4)  # NORMAL, USER_DEFINED


class CasingMismatchError(TokenizationError, ValueError):
    """Raised when a caller asks for a casing the tokenizer was not built with."""


class VocabularyFileError(TokenizationError, ValueError):
    """A ``vocab.txt`` whose line numbers cannot be its ids (a token twice, a blank line), or one that disagrees
    with the ``tokenizer.json`` beside it; the message names the file(s), the token and the lines."""


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
    write_vocab_card(out, vocab, lowercase, SPECIAL_TOKENS.values(), card)
    return out


def write_vocab_card(out: Path, vocab: dict[str, int], lowercase: bool, specials, card: dict[str, Any] | None) -> None:
    """``vocab_card.json``: the casing, the actual size and the special token ids, then ``card``."""
    full_card = {"lowercase": lowercase, "vocab_size": len(vocab),
                 "special_token_ids": {t: vocab[t] for t in specials}, **(card or {})}
    (out / VOCAB_CARD).write_text(json.dumps(full_card, indent=2) + "\n", encoding="utf-8")


# ------------------------------------------------------------------ SentencePiece (ALBERT)

def albert_preprocessor(lowercase: bool):
    """ALBERT's text preparation before the SentencePiece model's own normalization: `````` and
    ``''`` become ``"``; uncased also decomposes (NFKD), strips accents and lowercases, cased keeps
    accents. Taken from ``AlbertTokenizer`` itself (built without a model), so training text is
    prepared exactly as the saved tokenizer prepares it."""
    from transformers import AlbertTokenizer

    return AlbertTokenizer(do_lower_case=lowercase, keep_accents=not lowercase).backend_tokenizer.normalizer


def sentencepiece_proto(model: bytes):
    """The parsed ``ModelProto`` of a serialized SentencePiece model."""
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model)
    return proto


def albert_tokenizer(model: bytes, lowercase: bool, model_max_length: int = MODEL_MAX_LENGTH):
    """``transformers.AlbertTokenizer`` (fast) over a serialized SentencePiece unigram model: the
    model's pieces and scores as a ``tokenizers`` Unigram (the same Viterbi segmentation), ALBERT's
    preparation and the model's precompiled normalization, ``▁`` word starts (prefixed to every
    word) and ``[CLS] A [SEP] B [SEP]`` with segment ids. ``AlbertTokenizer`` reads the unknown
    piece at id 1, so a model with it elsewhere is refused; special tokens the model lacks are
    appended as added tokens (a model built here has ALBERT's five at ids 0..4)."""
    from transformers import AlbertTokenizer

    proto = sentencepiece_proto(model)
    pieces = [(p.piece, p.score) for p in proto.pieces]
    if proto.trainer_spec.unk_id != 1:
        raise TokenizationError(f"the SentencePiece model has its unknown piece at id {proto.trainer_spec.unk_id}; "
                                "ALBERT's pipeline needs it at id 1 (load the model's tokenizer directory instead)")
    return AlbertTokenizer(vocab=pieces, unk_token=pieces[1][0], do_lower_case=lowercase, keep_accents=not lowercase,
                           _spm_precompiled_charsmap=proto.normalizer_spec.precompiled_charsmap or None,
                           model_max_length=model_max_length,
                           model_input_names=["input_ids", "token_type_ids", "attention_mask"])


def infer_lowercase_from_sentencepiece(model: bytes) -> bool:
    """A SentencePiece model is uncased when no text piece changes under lowercasing (the rule
    :func:`infer_lowercase_from_vocab` applies to a ``vocab.txt``)."""
    proto = sentencepiece_proto(model)
    return all(p.piece == p.piece.lower() for p in proto.pieces if p.type in _SPM_TEXT_PIECE_TYPES)


# ------------------------------------------------------------------ byte-level BPE (RoBERTa)

def roberta_tokenizer(tokenizer, lowercase: bool, add_prefix_space: bool,
                      model_max_length: int = MODEL_MAX_LENGTH):
    """A ``transformers`` tokenizer over a trained byte-level BPE ``tokenizers.Tokenizer`` whose
    first ids are RoBERTa's special tokens: ``RobertaTokenizer`` when cased (its pipeline: byte-level
    pre-tokenizer, ``<s> A </s></s> B </s>``, ``<mask>`` taking the space before it), otherwise the
    same pipeline behind BERT's lowercasing and accent stripping as a ``PreTrainedTokenizerFast``."""
    from tokenizers import AddedToken, processors
    from transformers import PreTrainedTokenizerFast, RobertaTokenizer

    mask = AddedToken(ROBERTA_SPECIAL_TOKENS["mask_token"], lstrip=True, rstrip=False, normalized=False, special=True)
    roles = {**ROBERTA_ROLES, "mask_token": mask}
    if not lowercase:
        model = json.loads(tokenizer.to_str())["model"]
        merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
        return RobertaTokenizer(vocab=model["vocab"], merges=merges, add_prefix_space=add_prefix_space,
                                trim_offsets=True, model_max_length=model_max_length, **roles)
    tokenizer.add_special_tokens([mask])
    tokenizer.post_processor = processors.RobertaProcessing(
        (ROBERTA_ROLES["sep_token"], tokenizer.token_to_id(ROBERTA_ROLES["sep_token"])),
        (ROBERTA_ROLES["cls_token"], tokenizer.token_to_id(ROBERTA_ROLES["cls_token"])),
        trim_offsets=True, add_prefix_space=add_prefix_space)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, model_max_length=model_max_length,
                                   add_prefix_space=add_prefix_space, **roles)


def with_prefix_space(backend) -> bool:
    """Make a byte-level BPE ``tokenizers.Tokenizer`` give a text's first word the ``Ġ`` every other word
    has (``ByteLevel(add_prefix_space=True)``), in place; whether it changed anything. For text that
    stands for a piece of running text: a sentence cut out of a document (pretraining instances), or
    a pre-split word (NER/PICO). transformers' generic ``PreTrainedTokenizerFast`` (an uncased byte-level
    BPE export) ignores an ``add_prefix_space`` argument, so callers set it on the backend with this."""
    from tokenizers import Tokenizer

    pipeline = json.loads(backend.to_str())
    found = [p for p in _pre_tokenizer_nodes(pipeline.get("pre_tokenizer"))
             if p.get("type") == "ByteLevel" and not p.get("add_prefix_space")]
    for node in found:
        node["add_prefix_space"] = True
    if found:
        backend.pre_tokenizer = Tokenizer.from_str(json.dumps(pipeline)).pre_tokenizer
    return bool(found)


def _pre_tokenizer_nodes(node: dict | None) -> list[dict]:
    if not node:
        return []
    if node.get("type") == "Sequence":
        return [leaf for child in node.get("pretokenizers", ()) for leaf in _pre_tokenizer_nodes(child)]
    return [node]


def save_transformers_dir(tokenizer, out_dir: str | os.PathLike, lowercase: bool, specials,
                          card: dict[str, Any] | None = None) -> Path:
    """Write a ``transformers`` fast tokenizer with ``save_pretrained`` (``tokenizer.json``,
    ``tokenizer_config.json``) and the vocabulary card; ``specials`` are the tokens whose ids the
    card records. The caller adds the format's own files (``spiece.model``, ``vocab.json``)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vocab = tokenizer.backend_tokenizer.get_vocab(with_added_tokens=True)
    missing = [t for t in specials if t not in vocab]
    if missing:
        raise ValueError(f"tokenizer lacks the special token(s) {missing}")
    tokenizer.save_pretrained(str(out))
    config_file = out / "tokenizer_config.json"
    config = json.loads(config_file.read_text(encoding="utf-8"))
    config["do_lower_case"] = lowercase
    if config.get("tokenizer_class") == "TokenizersBackend":  # transformers 5's name; 4.x knows the other
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    write_vocab_card(out, vocab, lowercase, specials, card)
    return out


def check_vocab_text(vocab_file: str | os.PathLike) -> None:
    """Refuse a ``vocab.txt`` that BERT's loaders would misread without a word: binary content (a gzipped
    vocabulary) fails in the codec with no hint, and a UTF-8 byte-order mark (an editor's) becomes part of
    the first token, ``\ufeff[PAD]``, so the padding token is missing and the casing inferred from it."""
    from biomed_lm.tokenization.sources import sniff_binary

    with open(vocab_file, "rb") as handle:
        head = handle.read(3)
    if head == b"\xef\xbb\xbf":
        raise ValueError(f"{vocab_file} starts with a UTF-8 byte-order mark, which BERT's tokenizers read as part "
                         "of its first token; remove it (sed -i '1s/^\\xEF\\xBB\\xBF//' FILE) and load it again")
    binary = "the content is gzip-compressed: decompress it" if head[:2] == b"\x1f\x8b" else sniff_binary(vocab_file)
    if binary is not None:
        raise ValueError(f"{vocab_file}: {binary}; a vocab.txt is UTF-8 text, one token per line")


@dataclass(frozen=True)
class VocabLineProblem:
    """A line of a ``vocab.txt`` whose number cannot be its token's id: a blank one, or a token seen before
    (``first_line``)."""

    line: int
    token: str
    first_line: int | None = None

    def describe(self) -> str:
        if self.first_line is None:
            return f"line {self.line} is blank"
        return f"the token {self.token!r} is on line {self.first_line} and again on line {self.line}"


def vocab_line_problem(tokens: list[str]) -> VocabLineProblem | None:
    """The first line of a ``vocab.txt`` (its ``tokens``, one a line) whose number cannot be its id, or None.
    BERT's loaders give each line the id of its number: a token on two lines keeps only its later id (the
    earlier one no text can produce: "ids not contiguous" much later), and a blank line becomes a token no
    text can produce. A file with no token at all is the callers' to name (an empty vocabulary)."""
    while tokens and tokens[-1] == "":  # blank lines at the end shift no id
        tokens = tokens[:-1]
    if not any(token.strip() for token in tokens):  # nothing but whitespace: the callers' "empty"
        return None
    first_line: dict[str, int] = {}
    for number, token in enumerate(tokens, start=1):
        if token == "":  # a whitespace token ("\u3000") is a token; an empty line is none
            return VocabLineProblem(number, token)
        if token in first_line:
            return VocabLineProblem(number, token, first_line[token])
        first_line[token] = number
    return None


def read_vocab_lines(vocab_file: str | os.PathLike) -> list[str]:
    """The tokens of a ``vocab.txt``, one a line, as BERT's ``load_vocab`` reads them."""
    with open(vocab_file, encoding="utf-8") as handle:
        return [line.rstrip("\n") for line in handle]


def check_vocab_lines(vocab_file: str | os.PathLike, tokenizer_json: str | os.PathLike | None = None) -> None:
    """Refuse a ``vocab.txt`` whose line numbers cannot be its ids (:func:`vocab_line_problem`), or that
    disagrees with the WordPiece ``tokenizer_json`` beside it: the fast tokenizer reads one and the slow one
    (and Google's BERT code) the other, so a model would be trained and used with other ids."""
    tokens = read_vocab_lines(vocab_file)
    while tokens and tokens[-1] == "":  # blank lines at the end shift no id
        tokens.pop()
    problem = vocab_line_problem(tokens)
    by_id = _wordpiece_tokens_by_id(Path(tokenizer_json)) if tokenizer_json is not None else None
    if by_id is not None:
        difference = _in_tokenizer_json(problem, by_id) if problem else _first_difference(tokens, by_id)
        if difference is not None:
            raise VocabularyFileError(
                f"{vocab_file} and {tokenizer_json} disagree: {difference}; the two must hold the same tokens in "
                "the same order (one line per id), or the ids a model learns through one are other tokens "
                "through the other: restore the edited file from where the folder came from")
    elif problem is not None:
        raise VocabularyFileError(
            f"{vocab_file}: {problem.describe()}; a vocab.txt holds each token once, one per line, its id the line "
            "number minus 1, so this file is damaged: restore it from where it came from (a tokenizer.json of the "
            "same vocabulary lists the tokens by id) or delete the wrong line if you know which it is")


def _wordpiece_tokens_by_id(path: Path) -> dict[int, str] | None:
    """id -> token of a WordPiece ``tokenizer.json``'s model vocabulary, or None where there is no such file or
    its model is not WordPiece."""
    if not path.is_file():
        return None
    pipeline = json.loads(path.read_text(encoding="utf-8"))
    model = pipeline.get("model") if isinstance(pipeline, dict) else None
    if not isinstance(model, dict) or model.get("type") != "WordPiece" or not isinstance(model.get("vocab"), dict):
        return None
    # The model's vocabulary only: tokens added later (relation markers) sit above it, in tokenizer.json's
    # added_tokens and added_tokens.json, never in vocab.txt (transformers' save_pretrained).
    return {index: token for token, index in model["vocab"].items()}


def _first_difference(tokens: list[str], by_id: dict[int, str]) -> str | None:
    """Where ``tokens`` (vocab.txt's lines) first differ from ``by_id`` (tokenizer.json's ids), in words."""
    for index, token in enumerate(tokens):
        if by_id.get(index) != token:
            held = f"{by_id[index]!r}" if index in by_id else "no token"
            return f"vocab.txt's line {index + 1} is {token!r} where tokenizer.json has {held} as id {index}"
    if len(tokens) < len(by_id):
        return f"vocab.txt has {len(tokens):,} lines, where tokenizer.json has {len(by_id):,} tokens"
    return None


def _in_tokenizer_json(problem: VocabLineProblem, by_id: dict[int, str]) -> str:
    """A vocab.txt problem, and what tokenizer.json holds instead (the duplicate's only id, or no blank token)."""
    if problem.first_line is None:
        return f"in vocab.txt {problem.describe()}, where tokenizer.json has no blank token"
    ids = sorted(index for index, token in by_id.items() if token == problem.token)
    held = f"once, as id {ids[0]}" if len(ids) == 1 else f"as ids {ids}" if ids else "not at all"
    return f"in vocab.txt {problem.describe()}, where tokenizer.json has it {held}"


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
    recorded = _recorded_casing(Path(path))
    return recorded[0] if recorded is not None else None


def _recorded_casing(directory: Path) -> tuple[bool, str] | None:
    """The casing a directory records and where (``"tokenizer_config.json's do_lower_case"``), or None."""
    for name, key in ((VOCAB_CARD, "lowercase"), ("tokenizer_config.json", "do_lower_case")):
        if (directory / name).is_file():
            value = json.loads((directory / name).read_text(encoding="utf-8")).get(key)
            if isinstance(value, bool):
                return value, f"{name}'s {key}"
    return None


def directory_casing(path: str | os.PathLike) -> bool | None:
    """Whether a tokenizer directory's vocabulary is uncased: as it records it (:func:`recorded_lowercase`),
    else as its ``vocab.txt`` shows (:func:`infer_lowercase_from_vocab`); None when neither tells."""
    recorded = recorded_lowercase(path)
    vocab_text = Path(path) / "vocab.txt"
    if recorded is None and vocab_text.is_file():
        return infer_lowercase_from_vocab(vocab_text)
    return recorded


def align_wordpiece_casing(tokenizer, directory: str | os.PathLike, lowercase: bool | None) -> bool | None:
    """Make a BERT (WordPiece) tokenizer loaded from ``directory`` lowercase exactly when its vocabulary is
    uncased (``lowercase``: :func:`directory_casing`); returns the casing it tokenizes with.

    A folder with only ``vocab.txt``, ``config.json`` and weights (a converted Google release, a BioBERT
    download) records no casing, and ``AutoTokenizer`` then lowercases by default (transformers 5 builds the
    normalizer from ``do_lower_case``, default true, whatever ``tokenizer.json`` says): a cased vocabulary's
    "BRCA1" became "br ##ca ##1" while every record said cased (QA). Such a tokenizer gets the normalizer its
    vocabulary needs. A ``tokenizer.json`` whose own normalizer contradicts the vocabulary's casing is refused
    (:class:`CasingMismatchError`) rather than guessed at. Tokenizers without BERT's normalizer (byte-level
    BPE, SentencePiece) are left as they are."""
    actual = wordpiece_lowercases(tokenizer)
    if actual is None or lowercase is None:
        return lowercase if actual is None else actual
    directory = Path(directory)
    stated = _tokenizer_json_lowercases(directory / "tokenizer.json")
    if stated is not None and stated != lowercase:
        raise CasingMismatchError(
            f"{directory}: its tokenizer.json {'lowercases' if stated else 'keeps the case of'} the text, but its "
            f"vocabulary is {'uncased' if lowercase else 'cased'} ({_casing_source(directory)}); make them agree "
            "(remove tokenizer.json to rebuild it from vocab.txt, or correct the record)")
    if actual != lowercase:
        tokenizer.backend_tokenizer.normalizer = bert_normalizer(lowercase)
    return lowercase


def _tokenizer_json_lowercases(path: Path) -> bool | None:
    """Whether a ``tokenizer.json``'s BERT normalizer lowercases (None: no such file or normalizer)."""
    if not path.is_file():
        return None
    normalizer = json.loads(path.read_text(encoding="utf-8")).get("normalizer")
    if not isinstance(normalizer, dict) or normalizer.get("type") != "BertNormalizer":
        return None
    return bool(normalizer.get("lowercase"))


def wordpiece_lowercases(tokenizer) -> bool | None:
    """Whether a tokenizer's BERT normalizer lowercases; None for a tokenizer without one."""
    from tokenizers import normalizers

    backend = getattr(tokenizer, "backend_tokenizer", None)
    normalizer = getattr(backend, "normalizer", None)
    if not isinstance(normalizer, normalizers.BertNormalizer):
        return None
    return normalizer.normalize_str("A") == "a"


def _casing_source(directory: Path) -> str:
    recorded = _recorded_casing(directory)
    if recorded is not None:
        return recorded[1]
    return "vocab.txt has tokens that lowercasing changes" if not infer_lowercase_from_vocab(
        directory / "vocab.txt") else "vocab.txt has no token that lowercasing changes"


#: Files that are part of a tokenizer directory and mean nothing alone.
_DIRECTORY_FILES = frozenset({"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                              "merges.txt", "added_tokens.json", "vocab_card.json"})


def load_tokenizer(path: str | os.PathLike, lowercase: bool | None = None):
    """Load a tokenizer from a directory (any format ``AutoTokenizer`` reads), a bare ``vocab.txt``
    (BERT WordPiece) or a bare SentencePiece ``.model`` file (ALBERT's pipeline around it).

    ``lowercase=None`` uses what the directory records (or, for a bare vocab or model file, infers
    it: a vocabulary with uppercase tokens is cased). An explicit ``lowercase`` that contradicts the
    recorded casing raises :class:`CasingMismatchError`.
    """
    from transformers import AutoTokenizer

    p = Path(path)
    if p.is_file() and p.name in _DIRECTORY_FILES:
        # QA: a RoBERTa folder's vocab.json was read as a bare vocab.txt (a traceback from the WordPiece
        # model much later), its tokenizer.json as a vocabulary with gaps in its ids
        raise ValueError(f"{p} is one file of a tokenizer directory, not a vocab.txt or a SentencePiece .model: "
                         f"pass the directory ({p.parent})")
    vocab_text = p / "vocab.txt" if p.is_dir() else p
    if vocab_text.is_file() and p.suffix != ".model":
        check_vocab_text(vocab_text)
        check_vocab_lines(vocab_text, p / "tokenizer.json" if p.is_dir() else None)
    if p.is_dir() and holds_only_a_vocab_file(p):
        tok, effective = _bare_vocab_folder_tokenizer(p, lowercase)
    elif p.is_dir():
        recorded = _refuse_another_casing(p, directory_casing(p), lowercase)
        tok = AutoTokenizer.from_pretrained(str(p))
        effective = align_wordpiece_casing(tok, p, recorded if recorded is not None else lowercase)
    elif p.is_file() and p.suffix == ".model":
        model = p.read_bytes()
        effective = infer_lowercase_from_sentencepiece(model) if lowercase is None else lowercase
        tok = albert_tokenizer(model, lowercase=effective)
    elif p.is_file():
        effective = infer_lowercase_from_vocab(p) if lowercase is None else lowercase
        tok = _vocab_file_tokenizer(p, effective)
    else:
        raise FileNotFoundError(f"tokenizer not found: {p} (expected a directory, a vocab.txt file or a "
                                "SentencePiece .model file)")
    tok.init_kwargs["do_lower_case"] = effective
    return tok


#: The files ``AutoTokenizer`` learns a folder's tokenizer class from; a folder with a vocab.txt and none of
#: them is a bare WordPiece vocabulary (transformers would ask for sentencepiece or tiktoken instead).
_TOKENIZER_CLASS_FILES = ("tokenizer.json", "tokenizer_config.json", "config.json")


def holds_only_a_vocab_file(directory: str | os.PathLike) -> bool:
    """Whether a folder's tokenizer is its ``vocab.txt`` alone (no file says which tokenizer to build)."""
    folder = Path(directory)
    return (folder / "vocab.txt").is_file() and not any((folder / name).is_file() for name in _TOKENIZER_CLASS_FILES)


def _bare_vocab_folder_tokenizer(folder: Path, lowercase: bool | None):
    """A folder holding only a vocab.txt, loaded as that file is: cased or not as the folder records it (a
    vocab card), else as its tokens show, unless ``lowercase`` says (refused where it contradicts a record)."""
    recorded = _refuse_another_casing(folder, recorded_lowercase(folder), lowercase)
    effective = lowercase if lowercase is not None else recorded
    if effective is None:
        effective = infer_lowercase_from_vocab(folder / "vocab.txt")
    return _vocab_file_tokenizer(folder / "vocab.txt", effective), effective


def _refuse_another_casing(folder: Path, recorded: bool | None, lowercase: bool | None) -> bool | None:
    """``recorded`` (the folder's casing), after refusing an explicit ``lowercase`` that contradicts it."""
    if lowercase is not None and recorded is not None and lowercase != recorded:
        raise CasingMismatchError(f"{folder} was built {'uncased' if recorded else 'cased'}; refusing to use it "
                                  f"{'lowercased' if lowercase else 'cased'}")
    return recorded


def _vocab_file_tokenizer(vocab_file: Path, lowercase: bool):
    """BERT's WordPiece tokenizer over a vocab.txt."""
    from transformers import BertTokenizer

    # BertTokenizer(path) — the positional form; BertTokenizer(vocab_file=...) silently builds
    # a 5-token vocabulary in transformers 5.
    return BertTokenizer(str(vocab_file), do_lower_case=lowercase)
