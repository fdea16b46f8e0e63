"""RoPE-Mixed ("Rotary Position Embedding for Vision Transformer", Heo et al., ECCV 2024): the paper's
initialisation, equality with axial RoPE without the random rotation, the rope-vit rotation
convention, per-head tables on the fused kernel with gradients into the frequencies (gradcheck), the
N-D oracle and relative property per head, fp32 through ``.to(bfloat16)``, the meta device."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.func import functional_call

import rotary
from helpers import forbid_torch_path
from rotary import AxialRoPE, RoPEMixed
from rotary.kernels.extension import load_cpu_extension
from rotary.variants import relative_scores
from variant_checks import (
    FLOATS,
    assert_close,
    expect,
    expected_nd,
    is_bool,
    is_int,
    is_number,
    largest_angle,
    spoiled,
    tensors,
    to_bhsd,
)

needs_kernel = pytest.mark.skipif(load_cpu_extension() is None, reason="the fused CPU kernel is not built here")


def test_initialisation_follows_the_paper():
    """Magnitudes 1 / θ^(4k/d) (θ = 10, k < d/4) in two blocks at right angles, one random angle per head."""
    d, H = 32, 6
    mixed = RoPEMixed(d, H, generator=torch.Generator().manual_seed(0))
    f = mixed.inv_freq.detach().double()  # [H, (y, x), d/2]
    magnitude = 1 / (10.0 ** (torch.arange(0, d, 4)[: d // 4].float() / d))  # the paper's expression, fp32
    fy, fx = f[:, 0], f[:, 1]
    first = torch.atan2(fy[:, : d // 4], fx[:, : d // 4])  # the angle of each pair's frequency vector
    second = torch.atan2(fy[:, d // 4 :], fx[:, d // 4 :])
    torch.testing.assert_close(torch.hypot(fx, fy), magnitude.double().repeat(H, 2), rtol=1e-6, atol=0)
    assert float((first - first[:, :1]).abs().max()) < 1e-6  # one angle per head ...
    turn = (second - first + math.pi) % (2 * math.pi) - math.pi
    torch.testing.assert_close(
        turn, torch.full_like(turn, math.pi / 2), rtol=0, atol=1e-6
    )  # ... blocks at right angles
    phis = first[:, 0] % (2 * math.pi)
    assert len(set(phis.round(decimals=4).tolist())) == H  # different per head
    again = RoPEMixed(d, H, generator=torch.Generator().manual_seed(0))
    assert torch.equal(again.inv_freq, mixed.inv_freq)  # seeded
    mixed.reset_parameters(torch.Generator().manual_seed(1))
    assert not torch.equal(again.inv_freq, mixed.inv_freq)
    assert list(mixed.state_dict()) == ["inv_freq"] and mixed.inv_freq.dtype == torch.float32


@pytest.mark.parametrize("interleaved", [False, True])
def test_without_the_random_rotation_it_equals_axial_rope(interleaved, gen):
    mixed = RoPEMixed(32, 4, rotate=False, interleaved=interleaved)
    axial = AxialRoPE(32, 2, base=10.0, block_order=(1, 0), interleaved=interleaved)  # x's block first, like the paper
    coords = axial.grid(5, 6, prefix=1)
    per_head = mixed.tables(coords)
    flat = axial.tables(coords)
    assert per_head.heads == 4 and per_head.cos.shape == (31, 4, 32)
    assert torch.equal(per_head.cos, flat.cos[:, None].expand(31, 4, 32))
    assert torch.equal(per_head.sin, flat.sin[:, None].expand(31, 4, 32))
    q, k = torch.randn(2, 4, 31, 32, generator=gen), torch.randn(2, 4, 31, 32, generator=gen)
    got, want = mixed(q, k, coords), axial(q, k, coords)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_rotation_convention_of_rope_vit(gen):
    """naver-ai/rope-vit's compute_mixed_cis: t_x = i % W, t_y = i // W, angle t_x f_x + t_y f_y per
    head and pair, pairs (2i, 2i+1) as complex numbers; CLS (first) not rotated."""
    H, d, Hg, W = 3, 16, 4, 5
    mixed = RoPEMixed(d, H, interleaved=True, generator=torch.Generator().manual_seed(2))
    freqs_y, freqs_x = mixed.inv_freq.detach()[:, 0], mixed.inv_freq.detach()[:, 1]  # [H, d/2] each
    t = torch.arange(Hg * W).float()
    t_x, t_y = t % W, torch.div(t, W, rounding_mode="floor")
    angles = t_x[None, :, None] * freqs_x[:, None, :] + t_y[None, :, None] * freqs_y[:, None, :]  # [H, N, d/2]
    cis = torch.polar(torch.ones_like(angles), angles)
    q = torch.randn(2, H, 1 + Hg * W, d, generator=gen)
    patches = torch.view_as_complex(q[:, :, 1:].reshape(2, H, Hg * W, d // 2, 2))
    want = torch.cat((q[:, :, :1], torch.view_as_real(patches * cis).flatten(3)), dim=2)
    got = mixed.rotate(q, mixed.grid(Hg, W, prefix=1)).detach()
    bound = 4 * (Hg + W) * 2**-24 + 2**-22  # their fp32 angles against float64 ones, times |q|
    assert float((got - want).abs().max()) <= bound * float(q.abs().max())


@pytest.mark.parametrize("interleaved", [False, True])
def test_equals_the_block_diagonal_nd_reference_per_head(interleaved, gen):
    mixed = RoPEMixed(16, 3, interleaved=interleaved, rotary_dim=12, generator=gen)
    coords = (torch.rand(7, 2, generator=gen, dtype=torch.float64) - 0.5) * 40
    x = torch.randn(2, 3, 7, 16, generator=gen, dtype=torch.float64)
    got = mixed.rotate(x, coords).detach()
    want = rotary.reference.rotate_matrix_nd(x, coords, mixed.inv_freq.detach(), interleaved=interleaved)
    assert float((got - want).abs().max()) < 1e-12
    assert got[..., 12:].equal(x[..., 12:])  # pass-through channels


@settings(max_examples=20)
@given(shift=st.tuples(st.integers(-500, 500), st.integers(-500, 500)), seed=st.integers(0, 2**16))
def test_scores_depend_only_on_the_offset_per_head(shift, seed):
    g = torch.Generator().manual_seed(seed)
    mixed = RoPEMixed(16, 2, generator=g)
    coords = mixed.grid(3, 4).values
    q, k = torch.randn(1, 2, 12, 16, generator=g), torch.randn(1, 2, 12, 16, generator=g)
    q0, k0 = mixed(q, k, coords)
    q1, k1 = mixed(q, k, coords + torch.tensor(shift, dtype=torch.float64))
    scale = float(q.norm(dim=-1).max() * k.norm(dim=-1).max())
    torch.testing.assert_close(q0 @ k0.transpose(-1, -2), q1 @ k1.transpose(-1, -2), rtol=0, atol=8 * 2**-24 * scale)
    torch.testing.assert_close(q1.norm(dim=-1), q.norm(dim=-1), rtol=4e-7, atol=0)


def test_mixed_heads_see_diagonals():
    """What the mixing buys: with a random angle, a head's score map is not separable into an h part
    and a w part (axial RoPE's is, up to the cross terms of q's pairs); here, concretely, the map of a
    rotated head differs from its transpose, while axial RoPE's map of a symmetric query is symmetric."""
    mixed = RoPEMixed(16, 2, generator=torch.Generator().manual_seed(5))
    ones = torch.ones(2, 16)
    s = relative_scores(mixed, ones, ones, 3)  # [H, 7, 7]
    assert float((s - s.transpose(-1, -2)).abs().max()) > 1.0
    axial = relative_scores(RoPEMixed(16, 2, rotate=False), ones, ones, 3)
    assert float((axial - axial.transpose(-1, -2)).abs().max()) < 1e-12


