"""The suites of ``rotary bench`` beyond the RoPE groups: the fused ops (``rotate_and_cache``,
``rmsnorm_rotate``) and ``generation``, on the CPU and through the GPU path (on the CPU stand-in of
tests/test_bench.py). Times are never asserted, only that every row has one, that the ratios are the
row's time over its limit, and that what is timed computes what the table says."""

from __future__ import annotations

import argparse
import json
import sys

import pytest
import torch

from rotary.tools.bench import fused, generation
from rotary.tools.cli import main
from test_bench import stand_in  # noqa: F401  (the fixture)

FUSED = {
    "rotate_and_cache": ["rotary.rotate_and_cache", "torch composition (eager)"],
    "rmsnorm_rotate": ["rotary.rmsnorm_rotate", "rotary rms_norm + rotate (two steps)", "torch composition (eager)"],
}


def _json(capsys, *args: str) -> list[dict]:
    assert main(["bench", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)["results"]


@pytest.mark.parametrize("suite", sorted(FUSED))
def test_a_fused_suite_on_the_cpu_times_the_op_its_compositions_and_the_traffic_limit(suite, capsys):
    rows = _json(capsys, "--quick", "--shapes", "none", "--suites", suite, "--repeats", "1", "--dtypes", "fp32,bf16")
    groups = list(dict.fromkeys(r["group"] for r in rows))
    assert groups == [
        f"{suite} {s.describe()} {d}"
        for s in fused.suite_shapes(argparse.Namespace(quick=True), "cpu")
        for d in ("fp32", "bf16")
    ]
    for group in groups:
        found = {r["method"]: r for r in rows if r["group"] == group}
        assert list(found) == [*FUSED[suite], fused.TRAFFIC_LIMIT]  # --quick: no compiled row
        limit = found[fused.TRAFFIC_LIMIT]
        assert limit["median_s"] > 0 and limit["ratios"]["x traffic limit"] == 1.0 and "GB/s" in limit["note"]
        for name in FUSED[suite]:
            r = found[name]
            assert r["median_s"] > 0 and r["ratios"]["x traffic limit"] == pytest.approx(
                r["median_s"] / limit["median_s"]
            )
        # the fused op equals the composition it is checked against (else its note says by how much)
        assert found[FUSED[suite][0]]["note"] == "", found[FUSED[suite][0]]


def test_the_compiled_composition_row_is_timed_with_compile(capsys):
    rows = _json(
        capsys,
        "--quick",
        "--compile",
        "--shapes",
        "none",
        "--suites",
        "rotate_and_cache",
        "--repeats",
        "1",
        "--dtypes",
        "fp32",
    )
    compiled = [r for r in rows if r["method"] == "torch composition, torch.compile (Inductor)"]
    assert len(compiled) == 2 and all(r["median_s"] > 0 for r in compiled)


def test_the_compositions_compute_the_fused_ops():
    """The rows a fused op is measured against compute what it computes (so the ratio compares like
    with like): rotate_and_cache's composition writes the same cache rows and returns the same q, k."""
    import rotary

    shape = fused.FusedShape(2, 3, 4, 2, 16)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, h, 16, generator=g) for h in (4, 2, 2))
    ids = shape.positions(torch.device("cpu"))
    rope = rotary.RoPE(16, max_position=32)
    angles = torch.outer(torch.arange(32, dtype=torch.float64), rope.inv_freq.double())
    cache = torch.cat((angles.cos(), angles.sin()), dim=-1).float()
    caches = [torch.zeros(2, 8, 2, 16) for _ in range(4)]
    got = rotary.rotate_and_cache(q, k, v, caches[0], caches[1], ids, positions=ids, cos_sin_cache=cache)
    want = fused.rotate_and_cache_composition(q, k, v, caches[2], caches[3], ids, ids, cache)
    for a, b in zip((*got, caches[0], caches[1]), (*want, caches[2], caches[3])):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    assert caches[2][:, :3].abs().sum() > 0 and caches[2][:, 3:].abs().sum() == 0  # the slots 0..2 only

    wq, wk = torch.rand(16, generator=g) + 0.5, torch.rand(16, generator=g) + 0.5
    tables = rope.tables(ids)
    cos, sin = tables.gather()
    got = rotary.rmsnorm_rotate(q, k, wq, wk, tables, eps=1e-6, layout="bshd")
    want = fused.rmsnorm_rotate_composition(q, k, wq, wk, cos, sin, 1e-6)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_decoding_shapes_put_each_sequence_at_its_own_position():
    assert fused.FusedShape(3, 1).positions(torch.device("cpu")).tolist() == [[1000], [1001], [1002]]
    assert fused.FusedShape(2, 3).positions(torch.device("cpu")).tolist() == [[0, 1, 2], [0, 1, 2]]
    with pytest.raises(ValueError, match="shape '4x': give BxS with two positive integers"):
        fused.FusedShape.parse("4x")


