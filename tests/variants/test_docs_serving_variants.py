"""docs/variants.md, "What serving stacks run", and the ntk_alpha section of docs/scaling.md: the examples
run as written, and the numbers the text quotes are the library's."""

from __future__ import annotations

import pathlib
import re

import pytest
import torch

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"
HEADING = "## What serving stacks run: HunYuan's NTK-alpha, LongRoPE's mscale, dual-chunk RoPE, FoPE"


def section(name: str, heading: str, level: str = "\n## ") -> str:
    text = (DOCS / name).read_text()
    start = text.index(heading + "\n")
    end = text.find(level, start + len(heading))
    return text[start : end if end >= 0 else len(text)]


@pytest.mark.parametrize(
    "name, heading, level",
    [
        ("variants.md", HEADING, "\n## "),
        ("scaling.md", "### `ntk_alpha`: HunYuan's NTK with alpha (`alpha`)", "\n### "),
    ],
)
def test_section_examples_run(name, heading, level):
    blocks = re.findall(r"```python\n(.*?)```", section(name, heading, level), flags=re.S)
    assert blocks
    for block in blocks:
        exec(compile(block, f"{name}: {heading}", "exec"), {})


def test_quoted_fp32_angle_error():
    """vLLM's fp32 angles for Qwen2.5-1M's frequencies: the errors the text quotes."""
    text = " ".join(section("variants.md", HEADING).split())
    inv = 1.0 / (1e7 ** (torch.arange(0, 128, 2, dtype=torch.float) / 128))
    for quoted, last in (("0.0078", 262144), ("0.016", 516095)):
        t = torch.arange(last - 4096, last + 1, dtype=torch.float)
        error = (torch.outer(t, inv).double() - torch.outer(t.double(), inv.double())).abs().max().item()
        assert f"{quoted} rad" in text and round(error, len(quoted) - 2) == float(quoted)
    assert "516,095" in text  # the largest inter_critical position: chunk_size + L - 1
    from rotary.variants import DualChunkRoPE

    dc = DualChunkRoPE(128, chunk_size=262144, local_size=8192)
    assert dc.positions(torch.tensor([dc.chunk_len - 1]))["inter_critical"].item() == 516095
