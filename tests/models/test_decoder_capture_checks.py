"""``Decoder.generate(capture="compile")`` as CUDA graphs would see it, checked on this CPU machine.

On CUDA, ``capture="compile"`` is ``torch.compile(decode_step, mode="reduce-overhead")``: Inductor
records the compiled step in CUDA graphs (cudagraph trees) unless its checks find a reason not to
(an op that cannot be captured, a CPU tensor, an input mutated in place that is not a static input),
and it records again whenever a static input's address changes. Either would make the step slower
than eager decoding with no error. Here the step is compiled with CUDA graphs switched on, run as on an
accelerator (``rotary.devices.host_checks`` off: no host reads), with Inductor's own checks asked for their
reasons; the one check that must fail on a CPU (the device) is left out. Two graphs: the pure-torch
accelerator path, and the CUDA path's one-launch ``rotary::rotate_and_cache`` custom op, whose Triton
kernel Triton's interpreter runs on CPU tensors.

It runs in a process of its own (``helpers.run_interpreted``: a child forked from a server that has imported
torch and Triton, Triton's interpreter on, and nothing of rotary or Inductor): it patches Inductor, and
Triton's interpreter must be set before Triton is imported. One process checks both graphs, one after the
other (the torch path first, before the fused kernel is switched on; dynamo and its counters reset between
them): a second process would import dynamo and Inductor again for most of its time. What it cannot see is
the CUDA runtime itself; ``tests/models/test_generation_cuda.py`` captures the step on a GPU.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import sys, traceback, torch
    import rotary.devices as devices
    devices.host_checks = lambda device: False  # as on an accelerator: nothing read on the host
    import torch._inductor.config as inductor_config
    import torch._inductor.cudagraph_utils as cudagraph_utils
    import torch._inductor.output_code as output_code
    from torch._inductor.utils import BoxedBool
    inductor_config.triton.cudagraphs = True  # what mode="reduce-overhead" sets on CUDA
    cudagraph_utils.check_lowering_disable_cudagraph = lambda devices: None  # the CPU-device reason only
    graphs, calls = [], []

    def instead_of_recording(example_inputs, compiled, cudagraphs, constants, device_index):
        static = set(compiled.fx_kwargs["static_input_idxs"] or ())
        names = [p.name for p in compiled.cudagraph_info.placeholders]
        graphs.append(dict(
            disabled=compiled.disabled_cudagraphs_reason,
            fails=list(compiled.cudagraph_info.cudagraph_fail_reasons),
            mutated_not_static=[names[i] for i in compiled.mutated_input_idxs if i not in static],
            inputs=len(example_inputs), static=len(static),
        ))
        inner = compiled.current_callable

        def run(args):  # the static inputs' addresses at every call (cudagraph trees record again when one moves)
            calls.append(tuple(args[i].data_ptr() for i in sorted(static)))
            return inner(args)

        run._boxed_call = True
        compiled.current_callable = run
        BoxedBool.disable(cudagraphs)

    output_code.cudagraph_post_compile = instead_of_recording
    output_code.cudagraph_partition_post_compile = instead_of_recording
    from torch._dynamo.utils import counters
    from rotary.models import Decoder, DecoderConfig

    def check(path):
        launches = []
        if path == "fused":  # from here on
            import rotary.serving as serving
            from rotary.kernels import triton as triton_kernel
            serving._fused_kernel_device = lambda q: True  # the CUDA path, run by Triton's interpreter
            real = triton_kernel.rotate_and_cache_triton
            triton_kernel.rotate_and_cache_triton = lambda *a, **kw: (launches.append(1), real(*a, **kw))[1]
        torch._dynamo.reset()
        counters.clear()
        graphs.clear()
        calls.clear()
        torch.manual_seed(0)
        model = Decoder(DecoderConfig(vocab_size=64, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2)).eval()
        ids = torch.randint(1, 64, (2, 5))
        eager = model.generate(ids, 6, cache="static")
        for _ in range(2):  # the second call reuses the caches and the compiled step
            assert torch.equal(model.generate(ids, 6, capture="compile"), eager)
        assert len(graphs) == 1 and counters["stats"]["unique_graphs"] == 1, (graphs, dict(counters["stats"]))
        graph = graphs[0]
        assert graph["disabled"] is None and graph["fails"] == [], graph
        assert graph["mutated_not_static"] == [], graph
        assert graph["inputs"] - graph["static"] == 1, graph  # the token alone is copied in at each replay
        assert len(calls) == 10 and len(set(calls)) == 1, len(set(calls))  # 5 steps per call, one set of addresses
        if path == "fused":
            assert launches, "the fused kernel did not run"
        print("capture checks ok", path, graph["inputs"], flush=True)

    for path in sys.argv[1:]:  # "torch" before "fused": the fused path's patches stay
        try:
            check(path)
        except Exception:
            print(f"capture checks failed {path}:", traceback.format_exc(), flush=True)
    """
)


@pytest.fixture(scope="module")
def checked(tmp_path_factory) -> str:
    """The script's output for both paths ("fused" only where Triton is installed): one
    process per session, however many pytest-xdist workers run these tests (the first runs it under a
    lock, the others read what it wrote)."""
    from filelock import FileLock  # a dependency of torch

    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "decoder-capture-checks.txt"
    with FileLock(f"{shared}.lock"):
        if not shared.is_file():
            shared.write_text(_run_script())
        return shared.read_text()


def _run_script() -> str:
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = (  # its kernels shared with other checkouts, as in conftest.py
        f"import sys; sys.path.insert(0, {tests!r}); import inductor_paths; "
        "inductor_paths.one_torch_path_for_every_checkout()\n" + SCRIPT
    )
    try:
        import triton  # noqa: F401  a test dependency; without it CUDA takes the torch path
    except ImportError:  # (the server imports Triton): a process of its own, the torch path alone
        done = subprocess.run([sys.executable, "-c", script, "torch"], capture_output=True, text=True, timeout=900)
        return f"{done.stdout}\n(status {done.returncode})\n{done.stderr[-6000:]}"
    from helpers import run_interpreted

    return run_interpreted(script, "torch", "fused", timeout=900)


@pytest.mark.slow
@pytest.mark.parametrize("path", ["torch", "fused"])
def test_the_compiled_decoding_step_gives_cuda_graphs_no_reason_to_skip_or_record_again(path, checked):
    if path == "fused":
        pytest.importorskip("triton")  # a test dependency; without it CUDA takes the torch path
    assert f"capture checks ok {path}" in checked, checked[-8000:]
