"""GPU timing for ``rotary bench --device cuda``: CUDA-graph replay, CUDA events, host wall time.

Every row is timed two ways: **GPU time per call** (``n`` calls captured into one CUDA graph, replayed between
two events; a method that cannot be captured is timed eagerly between events and its row says why) and **host
wall time per call** (an eager loop synchronised before and after). :class:`~.harness.Prepared` calls are timed
per call. The CUDA primitives sit behind :class:`CudaBackend`, so the arithmetic is tested on a CPU with a
stand-in; a failing method becomes its row's note and never stops the others.
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import time
import traceback
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from ...errors import InputError

__all__ = [
    "CudaBackend",
    "DeviceTiming",
    "open_backend",
    "capture",
    "graph_seconds",
    "eager_event_seconds",
    "host_loop_seconds",
    "prepared_event_seconds",
    "prepared_host_seconds",
    "time_on_device",
    "short_error",
    "capture_failure",
]

#: one graph replay and one host loop last about this long (calls per graph / per loop follow from it)
TARGET_S = 5e-3
#: calls captured into one graph: at least (event resolution), at most (capture time, graph size)
MIN_GRAPH_CALLS, MAX_GRAPH_CALLS = 10, 200
#: calls per host loop and per eager-events loop
MIN_LOOP_CALLS, MAX_LOOP_CALLS = 3, 1000
#: eager calls before anything is timed or captured (compilation, autotuning, table builds)
WARMUP_CALLS = 3

#: how a row's GPU time was measured
GRAPH, EAGER, PER_CALL = "graph", "eager", "per call"


class Event(Protocol):
    def record(self) -> None: ...
    def synchronize(self) -> None: ...
    def elapsed_time(self, end: Any) -> float: ...  # milliseconds, as torch.cuda.Event


class Graph(Protocol):
    def replay(self) -> None: ...


class Backend(Protocol):
    """What the timers need from the device; :class:`CudaBackend` is the real one."""

    device: torch.device

    def synchronize(self) -> None: ...
    def event(self) -> Event: ...
    def capture(self, call: Callable[[], object], calls: int) -> Graph: ...
    def release(self) -> None: ...


class CudaBackend:
    """The CUDA primitives the timers use, on one device (``open_backend("cuda")``; needs a GPU)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def event(self) -> Event:
        return torch.cuda.Event(enable_timing=True)

    def capture(self, call: Callable[[], object], calls: int) -> Graph:
        """``calls`` calls of ``call`` captured into one CUDA graph after side-stream warm-up; a failed capture
        restores the current stream and raises the capture's exception.
        """
        stream = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(stream)
        with torch.cuda.stream(side):
            for _ in range(WARMUP_CALLS):
                call()
        stream.wait_stream(side)
        self.synchronize()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                for _ in range(calls):
                    call()
        except BaseException:
            torch.cuda.set_stream(stream)
            with contextlib.suppress(Exception):
                torch.cuda.synchronize(self.device)
            raise
        return graph

    def release(self) -> None:
        """Hand cached blocks (a group's graphs and inputs, once dropped) back to the driver."""
        with contextlib.suppress(Exception):
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()


def open_backend(device: str) -> CudaBackend:
    """The backend for ``--device`` (``"cuda"`` or ``"cuda:N"``), or a ``ValueError`` that says why not."""
    name = torch.device(device)
    if name.type != "cuda":
        raise InputError(f"--device {device}: GPU timing is for CUDA devices; use --device cuda (or cpu)")
    if not torch.cuda.is_available():
        raise InputError(
            f"--device {device}: this torch ({torch.__version__}) sees no CUDA device (torch.cuda.is_available() is "
            "False); run it on a machine with an NVIDIA GPU and a CUDA build of torch, or leave out --device"
        )
    if name.index is not None and name.index >= torch.cuda.device_count():
        raise InputError(
            f"--device {device}: there are {torch.cuda.device_count()} CUDA devices (cuda:0 .. "
            f"cuda:{torch.cuda.device_count() - 1}); pick one of them"
        )
    index = torch.cuda.current_device() if name.index is None else name.index
    torch.cuda.set_device(index)
    return CudaBackend(torch.device("cuda", index))


