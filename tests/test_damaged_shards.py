"""A damaged ``.arrow`` shard of a prepared corpus or of pretraining instances is named, in the same words by
every stage (QA, 2026-11-28: create_pretraining_data called a corpus with one truncated shard "not a prepared
corpus", and pretrain named only the folder, with pyarrow's "Expected to be able to read N bytes for message
body")."""

from __future__ import annotations

import json

from pathlib import Path

import pytest

from biomed_lm.errors import InputError
from biomed_lm.pretrain.data import load_pretraining_data
from biomed_lm.pretrain.instance_builder import PretrainingDataConfig, create_pretraining_data
from biomed_lm.pretrain.prepared_corpus import PretrainingDataError
from biomed_lm.tokenization.sources import damaged_arrow_file, iter_texts
from tests.test_pretraining_data import save_corpus, save_tokenizer, synthetic_documents, vocabulary_words


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("damaged_shards")


@pytest.fixture(scope="module")
def sources(work) -> tuple[Path, Path]:
    """A prepared corpus of two shards and a tokenizer for it."""
    import datasets

    documents = synthetic_documents(40, seed=1)
    single = save_corpus(documents, work / "corpus_one_shard")
    datasets.load_from_disk(str(single)).save_to_disk(str(work / "corpus"), num_shards=2)
    return work / "corpus", save_tokenizer(vocabulary_words(documents), work / "vocab")


def truncated_copy(folder: Path, to: Path, shard_index: int) -> Path:
    """A copy of the dataset ``folder`` whose ``shard_index``-th ``.arrow`` file is cut in half."""
    import shutil

    shutil.copytree(folder, to)
    shard = sorted(to.glob("*.arrow"))[shard_index]
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    return shard


def test_create_pretraining_data_names_the_damaged_corpus_shard(sources, work, capsys):
    from biomed_lm.launch.create_pretraining_data import main

    corpus, tokenizer = sources
    shard = truncated_copy(corpus, work / "damaged_corpus", shard_index=1)
    assert damaged_arrow_file(corpus) is None
    assert main(["--corpus", str(shard.parent), "--tokenizer", str(tokenizer), "--output-dir", str(work / "out"),
                 "--num-proc", "1"]) == 2
    err = capsys.readouterr().err
    assert f"{shard.parent}: prepared corpus cannot be read: its shard {shard.name} is damaged or truncated; " \
           "rebuild it with launch/prepare_corpus.py --overwrite (" in err
    assert "not a prepared corpus" not in err


def test_pretrain_names_the_damaged_instance_shard(sources, work):
    corpus, tokenizer = sources
    instances = work / "instances"
    create_pretraining_data(PretrainingDataConfig(corpus=str(corpus), tokenizer=str(tokenizer),
                                                  output_dir=str(instances), num_proc=1), progress=False)
    shard = truncated_copy(instances, work / "damaged_instances", shard_index=0)
    with pytest.raises(PretrainingDataError, match=rf"{shard.parent}: instance dataset cannot be read: {shard.name} "
                                                   r"is [\d,]+ bytes, [\d,]+ when it was written; rebuild it with "
                                                   r"launch/create_pretraining_data.py --overwrite$"):
        load_pretraining_data(shard.parent)  # the sizes its metadata records
    metadata_file = shard.parent / "pretraining_data.json"
    metadata = json.loads(metadata_file.read_text())
    del metadata["output_files"]  # as data built before sizes were recorded: pyarrow's error, the shard found
    metadata_file.write_text(json.dumps(metadata))
    with pytest.raises(PretrainingDataError, match=rf"{shard.parent}: instance dataset cannot be read: its shard "
                                                   rf"{shard.name} is damaged or truncated; rebuild it with "
                                                   r"launch/create_pretraining_data.py --overwrite \("):
        load_pretraining_data(shard.parent)


def test_build_vocab_names_the_damaged_corpus_shard(sources, work):
    shard = truncated_copy(sources[0], work / "damaged_for_vocab", shard_index=1)
    with pytest.raises(InputError, match=rf"{shard.parent}: prepared corpus cannot be read: its shard "
                                         rf"{shard.name} is damaged or truncated; rebuild it with "
                                         r"launch/prepare_corpus.py --overwrite \("):
        list(iter_texts([str(shard.parent)]))
