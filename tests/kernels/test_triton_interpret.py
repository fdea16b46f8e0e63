"""The Triton kernels, run on CPU tensors by Triton's interpreter (``TRITON_INTERPRET=1``).

The interpreter must be switched on before Triton is imported, and other tests import it first,
so the check runs in a fresh Python process. Shapes are tiny: the interpreter runs every program
instance in NumPy. Both kernels take the same :class:`~rotary.kernels.contract.Rotation` as the
pure-torch path they are compared with: separate q and k tables, per-head tables, positions,
stacked per-batch tables, conjugation, in place, and the table gradients.
"""

from __future__ import annotations

import textwrap

import pytest

from covering import covering
from helpers import run_interpreted

pytest.importorskip("triton")  # a dev dependency; without it CUDA tensors take the torch path

#: the sizes of the two loops' factors below: every 3 of them in all their combinations (tests/covering.py)
SIZES = [(range(3), range(2), range(2), range(3), range(2), range(3)), (range(2),) * 5]
SCRIPT = textwrap.dedent(
    """
    import itertools, torch
    from covering import covering
    from rotary.kernels.contract import Rotation
    from rotary.kernels.eager import run_torch, table_grad_torch
    from rotary.kernels.triton import run_triton, table_grad_triton
    from rotary.tables import cos_sin_table

    def bf16_truncated(t):
        # the interpreter casts fp32 -> bf16 by truncation (a GPU rounds to nearest even)
        return (t.float().view(torch.int32) & -65536).view(torch.float32).to(torch.bfloat16)

    gen = torch.Generator().manual_seed(0)
    checked = 0
    for dtype, interleaved, r, positions_kind, conjugate, tables_kind in covering(
        (torch.float32, torch.bfloat16, torch.float64), (False, True), (8, 6), ("none", "per_batch", "stacked"),
        (False, True), ("shared", "separate_k", "per_head"),
    ):
        B, S, D, Hq = 2, 2, 8, 2  # b and s take two values each: every offset term is exercised
        Hk = Hq if tables_kind == "per_head" else 1
        base = torch.randn(B, S, Hq + Hk + 2, D, generator=gen).to(dtype)  # a fused qkv: q heads, k heads, 2 v
        q, k = base[:, :, :Hq], base[:, :, Hq : Hq + Hk]  # strided views (GQA unless per head)
        table_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        if tables_kind == "per_head":
            inv = torch.rand(Hq, 1, r // 2, generator=gen) + 0.1
            cos, sin = cos_sin_table(torch.arange(9)[:, None], inv, interleaved=interleaved, dtype=table_dtype)
            k_cos, k_sin = cos, sin
        else:
            inv = torch.rand(r // 2, generator=gen) + 0.1
            cos, sin = cos_sin_table(torch.arange(9), inv, interleaved=interleaved, dtype=table_dtype)
            k_cos, k_sin = (cos * 0.5, sin * 0.5) if tables_kind == "separate_k" else (cos, sin)
        if positions_kind == "none":
            positions, batch_rows = None, 0
        elif positions_kind == "per_batch":
            positions, batch_rows = torch.randint(0, 9, (B, S), generator=gen), 0
        else:  # stacked per-batch tables [B * S, r], row b * S + s
            positions, batch_rows = None, S
        xs = (q, k)
        wide = [x.float() if dtype == torch.bfloat16 else x for x in xs]
        expected = tuple(torch.empty_like(w) for w in wide)
        spec = dict(cos=(cos, k_cos), sin=(sin, k_sin), positions=positions, batch_rows=batch_rows,
                    interleaved=interleaved, conjugate=conjugate)
        run_torch(Rotation(tuple(wide), expected, **spec))
        if dtype == torch.bfloat16:
            expected = tuple(bf16_truncated(e) for e in expected)
        outs = tuple(torch.empty_like(x) for x in xs)
        run_triton(Rotation(xs, outs, **spec))
        for o, e in zip(outs, expected):
            difference = (o.double() - e.double()).abs().max()
            assert torch.equal(o, e), (dtype, interleaved, r, positions_kind, tables_kind, difference)
        # table gradients, per token: against the pure-torch sums (fp32 sums in another order: close, not equal)
        grads = tuple(torch.randn(x.shape, generator=gen).to(dtype) for x in xs)
        want = table_grad_torch(Rotation(xs, xs, **spec), grads)
        buffers = [(torch.empty_like(w[0]), torch.empty_like(w[1])) for w in want]
        table_grad_triton(Rotation(xs, xs, **spec), grads, buffers)
        for (gc, gs), (wc, ws) in zip(buffers, want):
            tol = 1e-12 if dtype == torch.float64 else 1e-5
            assert torch.allclose(gc, wc, atol=tol, rtol=tol) and torch.allclose(gs, ws, atol=tol, rtol=tol), (
                "table grad", dtype, interleaved, r, tables_kind)
        v_before = base[:, :, Hq + Hk :].clone()
        run_triton(Rotation(xs, xs, **spec))  # in place
        for x, e in zip(xs, expected):
            assert torch.equal(x, e), ("in place", dtype, interleaved, r, positions_kind, tables_kind)
        assert torch.equal(base[:, :, Hq + Hk :], v_before)  # v untouched
        checked += 1

    # the table gradients' kernel over several blocks of heads (the last one partial): 5 heads, 2 a block
    import rotary.kernels.triton as tk
    tk.heads_per_program = lambda x, hq, hk: 2
    blocks = 0
    for dtype, interleaved, r, per_head, conjugate in covering(
        (torch.float32, torch.bfloat16), (False, True), (8, 6), (False, True), (False, True)
    ):
        x = torch.randn(2, 2, 5, 8, generator=gen).to(dtype)
        g = torch.randn(2, 2, 5, 8, generator=gen).to(dtype)
        if per_head:
            inv_freq = torch.rand(5, 1, r // 2, generator=gen) + 0.1
            cos, sin = cos_sin_table(torch.arange(4)[:, None], inv_freq, interleaved=interleaved)
        else:
            cos, sin = cos_sin_table(torch.arange(4), torch.rand(r // 2, generator=gen) + 0.1, interleaved=interleaved)
        rotation = Rotation((x,), (x,), (cos,), (sin,), None, 2, interleaved, conjugate)
        want = table_grad_torch(rotation, (g,))
        buffers = [(torch.empty_like(w[0]), torch.empty_like(w[1])) for w in want]
        table_grad_triton(rotation, (g,), buffers)
        for (gc, gs), (wc, ws) in zip(buffers, want):
            assert torch.allclose(gc, wc, atol=1e-5, rtol=1e-5) and torch.allclose(gs, ws, atol=1e-5, rtol=1e-5), (
                "table grad blocks", dtype, interleaved, r, per_head, conjugate,
                (gc - wc).abs().max(), (gs - ws).abs().max())
        blocks += 1
    print("checked", checked, "blocks", blocks)
    """
)


