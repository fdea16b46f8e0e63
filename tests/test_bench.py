"""``rotary bench``: the quick run prints a table, --json is machine-readable, extra cases load from a file."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
import torch

from helpers import run_cli, run_main
from rotary.tools import bench
from rotary.tools.bench import runner
from rotary.tools.bench.table import format_table
from rotary.tools.cli import main


def run_bench(*args: str) -> subprocess.CompletedProcess:
    """``rotary bench *args`` in this process (``run_main``: the same ``main`` as ``python -m rotary``, whose
    own process is checked in test_cli.py), with what ``--cases`` registers undone after."""
    with bench.scoped_registrations(), tempfile.TemporaryDirectory() as cwd:
        return run_main("bench", *args, cwd=cwd, ok=None)


@pytest.mark.slow
def test_quick_bench_prints_a_table():
    done = run_bench("--quick", "--repeats", "1", "--dtypes", "fp32")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "logical CPUs" in out and "threads" in out and "fused CPU kernel loaded" in out
    for method in (
        "limit: in-place pass (mul_)",
        "limit: copy (clone)",
        "rotary fused, in place",
        "rotary fused, out of place",
        "rotary pure-torch path",
        "HF eager apply_rotary_pos_emb",
        "rotary-embedding-torch 0.9.1",
        "complex form (Meta LLaMA)",
    ):
        assert method in out
    assert "prefill-small 1x4x128x64 fp32" in out and "decode-small 2x4x1x64 fp32" in out
    assert "fwd+bwd" in out and "extra peak MiB" in out
    # the suites that run on the CPU, at --quick's shapes (--dtypes applies to the fused ones)
    assert "rotate_and_cache 4x1 (q 32 heads, k 8 heads, D 128) fp32" in out
    assert "rmsnorm_rotate 1x64 (q 32 heads, k 8 heads, D 128) fp32" in out
    assert "generation: 1 layers, width 64" in out and "decode step 1x32/8x1x128" not in out


@pytest.mark.slow
def test_json_output_and_extra_cases(tmp_path):
    cases = tmp_path / "my_cases.py"
    cases.write_text(
        textwrap.dedent(
            """
            from rotary.tools import bench

            bench.register_method(bench.Method("extra: q.add_(0)", lambda i: lambda: i.q.add_(0.0)))

            def suite(options):
                t = bench.time_interleaved({"noop": lambda: None}, options.repeats)
                return [bench.Result("my suite", "noop", False, t["noop"], options.repeats)]

            bench.register_suite("mine", suite)
            """
        )
    )
    done = run_bench(
        "--quick",
        "--repeats",
        "1",
        "--dtypes",
        "bf16",
        "--shapes",
        "decode",
        "--json",
        "--cases",
        str(cases),
        "--suites",
        "mine",
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["machine"]["torch_threads"] >= 1
    rows = data["results"]
    groups = {r["group"] for r in rows}
    assert groups == {"decode 16x32x1x128 bf16", "my suite"}
    by_method = {(r["method"], r["backward"]): r for r in rows if r["group"].startswith("decode")}
    assert ("extra: q.add_(0)", False) in by_method
    inplace = by_method[("rotary fused, in place", False)]
    assert inplace["median_s"] > 0 and inplace["ratios"]["x in-place pass"] > 0
    assert by_method[("HF eager apply_rotary_pos_emb", False)]["ratios"]["HF eager speedup"] == pytest.approx(1.0)


def test_extra_peak_bytes_sees_a_large_temporary():
    import torch

    x = torch.randn(2**22)  # 16 MiB
    extra = bench.extra_peak_bytes(lambda: x * 2)
    if extra is None:
        pytest.skip("peak resident memory needs Linux /proc")
    assert 15 * 2**20 <= extra <= 40 * 2**20
    assert bench.extra_peak_bytes(lambda: x.mul_(1.0)) < 2**20


@pytest.mark.parametrize(
    "args, message",
    [
        (["--dtypes", "fp8"], "unknown dtype 'fp8'"),
        (["--shapes", "nope"], "names no shape"),
        (["--repeats", "0"], "argument --repeats: must be a positive integer, got 0"),
        (["--repeats", "101"], "argument --repeats: must be at most 100"),
        (["--cases", "/nonexistent/cases.py"], "no such file"),
    ],
)
def test_bad_arguments(args, message, capsys):
    try:
        status = main(["bench", "--quick", "--no-memory", *args])
    except SystemExit as exc:  # argparse's own checks exit
        status = exc.code
    assert status == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "text, message",
    [
        ("import sys\nsys.exit(3)\n", "called sys.exit(3)"),
        ("raise RuntimeError('boom')\n", "raised RuntimeError: boom"),
    ],
)
def test_a_cases_file_that_exits_or_raises_is_a_one_line_error(text, message, tmp_path, capsys):
    cases = tmp_path / "cases.py"
    cases.write_text(text)
    assert main(["bench", "--quick", "--no-memory", "--cases", str(cases)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rotary bench: error: --cases ") and message in err and err.count("\n") == 1


def test_a_cases_file_that_is_not_python_is_a_one_line_error(tmp_path, capsys):
    cases = tmp_path / "cases.txt"
    cases.write_text("x = 1\n")
    assert main(["bench", "--quick", "--no-memory", "--cases", str(cases)]) == 2
    assert "not a Python file" in capsys.readouterr().err


def test_hf_llama_patch_case_adds_a_patched_vs_unpatched_group():
    import argparse
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "cases" / "hf_llama_patch.py"
    spec = importlib.util.spec_from_file_location("hf_llama_patch_case", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = module.suite(argparse.Namespace(quick=True, repeats=1))
    assert [r.method for r in rows] == ["HF Llama, unpatched", "HF Llama, rotary.hf.patch"] * 3
    assert [r.backward for r in rows] == [False, False, True, True, False, False]
    prefixes = ["small Llama forward", "small Llama training step", "small Llama decoding step"]
    assert [r.group.startswith(p) for r, p in zip(rows[::2], prefixes)] == [True] * 3
    assert all(r.median_s > 0 for r in rows)
    assert [r.ratios["HF eager speedup"] for r in rows[::2]] == [1.0] * 3


def test_slower_methods_are_called_slower():
    rows = [
        bench.Result("g", "HF eager apply_rotary_pos_emb", False, 1e-5, 3, ratios={"HF eager speedup": 1.0}),
        bench.Result("g", "fast", False, 5e-6, 3, ratios={"HF eager speedup": 2.0}),
        bench.Result("g", "slow", False, 5.1e-5, 3, ratios={"HF eager speedup": 1e-5 / 5.1e-5}),
    ]
    lines = {
        line.split()[0]: line
        for line in bench.format_table(
            {"cpu": "x", "logical_cpus": 1, "torch": "t", "torch_threads": 1}, rows
        ).splitlines()[3:]
    }
    assert "2.0x faster" in lines["fast"]
    assert "5.1x slower" in lines["slow"] and "faster" not in lines["slow"]
    assert "1.0x (same)" in lines["HF"]


def test_unknown_suite_is_an_error_listing_the_registered_ones(monkeypatch, tmp_path, capsys):
    from rotary.tools.bench import harness

    monkeypatch.setattr(harness, "SUITES", {})
    cases = tmp_path / "cases.py"
    cases.write_text("from rotary.tools import bench\nbench.register_suite('mine', lambda options: [])\n")
    assert main(["bench", "--quick", "--no-memory", "--cases", str(cases), "--suites", "nosuch"]) == 2
    err = capsys.readouterr().err
    assert err == "rotary bench: error: --suites: unknown suite 'nosuch'; registered suites: mine\n"
    assert main(["bench", "--quick", "--suites", "nosuch"]) == 2
    assert "registered suites: mine" in capsys.readouterr().err


def test_a_cases_file_that_raises_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.py"
    bad.write_text("raise RuntimeError('boom')\n")
    assert main(["bench", "--quick", "--cases", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err == f"rotary bench: error: --cases {bad}: importing it raised RuntimeError: boom\n"


def test_decode_suite_and_the_training_rows():
    import argparse

    from rotary.tools.bench import methods

    rows = methods.decode_suite(argparse.Namespace(quick=False, repeats=1, dtypes="fp32", suites=None))
    assert [r.method for r in rows][-1] == "HF eager apply_rotary_pos_emb" and len(rows) == 5
    assert all(r.median_s > 0 and r.ratios["HF eager speedup"] > 0 for r in rows)
    assert methods.decode_suite(argparse.Namespace(quick=True, repeats=1, dtypes="fp32", suites=None)) == []
    names = {(m.name, m.backward) for m in bench.METHODS}
    for name in (methods.TWO_COPIES, methods.INPLACE_TRAINING):
        assert (name, True) in names
    # fwd+bwd rows divide by two copies, forward rows by one
    results = [
        bench.Result("g", "limit: in-place pass (mul_)", False, 1.0, 1),
        bench.Result("g", "limit: copy (clone)", False, 2.0, 1),
        bench.Result("g", methods.TWO_COPIES, True, 4.0, 1),
        bench.Result("g", methods.INPLACE_TRAINING, True, 2.5, 1),
    ]
    runner._group_ratios(results)
    assert results[-1].ratios["x in-place pass"] == 2.5 and results[-1].ratios["x copy"] == 2.5 / 4.0
    assert results[1].ratios["x copy"] == 1.0


def test_without_the_baselines_packages_their_rows_are_skipped_with_one_line(monkeypatch, capsys):
    """As installed without [dev]: transformers and rotary-embedding-torch cannot be imported."""
    import argparse
    import sys

    from rotary.tools.bench import methods

    monkeypatch.setitem(sys.modules, "transformers", None)
    monkeypatch.setitem(sys.modules, "rotary_embedding_torch", None)
    argv = [
        "bench",
        "--quick",
        "--no-memory",
        "--repeats",
        "1",
        "--dtypes",
        "fp32",
        "--shapes",
        "decode-small",
        "--suites",
        "none",
    ]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "HF eager apply_rotary_pos_emb (needs transformers)" in err  # --quick times no torch.compile row
    assert "rotary-embedding-torch 0.9.1 (needs rotary_embedding_torch)" in err
    assert err.rstrip().endswith("pip install transformers rotary-embedding-torch")
    assert "rotary fused, out of place" in out and "complex form (Meta LLaMA)" in out
    assert "HF eager" not in out and "rotary-embedding-torch" not in out and "faster" not in out
    rows = methods.decode_suite(argparse.Namespace(quick=False, repeats=1, dtypes="fp32", suites=None))
    assert len(rows) == 4 and "HF eager apply_rotary_pos_emb" not in {r.method for r in rows}
    assert all(r.median_s > 0 and not r.ratios for r in rows)


def test_harness_owns_the_shared_row_names_and_does_not_import_methods():
    """``methods`` imports ``harness``: the row names the ratios use live in ``harness``, which does not
    import ``methods`` back."""
    from rotary.tools.bench import harness, methods

    assert (harness.TWO_COPIES, harness.INPLACE_TRAINING) == (methods.TWO_COPIES, methods.INPLACE_TRAINING)
    assert "from .methods" not in Path(harness.__file__).read_text()


@pytest.mark.slow
def test_compiled_module_row_runs_the_module_and_matches_it():
    import torch

    from rotary.tools.bench import harness, methods

    names = {(m.name, m.backward) for m in bench.METHODS}
    for backward in (False, True):
        assert ("rotary RoPE module under torch.compile", backward) in names
    inp = harness.make_inputs(harness.QUICK_SHAPES[0], torch.float32)
    q, k = methods._compiled_module(inp)(inp.q, inp.k)
    expected = inp.rope(inp.q, inp.k)
    assert torch.equal(q, expected[0]) and torch.equal(k, expected[1])


def test_a_prepared_call_is_timed_without_its_preparation():
    """``Prepared``: the preparation (here 20 ms of sleep) stays outside the timed region, the call
    (here 2 ms) inside; the same call unprepared is timed with its sleep."""
    import time

    from rotary.tools.bench import harness

    def prepare():
        time.sleep(0.02)
        return lambda: time.sleep(0.002)

    medians = harness.time_interleaved({"prepared": harness.Prepared(prepare), "plain": lambda: prepare()()}, repeats=3)
    assert 0.002 <= medians["prepared"] < 0.012 and medians["plain"] >= 0.022
    assert harness.allocations(harness.Prepared(lambda: lambda: torch.empty(1024))) == [4096]


@pytest.mark.parametrize("inplace", [True, False])
def test_the_training_step_rows_time_the_rotation_alone_with_the_out_of_place_gradients(inplace):
    """The rows' timed call: forward and backward of ``rope(q, k, inplace=...)``, allocating one
    gradient per input (the backward never writes into the gradient it receives) and, out of place,
    the two outputs; the leaves' gradients are exactly those of the out-of-place path with output
    gradients the caller holds."""
    from rotary.tools.bench import harness, methods

    name = methods.INPLACE_TRAINING if inplace else methods.OUT_OF_PLACE_TRAINING
    inp = harness.make_inputs(harness.Shape("t", 2, 4, 2, 16, 64), torch.float32)
    row = next(m for m in bench.METHODS if (m.name, m.backward) == (name, True))
    call = row.make(inp)
    assert isinstance(call, harness.Prepared)
    step = call.prepare()
    q_leaf, k_leaf = call.leaves
    sizes = harness.allocations(step)
    assert sizes is not None
    sized = sorted(size for size in sizes if size >= inp.k.numel() * 4)
    assert sized == sorted([inp.q.numel() * 4, inp.k.numel() * 4] * (1 if inplace else 2)), sizes
    q, k = inp.q.detach().clone().requires_grad_(), inp.k.detach().clone().requires_grad_()
    torch.autograd.backward(inp.rope(q, k), (inp.grad_q, inp.grad_k))
    assert torch.equal(q_leaf.grad, q.grad) and torch.equal(k_leaf.grad, k.grad)


def test_the_training_limit_row_passes_over_fresh_copies_and_is_their_ratio():
    from rotary.tools.bench import harness, methods

    inp = harness.make_inputs(harness.Shape("t", 2, 4, 2, 16, 64), torch.float32)
    row = next(m for m in bench.METHODS if (m.name, m.backward) == (methods.TRAINING_PASSES, True))
    call = row.make(inp)
    before = [t.clone() for t in (inp.q, inp.k, inp.grad_q, inp.grad_k)]
    sizes = harness.allocations(call.prepare())
    assert sizes is not None and all(size < inp.k.numel() * 4 for size in sizes), sizes  # copies: in the preparation
    assert all(torch.equal(a, b) for a, b in zip(before, (inp.q, inp.k, inp.grad_q, inp.grad_k)))
    results = [
        bench.Result("g", methods.TRAINING_PASSES, True, 2.0, 1),
        bench.Result("g", methods.INPLACE_TRAINING, True, 3.0, 1),
        bench.Result("g", methods.TWO_COPIES, True, 4.0, 1),
    ]
    runner._group_ratios(results)
    assert results[1].ratios["x fresh passes"] == 1.5 and "x fresh passes" not in results[2].ratios
    assert "x fresh passes (training step)" in format_table(
        {"cpu": "c", "logical_cpus": 1, "torch": "t", "torch_threads": 1}, results
    )


def test_the_training_step_overhead_script_times_its_three_steps(capsys):
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "training_step_overhead.py"
    spec = importlib.util.spec_from_file_location("training_step_overhead", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(["--shape", "2,2,8,16", "--repeats", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split("  ")[0] for line in out[:3]] == [
        "autograd only",
        "mul_ passes under autograd",
        "rope(q, k, inplace=True)",
    ]
    assert out[3].startswith("rope / mul_ passes under autograd: ")
    with pytest.raises(SystemExit):
        script.main(["--shape", "2,2,8"])


def test_the_kernel_vs_pass_script_times_the_kernel_and_the_pass(capsys):
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "kernel_vs_pass.py"
    spec = importlib.util.spec_from_file_location("kernel_vs_pass", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    for layout, fresh in (("bhsd", []), ("bshd", []), ("bhsd", ["--fresh"])):
        assert script.main(["--shape", "1,2,32,16", "--repeats", "1", "--layout", layout, *fresh]) == 0
        out = capsys.readouterr().out.splitlines()
        assert [line[:22].strip() for line in out] == [
            "mul_ pass",
            "half, in place",
            "half, out of place",
            "interleaved, in place",
        ]
        assert out[0].endswith("1.00x the pass")
    with pytest.raises(SystemExit):
        script.main(["--shape", "1,2,32,15"])


# --device cuda -----------------------------------------------------------------------------------
# The GPU path's timers take a backend (rotary.tools.bench.cuda.CudaBackend on a GPU); here a CPU stand-in
# with the same methods: events read a clock (virtual seconds that the timed calls advance, or
# perf_counter), a "graph" replays the captured calls, synchronisations are counted.


class _VirtualClock:
    """Seconds that only the calls under test advance: timer arithmetic comes out exact."""

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


class _WallClock:
    def now(self) -> float:
        import time

        return time.perf_counter()


class _Event:
    def __init__(self, clock) -> None:
        self.clock, self.t = clock, None

    def record(self) -> None:
        self.t = self.clock.now()

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: _Event) -> float:  # milliseconds, as torch.cuda.Event
        return (end.t - self.t) * 1e3


class _Graph:
    def __init__(self, call, calls: int) -> None:
        self.call, self.calls = call, calls

    def replay(self) -> None:
        for _ in range(self.calls):
            self.call()


class StandIn:
    """A CPU stand-in for :class:`rotary.tools.bench.cuda.CudaBackend`. ``refuse``: a predicate on the call;
    capturing a call it accepts raises what a host read inside a CUDA-graph capture raises."""

    def __init__(self, clock=None, refuse=lambda call: False, sync_sleep: float = 0.0) -> None:
        self.device = torch.device("cpu")
        self.clock = clock or _WallClock()
        self.refuse, self.sync_sleep = refuse, sync_sleep
        self.syncs = self.releases = 0
        self.captured: list[int] = []

    def synchronize(self) -> None:
        import time

        self.syncs += 1
        if self.sync_sleep:
            time.sleep(self.sync_sleep)

    def event(self) -> _Event:
        return _Event(self.clock)

    def capture(self, call, calls: int) -> _Graph:
        if self.refuse(call):
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing\nmore detail")
        self.captured.append(calls)
        return _Graph(call, calls)

    def release(self) -> None:
        self.releases += 1


@pytest.fixture
def stand_in(monkeypatch):
    """``--device cuda`` runs on the CPU through the stand-in (inputs stay on the CPU); the timing
    targets are shortened so a run takes seconds."""
    from rotary.tools.bench import cuda

    backend = StandIn()
    monkeypatch.setattr(cuda, "open_backend", lambda device: backend)
    monkeypatch.setattr(cuda, "TARGET_S", 5e-4)
    monkeypatch.setattr(cuda, "MIN_GRAPH_CALLS", 2)
    return backend


def test_the_device_option_defaults_to_cpu_and_takes_cpu_or_cuda(capsys):
    from rotary.tools.cli import build_parser

    args = build_parser().parse_args(["bench"])
    assert args.device == "cpu" and args.dtypes is None
    assert build_parser().parse_args(["bench", "--device", "cuda"]).device == "cuda"
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--device", "tpu"])
    assert exc.value.code == 2 and "argument --device: invalid choice: 'tpu'" in capsys.readouterr().err


def test_device_cuda_without_cuda_is_a_one_line_error(monkeypatch, capsys):
    """In process (on a machine without CUDA the patch changes nothing); a rotary error as one line and
    status 2 from the real ``python -m rotary`` process is test_cli.py's subprocess check."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on this machine, also on a GPU one
    assert main(["bench", "--device", "cuda", "--quick"]) == 2
    captured = capsys.readouterr()
    err = captured.err
    assert err.count("\n") == 1 and err.startswith("rotary bench: error: --device cuda: this torch (")
    assert "sees no CUDA device (torch.cuda.is_available() is False" in err and "leave out --device" in err
    assert captured.out == ""


