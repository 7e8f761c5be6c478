"""A bad ``--max-shard-size`` is refused when the options are read, before any work (QA, 2026-11-29:
create_pretraining_data with ``abc`` ended in a ValueError traceback and with ``0MB`` in a ZeroDivisionError,
both only once every instance was built; prepare_corpus accepted ``0MB`` and divided by it after parsing)."""

from __future__ import annotations

from pathlib import Path

import pytest

from biomed_lm.errors import TokenizationError
from biomed_lm.finished_output import shard_size_problem
from biomed_lm.launch.create_pretraining_data import main as create_data_main
from biomed_lm.launch.prepare_corpus import main as prepare_main
from biomed_lm.pretrain.instance_builder import PretrainingDataConfig
from biomed_lm.pretrain.prepared_corpus import PretrainingDataError
from biomed_lm.tokenization.corpus import CorpusConfig

FORMS = ("give a whole number above 0 and a unit: KB, MB, GB, TB, PB (powers of 1000) or KiB, MiB, GiB, TiB, PiB, "
         "such as 500MB or 1GiB")


@pytest.mark.parametrize("size", ["500MB", "1GB", "512MiB", "10KB", "2TB"])
def test_sizes_save_to_disk_reads_are_accepted(size):
    assert shard_size_problem(size) is None
    assert CorpusConfig(max_shard_size=size).max_shard_size == size
    assert PretrainingDataConfig(max_shard_size=size).max_shard_size == size


@pytest.mark.parametrize(("size", "why"), [("abc", "is not a size"), ("1.5GB", "is not a size"),
                                           ("500", "is not a size"), ("", "is not a size"),
                                           ("0MB", "is 0 bytes"), ("-5MB", "is -5,000,000 bytes")])
def test_bad_sizes_are_refused_when_the_config_is_built(size, why):
    message = f"max_shard_size (--max-shard-size) {size!r} {why}: {FORMS}"
    assert shard_size_problem(size) == message
    with pytest.raises(TokenizationError) as corpus_error:
        CorpusConfig(inputs=["a.txt"], output_dir="out", max_shard_size=size)
    with pytest.raises(PretrainingDataError) as data_error:
        PretrainingDataConfig(max_shard_size=size)
    assert str(corpus_error.value) == str(data_error.value) == message


def test_validate_refuses_a_size_set_after_construction():
    config = PretrainingDataConfig(corpus="c", tokenizer="t", output_dir="o")
    config.max_shard_size = "0MB"
    with pytest.raises(PretrainingDataError, match=r"max_shard_size \(--max-shard-size\) '0MB' is 0 bytes"):
        config.validate()


@pytest.mark.parametrize("size", ["abc", "0MB"])
def test_prepare_corpus_refuses_a_bad_size_before_parsing(tmp_path, capsys, size):
    text = tmp_path / "docs.txt"
    text.write_text("protein kinase binds the receptor in tumour cells.\n", encoding="utf-8")
    out = tmp_path / "corpus"
    assert prepare_main(["--inputs", str(text), "--output-dir", str(out), "--min-words", "1", "--num-proc", "1",
                         "--max-shard-size", size]) == 2
    assert capsys.readouterr().err == f"prepare_corpus: error: max_shard_size (--max-shard-size) {size!r} " \
                                      f"{'is not a size' if size == 'abc' else 'is 0 bytes'}: {FORMS}\n"
    assert not out.exists()  # nothing parsed, no folder made


@pytest.mark.parametrize("size", ["abc", "0MB"])
def test_create_pretraining_data_refuses_a_bad_size_before_building(tmp_path, capsys, size):
    out = tmp_path / "data"
    status = create_data_main(["--corpus", str(tmp_path / "no_corpus"), "--tokenizer", str(tmp_path / "no_vocab"),
                               "--output-dir", str(out), "--max-shard-size", size])
    err = capsys.readouterr().err
    assert status == 2
    assert err == f"create_pretraining_data: error: max_shard_size (--max-shard-size) {size!r} " \
                  f"{'is not a size' if size == 'abc' else 'is 0 bytes'}: {FORMS}\n"  # not "corpus not found"
    assert not out.exists()


def test_a_bad_size_in_a_yaml_config_is_refused_too(tmp_path, capsys):
    config = tmp_path / "data.yaml"
    config.write_text(f"corpus: {tmp_path / 'c'}\ntokenizer: {tmp_path / 't'}\noutput_dir: {tmp_path / 'o'}\n"
                      "max_shard_size: 0GB\n")
    assert create_data_main(["--config", str(config)]) == 2
    assert "create_pretraining_data: error: max_shard_size (--max-shard-size) '0GB' is 0 bytes" in \
        capsys.readouterr().err
    assert not Path(tmp_path / "o").exists()
