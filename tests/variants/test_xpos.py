"""xPos: the paper's scales, parity with rotary-embedding-torch's ``use_xpos``, relative scores,
KV-cache decoding equal to the full pass, the range guard, causal use only, and the Decoder entry."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rotary
from helpers import forbid_torch_path, hf_frequencies
from rotary import reference
from rotary.kernels import extension
from rotary.kernels.eager import rotate_torch
from rotary.models import POSITION_ENCODINGS, Decoder, DecoderConfig
from rotary.nn import KVCache, RotaryAttention, RotaryLinearAttention
from rotary.variants import XPos, xpos_zeta
from variant_checks import (
    EPS64,
    FLOATS,
    TOL,
    WILD,
    expect,
    is_bool,
    is_int,
    is_number,
    spoiled,
    tensors,
    to_bhsd,
    valid_ids,
)


def xpos_oracle(x: torch.Tensor, positions: list[int], *, scale_base: float, center: int, interleaved: bool, key: bool):
    """The paper's formula in float64: R_n x (the block-diagonal oracle), then pair i times ζ_i^(±(n-c)/γ)."""
    d = x.shape[-1]
    inv_freq = rotary.frequencies(d).inv_freq  # the frequencies are their own stage, tested against transformers
    rotated = reference.rotate_matrix(x, torch.tensor(positions), inv_freq, interleaved=interleaved)
    zeta = np.array([(2 * i + 0.4 * d) / (1.4 * d) for i in range(d // 2)])
    sign = -1.0 if key else 1.0
    scale = np.stack([zeta ** (sign * (n - center) / scale_base) for n in positions])  # [S, d/2]
    per_channel = np.repeat(scale, 2, axis=-1) if interleaved else np.concatenate([scale, scale], axis=-1)
    return rotated * torch.from_numpy(per_channel)


def test_zeta_runs_from_0_285714_to_0_977679_for_d64():
    zeta = xpos_zeta(64)
    assert round(float(zeta[0]), 6) == 0.285714 and round(float(zeta[-1]), 6) == 0.977679
    assert zeta.dtype == torch.float64 and bool((zeta.diff() > 0).all())
    assert torch.equal(XPos(64).zeta, zeta)


@pytest.mark.parametrize("interleaved", [False, True])
def test_matches_the_float64_formula(interleaved, gen):
    xpos = XPos(16, scale_base=32, center=5, interleaved=interleaved)
    positions = [0, 3, 5, 17, 40]
    q, k = (
        torch.randn(2, 1, 5, 16, generator=gen, dtype=torch.float64),
        torch.randn(2, 1, 5, 16, generator=gen, dtype=torch.float64),
    )
    q_rot, k_rot = xpos(q, k, position_ids=torch.tensor(positions))
    for got, x, key in ((q_rot, q, False), (k_rot, k, True)):
        want = xpos_oracle(x, positions, scale_base=32, center=5, interleaved=interleaved, key=key)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("seq_len,head_dim,scale_base", [(16, 64, 512), (37, 32, 8), (128, 64, 64)])
def test_parity_with_rotary_embedding_torch(seq_len, head_dim, scale_base, gen):
    from rotary_embedding_torch import RotaryEmbedding

    q, k = torch.randn(2, 3, seq_len, head_dim, generator=gen), torch.randn(2, 3, seq_len, head_dim, generator=gen)
    theirs = RotaryEmbedding(head_dim, use_xpos=True, xpos_scale_base=scale_base)
    want_q, want_k = theirs.rotate_queries_and_keys(q, k)
    # rotary-embedding-torch centres a call of S tokens at S // 2 and pairs channels (2i, 2i+1)
    xpos = XPos(head_dim, scale_base=scale_base, interleaved=True, center=seq_len // 2)
    got_q, got_k = xpos(q, k)

    # theirs forms the angles n·θ in fp32 (off by up to n·2^-24 rad) and the scales in fp32; ours in
    # float64, rounded once: equal up to those fp32 errors
    def close(got, want):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=float(want.abs().max()) * seq_len * 2.0**-23)

    close(got_q, want_q)
    close(got_k, want_k)
    # and decoding the last tokens against all keys equals their full pass
    last_q = rotary.rotate([q[:, :, -3:]], xpos.tables(torch.arange(seq_len - 3, seq_len)))[0]
    close(last_q, want_q[:, :, -3:])


def test_separate_key_tables_run_on_the_fused_cpu_kernel(monkeypatch, gen):
    assert extension.load_cpu_extension() is not None, extension.cpu_extension_error()
    forbid_torch_path(monkeypatch)  # equal to the torch oracle, and not by falling back to it
    xpos = XPos(32, scale_base=16, center=4)
    ids = torch.tensor([[0, 1, 2, 9], [3, 4, 5, 30]])
    tables = xpos.tables(ids)
    q, k = torch.randn(2, 4, 4, 32, generator=gen), torch.randn(2, 2, 4, 32, generator=gen)
    q_rot, k_rot = rotary.rotate([q, k], tables, kinds=("q", "k"))
    expected_q = rotate_torch(q, tables.cos[:, None], tables.sin[:, None], interleaved=False, inplace=False)
    expected_k = rotate_torch(k, tables.k_cos[:, None], tables.k_sin[:, None], interleaved=False, inplace=False)
    assert torch.equal(q_rot, expected_q) and torch.equal(k_rot, expected_k)
    assert not torch.equal(tables.cos, tables.k_cos)
    # the module's own call, with autograd (forward and backward on the kernel), and in bf16
    q_leaf = q.clone().requires_grad_()
    got_q, got_k = xpos(q_leaf, k, position_ids=ids)
    assert torch.equal(got_q.detach(), expected_q) and torch.equal(got_k, expected_k)
    g = torch.randn(q.shape, generator=gen)  # a dense gradient (an expanded one, from .sum(), has no unit stride)
    got_q.backward(g)
    want_grad = rotate_torch(g, tables.cos[:, None], -tables.sin[:, None], interleaved=False, inplace=False)
    torch.testing.assert_close(q_leaf.grad, want_grad, rtol=1e-6, atol=1e-6)
    low_q, low_k = xpos(q.bfloat16(), k.bfloat16(), position_ids=ids)
    assert low_q.dtype == low_k.dtype == torch.bfloat16
    for got, x, cos, sin in ((low_q, q, tables.cos, tables.sin), (low_k, k, tables.k_cos, tables.k_sin)):
        want = rotate_torch(x.bfloat16(), cos[:, None], sin[:, None], interleaved=False, inplace=False)
        assert torch.equal(got, want)


@settings(max_examples=25)
@given(
    n=st.integers(0, 3000),
    m=st.integers(0, 3000),
    shift=st.integers(0, 20000),
    interleaved=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_scores_are_invariant_to_shifting_both_positions(n, m, shift, interleaved, seed):
    g = torch.Generator().manual_seed(seed)
    xpos = XPos(32, scale_base=512, interleaved=interleaved)
    q, k = (
        torch.randn(1, 1, 1, 32, generator=g, dtype=torch.float64),
        torch.randn(1, 1, 1, 32, generator=g, dtype=torch.float64),
    )

    def score(a: int, b: int) -> float:
        q_rot = rotary.rotate([q], xpos.tables(torch.tensor([a]), dtype=torch.float64))[0]
        k_rot = rotary.rotate([k], xpos.tables(torch.tensor([b]), dtype=torch.float64), kinds=("k",))[0]
        return float((q_rot * k_rot).sum())

    base = score(n, m)
    assert math.isclose(score(n + shift, m + shift), base, rel_tol=1e-9, abs_tol=1e-9 * float(q.norm() * k.norm()))


@settings(max_examples=8)
@given(prefill=st.integers(1, 11), start=st.integers(0, 6000), seed=st.integers(0, 2**16))
def test_kv_cache_decoding_equals_the_full_pass_at_any_offset(prefill, start, seed):
    torch.manual_seed(seed)
    xpos = XPos(8, scale_base=64, center=2000)  # γ = 64: scales from 3.5^(31) down to 3.5^(-70) over these positions
    attn = RotaryAttention(32, 4, num_kv_heads=2, causal=True, rope=xpos).eval()
    x = torch.randn(2, 12, 32)
    ids = torch.arange(start, start + 12).expand(2, 12)
    full = attn(x, position_ids=ids)
    cache = KVCache()
    parts = [attn(x[:, :prefill], position_ids=ids[:, :prefill], cache=cache)]
    parts += [attn(x[:, i : i + 1], cache=cache) for i in range(prefill, 12)]  # positions continue the cache
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=1e-5, atol=1e-5)


def test_range_guard_and_what_happens_at_2_to_the_20():
    xpos = XPos(64)  # γ = 512, centre 1024
    # the largest distance at which every scale is a normal fp32 number: the tables there are finite
    edge = xpos.center + xpos.max_distance
    tables = xpos.tables(torch.tensor([edge]))
    for t in (tables.cos, tables.sin, tables.k_cos, tables.k_sin):
        assert bool(torch.isfinite(t).all())
    assert float(xpos.scales(torch.tensor([edge])).min()) >= 2.0**-126
    with pytest.raises(ValueError, match=r"position .* beyond max_distance=.*larger scale_base"):
        xpos.tables(torch.tensor([edge + 1]))
    with pytest.raises(ValueError, match="beyond max_distance"):
        xpos.tables(torch.tensor([2**20]))
    # uncentred, position 2**20: the query scales underflow to 0 even in float64, the key scales overflow
    scales = XPos(64, center=0).scales(torch.tensor([2**20]))[0]
    assert int((scales == 0).sum()) == 19 and int((scales < 2.0**-126).sum()) == 31
    assert bool(torch.isinf(1 / scales[:19]).all())
    with pytest.raises(ValueError, match="center=40000 is further than max_distance"):
        XPos(64, center=40000)


@pytest.mark.parametrize("layer", [RotaryAttention, RotaryLinearAttention])
def test_bidirectional_attention_is_refused_with_the_reason(layer):
    refused = r"XPos needs causal=True: .*grows exponentially.*keys ahead.*This {} has causal=False: set causal=True"
    refused = refused.format(layer.__name__)
    with pytest.raises(ValueError, match=refused):
        layer(32, 4, causal=False, rope=XPos(8))
    x = torch.randn(1, 5, 32)
    attn = layer(32, 4, causal=True, rope=XPos(8))
    assert attn(x).shape == (1, 5, 32)
    # at forward too: causal and rope are plain attributes a caller can change after construction
    attn.causal = False
    with pytest.raises(ValueError, match=refused):
        attn(x)
    bidirectional = layer(32, 4, causal=False, rope=rotary.RoPE(8))
    assert bidirectional(x).shape == (1, 5, 32)
    bidirectional.rope = XPos(8)
    with pytest.raises(ValueError, match=refused):
        bidirectional(x)


def test_bad_arguments_name_the_value():
    with pytest.raises(ValueError, match="scale_base must be a finite number > 0, got 0"):
        XPos(64, scale_base=0)
    with pytest.raises(ValueError, match="coordinate axes but xPos is 1-D"):
        XPos(8).tables(rotary.positions.grid(2, 2))


def test_decoder_entry_trains_and_generates():
    assert "xpos" in POSITION_ENCODINGS
    torch.manual_seed(0)
    config = DecoderConfig(
        vocab_size=40, hidden_size=32, num_layers=2, num_heads=4, position_encoding="xpos", xpos_scale_base=64
    )
    model = Decoder(config)
    assert isinstance(model.rope, XPos) and all(layer.attn.rope is model.rope for layer in model.layers)
    ids = torch.randint(40, (2, 10))
    loss = model.loss(ids)
    loss.backward()
    assert bool(torch.isfinite(loss)) and model.layers[0].attn.q_proj.weight.grad.abs().sum() > 0
    model.eval()
    cached = model.generate(ids[:, :4], max_new_tokens=6)
    uncached = model.generate(ids[:, :4], max_new_tokens=6, use_cache=False)
    assert torch.equal(cached, uncached)
    with pytest.raises(ValueError, match="xpos' takes no rope_scaling"):
        Decoder(
            DecoderConfig(
                vocab_size=40,
                hidden_size=32,
                num_layers=1,
                position_encoding="xpos",
                rope_scaling={"rope_type": "linear", "factor": 2.0},
            )
        )


def test_score_decay_behind_the_figure():
    from rotary.analysis import measured_decay, xpos_scores

    distances = list(range(0, 4097, 4))
    xpos = xpos_scores(XPos(64), distances)
    rope = measured_decay(rotary.RoPE(64), distances, kind="ones")
    assert xpos[0] == 64.0 and rope[0] == 64.0
    # xPos's envelope keeps falling where RoPE's all-ones score keeps oscillating
    far = slice(len(distances) // 2, None)
    assert float(xpos[far].abs().max()) < float(rope[far].max()) / 2
    assert float(xpos[-256:].abs().max()) < float(xpos[256:512].abs().min())


def _xpos_reference(x_bhsd, pos, spec, key):
    """rotate_complex at ``pos`` times ζ_i^(±(n - c)/γ) on both channels of pair i, float64; ``spec`` holds the
    rotated width, frequencies, centre ``c``, ``γ`` and pairing the test restated from XPos's documentation."""
    r = spec.rotary_dim
    i = torch.arange(r // 2, dtype=torch.float64)
    zeta = (2 * i + 0.4 * r) / (1.4 * r)
    out = torch.empty(x_bhsd.shape, dtype=torch.float64)
    for b in range(x_bhsd.shape[0]):
        p = pos if pos.dim() == 1 else pos[min(b, pos.shape[0] - 1)]
        rot = reference.rotate_complex(x_bhsd[b], p, spec.inv_freq.double(), interleaved=spec.interleaved)
        expo = (p.double() - spec.center) / spec.scale_base
        scale = zeta[None, :] ** (-expo if key else expo)[:, None]  # [S, r/2]
        scale = scale.repeat_interleave(2, -1) if spec.interleaved else torch.cat((scale, scale), -1)
        rot[..., :r] = rot[..., :r] * scale
        out[b] = rot
    return out


def test_no_tokens_are_not_refused_at_any_offset():
    """Zero tokens have no position to be out of range (an offset past max_distance was refused, naming
    the position offset - 1 that no token has)."""
    xpos = XPos(8)
    for dtype in (torch.float32, torch.float16):
        q = torch.randn(1, 2, 0, 8, dtype=dtype)
        q_rot, k_rot = xpos(q, q.clone(), offset=2**40)
        assert q_rot.shape == k_rot.shape == q.shape
    assert xpos.tables(rotary.positions.arange(0, offset=2**40)).cos.shape == (0, 8)


def xpos_limits(scale_base: float) -> tuple[int, int]:
    """XPos's documented ranges: ``max_distance``, the largest ``|n - c|`` whose scales ζ_0^(±(n - c)/γ) stay
    in fp32's normal range (ζ_0 = 0.4 r / 1.4 r = 2/7, 2^-126), and ``fp16_max_distance`` (scales up to 2^14)."""
    per_token = -math.log(2 / 7) / scale_base
    return math.floor(126 * math.log(2) / per_token), math.floor(14 * math.log(2) / per_token)


def valid_xpos(args: dict) -> bool:
    """XPos(head_dim, ...)'s contract: head_dim an even int in (0, 2**16], rotary_dim an even int <= head_dim,
    base a number > 1 whose frequencies base^(-2i/r) are > 0 in fp32, scale_base a finite number > 0,
    interleaved a bool, max_position an int > 0, center an int in [0, max_distance]."""
    d, r = args["head_dim"], args.get("rotary_dim")
    if not (is_int(d) and 0 < d <= 2**16 and d % 2 == 0) or not (
        r is None or (is_int(r) and 0 < r <= d and r % 2 == 0)
    ):
        return False
    r = d if r is None else r
    base, gamma, center = args.get("base", 10000.0), args["scale_base"], args["center"]
    if not (is_number(base) and base > 1 and is_number(gamma) and gamma > 0):
        return False
    if not bool((torch.tensor([float(base) ** (-2 * i / r) for i in range(r // 2)]).float() > 0).all()):
        return False
    max_position = args.get("max_position", 2048)
    if not (is_bool(args["interleaved"]) and is_int(max_position) and max_position > 0):
        return False
    return center is None or (is_int(center) and 0 <= center <= xpos_limits(gamma)[0])


XPOS_BAD = {
    "head_dim": [6, 0, 7, "8", 8.0, 2**40],
    "scale_base": [1e300, 1e-300, 1e-3, 0.0, -1.0, math.nan, math.inf, "512", True],
    "rotary_dim": [4, 3, 0, 10, 4.0],
    "interleaved": ["no", 0],
    "max_position": [64, 0, -1, 2**40, 64.0],
    "center": [0, 30, 10**9, -1, 3.5, True, "0"],
    "base": [1.0, 1e-300, 1e300, math.nan, "10000"],
}


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_xpos_is_right_or_a_named_error(data):
    wild = data.draw(WILD)
    valid = dict(
        head_dim=data.draw(st.sampled_from([8, 16])),
        scale_base=data.draw(st.sampled_from([512.0, 8.0])),
        interleaved=data.draw(st.booleans()),
        center=data.draw(st.sampled_from([None, None, 0, 20])),
    )
    args = spoiled(data.draw, valid, XPOS_BAD) if wild else valid
    ok = valid_xpos(args)
    head_dim = args.pop("head_dim")
    rope = expect(ok, XPos, head_dim, **args)
    if not ok:
        return
    # what the positions are decided and the rotation checked against, restated from XPos's docstring (not read
    # from the module): the centre defaults to max_position // 2, at most max_distance; the frequencies are
    # transformers' default ones over the rotated channels (docs/core.md: bit-identical)
    max_distance, fp16_max_distance = xpos_limits(args["scale_base"])
    center = args["center"] if args["center"] is not None else min(args.get("max_position", 2048) // 2, max_distance)
    r = head_dim if args.get("rotary_dim") is None else args["rotary_dim"]
    inv_freq = hf_frequencies({"rope_type": "default"}, args.get("base", 10000.0), r)[0]
    spec = SimpleNamespace(
        rotary_dim=r, inv_freq=inv_freq, center=center, scale_base=args["scale_base"], interleaved=args["interleaved"]
    )
    assert rope.center == center and 0 <= center <= max_distance
    batch, seq = data.draw(st.integers(1, 2)), data.draw(st.integers(0, 4))
    layout = data.draw(st.sampled_from(["bhsd", "bshd"] + ["bhds"] * wild))
    dtype = data.draw(st.sampled_from(FLOATS))
    shape = [batch, 2, seq, head_dim] if layout != "bshd" else [batch, seq, 2, head_dim]
    q = data.draw(st.one_of(tensors(shape=shape, dtype=dtype), *[tensors(max_size=3)] * wild))
    k = data.draw(tensors(shape=shape, dtype=dtype))
    pos = data.draw(
        st.one_of(
            st.none(),
            st.lists(st.integers(0, 60), min_size=seq, max_size=seq).map(torch.tensor),
            st.just(torch.arange(seq).expand(batch, seq)),
            *[st.lists(st.integers(-2, 2**41), min_size=seq, max_size=seq).map(torch.tensor)] * wild,
            *[st.just(torch.arange(seq, dtype=torch.float32))] * wild,
        )
    )
    offset = data.draw(st.sampled_from([0, 7] + [-1, 2**40, 1.5, True] * wild))
    # valid: q as drawn for the layout (a wild q never fits: its last dim is <= 3), "bhsd"/"bshd", and either
    # an int offset >= 0 or positions [S] / [B or 1, S] (int64/int32, >= 0) with offset 0; every position at
    # most max_distance past the centre, and (float16) at most fp16_max_distance from it on either side
    if pos is None:
        ok = is_int(offset) and offset >= 0
        ids = torch.arange(offset, offset + seq) if ok else None
    else:
        ok = offset == 0 and not isinstance(offset, bool) and valid_ids(pos) and pos.shape[-1] == seq
        ok = ok and (pos.dim() == 1 or pos.shape[0] in (1, batch))
        ids = pos
    ok = ok and q.shape == tuple(shape) and q.dtype == dtype and layout in ("bhsd", "bshd")
    if ok and ids.numel():
        c = center
        ok = int(ids.max()) - c <= max_distance
        if dtype == torch.float16:
            ok = ok and max(int(ids.max()) - c, c - int(ids.min())) <= fp16_max_distance
    out = expect(ok, rope, q, k, position_ids=pos, offset=offset, layout=layout)
    if not ok:
        return
    pos = ids
    for got, x, key in zip(out, (q, k), (False, True)):
        ref = _xpos_reference(to_bhsd(x, layout), pos, spec, key)
        ref = ref if layout == "bhsd" else ref.transpose(1, 2)
        assert bool(torch.isfinite(ref).all())
        # the scales reach 2^±126: compare relative to the reference's magnitude per pair of channels
        rel = (got.double() - ref).abs() / ref.abs().amax(dim=-1, keepdim=True).clamp_min(1e-300)
        angle = float(pos.abs().max()) if pos.numel() else 0.0
        bound = TOL[x.dtype] * 4 + 8 * EPS64 * angle
        assert not rel.numel() or float(rel.max()) <= bound * max(1.0, float(x.double().abs().max()))
