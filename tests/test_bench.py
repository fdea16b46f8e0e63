"""``rotary bench``: the quick run prints a table, --json is machine-readable, extra cases load from a file."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest
import torch

from helpers import run_cli
from rotary import bench
from rotary.cli import main


def run_bench(*args: str) -> subprocess.CompletedProcess:
    return run_cli("bench", *args, ok=None)


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


@pytest.mark.slow
def test_json_output_and_extra_cases(tmp_path):
    cases = tmp_path / "my_cases.py"
    cases.write_text(
        textwrap.dedent(
            """
            from rotary import bench

            bench.register_method(bench.Method("extra: q.add_(0)", lambda i: lambda: i.q.add_(0.0)))

            def suite(options):
                t = bench.time_interleaved({"noop": lambda: None}, options.repeats)
                return [bench.Result("my suite", "noop", False, t["noop"], options.repeats)]

            bench.register_suite("mine", suite)
            """
        )
    )
    done = run_bench(
        "--quick", "--repeats", "1", "--dtypes", "bf16", "--shapes", "decode", "--json", "--cases", str(cases)
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
    from rotary.bench import harness

    monkeypatch.setattr(harness, "SUITES", {})
    cases = tmp_path / "cases.py"
    cases.write_text("from rotary import bench\nbench.register_suite('mine', lambda options: [])\n")
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

    from rotary.bench import harness, methods

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
    harness._group_ratios(results)
    assert results[-1].ratios["x in-place pass"] == 2.5 and results[-1].ratios["x copy"] == 2.5 / 4.0
    assert results[1].ratios["x copy"] == 1.0


def test_without_the_baselines_packages_their_rows_are_skipped_with_one_line(monkeypatch, capsys):
    """As installed without [dev]: transformers and rotary-embedding-torch cannot be imported."""
    import argparse
    import sys

    from rotary.bench import methods

    monkeypatch.setitem(sys.modules, "transformers", None)
    monkeypatch.setitem(sys.modules, "rotary_embedding_torch", None)
    argv = ["bench", "--quick", "--no-memory", "--repeats", "1", "--dtypes", "fp32", "--shapes", "decode-small"]
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
    from rotary.bench import harness, methods

    assert (harness.TWO_COPIES, harness.INPLACE_TRAINING) == (methods.TWO_COPIES, methods.INPLACE_TRAINING)
    assert "from .methods" not in Path(harness.__file__).read_text()


@pytest.mark.slow
def test_compiled_module_row_runs_the_module_and_matches_it():
    import torch

    from rotary.bench import harness, methods

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

    from rotary.bench import harness

    def prepare():
        time.sleep(0.02)
        return lambda: time.sleep(0.002)

    medians = harness.time_interleaved(
        {"prepared": harness.Prepared(prepare), "plain": lambda: prepare()()}, repeats=3
    )
    assert 0.002 <= medians["prepared"] < 0.012 and medians["plain"] >= 0.022
    assert harness.allocations(harness.Prepared(lambda: (lambda: torch.empty(1024)))) == [4096]


@pytest.mark.parametrize("inplace", [True, False])
def test_the_training_step_rows_time_the_rotation_alone_with_the_out_of_place_gradients(inplace):
    """The rows' timed call: forward and backward of ``rope(q, k, inplace=...)``, allocating one
    gradient per input (the backward never writes into the gradient it receives) and, out of place,
    the two outputs; the leaves' gradients are exactly those of the out-of-place path with output
    gradients the caller holds."""
    from rotary.bench import harness, methods

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
    from rotary.bench import harness, methods

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
    harness._group_ratios(results)
    assert results[1].ratios["x fresh passes"] == 1.5 and "x fresh passes" not in results[2].ratios
    assert "x fresh passes (training step)" in harness.format_table({"cpu": "c", "logical_cpus": 1, "torch": "t", "torch_threads": 1}, results)

def test_the_training_step_overhead_script_times_its_three_steps(capsys):
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "training_step_overhead.py"
    spec = importlib.util.spec_from_file_location("training_step_overhead", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(["--shape", "2,2,8,16", "--repeats", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split("  ")[0] for line in out[:3]] == ["autograd only", "mul_ passes under autograd", "rope(q, k, inplace=True)"]
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
        assert [line[:22].strip() for line in out] == ["mul_ pass", "half, in place", "half, out of place", "interleaved, in place"]
        assert out[0].endswith("1.00x the pass")
    with pytest.raises(SystemExit):
        script.main(["--shape", "1,2,32,15"])
