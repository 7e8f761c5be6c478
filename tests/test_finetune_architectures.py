"""Fine-tuning any encoder: six architectures through every BLURB task family (issue 15, item 6).

BERT (WordPiece), RoBERTa (byte-level BPE, one token type), ALBERT (SentencePiece), ELECTRA
(WordPiece, the discriminator), DeBERTa-v2 (SentencePiece, no token types) and GPT-2 (a byte-level
BPE decoder with no pad, [CLS] or [SEP]) are each built here, offline, as a tiny random model (2
layers, hidden 32, 2 heads, intermediate 37) saved with ``save_pretrained`` from its pretraining
class (the way a user's checkpoint comes), next to a tiny tokenizer of its own kind trained on the
committed PubMed sample and the task texts: the toolkit's own WordPiece builder
(``tokenization/vocab.py``) for BERT and ELECTRA, a ``tokenizers`` byte-level BPE for RoBERTa and
GPT-2, a ``sentencepiece`` unigram model for ALBERT and DeBERTa-v2. The toolkit then loads each
directory exactly as a user's checkpoint (``finetune/model_check.py``, ``AutoModel``).

Each architecture is fine-tuned for one epoch on a tiny slice of each task family — NER on the
committed NCBI-disease files (windowed, CRF decoding), PICO, relation extraction with entity markers
and with placeholders, sentence similarity, multi-label document classification and QA on the
generic fixtures of ``test_finetune_tasks.py`` — through featurization, the forward pass, the loss,
decoding and the metric. What each family needs (``finetune/model_families.py``) is checked on the
run: token types reach the encoder only where it has segment embeddings, pre-split words are
tokenized as inside running text (prefix space), windows are framed as the tokenizer frames text,
markers are single tokens and the embeddings grew for them, GPT-2 pads with EOS and reads the
sequence at its last real token. Scores are random-model scores and are checked for range only.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import warnings
from pathlib import Path
from typing import Callable

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import biomed_lm.finetune.trainer as trainer  # noqa: E402
from biomed_lm.errors import InputError  # noqa: E402
from biomed_lm.finetune.adapters.tagging import special_frame  # noqa: E402
from biomed_lm.finetune.model_check import check_model  # noqa: E402
from biomed_lm.finetune.relation_inputs import ENTITY_MARKERS  # noqa: E402
from biomed_lm.finetune.trainer import run_finetune  # noqa: E402
from tests.conftest import REPO, ncbi_slice  # noqa: E402
from tests.test_finetune_tasks import (DOCS, NER_SENTENCES, PICO_DOCS, QA_ROWS, RELATION_ROWS,  # noqa: E402,F401
                                       _args, _check_record, _jsonl, _relation_rows, _write, predictions, quiet)

ARCHITECTURES = ("bert", "roberta", "albert", "electra", "deberta-v2", "gpt2")
#: the encoder gets token_type_ids: BERT, ALBERT and ELECTRA have two segment embeddings; RoBERTa has
#: one, the DeBERTa-v2 built here (as DeBERTa-v3) none, and GPT-2 would embed them as words
TOKEN_TYPES = {"bert": True, "roberta": False, "albert": True, "electra": True, "deberta-v2": False, "gpt2": False}
#: special tokens before and after a text: [CLS] ... [SEP], <s> ... </s>, GPT-2's ... EOS
FRAME = {"bert": (1, 1), "roberta": (1, 1), "albert": (1, 1), "electra": (1, 1), "deberta-v2": (1, 1), "gpt2": (0, 1)}
BYTE_LEVEL = ("roberta", "gpt2")
SIZES = dict(num_hidden_layers=2, num_attention_heads=2, intermediate_size=37)
HIDDEN = 32
POSITIONS = 128

SIMILARITY_PAIRS = [("The gene is expressed in liver .", "Liver cells express the gene .", 3.5),
                    ("Mice were treated with the drug .", "The weather was cold .", 0.0),
                    ("Tumours grew quickly .", "Tumour growth was fast .", 4.0),
                    ("The protein binds DNA .", "Patients were enrolled .", 0.5)]


# ----------------------------------------------------------------------- tiny checkpoints

def _ncbi_sentences(limit: int = 40) -> list[str]:
    text = (REPO / "data" / "blurb" / "NCBI-disease" / "train.tsv").read_text(encoding="utf-8")
    return [" ".join(line.split("\t")[0] for line in block.splitlines() if line.strip())
            for block in text.strip().split("\n\n")[:limit]]


def _corpus() -> list[str]:
    """A few hundred sentences: the committed PubMed sample, then every text the tasks below use."""
    lines = (REPO / "data" / "sample" / "sywada_PubMedAbstract_1MB.txt").read_text(encoding="utf-8").splitlines()
    sample = [s.strip() + "." for line in lines[:40] for s in line.split(". ") if s.strip()][:300]
    tasks = [" ".join(w for w, _ in s) for s in NER_SENTENCES]
    tasks += [" ".join(w for w, _ in seg) for segs in PICO_DOCS.values() for seg in segs]
    tasks += [text for text, _ in DOCS] + [f"{q} {c}" for q, c, _ in QA_ROWS] + [r[0] for r in RELATION_ROWS]
    tasks += [f"{a} {b}" for a, b, _ in SIMILARITY_PAIRS] + ["@AGENT$ @DISEASE$ @GENE$"]
    return sample + _ncbi_sentences() + tasks


def _wordpiece(corpus: list[str], out: Path) -> int:
    """The toolkit's own WordPiece vocabulary (as pretraining writes it), saved into ``out``."""
    from biomed_lm.tokenization.tokenizer_io import save_tokenizer_dir
    from biomed_lm.tokenization.vocab import VocabConfig, train_vocab

    trained = train_vocab(corpus, VocabConfig(vocab_size=700, special_token_layout="compact", min_frequency=1))
    save_tokenizer_dir(trained.tokenizer, out, lowercase=True)
    return trained.tokenizer.get_vocab_size()


