"""The formatter decides the layout: ``ruff format`` skips only data tables laid out by hand (``# fmt: skip``).

``ruff format --check`` and ``ruff check`` (E501 at 120 characters) run in ``make lint``; what they cannot see is
a ``# fmt: skip`` that protects code rather than a table. A marker must close a table: an assignment of a literal
collection or of a call that builds one from keyword values (``dict(...)``, ``frozenset({...})``, hypothesis'
``st.one_of(...)``), or a ``pytest.mark.parametrize`` list.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TABLE_BUILDERS = {"dict", "frozenset", "set", "tuple", "list", "one_of", "sampled_from"}


def _is_table(value: ast.expr | None) -> bool:
    if isinstance(value, (ast.Dict, ast.List, ast.Tuple, ast.Set)):
        return True
    if isinstance(value, ast.Call):
        name = value.func.attr if isinstance(value.func, ast.Attribute) else getattr(value.func, "id", "")
        return name in TABLE_BUILDERS or name == "parametrize"
    return False


def skipped_code(path: Path, root: Path = ROOT) -> list[str]:
    """The ``# fmt: skip`` lines of ``path`` that do not close a table, as ``path:line`` (relative to ``root``)."""
    text = path.read_text()
    marked = {i for i, line in enumerate(text.splitlines(), 1) if line.rstrip().endswith("# fmt: skip")}
    if not marked:
        return []
    tables = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and _is_table(node.value):
            tables.add(node.end_lineno)
        for decorator in getattr(node, "decorator_list", []):
            if _is_table(decorator):
                tables.add(decorator.end_lineno)
    return [f"{path.relative_to(root)}:{line}" for line in sorted(marked - tables)]


def test_fmt_skip_marks_only_data_tables():
    files = [p for d in ("src", "tests", "benchmarks", "scripts") for p in sorted((ROOT / d).rglob("*.py"))]
    assert len(files) > 200  # the walk found the tree
    assert [line for path in files for line in skipped_code(path)] == []


def test_the_check_sees_skipped_code(tmp_path):
    (tmp_path / "m.py").write_text(
        "TABLE = dict(a=1,  b=2)  # fmt: skip\n"
        "x = [o for o in range(3)\n     if o]  # fmt: skip\n"
        "f(1,\n  2)  # fmt: skip\n"
    )
    assert skipped_code(tmp_path / "m.py", tmp_path) == ["m.py:3", "m.py:5"]
