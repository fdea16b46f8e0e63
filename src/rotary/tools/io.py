"""File writing the tools share."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["write_atomic"]


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write ``path`` (its directory must exist) through ``<name>.tmp`` and a rename: never half a file under its
    real name; a ``str`` is written as UTF-8. Raises OSError when the directory is missing or not writable.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     write_atomic(Path(d) / "a.txt", "whole")
    ...     (Path(d) / "a.txt").read_text(), sorted(p.name for p in Path(d).iterdir())
    ('whole', ['a.txt'])
    """
    tmp = path.with_name(path.name + ".tmp")
    if isinstance(data, str):
        tmp.write_text(data, encoding="utf-8")
    else:
        tmp.write_bytes(data)
    os.replace(tmp, path)
