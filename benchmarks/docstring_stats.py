"""How much of ``src/rotary`` is docstrings, and which docstrings are longest.

Run: ``python benchmarks/docstring_stats.py [--top N] [--by-file] [ROOT]`` (ROOT defaults to ``src/rotary``).
A docstring's lines run from its expression's first line to its last (``lineno`` to ``end_lineno``), for
every module, class and function. Module docstrings count toward the share; the length cap (``MAX_LINES``)
applies to class and function docstrings only, module overviews being exempt. ``tests/test_docstrings.py``
holds the tree to ``MAX_SHARE`` and ``MAX_LINES``.
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass
from pathlib import Path

MAX_SHARE = 0.15
MAX_LINES = 30
ROOT = Path(__file__).resolve().parents[1] / "src" / "rotary"


@dataclass(frozen=True)
class Docstring:
    path: Path
    name: str
    kind: str  # "module", "class" or "function"
    lineno: int
    lines: int


@dataclass(frozen=True)
class Stats:
    source_lines: int
    docstrings: tuple[Docstring, ...]

    @property
    def docstring_lines(self) -> int:
        return sum(d.lines for d in self.docstrings)

    @property
    def share(self) -> float:
        return self.docstring_lines / self.source_lines if self.source_lines else 0.0

    def over(self, limit: int = MAX_LINES) -> list[Docstring]:
        """Class and function docstrings longer than ``limit`` lines, longest first."""
        long = [d for d in self.docstrings if d.kind != "module" and d.lines > limit]
        return sorted(long, key=lambda d: -d.lines)


def _scopes(node: ast.AST):
    """The module, classes and functions in ``node``, found through statements only (no expression holds one)."""
    if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
        yield node
    for field in ("body", "orelse", "finalbody", "handlers", "cases"):
        for child in getattr(node, field, ()):
            if isinstance(child, ast.stmt | ast.excepthandler | ast.match_case):
                yield from _scopes(child)


def _docstrings(path: Path) -> tuple[int, list[Docstring]]:
    text = path.read_text(encoding="utf-8")
    found = []
    for node in _scopes(ast.parse(text, filename=str(path))):
        body = node.body
        if not (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)):
            continue
        if not isinstance(body[0].value.value, str):
            continue
        expr = body[0]
        kind = "module" if isinstance(node, ast.Module) else "class" if isinstance(node, ast.ClassDef) else "function"
        name = path.stem if isinstance(node, ast.Module) else node.name
        found.append(Docstring(path, name, kind, expr.lineno, expr.end_lineno - expr.lineno + 1))
    return len(text.splitlines()), found


def measure(root: Path = ROOT) -> Stats:
    """Count the source lines and the docstring lines of every ``.py`` file under ``root``."""
    total, docs = 0, []
    for path in sorted(root.rglob("*.py")):
        lines, found = _docstrings(path)
        total += lines
        docs.extend(found)
    return Stats(total, tuple(docs))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", type=Path, default=ROOT)
    parser.add_argument("--top", type=int, default=20, help="list the N longest class and function docstrings")
    parser.add_argument("--by-file", action="store_true", help="also list each file's docstring share")
    args = parser.parse_args(argv)
    stats = measure(args.root)
    print(
        f"{args.root}: {stats.source_lines} lines, {stats.docstring_lines} docstring lines "
        f"({100 * stats.share:.1f} %, limit {100 * MAX_SHARE:.0f} %)"
    )
    print(f"class/function docstrings over {MAX_LINES} lines: {len(stats.over())}")
    longest = sorted((d for d in stats.docstrings if d.kind != "module"), key=lambda d: -d.lines)
    for d in longest[: args.top]:
        print(f"  {d.lines:4d}  {d.path.relative_to(args.root)}:{d.lineno}  {d.name}")
    if args.by_file:
        rows = []
        for path in sorted(args.root.rglob("*.py")):
            lines, found = _docstrings(path)
            doc = sum(d.lines for d in found)
            rows.append((doc, lines, path))
        for doc, lines, path in sorted(rows, key=lambda r: -r[0]):
            print(f"  {doc:5d} / {lines:5d}  {100 * doc / max(lines, 1):5.1f} %  {path.relative_to(args.root)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