def test_cpu_suites_and_cpu_shapes_are_refused_with_device_cuda(stand_in, capsys):
    assert main(["bench", "--device", "cuda", "--suites", "decode"]) == 2
    err = capsys.readouterr().err
    assert "--suites decode: this suite runs on cpu only, not with --device cuda; leave it out" in err
    assert main(["bench", "--device", "cuda", "--shapes", "gqa"]) == 2  # a CPU shape
    err = capsys.readouterr().err
    assert "'gqa' names no GPU shape; with --device cuda choose from ['prefill', 'training'," in err
    assert main(["bench", "--device", "cuda", "--dtypes", "fp8", "--shapes", "decode-small"]) == 2
    assert "unknown dtype 'fp8'" in capsys.readouterr().err


def test_graph_time_is_one_replay_divided_by_the_calls_it_holds():
    from rotary.tools.bench import cuda

    clock = _VirtualClock()
    backend = StandIn(clock)
    calls = []

    def call():  # 2 ms of "GPU time" per call
        calls.append(1)
        clock.advance(2e-3)

    graph = cuda.capture(call, 5, backend)
    assert len(calls) == 5  # the check replay
    assert cuda.graph_seconds(graph, 5, backend) == pytest.approx(2e-3, rel=1e-12)
    assert len(calls) == 10
    assert cuda.eager_event_seconds(call, 4, backend) == pytest.approx(2e-3, rel=1e-12)


