"""The harness of ``rotary bench``: shapes, inputs, the method and suite registries, interleaved timing, peak memory."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "DTYPE_NAMES",
    "Inputs",
    "Method",
    "Prepared",
    "Result",
    "SHAPES",
    "QUICK_SHAPES",
    "Shape",
    "DeviceGroup",
    "CUDA_GROUPS",
    "QUICK_CUDA_GROUPS",
    "head_shape",
    "METHODS",
    "SUITES",
    "register_method",
    "register_suite",
    "time_interleaved",
    "extra_peak_bytes",
    "allocations",
    "make_inputs",
    "run",
    "format_table",
    "installed",
]


@dataclass(frozen=True)
class Shape:
    """q ``[B, Hq, S, D]`` and k ``[B, Hk, S, D]``; every sequence's tokens sit at positions
    ``start .. start + S - 1``.

    Example:
        >>> Shape("decode", 64, 32, 8, 1, 128, start=4096).describe()
        'decode 64x32/8x1x128 at position 4096'
    """

    name: str
    batch: int
    q_heads: int
    k_heads: int
    seq_len: int
    head_dim: int
    start: int = 0

    def describe(self) -> str:
        heads = f"{self.q_heads}" if self.q_heads == self.k_heads else f"{self.q_heads}/{self.k_heads}"
        at = f" at position {self.start}" if self.start else ""
        return f"{self.name} {self.batch}x{heads}x{self.seq_len}x{self.head_dim}{at}"


SHAPES = [
    Shape("prefill", 1, 32, 32, 2048, 128),  # LLaMA-7B prefill
    Shape("training", 8, 12, 12, 512, 64),
    Shape("gqa", 1, 32, 8, 4096, 128),
    Shape("decode", 16, 32, 32, 1, 128),
]
QUICK_SHAPES = [Shape("prefill-small", 1, 4, 4, 128, 64), Shape("decode-small", 2, 4, 4, 1, 64)]


@dataclass(frozen=True)
class DeviceGroup:
    """A group of ``rotary bench --device cuda``: a shape, its default dtypes (``--dtypes`` replaces
    them), whether the fwd+bwd rows are timed too, and the pairing (``interleaved``: (2i, 2i + 1))."""

    shape: Shape
    dtypes: tuple[str, ...]
    backward: bool = False
    interleaved: bool = False


#: the GPU groups: q 32 heads, k 8 heads (Llama-3-8B's GQA), head_dim 128
CUDA_GROUPS = [
    DeviceGroup(Shape("prefill", 1, 32, 8, 4096, 128), ("bf16",)),
    DeviceGroup(Shape("training", 8, 32, 8, 2048, 128), ("bf16", "fp32"), backward=True),
    DeviceGroup(Shape("decode", 64, 32, 8, 1, 128, start=4096), ("bf16",)),
    DeviceGroup(Shape("interleaved", 1, 32, 8, 4096, 128), ("bf16",), interleaved=True),
]
#: ``--quick --device cuda``: the same groups, small
QUICK_CUDA_GROUPS = [
    DeviceGroup(Shape("prefill-small", 1, 8, 2, 256, 64), ("bf16",)),
    DeviceGroup(Shape("training-small", 2, 8, 2, 128, 64), ("fp32",), backward=True),
    DeviceGroup(Shape("decode-small", 4, 8, 2, 1, 64, start=64), ("bf16",)),
    DeviceGroup(Shape("interleaved-small", 1, 8, 2, 256, 64), ("bf16",), interleaved=True),
]


def head_shape(text: str) -> tuple[int, int, int, int]:
    """``"B,H,S,D"`` as four positive ints with D even: an ``argparse`` ``type=`` for the scripts
    under ``benchmarks/``.

    Example::

        >>> head_shape("8,12,512,64")
        (8, 12, 512, 64)
    """
    try:
        shape = tuple(int(n) for n in text.split(","))
    except ValueError:
        shape = ()
    if len(shape) != 4 or min(shape) < 1 or shape[3] % 2:
        raise argparse.ArgumentTypeError(f"{text!r}: give four positive integers B,H,S,D with D even, e.g. 8,12,512,64")
    return shape  # type: ignore[return-value]


@dataclass
class Inputs:
    """Everything a method needs, built once per group on the group's device: q/k (``bhsd``,
    contiguous), tables in each form. The tokens sit at ``shape.start + arange(S)``."""

    shape: Shape
    dtype: torch.dtype
    q: torch.Tensor
    k: torch.Tensor
    rope: Any  # rotary.RoPE, with the group's pairing, tables built on the device
    cos: torch.Tensor  # fp32 [S, D], rotary's tables of the tokens' positions
    sin: torch.Tensor
    hf_cos: torch.Tensor  # [1, S, D] in q's dtype, as Hugging Face's rotary embedding returns them
    hf_sin: torch.Tensor
    grad_q: torch.Tensor
    grad_k: torch.Tensor
    position_ids: torch.Tensor | None = None  # int64 [B, S] on the device: start + arange(S) per sequence
    table_cos: torch.Tensor | None = None  # fp32 [T, D], T = start + S: whole tables, rows indexed by position
    table_sin: torch.Tensor | None = None
    interleaved: bool = False  # the pairing of rope and the tables


@dataclass(frozen=True)
class Method:
    """One timed way of rotating q and k. ``backward``: the call runs forward and backward.

    ``requires``: the module an optional package installs that the method imports (e.g.
    ``"transformers"``, ``"flash_attn.ops.triton.rotary"``); when it cannot be imported, ``rotary
    bench`` leaves the method out and says so in one line on stderr.

    ``devices``: the device types the method runs on (``"cpu"``, ``"cuda"``); methods registered
    without it run on the CPU only. On a device other than the CPU, ``make`` may return ``None`` for
    a group it does not apply to (e.g. a half-pairing baseline in the interleaved group).
    ``inplace``: the method writes q and k in place; on the GPU its "x copy" ratio divides by the
    in-place pass instead of the copy.

    Example:
        >>> Method("clone q and k", lambda inputs: lambda: (inputs.q.clone(), inputs.k.clone())).devices
        ('cpu',)
    """

    name: str
    make: Callable[[Inputs], Callable[[], object]]
    backward: bool = False
    note: str = ""
    requires: str = ""
    devices: tuple[str, ...] = ("cpu",)
    inplace: bool = False


@dataclass
class Result:
    """One row. On the CPU ``median_s`` is the median wall time per call. With ``--device cuda``
    ``median_s`` is the GPU time per call, measured as ``gpu_timing`` says (``"graph"``: CUDA-graph
    replay; ``"eager"``: CUDA events around an eager loop, for a method that cannot be captured;
    ``"per call"``: events around each call of a :class:`Prepared`), and ``host_s`` the host wall
    time per call in an eager loop; both NaN (null in JSON) for a method that failed (see ``note``)."""

    group: str  # e.g. "prefill 1x32x2048x128 fp32"
    method: str
    backward: bool
    median_s: float
    repeats: int
    extra_peak_bytes: int | None = None
    ratios: dict[str, float] = field(default_factory=dict)
    note: str = ""
    host_s: float | None = None
    gpu_timing: str = ""


#: the training-step rows (see ``methods._training_step``) and the fwd+bwd limits: here, not in
#: ``methods``, because the ratios below use them and ``methods`` imports this module
INPLACE_TRAINING = "rotary fused, in place (training step)"
OUT_OF_PLACE_TRAINING = "rotary fused, out of place (training step)"
TWO_COPIES = "limit: two copies (fwd+bwd)"
#: the training-step rows' limit: q, k and the two output gradients prepared as those rows prepare
#: them, each rotated by nothing (``mul_(1.0)``) once
TRAINING_PASSES = "limit: in-place passes, fresh inputs (training step)"
TRAINING_STEPS = (INPLACE_TRAINING, OUT_OF_PLACE_TRAINING, TRAINING_PASSES)
#: the forward limits
INPLACE_PASS = "limit: in-place pass (mul_)"
COPY = "limit: copy (clone)"

METHODS: list[Method] = []
SUITES: dict[str, Callable[[argparse.Namespace], list[Result]]] = {}


def register_method(method: Method) -> Method:
    """Add a method to every shape/dtype group."""
    METHODS.append(method)
    return method


def register_suite(name: str, suite: Callable[[argparse.Namespace], list[Result]]) -> None:
    """Add a suite: ``suite(options)`` returns its own results (own groups), printed after the RoPE groups."""
    SUITES[name] = suite


# measurement -----------------------------------------------------------------------------------


class Prepared:
    """A call whose inputs must be fresh every time, made outside the timed region.

    ``prepare()`` builds them (not timed) and returns the call to time, which is then made once. The
    timing and the memory measurement time and record that call alone. Calling a ``Prepared`` does
    both steps (a warm-up).

    Example::

        >>> x = torch.zeros(4)
        >>> p = Prepared(lambda: (lambda y=x.clone(): y.add_(1)))  # a fresh y for each call
        >>> p().tolist(), x.tolist()
        ([1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0])
    """

    def __init__(self, prepare: Callable[[], Callable[[], object]]) -> None:
        self.prepare = prepare
        self.leaves: tuple[torch.Tensor, ...] = ()  # tensors a method exposes for checks

    def __call__(self) -> object:
        return self.prepare()()


def _timed_once(call: Callable[[], object]) -> float:
    """Seconds of one call; of the prepared call alone for a :class:`Prepared`."""
    if isinstance(call, Prepared):
        call = call.prepare()
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def _per_call_loops(call: Callable[[], object], budget_s: float = 2e-3) -> int:
    """Calls per sample so one sample lasts about ``budget_s`` (tiny decode calls are ~10 µs)."""
    return max(1, min(1000, int(budget_s / max(_timed_once(call), 1e-7))))


def time_interleaved(calls: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median seconds per call of each callable, sampling them in turn ``repeats`` times.

    A :class:`Prepared` call is timed call by call, each one's preparation outside the timed region.
    """
    for call in calls.values():  # warm up (first-call allocation, compilation, caches)
        call()
        call()
    loops = {name: _per_call_loops(call) for name, call in calls.items()}
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            n = loops[name]
            if isinstance(call, Prepared):
                samples[name].append(sum(_timed_once(call) for _ in range(n)) / n)
                continue
            start = time.perf_counter()
            for _ in range(n):
                call()
            samples[name].append((time.perf_counter() - start) / n)
    return {name: statistics.median(values) for name, values in samples.items()}


