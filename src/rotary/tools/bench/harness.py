"""The harness of ``rotary bench``: shapes, inputs, the method and suite registries, interleaved timing, peak memory."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from ..._registry import scoped

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
    "SUITE_DEVICES",
    "register_method",
    "register_suite",
    "scoped_registrations",
    "suite_device",
    "suite_repeats",
    "time_interleaved",
    "extra_peak_bytes",
    "allocations",
    "make_inputs",
    "package_version",
    "installed",
]


@dataclass(frozen=True)
class Shape:
    """q ``[B, Hq, S, D]`` and k ``[B, Hk, S, D]`` at positions ``start .. start + S - 1``.

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
    """``"B,H,S,D"`` as four positive ints with D even (an ``argparse`` ``type=``).

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
    """What a method needs, built once per group on its device: q/k (``bhsd``, contiguous), tables in each form."""

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
    """One timed way of rotating q and k (``backward``: forward and backward).

    ``requires``: an optional module (left out, with one line on stderr, when not importable); ``devices``: where
    it runs (``make`` may return ``None`` for a group it does not apply to); ``inplace``: it writes q and k in place.

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
    """One row: ``median_s`` per call (CPU: wall time; CUDA: GPU time measured as ``gpu_timing`` says, ``"graph"``,
    ``"eager"`` or ``"per call"``), ``host_s`` the host time per call; both NaN for a method that failed (``note``).
    """

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
    kind: str = ""  # "" (a RoPE row), "fused" (a fused-op suite's row) or "generation" (see ``values``)
    values: dict[str, float] = field(default_factory=dict)  # a generation row's figures: tokens/s, ...


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
#: the device types each suite runs on (``register_suite(..., devices=...)``)
SUITE_DEVICES: dict[str, tuple[str, ...]] = {}


def scoped_registrations() -> contextlib.AbstractContextManager[None]:
    """Undo, on leaving the block, the methods and suites registered inside it.

    >>> with scoped_registrations():
    ...     register_suite("mine", lambda options: [])
    >>> "mine" in SUITES
    False
    """
    return scoped(METHODS, SUITES, SUITE_DEVICES)


def register_method(method: Method) -> Method:
    """Add a method to every shape/dtype group."""
    METHODS.append(method)
    return method


def register_suite(
    name: str, suite: Callable[[argparse.Namespace], list[Result]], *, devices: tuple[str, ...] = ("cpu",)
) -> None:
    """Add a suite ``suite(options) -> list[Result]`` for ``devices`` (default the CPU); see :func:`suite_device`."""
    SUITES[name] = suite
    SUITE_DEVICES[name] = tuple(devices)


def suite_device(options: argparse.Namespace) -> tuple[torch.device, str]:
    """A suite's device and shape set: ``options.backend``'s device and ``"cuda"``, else the CPU and ``"cpu"``."""
    backend = getattr(options, "backend", None)
    if backend is not None:
        return backend.device, "cuda"
    return torch.device("cpu"), "cpu"


def suite_repeats(options: argparse.Namespace) -> int:
    """``--repeats`` for a suite (at least 1; 3 when not given)."""
    return max(1, int(getattr(options, "repeats", 3) or 3))


# measurement -----------------------------------------------------------------------------------


class Prepared:
    """A call with fresh inputs every time: ``prepare()`` builds them (not timed) and returns the call to time.

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
    """Median seconds per call of each callable, sampled in turn ``repeats`` times."""
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
    """Peak bytes PyTorch's allocator holds for ``call`` beyond what it held before (temporaries and results
    included), from the profiler's memory records; ``None`` if this build records no allocations.

    >>> x = torch.randn(2**20)
    >>> extra_peak_bytes(lambda: x * 2) >= 4 * 2**20, extra_peak_bytes(lambda: x.mul_(1.0)) < 1024
    (True, True)
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
    """The sizes in bytes of the allocations ``call`` makes, in order (``None``: not recorded).

    >>> x = torch.randn(1024)
    >>> allocations(lambda: (x.exp(), x.clone()))
    [4096, 4096]
    """
    events = _allocation_log(call)
    return None if events is None else [size for _, size in events if size > 0]


def _allocation_log(call: Callable[[], object]) -> list[tuple[int, int]] | None:
    """``(time, ±bytes)`` of every allocation and free during ``call``; None when the profiler records none."""
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
    """One group's inputs on ``device`` (seeded), tables of positions ``start + arange(S)`` in each form, and a
    RoPE whose tables are built up front (nothing grows during a CUDA-graph capture).

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


def package_version(module: str) -> str:
    """The installed version of the package providing ``module``, ``"not installed"`` or ``"importable"``.

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


def installed(module: str) -> bool:
    """Whether ``module`` can be imported.

    >>> installed("torch"), installed("no_such_package_for_rotary")
    (True, False)
    """
    try:
        importlib.import_module(module)
    except Exception:  # ImportError, or a package that fails while importing (e.g. no GPU it needs)
        return False
    return True