def test_the_host_loop_synchronises_once_before_and_once_after_inside_the_timed_region():
    """With a synchronisation that takes 20 ms, 10 calls of nothing take 2 ms each: the final sync
    is timed once for the loop (per call it would be 20 ms each; never timed, ~0)."""
    from rotary.tools.bench import cuda

    backend = StandIn(sync_sleep=0.02)
    per_call = cuda.host_loop_seconds(lambda: None, 10, backend)
    assert backend.syncs == 2
    assert 2e-3 <= per_call < 10e-3


def test_the_host_loop_times_a_sleeping_call():
    import time

    from rotary.tools.bench import cuda

    backend = StandIn()
    per_call = cuda.host_loop_seconds(lambda: time.sleep(2e-3), 5, backend)
    assert 2e-3 <= per_call < 20e-3 and backend.syncs == 2


def test_a_prepared_call_is_timed_on_the_device_without_its_preparation():
    from rotary.tools.bench import cuda, harness

    clock = _VirtualClock()
    backend = StandIn(clock)

    def prepare():
        clock.advance(0.05)  # the preparation: outside the events
        return lambda: clock.advance(3e-3)

    assert cuda.prepared_event_seconds(harness.Prepared(prepare), 4, backend) == pytest.approx(3e-3, rel=1e-12)
    host = cuda.prepared_host_seconds(harness.Prepared(lambda: lambda: None), 3, backend)
    assert 0 <= host < 1e-3


