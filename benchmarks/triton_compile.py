"""Compile rotary's Triton kernels for an NVIDIA GPU on a machine without one, and report what the
compiler made of them.

Every kernel configuration rotary launches (the rotation, its table gradients, RoPE with the KV-cache
write, per-head RMSNorm with RoPE; each dtype, pairing, partial rotary, positions, per-head tables,
conjugation, in place) is launched through rotary's own launch functions on CPU tensors, with a stand-in
for Triton's CUDA driver: Triton specialises and compiles each launch for the chosen GPU
architecture (PTX, then a cubin by the ``ptxas`` that the triton wheel ships) and runs nothing.

This catches, without a GPU: kernels that fail to compile for a GPU (Triton's interpreter, which the
tests run on the CPU, accepts code that the compiler rejects), register spills (local memory), and
global loads and stores that are not vectorised, and loads issued after a store (a store may alias
what a later load reads, so the load cannot move above it: a second memory round trip in the
program). It times nothing: speed is measured on a GPU with
``rotary bench --device cuda``.

    python benchmarks/triton_compile.py                # sm_90 (H100, H200), every configuration
    python benchmarks/triton_compile.py --arch 80      # sm_80 (A100)
    python benchmarks/triton_compile.py --hot          # the serving shapes only (bf16, head_dim 128)
    python benchmarks/triton_compile.py --ptx /tmp/a   # and each launch's PTX, to diff two versions
    python benchmarks/triton_compile.py --host         # host time per call of the CUDA launch paths

Each line: kernel, configuration, registers per thread, local memory (spills), shared memory, and the
global loads/stores of the PTX by width (``v4.b32`` is 16 bytes), and ``ld-after-st N`` when N basic
blocks issue a global load after a global store. The exit status is 1 when a launch
failed to compile or spilled.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("triton_compile: unset TRITON_INTERPRET (the interpreter compiles nothing)")

import torch  # noqa: E402

try:
    import triton  # noqa: E402
    from triton.backends.compiler import GPUTarget  # noqa: E402
    from triton.runtime import driver  # noqa: E402
    from triton.runtime.jit import JITFunction  # noqa: E402
except ImportError:  # pragma: no cover - triton is a test dependency
    sys.exit("triton_compile: Triton is not installed (pip install -e '.[test]')")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
# Triton 3.9 warns that its default will change; the GPU runs use the same default as this compile
warnings.filterwarnings("ignore", message="TRITON_DEFAULT_FP_FUSION")

WARP = 32


class CompileOnlyDriver:
    """Stands in for Triton's CUDA driver: the target is the chosen architecture; nothing launches."""

    def __init__(self, arch: int):
        self.target = GPUTarget("cuda", arch, WARP)

    def is_active(self) -> bool:
        return True

    def get_current_target(self) -> GPUTarget:
        return self.target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cpu")

    def map_python_to_cpp_type(self, ty: str) -> str:
        return ty

    def __getattr__(self, name: str):
        raise RuntimeError(f"triton_compile: the compile-only driver has no {name!r} (nothing runs here)")


@dataclass
class Launch:
    kernel: str
    config: str
    compiled: object | None
    error: str | None


LAUNCHES: list[Launch] = []
_CONFIG = ["?"]


def _compile_instead_of_launch() -> None:
    """Every ``kernel[grid](...)`` compiles (Triton's warm-up) and records the compiled kernel."""
    run = JITFunction.run

    def compile_only(self, *args, grid, warmup, **kwargs):
        try:
            compiled = run(self, *args, grid=grid, warmup=True, **kwargs)
            LAUNCHES.append(Launch(self.__name__, _CONFIG[0], compiled, None))
        except Exception as error:  # report it, go on with the next configuration
            LAUNCHES.append(Launch(self.__name__, _CONFIG[0], None, f"{type(error).__name__}: {error}"))
        return None

    JITFunction.run = compile_only  # type: ignore[method-assign]


