"""Running ``rotary bench``: the groups the command line selects, timed on the CPU (:func:`run`) or a GPU
(:func:`run_on_device`), with the ratios within each group and a description of the machine."""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ...errors import InputError
from . import harness
from .harness import (
    COPY,
    CUDA_GROUPS,
    DTYPE_NAMES,
    INPLACE_PASS,
    QUICK_CUDA_GROUPS,
    QUICK_SHAPES,
    SHAPES,
    TRAINING_PASSES,
    TRAINING_STEPS,
    TWO_COPIES,
    DeviceGroup,
    Method,
    Prepared,
    Result,
    extra_peak_bytes,
    installed,
    package_version,
    time_interleaved,
)
from .table import DEVICE_HEADER, device_row, group_table

__all__ = ["CPU_DTYPES", "NO_SHAPES", "run", "run_on_device"]

# harness.METHODS, harness.SUITES and harness.make_inputs are read through the module: tests replace them there.


def _group_ratios(results: list[Result]) -> None:
    """Ratios within a group: to the in-place pass, to the copy limit, of the training-step rows to
    theirs, and HF eager's time over the row's.
    """

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
    """Run the benchmark as ``options`` say (``device="cuda"``: :func:`run_on_device`); returns (machine, results)."""
    from rotary.kernels.extension import cpu_extension_error, load_cpu_extension

    device = getattr(options, "device", None) or "cpu"
    backend = None
    if device != "cpu":
        from . import cuda

        backend = cuda.open_backend(device)  # no CUDA: a one-line error before anything runs
    options.backend = backend  # the suites' timer on a device (None: the CPU)
    if options.threads:
        torch.set_num_threads(options.threads)
    for path in options.cases or []:
        _load_cases(path)
    # the whole selection is checked before anything is built or timed
    kind = torch.device(device).type
    _check_dtypes(options)
    suites = _selected_suites(options, kind)
    if options.shapes == NO_SHAPES and not suites:
        raise InputError(
            "--shapes none --suites none: nothing to time; leave out --shapes none (the RoPE "
            "groups) or --suites none (the suites)"
        )
    if backend is not None:
        machine, results = run_on_device(options, backend)
        for suite in suites:
            results.extend(_run_suite(suite, options))
            backend.release()
        return machine, results
    if getattr(options, "dtypes", None) is None:
        options.dtypes = CPU_DTYPES
    machine = _machine()
    machine["fused_cpu_kernel"] = (
        "loaded" if load_cpu_extension() is not None else f"unavailable: {cpu_extension_error()}"
    )
    shapes = QUICK_SHAPES if options.quick else SHAPES
    wanted = _wanted_shapes(options, [s.name for s in SHAPES + QUICK_SHAPES], "shape; choose from")
    if wanted is not None:
        shapes = [s for s in SHAPES + QUICK_SHAPES if s.name in wanted]
    methods = _without_missing_packages(_selected_methods(options, "cpu"))
    results: list[Result] = []
    # memory is measured after all timing, so the profiler that records allocations never overlaps a timed call
    memory_work: list[tuple[list[Result], list[Method], dict]] = []
    for shape in shapes:
        for dtype_name in options.dtypes.split(","):  # checked above
            group = f"{shape.describe()} {dtype_name}"
            inp = harness.make_inputs(shape, DTYPE_NAMES[dtype_name])
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
    for suite in suites:
        results.extend(_run_suite(suite, options))
    for group_results, group_methods, calls in memory_work:
        for r, m in zip(group_results, group_methods):
            r.extra_peak_bytes = extra_peak_bytes(calls[(m.name, m.backward)])
        calls.clear()  # free the group's inputs before the next one is measured
    return machine, results


def _run_suite(suite: Callable[[argparse.Namespace], list[Result]], options: argparse.Namespace) -> list[Result]:
    """The suite's rows; with ``--progress`` its tables go to stderr as soon as it ends."""
    started = time.perf_counter()
    rows = suite(options)
    if getattr(options, "progress", False) and rows:
        from .table import format_table

        print(
            f"  timed suite {getattr(suite, '__name__', suite)} ({time.perf_counter() - started:.0f} s)",
            file=sys.stderr,
        )
        print(
            format_table({}, rows, markdown=getattr(options, "markdown", False)).strip("\n"),
            file=sys.stderr,
            flush=True,
        )
    return rows


