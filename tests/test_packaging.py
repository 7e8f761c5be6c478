"""Packaging checks that need no build: the locks agree with setup.py, setup.py ships every package
and data file, and every path and config the Docker image and its README commands name exists and
parses. (Building and installing the wheel: tests/test_wheel_install.py.)"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from fnmatch import fnmatch
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.conftest import REPO

CPU_LOCK = REPO / "requirements" / "cpu.lock"
GPU_LOCK = REPO / "requirements" / "gpu.lock"
DOCKERFILE = REPO / "docker" / "Dockerfile"
README = REPO / "README.md"


# --- setup.py, read without running it ---------------------------------------------------------

def setup_keywords() -> dict[str, object]:
    """The literal keyword arguments of setup.py's ``setup(...)`` call (those that are literals)."""
    tree = ast.parse((REPO / "setup.py").read_text(encoding="utf-8"))
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "setup"]
    assert len(calls) == 1, "setup.py should call setup() once"
    keywords = {}
    for keyword in calls[0].keywords:
        try:
            keywords[keyword.arg] = ast.literal_eval(keyword.value)
        except ValueError:
            pass  # computed (long_description, packages, package_dir)
    return keywords


def package_dirs() -> dict[str, str]:
    """setup.py's import name → folder mapping, as setup.py computes it."""
    spec = importlib.util.spec_from_file_location("_setup_for_tests", REPO / "setup.py")
    source = (REPO / "setup.py").read_text(encoding="utf-8")
    head = source[:source.index("\nsetup(")]  # everything before the setup() call: no build runs
    namespace: dict[str, object] = {"__file__": str(REPO / "setup.py"), "__name__": spec.name}
    exec(compile(head, str(REPO / "setup.py"), "exec"), namespace)
    return namespace["PACKAGE_DIRS"]


def makefile_extras() -> set[str]:
    """The extras `make env` installs (``-e ".[dev,pretrain]"``)."""
    found = re.findall(r'-e\s+"?\.\[([a-z0-9_,-]+)\]"?', (REPO / "Makefile").read_text(encoding="utf-8"))
    assert found, "the Makefile's env target installs no extras of this package?"
    return {extra for group in found for extra in group.split(",")}


def read_lock(path: Path) -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)", line)
        assert match, f"{path.name}, line {number}: {line!r} is not name==version"
        name = canonicalize_name(match[1])
        assert name not in pins, f"{path.name}, line {number}: {match[1]} is pinned twice"
        pins[name] = Version(match[2])
    return pins