# the timers ------------------------------------------------------------------------------------


def capture(call: Callable[[], object], calls: int, backend: Backend) -> Graph:
    """``calls`` calls of ``call`` as one graph, replayed once (a graph that cannot replay fails here)."""
    graph = backend.capture(call, calls)
    graph.replay()
    backend.synchronize()
    return graph


def graph_seconds(graph: Graph, calls: int, backend: Backend) -> float:
    """Seconds of GPU time per call: one replay of a graph holding ``calls`` calls, between two events."""
    start, end = backend.event(), backend.event()
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e-3 / calls


def eager_event_seconds(call: Callable[[], object], calls: int, backend: Backend) -> float:
    """GPU seconds per call between two events around an eager loop (gaps waiting for the host included)."""
    backend.synchronize()
    start, end = backend.event(), backend.event()
    start.record()
    for _ in range(calls):
        call()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e-3 / calls


def host_loop_seconds(call: Callable[[], object], calls: int, backend: Backend) -> float:
    """Wall-clock seconds per call of an eager loop, synchronised before and after the loop only."""
    backend.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    backend.synchronize()
    return (time.perf_counter() - start) / calls


def prepared_event_seconds(prepared: Any, calls: int, backend: Backend) -> float:
    """GPU seconds per call of a ``Prepared``, each call between its own two events; the mean."""
    pairs = []
    for _ in range(calls):
        call = prepared.prepare()
        start, end = backend.event(), backend.event()
        start.record()
        call()
        end.record()
        pairs.append((start, end))
    backend.synchronize()
    return sum(start.elapsed_time(end) for start, end in pairs) * 1e-3 / calls


def prepared_host_seconds(prepared: Any, calls: int, backend: Backend) -> float:
    """Wall-clock seconds per call of a ``Prepared``, each call between two synchronisations; the mean."""
    total = 0.0
    for _ in range(calls):
        call = prepared.prepare()
        backend.synchronize()
        start = time.perf_counter()
        call()
        backend.synchronize()
        total += time.perf_counter() - start
    return total / calls


def short_error(exc: BaseException, limit: int = 160) -> str:
    """``"TypeName: first line of the message"``, at most ``limit`` characters.

    >>> short_error(RuntimeError("operation not permitted when stream is capturing\\nmore"))
    'RuntimeError: operation not permitted when stream is capturing'
    """
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def capture_failure(exc: BaseException) -> str:
    """What stopped a capture: the first exception and its deepest frame outside torch.

    >>> try:
    ...     try:
    ...         raise RuntimeError("operation not permitted when stream is capturing")
    ...     finally:
    ...         raise RuntimeError("operation failed due to a previous error during capture")
    ... except RuntimeError as exc:
    ...     capture_failure(exc).startswith("RuntimeError: operation not permitted when stream is capturing (")
    True
    """
    first = exc
    while first.__context__ is not None and first.__context__ is not first:
        first = first.__context__
    frames = traceback.extract_tb(first.__traceback__)
    outside = [f for f in frames if f"{os.sep}torch{os.sep}" not in f.filename]
    frame = outside[-1] if outside else (frames[-1] if frames else None)
    where = (
        f" ({os.path.basename(os.path.dirname(frame.filename))}/{os.path.basename(frame.filename)}:{frame.lineno})"
        if frame
        else ""
    )
    return short_error(first) + where


# a group ---------------------------------------------------------------------------------------


@dataclass
class DeviceTiming:
    """One row: ``gpu_s`` measured as ``gpu_timing`` says, ``host_s`` (both NaN if it failed), and its note."""

    gpu_s: float = math.nan
    host_s: float = math.nan
    gpu_timing: str = ""
    note: str = ""