@needs_kernel
def test_gradcheck_of_the_frequencies_through_the_fused_kernel(monkeypatch, gen):
    forbid_torch_path(monkeypatch)
    mixed = RoPEMixed(8, 2, generator=gen)
    coords = mixed.grid(2, 3, prefix=1)
    freq = mixed.inv_freq.detach().double().requires_grad_()
    q = torch.randn(2, 2, 7, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 2, 7, 8, generator=gen, dtype=torch.float64)

    def f(freq, q):
        return functional_call(mixed, {"inv_freq": freq}, (q, k, coords))

    assert torch.autograd.gradcheck(f, (freq, q))
    # against the gradient of the rotation written in plain torch ops (pairs (i, i + r/2))
    g = tuple(torch.randn(2, 2, 7, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    values = coords.values.masked_fill(coords.identity[:, None], 0.0)

    def oracle(freq, q):
        angle = torch.einsum("sa,haj->hsj", values, freq)  # [H, S, r/2]
        c, s = angle.cos(), angle.sin()
        return tuple(torch.cat((x[..., :4] * c - x[..., 4:] * s, x[..., 4:] * c + x[..., :4] * s), -1) for x in (q, k))

    got = torch.autograd.grad(f(freq, q), (freq, q), g)
    want = torch.autograd.grad(oracle(freq, q), (freq, q), g)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@needs_kernel
def test_trains_on_the_fused_kernel_and_keeps_fp32(monkeypatch, gen):
    forbid_torch_path(monkeypatch)
    mixed = RoPEMixed(16, 2, prefix_tokens=1, generator=gen)
    model = torch.nn.ModuleDict({"proj": torch.nn.Linear(16, 16), "rope": mixed})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    start = mixed.inv_freq.detach().clone()
    x = torch.randn(3, 2, 1 + 12, 16, generator=gen)
    coords = mixed.grid(3, 4)
    for _ in range(3):
        q, k = mixed(model["proj"](x), x, coords)
        loss = (q * k).sum(-1).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert mixed.inv_freq.grad is not None and not torch.equal(mixed.inv_freq, start)
    learned = mixed.inv_freq.detach().clone()
    model.to(torch.bfloat16)
    assert model["proj"].weight.dtype == torch.bfloat16
    assert mixed.inv_freq.dtype == torch.float32 and torch.equal(mixed.inv_freq, learned)


def test_meta_device_then_reset_or_load():
    trained = RoPEMixed(16, 2, generator=torch.Generator().manual_seed(0))
    with torch.device("meta"):
        mixed = RoPEMixed(16, 2)
    assert mixed.inv_freq.is_meta
    mixed.to_empty(device="cpu")
    mixed.load_state_dict(trained.state_dict())
    q = torch.randn(1, 2, 6, 16)
    assert torch.equal(mixed.rotate(q, mixed.grid(2, 3)), trained.rotate(q, trained.grid(2, 3)))
    mixed.reset_parameters(torch.Generator().manual_seed(0))
    assert torch.equal(mixed.inv_freq, trained.inv_freq)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: RoPEMixed(18, 2), r"rotary_dim divisible by 4.*rotary_dim=18"),
        (lambda: RoPEMixed(16, 0), r"num_heads must be a positive int, got 0"),
        (
            lambda: RoPEMixed(16, 2).rotate(torch.randn(1, 3, 6, 16), RoPEMixed(16, 2).grid(2, 3)),
            r"x has 3 heads but the per-head tables were built for 2",
        ),
        (lambda: RoPEMixed(16, 2).tables(torch.zeros(6, 3)), r"\[S, 2\] or \[B, S, 2\].*got shape \(6, 3\)"),
    ],
)
def test_bad_input_says_what_to_change(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()


MIXED_BAD = {
    "head_dim": [12, 6, 0, 7, "8", 8.0],
    "num_heads": [0, -1, "2", 2.0, True],
    "base": [1e300, 1.0, 0.5, 1e-300, -1.0, math.nan, "10"],
    "rotate": ["yes", 1],
    "interleaved": ["true", None],
    "rotary_dim": [4, 2, 6, 0, 100],
    "prefix_tokens": [-1, 1.0],
    "axes": [3],
}


def valid_mixed(args: dict) -> bool:
    """RoPEMixed's documented contract: an even head_dim, a rotary_dim (default head_dim) that is even,
    <= head_dim and a multiple of 4, num_heads an int > 0, base a number > 0 whose magnitudes
    1 / base^(4k/r) (k < r/4) are finite and > 0 in fp32, booleans, prefix_tokens an int >= 0, and no axes
    (RoPE-Mixed is 2-D)."""
    d, r = args["head_dim"], args.get("rotary_dim")
    if not (is_int(d) and d > 0 and d % 2 == 0) or not (r is None or (is_int(r) and 0 < r <= d and r % 2 == 0)):
        return False
    r = d if r is None else r
    base, heads = args["base"], args["num_heads"]
    if r % 4 or not (is_int(heads) and heads > 0) or not (is_number(base) and base > 0):
        return False
    magnitudes = torch.tensor([float(base) ** (-4 * k / r) for k in range(r // 4)], dtype=torch.float64).float()
    return (
        bool((torch.isfinite(magnitudes) & (magnitudes > 0)).all())
        and is_bool(args["rotate"])
        and is_bool(args["interleaved"])
        and is_int(args.get("prefix_tokens", 0))
        and args.get("prefix_tokens", 0) >= 0
        and "axes" not in args
    )


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_rope_mixed_is_right_or_a_named_error(data):
    valid = dict(
        head_dim=data.draw(st.sampled_from([8, 16])),
        num_heads=data.draw(st.integers(1, 3)),
        base=data.draw(st.sampled_from([10.0, 100.0])),
        rotate=data.draw(st.booleans()),
        interleaved=data.draw(st.booleans()),
    )
    args = spoiled(data.draw, valid, MIXED_BAD)
    ok = valid_mixed(args)
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    head_dim, num_heads = args.pop("head_dim"), args.pop("num_heads")
    rope = expect(ok, RoPEMixed, head_dim, num_heads, generator=g, **args)
    if not ok:
        return
    rope.eval()
    inv_freq = rope.frequencies()
    r = head_dim if args.get("rotary_dim") is None else args["rotary_dim"]
    assert inv_freq.shape == (num_heads, 2, r // 2) and bool(torch.isfinite(inv_freq).all())
    # the paper's initial frequencies (docs/variants.md): per head, magnitudes base^(-4k/r) (k < r/4) in two blocks
    # at right angles (a random angle per head, or none with rotate=False)
    f = inv_freq.detach().double()
    magnitudes = torch.tensor([float(args["base"]) ** (-4 * j / r) for j in range(r // 4)], dtype=torch.float64)
    torch.testing.assert_close(f.norm(dim=1), magnitudes.repeat(2).expand(num_heads, -1), rtol=1e-6, atol=0)
    assert float((f[:, :, : r // 4] * f[:, :, r // 4 :]).sum(1).abs().max()) <= 1e-6
    h, w = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
    prefix = data.draw(st.sampled_from([0, 1]))
    coords = rope.grid(h, w, prefix=prefix)
    # the grid, restated (AxialRoPE.grid's docstring): prefix identity tokens, then (y, x) row-major
    grid = [[0.0, 0.0]] * prefix + [[float(y), float(x)] for y in range(h) for x in range(w)]
    assert coords.values.tolist() == grid and (prefix == 0 or coords.identity.tolist() == [True] + [False] * h * w)
    layout = data.draw(st.sampled_from(["bhsd", "bshd"]))
    kv_heads = data.draw(st.sampled_from([num_heads, num_heads, 1, num_heads + 1]))
    dtype = data.draw(st.sampled_from(FLOATS))
    s, d = coords.seq_len, rope.head_dim
    q = data.draw(tensors(shape=[2, num_heads, s, d] if layout == "bhsd" else [2, s, num_heads, d], dtype=dtype))
    k = data.draw(tensors(shape=[2, kv_heads, s, d] if layout == "bhsd" else [2, s, kv_heads, d], dtype=dtype))
    # the tables are per head: q and k must both have num_heads heads
    out = expect(kv_heads == num_heads, rope, q, k, coords, layout=layout)
    if out is None:
        return
    values = torch.tensor(grid, dtype=torch.float64)  # identity tokens at 0: not turned
    angle = largest_angle(values, inv_freq)
    for got, x in zip(out, (q, k)):
        ref = expected_nd(to_bhsd(x, layout), values, inv_freq, args["interleaved"])
        assert_close(got, ref if layout == "bhsd" else ref.transpose(1, 2), x, angle)
