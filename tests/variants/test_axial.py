"""AxialRoPE: the N-D relative property, the block-diagonal N-D oracle, the presets against the models
they reproduce (transformers' Pixtral and Llama 4 vision modules, rotary-embedding-torch, and the
torchtune / DINOv3 / EVA-02 / FLUX / CogVideoX formulas written out here from their code's
conventions), coordinate augmentation, identity rows, the fused kernel, and bad input."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

import rotary
from helpers import forbid_torch_path
from rotary import AxialRoPE
from rotary import positions as P
from rotary.kernels.extension import load_cpu_extension
from rotary.variants import PRESETS, Coordinates, relative_scores
from variant_checks import (
    FLOATS,
    WILD,
    assert_close,
    expect,
    expected_nd,
    is_bool,
    is_int,
    is_number,
    largest_angle,
    tensors,
    to_bhsd,
)

needs_kernel = pytest.mark.skipif(load_cpu_extension() is None, reason="the fused CPU kernel is not built here")


def fp32_angle_bound(max_angle: float) -> float:
    """Largest cos/sin difference from angles formed in fp32 (the references') instead of float64:
    the angle's rounding plus the rounding of the fp32 frequency and of the fp32 result."""
    return 4 * max_angle * 2**-24 + 2**-23


def tables64(rope, coords):
    t = rope.tables(coords)
    return t.cos.double(), t.sin.double()


# ---- the N-D oracle and the relative property (hypothesis) --------------------------------------
@st.composite
def axial_configs(draw):
    axes = draw(st.integers(1, 3))
    pairs = [draw(st.integers(1, 4)) for _ in range(axes)]
    split = tuple(2 * p for p in pairs)
    rotary_dim = sum(split)
    head_dim = rotary_dim + 2 * draw(st.integers(0, 2))
    kwargs = dict(
        split=split,
        rotary_dim=rotary_dim,
        base=draw(st.sampled_from([10.0, 100.0, 10000.0])),
        interleaved=draw(st.booleans()),
        block_order=tuple(draw(st.permutations(range(axes)))),
        max_freq=draw(st.sampled_from([None, None, 8.0])),
    )
    return head_dim, axes, kwargs


@settings(max_examples=25)
@given(config=axial_configs(), seed=st.integers(0, 2**16))
def test_axial_equals_the_block_diagonal_nd_reference(config, seed):
    """The rotation is the float64 block-diagonal N-D matrix of the documented frequencies and pair layout
    (_inv_freq, restated from AxialRoPE's docstring; nothing taken from the module)."""
    head_dim, axes, kwargs = config
    rope = AxialRoPE(head_dim, axes, **kwargs)
    inv_freq = _inv_freq(dict(head_dim=head_dim, axes=axes, **kwargs))
    assert torch.equal(rope.frequencies(), inv_freq)
    g = torch.Generator().manual_seed(seed)
    S = 5
    coords = (torch.rand(S, axes, generator=g, dtype=torch.float64) - 0.5) * 60  # any real coordinates
    identity = torch.rand(S, generator=g) < 0.3
    x = torch.randn(2, 3, S, head_dim, generator=g, dtype=torch.float64)
    got = rope.rotate(x, coords, identity=identity)
    # identity tokens are not rotated: the reference at coordinates 0
    want = rotary.reference.rotate_matrix_nd(
        x, coords.masked_fill(identity[:, None], 0.0), inv_freq, interleaved=kwargs["interleaved"]
    )
    assert float((got - want).abs().max()) < 1e-12
    assert torch.equal(got[:, :, identity], x[:, :, identity])
    # norm preservation, here in float64
    torch.testing.assert_close(got.norm(dim=-1), x.norm(dim=-1), rtol=1e-13, atol=0)


@settings(max_examples=25)
@given(
    preset=st.sampled_from(["torchtune", "pixtral", "dinov3", "eva02", "flux", "cogvideox"]),
    shift=st.lists(st.integers(-1000, 1000), min_size=3, max_size=3),
    seed=st.integers(0, 2**16),
)
def test_scores_depend_only_on_the_offset_per_axis(preset, shift, seed):
    """N-D relative property: moving every token by the same (Δt, Δh, Δw) keeps every score."""
    rope = AxialRoPE.preset(preset, suffix_tokens=0, prefix_tokens=0)
    g = torch.Generator().manual_seed(seed)
    sizes = (2, 3, 4)[3 - rope.axes :]
    coords = rope.grid(*sizes).values
    moved = coords + torch.tensor(shift[: rope.axes], dtype=torch.float64)
    q = torch.randn(1, 2, coords.shape[0], rope.head_dim, generator=g)
    k = torch.randn(1, 2, coords.shape[0], rope.head_dim, generator=g)
    q0, k0 = rope(q, k, coords)
    q1, k1 = rope(q, k, moved)
    scale = float(q.norm(dim=-1).max() * k.norm(dim=-1).max())
    # fp32 tables at coordinates up to ~1000: entries within 2^-24, angles exact in float64
    torch.testing.assert_close(q0 @ k0.transpose(-1, -2), q1 @ k1.transpose(-1, -2), rtol=0, atol=8 * 2**-24 * scale)
    torch.testing.assert_close(q1.norm(dim=-1), q.norm(dim=-1), rtol=4e-7, atol=0)


def test_relative_scores_are_symmetric_in_each_axis_for_equal_content():
    """⟨R(c) q, R(c + Δ) q⟩ = ⟨R(c) q, R(c - Δ) q⟩ (a rotation by Δ and its inverse): the score map is
    point-symmetric about the centre, and its centre is the plain dot product."""
    rope = AxialRoPE.preset("pixtral", 32)
    g = torch.Generator().manual_seed(0)
    v = torch.randn(32, generator=g, dtype=torch.float64)
    s = relative_scores(rope, v, v, 3)
    torch.testing.assert_close(s, s.flip(0).flip(1), rtol=0, atol=1e-12)
    assert abs(float(s[3, 3]) - float(v @ v)) < 1e-12


# ---- the fused kernel ---------------------------------------------------------------------------
@needs_kernel
def test_axial_runs_on_the_fused_kernel(monkeypatch, gen):
    forbid_torch_path(monkeypatch)
    for name in PRESETS:
        rope = AxialRoPE.preset(name)
        coords = rope.grid(*(2, 3, 2)[3 - rope.axes :])
        q = torch.randn(2, 4, coords.seq_len, rope.head_dim, generator=gen, dtype=torch.float64)
        q_rot, k_rot = rope(q, q.clone(), coords)
        want = rotary.reference.rotate_matrix_nd(
            q,
            coords.values.masked_fill(coords.identity[:, None], 0.0) if coords.identity is not None else coords.values,
            rope.inv_freq,
            interleaved=rope.interleaved,
        )
        assert float((q_rot - want).abs().max()) < 1e-12, name
        assert torch.equal(q_rot, k_rot)
        # bf16 and the bshd layout, in place
        x = torch.randn(2, coords.seq_len, 4, rope.head_dim, generator=gen).bfloat16()
        out = rope.rotate(x.clone(), coords, layout="bshd")
        y = x.clone()
        assert rope.rotate(y, coords, layout="bshd", inplace=True) is y and torch.equal(y, out)


# ---- parity: rotary-embedding-torch 0.9.1 -------------------------------------------------------
@pytest.mark.parametrize("sizes", [(4, 5), (3, 4, 5)])
@pytest.mark.parametrize("freqs_for", ["lang", "pixel"])
def test_rotary_embedding_torch_axial_frequencies(sizes, freqs_for):
    from rotary_embedding_torch import RotaryEmbedding, apply_rotary_emb

    A = len(sizes)
    theirs = RotaryEmbedding(dim=16, freqs_for=freqs_for, max_freq=10)
    freqs = theirs.get_axial_freqs(*sizes)  # [*sizes, 16 A]: per axis, pairs (2i, 2i+1)
    ours = AxialRoPE(16 * A, axes=A, interleaved=True, max_freq=10.0 if freqs_for == "pixel" else None)
    if freqs_for == "pixel":  # rotary-embedding-torch spaces pixel coordinates linspace(-1, 1, n)
        axes = [torch.linspace(-1, 1, n, dtype=torch.float64) for n in sizes]
        coords = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, A)
    else:
        coords = ours.grid(*sizes)
    cos, sin = tables64(ours, coords)
    flat = freqs.reshape(-1, 16 * A)
    bound = fp32_angle_bound(float(flat.abs().max()))
    assert float((cos - flat.cos()).abs().max()) <= bound
    assert float((sin - flat.sin()).abs().max()) <= bound
    t = torch.randn(2, 3, *sizes, 16 * A)  # their layout: [B, H, *grid, D]
    want = apply_rotary_emb(freqs, t).reshape(2, 3, -1, 16 * A)
    got = ours.rotate(t.reshape(2, 3, -1, 16 * A), coords)
    assert float((got - want).abs().max()) <= 2 * bound * float(t.abs().max()) + 1e-6


