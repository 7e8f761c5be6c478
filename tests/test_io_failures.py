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