def load_lock_writer():
    spec = importlib.util.spec_from_file_location("_lock_writer", REPO / "requirements" / "lock.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- the locks ---------------------------------------------------------------------------------

def test_locks_are_exact_pins_without_duplicates() -> None:
    cpu, gpu = read_lock(CPU_LOCK), read_lock(GPU_LOCK)
    assert len(cpu) > 50 and len(gpu) > 50
    for pins in (cpu, gpu):
        assert not any(version.local for version in pins.values()), "a lock pins without local labels (+cpu)"


def test_every_setup_requirement_is_locked_at_a_version_it_allows() -> None:
    """install_requires and the extras `make env` installs must all be in the CPU lock, each at a
    version inside setup.py's specifier; the other extras' requirements, where locked, too."""
    keywords = setup_keywords()
    extras: dict[str, list[str]] = keywords["extras_require"]
    installed = makefile_extras()
    assert installed <= set(extras), f"the Makefile installs unknown extras {installed - set(extras)}"
    cpu = read_lock(CPU_LOCK)
    required = [(req, "install_requires") for req in keywords["install_requires"]]
    required += [(req, f"extra {name!r}") for name, reqs in extras.items() for req in reqs]
    problems = []
    for text, where in required:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        pinned = cpu.get(name)
        if pinned is None:
            if where == "install_requires" or where.strip("extra '") in installed:
                problems.append(f"{text} ({where}) is not in {CPU_LOCK.name}")
            continue
        if not requirement.specifier.contains(pinned, prereleases=True):
            problems.append(f"{CPU_LOCK.name} pins {name}=={pinned}, outside setup.py's {text} ({where})")
    assert not problems, "\n".join(problems)


def test_every_requirement_has_a_floor() -> None:
    """A floor is a statement about the code; an unversioned requirement makes none."""
    keywords = setup_keywords()
    texts = keywords["install_requires"] + [r for reqs in keywords["extras_require"].values() for r in reqs]
    bare = [text for text in texts
            if not any(spec.operator in (">=", "==", "~=") for spec in Requirement(text).specifier)]
    assert not bare, f"requirements without a floor: {bare}"


def test_gpu_lock_is_the_cpu_lock_less_what_the_base_image_owns() -> None:
    writer = load_lock_writer()
    cpu, gpu = read_lock(CPU_LOCK), read_lock(GPU_LOCK)
    expected = {name: version for name, version in cpu.items() if not writer.GPU_BASE_OWNS.match(name)}
    assert gpu == expected
    assert "torch" in cpu and "torch" not in gpu


def test_this_environment_has_the_locked_versions() -> None:
    """`make env` installs every pin of the lock exactly (the environment may hold more)."""
    if Path(sys.prefix).resolve() != (REPO / ".venv").resolve():
        pytest.skip("not the checkout's .venv (the lock describes the environment `make env` builds)")
    wrong = []
    for name, version in read_lock(CPU_LOCK).items():
        try:
            have = Version(importlib.metadata.version(name))
        except importlib.metadata.PackageNotFoundError:
            wrong.append(f"{name} (locked {version}) is not installed")
            continue
        if Version(have.public) != version:
            wrong.append(f"{name}: installed {have}, locked {version}")
    assert not wrong, "run `make env` (or refresh the lock, README):\n" + "\n".join(wrong)


# --- what setup.py ships -----------------------------------------------------------------------

def test_every_python_folder_is_a_shipped_package() -> None:
    """A folder of Python files below a mapped folder without an entry in PACKAGE_DIRS would be
    missing from the wheel (tests/test_wheel_install.py would find it late and slowly)."""
    dirs = package_dirs()
    shipped = {Path(folder) for folder in dirs.values()}
    missing = []
    for folder in {Path(f) for f in dirs.values()}:
        for source in (REPO / folder).rglob("*.py"):
            parent = source.parent.relative_to(REPO)
            if "__pycache__" not in parent.parts and parent not in shipped:
                missing.append(str(source.relative_to(REPO)))
    assert not missing, f"not in any package of setup.py (no __init__.py?): {sorted(missing)}"


def test_a_build_copies_into_an_emptied_build_folder(tmp_path) -> None:
    """setuptools keeps what an earlier build left in build/lib, so a file deleted from the checkout still
    shipped in the next wheel (QA: ``git pull && pip install .``)."""
    build_lib = tmp_path / "lib"
    stale = build_lib / "biomed_lm" / "configs" / "model" / "zzz-deleted.yaml"
    stale.parent.mkdir(parents=True)
    stale.write_text("hidden_size: 1\n")
    subprocess.run([sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(build_lib)], cwd=REPO,
                   check=True, capture_output=True)
    assert not stale.exists() and (build_lib / "biomed_lm" / "configs" / "pretrain" / "demo.yaml").is_file()


def test_the_shipped_files_the_code_knows_are_the_package_data() -> None:
    """biomed_lm.resources tells a shipped input (identified by its bytes) from a user's file in a checkout's
    data/ by these globs."""
    from biomed_lm.resources import SHIPPED_FILES, SHIPPED_PACKAGES

    data = setup_keywords()["package_data"]
    assert {SHIPPED_PACKAGES[kind]: list(globs) for kind, globs in SHIPPED_FILES.items()} == data


def test_package_data_globs_cover_every_config_and_data_file() -> None:
    """Every file under configs/ and data/ is package data, so a shipped path (configs/..., data/...)
    resolves from an installed wheel as it does in the checkout."""
    dirs, data = package_dirs(), setup_keywords()["package_data"]
    uncovered = []
    for package in ("biomed_lm.configs", "biomed_lm.data"):
        root = REPO / dirs[package]
        for path in root.rglob("*"):
            relative = path.relative_to(root).as_posix()
            if (path.is_dir() or path.suffix == ".py" or "__pycache__" in path.parts
                    or path.name.startswith(".")):
                continue
            if not any(fnmatch(relative, pattern) and relative.count("/") == pattern.count("/")
                       for pattern in data.get(package, [])):
                uncovered.append(f"{dirs[package]}/{relative}")
    assert not uncovered, f"not matched by setup.py's package_data: {uncovered}"


# --- Docker ------------------------------------------------------------------------------------

#: a repository path as the Dockerfile and README name them
REPO_PATH = re.compile(r"^(?:\./)?((?:launch|configs|tests|docker|requirements|data|benchmarks)(?:/[\w./-]+)?)$")


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of docker/Dockerfile, continuation lines joined, comments dropped."""
    joined, instructions = "", []
    for line in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("#") and not joined:
            continue
        joined += line.rstrip("\\").rstrip() + " " if line.rstrip().endswith("\\") else line
        if not line.rstrip().endswith("\\"):
            if joined.strip():
                keyword, _, rest = joined.strip().partition(" ")
                instructions.append((keyword.upper(), rest.strip()))
            joined = ""
    return instructions


def docker_commands() -> list[list[str]]:
    """The `docker ...` commands of the Dockerfile's header and of the README's GPU section, as argv."""
    header = []
    for line in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        header.append(line[1:].strip())
    blocks = re.findall(r"```bash\n(.*?)```", readme_section("GPU clusters"), flags=re.S)
    text = "\n".join(header + [line for block in blocks for line in block.splitlines()])
    text = re.sub(r"\\\n\s*", " ", text)  # continuation lines
    commands = [shlex.split(line.split("#")[0]) for line in text.splitlines() if line.strip().startswith("docker ")]
    assert commands, "no docker commands found in the Dockerfile's header or the README"
    return commands


def readme_section(title: str) -> str:
    text = README.read_text(encoding="utf-8")
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, flags=re.S | re.M)
    assert match, f"README has no '## {title}' section"
    return match[1]


def test_dockerfile_copies_and_names_only_existing_paths() -> None:
    instructions = dockerfile_instructions()
    assert instructions[0][0] in ("ARG", "FROM")
    copied = []
    for keyword, rest in instructions:
        if keyword in ("COPY", "ADD"):
            *sources, _ = [part for part in shlex.split(rest) if not part.startswith("--")]
            copied += [source for source in sources if source != "."]
        if keyword == "RUN":  # files of the checkout the build steps read (after COPY . .)
            copied += [word for word in re.findall(r"[\w./-]+", rest) if REPO_PATH.match(word)]
    missing = [path for path in copied if not (REPO / path).exists()]
    assert copied and not missing, f"the Dockerfile names paths that do not exist: {missing}"


def test_docker_commands_name_existing_files_and_configs() -> None:
    named = []
    for argv in docker_commands():
        for word in argv:
            value = word.split("=", 1)[-1] if word.startswith("--") else word
            match = REPO_PATH.match(value)
            if match:
                named.append(match[1])
        if argv[:2] == ["docker", "build"]:
            assert "-f" in argv and (REPO / argv[argv.index("-f") + 1]).is_file()
    missing = [path for path in named if not (REPO / path).exists()]
    assert named and not missing, f"docker commands name paths that do not exist: {missing}"


def test_docker_run_mounts_into_the_image_workdir() -> None:
    workdirs = [rest for keyword, rest in dockerfile_instructions() if keyword == "WORKDIR"]
    for argv in docker_commands():
        for flag, value in zip(argv, argv[1:]):
            if flag in ("-v", "--volume"):
                target = value.split(":")[1]
                assert target.startswith(workdirs[-1] + "/"), f"{value} mounts outside the image's {workdirs[-1]}"


def entry_commands() -> list[list[str]]:
    """What the documented `docker run` commands run inside the image (after the image name)."""
    commands = []
    for argv in docker_commands():
        if argv[:2] != ["docker", "run"]:
            continue
        rest, i = argv[2:], 0
        while i < len(rest) and rest[i].startswith("-"):
            i += 2 if rest[i] in ("-v", "--volume", "-e", "--env", "--gpus", "--name", "-w") else 1
        commands.append(rest[i + 1:])  # rest[i] is the image
    assert commands, "no `docker run` command documented"
    return commands


def test_docker_entry_commands_run_checkout_scripts_that_accept_their_configs(monkeypatch) -> None:
    """`deepspeed launch/pretrain.py --config configs/...` as the image runs it: the script exists and
    the config parses into its typed options (unknown keys and bad values are errors), through the
    script's own main() with training replaced by a recorder."""
    checked = 0
    for command in entry_commands():
        scripts = [word for word in command if word.startswith("launch/") and word.endswith(".py")]
        if not scripts:
            assert any(REPO_PATH.match(word) for word in command), f"{command}: runs nothing of the checkout"
            continue
        (script,) = scripts
        argv = command[command.index(script) + 1:]
        assert (REPO / script).is_file()
        module = importlib.import_module(f"biomed_lm.launch.{Path(script).stem}")
        if Path(script).stem == "pretrain":
            seen = []
            monkeypatch.setattr(module, "train", lambda *args: seen.append(args) or {"completed": False,
                                                                                     "model_dir": None})
            assert module.main(argv) == 0 and len(seen) == 1, f"{script} {' '.join(argv)} did not parse"
            model_args, data_args, train_args, _ = seen[0]
            config = argv[argv.index("--config") + 1]
            assert (REPO / config).is_file() and train_args.output_dir, config
            checked += 1
    assert checked, "no documented image command runs launch/pretrain.py"


def test_docker_gpu_test_command_selects_tests() -> None:
    """`python -m pytest -m gpu tests`: the paths exist, and the files there that -m gpu selects from
    carry the marker (every file with a CUDA-only test does: the optimizer's had none, so -m gpu never
    ran them)."""
    for command in entry_commands():
        if "pytest" in command:
            paths = [REPO / word for word in command if word == "tests" or word.startswith("tests/")]
            assert paths and all(p.exists() for p in paths)
            files = [f for p in paths for f in ([p] if p.is_file() else sorted(p.glob("test_*.py")))]
            marked = {f.name for f in files if "mark.gpu" in f.read_text(encoding="utf-8")}
            assert marked
            cuda_only = {f.name for f in files if "cuda.is_available()" in f.read_text(encoding="utf-8")}
            assert cuda_only <= marked, sorted(cuda_only - marked)


def docker_daemon() -> str | None:
    """Why an image cannot be built here, or None when it can."""
    if shutil.which("docker") is None:
        return "no docker command on this machine"
    info = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True,
                          timeout=60)
    if info.returncode != 0:
        return f"no Docker daemon reachable ({info.stderr.strip().splitlines()[-1] if info.stderr.strip() else ''})"
    return None