def _allocation_events(nodes: list) -> list[tuple[int, int]]:
    found: list[tuple[int, int]] = []
    stack = list(nodes)
    while stack:
        node = stack.pop()
        size = getattr(getattr(node, "extra_fields", None), "alloc_size", None)
        if isinstance(size, int):
            found.append((node.start_time_ns, size))
        stack.extend(node.children)
    return found


def extra_peak_bytes(call: Callable[[], object]) -> int | None:
    """Peak of the bytes PyTorch's allocator holds for ``call`` beyond what it held before, or ``None``.

    Every allocation and free made while ``call`` runs (on any thread, forward and backward) is recorded
    by the PyTorch profiler's memory tracking; the result is the largest running total, so a temporary
    freed before ``call`` returns still counts, and the returned tensors count as well. It is exact and
    independent of the operating system and of how the C library hands memory back, unlike the peak
    resident size, which a reused page hides. ``None`` if this PyTorch build records no allocations.

    Example::

        >>> x = torch.randn(2**20)
        >>> extra_peak_bytes(lambda: x * 2) >= 4 * 2**20
        True
        >>> extra_peak_bytes(lambda: x.mul_(1.0)) < 1024
        True
    """
    events = _allocation_log(call)
    if events is None:
        return None
    total = peak = 0
    for _, size in events:
        total += size
        peak = max(peak, total)
    return peak


