"""FoPE's per-head tables (cos² + sin² not 1) and dual-chunk RoPE's tables through ``rotary.rotate`` on the
Triton kernel, run on CPU tensors by Triton's interpreter, against the pure-torch path: both are producers
of tables and need nothing of the kernel but what every table already uses. Every case counts the calls of
each backend: one Triton call and one torch call, or the test fails."""

from __future__ import annotations

import textwrap

import pytest

from helpers import run_interpreted

pytest.importorskip("triton")

SCRIPT = textwrap.dedent(
    """
    import torch
    import rotary
    import rotary.rotation
    from rotary.kernels import ops, triton as triton_kernel
    from rotary.kernels.eager import run_torch
    from rotary.variants import DualChunkRoPE, FoPE

    rotary.plans._state.off = True  # reach ops.run (see test_text_variants_triton.py)
    calls = {"triton": 0, "torch": 0}

    def counted(name, backend):
        def run(rotation):
            calls[name] += 1
            return backend(rotation)

        return run

    gen = torch.Generator().manual_seed(0)
    fope = FoPE(16, num_key_value_heads=2, max_position_embeddings=64, init_std=0.3, generator=gen)
    fope_il = FoPE(16, num_key_value_heads=2, max_position_embeddings=64, init_std=0.3, interleaved=True, generator=gen)
    dual = DualChunkRoPE(16, chunk_size=10, local_size=4)
    ids = torch.tensor([[0, 1, 7, 13, 40], [2, 3, 64, 65, 300]])
    cases = [(fope, fope.tables(ids)), (fope_il, fope_il.tables(torch.arange(5)))]
    cases += [(dual, getattr(dual.tables(ids), name)) for name in ("intra", "successor", "inter", "inter_critical")]
    checked = 0
    for producer, tables in cases:
        for dtype in (torch.float32, torch.float64):
            t = tables.to(dtype)
            q, k = torch.randn(2, 5, 2, 16, generator=gen).to(dtype), torch.randn(2, 5, 2, 16, generator=gen).to(dtype)
            results = {}
            for name, backend in (("triton", triton_kernel.run_triton), ("torch", run_torch)):
                ops.run = counted(name, backend)
                before = dict(calls)
                results[name] = rotary.rotate([q, k], t, layout="bshd")
                other = "torch" if name == "triton" else "triton"
                assert calls[name] == before[name] + 1 and calls[other] == before[other], (name, calls, before)
            for a, b in zip(results["triton"], results["torch"]):
                assert torch.equal(a, b), (type(producer).__name__, dtype, (a - b).abs().max())
            checked += 1
    print("checked", checked, "triton calls", calls["triton"], "torch calls", calls["torch"])
    """
)


@pytest.mark.slow
def test_serving_variants_on_the_triton_kernel_under_interpreter():
    stdout = run_interpreted(SCRIPT)
    assert "checked 12 triton calls 12 torch calls 12" in stdout, stdout
