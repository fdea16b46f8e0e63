"""Several models of a run at a time (``--jobs``), each in a process of its own on ``--threads`` threads.

Processes, because torch's intra-op threads belong to a process and small models use two threads poorly
(docs/experiment.md). A pool of workers forked by a fork server that has imported torch and run nothing (a fork
of the main process after OpenMP threads can hang; ``spawn`` where there is no fork server) gets the texts once;
a job is one model trained, evaluated and described as :mod:`.jobs` does it, so its numbers equal ``--jobs 1``'s
at the same ``--threads``, bit for bit. Fine-tunes start once their parent's weights arrive. A worker's
ExperimentError ends the run naming the first failed model in plan order; a worker that dies is one line saying
how to continue; Ctrl-C stops the workers; a killed run takes its workers with it.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import multiprocessing
import multiprocessing.connection
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from .config import ExperimentConfig, ExperimentError
from .distributed import Distributed
from .evaluate import EvaluationText
from .jobs import ModelResult, evaluate_cached, model_from_bytes, model_record, state_bytes
from .plan import ModelSpec
from .progress import Reporter, Task
from .train import train_model

__all__ = ["choose_jobs", "run_in_parallel"]

#: seconds between two progress messages of one task from a worker (their steps are summed)
FORWARD_EVERY = 0.25


def choose_jobs(config: ExperimentConfig, dist: Distributed, jobs: int | None, models: int) -> tuple[int, int]:
    """How many models train at a time, and each one's torch threads; ``config`` is left as given.

    Alone on the CPU, by default each model gets one thread and as many run as torch's thread count holds;
    ``--threads T`` alone runs ``budget // T`` at once, ``--jobs J`` alone gives each ``budget // J`` threads.
    Under torchrun or on CUDA, one at a time. Raises ExperimentError for a ``--jobs`` that is not a positive
    integer, or above 1 under torchrun or on CUDA.

    >>> jobs, threads = choose_jobs(ExperimentConfig(device="cpu"), Distributed(), 2, models=22)
    >>> jobs, threads == max(1, torch.get_num_threads() // 2)
    (2, True)
    """
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise ExperimentError(f"--jobs must be a positive integer, got {jobs!r}")
    budget = torch.get_num_threads()
    if jobs is not None and jobs > 1:
        if dist.world_size > 1:
            raise ExperimentError(
                f"--jobs {jobs} trains models side by side in processes of their own, but under torchrun the "
                f"{dist.world_size} processes train each model together; leave --jobs out"
            )
        if config.device != "cpu":
            raise ExperimentError(
                f"--jobs {jobs} trains models side by side on the CPU, but --device {config.device} trains them one "
                "at a time; leave --jobs out or use --device cpu"
            )
    threads = config.threads
    if config.device != "cpu" or dist.world_size > 1:
        return 1, budget if threads is None else threads
    if jobs is None:
        threads = 1 if threads is None else threads
        jobs = budget // threads
    elif threads is None:
        threads = max(1, budget // jobs)
    return max(1, min(jobs, models)), threads


# ------------------------------------------------------------------------------------------------
# the worker processes

_WORKER: dict[str, Any] = {}


def _follow_parent(parent: int) -> None:
    """End this process when the main process ``parent`` ends, however it ends (a SIGKILL included).

    A worker is forked by the fork server, not by ``parent``: it watches the pipe ``parent`` holds open to it
    (``multiprocessing.parent_process().sentinel``, ready once ``parent`` has ended, the kernel closing its
    end), and ends with the process that started it too (PR_SET_PDEATHSIG).
    """
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            import ctypes

            ctypes.CDLL(None).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG: the fork server's end
    main = multiprocessing.parent_process()
    if main is None or main.pid != parent:
        os._exit(1)

    def watch() -> None:
        multiprocessing.connection.wait([main.sentinel])
        os._exit(1)

    threading.Thread(target=watch, name="rotary-parent-watch", daemon=True).start()


def _init_worker(threads: int, data: bytes, events: Any, parent: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    _follow_parent(parent)
    torch.set_num_threads(threads)
    payload = torch.load(io.BytesIO(data), weights_only=True)
    _WORKER["train"] = payload["train"]
    _WORKER["text"] = EvaluationText(payload["windows"], tuple(payload["sliding"]), payload["held_out"])
    _WORKER["events"] = events


class _ForwardedTask:
    """A worker's task: its counts go to the main process, summed over :data:`FORWARD_EVERY` seconds."""

    def __init__(self, events: Any, key: tuple[int, int]) -> None:
        self.events, self.key = events, key
        self.steps, self.fields, self.sent = 0, {}, time.perf_counter()

    def advance(self, steps: int = 1, **fields: Any) -> None:
        self.steps += steps
        self.fields.update(fields)
        if time.perf_counter() - self.sent >= FORWARD_EVERY:
            self.flush()

    def flush(self) -> None:
        if self.steps or self.fields:
            self.events.put(("advance", self.key, self.steps, self.fields))
        self.steps, self.fields, self.sent = 0, {}, time.perf_counter()


class _ForwardingReporter:
    """The reporter of a worker: its lines and tasks are shown by the main process's reporter."""

    enabled = True
    interactive = False

    def __init__(self, events: Any) -> None:
        self.events = events
        self._keys = itertools.count()

    def log(self, message: str) -> None:
        self.events.put(("log", message))

    @contextmanager
    def task(self, description: str, total: int, completed: int = 0) -> Iterator[_ForwardedTask]:
        key = (os.getpid(), next(self._keys))
        self.events.put(("start", key, description, total, completed))
        task = _ForwardedTask(self.events, key)
        try:
            yield task
        finally:
            task.flush()
            self.events.put(("end", key))


def _job(
    spec: ModelSpec,
    parent: tuple[ModelSpec, bytes] | None,
    send_weights: bool,
    config: ExperimentConfig,
    directory: Path,
    resumed: bool,
) -> None:
    """Train, evaluate and describe one model in a worker; its results are its last message."""
    events = _WORKER["events"]
    reporter: Any = _ForwardingReporter(events)
    start = None if parent is None else model_from_bytes(parent[0], config, parent[1])
    outcome = train_model(
        spec, config, _WORKER["train"], parent=start, run_dir=directory, resume=resumed, reporter=reporter
    )
    if send_weights:  # the models that start from it need not wait for its evaluation
        events.put(("trained", spec.name, state_bytes(outcome.model)))
    rows, seconds = evaluate_cached(spec, outcome.model, _WORKER["text"], config, directory, resumed, reporter)
    events.put(("done", spec.name, ModelResult(model_record(spec, outcome, config), rows, outcome.seconds, seconds)))


# ------------------------------------------------------------------------------------------------
# the main process


@contextmanager
def _sigint_ignored() -> Iterator[None]:
    """SIGINT ignored while a worker may be started: the child inherits that and never sees Ctrl-C."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)


def _pack(train: torch.Tensor, text: EvaluationText) -> bytes:
    buffer = io.BytesIO()
    torch.save(
        {"train": train.clone(), "windows": text.windows, "sliding": list(text.sliding), "held_out": text.held_out},
        buffer,
    )
    return buffer.getvalue()


def _stop(pool: ProcessPoolExecutor) -> None:
    """Kill the workers now and wait for them: none writes anything after this returns."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    for p in processes:
        with contextlib.suppress(Exception):
            p.kill()
    for p in processes:
        with contextlib.suppress(Exception):
            p.join(timeout=10)
    pool.shutdown(wait=False, cancel_futures=True)


def run_in_parallel(
    specs: list[ModelSpec],
    config: ExperimentConfig,
    jobs: int,
    train: torch.Tensor,
    text: EvaluationText,
    directory: Path,
    resumed: bool,
    reporter: Reporter,
) -> dict[str, ModelResult]:
    """Train and evaluate every model of ``specs``, ``jobs`` at a time: model name -> ``ModelResult``.

    Raises:
        ExperimentError: the first failed model in plan order, or a worker process died.
        KeyboardInterrupt: Ctrl-C (the workers are stopped first).
    """
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        # the fork server, a fresh interpreter that runs nothing, imports this module (torch, rotary) and
        # torch._dynamo (which torch.optim imports when first used) once; each worker is a fork of it, started in
        # milliseconds instead of the seconds of those imports
        context.set_forkserver_preload([__name__, "torch._dynamo"])
    else:  # Windows
        context = multiprocessing.get_context("spawn")
    events = context.Queue()
    by_name = {s.name: s for s in specs}
    order = {s.name: i for i, s in enumerate(specs)}
    parents = {s.parent_name for s in specs if s.parent is not None}
    waiting = [s for s in specs if s.parent is None] + [s for s in specs if s.parent is not None]
    running: dict[str, Future] = {}
    weights: dict[str, bytes] = {}
    results: dict[str, ModelResult] = {}
    failures: dict[str, BaseException] = {}
    tasks: dict[Any, Task] = {}

    def handle(event: tuple) -> None:
        kind = event[0]
        if kind == "log":
            reporter.log(event[1])
        elif kind == "start":
            tasks[event[1]] = reporter.start_task(*event[2:])
        elif kind == "advance":
            tasks[event[1]].advance(event[2], **event[3])
        elif kind == "end":
            reporter.end_task(tasks.pop(event[1]))
        elif kind == "trained":
            weights[event[1]] = event[2]
        elif kind == "done":
            results[event[1]] = event[2]
            running.pop(event[1], None)

    pool = ProcessPoolExecutor(
        jobs,
        mp_context=context,
        initializer=_init_worker,
        initargs=(config.threads, _pack(train, text), events, os.getpid()),
    )
    try:
        while running or (waiting and not failures):
            if not failures:
                for spec in [s for s in waiting if s.parent is None or s.parent_name in weights]:
                    if len(running) >= jobs:
                        break
                    waiting.remove(spec)
                    parent = None if spec.parent is None else (by_name[spec.parent_name], weights[spec.parent_name])
                    with _sigint_ignored():
                        running[spec.name] = pool.submit(
                            _job, spec, parent, spec.name in parents, config, directory, resumed
                        )
                if not running:
                    raise RuntimeError(f"no model can start: {[s.name for s in waiting]} wait for a parent")
            with contextlib.suppress(queue.Empty):
                handle(events.get(timeout=0.1))
                while True:
                    handle(events.get_nowait())
            for name, future in list(running.items()):
                if future.done() and future.exception() is not None:
                    failures[name] = future.exception()
                    del running[name]
            if failures:
                first = min(failures, key=order.__getitem__)
                if not any(order[n] < order[first] for n in running):
                    break  # no model before it can still fail
        if failures:
            _stop(pool)
            error = failures[min(failures, key=order.__getitem__)]
            if isinstance(error, BrokenProcessPool):
                names = ", ".join(sorted(failures, key=order.__getitem__))
                raise ExperimentError(
                    f"a worker process of --jobs {jobs} died while it trained or evaluated {names} ({error}); "
                    f"{directory} has no results.json. Continue the run with the same command and --resume {directory}"
                ) from None
            raise error
        pool.shutdown(wait=True)
        return results
    except BaseException:
        _stop(pool)
        raise
    finally:
        for task in list(tasks.values()):
            reporter.end_task(task)
        events.close()
        events.join_thread()