def _byte_level_bpe(corpus: list[str], specials: list[str]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """A byte-level BPE vocabulary (``specials`` first) and its merges, as RoBERTa and GPT-2 use."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=600, special_tokens=specials, show_progress=False,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    model = json.loads(bpe.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    return model["vocab"], merges


def _unigram(corpus: list[str], pad: str, unk: str) -> list[tuple[str, float]]:
    """A SentencePiece unigram model's pieces and scores (pad 0, unk 1, then [CLS] [SEP] [MASK])."""
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus), model_writer=model, vocab_size=400,
                                   model_type="unigram", pad_id=0, pad_piece=pad, unk_id=1, unk_piece=unk, bos_id=-1,
                                   eos_id=-1, user_defined_symbols=["[CLS]", "[SEP]", "[MASK]"],
                                   character_coverage=1.0, hard_vocab_limit=False, num_threads=1, minloglevel=2)
    processor = spm.SentencePieceProcessor(model_proto=model.getvalue())
    return [(processor.id_to_piece(i), processor.get_score(i)) for i in range(processor.get_piece_size())]


def _tokenizer_and_model(arch: str, out: Path):
    """The tokenizer (saved into ``out`` for the WordPiece families) and the model of ``arch``."""
    import transformers as hf

    corpus = _corpus()
    if arch in ("bert", "electra"):
        size = _wordpiece(corpus, out)
        if arch == "bert":
            return None, hf.BertForPreTraining(hf.BertConfig(vocab_size=size, hidden_size=HIDDEN,
                                                             max_position_embeddings=POSITIONS, **SIZES))
        return None, hf.ElectraForPreTraining(hf.ElectraConfig(vocab_size=size, embedding_size=16, hidden_size=HIDDEN,
                                                               max_position_embeddings=POSITIONS, **SIZES))
    if arch == "roberta":
        vocab, merges = _byte_level_bpe(corpus, ["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
        tokenizer = hf.RobertaTokenizer(vocab=vocab, merges=merges)
        config = hf.RobertaConfig(vocab_size=len(tokenizer), hidden_size=HIDDEN, type_vocab_size=1, pad_token_id=1,
                                  max_position_embeddings=POSITIONS + 2, **SIZES)
        return tokenizer, hf.RobertaForMaskedLM(config)
    if arch == "gpt2":
        vocab, merges = _byte_level_bpe(corpus, ["<|endoftext|>"])
        tokenizer = hf.GPT2Tokenizer(vocab=vocab, merges=merges)
        eos = tokenizer.eos_token_id
        config = hf.GPT2Config(vocab_size=len(tokenizer), n_embd=HIDDEN, n_layer=2, n_head=2, n_inner=37,
                               n_positions=POSITIONS, bos_token_id=eos, eos_token_id=eos)
        return tokenizer, hf.GPT2LMHeadModel(config)
    if arch == "albert":
        tokenizer = hf.AlbertTokenizer(vocab=_unigram(corpus, "<pad>", "<unk>"))
        config = hf.AlbertConfig(vocab_size=len(tokenizer), embedding_size=16, hidden_size=HIDDEN, pad_token_id=0,
                                 max_position_embeddings=POSITIONS, **SIZES)
        return tokenizer, hf.AlbertForPreTraining(config)
    tokenizer = hf.DebertaV2Tokenizer(vocab=_unigram(corpus, "[PAD]", "[UNK]"), unk_id=1)
    config = hf.DebertaV2Config(vocab_size=len(tokenizer), hidden_size=HIDDEN, type_vocab_size=0, pad_token_id=0,
                                max_position_embeddings=POSITIONS, relative_attention=True, position_buckets=32,
                                pos_att_type=["p2c", "c2p"], **SIZES)
    return tokenizer, hf.DebertaV2ForMaskedLM(config)


def build_checkpoint(arch: str, out: Path) -> Path:
    """A tiny random ``arch`` checkpoint with its tiny tokenizer, saved as a user's would be."""
    import torch

    torch.manual_seed(0)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer, model = _tokenizer_and_model(arch, out)
    model.save_pretrained(out)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory) -> Callable[[str], Path]:
    """``checkpoints(arch)``: the architecture's tiny checkpoint directory, built once per session."""
    built: dict[str, Path] = {}

    def get(arch: str) -> Path:
        if arch not in built:
            built[arch] = build_checkpoint(arch, tmp_path_factory.mktemp(f"tiny_{arch}"))
        return built[arch]

    return get


@pytest.fixture
def encoder_calls(monkeypatch) -> dict[str, list]:
    """The models ``run_finetune`` builds and the keyword arguments of every call of their encoder."""
    seen: dict[str, list] = {"models": [], "calls": []}
    original = trainer._build_model

    def recording(args, task, checked):
        model = original(args, task, checked)
        model.encoder.register_forward_pre_hook(lambda module, a, kwargs: seen["calls"].append(set(kwargs)),
                                                with_kwargs=True)
        seen["models"].append((model, checked.tokenizer))
        return model

    monkeypatch.setattr(trainer, "_build_model", recording)
    return seen


# ------------------------------------------------------------------------------- the tasks

def _ner(root: Path) -> tuple[Path, dict]:
    return ncbi_slice(root, train=8, eval_=4), dict(dataset="ncbi-disease", max_length=16, tagging_layer="crf")


def _pico(root: Path) -> tuple[Path, dict]:
    body = "\n".join(f"-DOCSTART- ({pmid})\n\n" + "\n\n".join("\n".join(f"{w}\t{t}" for w, t in seg) for seg in segs)
                     + "\n" for pmid, segs in PICO_DOCS.items())
    for split in ("train", "dev", "test"):
        _write(root / f"{split}.tsv", body)
    return root, dict(dataset="pico-mini", task_type="pico", max_length=16)


def _relation(transformation: str, representation: str) -> Callable[[Path], tuple[Path, dict]]:
    def write(root: Path) -> tuple[Path, dict]:
        for split in ("train", "dev", "test"):
            _jsonl(root / f"{split}.jsonl", _relation_rows())
        return root, dict(dataset="relmini", task_type="relation", negative_label="none", max_length=48,
                          relation_transformation=transformation, relation_representation=representation)
    return write


def _similarity(root: Path) -> tuple[Path, dict]:
    body = "text_a\ttext_b\tscore\n" + "".join(f"{a}\t{b}\t{s}\n" for a, b, s in SIMILARITY_PAIRS)
    for split in ("train", "dev", "test"):
        _write(root / f"{split}.tsv", body)
    return root, dict(dataset="simmini", task_type="similarity", max_length=48)


def _classification(root: Path) -> tuple[Path, dict]:
    for split in ("train", "dev", "test"):
        _jsonl(root / f"{split}.jsonl", [{"id": f"d{i}", "text": t, "labels": ls} for i, (t, ls) in enumerate(DOCS)])
    return root, dict(dataset="hocmini", task_type="classification", max_length=48)


def _qa(root: Path) -> tuple[Path, dict]:
    rows = [{"id": f"q{i}", "question": q, "context": c, "label": label} for i, (q, c, label) in enumerate(QA_ROWS)]
    for split in ("train", "dev", "test"):
        _jsonl(root / f"{split}.jsonl", rows)
    return root, dict(dataset="qamini", task_type="qa", max_length=48)


#: task -> (writer of its data, task family, metric, examples per split)
TASKS = {
    "ner": (_ner, "ner", "entity_f1", {"train": 8, "dev": 4, "test": 4}),
    "pico": (_pico, "pico", "pico_token_macro_f1", {s: 5 for s in ("train", "dev", "test")}),
    "relation-markers": (_relation("markers", "entity_start"), "relation", "micro_f1_positive",
                         {s: len(RELATION_ROWS) for s in ("train", "dev", "test")}),
    "relation-placeholders": (_relation("dummify", "cls"), "relation", "micro_f1_positive",
                              {s: len(RELATION_ROWS) for s in ("train", "dev", "test")}),
    "similarity": (_similarity, "similarity", "pearson", {s: len(SIMILARITY_PAIRS) for s in ("train", "dev", "test")}),
    "classification": (_classification, "classification", "micro_f1_multilabel",
                       {s: len(DOCS) for s in ("train", "dev", "test")}),
    "qa": (_qa, "qa", "accuracy", {s: len(QA_ROWS) for s in ("train", "dev", "test")}),
}


# --------------------------------------------------------------------- per-task checks

def _check_framing(arch: str, tokenizer, features: list[dict]) -> None:
    """Every input starts and ends with the special tokens the tokenizer frames a text with."""
    prefix, suffix = special_frame(tokenizer)
    assert (len(prefix), len(suffix)) == FRAME[arch]
    for feature in features:
        ids = feature["input_ids"]
        assert ids[:len(prefix)] == prefix and ids[len(ids) - len(suffix):] == suffix


def _check_markers(arch: str, tokenizer, model, features: list[dict]) -> None:
    """Each marker is one added token, once per input; the entity starts are [E1] and [E2]; the
    embeddings grew to the tokenizer; byte-level BPE leaves no lone space token before a marker."""
    marker_ids = tokenizer.convert_tokens_to_ids(list(ENTITY_MARKERS))
    assert model.encoder.get_input_embeddings().num_embeddings == len(tokenizer) > max(marker_ids)
    for feature in features:
        ids = feature["input_ids"]
        assert [ids.count(m) for m in marker_ids] == [1, 1, 1, 1]
        assert [ids[p] for p in feature["entity_starts"]] == [marker_ids[0], marker_ids[2]]
        if arch in BYTE_LEVEL:
            tokens = tokenizer.convert_ids_to_tokens(ids)
            assert not any(tokens[ids.index(m) - 1] == "Ġ" for m in marker_ids), tokens


def _check_placeholders(tokenizer, features: list[dict]) -> None:
    """The entity spans cover the placeholders that replaced the mentions."""
    for feature in features:
        for (start, end), placeholder in zip(feature["entity_spans"], ("@agent$", "@disease$")):
            text = tokenizer.decode(feature["input_ids"][start:end]).replace(" ", "").lower()
            assert placeholder in text, (text, placeholder)


def _check_task(task: str, arch: str, call: dict, seen: dict) -> None:
    model, tokenizer = seen["models"][0]
    features, predicted, examples = call["features"], call["predictions"], call["examples"]
    assert len(predicted) == len(examples)
    _check_framing(arch, tokenizer, features)
    if task in ("ner", "pico"):
        assert [len(p) for p in predicted] == [len(e.tokens) for e in examples]  # every word, across windows
        assert sum(sum(f["word_mask"]) for f in features) == sum(len(e.tokens) for e in examples)
    elif task == "relation-markers":
        _check_markers(arch, tokenizer, model, features)
    elif task == "relation-placeholders":
        _check_placeholders(tokenizer, features)
    elif task == "similarity":
        assert all(isinstance(p, float) for p in predicted)
    elif task == "classification":
        assert all(isinstance(p, set) for p in predicted)
    elif task == "qa" and arch == "gpt2":  # question EOS context EOS: the pair has a separator
        assert all(f["input_ids"].count(tokenizer.eos_token_id) == 2 for f in features)


@pytest.mark.parametrize("task", list(TASKS))
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_every_architecture_fine_tunes_on_every_task_family(checkpoints, tmp_path, predictions, encoder_calls,
                                                            arch, task):
    write, family, metric, sizes = TASKS[task]
    data, settings = write(tmp_path / "data")
    out = tmp_path / "run"
    result = run_finetune(_args(checkpoints(arch), data, out, batch_size=4, learning_rate=1e-3, **settings), log=quiet)
    record = _check_record(result, out, family, metric, sizes)
    assert record["model_check"]["model_family"] == arch
    score = record["test"]["score"]
    assert (-1.0 <= score <= 1.0) if metric == "pearson" else (0.0 <= score <= 1.0)
    assert 0 < record["train_time_s"] <= record["wall_time_s"]
    assert record["memory"]["peak_rss_bytes"] > 0 and record["memory"]["peak_rss_scope"] in ("run", "process")
    # the encoder got token types only where its family has segment embeddings, in every call
    assert encoder_calls["calls"] and {("token_type_ids" in kwargs) for kwargs in encoder_calls["calls"]} == \
        {TOKEN_TYPES[arch]}
    _check_task(task, arch, predictions[-1], encoder_calls)


# ---------------------------------------------------------------- per-family preparation

@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_checkpoint_is_prepared_for_its_family(checkpoints, arch):
    """The tokenizer as model_check hands it out: a pad token, and each pre-split word tokenized as
    it is inside running text (byte-level BPE needs the prefix space for that)."""
    from biomed_lm.finetune.adapters.tagging import _word_pieces

    checked = check_model(checkpoints(arch))
    tokenizer = checked.tokenizer
    assert checked.family.name == arch and checked.record()["model_family"] == arch
    assert tokenizer.pad_token_id is not None
    sentence = "Aspirin reduces the risk of colorectal cancer"
    (pieces,) = _word_pieces(tokenizer, [sentence.split()])
    running = tokenizer(sentence, add_special_tokens=False)["input_ids"]
    assert [i for word in pieces for i in word] == running, tokenizer.convert_ids_to_tokens(running)
    if arch in BYTE_LEVEL:
        assert all(tokenizer.convert_ids_to_tokens(p)[0].startswith("Ġ") for p in pieces)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_the_encoder_gets_a_prepared_mask_where_its_family_takes_one(checkpoints, arch):
    """BERT, RoBERTa, ALBERT and ELECTRA get the additive 4D padding mask transformers would build (so it
    does not read the 2D mask back each forward), with the same states on the real tokens, fp32, as from
    the 2D mask; DeBERTa-v2 and GPT-2 keep the 2D mask."""
    import torch

    from biomed_lm.finetune.modeling import TokenTaggingModel, load_encoder

    model = TokenTaggingModel(load_encoder(checkpoints(arch)), num_labels=3).eval()
    assert model.prepared_mask == (arch in ("bert", "roberta", "albert", "electra"))
    pad = model.encoder.config.pad_token_id or 0
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(pad + 5, min(model.encoder.config.vocab_size, 200), (3, 12), generator=generator)
    attention_mask = (torch.arange(12)[None, :] < torch.tensor([12, 9, 4])[:, None]).long()
    input_ids = input_ids.masked_fill(attention_mask == 0, pad)
    token_type_ids = torch.zeros_like(input_ids)
    with torch.no_grad():
        prepared = model._encode(input_ids, attention_mask, token_type_ids)
        model.prepared_mask = False
        plain = model._encode(input_ids, attention_mask, token_type_ids)
    real = attention_mask.bool()
    assert torch.allclose(prepared[real], plain[real], atol=1e-5)


def test_gpt2_pads_with_eos_and_reads_the_sequence_at_its_last_real_token(checkpoints):
    import torch

    from biomed_lm.finetune.modeling import SequenceClassificationModel, load_encoder

    checked = check_model(checkpoints("gpt2"))
    tokenizer = checked.tokenizer
    assert tokenizer.pad_token == tokenizer.eos_token and any("EOS" in note for note in checked.notes)
    torch.manual_seed(0)
    model = SequenceClassificationModel(load_encoder(checked.directory), 3).eval()
    assert model.sequence_token == "last" and not model.token_types
    batch = tokenizer(["Aspirin reduces the risk of colorectal cancer .", "Cancer ."], ["yes", "no"], padding=True,
                      return_tensors="pt")
    mask = batch["attention_mask"]
    last = mask.sum(dim=1) - 1
    assert bool((mask[1] == 0).any())  # the short pair is padded
    assert batch["input_ids"][torch.arange(2), last].tolist() == [tokenizer.eos_token_id] * 2
    with torch.no_grad():
        hidden = model.encoder(input_ids=batch["input_ids"], attention_mask=mask).last_hidden_state
        torch.testing.assert_close(model.represent(hidden, attention_mask=mask), hidden[torch.arange(2), last])
        logits = model(batch["input_ids"], mask).logits
        alone = tokenizer(["Cancer ."], ["no"], return_tensors="pt")
        torch.testing.assert_close(logits[1], model(alone["input_ids"], alone["attention_mask"]).logits[0])
        # token types are not the encoder's business: ones change nothing
        ones = torch.ones_like(batch["input_ids"])
        torch.testing.assert_close(model(batch["input_ids"], mask, token_type_ids=ones).logits, logits)


def test_electra_discriminator_loads_whole_and_a_generator_is_refused(checkpoints, tmp_path):
    from biomed_lm.finetune.modeling import load_encoder

    directory = checkpoints("electra")
    assert json.loads((directory / "config.json").read_text())["architectures"] == ["ElectraForPreTraining"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every encoder weight comes from the discriminator checkpoint
        load_encoder(directory)
    generator = tmp_path / "generator"
    shutil.copytree(directory, generator)
    config = json.loads((generator / "config.json").read_text())
    (generator / "config.json").write_text(json.dumps({**config, "architectures": ["ElectraForMaskedLM"]}))
    with pytest.raises(InputError, match="ELECTRA generator"):
        check_model(generator)


# ------------------------------------------------------------------------- paper 001's sweep

def test_paper001_sweep_config_names_the_tested_architectures_and_records_time_and_memory(checkpoints, tmp_path):
    """The comparison grid's config, cut to one grid point on GPT-2: each run record carries its
    training time and its own peak memory, what paper 001 compares besides F1."""
    from biomed_lm.config import parse_config
    from biomed_lm.finetune.sweep import SweepArgs, collect_runs, run_sweep

    config = REPO / "configs" / "blurb" / "paper001_ner_sweep.yaml"
    comments = " ".join(line for line in config.read_text(encoding="utf-8").splitlines() if line.startswith("#"))
    assert "untested" not in comments
    for name in ("BERT", "RoBERTa", "ALBERT", "ELECTRA", "DeBERTa-v2", "GPT-2", "test_finetune_architectures"):
        assert name in comments, name
    ncbi_slice(tmp_path / "data", train=8, eval_=4)
    (args,) = parse_config([SweepArgs], ["--config", str(config), "--model", str(checkpoints("gpt2")),
                                         "--output_dir", str(tmp_path / "sweep"), "--data_root", str(tmp_path / "data"),
                                         "--learning_rates", "1e-3", "--batch_sizes", "8", "--epochs", "1",
                                         "--max_length", "32"])
    summary = run_sweep(args, log=quiet, progress=False)
    assert summary["datasets"]["ncbi-disease"]["runs"] == 1 and not summary["failed"]
    (record,) = collect_runs(tmp_path / "sweep")
    assert record["model_check"]["model_family"] == "gpt2"
    assert 0 < record["train_time_s"] <= record["wall_time_s"]
    assert record["memory"]["peak_rss_bytes"] > 0 and record["memory"]["peak_rss_scope"] == "run"


def test_inputs_longer_than_the_checkpoints_positions_are_refused_before_training(checkpoints, tmp_path):
    """QA: --max-length 514 on a RoBERTa export (514 positions, 512 usable after the padding id) ended in an index
    error inside transformers; the limit is now named, with how it was read."""
    from biomed_lm.finetune.model_check import check_input_length, check_model, usable_positions

    roberta = check_model(checkpoints("roberta"))
    limit, how = roberta.positions
    config = json.loads((roberta.directory / "config.json").read_text())
    assert limit == config["max_position_embeddings"] - config["pad_token_id"] - 1 and "RoBERTa's positions" in how
    check_input_length(limit, True, roberta)
    with pytest.raises(InputError, match=rf"--max-length {limit + 2} is longer than .* takes: {limit} tokens "
                                         rf"\(max_position_embeddings {limit + 2}, less the padding id 1 \+ 1"):
        check_input_length(limit + 2, True, roberta)
    with pytest.raises(InputError,
                       match=rf"this dataset's default max_length {limit + 1} .*--max-length {limit} or less"):
        check_input_length(limit + 1, False, roberta)
    bert = check_model(checkpoints("bert"))
    assert bert.positions[0] == json.loads((bert.directory / "config.json").read_text())["max_position_embeddings"]
    assert usable_positions({"max_position_embeddings": 512, "position_biased_input": False}, bert.family) is None
