"""The Triton kernel, run on CPU tensors by Triton's interpreter (``TRITON_INTERPRET=1``).

The interpreter must be switched on before Triton is imported, and other tests import it first,
so the check runs in a fresh Python process. Shapes are tiny: the interpreter runs every program
instance in NumPy.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")  # a dev dependency; without it CUDA tensors take the torch path

SCRIPT = textwrap.dedent(
    """
    import itertools, torch
    from rotary.kernels.triton import rotate_triton
    from rotary.kernels.eager import rotate_rows_torch
    from rotary.tables import cos_sin_table

    def bf16_truncated(t):
        # the interpreter casts fp32 -> bf16 by truncation (a GPU rounds to nearest even)
        return (t.float().view(torch.int32) & -65536).view(torch.float32).to(torch.bfloat16)

    gen = torch.Generator().manual_seed(0)
    checked = 0
    for dtype, interleaved, r, positions_kind, conjugate in itertools.product(
        (torch.float32, torch.bfloat16, torch.float64), (False, True), (8, 6), ("none", "per_batch", "stacked"), (False, True)
    ):
        B, S, D = 2, 3, 8
        base = torch.randn(B, S, 5 + 2 + 2, D, generator=gen).to(dtype)  # a fused qkv: 5 q heads, 2 k, 2 v
        q, k = base[:, :, :5], base[:, :, 5:7]  # strided views (GQA)
        cos, sin = cos_sin_table(torch.arange(9), torch.rand(r // 2, generator=gen) + 0.1, interleaved=interleaved)
        if positions_kind == "none":
            positions, batch_rows = None, 0
        elif positions_kind == "per_batch":
            positions, batch_rows = torch.randint(0, 9, (B, S), generator=gen), 0
        else:  # stacked per-batch tables [B * S, r], row b * S + s
            positions, batch_rows = None, S
        xs = [q, k]
        expected = [torch.empty(x.shape, dtype=torch.float32 if dtype == torch.bfloat16 else dtype) for x in xs]
        rotate_rows_torch([x.to(e.dtype) for x, e in zip(xs, expected)], expected, cos, sin, positions, batch_rows, interleaved, conjugate)
        if dtype == torch.bfloat16:
            expected = [bf16_truncated(e) for e in expected]
        outs = [torch.empty_like(x) for x in xs]
        rotate_triton(xs, outs, cos, sin, positions, batch_rows, interleaved, conjugate)
        for o, e in zip(outs, expected):
            assert torch.equal(o, e), (dtype, interleaved, r, positions_kind, (o.double() - e.double()).abs().max())
        v_before = base[:, :, 7:].clone()
        rotate_triton(xs, xs, cos, sin, positions, batch_rows, interleaved, conjugate)  # in place
        for x, e in zip(xs, expected):
            assert torch.equal(x, e), ("in place", dtype, interleaved, r, positions_kind)
        assert torch.equal(base[:, :, 7:], v_before)  # v untouched
        checked += 1
    print("checked", checked)
    """
)


@pytest.mark.slow
def test_triton_kernel_under_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "checked 72" in done.stdout