@pytest.mark.slow
def test_triton_kernels_under_interpreter():
    stdout = run_interpreted(SCRIPT, timeout=900)
    assert f"checked {len(covering(*SIZES[0]))} blocks {len(covering(*SIZES[1]))}" in stdout


OUTSIDE = textwrap.dedent(
    """
    import torch
    from rotary import devices
    from rotary.kernels.contract import Rotation
    from rotary.kernels.eager import run_torch
    from rotary.kernels.triton import run_triton
    from rotary.tables import cos_sin_table

    devices.host_checks = lambda device: False  # as on a GPU: the torch path reads no row outside either
    cos, sin = cos_sin_table(torch.arange(5), torch.tensor([1.0, 0.1]))
    x = torch.randn(2, 3, 2, 4, generator=torch.Generator().manual_seed(0))
    k = torch.randn(2, 3, 1, 4, generator=torch.Generator().manual_seed(1))
    positions = torch.tensor([[0, 4, 5], [-1, 2, 100]])  # 5, -1 and 100 are outside the 5-row table
    outside = torch.tensor([[False, False, True], [True, False, True]])
    outs = {}
    for name, run in (("triton", run_triton), ("torch", run_torch)):
        for xs in ((x,), (x, k)):  # q alone, q and k in one launch
            got = tuple(torch.empty_like(t) for t in xs)
            run(Rotation(xs, got, (cos,) * len(xs), (sin,) * len(xs), positions, 0, False))
            for out in got:
                assert torch.isnan(out[outside]).all(), name
                assert not torch.isnan(out[~outside]).any(), name
            outs[name, len(xs)] = got
    for n in (1, 2):
        for a, b in zip(outs["triton", n], outs["torch", n]):
            inside = ~torch.isnan(b)
            assert torch.equal(a[inside], b[inside])
    import rotary.kernels.triton as tk
    launches, real = [], tk._launch
    tk._launch = lambda *args: (launches.append(args[1:]), real(*args))[1]
    v = torch.randn(2, 3, 1, 4)
    run_triton(Rotation((x, k, v), (x.clone(), k.clone(), v.clone()), (cos,) * 3, (sin,) * 3, None, 0, False))
    assert launches == [(0, 1), (2, None)], launches  # q and k in one launch, v in another
    print("outside ok")
    """
)


@pytest.mark.slow
def test_positions_outside_a_caller_s_table_are_nan_on_both_gpu_paths():
    # what the kernels do on a GPU, where positions are never read on the host
    stdout = run_interpreted(OUTSIDE, timeout=300)
    assert "outside ok" in stdout