# ---- parity: transformers 5.23 vision rotary embeddings (configs, random weights) -----------------
def test_pixtral_vision_rotary_embedding(gen):
    transformers = pytest.importorskip("transformers")
    from transformers.models.pixtral import modeling_pixtral as mp

    config = transformers.PixtralVisionConfig(hidden_size=128, num_attention_heads=2, image_size=112, patch_size=16)
    hf = mp.PixtralVisionRotaryEmbedding(config)
    ours = AxialRoPE.preset("pixtral", config.head_dim)
    h, w = 5, 7
    coords = ours.grid(h, w)
    position_ids = P.grid(h, w).ids  # the (h, w) pairs PixtralVisionModel builds with meshgrid
    hf_cos, hf_sin = hf(torch.zeros(1), position_ids)
    cos, sin = tables64(ours, coords)
    bound = fp32_angle_bound(max(h, w))
    assert float((cos - hf_cos).abs().max()) <= bound and float((sin - hf_sin).abs().max()) <= bound
    q = torch.randn(1, 2, h * w, 64, generator=gen)
    k = torch.randn(1, 2, h * w, 64, generator=gen)
    want_q, want_k = mp.apply_rotary_pos_emb(q, k, hf_cos, hf_sin, unsqueeze_dim=0)
    got_q, got_k = ours(q, k, coords)
    tol = 2 * bound * float(torch.cat((q, k)).abs().max()) + 1e-6
    assert float((got_q - want_q).abs().max()) <= tol and float((got_k - want_k).abs().max()) <= tol


def test_llama4_vision_rotary_embedding(gen):
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama4 import modeling_llama4 as ml

    config = transformers.Llama4VisionConfig(hidden_size=176, num_attention_heads=2, image_size=84, patch_size=14)
    freqs_ci = ml.Llama4VisionRotaryEmbedding(config).freqs_ci  # [idx² + 1, 1, D/2], CLS last
    head_dim = config.hidden_size // config.num_attention_heads
    ours = AxialRoPE.preset("llama4_vision", head_dim)
    idx = config.image_size // config.patch_size
    coords = ours.grid(idx, idx)  # CLS appended: suffix_tokens=1
    cos, sin = tables64(ours, coords)
    bound = fp32_angle_bound(idx + 1)
    assert float((cos[:, 0::2] - freqs_ci[:, 0].real).abs().max()) <= bound
    assert float((sin[:, 0::2] - freqs_ci[:, 0].imag).abs().max()) <= bound
    assert torch.equal(cos[-1], torch.ones(head_dim)) and torch.equal(sin[-1], torch.zeros(head_dim))
    q = torch.randn(2, idx * idx + 1, 2, head_dim, generator=gen)  # Llama 4 vision attention: [B, S, H, D]
    k = torch.randn(2, idx * idx + 1, 2, head_dim, generator=gen)
    want_q, want_k = ml.vision_apply_rotary_emb(q, k, freqs_ci)
    got_q, got_k = ours(q, k, coords, layout="bshd")
    tol = 2 * bound * float(torch.cat((q, k)).abs().max()) + 1e-6
    assert float((got_q - want_q).abs().max()) <= tol and float((got_k - want_k).abs().max()) <= tol


@pytest.mark.parametrize("hidden_size, heads", [(384, 6), (128, 4)])  # head_dim 64 (ViT-S/16) and 32
def test_dinov3_vit_rope_position_embedding(hidden_size, heads, gen):
    transformers = pytest.importorskip("transformers")
    from transformers.models.dinov3_vit import modeling_dinov3_vit as md

    from rotary.nn import RotaryAttention

    config = transformers.DINOv3ViTConfig(
        hidden_size=hidden_size,
        num_attention_heads=heads,
        patch_size=16,
        image_size=64,
        num_register_tokens=4,
        query_bias=True,
        key_bias=True,
        value_bias=True,
        proj_bias=True,
    )
    config._attn_implementation = "sdpa"
    head_dim, prefix = hidden_size // heads, 1 + config.num_register_tokens  # CLS and the registers come first
    hf = md.DINOv3ViTRopePositionEmbedding(config).eval()  # eval: no coordinate augmentation (random in training)
    ours = AxialRoPE.preset("dinov3", head_dim, base=config.rope_theta, prefix_tokens=prefix)
    # |coordinate| <= 1 and every frequency <= 1 cycle per unit, so |angle| <= 2π: transformers forms the
    # angles in fp32 (ours in float64), which moves cos and sin by at most fp32_angle_bound(2π) ≈ 1.6e-6
    bound = fp32_angle_bound(2 * math.pi)
    for h, w in ((4, 4), (3, 7), (14, 9)):  # the grid follows the image: transformers reads it off pixel_values
        hf_cos, hf_sin = hf(torch.zeros(1, 3, 16 * h, 16 * w))
        coords = ours.grid(h, w)
        cos, sin = tables64(ours, coords)
        assert (
            float((cos[prefix:] - hf_cos).abs().max()) <= bound and float((sin[prefix:] - hf_sin).abs().max()) <= bound
        )
        q = torch.randn(2, heads, prefix + h * w, head_dim, generator=gen)
        k = torch.randn(2, heads, prefix + h * w, head_dim, generator=gen)
        want_q, want_k = md.apply_rotary_pos_emb(q, k, hf_cos, hf_sin)
        got_q, got_k = ours(q, k, coords)
        # each output is x_i cos - x_j sin: the tables' difference times |x_i| + |x_j|, plus the rounding of
        # two products and a sum in each implementation (6 roundings of 2^-24 each, relative to |x_i| + |x_j|)
        tol = 2 * float(torch.cat((q, k)).abs().max()) * (bound + 2**-21)
        assert float((got_q - want_q).abs().max()) <= tol and float((got_k - want_k).abs().max()) <= tol
        assert torch.equal(got_q[:, :, :prefix], q[:, :, :prefix]) and torch.equal(
            want_q[:, :, :prefix], q[:, :, :prefix]
        )

    # the attention layer: DINOv3's weights in RotaryAttention, the preset as its rope, coordinates as position_ids
    hf_attn = md.DINOv3ViTAttention(config).eval()
    attn = RotaryAttention(hidden_size, heads, rope=ours, bias=True, causal=False).eval()
    attn.load_state_dict(hf_attn.state_dict())
    h, w = 5, 6
    x = torch.randn(2, prefix + h * w, hidden_size, generator=gen)
    with torch.no_grad():
        want, _ = hf_attn(x, position_embeddings=hf(torch.zeros(1, 3, 16 * h, 16 * w)))
        got = attn(x, position_ids=ours.grid(h, w))
        # the outputs are below 0.5, where an fp32 ulp is 6e-8: 16 ulps cover the two attention kernels'
        # different summation orders and the ≤ 1.6e-6 relative table differences averaged over the keys
        assert float(want.abs().max()) < 0.5
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
        # and the grid matters: the transposed grid gives another output
        assert not torch.allclose(attn(x, position_ids=ours.grid(w, h)), want, atol=1e-4)


