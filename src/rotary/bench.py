"""``rotary bench``: how fast RoPE is applied, against Hugging Face and the memory-traffic limit.

Applying RoPE reads q and k and writes them back; nothing else is needed. Two proxies bound what any
implementation can reach on the machine at hand: one in-place pass over q and k (``mul_(1.0)``) and
one out-of-place copy (``clone``). Every method is timed in one process, with the methods of a
group (one shape, one dtype) interleaved repeat after repeat, so that a neighbour's load on a shared
machine hits all of them alike; the median is reported. Ratios are taken within a group.

Adding a case: a *method* is a function ``make(inputs) -> call`` returning the zero-argument
callable to time (see :class:`Inputs`); register it with :func:`register_method`. A whole
different kind of measurement (e.g. a patched vs unpatched model forward) is a *suite*: a function
``suite(options) -> list[Result]`` registered with :func:`register_suite`; it can use
:func:`time_interleaved` and :func:`extra_peak_bytes`. Files defining either are loaded with
``rotary bench --cases FILE.py`` (see ``benchmarks/``).
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from .cli import positive_int

__all__ = [
    "Inputs",
    "Method",
    "Result",
    "SHAPES",
    "METHODS",
    "register_method",
    "register_suite",
    "time_interleaved",
    "extra_peak_bytes",
    "run",
    "register",
]


@dataclass(frozen=True)
class Shape:
    """q ``[B, Hq, S, D]`` and k ``[B, Hk, S, D]``."""

    name: str
    batch: int
    q_heads: int
    k_heads: int
    seq_len: int
    head_dim: int

    def describe(self) -> str:
        heads = f"{self.q_heads}" if self.q_heads == self.k_heads else f"{self.q_heads}/{self.k_heads}"
        return f"{self.name} {self.batch}x{heads}x{self.seq_len}x{self.head_dim}"


SHAPES = [
    Shape("prefill", 1, 32, 32, 2048, 128),  # LLaMA-7B prefill
    Shape("training", 8, 12, 12, 512, 64),
    Shape("gqa", 1, 32, 8, 4096, 128),
    Shape("decode", 16, 32, 32, 1, 128),
]
QUICK_SHAPES = [Shape("prefill-small", 1, 4, 4, 128, 64), Shape("decode-small", 2, 4, 4, 1, 64)]


@dataclass
class Inputs:
    """Everything a method needs, built once per group: q/k (``bhsd``, contiguous), tables in each form."""

    shape: Shape
    dtype: torch.dtype
    q: torch.Tensor
    k: torch.Tensor
    rope: Any  # rotary.RoPE
    cos: torch.Tensor  # fp32 [S, D], rotary's tables
    sin: torch.Tensor
    hf_cos: torch.Tensor  # [1, S, D] in q's dtype, as Hugging Face's rotary embedding returns them
    hf_sin: torch.Tensor
    grad_q: torch.Tensor
    grad_k: torch.Tensor


@dataclass(frozen=True)
class Method:
    """One timed way of rotating q and k. ``backward``: the call runs forward and backward."""

    name: str
    make: Callable[[Inputs], Callable[[], object]]
    backward: bool = False
    note: str = ""


@dataclass
class Result:
    group: str  # e.g. "prefill 1x32x2048x128 fp32"
    method: str
    backward: bool
    median_s: float
    repeats: int
    extra_peak_bytes: int | None = None
    ratios: dict[str, float] = field(default_factory=dict)
    note: str = ""


METHODS: list[Method] = []
SUITES: dict[str, Callable[[argparse.Namespace], list[Result]]] = {}


def register_method(method: Method) -> Method:
    """Add a method to every shape/dtype group."""
    METHODS.append(method)
    return method


def register_suite(name: str, suite: Callable[[argparse.Namespace], list[Result]]) -> None:
    """Add a suite: ``suite(options)`` returns its own results (own groups), printed after the RoPE groups."""
    SUITES[name] = suite


# methods ---------------------------------------------------------------------------------------


def _fwd_bwd(forward: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]], inp: Inputs):
    q, k = inp.q.detach().clone().requires_grad_(), inp.k.detach().clone().requires_grad_()

    def call() -> None:
        q.grad = k.grad = None
        qo, ko = forward(q, k)
        torch.autograd.backward((qo, ko), (inp.grad_q, inp.grad_k))

    return call


def _hf():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    return apply_rotary_pos_emb


def _hf_compiled():
    global _HF_COMPILED
    if _HF_COMPILED is None:
        import torch._dynamo

        # every shape x dtype x grad mode is one more specialisation of the same function: without
        # a higher limit dynamo would stop compiling after 8 and silently run the rest eagerly
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 256)
        torch._dynamo.config.accumulated_recompile_limit = max(torch._dynamo.config.accumulated_recompile_limit, 4096)
        # compile in this process: a pool of compile workers starting up in the background would
        # take CPU from whatever group is being timed at that moment
        import torch._inductor.config

        torch._inductor.config.compile_threads = 1
        _HF_COMPILED = torch.compile(_hf(), dynamic=False)
    return _HF_COMPILED


_HF_COMPILED = None


def _complex_form(inp: Inputs) -> Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """Meta LLaMA's form: pairs (2i, 2i+1) as complex numbers times a precomputed ``freqs_cis``."""
    S = inp.shape.seq_len
    freqs_cis = torch.polar(torch.ones(S, inp.shape.head_dim // 2), torch.outer(torch.arange(S).float(), inp.rope.inv_freq))

    def forward(q, k):
        out = []
        for x in (q, k):
            xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
            out.append(torch.view_as_real(xc * freqs_cis).flatten(-2).type_as(x))
        return out[0], out[1]

    return forward


def _ret(inp: Inputs):
    from rotary_embedding_torch import RotaryEmbedding

    emb = RotaryEmbedding(dim=inp.shape.head_dim)

    def forward(q, k):
        return emb.rotate_queries_or_keys(q), emb.rotate_queries_or_keys(k)

    return forward


def _torch_path(inp: Inputs):
    from .kernels.eager import rotate_torch

    c, s = inp.cos.view(1, 1, *inp.cos.shape), inp.sin.view(1, 1, *inp.sin.shape)

    def forward(q, k):
        return (
            rotate_torch(q, c, s, interleaved=False, inplace=False),
            rotate_torch(k, c, s, interleaved=False, inplace=False),
        )

    return forward


def _inplace_forward_backward(inp: Inputs):
    # In-place rotation needs a non-leaf input (as q straight out of a projection is): one cheap
    # q * 1 per call makes it, and is part of what is timed.
    q_leaf, k_leaf = inp.q.detach().clone().requires_grad_(), inp.k.detach().clone().requires_grad_()

    def call() -> None:
        q_leaf.grad = k_leaf.grad = None
        q, k = q_leaf * 1, k_leaf * 1
        inp.rope(q, k, inplace=True)
        torch.autograd.backward((q, k), (inp.grad_q, inp.grad_k))

    return call


def _builtin_methods() -> list[Method]:
    return [
        Method("limit: in-place pass (mul_)", lambda i: lambda: (i.q.mul_(1.0), i.k.mul_(1.0))),
        Method("limit: copy (clone)", lambda i: lambda: (i.q.clone(), i.k.clone())),
        Method("rotary fused, in place", lambda i: lambda: i.rope(i.q, i.k, inplace=True)),
        Method("rotary fused, out of place", lambda i: lambda: i.rope(i.q, i.k)),
        Method("rotary pure-torch path", lambda i: (lambda f: lambda: f(i.q, i.k))(_torch_path(i))),
        Method("HF eager apply_rotary_pos_emb", lambda i: lambda: _hf()(i.q, i.k, i.hf_cos, i.hf_sin)),
        Method("HF under torch.compile", lambda i: lambda: _hf_compiled()(i.q, i.k, i.hf_cos, i.hf_sin)),
        Method("rotary-embedding-torch 0.9.1", lambda i: (lambda f: lambda: f(i.q, i.k))(_ret(i))),
        Method("complex form (Meta LLaMA)", lambda i: (lambda f: lambda: f(i.q, i.k))(_complex_form(i))),
        # forward + backward
        Method("rotary fused, out of place", lambda i: _fwd_bwd(lambda q, k: i.rope(q, k), i), backward=True),
        Method(
            "rotary fused, in place",
            _inplace_forward_backward,
            backward=True,
            note="includes one q*1, k*1 to make non-leaf inputs",
        ),
        Method("rotary pure-torch path", lambda i: _fwd_bwd(_torch_path(i), i), backward=True),
        Method(
            "HF eager apply_rotary_pos_emb",
            lambda i: _fwd_bwd(lambda q, k: _hf()(q, k, i.hf_cos, i.hf_sin), i),
            backward=True,
        ),
        Method(
            "HF under torch.compile",
            lambda i: _fwd_bwd(lambda q, k: _hf_compiled()(q, k, i.hf_cos, i.hf_sin), i),
            backward=True,
        ),
        Method("rotary-embedding-torch 0.9.1", lambda i: _fwd_bwd(_ret(i), i), backward=True),
        Method("complex form (Meta LLaMA)", lambda i: _fwd_bwd(_complex_form(i), i), backward=True),
    ]


METHODS.extend(_builtin_methods())

# measurement -----------------------------------------------------------------------------------


def _per_call_loops(call: Callable[[], object], budget_s: float = 2e-3) -> int:
    """Calls per sample so one sample lasts about ``budget_s`` (tiny decode calls are ~10 µs)."""
    start = time.perf_counter()
    call()
    once = time.perf_counter() - start
    return max(1, min(1000, int(budget_s / max(once, 1e-7))))


def time_interleaved(calls: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median seconds per call of each callable, sampling them in turn ``repeats`` times."""
    for call in calls.values():  # warm up (first-call allocation, compilation, caches)
        call()
        call()
    loops = {name: _per_call_loops(call) for name, call in calls.items()}
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            n = loops[name]
            start = time.perf_counter()
            for _ in range(n):
                call()
            samples[name].append((time.perf_counter() - start) / n)
    return {name: statistics.median(values) for name, values in samples.items()}


def _status_bytes(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


_MALLOC_PINNED = False


def extra_peak_bytes(call: Callable[[], object]) -> int | None:
    """Peak resident memory added while ``call`` runs (Linux only; ``None`` elsewhere).

    glibc serves large blocks with mmap and returns them on free; pinning the mmap threshold at
    128 KiB (glibc otherwise raises it after the first free and reuses resident heap memory) makes
    every temporary the size of q or k show up in the peak. ``/proc/self/clear_refs`` resets the peak.
    The pin lasts for the rest of the process (glibc cannot undo it), so call this after all timing.
    """
    global _MALLOC_PINNED
    try:
        if not _MALLOC_PINNED:
            ctypes.CDLL("libc.so.6").mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD
            _MALLOC_PINNED = True
        best = None
        for _ in range(2):  # the smaller of two: the first may still fault in lazily mapped pages
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            before = _status_bytes("VmRSS:")
            call()
            extra = max(0, _status_bytes("VmHWM:") - before)
            best = extra if best is None else min(best, extra)
        return best
    except (OSError, KeyError, AttributeError):
        return None


def _make_inputs(shape: Shape, dtype: torch.dtype, seed: int = 0) -> Inputs:
    from .module import RoPE

    g = torch.Generator().manual_seed(seed)
    B, Hq, Hk, S, D = shape.batch, shape.q_heads, shape.k_heads, shape.seq_len, shape.head_dim
    rope = RoPE(D, max_position=max(S, 1))
    cos, sin = rope.cos_sin(torch.arange(S))
    return Inputs(
        shape=shape,
        dtype=dtype,
        q=torch.randn(B, Hq, S, D, generator=g).to(dtype),
        k=torch.randn(B, Hk, S, D, generator=g).to(dtype),
        rope=rope,
        cos=cos,
        sin=sin,
        hf_cos=cos.unsqueeze(0).to(dtype),
        hf_sin=sin.unsqueeze(0).to(dtype),
        grad_q=torch.randn(B, Hq, S, D, generator=g).to(dtype),
        grad_k=torch.randn(B, Hk, S, D, generator=g).to(dtype),
    )


DTYPE_NAMES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _group_ratios(results: list[Result]) -> None:
    by_key = {(r.method, r.backward): r.median_s for r in results}
    mul = by_key.get(("limit: in-place pass (mul_)", False))
    clone = by_key.get(("limit: copy (clone)", False))
    for r in results:
        if mul:
            r.ratios["x in-place pass"] = r.median_s / mul
        if clone:
            r.ratios["x copy"] = r.median_s / clone
        hf = by_key.get(("HF eager apply_rotary_pos_emb", r.backward))
        if hf:
            r.ratios["HF eager speedup"] = hf / r.median_s


def run(options: argparse.Namespace) -> tuple[dict[str, Any], list[Result]]:
    """Run the benchmark as the command line describes; returns (machine info, results)."""
    from .kernels.extension import cpu_extension_error, load_cpu_extension

    if options.threads:
        torch.set_num_threads(options.threads)
    for path in options.cases or []:
        _load_cases(path)
    machine = _machine()
    machine["fused_cpu_kernel"] = "loaded" if load_cpu_extension() is not None else f"unavailable: {cpu_extension_error()}"
    shapes = QUICK_SHAPES if options.quick else SHAPES
    if options.shapes:
        wanted = set(options.shapes.split(","))
        shapes = [s for s in SHAPES + QUICK_SHAPES if s.name in wanted]
        if not shapes:
            raise ValueError(f"--shapes {options.shapes!r} names no shape; choose from {[s.name for s in SHAPES + QUICK_SHAPES]}")
    methods = [m for m in METHODS if not (options.quick and "torch.compile" in m.name and not options.compile)]
    if options.no_compile:
        methods = [m for m in methods if "torch.compile" not in m.name]
    results: list[Result] = []
    # memory is measured after all timing: extra_peak_bytes pins glibc's mmap threshold for the rest of
    # the process, which makes every large allocation fault its pages in again and would slow every
    # out-of-place method timed after it (measured: fwd+bwd 43 ms pinned vs 17 ms unpinned at prefill)
    memory_work: list[tuple[list[Result], list[Method], dict]] = []
    for shape in shapes:
        for dtype_name in options.dtypes.split(","):
            if dtype_name not in DTYPE_NAMES:
                raise ValueError(f"unknown dtype {dtype_name!r} in --dtypes; use fp32, bf16 or fp16")
            group = f"{shape.describe()} {dtype_name}"
            inp = _make_inputs(shape, DTYPE_NAMES[dtype_name])
            calls = {}
            for m in methods:
                calls[(m.name, m.backward)] = m.make(inp)
            medians = time_interleaved(calls, options.repeats)  # type: ignore[arg-type]
            group_results = [
                Result(group, m.name, m.backward, medians[(m.name, m.backward)], options.repeats, note=m.note)
                for m in methods
            ]
            if not options.no_memory:
                memory_work.append((group_results, methods, calls))
            _group_ratios(group_results)
            results.extend(group_results)
            if options.progress:
                print(f"  timed {group}", flush=True)
    for name, suite in SUITES.items():
        if options.suites is None or name in options.suites.split(","):
            results.extend(suite(options))
    for group_results, group_methods, calls in memory_work:
        for r, m in zip(group_results, group_methods):
            r.extra_peak_bytes = extra_peak_bytes(calls[(m.name, m.backward)])
        calls.clear()  # free the group's inputs before the next one is measured
    return machine, results


def _load_cases(path: str) -> None:
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"--cases {path}: no such file")
    spec = importlib.util.spec_from_file_location(f"rotary_bench_cases_{file.stem}", file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


def _machine() -> dict[str, Any]:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": model,
        "logical_cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def _fmt_time(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    return f"{seconds * 1e3:.2f} ms"


def format_table(machine: dict[str, Any], results: list[Result], markdown: bool = False) -> str:
    """The results as text (or a markdown table), one block per group."""
    lines = [
        f"machine: {machine['cpu']}, {machine['logical_cpus']} logical CPUs, torch {machine['torch']} "
        f"with {machine['torch_threads']} threads; fused CPU kernel {machine.get('fused_cpu_kernel', '?')}"
    ]
    groups: dict[str, list[Result]] = {}
    for r in results:
        groups.setdefault(r.group, []).append(r)
    header = ["method", "pass", "median", "x in-place pass", "x copy", "vs HF eager", "extra peak MiB"]
    for group, rows in groups.items():
        table = []
        for r in rows:
            mem = "" if r.extra_peak_bytes is None else f"{r.extra_peak_bytes / 2**20:.1f}"
            table.append(
                [
                    r.method + (f" ({r.note})" if r.note else ""),
                    "fwd+bwd" if r.backward else "fwd",
                    _fmt_time(r.median_s),
                    f"{r.ratios['x in-place pass']:.2f}" if "x in-place pass" in r.ratios else "",
                    f"{r.ratios['x copy']:.2f}" if "x copy" in r.ratios else "",
                    f"{r.ratios['HF eager speedup']:.1f}x faster" if "HF eager speedup" in r.ratios else "",
                    mem,
                ]
            )
        lines.append("")
        if markdown:
            lines.append(f"### {group}")
            lines.append("")
            lines.append("| " + " | ".join(header) + " |")
            lines.append("|" + "|".join(["---"] + ["---"] + ["---:"] * 5) + "|")
            lines.extend("| " + " | ".join(row) + " |" for row in table)
        else:
            lines.append(group)
            widths = [max(len(str(x)) for x in col) for col in zip(header, *table)]
            for row in [header, *table]:
                cells = [str(c).ljust(w) if j < 2 else str(c).rjust(w) for j, (c, w) in enumerate(zip(row, widths))]
                lines.append("  " + "  ".join(cells))
    return "\n".join(lines)


def _bench(args: argparse.Namespace) -> int:
    if args.repeats is None:
        args.repeats = 3 if args.quick else 9
    if args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
    machine, results = run(args)
    if args.json:
        print(json.dumps({"machine": machine, "results": [asdict(r) for r in results]}, indent=1))
    else:
        print(format_table(machine, results, markdown=args.markdown))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="time RoPE application against Hugging Face and the memory-traffic limit")
    p.add_argument("--quick", action="store_true", help="two small shapes, 3 repeats, no torch.compile baseline")
    p.add_argument("--json", action="store_true", help="print machine-readable results")
    p.add_argument("--markdown", action="store_true", help="print markdown tables (docs/benchmarks.md)")
    p.add_argument("--dtypes", default="fp32,bf16", help="comma-separated: fp32, bf16, fp16 (default fp32,bf16)")
    p.add_argument("--shapes", default=None, help="comma-separated shape names (default: all)")
    p.add_argument("--repeats", type=int, default=None, help="interleaved samples per method (default 9; quick 3)")
    p.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: torch's current setting)")
    p.add_argument("--compile", action="store_true", help="with --quick: keep the torch.compile baseline")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurement")
    p.add_argument("--cases", action="append", help="a .py file registering extra methods or suites (repeatable)")
    p.add_argument("--suites", default=None, help="comma-separated registered suites to run (default: all)")
    p.add_argument("--progress", action="store_true", help="print a line as each group finishes")
    p.set_defaults(func=_bench)