def allocations(call: Callable[[], object]) -> list[int] | None:
    """The sizes in bytes of every allocation PyTorch's allocator makes while ``call`` runs, in order.

    From the same profiler records as :func:`extra_peak_bytes` (any thread, forward and backward);
    frees are left out. Counts and sizes are deterministic, so tests may assert on them. ``None`` if
    this PyTorch build records no allocations.

    Example::

        >>> x = torch.randn(1024)
        >>> allocations(lambda: (x.exp(), x.clone()))
        [4096, 4096]
    """
    events = _allocation_log(call)
    return None if events is None else [size for _, size in events if size > 0]


def _allocation_log(call: Callable[[], object]) -> list[tuple[int, int]] | None:
    """``(time, bytes)`` of every allocation (positive) and free (negative) made while ``call`` runs, in
    time order; ``None`` when the profiler records none, not even for a plain ``torch.empty``. For a
    :class:`Prepared`, of the prepared call alone."""
    if isinstance(call, Prepared):
        call = call.prepare()
    try:
        events = sorted(_allocation_events(_recorded(call)))
    except (RuntimeError, AttributeError):
        return None
    if not events and not _allocation_events(_recorded(lambda: torch.empty(1024))):
        return None
    return events


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Silence file descriptor 2 (the profiler's C++ side prints a line at every start and stop)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _recorded(call: Callable[[], object]) -> list:
    """The profiler's event tree of ``call`` with allocations recorded (the result is dropped afterwards)."""
    from torch.profiler import ProfilerActivity, profile

    with _quiet_stderr():
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            result = call()
    del result
    return prof.profiler.kineto_results.experimental_event_tree()


def make_inputs(
    shape: Shape,
    dtype: torch.dtype,
    seed: int = 0,
    *,
    device: torch.device | str = "cpu",
    interleaved: bool = False,
) -> Inputs:
    """The inputs of one group: q ``[B, Hq, S, D]``, k ``[B, Hk, S, D]`` and the output gradients
    drawn from a seeded CPU generator (the same values on every device), then moved to ``device``;
    a ``RoPE`` with the ``interleaved`` pairing whose tables cover positions ``0 .. start + S - 1``
    (built on ``device`` up front with ``RoPE.prepare``, so nothing grows during a CUDA-graph
    capture); cos/sin of the tokens' positions ``start + arange(S)`` in each form.

    Example:
        >>> inp = make_inputs(Shape("t", 2, 4, 2, 3, 8, start=5), torch.float32)
        >>> inp.position_ids.tolist(), tuple(inp.cos.shape), tuple(inp.table_cos.shape)
        ([[5, 6, 7], [5, 6, 7]], (3, 8), (8, 8))
    """
    from rotary.rope import RoPE

    device = torch.device(device)
    g = torch.Generator().manual_seed(seed)
    B, Hq, Hk, S, D = shape.batch, shape.q_heads, shape.k_heads, shape.seq_len, shape.head_dim
    rows = max(shape.start + S, 1)
    rope = RoPE(D, max_position=rows, interleaved=interleaved)
    if device.type != "cpu":
        rope = rope.to(device).prepare(rows, device=device)
    positions = torch.arange(shape.start, shape.start + S, device=device)
    cos, sin = rope.cos_sin(positions)
    table_cos, table_sin = (cos, sin) if shape.start == 0 else rope.cos_sin(torch.arange(rows, device=device))

    def draw(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=g).to(device=device, dtype=dtype)

    return Inputs(
        shape=shape,
        dtype=dtype,
        q=draw(B, Hq, S, D),
        k=draw(B, Hk, S, D),
        rope=rope,
        cos=cos,
        sin=sin,
        hf_cos=cos.unsqueeze(0).to(dtype),
        hf_sin=sin.unsqueeze(0).to(dtype),
        grad_q=draw(B, Hq, S, D),
        grad_k=draw(B, Hk, S, D),
        position_ids=positions.expand(B, S).contiguous(),
        table_cos=table_cos,
        table_sin=table_sin,
        interleaved=interleaved,
    )


DTYPE_NAMES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _group_ratios(results: list[Result]) -> None:
    """Ratios within a group: to the in-place pass, to the copy limit (fwd: one copy; fwd+bwd: two
    copies), of the training-step rows to their limit (in-place passes over inputs prepared as theirs
    are), and HF eager's time over the row's."""

    by_key = {(r.method, r.backward): r.median_s for r in results}
    mul = by_key.get((INPLACE_PASS, False))
    clone = by_key.get((COPY, False))
    two = by_key.get((TWO_COPIES, True))
    fresh = by_key.get((TRAINING_PASSES, True))
    for r in results:
        if fresh and r.backward and r.method in TRAINING_STEPS:
            r.ratios["x fresh passes"] = r.median_s / fresh
        if mul:
            r.ratios["x in-place pass"] = r.median_s / mul
        limit = two if r.backward else clone
        if limit:
            r.ratios["x copy"] = r.median_s / limit
        hf = by_key.get(("HF eager apply_rotary_pos_emb", r.backward))
        if hf:
            r.ratios["HF eager speedup"] = hf / r.median_s


#: ``--dtypes`` on the CPU when not given (on the GPU each group has its own, see :data:`CUDA_GROUPS`)
CPU_DTYPES = "fp32,bf16"


def run(options: argparse.Namespace) -> tuple[dict[str, Any], list[Result]]:
    """Run the benchmark as the command line describes; returns (machine info, results).

    ``options.device`` (default ``"cpu"``): ``"cuda"`` times the GPU groups (:func:`run_on_device`).
    """
    from rotary.kernels.extension import cpu_extension_error, load_cpu_extension

    device = getattr(options, "device", None) or "cpu"
    backend = None
    if device != "cpu":
        from . import cuda

        backend = cuda.open_backend(device)  # no CUDA: a one-line error before anything runs
        if getattr(options, "suites", None) is not None:
            raise ValueError(
                f"--suites {options.suites}: the suites time CPU work only; leave out --suites with --device {device}, "
                "or run them without --device"
            )
    if options.threads:
        torch.set_num_threads(options.threads)
    for path in options.cases or []:
        _load_cases(path)
    if backend is not None:
        return run_on_device(options, backend)
    if getattr(options, "dtypes", None) is None:
        options.dtypes = CPU_DTYPES
    if options.suites is not None:
        unknown = [name for name in options.suites.split(",") if name not in SUITES]
        if unknown:
            registered = ", ".join(sorted(SUITES)) or "none (add one with --cases FILE.py)"
            raise ValueError(f"--suites: unknown suite {unknown[0]!r}; registered suites: {registered}")
    machine = _machine()
    machine["fused_cpu_kernel"] = (
        "loaded" if load_cpu_extension() is not None else f"unavailable: {cpu_extension_error()}"
    )
    shapes = QUICK_SHAPES if options.quick else SHAPES
    if options.shapes:
        wanted = set(options.shapes.split(","))
        shapes = [s for s in SHAPES + QUICK_SHAPES if s.name in wanted]
        if not shapes:
            raise ValueError(
                f"--shapes {options.shapes!r} names no shape; choose from {[s.name for s in SHAPES + QUICK_SHAPES]}"
            )
    methods = _without_missing_packages(_selected_methods(options, "cpu"))
    results: list[Result] = []
    # memory is measured after all timing, so the profiler that records allocations never overlaps a timed call
    memory_work: list[tuple[list[Result], list[Method], dict]] = []
    for shape in shapes:
        for dtype_name in options.dtypes.split(","):
            if dtype_name not in DTYPE_NAMES:
                raise ValueError(f"unknown dtype {dtype_name!r} in --dtypes; use fp32, bf16 or fp16")
            group = f"{shape.describe()} {dtype_name}"
            inp = make_inputs(shape, DTYPE_NAMES[dtype_name])
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
                print(f"  timed {group}", file=sys.stderr, flush=True)
    for name, suite in SUITES.items():
        if options.suites is None or name in options.suites.split(","):
            results.extend(suite(options))
    for group_results, group_methods, calls in memory_work:
        for r, m in zip(group_results, group_methods):
            r.extra_peak_bytes = extra_peak_bytes(calls[(m.name, m.backward)])
        calls.clear()  # free the group's inputs before the next one is measured
    return machine, results


def _selected_methods(options: argparse.Namespace, device_type: str) -> list[Method]:
    """The registered methods that run on ``device_type``, less the ``torch.compile`` rows that
    ``--quick`` (without ``--compile``) and ``--no-compile`` leave out."""
    methods = [m for m in METHODS if device_type in m.devices]
    methods = [m for m in methods if not (options.quick and "torch.compile" in m.name and not options.compile)]
    if options.no_compile:
        methods = [m for m in methods if "torch.compile" not in m.name]
    return methods


def _device_groups(options: argparse.Namespace) -> list[tuple[DeviceGroup, list[str]]]:
    """The GPU groups ``--quick`` / ``--shapes`` select, each with its dtypes (``--dtypes`` replaces
    every group's own)."""
    groups = QUICK_CUDA_GROUPS if options.quick else CUDA_GROUPS
    if options.shapes:
        every = CUDA_GROUPS + QUICK_CUDA_GROUPS
        wanted = set(options.shapes.split(","))
        groups = [g for g in every if g.shape.name in wanted]
        if not groups:
            raise ValueError(
                f"--shapes {options.shapes!r} names no GPU shape; with --device cuda choose from "
                f"{[g.shape.name for g in every]}"
            )
    given = getattr(options, "dtypes", None)
    chosen = []
    for group in groups:
        dtypes = given.split(",") if given else list(group.dtypes)
        for name in dtypes:
            if name not in DTYPE_NAMES:
                raise ValueError(f"unknown dtype {name!r} in --dtypes; use fp32, bf16 or fp16")
        chosen.append((group, dtypes))
    return chosen


def _limit_of(method: str, backward: bool, inplace: bool) -> str:
    """The limit row a GPU row's "x copy" divides by: the fresh in-place passes for the training-step
    rows, two copies for other fwd+bwd rows, the in-place pass for in-place rows, else the copy.

    Example:
        >>> _limit_of("rotary fused, in place", False, True), _limit_of("HF eager apply_rotary_pos_emb", True, False)
        ('limit: in-place pass (mul_)', 'limit: two copies (fwd+bwd)')
    """
    if backward:
        return TRAINING_PASSES if method in TRAINING_STEPS else TWO_COPIES
    return INPLACE_PASS if inplace else COPY


def _device_ratios(results: list[Result], inplace: set[str]) -> None:
    """"x copy" of each GPU row: its GPU time over its limit row's (:func:`_limit_of`), in the same
    group, and only where both were measured the same way (both graph replays, or both per call)."""
    by_key = {(r.method, r.backward): r for r in results}
    for r in results:
        limit = by_key.get((_limit_of(r.method, r.backward, (r.method, r.backward) in inplace), r.backward))  # type: ignore[arg-type]
        if limit is None or limit.gpu_timing != r.gpu_timing:
            continue
        if math.isfinite(r.median_s) and math.isfinite(limit.median_s) and limit.median_s > 0:
            r.ratios["x copy"] = r.median_s / limit.median_s


def run_on_device(options: argparse.Namespace, backend: Any) -> tuple[dict[str, Any], list[Result]]:
    """The GPU groups (:data:`CUDA_GROUPS`) on ``backend``'s device (:mod:`rotary.tools.bench.cuda`).

    Each row: GPU time per call under CUDA-graph replay (or CUDA events, with a note, for a method
    that cannot be captured) and host wall time per call in an eager loop; "x copy" against the
    group's limit rows. A method that fails (to set up, to run, to be timed) is a row with a note,
    and the run goes on. After each group, rotary's deferred device checks are read once; a failed
    check is added to the notes of that group's rows.
    """
    from rotary.deferred import check_device_errors

    from . import cuda

    device = backend.device  # where the inputs live (a test's CPU stand-in keeps them on the CPU)
    kind = torch.device(getattr(options, "device", None) or device).type  # whose methods run
    groups = _device_groups(options)
    methods = _without_missing_packages(_selected_methods(options, kind))
    inplace = {(m.name, m.backward) for m in methods if m.inplace}
    machine = {**_machine(), **_device_machine(device, _selected_methods(options, kind))}
    results: list[Result] = []
    for group, dtypes in groups:
        for dtype_name in dtypes:
            name = f"{group.shape.describe()} {dtype_name}"
            started = time.perf_counter()
            try:
                inp = make_inputs(group.shape, DTYPE_NAMES[dtype_name], device=device, interleaved=group.interleaved)
            except Exception as exc:  # e.g. out of memory: the group is one row saying so, the next group runs
                note = f"failed to make the group's inputs: {cuda.short_error(exc)}"
                results.append(Result(name, "(inputs)", False, math.nan, options.repeats, note=note, host_s=math.nan))
                backend.release()
                continue
            calls: dict[tuple[str, bool], Callable[[], object]] = {}
            rows: list[tuple[Method, str]] = []  # (method, setup failure)
            for m in sorted(methods, key=lambda m: m.backward):  # forward rows first
                if m.backward and not group.backward:
                    continue
                try:
                    call = m.make(inp)
                except Exception as exc:  # a baseline that cannot be set up is a row note
                    rows.append((m, f"failed to set up: {cuda.short_error(exc)}"))
                    continue
                if call is not None:  # None: the method does not apply to this group
                    calls[(m.name, m.backward)] = call
                    rows.append((m, ""))
            timings = cuda.time_on_device(calls, options.repeats, backend, prepared_type=Prepared)  # type: ignore[arg-type]
            flagged = ""
            try:
                check_device_errors(device)
            except Exception as exc:  # a deferred check that failed during the group: say so on its rows
                flagged = f"rotary's deferred device checks flagged: {cuda.short_error(exc)}"
                print(f"rotary bench: {name}: {flagged}", file=sys.stderr)
            group_results = []
            for m, failure in rows:
                t = timings.get((m.name, m.backward), cuda.DeviceTiming(note=failure))
                note = "; ".join(filter(None, [m.note, t.note, flagged]))
                group_results.append(
                    Result(
                        name, m.name, m.backward, t.gpu_s, options.repeats, note=note, host_s=t.host_s,
                        gpu_timing=t.gpu_timing,
                    )  # fmt: skip
                )
            _device_ratios(group_results, inplace)
            results.extend(group_results)
            del inp, calls
            backend.release()
            if options.progress:  # the group's table too: a run stopped later still leaves the groups done
                print(f"  timed {name} ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
                table = [_device_row(r) for r in group_results]
                print("\n".join(_table(name, DEVICE_HEADER, table, getattr(options, "markdown", False), left=(0, 4))), file=sys.stderr, flush=True)
    machine["fused_cpu_kernel"] = _cpu_kernel_state()  # rope(q, k) tries the CPU decoding fast path first
    return machine, results


def _cpu_kernel_state() -> str:
    """Whether the fused CPU kernel is loaded ("loaded" or why not). Asked after the groups: on a GPU,
    ``rope(q, k)`` tries the CPU decoding fast path first, which loads (or fails to load) the kernel
    during the warm-up of the rotary rows, so this is a lookup and what those rows' host time included;
    a run without rotary rows builds it here, as the CPU run does at its start."""
    from rotary.kernels.extension import cpu_extension_error, load_cpu_extension

    return "loaded" if load_cpu_extension() is not None else f"unavailable: {cpu_extension_error()}"


def package_version(module: str) -> str:
    """The installed version of the package that provides ``module``, ``"not installed"``, or
    ``"importable"`` for a module without package metadata (e.g. a copied file).

    Example:
        >>> package_version("torch") == torch.__version__, package_version("no_such_package_for_rotary")
        (True, 'not installed')
    """
    from importlib import metadata

    if not installed(module):
        return "not installed"
    top = module.split(".")[0]
    for dist in (top, top.replace("_", "-")):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    version = getattr(sys.modules.get(top), "__version__", None)
    return str(version) if version else "importable"


def _device_machine(device: torch.device, methods: list[Method]) -> dict[str, Any]:
    """What a GPU run adds to the machine description: the GPU, CUDA, Triton, the baselines' versions."""
    info: dict[str, Any] = {"device": str(device)}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
    info["triton"] = package_version("triton")
    info["baselines"] = {m.requires: package_version(m.requires) for m in methods if m.requires}
    return info


def installed(module: str) -> bool:
    """Whether ``module`` (an optional package, e.g. ``"transformers"``) can be imported.

    Example:
        >>> installed("torch"), installed("no_such_package_for_rotary")
        (True, False)
    """
    try:
        importlib.import_module(module)
    except Exception:  # ImportError, or a package that fails while importing (e.g. no GPU it needs)
        return False
    return True


def _without_missing_packages(methods: list[Method]) -> list[Method]:
    """``methods`` less those whose package is not installed, named in one line on stderr."""
    missing: dict[str, list[str]] = {}
    for m in methods:
        if m.requires and (m.requires in missing or not installed(m.requires)):
            names = missing.setdefault(m.requires, [])
            if m.name not in names:
                names.append(m.name)
    if missing:
        skipped = "; ".join(f"{', '.join(names)} (needs {module})" for module, names in missing.items())
        install = " ".join(dict.fromkeys(module.split(".")[0].replace("_", "-") for module in missing))
        print(f"rotary bench: skipped, not installed: {skipped}; add them with: pip install {install}", file=sys.stderr)
    return [m for m in methods if m.requires not in missing]


def _load_cases(path: str) -> None:
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"--cases {path}: no such file")
    spec = importlib.util.spec_from_file_location(f"rotary_bench_cases_{file.stem}", file)
    if spec is None or spec.loader is None:
        raise ValueError(f"--cases {path}: not a Python file; give a .py file that registers methods or suites")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SystemExit as exc:  # sys.exit() in the user's file must not end the benchmark with its status
        raise ValueError(
            f"--cases {path}: importing it called sys.exit({exc.code!r}); a cases file only registers"
        ) from None
    except Exception as exc:  # the user's file: say which one and what it raised, no traceback
        raise ValueError(f"--cases {path}: importing it raised {type(exc).__name__}: {exc}") from None


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


def _versus_hf(speedup: float) -> str:
    """``speedup`` = HF eager time / this time, as words: "2.0x faster", "5.1x slower", "same"."""
    if f"{speedup:.1f}" == "1.0":
        return "1.0x (same)"
    return f"{speedup:.1f}x faster" if speedup > 1 else f"{1 / speedup:.1f}x slower"


#: the columns of a GPU group (``rotary bench --device cuda``)
DEVICE_HEADER = ["method", "GPU µs/call (graph)", "x copy", "host µs/call (eager)", "note"]


def _micro(seconds: float | None) -> str:
    """Seconds as µs with one decimal, "—" for a row without a time (NaN or None)."""
    if seconds is None or not math.isfinite(seconds):
        return "—"
    return f"{seconds * 1e6:.1f}"


def _device_row(r: Result) -> list[str]:
    """A GPU row's cells (:data:`DEVICE_HEADER`); a GPU time not from graph replay says how it was taken.

    Example:
        >>> _device_row(Result("g", "HF", False, 2.5e-5, 9, ratios={"x copy": 2.0}, host_s=1.4e-4, gpu_timing="graph"))
        ['HF', '25.0', '2.00', '140.0', '']
        >>> _device_row(Result("g", "x", True, 1e-4, 9, host_s=5e-4, gpu_timing="eager", note="not capturable: E"))
        ['x (fwd+bwd)', '100.0 (eager)', '', '500.0', 'not capturable: E']
    """
    gpu = _micro(r.median_s)
    if gpu != "—" and r.gpu_timing != "graph":
        gpu += f" ({r.gpu_timing})"
    ratio = f"{r.ratios['x copy']:.2f}" if "x copy" in r.ratios else ""
    method = r.method + (" (fwd+bwd)" if r.backward and "fwd+bwd" not in r.method else "")
    return [method, gpu, ratio, _micro(r.host_s), r.note]


def _machine_line(machine: dict[str, Any]) -> list[str]:
    if "gpu" not in machine and "device" not in machine:
        return [
            f"machine: {machine['cpu']}, {machine['logical_cpus']} logical CPUs, torch {machine['torch']} "
            f"with {machine['torch_threads']} threads; fused CPU kernel {machine.get('fused_cpu_kernel', '?')}"
        ]
    gpu = machine.get("gpu", machine.get("device", "?"))
    baselines = ", ".join(f"{module} {version}" for module, version in machine.get("baselines", {}).items())
    return [
        f"machine: {gpu} (CUDA {machine.get('cuda', '?')}), torch {machine['torch']}, triton "
        f"{machine.get('triton', '?')}; host {machine['cpu']}, {machine['logical_cpus']} logical CPUs"
        + (f"; fused CPU kernel {machine['fused_cpu_kernel']}" if "fused_cpu_kernel" in machine else ""),
        f"baselines: {baselines or 'none'}",
    ]


def format_table(machine: dict[str, Any], results: list[Result], markdown: bool = False) -> str:
    """The results as text (or a markdown table), one block per group.

    GPU groups (rows with ``gpu_timing``) have the columns of :data:`DEVICE_HEADER`: method, GPU µs
    per call under graph replay (marked "(eager)" or "(per call)" when measured otherwise), "x copy",
    host µs per call in an eager loop, note; times of a failed row are "—".
    """
    lines = _machine_line(machine)
    groups: dict[str, list[Result]] = {}
    for r in results:
        groups.setdefault(r.group, []).append(r)
    for group, rows in groups.items():
        if any(r.gpu_timing or r.host_s is not None for r in rows):
            lines.append("")
            lines.extend(_table(group, DEVICE_HEADER, [_device_row(r) for r in rows], markdown, left=(0, 4)))
            continue
        versus_hf = any("HF eager speedup" in r.ratios for r in rows)  # not without transformers
        steps = any("x fresh passes" in r.ratios for r in rows)
        header = ["method", "pass", "median", "x in-place pass", "x copy (fwd+bwd: two)"]
        header += ["x fresh passes (training step)"] * steps + ["vs HF eager"] * versus_hf + ["extra peak MiB"]
        table = []
        for r in rows:
            mem = "" if r.extra_peak_bytes is None else f"{r.extra_peak_bytes / 2**20:.1f}"
            row = [
                r.method + (f" ({r.note})" if r.note else ""),
                "fwd+bwd" if r.backward else "fwd",
                _fmt_time(r.median_s),
                f"{r.ratios['x in-place pass']:.2f}" if "x in-place pass" in r.ratios else "",
                f"{r.ratios['x copy']:.2f}" if "x copy" in r.ratios else "",
            ]
            if steps:
                row.append(f"{r.ratios['x fresh passes']:.2f}" if "x fresh passes" in r.ratios else "")
            if versus_hf:
                row.append(_versus_hf(r.ratios["HF eager speedup"]) if "HF eager speedup" in r.ratios else "")
            table.append([*row, mem])
        lines.append("")
        lines.extend(_table(group, header, table, markdown, left=(0, 1)))
    return "\n".join(lines)


def _table(group: str, header: list[str], table: list[list[str]], markdown: bool, left: tuple[int, ...]) -> list[str]:
    """One group as a markdown table (``### group``, then rows; a ``|`` inside a cell is escaped) or
    as aligned text; the columns in ``left`` are left-aligned, the others right-aligned."""
    if markdown:
        lines = [f"### {group}", "", "| " + " | ".join(header) + " |"]
        lines.append("|" + "|".join("---" if j in left else "---:" for j in range(len(header))) + "|")
        lines.extend("| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in table)
        return lines
    lines = [group]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *table)]
    for row in [header, *table]:
        cells = [str(c).ljust(w) if j in left else str(c).rjust(w) for j, (c, w) in enumerate(zip(row, widths))]
        lines.append("  " + "  ".join(cells).rstrip())
    return lines
