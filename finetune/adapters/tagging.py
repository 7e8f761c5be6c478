"""Adapters for token tagging: NER (one tag per word, BIO/IO/BIOUL, linear/BiLSTM/CRF head) and
EBM PICO (a set of PIO elements per word, one sigmoid per element).

Words are split into sub-words, each word on its own (byte-level BPE tokenizers are loaded with a
prefix space, so a word is split as it is inside running text); the word's label sits on its first
sub-word and every other position is ``-100``. Each window is framed by the special tokens the
tokenizer frames a text with (:func:`special_frame`: [CLS] ... [SEP], <s> ... </s>, GPT-2's
... EOS). A sentence longer than ``max_length`` is cut into consecutive windows of whole words
(:func:`word_windows`), so no word is dropped and every word gets a prediction; predictions are put
back together per sentence.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, Callable, Sequence

import torch
from torch import nn

from biomed_lm.errors import InputError
from biomed_lm.finetune.adapters.base import TaskAdapter, label_list
from biomed_lm.finetune.blurb import NER, PICO
from biomed_lm.finetune.modeling import IGNORE_INDEX, MultiTokenTaggingModel, TokenTaggingModel
from biomed_lm.finetune.tagging import convert_tags, split_tag, tag_labels

__all__ = ["TokenTaggingAdapter", "PicoAdapter", "word_windows", "special_frame", "tagging_features", "pad_tagging"]


def word_windows(subword_counts: Sequence[int], budget: int) -> list[tuple[int, int]]:
    """Split a sentence into consecutive ``[start, end)`` word ranges of at most ``budget`` sub-words.

    Windows never overlap and together hold every word, so each word is predicted exactly once. A
    single word longer than ``budget`` gets a window of its own (its sub-words are cut later, but
    its first sub-word, which carries the label, is kept).
    """
    if budget < 1:
        raise InputError(f"budget must be positive, got {budget}")
    windows, start, used = [], 0, 0
    for index, count in enumerate(subword_counts):
        count = max(1, count)
        if index > start and used + count > budget:
            windows.append((start, index))
            start, used = index, 0
        used += count
    if start < len(subword_counts) or not windows:
        windows.append((start, len(subword_counts)))
    return windows


def _word_pieces(tokenizer, sentences: Sequence[Sequence[str]]) -> list[list[list[int]]]:
    """Per sentence, the sub-word ids of each word on its own (a word the tokenizer drops, e.g. a
    control character, becomes [UNK] so that it still has a position to carry its label). One
    tokenizer call for all the words: the fast tokenizer batches them in Rust."""
    words = [word for sentence in sentences for word in sentence]
    pieces = tokenizer(words, add_special_tokens=False)["input_ids"] if words else []
    pieces = [ids if ids else [tokenizer.unk_token_id] for ids in pieces]
    out, start = [], 0
    for sentence in sentences:
        out.append(pieces[start:start + len(sentence)])
        start += len(sentence)
    return out


def special_frame(tokenizer) -> tuple[list[int], list[int]]:
    """The special token ids the tokenizer puts before and after a single text: ``([CLS], [SEP])``
    for BERT, ``(<s>, </s>)`` for RoBERTa, ``([], [EOS])`` for GPT-2 as :mod:`finetune.model_check`
    prepares it. Read from the tokenizer's own template (the special-tokens mask of a one-word
    text), so a window of words is framed exactly as the tokenizer frames running text."""
    encoding = tokenizer("a", return_special_tokens_mask=True)
    ids, special = list(encoding["input_ids"]), encoding["special_tokens_mask"]
    content = [index for index, flag in enumerate(special) if not flag]
    if not content:
        raise InputError(f"{type(tokenizer).__name__} gives no content token for the text 'a'")
    return ids[:content[0]], ids[content[-1] + 1:]


def tagging_features(examples: Sequence, tokenizer, max_length: int, encode_labels: Callable) -> list[dict]:
    """Windowed NER/PICO features; each remembers its example and first word for mapping back."""
    prefix, suffix = special_frame(tokenizer)
    budget = max_length - len(prefix) - len(suffix)
    if budget < 1:
        raise InputError(f"max_length {max_length} leaves no room next to {len(prefix) + len(suffix)} special tokens")
    features = []
    all_pieces = _word_pieces(tokenizer, [example.tokens for example in examples])
    for example_index, (example, pieces) in enumerate(zip(examples, all_pieces)):
        labels = encode_labels(example)
        for start, end in word_windows([len(p) for p in pieces], budget):
            ids, label_row, word_mask = list(prefix), [None] * len(prefix), [False] * len(prefix)
            for word in range(start, end):
                word_ids = pieces[word][:max(1, budget - (len(ids) - len(prefix)))]
                ids.extend(word_ids)
                label_row.extend([labels[word]] + [None] * (len(word_ids) - 1))
                word_mask.extend([True] + [False] * (len(word_ids) - 1))
            ids.extend(suffix)
            label_row.extend([None] * len(suffix))
            word_mask.extend([False] * len(suffix))
            features.append({"input_ids": ids, "labels": label_row, "word_mask": word_mask,
                             "example": example_index, "first_word": start, "num_words": end - start})
    return features


def pad_tagging(features: Sequence[dict], pad_id: int, num_elements: int | None) -> dict[str, torch.Tensor]:
    """A padded batch of tagging features; labels are ``-100`` (a vector of them for PICO) off words."""
    length = max(len(f["input_ids"]) for f in features)
    ignore = IGNORE_INDEX if num_elements is None else [IGNORE_INDEX] * num_elements
    batch = {
        "input_ids": torch.tensor([f["input_ids"] + [pad_id] * (length - len(f["input_ids"])) for f in features]),
        "attention_mask": torch.tensor([[1] * len(f["input_ids"]) + [0] * (length - len(f["input_ids"]))
                                        for f in features]),
        "word_mask": torch.tensor([f["word_mask"] + [False] * (length - len(f["word_mask"])) for f in features]),
        "labels": torch.tensor([[ignore if x is None else x for x in f["labels"]]
                                + [ignore] * (length - len(f["labels"])) for f in features]),
    }
    batch["token_type_ids"] = torch.zeros_like(batch["input_ids"])
    return batch


class _WordTaggingAdapter(TaskAdapter):
    """What NER and PICO share: windowed word features, decoding on first sub-words, and windows put
    back together into one prediction per word of each sentence."""

    num_elements: int | None = None  # PICO: labels per word (a multi-hot vector); NER: one label id

    @abstractmethod
    def encode_labels(self, example) -> list:
        """A word's training label (an id, or a multi-hot vector for PICO), per word of ``example``."""

    @abstractmethod
    def word_prediction(self, word) -> Any:
        """A word's decoded output as the metric takes it."""

    def degenerate(self, gold: Sequence, predicted: Sequence) -> list[str]:
        """No word tagged where the gold tags some (QA: every short NER run of a collapsed model predicted O
        throughout and scored 0.00 without a word); outside is "O" for NER, the empty set for PICO."""
        def tagged(word) -> bool:
            return bool(word) and word != "O"
        gold_words = sum(tagged(word) for example in gold for word in example)
        if gold_words and not any(tagged(word) for example in predicted for word in example):
            return [f"no test word is tagged (the gold tags {gold_words} words): the model predicts outside "
                    "everywhere, and the score of 0 reflects that"]
        return []

    def featurize(self, examples: Sequence) -> list[dict]:
        return tagging_features(examples, self.tokenizer, self.max_length, self.encode_labels)

    def collate(self, features: Sequence[dict]) -> dict[str, torch.Tensor]:
        return pad_tagging(features, self.pad_id, self.num_elements)

    def predict_batch(self, model: nn.Module, batch: dict[str, torch.Tensor], device: torch.device) -> list:
        logits = model(**self.inputs(batch, device, train=False)).logits
        return model.decode_logits(logits, batch["word_mask"].to(device))

    def predictions(self, examples: Sequence, features: Sequence[dict], outputs: Sequence) -> list:
        per_example: list[list] = [[] for _ in examples]
        for feature, words in zip(features, outputs):
            if len(words) != feature["num_words"]:
                raise RuntimeError(f"window of example {feature['example']} predicted {len(words)} words, "
                                   f"expected {feature['num_words']}")
            per_example[feature["example"]].extend(words)
        return [[self.word_prediction(word) for word in words] for words in per_example]


