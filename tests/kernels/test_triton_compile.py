"""rotary's Triton kernels compiled for NVIDIA GPUs on this machine, which has none.

``benchmarks/triton_compile.py`` launches every kernel configuration through rotary's launch functions
with a compile-only stand-in for Triton's CUDA driver: Triton compiles each launch to PTX and a cubin
(``ptxas`` ships in the triton wheel) and runs nothing. Triton's interpreter, which runs the kernels'
arithmetic in the other tests, accepts code that the GPU compiler rejects; these tests catch that, and
register spills and unvectorised accesses on the hot paths, without a GPU. Speed is not measured here.

The checks run in a fresh process: the interpreter must be off (other tests switch it on) and the
stand-in driver replaces Triton's for the whole process. One process, once per session however many
pytest-xdist workers run these tests, sweeps sm_90 (the eps check reads its launches: its two configurations are
in the sweep), then sm_80's serving shapes, then times the host-cost mode; before each, Triton's launch is
restored and its per-kernel caches (which hold the target) are emptied, as in a fresh process.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("triton")  # a test dependency (pyproject [test]); CUDA tensors take the torch path without it

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "triton_compile.py"


def _run(*args: str, code: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    command = [sys.executable, "-c", code] if code is not None else [sys.executable, str(SCRIPT), *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=900, cwd=ROOT)


def _lines(out: str) -> dict[str, str]:
    """configuration -> its report line (kernel, registers, accesses)."""
    found = {}
    for line in out.splitlines():
        m = re.match(r"^(ok|SPILLED|FAILED)\s+(\S+)\s+(.+?)\s+reg ", line)
        if m:
            found.setdefault(m.group(3).strip(), line)
    return found


SWEEPS = textwrap.dedent(
    """
    import gc, sys, traceback
    sys.path.insert(0, "benchmarks")
    from triton.runtime.jit import JITFunction
    import triton_compile as tc

    run = JITFunction.run

    def section(name, call):  # its report between "=== name" and "status name: ..."; one failing ends nothing
        print("===", name, flush=True)
        JITFunction.run = run  # Triton's launch as imported, the kernels' per-device caches (which hold the
        for fn in gc.get_objects():  # target) emptied, the launches forgotten: as in a fresh process
            if isinstance(fn, JITFunction):
                fn.device_caches.clear()
        tc.LAUNCHES.clear()
        try:
            status = call()
        except BaseException:
            traceback.print_exc(file=sys.stdout)
            status = "raised"
        print(f"status {name}:", status, flush=True)

    def sm90():
        status = tc.main(["--arch", "90"])
        for launch in tc.LAUNCHES:  # each rmsnorm_rotate launch's eps argument (the eps test)
            if launch.compiled is not None and launch.config.startswith("rmsnorm_rotate"):
                eps = launch.compiled.src.signature["eps"]
                print("eps:", launch.config, eps, "cvt.rn.f32.f64" in launch.compiled.asm["ptx"])
        return status

    def sm80():
        status = tc.main(["--arch", "80", "--hot"])
        archs = {launch.compiled.metadata.target.arch for launch in tc.LAUNCHES if launch.compiled is not None}
        return f"{status} targets {sorted(archs)}"

    def host():
        tc.host_costs.__defaults__ = (1, 20)  # repeats, calls: each path runs; how long it takes is not asserted
        sys.modules["transformers"] = None  # HF's line is for scale, no launch path of rotary: skipped (~2.5 s)
        return tc.main(["--host"])  # last: it patches rotary's device checks for the CUDA branches

    section("sm_90", sm90)
    section("sm_80 --hot", sm80)
    section("host", host)
    """
)


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory) -> dict[str, str]:
    """The reports of ``--arch 90`` (with the eps argument of every rmsnorm_rotate launch), ``--arch 80 --hot``
    and ``--host``, by section name, each ending in its status; one process per session (the first worker runs it
    under a lock, the others read what it wrote)."""
    import json

    from filelock import FileLock  # a dependency of torch

    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "triton-compile-sweeps.json"
    with FileLock(f"{shared}.lock"):
        if not shared.is_file():
            done = _run(code=SWEEPS)
            tail = f"\n(process status {done.returncode})\n{done.stderr[-4000:]}"
            sections = dict.fromkeys(("sm_90", "sm_80 --hot", "host"), "")
            for part in ("\n" + done.stdout).split("\n=== ")[1:]:
                name, _, report = part.partition("\n")
                sections[name] = report
            shared.write_text(json.dumps({name: report + tail for name, report in sections.items()}))
        return json.loads(shared.read_text())


@pytest.mark.slow
def test_every_kernel_configuration_compiles_for_sm90_without_spills(sweeps):
    stdout = sweeps["sm_90"]
    assert "status sm_90: 0" in stdout, stdout[-8000:]
    total = int(re.search(r"sm_90, triton \S+: (\d+) launches", stdout).group(1))
    assert total >= 60  # every kernel, dtype, pairing and option of the matrix
    assert f"{total} of {total} compiled without spills" in stdout
    kernels = set(re.findall(r"^ok\s+(\S+)", stdout, re.M))
    assert kernels == {"_rotary_kernel", "_rotate_cache_kernel", "_table_grad_kernel", "_norm_rotary_kernel"}
    # every program issues its global loads before its first global store (a load after a store cannot
    # move above it: a second memory round trip). rmsnorm_rotate stored rstd before loading the weight
    # and the tables, rotate_and_cache loaded k twice and v after both; partial rotary loaded the
    # pass-through channels after the rotated ones were stored
    assert "ld-after-st" not in stdout, [line for line in stdout.splitlines() if "ld-after-st" in line]


@pytest.mark.slow
def test_the_serving_kernels_compile_for_sm80_and_move_bf16_in_16_byte_accesses(sweeps):
    stdout = sweeps["sm_80 --hot"]
    assert "status sm_80 --hot: 0 targets [80]" in stdout, stdout[-8000:]
    lines = _lines(stdout)
    # head_dim 128, both pairings: every q/k/cache element moves in 16-byte vectors (ld/st.v4.b32); the
    # only scalar accesses left are a token's position and slot (b64) and RMSNorm's rstd (st.b32). The
    # interleaved pairing loads contiguous rows and splits the pairs in registers (it loaded each
    # channel's partner with 2- and 4-byte loads before)
    counts = {}
    for config in (
        "rotate bf16 half",
        "rotate bf16 half positions",
        "rotate_and_cache bf16 half",
        "rotate_and_cache bf16 half positions",
        "rmsnorm_rotate bf16 half",
        "rotate bf16 interleaved",
        "rotate_and_cache bf16 interleaved",
        "rmsnorm_rotate bf16 interleaved",
    ):
        line = lines[config]
        accesses = dict((k, int(n)) for k, n in re.findall(r"((?:ld|st)(?:\.v\d)?\.b\d+)x(\d+)", line))
        assert accesses.get("ld.v4.b32", 0) >= 12 and accesses.get("st.v4.b32", 0) >= 4, line
        scalar = {k for k in accesses if not k.startswith(("ld.v4", "st.v4"))}
        # (the interleaved RMSNorm loads its weight row [D], in the model's dtype, one value per thread, then
        # rearranges it into the pairs' layout in shared memory: 256 bytes per program, after the other loads)
        allowed = {"ld.b64", "st.b32"} | ({"ld.b16"} if config == "rmsnorm_rotate bf16 interleaved" else set())
        assert scalar <= allowed, line
        if "rmsnorm" not in config:
            assert "st.b32" not in scalar, line
        assert "ld-after-st" not in line, line
        counts[config] = accesses["ld.v4.b32"]
    # rotate_and_cache loads what the rotation loads (q and k, and their tables), plus v: k once, although
    # it is stored twice (k's output and the cache row); it loaded k and its tables twice before
    for pairing in ("half", "interleaved"):
        assert counts[f"rotate_and_cache bf16 {pairing}"] == counts[f"rotate bf16 {pairing}"] + 2, counts


@pytest.mark.slow
def test_rmsnorm_rotate_takes_eps_as_a_double_and_rounds_it_to_the_arithmetic_dtype(sweeps):
    # a Python float is passed to Triton as fp32: 1e-6 would have lost its low bits for fp64 inputs
    # (read from the sm_90 sweep's launches: a spill elsewhere in the sweep does not fail this test)
    stdout = sweeps["sm_90"]
    assert "eps: rmsnorm_rotate fp64 half partial fp64 False" in stdout, stdout[-8000:]  # double throughout
    assert "eps: rmsnorm_rotate fp32 half partial fp64 True" in stdout  # one rounding to fp32, as torch's


@pytest.mark.slow
def test_the_host_cost_mode_times_every_cuda_launch_path(sweeps):
    # --host sends CPU tensors down the CUDA branches to Triton's launch: a path that declined the inputs or
    # a launch that failed would time nothing, so each must run (no figure is asserted: timing is noisy here,
    # so each path is timed over 20 calls once instead of 2000 calls five times)
    stdout = sweeps["host"]
    assert "status host: 0" in stdout, stdout[-8000:]
    names = [line.split("µs", 1)[1].strip() for line in stdout.splitlines() if "µs" in line]
    assert names == [
        "Triton launch of the rotation (run_triton)",
        "Triton launch of rotate_and_cache",
        "rotary.rotate_and_cache, vLLM's form (checks included)",
        "rotary.rotate_and_cache, tables (checks included)",
        "rotary.rmsnorm_rotate, bf16 weights, tables (checks included)",
        "hf.patch's QK-norm apply on CUDA (rmsnorm_rotate, bf16 model tables)",
    ], stdout