def test_time_on_device_captures_notes_what_cannot_be_captured_and_goes_on_after_a_failure(monkeypatch):
    from rotary.tools.bench import cuda, harness

    monkeypatch.setattr(cuda, "TARGET_S", 1.0)  # as many calls per graph as allowed
    clock = _VirtualClock()

    def capturable():
        clock.advance(1e-3)

    def reads_the_host():
        clock.advance(4e-3)

    made = []

    def broken():
        made.append(1)
        if len(made) > 1:  # the first warm-up call passes, the second raises
            raise ValueError("boom\nsecond line")

    backend = StandIn(clock, refuse=lambda call: call is reads_the_host)
    prepared = harness.Prepared(lambda: lambda: clock.advance(2e-3))
    timings = cuda.time_on_device(
        {"graph": capturable, "eager": reads_the_host, "broken": broken, "prepared": prepared},
        3,
        backend,
        prepared_type=harness.Prepared,
    )
    graph, eager, failed, per_call = (timings[k] for k in ("graph", "eager", "broken", "prepared"))
    assert (graph.gpu_timing, graph.note, graph.gpu_s) == ("graph", "", pytest.approx(1e-3, rel=1e-9))
    assert graph.host_s >= 0 and backend.captured == [cuda.MAX_GRAPH_CALLS]
    assert eager.gpu_timing == "eager" and eager.gpu_s == pytest.approx(4e-3, rel=1e-9)
    assert eager.note.startswith(
        "not capturable: RuntimeError: CUDA error: operation not permitted when stream is capturing ("
    )
    assert eager.note.endswith("; GPU time from CUDA events around an eager loop")
    assert "(tests/test_bench.py:" in eager.note  # where the capture failed: the stand-in's raise
    assert failed.note == "failed: ValueError: boom" and math.isnan(failed.gpu_s) and math.isnan(failed.host_s)
    assert per_call.gpu_timing == "per call" and per_call.gpu_s == pytest.approx(2e-3, rel=1e-9)
    assert backend.releases == 1