def _file_scheme(labels: Sequence[str]) -> str:
    """The scheme a dataset's tags are written in: BIO, or BIOUL when any tag is U-/L- (or the
    BIOES spelling S-/E-, read as U-/L-)."""
    prefixes = {tag.partition("-")[0] for tag in labels if tag != "O"}
    return "bioul" if prefixes & {"U", "L", "S", "E"} else "bio"


def _bioes_as_bioul(tags: Sequence[str]) -> list[str]:
    return [("U" + t[1:]) if t.startswith("S-") else ("L" + t[1:]) if t.startswith("E-") else t for t in tags]


class TokenTaggingAdapter(_WordTaggingAdapter):
    """NER: the dataset's tags converted to ``args.tagging_scheme``; scored by entity F1 in that
    scheme (``args.ner_f1_mode``). The head reads ``word_mask`` in training (the CRF's positions)."""

    family = NER
    options = ("tagging_scheme", "tagging_layer")
    train_keys = ("labels", "word_mask")

    def __init__(self, args, dataset, tokenizer) -> None:
        super().__init__(args, dataset, tokenizer)
        self.source_scheme = _file_scheme(dataset.labels)
        types = list(dict.fromkeys(split_tag(t)[1] for t in _bioes_as_bioul(dataset.labels) if t != "O"))
        self.labels = tuple(tag_labels(types, args.tagging_scheme))
        self.index = {tag: i for i, tag in enumerate(self.labels)}
        # IO cannot write two touching entities of one type: an IO run is scored against the file's
        # own entities, in BIO (metrics.entity_f1's gold_scheme)
        self.gold_scheme = "bio" if args.tagging_scheme == "io" else args.tagging_scheme

    def to_model_tags(self, tags: Sequence[str], scheme: str | None = None) -> list[str]:
        """A dataset's tag sequence in the model's scheme (or in ``scheme``)."""
        return convert_tags(_bioes_as_bioul(tags), self.source_scheme, scheme or self.args.tagging_scheme)

    def encode_labels(self, example) -> list:
        return [self.index[t] for t in self.to_model_tags(example.tags)]

    def word_prediction(self, word) -> Any:
        return self.labels[word]

    def build_head(self, encoder: nn.Module) -> nn.Module:
        return TokenTaggingModel(encoder, len(self.labels), self.args.tagging_layer, self.args.dropout)

    def gold(self, examples: Sequence) -> list:
        return [self.to_model_tags(e.tags, self.gold_scheme) for e in examples]

    def metric_kwargs(self) -> dict[str, Any]:
        kwargs = {"scheme": self.args.tagging_scheme, "mode": self.args.ner_f1_mode}
        return kwargs if self.gold_scheme == self.args.tagging_scheme else {**kwargs, "gold_scheme": self.gold_scheme}

    def prediction_row(self, index: int, example, gold: Any, predicted: Any) -> dict[str, Any]:
        # tags as the metric scores them: predicted in the run's tagging scheme, gold in metric_kwargs'
        # gold_scheme (the run's, or BIO in an IO run; a BIO file's own tags in a BIO run)
        return {"index": index, "id": example.id, "words": list(example.tokens), "gold": gold, "predicted": predicted}


