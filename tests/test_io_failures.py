"""The data stages' entry scripts on a filesystem that fails part-way (QA, 2026-11-28: a full disk or a
read-only folder ended prepare_corpus, build_vocab, create_pretraining_data and finetune in raw tracebacks,
up to four of them, the full disk's naming no path): one line, the OS's reason and the file or output
folder, exit 1."""

from __future__ import annotations

import errno
import importlib.util
import os
import sys

import pytest

from tests.conftest import REPO


def _launch(name: str):
    spec = importlib.util.spec_from_file_location(f"launch_{name}", REPO / "launch" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _disk_full(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _read_only(*args, **kwargs):
    raise OSError(errno.EROFS, os.strerror(errno.EROFS), "/data/out/shard.arrow")


@pytest.mark.parametrize("script, stage, argv", [
    ("prepare_corpus", "prepare_corpus", ["--inputs", "data/sample", "--output-dir", "{out}"]),
    ("build_vocab", "build_vocab", ["--inputs", "data/sample", "--output-dir", "{out}"]),
    ("create_pretraining_data", "create_pretraining_data",
     ["--corpus", "c", "--tokenizer", "t", "--output-dir", "{out}"]),
])
@pytest.mark.parametrize("failure", [_disk_full, _read_only], ids=["disk full", "read-only"])
def test_a_filesystem_failure_part_way_is_one_line_naming_the_file_or_folder(script, stage, argv, failure, tmp_path,
                                                                             monkeypatch, capsys):
    module = _launch(script)
    monkeypatch.setattr(module, stage, failure)
    out = tmp_path / "out"
    assert module.main([a.format(out=out) for a in argv]) == 1
    err = capsys.readouterr().err.strip()
    expected = ("No space left on device: while writing under " + str(out) if failure is _disk_full
                else "Read-only file system: /data/out/shard.arrow")
    assert err == f"{script}: error: {expected}"


def test_finetune_names_the_file_the_os_named(monkeypatch, capsys):
    module = _launch("finetune")
    monkeypatch.setattr(module, "run_finetune", _read_only)
    assert module.main(["--dataset", "ncbi-disease", "--data-dir", "d", "--model", "m", "--output-dir", "o"]) == 1
    assert capsys.readouterr().err.strip() == "finetune: error: Read-only file system: /data/out/shard.arrow"


def test_build_vocab_on_a_full_disk_names_the_tokenizer_file(tmp_path, monkeypatch, capsys):
    """QA (2026-11-28): the ``tokenizers`` library reports a full disk as a plain ``Exception``, which
    build_vocab let through as a traceback; it is the OSError it is, naming the file being written."""
    from biomed_lm.tokenization import vocab

    def tokenizers_full_disk(*args, **kwargs):
        raise Exception("No space left on device (os error 28)")

    monkeypatch.setattr(vocab, "save_tokenizer_dir", tokenizers_full_disk)
    corpus = tmp_path / "docs.txt"
    corpus.write_text("".join(f"Protein kinase {i} binds DNA in cell line {i % 7}.\n" for i in range(40)))
    out = tmp_path / "out"
    argv = ["--inputs", str(corpus), "--output-dir", str(out), "--vocab-size", "300", "--progress", "false"]
    assert _launch("build_vocab").main(argv) == 1
    err = capsys.readouterr().err
    assert err == f"build_vocab: error: No space left on device: {out / 'tokenizer.json'}\n"


def test_a_tokenizers_failure_without_an_os_error_code_keeps_its_message_and_other_errors_pass():
    from biomed_lm.tokenization.vocab import tokenizers_write

    with pytest.raises(OSError) as caught, tokenizers_write("/out/tokenizer.json"):
        raise Exception("serialization failed")
    assert (caught.value.errno, caught.value.strerror, caught.value.filename) == \
        (None, "serialization failed", "/out/tokenizer.json")
    assert str(caught.value.__cause__) == "serialization failed"
    with pytest.raises(ValueError, match="lacks the special token"), tokenizers_write("/out/tokenizer.json"):
        raise ValueError("tokenizer lacks the special token(s) ['[CLS]']")