# ---- parity: formulas written out from each model's code conventions ------------------------------
def torchtune_vision_angles(grid: int, head_dim: int, base: float) -> torch.Tensor:
    """torchtune's VisionRotaryPositionalEmbeddings: dim = head_dim // 2 per axis, frequencies
    base^(-2k/dim) (k < dim/2), angles (x+1)θ then (y+1)θ, CLS appended with angle 0; fp32."""
    dim = head_dim // 2
    theta = 1.0 / (base ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
    patch = torch.arange(grid * grid).float()
    x, y = patch % grid, torch.div(patch, grid, rounding_mode="floor")
    angles = torch.cat(((x + 1)[:, None] * theta, (y + 1)[:, None] * theta), dim=-1)
    return torch.cat((angles, torch.zeros(1, angles.shape[-1])))  # [grid² + 1, head_dim / 2], pairs (2i, 2i+1)


@pytest.mark.parametrize("head_dim", [32, 64])
def test_torchtune_vision_formula(head_dim, gen):
    grid = 6
    angles = torchtune_vision_angles(grid, head_dim, 10000.0)
    ours = AxialRoPE.preset("torchtune", head_dim)
    cos, sin = tables64(ours, ours.grid(grid, grid))
    bound = fp32_angle_bound(grid)
    assert float((cos[:, 0::2] - angles.cos()).abs().max()) <= bound
    assert float((sin[:, 0::2] - angles.sin()).abs().max()) <= bound
    # and as a rotation of the paper's interleaved pairs, CLS untouched
    x = torch.randn(1, grid * grid + 1, 3, head_dim, generator=gen)  # torchtune: [b, s, n_h, h_d]
    pairs = x.reshape(*x.shape[:-1], -1, 2)
    c, s = angles.cos()[None, :, None], angles.sin()[None, :, None]
    want = torch.stack((pairs[..., 0] * c - pairs[..., 1] * s, pairs[..., 1] * c + pairs[..., 0] * s), -1).flatten(3)
    got = ours.rotate(x, ours.grid(grid, grid), layout="bshd")
    assert float((got - want).abs().max()) <= 2 * bound * float(x.abs().max()) + 1e-6
    assert torch.equal(got[:, -1], x[:, -1])


class Dinov3Rope:
    """DINOv3's RopePositionEmbedding conventions: periods base^(2k/(D/2)) (k < D/4), coordinates
    (i + 0.5) / n mapped to [-1, 1] ("separate"), training shift / jitter / rescale, angles
    2π c / period with h's block then w's, tiled twice (pairs (i, i + D/2)); fp32. The augmentation
    draws the same generator in the order AxialRoPE.augment documents (shift, jitter, rescale)."""

    def __init__(self, head_dim, base=100.0, shift=None, jitter=None, rescale=None):
        self.periods = base ** (2 * torch.arange(head_dim // 4, dtype=torch.float32) / (head_dim // 2))
        self.shift, self.jitter, self.rescale = shift, jitter, rescale

    def __call__(self, H, W, generator=None):
        coords_h = torch.arange(0.5, H, dtype=torch.float32) / H
        coords_w = torch.arange(0.5, W, dtype=torch.float32) / W
        coords = torch.stack(torch.meshgrid(coords_h, coords_w, indexing="ij"), dim=-1).flatten(0, 1)
        coords = 2.0 * coords - 1.0
        if self.shift is not None:
            coords = (
                coords
                + torch.empty(2, dtype=torch.float64).uniform_(-self.shift, self.shift, generator=generator).float()
            )
        if self.jitter is not None:
            top = math.log(self.jitter)
            coords = coords * torch.empty(2, dtype=torch.float64).uniform_(-top, top, generator=generator).exp().float()
        if self.rescale is not None:
            top = math.log(self.rescale)
            coords = coords * torch.empty(1, dtype=torch.float64).uniform_(-top, top, generator=generator).exp().float()
        angles = 2 * math.pi * coords[:, :, None] / self.periods[None, None, :]
        angles = angles.flatten(1, 2).tile(2)
        return angles.cos(), angles.sin()


def test_dinov3_formula_and_periods():
    ours = AxialRoPE.preset("dinov3", 64)
    # the figure: base 100, head_dim 64 has periods 1.0, 1.3335, 1.7783, ... (100^(k/16))
    assert [round(p, 4) for p in ours.wavelengths[:4].tolist()] == [1.0, 1.3335, 1.7783, 2.3714]
    assert ours.wavelengths[:16].tolist() == ours.wavelengths[16:].tolist()  # h's and w's pairs alike
    ref = Dinov3Rope(64)
    for H, W in ((4, 6), (7, 3)):
        want_cos, want_sin = ref(H, W)
        cos, sin = tables64(ours, ours.grid(H, W, prefix=0))
        bound = fp32_angle_bound(2 * math.pi)
        assert float((cos - want_cos).abs().max()) <= bound and float((sin - want_sin).abs().max()) <= bound
    # CLS and 4 registers first, untouched (the attention rotates only the last H·W tokens)
    with_registers = ours.grid(4, 6, prefix=5)
    cos, sin = tables64(ours, with_registers)
    assert torch.equal(cos[:5], torch.ones(5, 64)) and torch.equal(sin[:5], torch.zeros(5, 64))
    torch.testing.assert_close(cos[5:], tables64(ours, ours.grid(4, 6, prefix=0))[0], rtol=0, atol=0)


def test_dinov3_coordinate_augmentation_in_training_only():
    kw = dict(shift=0.5, jitter=1.5, rescale=2.0)
    ours = AxialRoPE.preset(
        "dinov3", 64, shift_coords=kw["shift"], jitter_coords=kw["jitter"], rescale_coords=kw["rescale"]
    )
    ref = Dinov3Rope(64, **kw)
    coords = ours.grid(4, 5, prefix=1)
    assert ours.training  # modules start in training mode
    got = ours.tables(coords, generator=torch.Generator().manual_seed(7))
    want_cos, want_sin = ref(4, 5, generator=torch.Generator().manual_seed(7))
    bound = fp32_angle_bound(2 * math.pi * 2 * 1.5 * 2.5)
    assert float((got.cos[1:].double() - want_cos).abs().max()) <= bound
    assert float((got.sin[1:].double() - want_sin).abs().max()) <= bound
    assert torch.equal(got.cos[0], torch.ones(64))  # CLS is never augmented into a rotation
    # seeded: reproducible; another seed: other coordinates
    again = ours.tables(coords, generator=torch.Generator().manual_seed(7))
    other = ours.tables(coords, generator=torch.Generator().manual_seed(8))
    assert torch.equal(again.cos, got.cos) and not torch.equal(other.cos, got.cos)
    # the module's own generator and the global one
    seeded = AxialRoPE.preset("dinov3", 64, shift_coords=0.5, generator=torch.Generator().manual_seed(3))
    twin = AxialRoPE.preset("dinov3", 64, shift_coords=0.5, generator=torch.Generator().manual_seed(3))
    assert torch.equal(seeded.tables(coords).cos, twin.tables(coords).cos)
    torch.manual_seed(11)
    first = AxialRoPE.preset("dinov3", 64, shift_coords=0.5).tables(coords).cos
    torch.manual_seed(11)
    assert torch.equal(AxialRoPE.preset("dinov3", 64, shift_coords=0.5).tables(coords).cos, first)
    # eval: off, the plain convention, every call alike
    ours.eval()
    plain = AxialRoPE.preset("dinov3", 64).tables(coords)
    assert torch.equal(ours.tables(coords).cos, plain.cos) and torch.equal(ours.tables(coords).sin, plain.sin)


def test_eva02_interpolates_the_finetune_grid_into_the_pretraining_range(gen):
    """EVA-02's VisionRotaryEmbeddingFast: dim = head_dim // 2 per axis (base^(-2k/dim)), coordinates
    t = arange(ft) / ft * pt, h's block then w's, pairs (2i, 2i+1); CLS first, not rotated."""
    head_dim, pt, ft = 64, 16, 24
    dim = head_dim // 2
    freqs = 1.0 / (10000 ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
    t = torch.arange(ft) / ft * pt
    f = (t[:, None] * freqs).repeat_interleave(2, dim=-1)  # [ft, dim]
    angles = torch.cat((f[:, None, :].expand(ft, ft, dim), f[None, :, :].expand(ft, ft, dim)), dim=-1).reshape(
        ft * ft, head_dim
    )
    ours = AxialRoPE.preset("eva02", head_dim, reference_grid=pt)
    coords = ours.grid(ft, ft)
    assert float(coords.values[1:, 0].max()) < pt  # the largest coordinate stays inside the pre-training grid
    cos, sin = tables64(ours, coords)
    bound = fp32_angle_bound(pt)
    assert torch.equal(cos[0], torch.ones(head_dim))
    assert float((cos[1:] - angles.cos()).abs().max()) <= bound and float((sin[1:] - angles.sin()).abs().max()) <= bound
    # without reference_grid: the fine-tuning grid's own integer coordinates
    assert AxialRoPE.preset("eva02", head_dim).grid(ft, ft).values[-1].tolist() == [ft - 1, ft - 1]


def test_flux_embed_nd_formula():
    """FLUX's EmbedND: axes (16, 56, 56), each its own base^(-2k/c) formed in float64, pairs
    (2i, 2i+1), image ids (0, h, w); text tokens have ids (0, 0, 0): no rotation."""
    ours = AxialRoPE.preset("flux")
    h, w = 3, 5
    ids = torch.zeros(h, w, 3, dtype=torch.float64)
    ids[..., 1] += torch.arange(h)[:, None]
    ids[..., 2] += torch.arange(w)[None, :]
    ids = ids.reshape(-1, 3)
    per_axis = []
    for a, dim in enumerate((16, 56, 56)):
        omega = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
        per_axis.append(ids[:, a : a + 1] * omega)
    angles = torch.cat(per_axis, dim=-1)  # float64 [S, 64]
    cos, sin = tables64(ours, ids)
    assert float((cos[:, 0::2] - angles.cos()).abs().max()) <= 2**-24  # float64 angles: fp32 rounding only
    assert float((sin[:, 0::2] - angles.sin()).abs().max()) <= 2**-24
    assert torch.equal(ours.grid(1, h, w).values, ids)
    text = tables64(ours, torch.zeros(4, 3))
    assert torch.equal(text[0], torch.ones(4, 128)) and torch.equal(text[1], torch.zeros(4, 128))


def test_cogvideox_3d_formula():
    """CogVideoX's get_3d_rotary_pos_embed: t gets D/4 channels, h and w 3D/8 each, each axis
    base^(-2k/c) in fp32, grids arange(t), arange(h), arange(w) (the default crop), pairs (2i, 2i+1)."""
    head_dim, T, H, W = 64, 3, 4, 5
    dims = (head_dim // 4, head_dim // 8 * 3, head_dim // 8 * 3)
    grids = (torch.arange(T).float(), torch.arange(H).float(), torch.arange(W).float())
    per_axis = [g[:, None] * (1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))) for g, d in zip(grids, dims)]
    angles = torch.cat(
        (
            per_axis[0][:, None, None].expand(T, H, W, -1),
            per_axis[1][None, :, None].expand(T, H, W, -1),
            per_axis[2][None, None, :].expand(T, H, W, -1),
        ),
        dim=-1,
    ).reshape(T * H * W, head_dim // 2)
    ours = AxialRoPE.preset("cogvideox", head_dim)
    assert ours.split == (16, 24, 24)
    cos, sin = tables64(ours, ours.grid(T, H, W))
    bound = fp32_angle_bound(W)
    assert (
        float((cos[:, 0::2] - angles.cos()).abs().max()) <= bound
        and float((sin[:, 0::2] - angles.sin()).abs().max()) <= bound
    )


# ---- identity rows, batches, devices, dtypes ------------------------------------------------------
def test_identity_rows_and_per_batch_coordinates(gen):
    rope = AxialRoPE(16, axes=2)
    coords = torch.randint(0, 9, (3, 7, 2))  # [B, S, A]: a different crop per image
    identity = torch.zeros(3, 7, dtype=torch.bool)
    identity[1, 0] = True
    x = torch.randn(3, 2, 7, 16, generator=gen, dtype=torch.float64)
    out = rope.rotate(x, coords, identity=identity)
    assert torch.equal(out[1, :, 0], x[1, :, 0])
    for b in range(3):
        want = rotary.reference.rotate_matrix_nd(
            x[b], coords[b].double().masked_fill(identity[b, :, None], 0.0), rope.inv_freq
        )
        assert float((out[b] - want).abs().max()) < 1e-12
    # integer N-D Positions are accepted as they are
    assert torch.equal(rope.rotate(x[:1], P.from_ids(coords[0], axes=2)), rope.rotate(x[:1], coords[0]))


def test_frequencies_stay_exact_through_dtype_moves_and_the_meta_device():
    rope = AxialRoPE.preset("flux")
    exact = rope.inv_freq.clone()
    rope.to(torch.bfloat16)
    assert rope.inv_freq.dtype == torch.float64 and torch.equal(rope.inv_freq, exact)
    with torch.device("meta"):
        meta = AxialRoPE.preset("flux")
    meta.to_empty(device="cpu")
    assert torch.equal(meta.inv_freq, exact)
    assert rope.state_dict() == {}  # nothing learned, nothing saved


def test_slot_axes_and_presets_table():
    assert AxialRoPE.preset("torchtune", 16).slot_axes == [1, 1, 1, 1, 0, 0, 0, 0]  # x's block first
    assert AxialRoPE.preset("cogvideox", 64).slot_axes == [0] * 8 + [1] * 12 + [2] * 12
    pixtral = AxialRoPE.preset("pixtral", 16)
    full = rotary.frequencies(16).inv_freq
    assert torch.equal(pixtral.inv_freq[0, :4].float(), full[0::2]) and torch.equal(
        pixtral.inv_freq[1, 4:].float(), full[1::2]
    )
    assert set(PRESETS) == {"torchtune", "llama4_vision", "pixtral", "dinov3", "eva02", "flux", "cogvideox"}
    assert all(AxialRoPE.preset(name).rotary_dim == PRESETS[name].head_dim for name in PRESETS)


# ---- bad input: each message says what to change --------------------------------------------------
@pytest.mark.parametrize(
    "make, match",
    [
        (
            lambda: AxialRoPE(64, 2, split=(24, 24)),
            r"split=\(24, 24\) adds up to 48 channels but rotary_dim=64; make the blocks sum to 64",
        ),
        (
            lambda: AxialRoPE(64, 2, split=(33, 31)),
            r"split\[0\]=33: each axis needs a positive even number of channels",
        ),
        (
            lambda: AxialRoPE(64, 3),
            r"rotary_dim=64 does not split into 3 equal blocks.*"
            r"pass split=\(\.\.\.\) with 3 even numbers summing to 64",
        ),
        (lambda: AxialRoPE(64, 2, split=(32, 16, 16)), r"split gives 3 blocks but axes=2"),
        (lambda: AxialRoPE(64, 2, block_order=(0, 0)), r"block_order must be a permutation"),
        (lambda: AxialRoPE(64, coordinates="normalized", grid_offset=1.0), r"normalized coordinates are cell centres"),
        (lambda: AxialRoPE(64, jitter_coords=0.5), r"jitter_coords must be a number >= 1"),
        (lambda: AxialRoPE.preset("flux", 64), r"head_dim must be 128"),
        (lambda: AxialRoPE.preset("sd3"), r"unknown axial preset 'sd3'; presets: torchtune, llama4_vision"),
        (
            lambda: AxialRoPE(64).tables(torch.zeros(10, 3)),
            r"must be \[S, 2\] or \[B, S, 2\].*got shape \(10, 3\); "
            r"give 2 coordinates per token or build the module with axes=3",
        ),
        (
            lambda: AxialRoPE(64, 3, split=(16, 24, 24)).tables(P.grid(3, 4)),
            r"have 2 coordinate axes but this AxialRoPE has axes=3",
        ),
        (lambda: AxialRoPE(64).tables(torch.tensor([[0.0, float("nan")]])), r"NaN or inf.*identity="),
        (lambda: AxialRoPE(64).grid(3), r"grid needs 2 sizes \(one per axis\)"),
        (
            lambda: AxialRoPE(8).rotate(torch.randn(1, 1, 7, 8), AxialRoPE(8).grid(2, 3)),
            r"cover S=6 tokens but x has S=7.*grid\(\.\.\., prefix=, suffix=\)",
        ),
        (
            lambda: AxialRoPE(8).tables(torch.zeros(4, 2), identity=torch.zeros(5, dtype=torch.bool)),
            r"identity has shape \(5,\)",
        ),
        (lambda: AxialRoPE(12, split=(4, 8), axis_slots="alternating"), r"every axis needs as many channels"),
        (lambda: AxialRoPE(8, axis_slots="dealt"), r"axis_slots"),
    ],
)
def test_bad_input_says_what_to_change(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()


def test_alternating_axis_slots_deal_each_axis_its_own_frequencies_in_turn():
    """axis_slots='alternating' (Kimi-K2.5's tower: w, h, w, h, ...): pair 2j is frequency j of block_order[0]'s
    axis, pair 2j + 1 frequency j of the other's; the frequencies are those of the blocks layout, re-dealt."""
    blocks = AxialRoPE(16, block_order=(1, 0))
    dealt = AxialRoPE(16, block_order=(1, 0), axis_slots="alternating")
    assert dealt.slot_axes == [1, 0] * 4
    f_blocks, f_dealt = blocks.frequencies(), dealt.frequencies()
    torch.testing.assert_close(f_dealt[1, 0::2], f_blocks[1, :4], rtol=0, atol=0)
    torch.testing.assert_close(f_dealt[0, 1::2], f_blocks[0, 4:], rtol=0, atol=0)
    assert not f_dealt[0, 0::2].any() and not f_dealt[1, 1::2].any()
    coords = torch.tensor([[2, 5], [3, 1]])
    angles = (coords.double()[:, :, None] * f_dealt[None]).sum(1)  # [S, r/2]
    torch.testing.assert_close(dealt.tables(coords).cos[:, :4], angles.cos().float()[:, :4])


def test_nd_positions_given_to_a_1d_rope_are_an_error():
    with pytest.raises(ValueError, match="positions have 2 coordinate axes but this RoPE is 1-D; use rotary.AxialRoPE"):
        rotary.RoPE(64).tables(P.grid(3, 4))


def test_coordinates_value_is_what_grid_returns():
    c = AxialRoPE(8, axes=3, split=(2, 2, 4)).grid(2, 1, 2, suffix=2)
    assert isinstance(c, Coordinates) and c.values.shape == (6, 3) and c.identity.tolist() == [False] * 4 + [True] * 2


def test_grid_sizes_change_without_a_recompile_under_dynamic_compile():
    """``rope(q, k, rope.grid(h, w))`` compiled with ``dynamic=True`` traces once for every grid of sizes >= 2 (torch
    specialises sizes 0 and 1) and equals eager. The grid cache's lookup, keyed on the sizes, made every size a new
    graph; under compilation the grid is built in the graph (``CoordinateRoPE.grid``, shared by every variant)."""
    from torch._dynamo.testing import CompileCounter

    rope = AxialRoPE(16, coordinates="normalized")
    torch._dynamo.reset()
    counter = CompileCounter()
    step = torch.compile(
        lambda q, h, w: rope(q, q.clone(), rope.grid(h, w, prefix=1))[0], backend=counter, dynamic=True
    )
    for h, w in [(3, 4), (4, 3), (2, 6)]:
        q = torch.randn(1, 2, 13, 16, generator=torch.Generator().manual_seed(h))
        assert torch.equal(step(q, h, w), rope(q, q.clone(), rope.grid(h, w, prefix=1))[0]), (h, w)
    assert counter.frame_count == 1


def _grid_values(sizes, kind, offset=0.0, normalize="separate", reference=None):
    """Grid coordinates restated from CoordinateRoPE's docstring (docs/variants.md), row-major: integer indices
    ``i + offset`` or, with ``reference`` (an int is every axis's), ``(i / n) · reference[a] + offset``; or cell
    centres ``2 (i + 0.5) / m - 1``, ``m`` the axis's size ``n`` ("separate"), the largest or the smallest size."""
    reference = (reference,) * len(sizes) if is_int(reference) else reference
    m = {"separate": None, "max": max(sizes), "min": min(sizes)}[normalize]
    axes = []
    for a, n in enumerate(sizes):
        i = torch.arange(n, dtype=torch.float64)
        if kind == "normalized":
            axes.append(2 * (i + 0.5) / (n if m is None else m) - 1)
        else:
            axes.append((i if reference is None else i / n * reference[a]) + offset)
    return torch.stack(torch.meshgrid(*axes, indexing="ij"), -1).reshape(-1, len(sizes))


def _grid_rows(sizes, a: dict, prefix=None, suffix=None):
    """``grid(*sizes)`` of a module built with keywords ``a``, restated: ``(values, identity)`` with ``prefix`` /
    ``suffix`` (default ``prefix_tokens`` / ``suffix_tokens``) identity rows at 0 before / after the grid."""
    p = a.get("prefix_tokens", 0) if prefix is None else prefix
    q = a.get("suffix_tokens", 0) if suffix is None else suffix
    inner = _grid_values(
        tuple(sizes),
        a.get("coordinates", "grid"),
        a.get("grid_offset", 0.0),
        a.get("normalize_coords", "separate"),
        a.get("reference_grid"),
    )
    values = torch.cat((inner.new_zeros(p, inner.shape[1]), inner, inner.new_zeros(q, inner.shape[1])))
    identity = torch.tensor([True] * p + [False] * inner.shape[0] + [True] * q)
    return values, identity


AXIAL_BAD = {
    "head_dim": [0, -4, 7, "8", 8.0, True, None],  # no upper bound is documented: 2**40 would be allocated
    "axes": [0, -1, True, "2", 2.0, 7],
    "split": [(3, 3), (0, 8), (True, True), "ab", 4, (2.0, 2.0), (2, 2, 2, 2), ()],
    "base": [1e300, 1.0, 0.5, 1e-300, 0.0, -10.0, math.nan, math.inf, "100", True],
    "coordinates": ["pixel", None, 0, ["grid"]],
    "max_freq": [10.0, 1.0, 1e300, 1e-300, 0.0, -1.0, math.nan, "10"],
    "interleaved": ["false", 1, None, 0.0],
    "block_order": [(True, False), (0, 0), 5, (1.0, 0.0), "10"],
    "frequency_scale": [2 * math.pi, 1e300, 1e-300, -1.0, 0.0, math.nan],
    "frequency_dtype": [torch.float64, torch.float16, "float32", None],
    "frequencies": ["alternating", "other", None],
    "grid_offset": [1.0, math.nan, 1e300, -1e300, "1", True],
    "reference_grid": [4, 2.0, True, (0, 3), "ab", (4, 4, 4), [4, 4]],
    "prefix_tokens": [1, 2, -1, 1.0, True],
    "suffix_tokens": [1, 1.0, "1"],
    "normalize_coords": ["max", "min", "avg"],
    "shift_coords": [0.5, -0.5, math.nan],
    "jitter_coords": [0.5, 2.0],
    "rescale_coords": ["2", 2.0],
    "generator": [0, "seed"],
    "nonsense": [1],
}


AXIAL_KEYWORDS = frozenset(
    "head_dim axes split base coordinates max_freq interleaved rotary_dim frequencies block_order axis_slots "
    "frequency_scale frequency_dtype grid_offset reference_grid normalize_coords prefix_tokens suffix_tokens "
    "shift_coords jitter_coords rescale_coords generator".split()
)  # AxialRoPE's keywords and CoordinateRoPE's


def _sizes_ok(sizes, axes: int) -> bool:
    """One positive int per axis, or one int for all (CoordinateRoPE's reference_grid, grid sizes)."""
    if is_int(sizes):
        sizes = (sizes,) * axes
    if not isinstance(sizes, (list, tuple)) or len(sizes) != axes:
        return False
    return all(is_int(n) and n > 0 for n in sizes)


def _axis_frequencies(a: dict, split: tuple, r: int) -> list[torch.Tensor]:
    """Each axis's frequencies as AxialRoPE's docstring states them: formed in ``frequency_dtype``, geometric
    ``1 / base ** (arange(0, c, 2) / c)`` (Hugging Face's form) or ``linspace(1, max_freq / 2, c / 2) · π``; Pixtral's
    "alternating" one geometric set over ``c = r``, axis ``a`` taking ``[a::A]``; then float64 times frequency_scale.
    A max_freq past the dtype's range gives inf (AxialRoPE refuses it, as every non-finite frequency)."""
    base, dtype = a["base"], a.get("frequency_dtype", torch.float32)

    def geometric(c):
        return 1.0 / (base ** (torch.arange(0, c, 2, dtype=torch.int64).to(dtype) / c))

    axes, out = len(split), []
    for axis, c in enumerate(split):
        if a.get("frequencies", "per_axis") == "alternating":
            f = geometric(r)[axis::axes]
        elif a.get("max_freq") is not None:
            top = a["max_freq"] / 2
            past = top > torch.finfo(dtype).max
            f = torch.full((c // 2,), math.inf) if past else torch.linspace(1.0, top, c // 2, dtype=dtype) * math.pi
        else:
            f = geometric(c)
        out.append(f.double() * a.get("frequency_scale", 1.0))
    return out


def _inv_freq(a: dict) -> torch.Tensor:
    """``inv_freq [A, r/2]`` restated from AxialRoPE's docstring for valid keywords ``a``: row ``a`` holds axis ``a``'s
    frequencies on its pairs, 0 elsewhere; the pairs are the axes' blocks in ``block_order`` (default ``0, 1, …``),
    each in its frequencies' order, or with ``axis_slots="alternating"`` pair ``A·j + i`` is frequency ``j`` of
    axis ``block_order[i]``. ``split`` defaults to equal blocks."""
    axes = a.get("axes", 2)
    r = a.get("rotary_dim") or a["head_dim"]
    split = tuple(a.get("split") or (r // axes,) * axes)
    per_axis = _axis_frequencies(a, split, r)
    order = tuple(a.get("block_order") or range(axes))
    want = torch.zeros(axes, r // 2, dtype=torch.float64)
    if a.get("axis_slots", "blocks") == "alternating":
        for i, axis in enumerate(order):
            want[axis, i::axes] = per_axis[axis]
        return want
    start = 0
    for axis in order:
        want[axis, start : start + split[axis] // 2] = per_axis[axis]
        start += split[axis] // 2
    return want


def valid_axial(a: dict) -> bool:
    """AxialRoPE's documented contract (and CoordinateRoPE's for the keywords it passes on)."""
    if set(a) - AXIAL_KEYWORDS:
        return False
    d, axes = a["head_dim"], a.get("axes", 2)
    r = a.get("rotary_dim")
    r = d if r is None else r
    if not (is_int(d) and d > 0 and d % 2 == 0 and is_int(axes) and axes > 0):
        return False
    if not (is_int(r) and 0 < r <= d and r % 2 == 0 and is_bool(a["interleaved"])):
        return False
    kind, offset, grid = a.get("coordinates", "grid"), a.get("grid_offset", 0.0), a.get("reference_grid")
    if kind not in ("grid", "normalized") or not is_number(offset):
        return False
    if kind == "normalized" and (offset or grid is not None):
        return False
    if grid is not None and not _sizes_ok(grid, axes):
        return False
    if a.get("normalize_coords", "separate") not in ("separate", "max", "min"):
        return False
    for name in ("prefix_tokens", "suffix_tokens"):
        if not (is_int(a.get(name, 0)) and a.get(name, 0) >= 0):
            return False
    shift, generator = a.get("shift_coords"), a.get("generator")
    if not (shift is None or (is_number(shift) and shift >= 0)):
        return False
    if any(not (a.get(n) is None or (is_number(a[n]) and a[n] >= 1)) for n in ("jitter_coords", "rescale_coords")):
        return False
    if not (generator is None or isinstance(generator, torch.Generator)):
        return False
    split = a.get("split")
    if split is None:
        if r % (2 * axes):
            return False
        split = (r // axes,) * axes
    if not isinstance(split, (list, tuple)) or len(split) != axes:
        return False
    if not all(type(c) is int and c > 0 and c % 2 == 0 for c in split) or sum(split) != r:
        return False
    base, max_freq, scale = a["base"], a.get("max_freq"), a.get("frequency_scale", 1.0)
    if not (is_number(base) and base > 0 and (max_freq is None or (is_number(max_freq) and max_freq > 0))):
        return False
    frequencies, slots = a.get("frequencies", "per_axis"), a.get("axis_slots", "blocks")
    if frequencies not in ("per_axis", "alternating") or slots not in ("blocks", "alternating"):
        return False
    if (
        (frequencies == "alternating" and max_freq is not None)
        or ("alternating" in (frequencies, slots))
        and (len(set(split)) != 1)
    ):
        return False
    order = a.get("block_order")
    if order is not None and not (
        isinstance(order, (list, tuple)) and all(is_int(i) for i in order) and sorted(order) == list(range(axes))
    ):
        return False
    if not (
        is_number(scale) and scale > 0 and a.get("frequency_dtype", torch.float32) in (torch.float32, torch.float64)
    ):
        return False
    f = torch.cat(_axis_frequencies(a, tuple(split), r))  # every pair must turn at a finite rate > 0
    return bool((torch.isfinite(f) & (f > 0)).all())


@st.composite
def axial_args(draw):
    """Constructor arguments: valid ones, in two draws of three with one or two entries (or an extra keyword) from
    AXIAL_BAD, of which some are valid with the other arguments (valid_axial decides): a third to a half of the
    draws are invalid."""
    a = draw(st.integers(1, 3))
    equal = draw(st.booleans())  # equal blocks in half the draws: the split and dealt pair layouts need them
    split = [2 * draw(st.integers(1, 3))] * a if equal else [2 * draw(st.integers(1, 3)) for _ in range(a)]
    valid = dict(
        head_dim=sum(split) + 2 * draw(st.integers(0, 1)),
        axes=a,
        split=draw(st.sampled_from([tuple(split), tuple(split), None])) if len(set(split)) == 1 else tuple(split),
        rotary_dim=sum(split),
        base=draw(st.sampled_from([10000.0, 100.0, 10.0])),
        coordinates=draw(st.sampled_from(["grid", "grid", "normalized"])),
        max_freq=draw(st.sampled_from([None, None, None, 10.0])),
        interleaved=draw(st.booleans()),
        block_order=tuple(draw(st.permutations(range(a)))),
    )
    # the documented conventions, each drawn valid: grid offsets and scalings, normalizations, Pixtral's and
    # Kimi-K2.5's dealing of equal blocks (the pair layout), the frequencies' precision and scale
    if valid["coordinates"] == "normalized":
        valid["normalize_coords"] = draw(st.sampled_from(["separate", "max", "min"]))
    else:
        valid["grid_offset"] = draw(st.sampled_from([0.0, 0.0, 1.0, -0.5]))
        valid["reference_grid"] = draw(st.sampled_from([None, None, 4, tuple(range(2, 2 + a))]))
    if len(set(split)) == 1:
        valid["axis_slots"] = draw(st.sampled_from(["blocks", "blocks", "alternating"]))
        if valid["max_freq"] is None:
            valid["frequencies"] = draw(st.sampled_from(["per_axis", "per_axis", "alternating"]))
    valid["frequency_dtype"] = draw(st.sampled_from([torch.float32, torch.float32, torch.float64]))
    n = draw(st.sampled_from([0, 0, 1, 1, 1, 2]))
    for name in draw(st.lists(st.sampled_from(sorted(AXIAL_BAD)), min_size=n, max_size=n, unique=True)):
        valid[name] = draw(st.sampled_from(AXIAL_BAD[name]))
    return valid


@st.composite
def axial_positions(draw, rope: AxialRoPE, wild=True):
    """Positions for ``rope``: a grid, explicit coordinates, or (``wild``) something else."""
    kind = draw(st.sampled_from(["grid"] * 4 + ["explicit"] * 3 + ["explicit_batch"] * 2 + ["arbitrary"] * wild))
    a = rope.axes
    if kind == "grid":
        sizes = draw(st.lists(st.integers(1, 3), min_size=a, max_size=a))
        bad = (
            None
            if not wild
            else draw(st.sampled_from([None] * 5 + [(0,) * a, (2,) * (a + 1), (2.0,) * a, ("2",) * a, (True,) * a]))
        )
        prefix = draw(st.sampled_from([None, 0, 1, 2] + [-1, 1.0, True] * wild))
        return "grid", (sizes if bad is None else bad, prefix)
    if kind in ("explicit", "explicit_batch"):
        s = draw(st.integers(0, 5))
        shape = [draw(st.integers(1, 2)), s, a] if kind == "explicit_batch" else [s, a]
        dtype = draw(
            st.sampled_from(
                [torch.int64, torch.int32, torch.float64, torch.float32] + [torch.bfloat16, torch.int16] * wild
            )
        )
        magnitude = draw(st.sampled_from([10, 10, 1e3, 1e6]))
        g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
        values = (torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1) * magnitude
        special = draw(st.sampled_from([None] * 4 + [math.nan, math.inf, -math.inf, 1e300] * wild))
        if special is not None and values.numel() and dtype.is_floating_point:
            values.view(-1)[0] = special  # 1e300 becomes inf in fp32 / bf16
        values = values.to(dtype)
        identity = draw(st.sampled_from([None, None, "some", "all"] + ["int", "wrong"] * wild))
        if identity == "some":
            identity = torch.arange(s) % 2 == 0
        elif identity == "all":
            identity = torch.ones(shape[:-1], dtype=torch.bool)
        elif identity == "int":
            identity = torch.ones(s, dtype=torch.int64)
        elif identity == "wrong":
            identity = torch.zeros(s + 1, dtype=torch.bool)
        return "explicit", (values, identity)
    return "arbitrary", draw(
        st.one_of(
            tensors(max_size=3),
            st.just([[0, 1]]),
            st.just(None),
            st.just(rotary.positions.arange(3)),
            st.just(rotary.positions.grid(2, 2)),
        )
    )


def test_one_axis_positions_are_coordinates_of_a_one_axis_rope():
    """A Positions with 1 axis (ids [S]) is what coordinates() documents for axes=1 (it was refused for its shape)."""
    rope = AxialRoPE(8, axes=1)
    assert rope.coordinates(P.arange(3)).values.tolist() == [[0.0], [1.0], [2.0]]
    assert rope.coordinates(P.from_ids(torch.tensor([[4, 5]]))).values.tolist() == [[[4.0], [5.0]]]


def test_max_freq_past_fp32_is_a_named_error():
    """linspace(1, max_freq / 2) in fp32 raised torch's RuntimeError for max_freq=1e300; float64 forms it."""
    with pytest.raises(ValueError, match=r"max_freq=1e\+300 puts the frequencies"):
        AxialRoPE(8, axes=1, max_freq=1e300)
    assert bool(torch.isfinite(AxialRoPE(8, axes=1, max_freq=1e300, frequency_dtype=torch.float64).inv_freq).all())


def _overlaps(x: torch.Tensor) -> bool:
    """An expanded view: elements shared by several indices (in-place rotation must refuse it)."""
    return x.numel() > 0 and any(stride == 0 and n > 1 for stride, n in zip(x.stride(), x.shape))


@settings(max_examples=100, deadline=None)
@given(wild=WILD, data=st.data())
def test_axial_rope_is_right_or_a_named_error(wild, data):
    """Every draw classified up front (valid_axial, the documented contract); a valid one is checked against an
    oracle that takes nothing from the module: the frequencies and their pairs (_inv_freq), the grid's coordinates
    (_grid_rows) and explicit coordinates as given, rotated by the float64 N-D reference (expected_nd)."""
    args = data.draw(axial_args())
    ok = valid_axial(args)
    rope = expect(ok, AxialRoPE, **args)
    if not ok:
        return
    rope.eval()  # augmentation has its own test
    assert rope.head_dim == args["head_dim"] and rope.interleaved is args["interleaved"]
    inv_freq = _inv_freq(args)
    assert torch.equal(rope.frequencies(), inv_freq), "the frequencies or their axes are not the documented ones"
    a = args["axes"]
    sizes = tuple(range(2, 2 + a))  # every valid module's grid of unequal sizes (normalize_coords tells them apart)
    values, mask = _grid_rows(sizes, args)
    coords = rope.grid(*sizes)
    assert torch.equal(coords.values, values), "the grid's coordinates are not the documented ones"
    assert torch.equal(coords.identity, mask) if bool(mask.any()) else coords.identity is None
    kind, pos = data.draw(axial_positions(rope, wild))
    identity = None
    ok = True  # the positions (and below, q, k and the keywords) as CoordinateRoPE.coordinates / forward document
    if kind == "grid":
        sizes, prefix = pos
        ok = _sizes_ok(tuple(sizes), a) and (prefix is None or (is_int(prefix) and prefix >= 0))
        coords = expect(ok, rope.grid, *sizes, prefix=prefix)
        if not ok:
            return
        values, mask = _grid_rows(sizes, args, prefix)
        assert torch.equal(coords.values, values), "the grid's coordinates are not the documented ones"
        assert torch.equal(coords.identity, mask) if bool(mask.any()) else coords.identity is None
        positions = coords
    elif kind == "explicit":
        positions, identity = pos
        token_shape = tuple(positions.shape[:-1])
        ok = bool(torch.isfinite(positions.double()).all()) and (
            identity is None
            or (identity.dtype == torch.bool and tuple(identity.shape) in (token_shape, token_shape[-1:]))
        )
    else:
        positions = pos
        if isinstance(positions, rotary.positions.Positions):  # arange(3): 1 axis, grid(2, 2): 2 axes
            ok = positions.axes == a
        else:  # a tensor [S, A] / [B, S, A] of numbers (a list or None is not coordinates)
            ok = isinstance(positions, torch.Tensor) and positions.dim() in (2, 3) and positions.shape[-1] == a
            ok = ok and positions.dtype != torch.bool
    seq = data.draw(st.integers(0, 5))
    if isinstance(positions, rotary.variants.Coordinates):
        seq = positions.seq_len
    elif isinstance(positions, torch.Tensor) and positions.dim() >= 2:
        seq = positions.shape[-2]
    layout = data.draw(st.sampled_from(["bhsd", "bshd"] + ["sbhd", 3] * wild))
    heads, batch = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2))
    if isinstance(positions, torch.Tensor) and positions.dim() == 3:
        batch = positions.shape[0] if data.draw(st.booleans()) else batch
    shape = [batch, heads, seq, rope.head_dim] if layout != "bshd" else [batch, seq, heads, rope.head_dim]
    dtype = data.draw(st.sampled_from(FLOATS))
    fitting = tensors(shape=shape, dtype=dtype)
    q = data.draw(st.one_of(fitting, tensors(max_size=3)) if wild else fitting)
    k = data.draw(st.one_of(st.just(q.clone()), fitting, *[tensors(max_size=3)] * wild))
    inplace = data.draw(st.sampled_from([False, True] + ["yes"] * wild))
    q0, k0 = q.clone(), k.clone()
    if isinstance(positions, rotary.positions.Positions):  # ids [S] / [B, S], [S, A] / [B, S, A] with A axes
        batched = positions.ids.dim() == 2 + (positions.axes > 1)
        tokens, rows = positions.ids.shape[int(batched)], positions.ids.shape[0] if batched else None
    elif isinstance(positions, torch.Tensor) and positions.dim() in (2, 3):
        tokens, rows = positions.shape[-2], positions.shape[0] if positions.dim() == 3 else None
    else:
        tokens, rows = seq, None
    # q and k: the shape drawn for the layout (a wild tensor never fits: its last dim is <= 3), one dtype;
    # the positions cover S tokens of batch 1 or B; in place only into tensors that own their memory
    ok = ok and layout in ("bhsd", "bshd") and tokens == seq and rows in (None, 1, batch)
    ok = ok and all(x.shape == tuple(shape) and x.dtype == dtype for x in (q, k))
    ok = ok and is_bool(inplace) and not (inplace and (_overlaps(q) or _overlaps(k)))
    out = expect(ok, rope, q, k, positions, identity=identity, layout=layout, inplace=inplace)
    if not ok:
        return
    # a valid draw: the result must be the rotation at the coordinates as documented (identity rows at 0)
    assert q.is_floating_point() and k.is_floating_point() and layout in ("bhsd", "bshd")
    if kind == "grid":
        values = values.masked_fill(mask.unsqueeze(-1), 0.0)
    elif isinstance(positions, rotary.positions.Positions):  # its ids; 1 axis: ids [..., S] are [..., S, 1]
        values = positions.ids.double() if a > 1 else positions.ids.double().unsqueeze(-1)
    else:  # a tensor of coordinates, as given
        values = positions.double()
    if identity is not None:
        values = values.masked_fill(identity.unsqueeze(-1), 0.0)
    assert bool(torch.isfinite(values).all())
    angle = largest_angle(values, inv_freq)
    for got, x in zip(out, (q0, k0)):
        ref = expected_nd(to_bhsd(x, layout), values, inv_freq, args["interleaved"])
        assert_close(got, to_bhsd(ref, layout) if layout == "bhsd" else ref.transpose(1, 2), x, angle)
    if inplace is True:
        assert out[0] is q


@settings(max_examples=33, deadline=None)  # and the 7 examples below: 40 as before
@given(
    name=st.sampled_from(
        ["torchtune", "llama4_vision", "pixtral", "dinov3", "eva02", "flux", "cogvideox", "nope", ["dinov3"], None, 3]
    ),
    head_dim=st.sampled_from([None, None, 32, 64, 48, 30, 0, -64, 64.0, True, "64", 128]),
    overrides=st.sampled_from(
        [{}, {}, {"prefix_tokens": 2}, {"interleaved": "no"}, {"base": -1.0}, {"axes": 3}, {"bogus": 1}]
    ),
)
# every row of the table at its model's head_dim, whatever the draws
@example(name="torchtune", head_dim=None, overrides={})
@example(name="llama4_vision", head_dim=None, overrides={})
@example(name="pixtral", head_dim=None, overrides={})
@example(name="dinov3", head_dim=None, overrides={})
@example(name="eva02", head_dim=None, overrides={})
@example(name="flux", head_dim=None, overrides={})
@example(name="cogvideox", head_dim=None, overrides={})
def test_axial_presets_are_right_or_a_named_error(name, head_dim, overrides):
    # a preset's name; head_dim (default the preset's) an int > 0 split into the preset's even blocks: D/2 and
    # D/2 (D % 4 == 0), CogVideoX D/4, 3D/8, 3D/8 (D % 16 == 0), FLUX 16, 56, 56 (D = 128); overrides that are
    # AxialRoPE keywords with valid values. axes=3: the 3-axis presets as they are; the 2-axis presets without a
    # block order (x's block first: torchtune, llama4_vision) then need three equal even blocks (D % 6 == 0)
    valid = isinstance(name, str) and name in PRESETS
    if valid:
        d = PRESETS[name].head_dim if head_dim is None else head_dim
        blocks = {"flux": lambda: d == 128, "cogvideox": lambda: d % 16 == 0}.get(name, lambda: d % 4 == 0)
        valid = is_int(d) and d > 0 and blocks()
        if overrides == {"axes": 3} and name not in ("flux", "cogvideox"):
            valid = valid and name not in ("torchtune", "llama4_vision") and d % 6 == 0
        else:
            valid = valid and overrides in ({}, {"prefix_tokens": 2}, {"axes": 3})
    rope = expect(valid, AxialRoPE.preset, name, head_dim, **overrides)
    if not valid:
        return
    rope.eval()
    kw = {**_table_row(name, PRESETS[name].head_dim if head_dim is None else head_dim), **overrides}
    want = _inv_freq(kw)
    assert torch.equal(rope.frequencies(), want), f"{name}: not the frequencies or pair layout of its row"
    a = kw["axes"]
    coords = rope.grid(*([2] * a))
    values, mask = _grid_rows([2] * a, kw)
    assert torch.equal(coords.values, values), f"{name}: not the coordinates of its row"
    q = torch.randn(1, 2, coords.seq_len, kw["head_dim"])
    q_rot = rope.rotate(q, coords)
    values = values.masked_fill(mask.unsqueeze(-1), 0.0)
    want_rot = q.double().numpy()
    for axis in range(a):  # the block-diagonal product, pair by pair: each pair turns with its axis only
        want_rot = rotary.reference.rotate_numpy(want_rot, values[:, axis], want[axis], interleaved=kw["interleaved"])
    assert_close(q_rot, torch.from_numpy(want_rot), q, largest_angle(values, want))


def _table_row(name: str, d: int) -> dict:
    """A row of docs/variants.md's presets table for head_dim ``d``, restated as AxialRoPE keywords (as its
    docstring defines them), not read from PRESETS: channels per axis (``split``, default equal blocks), the block
    first (``block_order``), the frequencies (``base^(-2k/c)`` per block of ``c`` channels is ``base^(-4k/D)`` for
    D/2; Pixtral's one set dealt ``[::2]``, ``[1::2]``; DINOv3's ``2π / period``), coordinates, pairing, and the
    tokens not rotated (CLS appended last: ``suffix_tokens=1``; first: ``prefix_tokens=1``)."""
    common = dict(head_dim=d, axes=2, base=10000.0, interleaved=True)
    rows = {
        "torchtune": dict(block_order=(1, 0), grid_offset=1.0, suffix_tokens=1),
        "llama4_vision": dict(block_order=(1, 0), grid_offset=1.0, suffix_tokens=1),
        "pixtral": dict(frequencies="alternating", interleaved=False),
        "dinov3": dict(
            base=100.0, frequency_scale=2 * math.pi, coordinates="normalized", interleaved=False, prefix_tokens=1
        ),
        "eva02": dict(prefix_tokens=1),
        "flux": dict(axes=3, split=(16, 56, 56), frequency_dtype=torch.float64),
        "cogvideox": dict(axes=3, split=(d // 4, 3 * d // 8, 3 * d // 8)),
    }
    return {**common, **rows[name]}


@settings(max_examples=40, deadline=None)
@given(
    shift=st.sampled_from([None, 0.0, 0.5, 1e300, -0.5, math.nan, "0.5", True]),
    jitter=st.sampled_from([None, 1.0, 1.5, 1e300, 0.5, math.inf, "2"]),
    rescale=st.sampled_from([None, 1.0, 2.0, 1e300, 0.0, -2.0]),
    training=st.booleans(),
    seed=st.integers(0, 2**16),
)
@example(shift=1e300, jitter=1.5, rescale=None, training=True, seed=0)  # valid: coordinates up to 1.5e300, finite
@example(shift=None, jitter=1e300, rescale=1e300, training=True, seed=0)  # the drawn factors decide
@example(shift=1e300, jitter=1e300, rescale=None, training=True, seed=0)  # refused: coordinates past float64's range
@example(shift=1e300, jitter=1e300, rescale=None, training=True, seed=1)  # accepted: a jitter that shrinks them
def test_axial_augmentation_is_finite_or_a_named_error(shift, jitter, rescale, training, seed):
    # valid (AxialRoPE's documented arguments): shift_coords None or a finite number >= 0 (a shift drawn from
    # [-shift, shift]), jitter_coords and rescale_coords None or finite numbers >= 1 (factors drawn log-uniformly
    # from [1/x, x])
    ok = (shift is None or (is_number(shift) and shift >= 0)) and all(
        v is None or (is_number(v) and v >= 1) for v in (jitter, rescale)
    )
    rope = expect(
        ok, AxialRoPE, 16, shift_coords=shift, jitter_coords=jitter, rescale_coords=rescale, coordinates="normalized"
    )
    if rope is None:
        return
    rope.train(training)
    coords = rope.grid(3, 3)
    # the augmented coordinates, restated from docs/variants.md: drawn from the generator in this order, a shift per
    # axis uniform in [-s, s], a factor per axis log-uniform in [1/j, j], one factor for all axes log-uniform in
    # [1/r, r]. The tables are refused only for angles beyond float64's range (AxialRoPE.tables): the largest
    # coordinate times the frequencies summed over the axes
    augmented = training and rope.augments
    values = augmented_coordinates(coords.values, shift, jitter, rescale, seed) if augmented else coords.values
    rate = float(rope.frequencies().abs().sum(-2).amax())
    finite = math.isfinite(float(values.abs().amax()) * rate)
    tables = expect(finite, rope.tables, coords, generator=torch.Generator().manual_seed(seed))
    if tables is None:
        return
    assert bool(torch.isfinite(tables.cos).all() and torch.isfinite(tables.sin).all())
    plain = AxialRoPE(16, coordinates="normalized").tables(Coordinates(values))  # eval: the coordinates as given
    assert torch.equal(tables.cos, plain.cos) and torch.equal(tables.sin, plain.sin)


def augmented_coordinates(values, shift, jitter, rescale, seed):
    """DINOv3's augmentation as docs/variants.md states it, drawn from ``torch.Generator().manual_seed(seed)``."""
    g, axes = torch.Generator().manual_seed(seed), values.shape[-1]
    if shift is not None:
        values = values + torch.empty(axes, dtype=torch.float64).uniform_(-shift, shift, generator=g)
    for factor, n in ((jitter, axes), (rescale, 1)):
        if factor is not None:
            top = math.log(factor)
            values = values * torch.empty(n, dtype=torch.float64).uniform_(-top, top, generator=g).exp()
    return values
