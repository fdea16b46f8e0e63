"""AxialRoPE (every preset) and RoPE-Mixed tables through ``rotary.rotate`` on the Triton kernel, run on
CPU tensors by Triton's interpreter, against the pure-torch path; and RoPE-Mixed's per-head table
gradients from the Triton kernel. Every case counts the calls of each backend: one Triton call and
one torch call, or the test fails (the C++ decode fast path, which fp32 axial tables would otherwise
take before the dispatcher, is turned off in the script). The variants are producers of tables: they need nothing of the
kernel but what every table uses (shared rows, per-head tables, table gradients)."""

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
    from rotary.kernels.contract import Rotation
    from rotary.kernels.eager import run_torch, table_grad_torch
    from rotary.variants import PRESETS, AxialRoPE, RoPEMixed

    # a recorded plan (rotary.plans) hands CPU tensors to the C++ kernel's rope_layout before the dispatcher
    # is reached; on CUDA no such plan is made. Plans off here, so every case reaches ops.run, pinned below to
    # one backend whose calls are counted.
    rotary.plans._state.off = True
    calls = {"triton": 0, "torch": 0}

    def counted(name, backend):
        def run(rotation):
            calls[name] += 1
            return backend(rotation)

        return run

    gen = torch.Generator().manual_seed(0)
    producers = [AxialRoPE.preset(name, 16 if name != "flux" else 128) for name in PRESETS if name != "llama4_vision"]
    producers += [RoPEMixed(16, 4, generator=gen), RoPEMixed(16, 4, interleaved=True, generator=gen)]
    checked = 0
    for rope in producers:
        coords = rope.grid(*(2, 2, 3)[3 - rope.axes :], prefix=1)
        S, D = coords.seq_len, rope.head_dim
        for dtype in (torch.float32, torch.float64):
            tables = rope.tables(coords, dtype=dtype)
            q, k = torch.randn(2, S, 4, D, generator=gen).to(dtype), torch.randn(2, S, 4, D, generator=gen).to(dtype)
            results = {}
            for name, backend in (("triton", triton_kernel.run_triton), ("torch", run_torch)):
                ops.run = counted(name, backend)  # the dispatcher's kernel call, pinned to one backend
                before = dict(calls)
                with torch.no_grad():
                    results[name] = rotary.rotate([q, k], tables, layout="bshd", kinds=("q", "k"))
                other = "torch" if name == "triton" else "triton"
                # one kernel call for q and k, on this backend and no other
                assert calls[name] == before[name] + 1 and calls[other] == before[other], (name, calls, before)
            for a, b in zip(results["triton"], results["torch"]):
                assert torch.equal(a, b), (rope, dtype, (a - b).abs().max())
            checked += 1
    # RoPE-Mixed: per-head table gradients [B, S, H, r] from the Triton kernel equal the torch path's
    mixed = RoPEMixed(16, 4, generator=gen)
    cos, sin = (t.detach() for t in (lambda tb: (tb.cos, tb.sin))(mixed.tables(mixed.grid(2, 3))))
    x, g = torch.randn(2, 6, 4, 16, generator=gen), torch.randn(2, 6, 4, 16, generator=gen)
    rotation = Rotation((x,), (x,), (cos,), (sin,), None, 0, False)
    buffers = [(torch.empty(2, 6, 4, 16), torch.empty(2, 6, 4, 16))]
    triton_kernel.table_grad_triton(rotation, (g,), buffers)
    want = table_grad_torch(rotation, (g,))
    for a, b in zip(buffers[0], want[0]):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    print("checked", checked, "triton calls", calls["triton"], "torch calls", calls["torch"])
    """
)


@pytest.mark.slow
def test_vision_variants_on_the_triton_kernel_under_interpreter():
    stdout = run_interpreted(SCRIPT)
    assert "checked 16 triton calls 16 torch calls 16" in stdout, stdout