def test_a_row_that_fails_while_timed_keeps_its_capture_note():
    from rotary.tools.bench import cuda

    state = {"calls": 0}

    def flaky():
        state["calls"] += 1
        if state["calls"] > 8:
            raise RuntimeError("device lost")

    backend = StandIn(refuse=lambda call: True)
    t = cuda.time_on_device({"x": flaky}, 3, backend)["x"]
    assert t.note.startswith("not capturable: RuntimeError: CUDA error") and t.note.endswith(
        "; failed while timing: RuntimeError: device lost"
    )
    assert math.isnan(t.gpu_s)


def _gpu_results() -> list:
    R = bench.Result
    g = "decode 64x32/8x1x128 at position 4096 bf16"
    return [
        R(g, "limit: copy (clone)", False, 4e-6, 9, host_s=2.05e-5, gpu_timing="graph"),
        R(g, "rope(q, k, position_ids=device ids)", False, 4.4e-6, 9, host_s=3.1e-5, gpu_timing="graph"),
        R(g, "apply_rotary", False, 1.2e-3, 9, host_s=1.3e-3, gpu_timing="eager", note="not capturable: A | B"),
        R(g, "Liger", False, math.nan, 9, host_s=math.nan, note="failed: ImportError: x"),
        R(g, "rotary fused, in place (training step)", True, 2e-4, 9, host_s=4e-4, gpu_timing="per call"),
    ]


_GPU_MACHINE = {
    "cpu": "Intel Xeon", "logical_cpus": 16, "torch": "2.11.0+cu130", "torch_threads": 8, "device": "cuda:0",
    "gpu": "NVIDIA H100 80GB HBM3", "cuda": "13.0", "triton": "3.6.0",
    "baselines": {"transformers": "5.17.0", "liger_kernel.ops.rope": "not installed"},
}  # fmt: skip