def test_fused_suites_on_the_gpu_path_have_both_times(stand_in, capsys):  # noqa: F811
    rows = _json(
        capsys,
        "--device",
        "cuda",
        "--quick",
        "--shapes",
        "none",
        "--suites",
        "rotate_and_cache,rmsnorm_rotate",
        "--repeats",
        "1",
    )
    assert {r["group"].split()[0] for r in rows} == {"rotate_and_cache", "rmsnorm_rotate"}
    assert all(r["group"].endswith(" bf16") for r in rows)  # the device default
    for r in rows:
        if r["method"] == fused.TRAFFIC_LIMIT:
            assert r["gpu_timing"] == "computed" and r["host_s"] is None and r["median_s"] > 0
        else:
            assert r["gpu_timing"] == "graph" and r["median_s"] > 0 and r["host_s"] > 0, r
            assert r["ratios"]["x traffic limit"] > 0
    assert stand_in.captured  # the rows went through the CUDA-graph timer


def test_fused_groups_as_markdown(capsys):
    assert (
        main(
            [
                "bench",
                "--quick",
                "--shapes",
                "none",
                "--suites",
                "rmsnorm_rotate",
                "--repeats",
                "1",
                "--dtypes",
                "fp32",
                "--markdown",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out.splitlines()
    assert "### rmsnorm_rotate 4x1 (q 32 heads, k 8 heads, D 128) fp32" in out
    header = out.index("| method | µs/call | x traffic limit | note |")
    assert out[header + 1] == "|---|---:|---:|---|" and out[header + 2].startswith("| rotary.rmsnorm_rotate | ")


# generation ----------------------------------------------------------------------------------------


def test_the_generation_suite_times_every_row_on_the_cpu(capsys):
    pytest.importorskip("transformers")
    rows = _json(capsys, "--quick", "--compile", "--shapes", "none", "--suites", "generation", "--repeats", "1")
    shape = generation.SHAPES["quick"]
    assert {r["group"] for r in rows} == {shape.describe()}
    names = [r["method"] for r in rows]
    assert names == [n for n in generation.ROWS if n != "rotary static + CUDA graph"]  # CUDA only
    for r in rows:
        v = r["values"]
        assert r["kind"] == "generation" and r["median_s"] > 0 and v["first call s"] > 0, r
        # tokens/s and ms per step describe the same time: batch * new / seconds, seconds / new
        assert v["tokens/s"] == pytest.approx(shape.batch * shape.new / r["median_s"])
        assert v["ms per step"] == pytest.approx(r["median_s"] / shape.new * 1e3)
        assert v["vs HF static"] == pytest.approx(
            next(x["median_s"] for x in rows if x["method"] == "HF static") / r["median_s"]
        )
        assert v["same tokens"] == 1.0, r  # fp32 greedy: every way, HF included, picks the same tokens


def test_generation_without_transformers_keeps_rotary_rows_and_says_why_not_hf(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "transformers", None)
    rows = _json(capsys, "--quick", "--shapes", "none", "--suites", "generation", "--repeats", "1")
    by_name = {r["method"]: r for r in rows}
    assert [n for n in by_name if n.startswith("rotary")] == ["rotary dynamic", "rotary static"]
    for name in ("HF dynamic", "HF static", "HF dynamic + rotary.hf.patch", "HF static + rotary.hf.patch"):
        assert (
            by_name[name]["note"] == "needs transformers (pip install transformers)"
            and by_name[name]["median_s"] is None
        )
    assert "vs HF static" not in by_name["rotary static"]["values"]
    assert capsys.readouterr().err == ""


def test_generation_table_as_text(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "transformers", None)
    assert main(["bench", "--quick", "--shapes", "none", "--suites", "generation", "--repeats", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(out) if line.split()[:3] == ["generation", "tokens/s", "ms"])
    assert out[header + 1].split()[:2] == ["rotary", "dynamic"] and out[header + 1].split()[-1] == "yes"
    assert any(line.split()[:2] == ["HF", "static"] and "needs transformers" in line for line in out)


def test_generation_on_the_gpu_path_runs_on_the_backends_device(stand_in, monkeypatch, capsys):  # noqa: F811
    monkeypatch.setitem(sys.modules, "transformers", None)
    rows = _json(capsys, "--device", "cuda", "--quick", "--shapes", "none", "--suites", "generation", "--repeats", "1")
    assert [r["method"] for r in rows if r["median_s"]] == [
        "rotary dynamic",
        "rotary static",
    ]  # the stand-in is the CPU


def test_the_qk_norm_generation_suite_times_qwen3_patched_and_not(capsys):
    """generation_qk_norm: Hugging Face's Qwen3 with and without rotary.hf.patch (its fused QK-norm path),
    every row timed, the same greedy tokens (fp32), ratios over Qwen3's own static row."""
    pytest.importorskip("transformers")
    from rotary import hf

    rows = _json(capsys, "--quick", "--compile", "--shapes", "none", "--suites", "generation_qk_norm", "--repeats", "1")
    shape = generation.SHAPES["quick"]
    assert {r["group"] for r in rows} == {f"{shape.describe()}; Qwen3 (QK-norm)"}
    assert [r["method"] for r in rows] == list(generation.QK_NORM_ROWS)
    static = next(x["median_s"] for x in rows if x["method"] == "HF Qwen3 static")
    for r in rows:
        v = r["values"]
        assert r["kind"] == "generation" and r["median_s"] > 0 and v["same tokens"] == 1.0, r
        assert v["vs HF static"] == pytest.approx(static / r["median_s"])
    model = generation.build_qwen3(shape, torch.device("cpu"))
    assert not hf.is_patched(model) and hf.is_patched(hf.patch(model))
    assert any(
        name.endswith("q_norm.weight") and not torch.equal(p, torch.ones_like(p))
        for name, p in model.named_parameters()
    )


def test_qk_norm_generation_without_transformers_says_why(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "transformers", None)
    rows = _json(capsys, "--quick", "--shapes", "none", "--suites", "generation_qk_norm", "--repeats", "1")
    assert [r["method"] for r in rows] == [n for n in generation.QK_NORM_ROWS if "compile" not in n]
    assert all(r["note"] == "needs transformers (pip install transformers)" and r["median_s"] is None for r in rows)


def test_llama_state_names_every_weight():
    transformers = pytest.importorskip("transformers")
    shape = generation.GenerationShape(1, 32, 4, 2, 64, 50, "fp32", batch=1, prompt=2, new=1)
    decoder, llama = generation.build_models(shape, torch.device("cpu"), with_hf=True)
    assert isinstance(llama, transformers.LlamaForCausalLM)
    assert set(generation.llama_state(decoder)) == set(llama.state_dict())


def test_a_suite_that_runs_on_the_cpu_only_is_refused_by_name_on_a_device(stand_in, capsys):  # noqa: F811
    assert main(["bench", "--device", "cuda", "--suites", "rotate_and_cache,decode", "--shapes", "none"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--suites decode: this suite runs on cpu only, not with --device cuda" in err


@pytest.mark.cuda
def test_cuda_suites_quick_end_to_end():
    """On a GPU: the fused-op groups timed by graph replay (or saying why not) against a computed
    traffic limit, and every generation row, the CUDA-graph one included, with tokens/s."""
    from helpers import run_cli

    done = run_cli("bench", "--device", "cuda", "--quick", "--shapes", "none", "--json", "--repeats", "1", timeout=600)
    rows = json.loads(done.stdout)["results"]
    for r in rows:
        if r["kind"] == "fused" and r["method"] != fused.TRAFFIC_LIMIT:
            assert r["median_s"] > 0 and r["host_s"] > 0, r
            assert r["gpu_timing"] == "graph" or r["note"].startswith("not capturable: "), r
    generated = {r["method"]: r for r in rows if r["kind"] == "generation"}
    assert "rotary static + CUDA graph" in generated
    for name in ("rotary dynamic", "rotary static", "rotary static + CUDA graph"):
        assert generated[name]["values"]["tokens/s"] > 0, generated[name]


# what the command line selects --------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, message",
    [
        # nothing selected: not an empty table with status 0
        (["--shapes", "none", "--suites", "none"], "--shapes none --suites none: nothing to time"),
        # a bad dtype is refused before any group, not a KeyError from the decode suite or ignored by generation
        (["--shapes", "none", "--suites", "decode", "--dtypes", "fp32,bf61"], "unknown dtype 'bf61' in --dtypes"),
        (["--shapes", "none", "--suites", "generation", "--dtypes", "fp64"], "unknown dtype 'fp64' in --dtypes"),
        (["--shapes", "none", "--suites", "none", "--dtypes", "fp64"], "unknown dtype 'fp64' in --dtypes"),
        # names that match nothing are not dropped in silence because another one matched
        (["--shapes", "decode-small,nosuch", "--suites", "none"], "--shapes 'nosuch' names no shape; choose from"),
        (["--shapes", "", "--suites", "none"], "--shapes '' names no shape; choose from"),
        (["--shapes", "none,decode-small"], "--shapes none (no RoPE group) stands alone"),
        (["--suites", "none,generation"], "--suites none (no suite) stands alone"),
        # a name given twice would print its group twice, under one title
        (["--suites", "generation,generation"], "--suites 'generation,generation' names 'generation' more than once"),
        (["--dtypes", "fp32,fp32"], "--dtypes 'fp32,fp32' names 'fp32' more than once"),
        # contradictory switches: not one of them ignored
        (["--json", "--markdown"], "argument --markdown: not allowed with argument --json"),
        (["--compile", "--no-compile"], "argument --no-compile: not allowed with argument --compile"),
    ],
)
def test_bad_selections_are_one_line_errors_before_any_work(args, message, monkeypatch, capsys):
    from rotary.tools.bench import harness

    def work(*_args, **_kwargs):
        raise AssertionError("timed something before refusing the command line")

    monkeypatch.setattr(harness, "make_inputs", work)
    monkeypatch.setattr(harness, "SUITES", dict.fromkeys(harness.SUITES, work))
    try:
        status = main(["bench", "--quick", "--no-memory", "--repeats", "1", *args])
    except SystemExit as exc:  # argparse's own checks exit
        status = exc.code
    out, err = capsys.readouterr()
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("rotary bench: error: ") and message in err, err


def test_bad_selections_on_the_gpu_path_are_refused_too(stand_in, monkeypatch, capsys):  # noqa: F811
    from rotary.tools.bench import harness

    def work(*_args, **_kwargs):
        raise AssertionError("timed something before refusing the command line")

    monkeypatch.setattr(harness, "SUITES", dict.fromkeys(harness.SUITES, work))
    for args, message in [
        (["--shapes", "none", "--suites", "generation", "--dtypes", "fp64"], "unknown dtype 'fp64' in --dtypes"),
        (["--shapes", "none", "--suites", "none"], "nothing to time"),
        (["--shapes", "decode-small,gqa", "--suites", "none"], "--shapes 'gqa' names no GPU shape; with --device cuda"),
    ]:
        assert main(["bench", "--device", "cuda", "--quick", "--repeats", "1", *args]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1 and message in err, err


def test_progress_prints_each_suite_as_it_ends(capsys, tmp_path):
    """--progress: a suite's tables reach stderr when it ends (a run killed later keeps them), and the
    output file still gets everything."""
    out = tmp_path / "t.md"
    argv = [
        "bench",
        "--quick",
        "--shapes",
        "none",
        "--suites",
        "rmsnorm_rotate",
        "--repeats",
        "1",
        "--dtypes",
        "fp32",
        "--progress",
        "--markdown",
        "-o",
        str(out),
    ]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert err.startswith("  timed suite rmsnorm_rotate_suite (")
    assert "### rmsnorm_rotate 4x1 (q 32 heads, k 8 heads, D 128) fp32" in err
    assert "### rmsnorm_rotate 4x1 (q 32 heads, k 8 heads, D 128) fp32" in out.read_text()
