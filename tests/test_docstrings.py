"""Docstrings state the contract once: at most 15 % of src lines, and no class or function docstring over 30 lines.

The measure is benchmarks/docstring_stats.py: a docstring's lines run from its expression's first line to
its last, for every module, class and function under src/rotary; module overviews are the one place a design
may take more than 30 lines. ``python benchmarks/docstring_stats.py`` prints the share and the longest.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _stats_module():
    name = "benchmarks_docstring_stats"
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / "docstring_stats.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


stats_module = _stats_module()


@pytest.fixture(scope="module")
def stats():
    return stats_module.measure(ROOT / "src" / "rotary")


def test_no_class_or_function_docstring_is_over_30_lines(stats):
    assert stats.source_lines > 10_000  # the measure found the package, not an empty folder
    long = [f"{d.path.relative_to(ROOT)}:{d.lineno} {d.name} ({d.lines} lines)" for d in stats.over()]
    assert not long, f"docstrings over {stats_module.MAX_LINES} lines (move the design to the module or docs/): {long}"


def test_docstrings_are_at_most_15_percent_of_src(stats):
    assert stats.source_lines > 10_000
    assert stats.share <= stats_module.MAX_SHARE, (
        f"docstrings are {stats.share:.1%} of src/rotary ({stats.docstring_lines} of {stats.source_lines} lines), "
        f"over {stats_module.MAX_SHARE:.0%}: state the contract once and move designs to docs/"
    )


def test_the_measure_counts_what_it_says(tmp_path):
    """A module, class and function docstring are counted from first to last line; a string that is not
    a docstring is not; a long module docstring is exempt from the cap, a long function docstring is not."""
    body = "\n".join(f"    line {i}" for i in range(31))
    (tmp_path / "m.py").write_text(
        f'"""Module.\n\n{body}\n"""\n\nclass C:\n    """One line."""\n\n\n'
        f'def f():\n    """Summary.\n\n{body}\n    """\n    x = """not a docstring"""\n    return x\n'
    )
    measured = stats_module.measure(tmp_path)
    kinds = sorted((d.kind, d.name, d.lines) for d in measured.docstrings)
    assert kinds == [("class", "C", 1), ("function", "f", 34), ("module", "m", 34)]
    assert [d.name for d in measured.over()] == ["f"]
    assert measured.docstring_lines == 69 and measured.share == 69 / measured.source_lines
    assert measured.source_lines == len((tmp_path / "m.py").read_text().splitlines())