def test_gpu_rows_as_markdown_have_both_times_the_ratio_and_the_note():

    rows = _gpu_results()
    runner._device_ratios(rows, inplace=set())
    text = bench.format_table(_GPU_MACHINE, rows, markdown=True)
    assert text.splitlines() == [
        "machine: NVIDIA H100 80GB HBM3 (CUDA 13.0), torch 2.11.0+cu130, triton 3.6.0; "
        "host Intel Xeon, 16 logical CPUs",
        "baselines: transformers 5.17.0, liger_kernel.ops.rope not installed",
        "",
        "### decode 64x32/8x1x128 at position 4096 bf16",
        "",
        "| method | GPU µs/call (graph) | x copy | host µs/call (eager) | note |",
        "|---|---:|---:|---:|---|",
        "| limit: copy (clone) | 4.0 | 1.00 | 20.5 |  |",
        "| rope(q, k, position_ids=device ids) | 4.4 | 1.10 | 31.0 |  |",
        "| apply_rotary | 1200.0 (eager) |  | 1300.0 | not capturable: A \\| B |",
        "| Liger | — |  | — | failed: ImportError: x |",
        "| rotary fused, in place (training step) (fwd+bwd) | 200.0 (per call) |  | 400.0 |  |",
    ]
    plain = bench.format_table(_GPU_MACHINE, rows).splitlines()
    assert plain[3] == "decode 64x32/8x1x128 at position 4096 bf16"
    assert plain[4].split() == "method GPU µs/call (graph) x copy host µs/call (eager) note".split()
    assert plain[7].split()[-8:] == "1200.0 (eager) 1300.0 not capturable: A | B".split()


def test_gpu_ratios_divide_by_the_limit_measured_the_same_way():
    from rotary.tools.bench import methods

    R = bench.Result
    rows = [
        R("g", methods.INPLACE_PASS, False, 2.0, 1, gpu_timing="graph"),
        R("g", methods.COPY, False, 4.0, 1, gpu_timing="graph"),
        R("g", "in place", False, 3.0, 1, gpu_timing="graph"),
        R("g", "out of place", False, 6.0, 1, gpu_timing="graph"),
        R("g", "not captured", False, 8.0, 1, gpu_timing="eager"),
        R("g", "failed", False, math.nan, 1),
        R("g", methods.TWO_COPIES, True, 10.0, 1, gpu_timing="graph"),
        R("g", "fwd+bwd", True, 15.0, 1, gpu_timing="graph"),
        R("g", methods.TRAINING_PASSES, True, 5.0, 1, gpu_timing="per call"),
        R("g", methods.INPLACE_TRAINING, True, 6.0, 1, gpu_timing="per call"),
    ]
    runner._device_ratios(rows, inplace={("in place", False), (methods.INPLACE_PASS, False)})
    ratios = {r.method: r.ratios.get("x copy") for r in rows}
    assert ratios == {
        methods.INPLACE_PASS: 1.0,
        methods.COPY: 1.0,
        "in place": 1.5,
        "out of place": 1.5,
        "not captured": None,
        "failed": None,
        methods.TWO_COPIES: 1.0,
        "fwd+bwd": 1.5,
        methods.TRAINING_PASSES: 1.0,
        methods.INPLACE_TRAINING: 1.2,
    }


def test_the_cpu_run_has_the_cpu_methods_only_and_the_same_inputs():
    import argparse

    from rotary.tools.bench import harness

    options = argparse.Namespace(quick=False, compile=False, no_compile=False)
    cpu = {m.name for m in runner._selected_methods(options, "cpu")}
    gpu = {m.name for m in runner._selected_methods(options, "cuda")}
    assert "rope(q, k, position_ids=device ids)" not in cpu and "Liger rope (LigerRopeFunction)" not in cpu
    assert {"rotary pure-torch path", "complex form (Meta LLaMA)", "rotary-embedding-torch 0.9.1"} <= cpu - gpu
    assert {"rope(q, k, position_ids=device ids)", "flash-attn Triton rotary, out of place"} <= gpu - cpu
    # the inputs of a CPU group are what they were before --device: seed 0, drawn in order, cast
    shape = harness.SHAPES[1]
    inp = harness.make_inputs(shape, torch.bfloat16)
    g = torch.Generator().manual_seed(0)
    B, Hq, Hk, S, D = shape.batch, shape.q_heads, shape.k_heads, shape.seq_len, shape.head_dim
    q, k = (
        torch.randn(B, Hq, S, D, generator=g).to(torch.bfloat16),
        torch.randn(B, Hk, S, D, generator=g).to(torch.bfloat16),
    )
    assert torch.equal(inp.q, q) and torch.equal(inp.k, k) and not inp.interleaved
    cos, sin = harness.make_inputs(shape, torch.float32).rope.cos_sin(torch.arange(S))
    assert torch.equal(inp.cos, cos) and torch.equal(inp.hf_cos, cos.unsqueeze(0).to(torch.bfloat16))


@pytest.mark.parametrize("interleaved", [False, True])
def test_flash_attn_half_width_tables_are_one_value_per_pair(interleaved):
    from rotary.tools.bench import harness, methods

    inp = harness.make_inputs(harness.Shape("t", 2, 4, 2, 3, 16, start=5), torch.bfloat16, interleaved=interleaved)
    cos, sin = methods._half_width(inp)
    assert cos.shape == (8, 8) and cos.dtype == torch.bfloat16 and cos.is_contiguous()
    full = (lambda h: h.repeat_interleave(2, dim=1)) if interleaved else (lambda h: torch.cat([h, h], dim=1))
    assert torch.equal(full(cos), inp.table_cos.to(torch.bfloat16)) and torch.equal(
        full(sin), inp.table_sin.to(torch.bfloat16)
    )


