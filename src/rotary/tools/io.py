"""File writing the tools share."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["write_atomic"]


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write ``path`` through a temporary file and a rename: never half a file under its real name.

    A ``str`` is written as UTF-8. The temporary file, ``<name>.tmp``, sits beside ``path`` (a rename
    within one directory is atomic); a kill while writing leaves the previous file intact.

    Args:
        path: the file to write (its directory must exist).
        data: the whole content.

    Raises:
        OSError: the directory is missing or not writable.

    Example:
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
