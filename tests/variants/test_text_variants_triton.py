"""xPos, M-RoPE and NoPE-temperature tables through ``rotary.rotate`` on the Triton kernel, run on CPU
tensors by Triton's interpreter, against the pure-torch path: the variants are producers of tables
and need nothing of the kernel but what every table already uses (separate key tables, per-token rows).
Every case counts the calls of each backend: one Triton call and one torch call, or the test fails."""

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
    from rotary.variants import MRoPE, NoPETemperature, XPos

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
    producers = [
        (XPos(16, scale_base=8, center=3), torch.tensor([[0, 1, 2, 7, 9], [4, 5, 6, 7, 8]])),
        (XPos(16, scale_base=8, interleaved=True), torch.arange(5)),
        (MRoPE(16, mrope_section=[2, 3, 3]), torch.randint(0, 30, (3, 2, 5), generator=gen)),
        (MRoPE(16, mrope_section=[4, 2, 2], mrope_interleaved=True), torch.randint(0, 30, (3, 2, 5), generator=gen)),
        (NoPETemperature(16, floor_scale=4), torch.arange(5)),
    ]
    checked = 0
    for producer, ids in producers:
        for dtype in (torch.float32, torch.float64):
            tables = producer.tables(ids, dtype=dtype)
            q, k = torch.randn(2, 5, 4, 16, generator=gen).to(dtype), torch.randn(2, 5, 2, 16, generator=gen).to(dtype)
            results = {}
            for name, backend in (("triton", triton_kernel.run_triton), ("torch", run_torch)):
                ops.run = counted(name, backend)  # the dispatcher's kernel call, pinned to one backend
                before = dict(calls)
                results[name] = rotary.rotate([q, k], tables, layout="bshd", kinds=("q", "k"))
                other = "torch" if name == "triton" else "triton"
                # one kernel call for q and k, on this backend and no other
                assert calls[name] == before[name] + 1 and calls[other] == before[other], (name, calls, before)
            for a, b in zip(results["triton"], results["torch"]):
                assert torch.equal(a, b), (type(producer).__name__, dtype, (a - b).abs().max())
            checked += 1
    print("checked", checked, "triton calls", calls["triton"], "torch calls", calls["torch"])
    """
)


@pytest.mark.slow
def test_text_variants_on_the_triton_kernel_under_interpreter():
    stdout = run_interpreted(SCRIPT)
    assert "checked 10 triton calls 10 torch calls 10" in stdout, stdout
