"""The torch release pyproject.toml admits is one that can import rotary.

Older torch cannot be installed here, so the check is by feature: each torch API rotary calls that
is younger than torch itself is named below with the first release that has it, the test reads
that the code still uses it, and pyproject's floor must be at least the newest of them.
"""

import ast
import inspect
import pathlib
import re

import torch

from rotary.kernels import ops

ROOT = pathlib.Path(__file__).resolve().parents[1]

#: what rotary uses -> the first torch release that has it
TORCH_FEATURES = {
    # the custom ops of rotary.kernels.ops take `list[torch.Tensor]`; torch 2.4 to 2.6 infer schemas
    # only from typing.List / typing.Sequence, and fail at `import rotary`
    "torch.library.custom_op inferring a schema from builtin list[torch.Tensor] annotations": (2, 7),
    # ops.py has `from __future__ import annotations`, so every annotation is a string
    "torch.library.custom_op reading string annotations": (2, 5),
    "torch.library.custom_op with register_fake and register_autograd": (2, 4),
    "torch.compiler.is_compiling": (2, 3),
}


def declared_torch_floor() -> tuple[int, int]:
    pyproject = (ROOT / "pyproject.toml").read_text()
    major, minor = re.search(r'"torch>=(\d+)\.(\d+)', pyproject).groups()
    return int(major), int(minor)


def custom_op_annotations(tree: ast.Module) -> list[str]:
    """The parameter annotations, as written, of every function decorated with torch.library.custom_op."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and any(
            "torch.library.custom_op" in ast.unparse(d) for d in node.decorator_list
        ):
            found += [ast.unparse(arg.annotation) for arg in node.args.args if arg.annotation is not None]
    return found


def test_the_features_are_still_used():
    tree = ast.parse(inspect.getsource(ops))
    annotations = custom_op_annotations(tree)
    assert "list[torch.Tensor]" in annotations  # builtin list, not typing.List
    assert any(isinstance(n, ast.ImportFrom) and n.module == "__future__" for n in tree.body)  # strings
    sources = "".join(p.read_text() for p in (ROOT / "src" / "rotary").rglob("*.py"))
    assert "torch.compiler.is_compiling()" in sources and ".register_autograd(" in sources


def test_pyproject_admits_no_torch_older_than_the_features_rotary_uses():
    floor = declared_torch_floor()
    for feature, first in TORCH_FEATURES.items():
        assert floor >= first, (
            f"pyproject.toml admits torch {floor[0]}.{floor[1]}, but {feature} needs torch {first[0]}.{first[1]}"
        )


def test_the_installed_torch_is_not_below_the_floor():
    installed = tuple(int(part) for part in re.match(r"(\d+)\.(\d+)", torch.__version__).groups())
    assert installed >= declared_torch_floor()