# configurations ---------------------------------------------------------------------------------


def _tables(r: int, interleaved: bool, dtype: torch.dtype, per_head: int = 0, rows: int = 16):
    from rotary.tables import cos_sin_table

    table_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    inv = torch.rand(per_head, 1, r // 2) + 0.1 if per_head else torch.rand(r // 2) + 0.1
    pos = torch.arange(rows)[:, None] if per_head else torch.arange(rows)
    return cos_sin_table(pos, inv, interleaved=interleaved, dtype=table_dtype)


def _rotation(
    q, k, r, interleaved, dtype, positions="none", per_head=False, separate_k=False, conjugate=False, outs=None
):
    from rotary.kernels.contract import Rotation

    B, S = q.shape[:2]
    cos, sin = _tables(r, interleaved, dtype, per_head=q.shape[2] if per_head else 0)
    k_cos, k_sin = (cos * 0.5, sin * 0.5) if separate_k else (cos, sin)
    if positions == "per_batch":
        pos, batch_rows = torch.randint(0, cos.shape[0], (B, S)), 0
    elif positions == "stacked":  # stacked per-batch tables [B * S, r], row b * S + s
        cos, sin = (t.repeat(B * S // t.shape[0] + 1, *[1] * (t.dim() - 1))[: B * S] for t in (cos, sin))
        k_cos, k_sin = cos, sin
        pos, batch_rows = None, S
    else:
        pos, batch_rows = None, 0
    outs = outs if outs is not None else (torch.empty_like(q), torch.empty_like(k))
    return Rotation((q, k), outs, (cos, k_cos), (sin, k_sin), pos, batch_rows, interleaved, conjugate)


def _qk(dtype, B=2, S=3, hq=4, hk=2, D=16, layout_qkv=False):
    if layout_qkv:  # strided views of a fused qkv projection
        base = torch.randn(B, S, hq + 2 * hk, D).to(dtype)
        return base[:, :, :hq], base[:, :, hq : hq + hk]
    return torch.randn(B, S, hq, D).to(dtype), torch.randn(B, S, hk, D).to(dtype)


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp64": torch.float64}


def configurations(hot: bool):
    """(name, call) for every configuration launched; ``hot``: the serving shapes only."""
    from rotary.kernels import norm
    from rotary.kernels import triton as tk

    calls = []

    def rotation_case(name, dtype, D=128, r=None, interleaved=False, hq=32, hk=8, qkv=False, inplace=False, **kw):
        def call():
            q, k = _qk(dtype, hq=hq, hk=hk, D=D, layout_qkv=qkv)
            rot = _rotation(q, k, r or D, interleaved, dtype, outs=(q, k) if inplace else None, **kw)
            tk.run_triton(rot)

        calls.append((f"rotate {name}", call))

    def cache_case(name, dtype, D=128, r=None, interleaved=False, dv=None, positions="none", bc=2, inplace=False):
        def call():
            q, k = _qk(dtype, hq=32, hk=8, D=D)
            v = torch.randn(2, 3, 8, dv or D).to(dtype)
            k_cache, v_cache = torch.zeros(bc, 64, 8, D).to(dtype), torch.zeros(bc, 64, 8, dv or D).to(dtype)
            slots = torch.randint(0, 64, (2, 3))
            rot = _rotation(q, k, r or D, interleaved, dtype, positions=positions, outs=(q, k) if inplace else None)
            tk.rotate_and_cache_triton(rot, v, k_cache, v_cache, slots)

        calls.append((f"rotate_and_cache {name}", call))

    def cos_sin_cache_case(name, dtype, interleaved=False, cache_dtype=torch.float32, r=128, int32=False):
        def call():  # vLLM's form: the kernel reads the cos_sin_cache halves at the positions, and checks the rows
            from rotary.kernels.contract import Rotation

            q, k = _qk(dtype, hq=32, hk=8, D=128)
            v = torch.randn(2, 3, 8, 128).to(dtype)
            k_cache, v_cache = torch.zeros(2, 64, 8, 128).to(dtype), torch.zeros(2, 64, 8, 128).to(dtype)
            slots = torch.randint(0, 64, (2, 3), dtype=torch.int32 if int32 else torch.int64)
            cache = torch.rand(512, r).to(cache_dtype)
            cos, sin = cache[:, : r // 2], cache[:, r // 2 :]
            positions = torch.randint(0, 512, (2, 3))
            rot = Rotation(
                (q, k), (torch.empty_like(q), torch.empty_like(k)), (cos, cos), (sin, sin), positions, 0, interleaved
            )
            tk.rotate_and_cache_triton(rot, v, k_cache, v_cache, slots, pair_tables=True)

        calls.append((f"rotate_and_cache {name}", call))

    def grad_case(name, dtype, D=64, r=None, interleaved=False, per_head=False, conjugate=False):
        def call():
            q, k = _qk(dtype, hq=32, hk=32 if per_head else 8, D=D)  # a model's heads
            rot = _rotation(q, k, r or D, interleaved, dtype, per_head=per_head, conjugate=conjugate)
            grads = tuple(torch.randn_like(x) for x in rot.xs)
            shape = lambda x: (*x.shape[: 3 if per_head else 2], r or D)  # noqa: E731  [B, S, (H,) r]
            buffers = [(torch.empty(shape(x)), torch.empty(shape(x))) for x in rot.xs]
            tk.table_grad_triton(rot, grads, buffers)

        calls.append((f"table_grad {name}", call))

    def norm_case(name, dtype, D=128, r=None, interleaved=False, round_normed=True, positions="none", hq=32, hk=8):
        def call():
            q, k = _qk(dtype, hq=hq, hk=hk, D=D)
            rot = _rotation(q, k, r or D, interleaved, dtype, positions=positions)
            compute = norm.compute_dtype(q)
            weights = [torch.rand(D).to(dtype) for _ in range(2)]  # a model's norm weights, in its dtype
            rstds = tuple(x.new_empty(x.shape[:3], dtype=compute) for x in rot.xs)
            norm.run_triton(rot, weights, rstds, round_normed, 1e-6)

        calls.append((f"rmsnorm_rotate {name}", call))

    # the serving shapes: bf16, head_dim 128, 32 query / 8 key-value heads
    rotation_case("bf16 half", torch.bfloat16)
    rotation_case("bf16 half positions", torch.bfloat16, positions="per_batch")
    rotation_case("bf16 half in place qkv views", torch.bfloat16, inplace=True, qkv=True)
    rotation_case("bf16 interleaved", torch.bfloat16, interleaved=True)
    cache_case("bf16 half", torch.bfloat16)
    cache_case("bf16 half positions", torch.bfloat16, positions="per_batch")
    cache_case("bf16 interleaved", torch.bfloat16, interleaved=True)
    cos_sin_cache_case("bf16 half cos_sin_cache", torch.bfloat16)
    cos_sin_cache_case("bf16 interleaved cos_sin_cache", torch.bfloat16, interleaved=True)
    norm_case("bf16 half", torch.bfloat16)
    norm_case("bf16 half positions", torch.bfloat16, positions="per_batch")
    norm_case("bf16 interleaved", torch.bfloat16, interleaved=True)
    grad_case("bf16 half", torch.bfloat16, D=128)
    if hot:
        return calls
    cos_sin_cache_case(
        "fp16 half bf16 cos_sin_cache r64 int32 slots", torch.float16, cache_dtype=torch.bfloat16, r=64, int32=True
    )
    cos_sin_cache_case("fp32 interleaved cos_sin_cache r96", torch.float32, interleaved=True, r=96)
    for tag, dtype in DTYPES.items():
        for interleaved in (False, True):
            pairing = "interleaved" if interleaved else "half"
            rotation_case(f"{tag} {pairing} D64 partial", dtype, D=64, r=32, interleaved=interleaved, hq=4, hk=2)
            rotation_case(
                f"{tag} {pairing} conjugate stacked",
                dtype,
                D=64,
                interleaved=interleaved,
                hq=4,
                hk=2,
                conjugate=True,
                positions="stacked",
            )
            cache_case(
                f"{tag} {pairing} partial dv",
                dtype,
                D=64,
                r=48,
                interleaved=interleaved,
                dv=32,
                positions="per_batch",
                bc=1,
            )
            grad_case(f"{tag} {pairing}", dtype, interleaved=interleaved, conjugate=interleaved)
            norm_case(
                f"{tag} {pairing} partial",
                dtype,
                D=64,
                r=32,
                interleaved=interleaved,
                round_normed=not interleaved,
                hq=4,
                hk=2,
            )
    rotation_case(
        "fp32 half per-head tables separate k", torch.float32, D=32, hq=4, hk=4, per_head=True, separate_k=True
    )
    rotation_case("fp16 half q alone odd heads", torch.float16, D=96, hq=5, hk=0)  # k with no heads
    cache_case("fp16 half in place", torch.float16, inplace=True)
    grad_case("fp32 half per-head", torch.float32, per_head=True)

    def wide(case, *args, **kw):  # the int64-offset form (WIDE) of a case: storages of 2^31 elements or more
        case(*args, **kw)
        label, call = calls.pop()

        def forced():
            real = tk.wide_offsets
            tk.wide_offsets = lambda *tensors: True
            try:
                call()
            finally:
                tk.wide_offsets = real

        calls.append((f"{label} int64 offsets", forced))

    wide(rotation_case, "bf16 half positions", torch.bfloat16, positions="per_batch")
    wide(cache_case, "bf16 half", torch.bfloat16)
    wide(norm_case, "bf16 half positions", torch.bfloat16, positions="per_batch")
    wide(grad_case, "bf16 half", torch.bfloat16, D=128)
    return calls


# reading the compiled kernels ------------------------------------------------------------------

_TOOLS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
_ACCESS = re.compile(r"\b((?:ld|st)\.global(?:\.[a-z0-9]+)*)")


def loads_after_stores(ptx: str) -> int:
    """The basic blocks of ``ptx`` in which a global load comes after a global store. The GPU keeps their
    order (the addresses may alias), so such a load starts only once the code before the store has run:
    one more memory round trip for the program than loading everything first."""
    blocks = 0
    stored = counted = False
    for line in ptx.splitlines():
        line = line.strip()
        if re.match(r"^\$L__BB\w*:", line):  # a new basic block
            stored = counted = False
        elif re.search(r"\bst\.global", line):
            stored = True
        elif stored and not counted and re.search(r"\bld\.global", line):
            blocks += 1
            counted = True
    return blocks


def resources(cubin: bytes) -> dict[str, int]:
    """REG, STACK, LOCAL, SHARED of the kernel in ``cubin`` (``cuobjdump -res-usage``)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run(
            [str(_TOOLS / "cuobjdump"), "-res-usage", f.name], capture_output=True, text=True, check=True
        ).stdout
    found = dict(re.findall(r"\b(REG|STACK|LOCAL|SHARED):(\d+)", out))
    return {k: int(v) for k, v in found.items()}


def accesses(ptx: str) -> collections.Counter:
    """Global loads and stores of ``ptx`` by width, e.g. ``ld.v4.b32`` (without cache hints)."""
    counts: collections.Counter = collections.Counter()
    for op in _ACCESS.findall(ptx):
        parts = op.split(".")
        kind = parts[0]
        width = [p for p in parts[2:] if re.fullmatch(r"v\d|[busf]\d+", p)]
        counts[".".join([kind, *width])] += 1
    return counts


def compile_all(arch: int, hot: bool = False, only: set[str] | None = None) -> list[Launch]:
    """Compile the configurations (``only``: those names) for ``sm_<arch>``; one :class:`Launch` each
    kernel launch (a configuration that launched nothing is a failed one). Once per process."""
    driver.set_active(CompileOnlyDriver(arch))
    _compile_instead_of_launch()
    torch.manual_seed(0)
    for name, call in configurations(hot):
        if only is not None and name not in only:
            continue
        _CONFIG[0] = name
        before = len(LAUNCHES)
        try:
            call()
        except Exception as error:
            LAUNCHES.append(Launch("?", name, None, f"{type(error).__name__}: {error}"))
        if len(LAUNCHES) == before:
            LAUNCHES.append(Launch("?", name, None, "no Triton launch"))
    return LAUNCHES


def host_costs(repeats: int = 5, calls: int = 2000) -> list[tuple[str, float]]:
    """Host time per call of rotary's CUDA launch paths, on this machine's CPU: ``(name, µs)``.

    CPU tensors go down the CUDA branches (the decoding fast path, hf.patch's model-tables path, the
    fused cache write) to the Triton launch, which runs as far as Triton's own launch preparation
    (binding and specialising the arguments, the compiled-kernel lookup) and stops before the driver's
    launcher: a GPU host adds that (a few µs) and its CUDA tensor allocations. Shapes: a decoding step of
    the generation suite's Llama (batch 8, 16 query / 4 key-value heads, head_dim 64, bf16). Hugging
    Face's ``apply_rotary_pos_emb`` is timed in CPU operations for scale (on a GPU each of its ~10
    operations is a CUDA launch). Once per process, as :func:`compile_all`."""
    import time

    driver.set_active(CompileOnlyDriver(90))
    run = JITFunction.run
    JITFunction.run = lambda self, *a, grid, warmup, **kw: run(self, *a, grid=grid, warmup=True, **kw)  # type: ignore[method-assign]
    torch.set_num_threads(1)
    import rotary
    from rotary import devices, serving
    from rotary.kernels import triton as tk
    from rotary.kernels.contract import Rotation
    from rotary.tables import cos_sin_table

    devices.host_checks = lambda device: False  # as on an accelerator: nothing read on the host
    serving._fused_kernel_device = lambda q: True  # rotate_and_cache's CUDA branch
    from rotary.kernels import norm

    norm._backend = lambda rotation: "triton"  # rmsnorm_rotate's
    B, HQ, HK, D = 8, 16, 4, 64
    q, k, v = (torch.randn(B, h, 1, D).to(torch.bfloat16) for h in (HQ, HK, HK))
    cos, sin = cos_sin_table(torch.arange(512), 1.0 / 10000 ** (torch.arange(0, D, 2) / D), interleaved=False)
    model_cos, model_sin = (t[300:301].expand(B, 1, D).to(torch.bfloat16) for t in (cos, sin))  # HF's [B, S, D]
    qv, kv, vv = (t.transpose(1, 2) for t in (q, k, v))
    outs = (torch.empty_like(qv), torch.empty_like(kv))
    rotation = Rotation((qv, kv), outs, (cos[300:], cos[300:]), (sin[300:], sin[300:]), None, 0, False)
    k_cache, v_cache = torch.zeros(B, 512, HK, D).to(torch.bfloat16), torch.zeros(B, 512, HK, D).to(torch.bfloat16)
    slots = torch.full((B, 1), 300)
    cache_rotation = rotation.replace(positions=slots)
    cos_sin_cache = torch.cat((cos[:, : D // 2], sin[:, : D // 2]), dim=-1)  # vLLM's layout
    pos, tables = slots.clone(), rotary.RoPE(D).tables(slots)
    weight = torch.rand(D).to(torch.bfloat16)  # a QK-norm's weight in a bf16 model
    cases = {
        "Triton launch of the rotation (run_triton)": lambda: tk.run_triton(rotation),
        "Triton launch of rotate_and_cache": lambda: tk.rotate_and_cache_triton(
            cache_rotation, vv, k_cache, v_cache, slots
        ),
        "rotary.rotate_and_cache, vLLM's form (checks included)": lambda: rotary.rotate_and_cache(
            qv, kv, vv, k_cache, v_cache, slots, positions=pos, cos_sin_cache=cos_sin_cache
        ),
        "rotary.rotate_and_cache, tables (checks included)": lambda: rotary.rotate_and_cache(
            qv, kv, vv, k_cache, v_cache, slots, tables
        ),
        "rotary.rmsnorm_rotate, bf16 weights, tables (checks included)": lambda: rotary.rmsnorm_rotate(
            q, k, weight, weight, tables
        ),
        "hf.patch's QK-norm apply on CUDA (rmsnorm_rotate, bf16 model tables)": lambda: rotary.rmsnorm_rotate(
            q, k, weight, weight, rotary.RotaryTables.unchecked(model_cos, model_sin, False)
        ),
    }
    try:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        cases["for scale: HF apply_rotary_pos_emb in CPU operations"] = lambda: apply_rotary_pos_emb(
            q, k, model_cos, model_sin
        )
    except ImportError:
        pass
    results = []
    for name, call in cases.items():
        call()  # compiles once
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(calls):
                call()
            best = min(best, (time.perf_counter() - start) / calls)
        results.append((name, best * 1e6))
    return results


def code_only(ptx: str) -> str:
    """``ptx`` without its debug records (line records, their labels, the DWARF sections), which change
    whenever source lines move: two kernels that compile to the same code give the same text."""
    code = ptx.split("\t.section\t.debug", 1)[0]
    keep = (line for line in code.splitlines() if not line.lstrip().startswith((".loc", ".file", "$L__tmp")))
    return "\n".join(keep) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability x10 (default 90: H100/H200)")
    parser.add_argument("--hot", action="store_true", help="the serving shapes only")
    parser.add_argument(
        "--ptx", metavar="DIR", help="also write each launch's PTX there (to diff two versions of a kernel)"
    )
    parser.add_argument(
        "--host", action="store_true", help="instead: host time per call of the CUDA launch paths, on this CPU"
    )
    args = parser.parse_args(argv)
    if args.host:
        for name, micros in host_costs():
            print(f"{micros:7.1f} µs  {name}")
        return 0
    compile_all(args.arch, args.hot)
    if args.ptx:
        Path(args.ptx).mkdir(parents=True, exist_ok=True)
        for i, launch in enumerate(LAUNCHES):
            if launch.compiled is not None:
                name = re.sub(r"[^\w]+", "_", f"{i:02d} {launch.config} {launch.kernel}")
                ptx = code_only(launch.compiled.asm["ptx"])
                (Path(args.ptx) / f"{name}.ptx").write_text(ptx)
    failed = 0
    print(f"sm_{args.arch}, triton {triton.__version__}: {len(LAUNCHES)} launches")
    for launch in LAUNCHES:
        if launch.compiled is None:
            failed += 1
            print(f"FAILED  {launch.kernel:22s} {launch.config}: {launch.error}")
            continue
        use = resources(launch.compiled.asm["cubin"])
        spilled = use.get("LOCAL", 0) > 0 or use.get("STACK", 0) > 0
        failed += spilled
        counts = accesses(launch.compiled.asm["ptx"])
        access = " ".join(f"{k}x{v}" for k, v in sorted(counts.items()))
        late = loads_after_stores(launch.compiled.asm["ptx"])
        print(
            f"{'SPILLED' if spilled else 'ok':7s} {launch.kernel:22s} {launch.config:48s} reg {use.get('REG', 0):3d} "
            f"local {use.get('LOCAL', 0)} shared {use.get('SHARED', 0)}  {access}"
            + (f"  ld-after-st {late}" if late else "")
        )
    print(f"{len(LAUNCHES) - failed} of {len(LAUNCHES)} compiled without spills")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
