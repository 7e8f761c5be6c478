"""The shape of the code (issues 14 and 25): one import name, imports that run one way down the layers,
no import cycles, functions a reader can hold.

Checked on the source with ``ast``, so a regression fails here with the module and the function
named, before a reviewer has to find it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: import name → folder (setup.py's PACKAGE_DIRS, for the folders that hold code)
PACKAGES = {"biomed_lm": "biomed_lm", "biomed_lm.tokenization": "tokenization", "biomed_lm.pretrain": "pretrain",
            "biomed_lm.finetune": "finetune", "biomed_lm.experiments": "experiments", "biomed_lm.launch": "launch"}
TOP_LEVEL_NAMES_OF_THE_OLD_LAYOUT = ("common", "tokenization", "pretrain", "finetune", "experiments", "launch")
#: The hot paths: the pretraining and fine-tuning loops, the analysis and the report.
HOT_PATHS = ("pretrain/trainer.py", "finetune/trainer.py", "experiments/analysis.py",
             "experiments/checkpoint_analysis.py", "experiments/report.py")
MAX_FUNCTION_LINES = 60


def _modules() -> dict[str, Path]:
    modules = {}
    for package, folder in PACKAGES.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            parts = path.relative_to(REPO / folder).with_suffix("").parts
            name = ".".join((package, *parts))
            modules[name.removesuffix(".__init__")] = path
    return modules


#: The layers of docs/architecture.md, lowest first: a module may import its own layer's package and
#: the layers below it. pretrain and finetune are one layer, two stages: neither imports the other.
LAYERS = (("biomed_lm",), ("biomed_lm.tokenization",), ("biomed_lm.pretrain", "biomed_lm.finetune"),
          ("biomed_lm.experiments",), ("biomed_lm.launch",))
_DYNAMIC_IMPORTERS = ("import_module", "__import__")


def _package_of(module: str) -> str:
    """The layer package a module belongs to: ``biomed_lm.finetune`` for ``biomed_lm.finetune.readers.qa``,
    ``biomed_lm`` for the shared floor (``biomed_lm.config``, ``biomed_lm.resources``, ...)."""
    packages = [p for layer in LAYERS for p in layer if p != "biomed_lm"]
    return next((p for p in packages if module == p or module.startswith(p + ".")), "biomed_lm")


def _layer_of(package: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if package in layer)


def _runtime_nodes(tree: ast.AST):
    """Every node of ``tree`` except those under ``if TYPE_CHECKING:`` (annotations only, never run)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (n for child in node.orelse for n in [child, *_runtime_nodes(child)])
            continue
        yield node
        yield from _runtime_nodes(node)


