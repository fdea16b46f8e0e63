"""A lock that objects holding it can still be copied and pickled with.

``copy.deepcopy(model)`` (EMA weights, model surgery) and ``torch.save(model)`` pickle every attribute;
a ``threading.Lock`` cannot be pickled. What a lock guards is shared state of one live object, so a
copy gets a fresh, unlocked lock of its own.
"""

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
