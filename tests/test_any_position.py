"""Any int64 position is rotated, on every device: a row the cached table does not hold is computed.

``RoPE(64)`` caches 2048 rows. With ``position_ids`` on an accelerator the ids are never read on the
host, so the cache cannot grow to cover them: the kernels compute the rows of the positions past it
from the frequencies and the position (the angle in float64, as the cached rows are made). These
tests run that path on the CPU under ``accelerator_rules`` (CPU tensors treated as an accelerator's,
any host read failing), against the float64 reference (``rotary.reference``), and the Triton kernels
under Triton's interpreter in a fresh process.
"""

from __future__ import annotations

import itertools
import textwrap

import pytest
import torch

import rotary
from helpers import accelerator_rules, assert_tables_match, numpy_cos_sin, run_interpreted
from rotary import reference

FP32_EPS = torch.finfo(torch.float32).eps
POSITIONS = (4096, 2**20, 2**31 + 7)


def pair_norms(x: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """Each channel's pair length ``sqrt(a² + b²)`` (float64, x's shape): the scale of its rotation's error."""
    x = x.double()
    a, b = (x[..., 0::2], x[..., 1::2]) if interleaved else x.chunk(2, dim=-1)
    n = (a * a + b * b).sqrt()
    return torch.stack((n, n), dim=-1).flatten(-2) if interleaved else torch.cat((n, n), dim=-1)


def ulps(out: torch.Tensor, x: torch.Tensor, ids: torch.Tensor, rope: rotary.RoPE) -> float:
    """The largest error of ``out`` against the float64 rotation of ``x`` ``[B, H, S, D]`` at ``ids`` ``[S]``,
    in fp32 ulps of each pair's length."""
    want = reference.rotate_complex(x, ids, rope.inv_freq, interleaved=rope.interleaved)
    return float(((out.double() - want).abs() / (FP32_EPS * pair_norms(x, rope.interleaved))).max())


def reference_angle_error(position: int, rope: rotary.RoPE) -> float:
    """The float64 reference's own angle error at ``position``: half an ulp of its largest angle."""
    return float(torch.tensor(position * float(rope.inv_freq.max()), dtype=torch.float64).abs() * 2**-53)


@pytest.mark.parametrize("interleaved", [False, True])
def test_positions_past_the_cache_equal_the_float64_reference_without_a_host_read(interleaved):
    g = torch.Generator().manual_seed(0)
    for start, inplace in itertools.product(POSITIONS, (False, True)):
        rope = rotary.RoPE(64, interleaved=interleaved)  # no prepare(): 2048 cached rows
        q, k = torch.randn(2, 4, 3, 64, generator=g), torch.randn(2, 2, 3, 64, generator=g)
        ids = torch.arange(start, start + 3).expand(2, 3)
        qi, ki = q.clone(), k.clone()
        with accelerator_rules():
            got = rope(qi, ki, position_ids=ids, inplace=inplace)
        assert rope._caches["original"].length == 2048  # nothing grew: the rows were computed
        if inplace:
            assert got[0] is qi and got[1] is ki
        # 2 fp32 ulps of the pair; at 2**31 + 7 the reference's own angle error (its float64 product) adds
        slack = 2 + reference_angle_error(start, rope) / FP32_EPS
        for out, x in zip(got, (q, k)):
            assert not out.isnan().any()
            assert ulps(out, x, ids[0], rope) <= slack, (start, inplace)
        # the CPU computes the same without reading the cache as a 2**31-row table
        assert all(torch.equal(a, b) for a, b in zip(got, rope(q, k, position_ids=ids)))


def test_a_computed_row_is_the_cached_row():
    # the row a kernel computes equals the row the cache holds for that position (the same float64 formula)
    rope = rotary.RoPE(64, max_position=16)
    ids = torch.tensor([3, 100, 5000, 70000])  # 70000: past the cache's 65536-row limit too
    cos, sin = rope.cos_sin(ids)
    with accelerator_rules():
        tables = rope.tables(ids)
        c, s = tables.gather()
    assert tables.cos.shape[0] == 16
    assert torch.equal(c, cos) and torch.equal(s, sin)
    assert_tables_match((cos, sin), numpy_cos_sin(ids, rope.inv_freq))  # and both are NumPy's float64 cos, sin


def test_no_position_gives_nan_and_negative_positions_rotate_by_the_negative_angle():
    rope = rotary.RoPE(64)
    x = torch.randn(1, 2, 6, 64)
    ids = torch.tensor([-(2**62), -5, -1, 2**40, 2**53 + 1, 2**63 - 1])
    for host_read in (True, False):
        if host_read:
            out = rope.rotate(x, position_ids=ids)
        else:
            with accelerator_rules():
                out = rope.rotate(x, position_ids=ids)
        assert not out.isnan().any() and not out.isinf().any()
        # a rotation keeps each pair's length (to fp32 rounding), whatever the angle
        assert torch.allclose(pair_norms(out, False), pair_norms(x, False), rtol=1e-5)
        near = ids[1:3]  # -5 and -1: the float64 angle is exact, the reference's
        assert ulps(out[:, :, 1:3], x[:, :, 1:3], near, rope) <= 2, host_read


def test_rotate_and_cache_rotates_positions_past_the_cache():
    rope = rotary.RoPE(64)
    g = torch.Generator().manual_seed(1)
    for start in POSITIONS:
        q, k, v = (torch.randn(1, 3, h, 64, generator=g) for h in (4, 2, 2))  # [B, S, H, D]
        k_cache, v_cache = torch.zeros(1, 8, 2, 64), torch.zeros(1, 8, 2, 64)
        ids = torch.arange(start, start + 3)[None]
        slots = torch.tensor([[0, 1, 2]])
        with accelerator_rules():
            q_out, k_out = rotary.rotate_and_cache(q, k, v, k_cache, v_cache, slots, rope.tables(ids))
        slack = 2 + reference_angle_error(start, rope) / FP32_EPS
        for out, x in ((q_out, q), (k_out, k)):
            assert ulps(out.transpose(1, 2), x.transpose(1, 2), ids[0], rope) <= slack, start
        assert torch.equal(k_cache[0, :3], k_out[0]) and torch.equal(v_cache[0, :3], v[0])


INTERPRETED = textwrap.dedent(
    """
    import itertools, sys, torch, rotary
    from rotary import reference
    from rotary.kernels.triton import rotate_and_cache_triton, run_triton
    from rotary.kernels import norm
    from rotary.rotation import plan

    eps = torch.finfo(torch.float32).eps

    def pair_norms(x, interleaved):
        x = x.double()
        a, b = (x[..., 0::2], x[..., 1::2]) if interleaved else x.chunk(2, -1)
        n = (a * a + b * b).sqrt()
        return torch.stack((n, n), -1).flatten(-2) if interleaved else torch.cat((n, n), -1)

    def ulps(out, x, ids, rope):  # out, x [B, S, H, D]
        want = reference.rotate_complex(x.transpose(1, 2), ids, rope.inv_freq, interleaved=rope.interleaved)
        return float(((out.transpose(1, 2).double() - want).abs() / (eps * pair_norms(want, rope.interleaved))).max())

    rotary.devices.host_checks = lambda device: False  # as on a GPU: ids never read, the cache as it is
    g = torch.Generator().manual_seed(0)
    checked = 0
    for start, interleaved in itertools.product((4096, 2**20, 2**31 + 7), (False, True)):
        inplace = interleaved  # both pairings, in place and not (the kernel's INPLACE is tested elsewhere)
        rope = rotary.RoPE(64, interleaved=interleaved)
        slack = 2 + start * float(rope.inv_freq.max()) * 2**-53 / eps
        q, k = torch.randn(2, 4, 3, 64, generator=g), torch.randn(2, 2, 3, 64, generator=g)
        ids = torch.arange(start, start + 3).expand(2, 3)
        tables = rope.tables(ids)
        assert tables.cos.shape[0] == 2048 and tables.frequencies is not None
        rotation, _ = plan([q, k], tables, layout="bhsd", kinds=("q", "k"), names=("q", "k"))
        xs = tuple(x.clone() for x in rotation.xs)
        outs = rotation.xs if inplace else tuple(torch.empty_like(x) for x in rotation.xs)
        run_triton(rotation.replace(outs=outs))
        for out, x in zip(outs, xs):
            assert ulps(out, x, ids[0], rope) <= slack, ("rotate", start, interleaved, inplace)
        # the fused rotation and KV-cache write
        v = torch.randn(2, 3, 2, 64, generator=g)
        kc, vc = torch.zeros(2, 5, 2, 64), torch.zeros(2, 5, 2, 64)
        outs = tuple(torch.empty_like(x) for x in xs)
        rotate_and_cache_triton(rotation.replace(xs=xs, outs=outs), v, kc, vc, torch.tensor([[0, 1, 2]] * 2))
        for out, x in zip(outs, xs):
            assert ulps(out, x, ids[0], rope) <= slack, ("cache", start, interleaved)
        assert torch.equal(kc[:, :3], outs[1]) and torch.equal(vc[:, :3], v)
        # the RMSNorm + rotation kernel (unit weights: the rotation of the normalised x)
        rstds = tuple(torch.empty(x.shape[:3]) for x in xs)
        outs = tuple(torch.empty_like(x) for x in xs)
        weights = [torch.ones(64), torch.ones(64)]
        norm.run_triton(rotation.replace(xs=xs, outs=outs), weights, rstds, True, 1e-6)
        for out, x, r in zip(outs, xs, rstds):
            normed = (x.double() * r.double()[..., None]).float()
            assert ulps(out, normed, ids[0], rope) <= slack + 1, ("norm", start, interleaved)
        checked += 1
    # every angle: the kernel's float64 sin/cos against torch's, rounded to fp32 (a rotation of unit pairs
    # reads the row out: 1 * c - 0 * s is c exactly)
    rope = rotary.RoPE(128)
    ids = torch.cat((torch.randint(0, 2**31, (40,), generator=g), torch.tensor([-(2**40), -3, 2**62, 2**63 - 1])))
    x = torch.cat((torch.ones(1, 44, 1, 64), torch.zeros(1, 44, 1, 64)), dim=-1)
    tables = rope.tables(ids)
    rotation, _ = plan([x], tables, layout="bshd", kinds=None, names=("x",))
    out = torch.empty_like(x)
    run_triton(rotation.replace(outs=(out,)))
    cos, sin = rotary.tables.cos_sin_table(ids, rope.inv_freq)
    exact = ids.abs() < 2**31
    got_c, got_s = out[0, :, 0, :64], out[0, :, 0, 64:]
    assert torch.equal(got_c[exact], cos[exact, :64]) and torch.equal(got_s[exact], sin[exact, :64])
    assert got_c.isfinite().all() and got_s.isfinite().all() and (got_c.abs() <= 1).all()
    print("any position ok", checked)
    """
)


@pytest.mark.slow
def test_triton_kernels_compute_the_rows_past_the_cache_under_the_interpreter():
    stdout = run_interpreted(INTERPRETED, timeout=600)
    assert "any position ok 6" in stdout


def test_computed_rows_carry_the_attention_scaling():
    # YaRN scales cos and sin by its attention factor: a computed row is the cached row, scaling included
    rope = rotary.RoPE(64, scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512})
    assert rope.attention_scaling != 1.0
    q, k = torch.randn(1, 4, 3, 64), torch.randn(1, 2, 3, 64)
    for start in (4096, 2**20):
        ids = torch.arange(start, start + 3)
        with accelerator_rules():
            got = rope(q, k, position_ids=ids)
        want = rope(q, k, position_ids=ids)  # the CPU reads the ids: rows of a grown cache, or computed per call
        assert all(torch.equal(a, b) for a, b in zip(got, want)), start


