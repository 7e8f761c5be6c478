"""``pip install`` of the wheel, not the checkout: the package runs from any directory.

The wheel is built from a copy of the checkout's files (what git tracks, or would, so stale
``build/`` leftovers cannot slip in), installed with ``--no-deps`` into a fresh virtualenv, and run
from a temporary directory outside the repository: ``biomed-lm --help``, then a tiny corpus →
vocabulary → instances → pretraining → NCBI-disease fine-tuning using only shipped configs and the
shipped sample data. The new virtualenv reuses this environment's installed dependencies through a
``.pth`` line naming its site-packages (a plain path: the editable install's finder there is not
activated), so nothing is downloaded and biomed_lm can only come from the wheel.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.xdist_group("wheel_install")  # one build and install, shared by this module's tests

#: not part of a source tree, whatever is lying in the checkout
IGNORED = {".git", ".venv", "runs", "build", "dist", "wandb", "__pycache__", ".pytest_cache", ".hypothesis"}


def source_files() -> list[str]:
    """The checkout's files as git sees them (tracked, or untracked and not ignored), or, outside a
    git checkout, every file but the environment, runs and build leftovers."""
    if shutil.which("git") and (REPO / ".git").exists():
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                                capture_output=True, check=True).stdout.decode().split("\0")
        return sorted({name for name in listed if name and (REPO / name).is_file()})
    return sorted(str(p.relative_to(REPO)) for p in REPO.rglob("*")
                  if p.is_file() and not IGNORED.intersection(p.relative_to(REPO).parts)
                  and not any(part.endswith(".egg-info") for part in p.relative_to(REPO).parts))


def run(command: list[str], cwd: Path, env: dict[str, str], timeout: int = 600) -> subprocess.CompletedProcess:
    try:
        done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as err:
        output = [stream.decode(errors="replace") if isinstance(stream, bytes) else stream or ""
                  for stream in (err.stdout, err.stderr)]
        pytest.fail(f"{' '.join(command)} ran past {timeout} s\n--- stdout\n{output[0][-3000:]}\n"
                    f"--- stderr\n{output[1][-5000:]}")
    assert done.returncode == 0, (f"{' '.join(command)} exited {done.returncode}\n"
                                  f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-5000:]}")
    return done


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict[str, Path]:
    """The wheel built and installed into a fresh virtualenv; a work directory outside the repository."""
    root = tmp_path_factory.mktemp("wheel_install")
    source = root / "src"
    for name in source_files():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, source / name)
    dist = root / "dist"
    run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
         str(source), "-w", str(dist)], cwd=root, env=os.environ.copy())
    (wheel,) = dist.glob("biomed_lm-*.whl")

    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    # This environment's dependencies (torch, transformers, deepspeed, ...), after the venv's own packages.
    (purelib / "_biomed_lm_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps", "--no-index",
         str(wheel)], cwd=root, env=os.environ.copy())

    work = root / "work"
    work.mkdir()
    drop = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
            "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}", HF_HUB_OFFLINE="1",
               PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", WANDB_MODE="disabled")
    return {"venv": venv, "python": python, "purelib": purelib, "work": work, "env": env, "wheel": wheel}


def biomed_lm(installed, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return run([str(installed["venv"] / "bin" / "biomed-lm"), *args], cwd=installed["work"], env=installed["env"],
               timeout=timeout)


def test_wheel_holds_the_package_and_its_data(installed) -> None:
    import zipfile

    names = set(zipfile.ZipFile(installed["wheel"]).namelist())
    expected = {"biomed_lm/launch/cli.py", "biomed_lm/pretrain/trainer.py", "biomed_lm/finetune/trainer.py",
                "biomed_lm/tokenization/vocab.py", "biomed_lm/experiments/report.py", "biomed_lm/launch/pretrain.py",
                "biomed_lm/configs/pretrain/demo.yaml", "biomed_lm/configs/terms/pubmedbert_table1.txt",
                "biomed_lm/data/sample/sywada_PubMedAbstract_1MB.txt", "biomed_lm/data/blurb/NCBI-disease/train.tsv"}
    assert expected <= names, sorted(expected - names)
    # one import name: nothing generic lands in site-packages
    top = {name.split("/")[0] for name in names} - {"biomed_lm"}
    assert len(top) == 1 and top.pop().endswith(".dist-info"), sorted({name.split("/")[0] for name in names})


def test_imports_come_from_the_virtualenv_not_the_checkout(installed) -> None:
    probe = ("import json, sys, biomed_lm, biomed_lm.launch.cli, biomed_lm.pretrain.trainer, "
             "biomed_lm.launch.pretrain\n"
             "from biomed_lm.resources import shipped_dir\n"
             "print(json.dumps({'files': [m.__file__ for m in (biomed_lm, biomed_lm.launch.cli, "
             "biomed_lm.pretrain.trainer,"
             " biomed_lm.launch.pretrain)], 'configs': str(shipped_dir('configs')), 'data': str(shipped_dir('data')),"
             " 'path': sys.path}))")
    seen = json.loads(run([str(installed["python"]), "-c", probe], cwd=installed["work"],
                          env=installed["env"]).stdout)
    purelib = installed["purelib"].resolve()
    for path in [*seen["files"], seen["configs"], seen["data"]]:
        assert Path(path).resolve().is_relative_to(purelib), f"{path} is not from the installed wheel"
    environment = Path(sysconfig.get_paths()["purelib"]).resolve()  # the dependencies' .pth entry, allowed
    for entry in seen["path"]:
        resolved = Path(entry or installed["work"]).resolve()
        assert not (resolved.is_relative_to(REPO.resolve()) and not resolved.is_relative_to(environment)), \
            f"the checkout is on sys.path: {entry}"


def test_console_script_help(installed) -> None:
    out = biomed_lm(installed, "--help").stdout
    for command in ("corpus", "vocab", "data", "pretrain", "finetune", "blurb", "report"):
        assert f"  {command} " in out, out


def test_tiny_pretrain_then_finetune_from_outside_the_repository(installed) -> None:
    """Shipped configs and data only, named as the README names them (configs/..., data/...); the
    working directory has none of them, so every one comes from the installed package."""
    work = installed["work"]
    assert not (work / "configs").exists() and not (work / "data").exists()
    corpus = ("corpus", "--config", "configs/corpus/demo.yaml", "--output-dir", "corpus", "--num-proc", "1")
    biomed_lm(installed, *corpus)
    # A reinstall gives the shipped sample new times (QA: every output built from it then refused its rerun).
    run([sys.executable, "-m", "pip", "--python", str(installed["python"]), "install", "--quiet", "--no-deps",
         "--no-index", "--force-reinstall", str(installed["wheel"])], cwd=work, env=os.environ.copy())
    again = biomed_lm(installed, *corpus)
    assert "already complete" in again.stdout + again.stderr, again.stdout + again.stderr
    biomed_lm(installed, "vocab", "--config", "configs/vocab/demo.yaml", "--inputs", "corpus", "--output-dir", "vocab",
              "--vocab-size", "3000")
    biomed_lm(installed, "data", "--config", "configs/data/demo.yaml", "--corpus", "corpus", "--tokenizer", "vocab",
              "--output-dir", "instances", "--max-seq-length", "64", "--num-proc", "1")
    pretrain = biomed_lm(installed, "pretrain", "--config", "configs/pretrain/demo.yaml", "--data-dir", "instances",
                         "--tokenizer", "vocab", "--output-dir", "pretrain", "--max-steps", "2",
                         "--micro-batch-size", "8", "--checkpoint-every", "2", "--num-workers", "0")
    assert "finished 2 steps" in pretrain.stdout, pretrain.stdout
    model = work / "pretrain" / "model"
    finetune = biomed_lm(installed, "finetune", "--config", "configs/finetune/ncbi_disease.yaml", "--model", str(model),
                         "--output_dir", "finetune", "--epochs", "1", "--batch_size", "16", "--max_length", "64",
                         "--max_train_examples", "64", "--max_eval_examples", "32")
    assert "test score" in finetune.stdout, finetune.stdout
    record = json.loads((work / "finetune" / "run.json").read_text())
    assert record["dataset"] == "ncbi-disease" and 0.0 <= record["test"]["score"] <= 1.0

    from transformers import AutoTokenizer, BertForPreTraining

    loaded = BertForPreTraining.from_pretrained(model)
    assert loaded.config.model_type == "bert" and loaded.config.num_hidden_layers == 2  # bert-tiny
    assert len(AutoTokenizer.from_pretrained(model)) <= loaded.config.vocab_size
