"""docs/variants.md: the examples of the axial, RoPE-Mixed and learnable-frequency sections run as
written, and the numbers the text quotes are the library's."""

from __future__ import annotations

import pathlib
import re

import pytest
import torch

from rotary import AxialRoPE
from rotary.variants import PRESETS

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "variants.md"
SECTIONS = (
    "## Axial RoPE: images and video",
    "## RoPE-Mixed: learnable 2-D frequencies per head",
    "## Learnable frequencies",
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


def test_presets_table_lists_every_preset():
    rows = re.findall(r"^\| `(\w+)` \|", section(SECTIONS[0]), flags=re.M)
    assert rows == list(PRESETS)


def test_quoted_numbers():
    text = " ".join(section(SECTIONS[0]).split())
    periods = AxialRoPE.preset("dinov3", 64).wavelengths[:4].tolist()
    assert ", ".join(f"{p:.4f}".rstrip("0").rstrip(".") if p != 1 else "1.0" for p in periods) in text
    # "tables within 1.2e-7 of transformers', rotated q, k within 5e-7": the parity tests' cases
    import transformers
    from transformers.models.llama4 import modeling_llama4 as ml
    from transformers.models.pixtral import modeling_pixtral as mp

    from rotary import positions as P

    assert "tables within 1.2e-7 of transformers', rotated q, k within 5e-7" in text
    gen = torch.Generator().manual_seed(1234)
    pixtral = AxialRoPE.preset("pixtral", 64)
    config = transformers.PixtralVisionConfig(hidden_size=128, num_attention_heads=2, image_size=112, patch_size=16)
    hf_cos, hf_sin = mp.PixtralVisionRotaryEmbedding(config)(torch.zeros(1), P.grid(5, 7).ids)
    tables = pixtral.tables(pixtral.grid(5, 7))
    assert max(float((tables.cos - hf_cos).abs().max()), float((tables.sin - hf_sin).abs().max())) <= 1.2e-7
    q, k = torch.randn(1, 2, 35, 64, generator=gen), torch.randn(1, 2, 35, 64, generator=gen)
    want = mp.apply_rotary_pos_emb(q, k, hf_cos, hf_sin, unsqueeze_dim=0)
    got = pixtral(q, k, pixtral.grid(5, 7))
    assert max(float((a - b).abs().max()) for a, b in zip(got, want)) <= 5e-7
    llama = AxialRoPE.preset("llama4_vision", 88)
    config = transformers.Llama4VisionConfig(hidden_size=176, num_attention_heads=2, image_size=84, patch_size=14)
    freqs_ci = ml.Llama4VisionRotaryEmbedding(config).freqs_ci
    tables = llama.tables(llama.grid(6, 6))
    assert float((tables.cos[:, 0::2] - freqs_ci[:, 0].real).abs().max()) <= 1.2e-7
    q, k = torch.randn(2, 37, 2, 88, generator=gen), torch.randn(2, 37, 2, 88, generator=gen)
    want = ml.vision_apply_rotary_emb(q, k, freqs_ci)
    got = llama(q, k, llama.grid(6, 6), layout="bshd")
    assert max(float((a - b).abs().max()) for a, b in zip(got, want)) <= 5e-7


def test_quoted_dinov3_numbers():
    # "agrees with the dinov3 preset's tables within 4.2e-7" and "give its output within 1.2e-7"
    import transformers
    from transformers.models.dinov3_vit import modeling_dinov3_vit as md

    from rotary.nn import RotaryAttention

    text = " ".join(section(SECTIONS[0]).split())
    assert "agrees with the `dinov3` preset's tables within 4.2e-7" in text and "give its output within 1.2e-7" in text
    gen = torch.Generator().manual_seed(1234)
    # the layers' weights come from the global generator: seeded, so the result does not depend on the tests
    # run before in the process (about 1 draw in 15 gives outputs apart by up to 1.1e-7)
    torch.manual_seed(0)
    for hidden_size, heads in ((384, 6), (128, 4)):
        config = transformers.DINOv3ViTConfig(
            hidden_size=hidden_size,
            num_attention_heads=heads,
            patch_size=16,
            num_register_tokens=4,
            query_bias=True,
            key_bias=True,
            value_bias=True,
            proj_bias=True,
        )
        config._attn_implementation = "sdpa"
        hf = md.DINOv3ViTRopePositionEmbedding(config).eval()
        rope = AxialRoPE.preset("dinov3", hidden_size // heads, prefix_tokens=5)
        for h, w in ((4, 4), (3, 7), (14, 9), (32, 32)):
            hf_cos, hf_sin = hf(torch.zeros(1, 3, 16 * h, 16 * w))
            tables = rope.tables(rope.grid(h, w))
            assert (
                max(float((tables.cos[5:] - hf_cos).abs().max()), float((tables.sin[5:] - hf_sin).abs().max()))
                <= 4.2e-7
            )
        hf_attn = md.DINOv3ViTAttention(config).eval()
        attn = RotaryAttention(hidden_size, heads, rope=rope, bias=True, causal=False).eval()
        attn.load_state_dict(hf_attn.state_dict())
        x = torch.randn(2, 5 + 6 * 5, hidden_size, generator=gen)
        with torch.no_grad():
            want, _ = hf_attn(x, position_embeddings=hf(torch.zeros(1, 3, 16 * 6, 16 * 5)))
            assert float((attn(x, position_ids=rope.grid(6, 5)) - want).abs().max()) <= 1.2e-7