WIDE = textwrap.dedent(
    """
    import itertools, torch
    import rotary.kernels.triton as tk
    from covering import covering
    from rotary.kernels import norm as K
    from rotary.kernels.contract import Rotation
    from rotary.tables import cos_sin_table

    # the int64 offsets a storage of 2^31 elements or more switches on (WIDE) give the int32 ones' results:
    # every kernel, run both ways on small tensors
    def both(call):
        results = []
        for wide in (False, True):
            tk.wide_offsets = lambda *tensors, wide=wide: wide
            results.append(call())
        return results

    gen = torch.Generator().manual_seed(0)
    checked = 0
    for dtype, interleaved, positions_kind in covering(
        (torch.float32, torch.bfloat16), (False, True), ("none", "per_batch"), strength=2
    ):
        B, S, D, Hq, Hk = 2, 3, 8, 3, 1
        base = torch.randn(B, S, Hq + 2 * Hk, D, generator=gen).to(dtype)
        q, k, v = base[:, :, :Hq], base[:, :, Hq : Hq + Hk], base[:, :, Hq + Hk :]
        inv_freq = torch.rand(3, generator=gen) + 0.1
        cos, sin = cos_sin_table(torch.arange(9), inv_freq, interleaved=interleaved, dtype=torch.float32)
        positions = torch.randint(0, 9, (B, S), generator=gen) if positions_kind == "per_batch" else None
        rotation = Rotation((q, k), (q, k), (cos, cos), (sin, sin), positions, 0, interleaved)

        def rotate():
            outs = (torch.empty_like(q), torch.empty_like(k))
            tk.run_triton(rotation.replace(outs=outs))
            return outs

        def cache():
            outs = (torch.empty_like(q), torch.empty_like(k))
            caches = (torch.zeros(B, 6, Hk, D, dtype=dtype), torch.zeros(B, 6, Hk, D, dtype=dtype))
            slots = torch.tensor([[0, 2, 4], [5, 1, 3]])
            tk.rotate_and_cache_triton(rotation.replace(outs=outs), v, *caches, slots)
            return outs + caches

        def normed():
            outs = (torch.empty_like(q), torch.empty_like(k))
            rstds = (q.new_empty(q.shape[:3], dtype=torch.float32), k.new_empty(k.shape[:3], dtype=torch.float32))
            K.run_triton(rotation.replace(outs=outs), [torch.ones(D), torch.ones(D) * 2], rstds, True, 1e-6)
            return outs + rstds

        def table_grads():
            grads = (torch.randn(q.shape, generator=torch.Generator().manual_seed(1)).to(dtype),)
            buffers = [(torch.empty(B, S, 6), torch.empty(B, S, 6))]
            rotation = Rotation((q,), (q,), (cos[:, :6],), (sin[:, :6],), None, 0, interleaved)
            tk.table_grad_triton(rotation, grads, buffers)
            return buffers[0]

        for call in (rotate, cache, normed, table_grads):
            narrow, wide = both(call)
            same = all(torch.equal(a, b) for a, b in zip(narrow, wide))
            assert same, (call.__name__, dtype, interleaved, positions_kind)
            checked += 1
    print("wide ok", checked)
    """
)


@pytest.mark.slow
def test_int64_offsets_give_the_int32_results():
    stdout = run_interpreted(WIDE, timeout=600)
    # every pair of the three factors (tests/covering.py): 4 rows of 8, each through the 4 kernels
    assert f"wide ok {4 * len(covering(range(2), range(2), range(2), strength=2))}" in stdout


def test_storages_of_2_31_elements_switch_the_kernels_to_int64_offsets():
    import torch

    from rotary.kernels.triton import wide_offsets

    big = torch.empty(2**31, dtype=torch.bfloat16, device="meta")  # no memory: only its size is read
    assert wide_offsets(big) and wide_offsets(torch.ones(2), big[:10])  # a small view of a big storage too
    assert not wide_offsets(torch.empty(2**31 - 1, dtype=torch.bfloat16, device="meta"), torch.ones(3))


OVERFLOW = textwrap.dedent(
    """
    import torch, triton, triton.language as tl

    @triton.jit
    def scale(x_ptr, out_ptr, factor):
        i = tl.arange(0, 4)
        tl.store(out_ptr + i, tl.load(x_ptr + i) * factor)  # int32 * int32

    x = torch.full((4,), 2**20, dtype=torch.int32)
    out = torch.empty_like(x)
    scale[(1,)](x, out, 2**10)  # 2**30: fits
    print("fits", out.tolist())
    try:
        scale[(1,)](x, out, 2**12)  # 2**32: wraps to 0 on a GPU without the check
    except Exception as exc:
        print("refused:", exc)

    @triton.jit
    def shift(x_ptr, out_ptr, by):
        i = tl.arange(0, 4)
        tl.store(out_ptr + i, tl.load(x_ptr + i) - by)  # int32 - int32

    low = torch.tensor([0, -1, -2**31 + 2, 5], dtype=torch.int32)
    shift[(1,)](low, out, 2)  # -2**31: fits
    print("fits", out.tolist())
    try:
        shift[(1,)](low, out, 3)  # one lane below -2**31
    except Exception as exc:
        print("refused:", exc)
    """
)


def test_the_interpreter_refuses_an_int32_overflow():
    """The interpreter server's overflow check (``helpers.check_int_overflow_in_numpy``) fails a kernel whose
    int32 arithmetic overflows, as Triton's compiled check does with ``debug=True``; Triton's own interpreter
    computes the check and never reports it."""
    stdout = run_interpreted(OVERFLOW)
    assert f"fits {[2**30] * 4}" in stdout
    assert f"fits {[-2, -3, -(2**31), 3]}" in stdout
    assert (
        "int32 overflow detected for operation mul" in stdout and "int32 overflow detected for operation sub" in stdout
    )