def test_docker_image_builds() -> None:
    """Builds docker/Dockerfile and runs its smoke commands. Opt-in (BIOMED_LM_DOCKER_BUILD=1: apex
    and DeepSpeed's CUDA ops compile for many minutes) and only from a base image already present
    (BIOMED_LM_DOCKER_BASE, default the Dockerfile's): a test never pulls."""
    if os.environ.get("BIOMED_LM_DOCKER_BUILD") != "1":
        pytest.skip("building the image takes long: set BIOMED_LM_DOCKER_BUILD=1 to run it")
    reason = docker_daemon()
    if reason:
        pytest.skip(reason)
    default = next(rest.split("=", 1)[1] for keyword, rest in dockerfile_instructions()
                   if keyword == "ARG" and rest.startswith("BASE_IMAGE="))
    base = os.environ.get("BIOMED_LM_DOCKER_BASE", default)
    if subprocess.run(["docker", "image", "inspect", base], capture_output=True).returncode != 0:
        pytest.skip(f"base image {base} is not present locally (pull it first, or set BIOMED_LM_DOCKER_BASE)")
    tag = "biomed-lm:test"
    build = subprocess.run(["docker", "build", "-f", str(DOCKERFILE), "--build-arg", f"BASE_IMAGE={base}", "-t", tag,
                            str(REPO)], capture_output=True, text=True, timeout=7200)
    assert build.returncode == 0, build.stderr[-5000:]
    for command in (["biomed-lm", "--help"], ["python", "launch/pretrain.py", "--help"]):
        ran = subprocess.run(["docker", "run", "--rm", tag, *command], capture_output=True, text=True, timeout=600)
        assert ran.returncode == 0, ran.stderr[-3000:]
