"""Progress of a run: rich progress bars with an ETA on a terminal, plain log lines otherwise.

A log file or a CI console gets one line when a task starts, about every tenth of the way (at most
every few seconds), and when it ends; a terminal gets a bar with the loss and the time left.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

__all__ = ["Reporter", "Task", "table_console"]


def table_console(stream: TextIO | None = None) -> Any:
    """A rich console on ``stream`` (default stdout), at least 100 columns wide so piped tables do not wrap.

    >>> import io
    >>> out = io.StringIO()
    >>> c = table_console(out)
    >>> c.print("perplexity 3.2"); c.width >= 100, out.getvalue()
    (True, 'perplexity 3.2\\n')
    """
    import shutil

    columns = shutil.get_terminal_size((120, 24)).columns
    return _console_class()(file=stream if stream is not None else sys.stdout, width=max(columns, 100), highlight=False)


def _console_class() -> type:
    """``rich.console.Console`` that lets a closed pipe raise ``BrokenPipeError`` (for ``cli.main``)."""
    from rich.console import Console

    class PipeConsole(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError("the reader of the output has gone")

    return PipeConsole


class Task:
    """One counted piece of work (training one model, evaluating one model)."""

    def __init__(self, reporter: Reporter, description: str, total: int, completed: int) -> None:
        self.reporter, self.description, self.total, self.completed = reporter, description, total, completed
        self.started, self.start_count = time.perf_counter(), completed
        self.fields: dict[str, Any] = {}
        self._last_line = self.started
        self._next_tenth = completed * 10 // max(total, 1) + 1
        self._rich_id = None

    def advance(self, steps: int = 1, **fields: Any) -> None:
        """Count ``steps`` more units done; ``fields`` (e.g. ``loss=1.23``) are shown beside the bar."""
        self.completed += steps
        self.fields.update(fields)
        r = self.reporter
        if self._rich_id is not None and r.progress is not None:
            r.progress.update(self._rich_id, advance=steps, info=self._info())
        elif r.enabled:
            now = time.perf_counter()
            tenth = self.completed * 10 // max(self.total, 1)
            if self.completed < self.total and (tenth >= self._next_tenth and now - self._last_line >= 2.0):
                self._next_tenth = tenth + 1
                self._last_line = now
                r.log(f"{self.description}: {self.completed}/{self.total} {self._info()} {self._times(now)}")

    def _info(self) -> str:
        return " ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in self.fields.items())

    def _times(self, now: float) -> str:
        elapsed = now - self.started
        done = self.completed - self.start_count
        if done <= 0 or self.completed >= self.total:
            return f"({elapsed:.0f} s)"
        eta = elapsed / done * (self.total - self.completed)
        return f"({elapsed:.0f} s, about {eta:.0f} s left)"


class Reporter:
    """Where a run tells what it is doing (``enabled``: False on every rank but 0; ``interactive``: rich bars).

    >>> import io
    >>> out = io.StringIO()
    >>> with Reporter(stream=out).task("train rope", total=2) as t:
    ...     t.advance(loss=1.5); t.advance(loss=1.25)
    >>> out.getvalue().splitlines()[-1].startswith("train rope: done 2/2 loss 1.25")
    True
    """

    def __init__(self, enabled: bool = True, stream: TextIO | None = None, interactive: bool | None = None) -> None:
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stdout
        self.interactive = bool(enabled and (self.stream.isatty() if interactive is None else interactive))
        self.progress = None
        self._open: list[Task] = []  # the tasks on the live display (a terminal's bars)

    def log(self, message: str) -> None:
        """One line (through rich's console when bars are live, so they are not torn)."""
        if not self.enabled:
            return
        if self.progress is not None:
            self.progress.console.print(message, markup=False, highlight=False)
        else:
            print(message, file=self.stream, flush=True)

    @contextmanager
    def task(self, description: str, total: int, completed: int = 0) -> Iterator[Task]:
        """A counted task; a bar (terminal) or start / progress / end lines (otherwise)."""
        t = self.start_task(description, total, completed)
        try:
            yield t
        finally:
            self.end_task(t)

    def start_task(self, description: str, total: int, completed: int = 0) -> Task:
        """:meth:`task` without the ``with``, shown until :meth:`end_task`; several may be open at once."""
        t = Task(self, description, total, completed)
        if self.interactive:
            if self.progress is None:
                from rich.progress import (
                    BarColumn,
                    MofNCompleteColumn,
                    Progress,
                    TextColumn,
                    TimeElapsedColumn,
                    TimeRemainingColumn,
                )

                self.progress = Progress(
                    TextColumn("{task.description}"),
                    BarColumn(),
                    MofNCompleteColumn(),
                    TextColumn("{task.fields[info]}"),
                    TimeElapsedColumn(),
                    TextColumn("eta"),
                    TimeRemainingColumn(),
                    console=_console_class()(file=self.stream),
                    transient=False,
                )
                self.progress.start()
            t._rich_id = self.progress.add_task(description, total=total, completed=completed, info="")
            self._open.append(t)
        elif self.enabled:
            note = " (resumed)" if completed else ""
            self.log(
                f"{description}: {completed}/{total}{note}" if completed < total else f"{description}: already done"
            )
        return t

    def end_task(self, t: Task) -> None:
        """End a task of :meth:`start_task`: its last bar stays on the terminal, or its end line is logged."""
        if t in self._open:
            self._open.remove(t)
            if self.progress is not None:
                if not self._open:
                    self.progress.stop()
                    self.progress = None
                else:
                    done = next(task for task in self.progress.tasks if task.id == t._rich_id)
                    finished = self.progress.make_tasks_table([done])
                    self.progress.remove_task(t._rich_id)
                    self.progress.console.print(finished)
        elif self.enabled and not self.interactive and t.completed > t.start_count:
            self.log(
                f"{t.description}: done {t.completed}/{t.total} {t._info()} {t._times(time.perf_counter())}".rstrip()
            )
