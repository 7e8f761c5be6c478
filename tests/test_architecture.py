"""The shape of the code (issue 14): one import name, no import cycles, functions a reader can hold.

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


def _runtime_nodes(tree: ast.AST):
    """Every node of ``tree`` except those under ``if TYPE_CHECKING:`` (annotations only, never run)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (n for child in node.orelse for n in [child, *_runtime_nodes(child)])
            continue
        yield node
        yield from _runtime_nodes(node)


def _imports(path: Path, module: str) -> set[str]:
    """Every module ``path`` imports, at module level or inside a function (an import deferred to
    a function still ties the two modules together), but not under ``if TYPE_CHECKING:``."""
    names = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in _runtime_nodes(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
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
