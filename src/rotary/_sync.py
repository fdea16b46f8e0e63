"""A lock that objects holding it can still be deep-copied and pickled with: a copy gets a fresh lock."""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["CopyableLock"]


class CopyableLock:
    """A ``threading.Lock`` (context manager) whose copies and unpickled versions are new locks.

    Example:
        >>> import copy, pickle
        >>> lock = CopyableLock()
        >>> with lock:
        ...     twin = copy.deepcopy(lock)
        >>> twin.acquire(blocking=False)  # the copy is a new lock, not the held one
        True
        >>> type(pickle.loads(pickle.dumps(lock))).__name__
        'CopyableLock'
    """

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(self, *exc: Any) -> None:
        self._lock.release()

    def __reduce__(self) -> tuple[type, tuple]:
        return (CopyableLock, ())

    def __deepcopy__(self, memo: dict) -> CopyableLock:
        return CopyableLock()