def _dynamic_import(node: ast.AST) -> str | None:
    """The module a call ``importlib.import_module("biomed_lm.x")`` (or ``__import__``) names, by its
    string literal; for an f-string, its constant head (``f"biomed_lm.launch.{name}"``: ``biomed_lm.launch``)."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    func = node.func
    if (func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)) not in _DYNAMIC_IMPORTERS:
        return None
    target = node.args[0]
    if isinstance(target, ast.Constant) and isinstance(target.value, str):
        return target.value
    if isinstance(target, ast.JoinedStr) and target.values and isinstance(target.values[0], ast.Constant):
        return str(target.values[0].value).rstrip(".") or None
    return None


def _imports(path: Path, module: str, *, with_type_checking: bool = False) -> set[str]:
    """Every module ``path`` imports, at module level or inside a function (an import deferred to
    a function still ties the two modules together), and by ``importlib.import_module`` of a literal
    name; under ``if TYPE_CHECKING:`` only ``with_type_checking`` (annotations never run, so they
    make no cycle, but they still say which way a layer depends)."""
    names = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in (ast.walk(tree) if with_type_checking else _runtime_nodes(tree)):
        if (dynamic := _dynamic_import(node)) is not None:
            names.add(dynamic)
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def test_every_module_imports_the_toolkit_by_its_one_name():
    offenders = []
    for module, path in _modules().items():
        for name in _imports(path, module):
            if name.split(".")[0] in TOP_LEVEL_NAMES_OF_THE_OLD_LAYOUT:
                offenders.append(f"{path.relative_to(REPO)}: imports {name}")
    assert not offenders, "\n".join(offenders)


def _upward_imports() -> list[tuple[str, str]]:
    """(importer, imported module) for every import of a toolkit module from a layer above the importer's,
    or from the sibling stage (pretrain <-> finetune). ``from m import x`` is reported as ``m``."""
    found = []
    for module, path in _modules().items():
        importer = _package_of(module)
        names = _imports(path, module, with_type_checking=True)
        for name in names:
            if name.split(".")[0] != "biomed_lm" or name.rpartition(".")[0] in names:
                continue
            imported = _package_of(name)
            if imported != importer and _layer_of(imported) >= _layer_of(importer):
                found.append((module, name))
    return sorted(found)


def test_imports_run_down_the_layers():
    """docs/architecture.md's layers hold in the code: the shared floor imports nothing above it,
    tokenization imports neither stage, pretrain and finetune not each other, experiments not launch.
    TYPE_CHECKING imports and ``importlib.import_module("biomed_lm....")`` count."""
    upward = _upward_imports()
    assert not upward, "imports that run up (or across) the layers:\n" + "\n".join(
        f"{_modules()[m].relative_to(REPO)}: {m} imports {n}" for m, n in upward)


def test_the_layer_check_finds_what_it_should(tmp_path):
    """Each kind of upward import is seen: a plain one, a deferred one, one under TYPE_CHECKING, a
    relative one, and ``importlib.import_module`` of a literal name or an f-string."""
    source = (
        "from __future__ import annotations\n"
        "import importlib\n"
        "from typing import TYPE_CHECKING\n"
        "from biomed_lm.finetune.blurb import BLURB\n"
        "if TYPE_CHECKING:\n"
        "    from biomed_lm.pretrain.trainer import Trainer\n"
        "from ..experiments import report\n"
        "def deferred(name):\n"
        "    import biomed_lm.launch.cli\n"
        "    importlib.import_module('biomed_lm.experiments.ablation')\n"
        "    return importlib.import_module(f'biomed_lm.launch.{name}')\n")
    path = tmp_path / "probe.py"
    path.write_text(source)
    names = _imports(path, "biomed_lm.tokenization.probe", with_type_checking=True)
    upward = {_package_of(n) for n in names if n.startswith("biomed_lm") and _package_of(n) != "biomed_lm"}
    assert upward == {"biomed_lm.finetune", "biomed_lm.pretrain", "biomed_lm.experiments", "biomed_lm.launch"}
    assert "biomed_lm.pretrain.trainer" not in _imports(path, "biomed_lm.tokenization.probe")  # runtime only
    assert "biomed_lm.launch" in names and "biomed_lm.experiments.ablation" in names
    assert [_layer_of(p) for p in ("biomed_lm", "biomed_lm.tokenization", "biomed_lm.pretrain",
                                   "biomed_lm.finetune", "biomed_lm.experiments", "biomed_lm.launch")] == \
        [0, 1, 2, 2, 3, 4]


def test_no_import_cycles():
    modules = _modules()
    graph = {m: {n for n in _imports(p, m) if n in modules and n != m} for m, p in modules.items()}
    # a package's __init__ importing its own submodules is not a cycle worth reporting
    graph = {m: {n for n in deps if not n.startswith(m + ".")} for m, deps in graph.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        stack.append(module)
        for dep in sorted(graph[module]):
            if state.get(dep) == 1:
                return stack[stack.index(dep):] + [dep]
            if dep not in state and (cycle := visit(dep)):
                return cycle
        stack.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)):
            pytest.fail("import cycle: " + " -> ".join(cycle))


def _long_functions(path: Path) -> list[str]:
    long = []
    for node in _runtime_nodes(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_FUNCTION_LINES:
                long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({lines} lines)")
    return long


@pytest.mark.parametrize("hot_path", HOT_PATHS)
def test_hot_path_functions_fit_on_a_screen(hot_path):
    long = _long_functions(REPO / hot_path)
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


def test_code_lines_fit_in_120_characters():
    """The style's line length, for every tracked Python, shell and YAML file (the last 44 over it were
    rewrapped on 2026-11-28): a long line in a diff is read by scrolling."""
    import subprocess

    tracked = subprocess.run(["git", "ls-files", "*.py", "*.sh", "*.yaml"], cwd=REPO, capture_output=True,
                             text=True, check=False)
    if tracked.returncode != 0:
        pytest.skip("not a git checkout")
    long_lines = [f"{name}:{number} ({len(line)} characters)"
                  for name in tracked.stdout.split()
                  for number, line in enumerate((REPO / name).read_text(encoding="utf-8").splitlines(), 1)
                  if len(line) > 120]
    assert not long_lines, "lines over 120 characters: " + ", ".join(long_lines)