#: ``--shapes none``: no RoPE group, the suites alone (``--suites none``: no suite)
NO_SHAPES = "none"


def _names(
    text: str | None, flag: str, known: Any, unknown: Callable[[str], str], none: str | None = None
) -> list[str] | None:
    """The comma-separated names of ``flag``, each once and each in ``known`` (else InputError).

    >>> _names("fp32,bf16", "--dtypes", DTYPE_NAMES, str)
    ['fp32', 'bf16']
    """
    if text is None:
        return None
    names = text.split(",")
    if none is not None and NO_SHAPES in names and len(names) > 1:
        raise InputError(f"{flag} none ({none}) stands alone; give {flag} none, or the names without none")
    twice = [name for name in dict.fromkeys(names) if names.count(name) > 1]
    if twice:
        raise InputError(f"{flag} {text!r} names {', '.join(map(repr, twice))} more than once; name each once")
    for name in names:
        if name not in known and not (none is not None and name == NO_SHAPES):
            raise InputError(unknown(name))
    return names


def _check_dtypes(options: argparse.Namespace) -> None:
    """``--dtypes``: known names, each once (every suite and group reads them as checked here)."""
    unknown = "unknown dtype {!r} in --dtypes; use fp32, bf16 or fp16".format
    _names(getattr(options, "dtypes", None), "--dtypes", DTYPE_NAMES, unknown)


def _wanted_shapes(options: argparse.Namespace, known: list[str], what: str) -> set[str] | None:
    """The shape names ``--shapes`` gives (None: the default; empty: ``none``), each in ``known``."""
    unknown = [n for n in (options.shapes or "").split(",") if n not in known and n != NO_SHAPES]
    if options.shapes is not None and unknown:  # reported together: '' (--shapes '') names no shape either
        raise InputError(f"--shapes {','.join(unknown)!r} names no {what} {known}")
    names = _names(options.shapes, "--shapes", known, str, none="no RoPE group")
    return None if names is None else {n for n in names if n != NO_SHAPES}


def _selected_suites(
    options: argparse.Namespace, device_type: str
) -> list[Callable[[argparse.Namespace], list[Result]]]:
    """The suites to run on ``device_type``: those ``--suites`` names (``none``: none), else all that run there."""
    if options.suites is None:
        return [s for name, s in harness.SUITES.items() if device_type in harness.SUITE_DEVICES.get(name, ("cpu",))]
    registered = ", ".join(sorted(harness.SUITES)) or "none (add one with --cases FILE.py)"
    names = _names(
        options.suites,
        "--suites",
        harness.SUITES,
        lambda name: f"--suites: unknown suite {name!r}; registered suites: {registered}",
        none="no suite",
    )
    if names == [NO_SHAPES]:
        return []
    chosen = []
    for name in names or []:
        devices = harness.SUITE_DEVICES.get(name, ("cpu",))
        if device_type not in devices:
            raise InputError(
                f"--suites {name}: this suite runs on {' and '.join(devices)} only, not with --device {device_type}; "
                f"leave it out, or run it without --device"
            )
        chosen.append(harness.SUITES[name])
    return chosen


def _selected_methods(options: argparse.Namespace, device_type: str) -> list[Method]:
    """The methods that run on ``device_type``, less the compiled rows ``--quick``/``--no-compile`` leave out."""
    methods = [m for m in harness.METHODS if device_type in m.devices]
    methods = [m for m in methods if not (options.quick and "torch.compile" in m.name and not options.compile)]
    if options.no_compile:
        methods = [m for m in methods if "torch.compile" not in m.name]
    return methods


def _device_groups(options: argparse.Namespace) -> list[tuple[DeviceGroup, list[str]]]:
    """The GPU groups ``--quick`` / ``--shapes`` select, each with its dtypes."""
    groups = QUICK_CUDA_GROUPS if options.quick else CUDA_GROUPS
    every = CUDA_GROUPS + QUICK_CUDA_GROUPS
    wanted = _wanted_shapes(options, [g.shape.name for g in every], "GPU shape; with --device cuda choose from")
    if wanted is not None:
        groups = [g for g in every if g.shape.name in wanted]
    _check_dtypes(options)
    given = getattr(options, "dtypes", None)
    return [(group, given.split(",") if given else list(group.dtypes)) for group in groups]