class PicoAdapter(_WordTaggingAdapter):
    """EBM PICO: per word the set of its PIO elements, one sigmoid per element (multi-label, so the
    CRF, a single-label sequence model, does not apply)."""

    family = PICO
    options = ("tagging_layer",)

    def __init__(self, args, dataset, tokenizer) -> None:
        super().__init__(args, dataset, tokenizer)
        self.num_elements = len(self.labels)

    def encode_labels(self, example) -> list:
        return [[int(e in word) for e in self.labels] for word in example.elements]

    def word_prediction(self, word) -> Any:
        return {e for e, on in zip(self.labels, word) if on}

    def build_head(self, encoder: nn.Module) -> nn.Module:
        if self.args.tagging_layer == "crf":
            raise InputError("tagging_layer 'crf' does not apply to PICO's multi-label tagging; use linear or bilstm")
        return MultiTokenTaggingModel(encoder, len(self.labels), self.args.tagging_layer, self.args.dropout)

    def gold(self, examples: Sequence) -> list:
        return [[set(word) for word in e.elements] for e in examples]

    def metric_kwargs(self) -> dict[str, Any]:
        return {"elements": self.labels}

    def prediction_row(self, index: int, example, gold: Any, predicted: Any) -> dict[str, Any]:
        return {"index": index, "id": example.id, "words": list(example.tokens),
                "gold": [label_list(word) for word in gold], "predicted": [label_list(word) for word in predicted]}
