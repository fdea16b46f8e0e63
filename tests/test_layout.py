"""The layout users import from: the old module paths are gone, and the tools (rotary/tools/)
stay apart from the library (issue: a codebase a newcomer can hold in their head)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import rotary
import rotary.tools
from helpers import run_interpreted


def test_the_old_module_paths_are_gone():
    """Release 0.1.0 had no users to keep: the aliases of the moved modules are gone, and importing one
    fails instead of giving a second copy."""
    import pytest

    for old in ("bench", "cli", "commands", "experiments", "plots", "module", "apply", "config"):
        assert not (SRC / f"{old}.py").exists(), old
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(f"rotary.{old}")
    assert not hasattr(rotary.tools, "install_old_path")


# ---- the tools apart from the library --------------------------------------------------------------
SRC = Path(rotary.__file__).resolve().parent
TOOLS = SRC / "tools"


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in one file, deferred ones inside functions included, relative
    ones resolved; ``from a import b`` gives both ``a`` and ``a.b``."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            base = ".".join(parts[: len(parts) - node.level + 1]) if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            found += [(node.lineno, module)] + [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return found


def test_the_library_imports_nothing_from_the_tools():
    """Everything outside rotary/tools/ is the library: no import of rotary.tools, not even deferred inside a
    function. The exception is the entry point ``python -m rotary``."""
    entry_points = {"rotary.__main__"}
    library = [p for p in sorted(SRC.rglob("*.py")) if TOOLS not in p.parents and _module_name(p) not in entry_points]
    assert len(library) > 40
    found = [
        f"{_module_name(path)}:{line} imports {module}"
        for path in library
        for line, module in _imported(path)
        if module == "rotary.tools" or module.startswith("rotary.tools.")
    ]
    assert not found, found


def test_importing_and_using_the_library_loads_no_tool():
    code = (
        "import sys, torch, rotary\n"
        "q = torch.randn(1, 2, 4, 8)\n"
        "rotary.RoPE(8)(q, q)\n"
        "import rotary.analysis, rotary.hf, rotary.models, rotary.nn\n"
        "print([m for m in sys.modules if m.startswith('rotary.tools')])\n"
    )
    # a process in which nothing of rotary was imported: a child forked from the interpreter server
    assert run_interpreted(code).strip() == "[]"


# ---- no import cycle -------------------------------------------------------------------------------
def _dependencies(modules: dict[str, Path]) -> dict[str, dict[str, int]]:
    """module -> {module of src it imports: first line}, deferred imports inside functions included.

    ``from a import b`` depends on the module ``a.b`` when there is one (``from . import positions``
    needs rotary.positions, not what rotary/__init__.py re-exports), else on ``a``. Importing ``a.b``
    also runs ``a/__init__.py`` first; that is not counted, or every package whose ``__init__``
    re-exports a submodule would be a cycle."""
    graph: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1]) if node.level else ""
                module = ".".join(p for p in (base, node.module or "") if p)
                targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in modules else module for a in node.names]
            else:
                continue
            for target in targets:
                if target in modules and target != name:
                    edges[target] = min(edges.get(target, node.lineno), node.lineno)
        graph[name] = edges
    return graph


def _cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle ``[a, b, ..., a]`` through every import edge that closes one (depth-first search)."""
    found, state = [], {}  # state: 1 on the current path, 2 done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, {})):
            if state.get(nxt) == 1:
                found.append(path[path.index(nxt) :] + [node, nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                visit(nxt, path + [node])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    return found


def test_the_cycle_finder_finds_cycles():
    assert _cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"a.x": 1}, "a.x": {}}) == []
    assert _cycles({"p": {"p.m": 1}, "p.m": {"p": 5}}) == [["p", "p.m", "p"]]


def test_the_dependencies_read_deferred_and_relative_imports(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .a import f\n")
    (pkg / "a.py").write_text("def f():\n    from . import b\n")
    (pkg / "b.py").write_text("from pkg import f\nfrom . import a\n")
    modules = {"pkg": pkg / "__init__.py", "pkg.a": pkg / "a.py", "pkg.b": pkg / "b.py"}
    graph = _dependencies(modules)
    assert graph == {"pkg": {"pkg.a": 1}, "pkg.a": {"pkg.b": 2}, "pkg.b": {"pkg": 1, "pkg.a": 2}}
    assert _cycles(graph) == [["pkg", "pkg.a", "pkg.b", "pkg"], ["pkg.a", "pkg.b", "pkg.a"]]


def test_no_import_cycle_in_src():
    """No module of src/ needs, directly or through others, a module that needs it: each can be read
    (and imported) after the ones it uses. Deferred imports inside functions count too."""
    modules = {_module_name(p): p for p in sorted(SRC.rglob("*.py"))}
    graph = _dependencies(modules)
    assert sum(map(len, graph.values())) > 200  # the scan does see the imports
    cycles = _cycles(graph)
    assert not cycles, [" -> ".join(c) for c in cycles]


def test_the_command_line_parses_no_source_at_error_time():
    """Bad input is an InputError, told apart by its type (rotary.errors), not by reading the source that raised it."""
    imported = {module for _, module in _imported(TOOLS / "cli.py")}
    assert not {"ast", "linecache", "inspect", "traceback"} & imported, imported
    assert "rotary.errors.InputError" in imported