def _check_gpu_rows_rotate_like_rope(device: str, interleaved: bool, compiled: bool = True) -> list[str]:
    """Every forward row of the GPU groups that can run here rotates q and k as ``rope(q, k)`` at the
    group's positions (the rows compare like with like); returns the rows checked. ``compiled=False``
    leaves out the ``torch.compile`` rows (their compilation is most of the time)."""
    from rotary.tools.bench import harness

    shape = harness.Shape("t", 2, 4, 2, 3, 64, start=7)
    checked = []
    for m in bench.METHODS:
        if (
            "cuda" not in m.devices
            or m.backward
            or m.name.startswith("limit")
            or (m.requires and not harness.installed(m.requires))
        ):
            continue
        if not compiled and "torch.compile" in m.name:
            continue
        inp = harness.make_inputs(shape, torch.float32, device=device, interleaved=interleaved)
        q0, k0 = inp.q.clone(), inp.k.clone()
        expected = inp.rope(q0, k0, offset=shape.start)
        call = m.make(inp)
        if call is None:
            assert interleaved and ("HF" in m.name or "Liger" in m.name)
            continue
        out = call()
        q, k = (inp.q, inp.k) if m.inplace else (out[0], out[1])
        torch.testing.assert_close(q, expected[0], atol=2e-6, rtol=2e-6, msg=m.name)
        torch.testing.assert_close(k, expected[1], atol=2e-6, rtol=2e-6, msg=m.name)
        checked.append(m.name)
    return checked


@pytest.mark.parametrize("interleaved", [False, True])
def test_the_gpu_rows_rotate_like_rope_on_the_cpu(interleaved):
    checked = _check_gpu_rows_rotate_like_rope("cpu", interleaved)
    rotary_rows = {
        "rotary fused, in place",
        "rotary fused, out of place",
        "rope(q, k, position_ids=device ids)",
        "rotary.apply_rotary, device cos/sin [S, D]",
        "rotary.apply_rotary, device tables [T, D] + position_ids",
    }
    assert rotary_rows <= set(checked)
    assert ("HF eager apply_rotary_pos_emb" in checked) == (not interleaved)


@pytest.mark.slow
def test_device_cuda_runs_every_group_through_the_gpu_path(stand_in, monkeypatch, capsys):
    """``--device cuda --quick`` end to end on the stand-in: every GPU group, both times per row,
    the GPU rows, half-pairing baselines only in half-pairing groups, fwd+bwd rows only in the training
    group, and a baseline that fails (to set up, or to run) is a row with a note, not the end of the run."""
    from rotary.tools.bench import harness

    def explode():
        raise RuntimeError("kernel exploded")

    extra = [
        harness.Method("broken baseline", lambda i: explode, devices=("cuda",)),
        harness.Method("unbuildable baseline", lambda i: explode(), devices=("cuda",)),
        harness.Method("cpu only", lambda i: lambda: None),
    ]
    monkeypatch.setattr(harness, "METHODS", harness.METHODS + extra)
    assert main(["bench", "--device", "cuda", "--quick", "--repeats", "1", "--json", "--suites", "none"]) == 0
    out, err = capsys.readouterr()
    data = json.loads(out)
    assert data["machine"]["device"] == "cpu" and "triton" in data["machine"]  # the stand-in's device
    rows = data["results"]
    groups = list(dict.fromkeys(r["group"] for r in rows))
    assert groups == [f"{g.shape.describe()} {g.dtypes[0]}" for g in harness.QUICK_CUDA_GROUPS]
    by_group = {g: {(r["method"], r["backward"]): r for r in rows if r["group"] == g} for g in groups}
    for group, found in by_group.items():
        names = {name for name, _ in found}
        assert {
            "limit: copy (clone)",
            "rope(q, k, position_ids=device ids)",
            "rotary.apply_rotary, device cos/sin [S, D]",
        } <= names
        assert "cpu only" not in names and "rotary pure-torch path" not in names
        assert ("HF eager apply_rotary_pos_emb" in names) == ("interleaved" not in group)
        assert any(backward for _, backward in found) == group.startswith("training")
        assert found[("limit: copy (clone)", False)]["ratios"]["x copy"] == 1.0
        assert found[("broken baseline", False)]["note"] == "failed: RuntimeError: kernel exploded"
        assert found[("broken baseline", False)]["median_s"] is None  # NaN in JSON: null
        assert found[("unbuildable baseline", False)]["note"] == "failed to set up: RuntimeError: kernel exploded"
        for key, r in found.items():
            if "baseline" in key[0]:
                continue
            assert r["median_s"] > 0 and r["host_s"] > 0 and r["gpu_timing"] in ("graph", "per call"), (group, key, r)
    training = by_group[groups[1]]
    assert training[("rotary fused, in place (training step)", True)]["gpu_timing"] == "per call"
    assert training[("HF eager apply_rotary_pos_emb", True)]["ratios"]["x copy"] > 0
    assert err.count("\n") <= 1  # at most the line naming the baselines not installed


