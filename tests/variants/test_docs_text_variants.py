"""docs/variants.md: the examples of the M-RoPE, xPos and p-RoPE/NoPE sections run as written, and the
numbers the text quotes are the library's."""

from __future__ import annotations

import pathlib
import re

import pytest

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "variants.md"
SECTIONS = (
    "## M-RoPE: multimodal RoPE of the vision-language models",
    "## xPos",
    "## p-RoPE and NoPE layers",
)


def section(heading: str) -> str:
    text = DOC.read_text()
    start = text.index(heading + "\n")
    end = text.find("\n## ", start + len(heading))
    return text[start : end if end >= 0 else len(text)]


@pytest.mark.parametrize("heading", SECTIONS)
def test_section_examples_run(heading):
    blocks = re.findall(r"```python\n(.*?)```", section(heading), flags=re.S)
    assert blocks, f"{heading} has no python example"
    for block in blocks:
        exec(compile(block, f"{DOC.name}: {heading}", "exec"), {})


def test_quoted_numbers():
    import math

    from rotary import XPos
    from rotary.analysis import mrope_layout
    from rotary.variants import MRoPE

    text = " ".join(section("## xPos").split())
    assert f"{XPos(64).max_distance:,}" in text and "(35,694 for `γ = 512`)" in text
    # the scales reach 2**14 (fp16's limit, with room for |x| up to ~4) at x = γ · 14 ln 2 / ln 3.5
    assert XPos(64).fp16_max_distance == math.floor(512 * 14 * math.log(2) / math.log(3.5))
    assert f"{XPos(64).fp16_max_distance:,} for `γ = 512`" in text
    spans = mrope_layout(MRoPE(128, mrope_section=[16, 24, 24], base=1e6)).span
    quoted = (
        f"{spans['T'][0]:.1f}–{spans['T'][1]:.0f}, {spans['H'][0]:.0f}–{spans['H'][1]:,.0f} "
        f"and {spans['W'][0]:,.0f}–{spans['W'][1]:,.0f}"
    )
    assert quoted in " ".join(section(SECTIONS[0]).split()), quoted


@pytest.mark.usefixtures("figures_drawn_once")  # drawn once per test process (conftest.py)
def test_rotary_plot_variants_writes_the_figures(tmp_path, capsys):
    import json

    from rotary.tools.cli import main

    assert main(["plot", "variants", "-o", str(tmp_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    names = sorted(pathlib.Path(f).name for f in out["files"])
    assert names == ["mrope.png", "mrope.svg", "nope_layers.png", "nope_layers.svg", "xpos.png", "xpos.svg"]
    assert all((tmp_path / n).stat().st_size > 0 for n in names)
    assert round(out["nope_temperature_at_8191"], 4) == 1.0693 and out["xpos_max_distance"] == 35694
    for name in ("mrope", "xpos", "nope_layers"):  # the docs embed these
        assert f"figures/{name}.png" in DOC.read_text()