def test_frequencies_that_are_a_strided_view_are_refused_by_name():
    # RotaryTables took frequencies of any strides, and every kernel call with them (general path, plan, rotate or
    # rmsnorm_rotate) then failed in C++ with a bare RuntimeError: the kernels read them as one contiguous row
    rope = rotary.RoPE(64, max_position=32)
    full = rope.tables(torch.arange(32))
    frequencies = rotary.tables.row_frequencies(rope.inv_freq, rope.attention_scaling, "cpu")
    strided = torch.zeros(2 * frequencies.numel(), dtype=torch.float64)[::2]
    strided.copy_(frequencies)
    rows = torch.tensor([[0, 1, 2], [3, 40, 5]])  # 40: past the table, computed from the frequencies
    with pytest.raises(rotary.InputError, match=r"frequencies .*contiguous"):
        rotary.RotaryTables.unchecked(full.cos, full.sin, False, rows=rows, frequencies=strided)
    tables = rotary.RotaryTables.unchecked(full.cos, full.sin, False, rows=rows, frequencies=strided.contiguous())
    q, k = torch.randn(2, 4, 3, 64), torch.randn(2, 2, 3, 64)
    assert torch.equal(rotary.rotate([q, k], tables)[0], rope(q, k, position_ids=rows)[0])