def test_device_cuda_markdown_has_a_table_per_group(stand_in, capsys):
    argv = [
        "bench",
        "--device",
        "cuda",
        "--quick",
        "--repeats",
        "1",
        "--markdown",
        "--shapes",
        "decode-small",
        "--suites",
        "none",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    assert "### decode-small 4x8/2x1x64 at position 64 bf16" in out
    header = out.index("| method | GPU µs/call (graph) | x copy | host µs/call (eager) | note |")
    assert out[header + 1] == "|---|---:|---:|---:|---|"
    assert out[header + 2].startswith("| limit: in-place pass (mul_) | ") and "| 1.00 |" in out[header + 2]


def test_device_cuda_skips_the_baselines_it_cannot_import_in_one_line(stand_in, monkeypatch, capsys):
    for module in ("transformers", "liger_kernel", "flash_attn"):
        monkeypatch.setitem(sys.modules, module, None)
    argv = [
        "bench",
        "--device",
        "cuda",
        "--quick",
        "--repeats",
        "1",
        "--shapes",
        "decode-small",
        "--json",
        "--suites",
        "none",
    ]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert len(err.splitlines()) == 1 and err.startswith("rotary bench: skipped, not installed: ")
    assert "Liger rope (LigerRopeFunction) (needs liger_kernel.ops.rope)" in err
    assert (
        "flash-attn Triton rotary, out of place, flash-attn Triton rotary, in place "
        "(needs flash_attn.ops.triton.rotary)" in err
    )
    assert "HF eager apply_rotary_pos_emb (needs transformers)" in err
    assert err.rstrip().endswith("pip install transformers liger-kernel flash-attn")
    data = json.loads(out)
    assert {r["method"] for r in data["results"]}.isdisjoint(
        {"HF eager apply_rotary_pos_emb", "Liger rope (LigerRopeFunction)"}
    )
    assert data["machine"]["baselines"]["flash_attn.ops.triton.rotary"] == "not installed"


# on a GPU (`pytest -m cuda`; skipped without CUDA) ------------------------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize("interleaved", [False, True])
def test_cuda_the_gpu_rows_rotate_like_rope(interleaved):
    checked = _check_gpu_rows_rotate_like_rope("cuda", interleaved, compiled=False)
    assert "rope(q, k, position_ids=device ids)" in checked


@pytest.mark.cuda
def test_cuda_bench_quick_end_to_end():
    """``rotary bench --device cuda --quick`` on the GPU: every group, the limits captured in CUDA graphs
    and their own ratio, both times for every rotary row (by graph replay, or by events with a note
    saying why it could not be captured: whether rotary's hot paths capture is issue 20's own tests'
    business), and no row without a time that does not say why."""
    done = run_cli("bench", "--device", "cuda", "--quick", "--json", "--suites", "none", timeout=300)
    data = json.loads(done.stdout)
    assert data["machine"]["gpu"] and data["machine"]["device"].startswith("cuda")
    rows = data["results"]
    assert {r["group"].split()[0] for r in rows} == {
        "prefill-small",
        "training-small",
        "decode-small",
        "interleaved-small",
    }
    for r in rows:
        name = r["method"]
        if name.startswith("limit"):
            assert r["median_s"] > 0 and r["host_s"] > 0 and r["ratios"]["x copy"] == 1.0, r
            assert r["gpu_timing"] == ("per call" if "training step" in name else "graph"), r
        if name.startswith(("rotary", "rope(")):
            assert r["median_s"] > 0 and r["host_s"] > 0, r
            assert r["gpu_timing"] in ("graph", "per call") or r["note"].startswith("not capturable: "), r
        assert r["median_s"] is not None or r["note"], r  # no time: the note says why


def test_a_group_whose_inputs_cannot_be_made_is_one_row_and_the_others_run(stand_in, monkeypatch, capsys):
    from rotary.tools.bench import harness

    made = harness.make_inputs

    def make_inputs(shape, dtype, *args, **kwargs):
        if shape.name == "prefill-small":
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return made(shape, dtype, *args, **kwargs)

    monkeypatch.setattr(harness, "make_inputs", make_inputs)
    argv = [
        "bench",
        "--device",
        "cuda",
        "--quick",
        "--repeats",
        "1",
        "--shapes",
        "prefill-small,decode-small",
        "--json",
        "--suites",
        "none",
    ]
    assert main(argv) == 0
    rows = json.loads(capsys.readouterr().out)["results"]
    assert rows[0]["group"].startswith("prefill-small") and rows[0]["method"] == "(inputs)"
    assert (
        rows[0]["note"]
        == "failed to make the group's inputs: RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"
    )
    assert {r["group"] for r in rows[1:]} == {"decode-small 4x8/2x1x64 at position 64 bf16"} and len(rows) > 5


def test_cpu_kernel_ab_names_a_revision_it_cannot_read():
    """benchmarks/cpu_kernel_ab.py (an A/B of two builds of the CPU kernel): an unknown revision is one
    line naming it, before anything is built. Its ``main`` in this process: the script ends with
    ``SystemExit(message)``, which Python prints as that one line, without a traceback, and status 1."""
    import importlib.util

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "cpu_kernel_ab.py"
    spec = importlib.util.spec_from_file_location("cpu_kernel_ab", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    threads = torch.get_num_threads()
    try:
        with pytest.raises(SystemExit) as stop:
            module.main(["--against", "no-such-revision-xyz"])
    finally:
        torch.set_num_threads(threads)  # the script sets its --threads
    assert str(stop.value.code).startswith(
        "cpu_kernel_ab: cannot read src/rotary/kernels/cpu/rotary.cpp at 'no-such-revision-xyz'"
    )