def _clamp(value: float, low: int, high: int) -> int:
    return max(low, min(high, int(value)))


@dataclass
class _Row:
    call: Any
    timing: DeviceTiming
    graph: Any = None
    graph_calls: int = 0
    loop_calls: int = 0
    gpu: list[float] | None = None
    host: list[float] | None = None
    failed: bool = False


def _prepare_row(call: Any, backend: Backend, prepared_type: type | tuple[type, ...]) -> _Row:
    """Warm up, size the loops, capture the graph (or say why not)."""
    row = _Row(call, DeviceTiming(), gpu=[], host=[])
    try:
        for _ in range(WARMUP_CALLS):
            call()
        backend.synchronize()
        if isinstance(call, prepared_type):
            once = prepared_host_seconds(call, 1, backend)
        else:
            once = host_loop_seconds(call, 1, backend)
    except Exception as exc:  # a baseline that fails is a row note, never the end of the run
        row.timing.note, row.failed = f"failed: {short_error(exc)}", True
        return row
    row.loop_calls = _clamp(TARGET_S / max(once, 1e-7), MIN_LOOP_CALLS, MAX_LOOP_CALLS)
    if isinstance(call, prepared_type):
        row.timing.gpu_timing = PER_CALL
        row.timing.note = (
            "fresh inputs every call: GPU time from events around each call, host time synchronised per call"
        )
        row.loop_calls = min(row.loop_calls, 50)
        return row
    row.graph_calls = _clamp(TARGET_S / max(once, 1e-7), MIN_GRAPH_CALLS, MAX_GRAPH_CALLS)
    try:
        row.graph = capture(call, row.graph_calls, backend)
        row.timing.gpu_timing = GRAPH
    except Exception as exc:
        row.graph = None
        row.timing.gpu_timing = EAGER
        row.timing.note = f"not capturable: {capture_failure(exc)}; GPU time from CUDA events around an eager loop"
        with contextlib.suppress(Exception):
            backend.synchronize()
    return row


def _sample(row: _Row, backend: Backend) -> None:
    if row.timing.gpu_timing == PER_CALL:
        row.gpu.append(prepared_event_seconds(row.call, row.loop_calls, backend))  # type: ignore[union-attr]
        row.host.append(prepared_host_seconds(row.call, row.loop_calls, backend))  # type: ignore[union-attr]
        return
    if row.graph is not None:
        row.gpu.append(graph_seconds(row.graph, row.graph_calls, backend))  # type: ignore[union-attr]
    else:
        row.gpu.append(eager_event_seconds(row.call, row.loop_calls, backend))  # type: ignore[union-attr]
    row.host.append(host_loop_seconds(row.call, row.loop_calls, backend))  # type: ignore[union-attr]


def time_on_device(
    calls: dict[Hashable, Callable[[], object]],
    repeats: int,
    backend: Backend,
    prepared_type: type | tuple[type, ...] = (),
) -> dict[Hashable, DeviceTiming]:
    """Median GPU and host time per call of each callable, every call captured first, then sampled in turn
    ``repeats`` times; a row that raises gets NaN times and a note naming the exception.
    """
    rows = {key: _prepare_row(call, backend, prepared_type) for key, call in calls.items()}
    for _ in range(repeats):
        for row in rows.values():
            if row.failed:
                continue
            try:
                _sample(row, backend)
            except Exception as exc:
                row.failed = True
                row.timing.note = "; ".join(filter(None, [row.timing.note, f"failed while timing: {short_error(exc)}"]))
                with contextlib.suppress(Exception):
                    backend.synchronize()
    results = {}
    for key, row in rows.items():
        if not row.failed:
            row.timing.gpu_s = statistics.median(row.gpu)  # type: ignore[arg-type]
            row.timing.host_s = statistics.median(row.host)  # type: ignore[arg-type]
        results[key] = row.timing
        row.graph = row.call = None
    rows.clear()
    backend.release()
    return results