def _limit_of(method: str, backward: bool, inplace: bool) -> str:
    """The limit row a GPU row's "x copy" divides by.

    >>> _limit_of("rotary fused, in place", False, True), _limit_of("HF eager apply_rotary_pos_emb", True, False)
    ('limit: in-place pass (mul_)', 'limit: two copies (fwd+bwd)')
    """
    if backward:
        return TRAINING_PASSES if method in TRAINING_STEPS else TWO_COPIES
    return INPLACE_PASS if inplace else COPY


def _device_ratios(results: list[Result], inplace: set[str]) -> None:
    """ "x copy" of each GPU row: its time over its limit row's, where both were measured the same way."""
    by_key = {(r.method, r.backward): r for r in results}
    for r in results:
        limit = by_key.get((_limit_of(r.method, r.backward, (r.method, r.backward) in inplace), r.backward))  # type: ignore[arg-type]
        if limit is None or limit.gpu_timing != r.gpu_timing:
            continue
        if math.isfinite(r.median_s) and math.isfinite(limit.median_s) and limit.median_s > 0:
            r.ratios["x copy"] = r.median_s / limit.median_s


def run_on_device(options: argparse.Namespace, backend: Any) -> tuple[dict[str, Any], list[Result]]:
    """The GPU groups (:data:`CUDA_GROUPS`) on ``backend``'s device, timed as :mod:`rotary.tools.bench.cuda` says."""
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
                inp = harness.make_inputs(
                    group.shape, DTYPE_NAMES[dtype_name], device=device, interleaved=group.interleaved
                )
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
            group_results = []
            for m, failure in rows:
                t = timings.get((m.name, m.backward), cuda.DeviceTiming(note=failure))
                note = "; ".join(filter(None, [m.note, t.note]))
                group_results.append(
                    Result(
                        name,
                        m.name,
                        m.backward,
                        t.gpu_s,
                        options.repeats,
                        note=note,
                        host_s=t.host_s,
                        gpu_timing=t.gpu_timing,
                    )
                )
            _device_ratios(group_results, inplace)
            results.extend(group_results)
            del inp, calls
            backend.release()
            if options.progress:  # the group's table too: a run stopped later still leaves the groups done
                print(f"  timed {name} ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
                table = [device_row(r) for r in group_results]
                print(
                    "\n".join(
                        group_table(name, DEVICE_HEADER, table, getattr(options, "markdown", False), left=(0, 4))
                    ),
                    file=sys.stderr,
                    flush=True,
                )
    machine["fused_cpu_kernel"] = _cpu_kernel_state()  # rope(q, k) tries the CPU decoding fast path first
    return machine, results


def _cpu_kernel_state() -> str:
    """Whether the fused CPU kernel is loaded ("loaded" or why not), asked after the groups ran."""
    from rotary.kernels.extension import cpu_extension_error, load_cpu_extension

    return "loaded" if load_cpu_extension() is not None else f"unavailable: {cpu_extension_error()}"


def _device_machine(device: torch.device, methods: list[Method]) -> dict[str, Any]:
    """The GPU, CUDA, Triton and the baselines' versions."""
    info: dict[str, Any] = {"device": str(device)}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
    info["triton"] = package_version("triton")
    info["baselines"] = {m.requires: package_version(m.requires) for m in methods if m.requires}
    return info


def _without_missing_packages(methods: list[Method]) -> list[Method]:
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
        raise InputError(f"--cases {path}: not a Python file; give a .py file that registers methods or suites")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SystemExit as exc:  # sys.exit() in the user's file must not end the benchmark with its status
        raise InputError(
            f"--cases {path}: importing it called sys.exit({exc.code!r}); a cases file only registers"
        ) from None
    except Exception as exc:  # the user's file: say which one and what it raised, no traceback
        raise InputError(f"--cases {path}: importing it raised {type(exc).__name__}: {exc}") from None


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
