"""The text a run learns from: files, directories, glob patterns, or a corpus every Python has (nothing downloaded).

``--data`` takes sources read in order and joined by a newline: a UTF-8 file; a directory or a glob pattern
(their regular files in sorted order, hidden files and ``__pycache__`` left out, files that are not UTF-8 text
skipped and counted); ``builtin:pydoc`` (CPython's ``pydoc_data.topics``, about 0.47 MB, the default);
``builtin:stdlib`` (the interpreter's standard library sources, tens of MB, differing between versions).
"""

from __future__ import annotations

import glob
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from .config import ExperimentError

__all__ = ["BUILTIN_CORPORA", "DEFAULT_SOURCE", "Text", "first_invalid_utf8", "read_sources", "read_text"]

DEFAULT_SOURCE = "builtin:pydoc"
BUILTIN_CORPORA = {
    "builtin:pydoc": "CPython's pydoc_data.topics",
    "builtin:stdlib": "the standard library's *.py sources of the running Python",
}
#: bytes decoded at a time when checking a text: the check never holds the whole text as a str
UTF8_CHUNK = 1 << 20


@dataclass(frozen=True)
class Text:
    """The bytes of every source joined (``data``), the ``source`` as given, the ``files`` read and ``skipped``."""

    data: bytes
    source: str
    files: int
    skipped: int = 0


def first_invalid_utf8(data: bytes, chunk: int | None = None) -> int | None:
    r"""The offset of the first byte that is not valid UTF-8, or None; decoded ``chunk`` bytes at a time.

    >>> first_invalid_utf8("Grü".encode()), first_invalid_utf8(b"caf\xe9"), first_invalid_utf8(b"ab\xc3", chunk=2)
    (None, 3, 2)
    """
    import codecs

    size = chunk or UTF8_CHUNK
    decoder = codecs.getincrementaldecoder("utf-8")()
    view = memoryview(data)
    for start in range(0, len(data), size):
        pending = len(decoder.getstate()[0])  # bytes of a character cut by the previous chunk
        try:
            decoder.decode(view[start : start + size], final=start + size >= len(data))
        except UnicodeDecodeError as exc:
            return start - pending + exc.start
    return None


def _is_text(data: bytes) -> bool:
    return bool(data) and b"\x00" not in data and first_invalid_utf8(data) is None


def _pydoc() -> bytes:
    from pydoc_data.topics import topics

    # sorted: the order of a dict literal is the file's, but be explicit about it
    return "\n\n".join(topics[k] for k in sorted(topics)).encode("utf-8")


def _stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    found = []
    for directory, names, files in os.walk(root):
        names[:] = sorted(
            n for n in names if n not in ("site-packages", "dist-packages", "__pycache__") and not n.startswith(".")
        )
        found += [Path(directory) / f for f in sorted(files) if f.endswith(".py")]
    return found


def _tree(root: Path) -> list[Path]:
    found = []
    for directory, names, files in os.walk(root):
        names[:] = sorted(n for n in names if n != "__pycache__" and not n.startswith("."))
        found += [Path(directory) / f for f in sorted(files) if not f.startswith(".")]
    return found


def _read_listed(paths: list[Path], given: str, what: str) -> tuple[list[bytes], int]:
    """The UTF-8 texts among ``paths`` (a directory's files or a pattern's matches) and how many were skipped."""
    texts, skipped = [], 0
    for path in paths:
        if not path.is_file():
            continue
        try:
            data = path.read_bytes()
        except OSError:
            skipped += 1
            continue
        if _is_text(data):
            texts.append(data)
        else:
            skipped += 1
    if not texts:
        raise ExperimentError(
            f"--data {given}: {what} holds no UTF-8 text ({skipped} file(s), none of them non-empty UTF-8 text); "
            "give files of UTF-8 text, or builtin:pydoc / builtin:stdlib"
        )
    return texts, skipped


def read_text(path: str) -> bytes:
    """The bytes of one named file; ExperimentError when it is missing, not a regular file, unreadable, empty or
    not UTF-8.
    """
    file = Path(path)
    if not file.is_file():  # /dev/zero, a pipe, a socket: reading could never end
        raise ExperimentError(f"--data {path} is not a regular file (a device, pipe or socket); give a UTF-8 text file")
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise ExperimentError(f"--data {path} cannot be read ({exc.strerror}); check its permissions") from None
    if not data:
        raise ExperimentError(f"--data {path} is empty; give a UTF-8 text file")
    bad = first_invalid_utf8(data)
    if bad is not None:
        raise ExperimentError(
            f"--data {path} is not UTF-8 text (byte 0x{data[bad]:02x} at offset {bad}); "
            "convert it, e.g. with iconv -t UTF-8"
        )
    return data


def read_sources(sources: tuple[str, ...] | list[str] | None) -> Text:
    """Read every source of ``--data`` (None: ``builtin:pydoc``) and join them.

    Raises:
        ExperimentError: a source that does not exist, matches nothing or holds no UTF-8 text; a named file that
            is not UTF-8 text; an unknown ``builtin:`` name.

    >>> text = read_sources(None)
    >>> text.source, text.files, len(text.data) > 100_000
    ('builtin:pydoc', 1, True)
    """
    sources = list(sources) if sources else [DEFAULT_SOURCE]
    parts: list[bytes] = []
    files = skipped = 0
    for given in sources:
        if given.startswith("builtin:"):
            if given not in BUILTIN_CORPORA:
                raise ExperimentError(f"--data {given}: unknown built-in corpus; known: {', '.join(BUILTIN_CORPORA)}")
            if given == "builtin:pydoc":
                parts.append(_pydoc())
                files += 1
            else:
                texts, left_out = _read_listed(_stdlib_files(), given, "the standard library")
                parts += texts
                files, skipped = files + len(texts), skipped + left_out
            continue
        path = Path(given)
        if path.is_dir():
            texts, left_out = _read_listed(_tree(path), given, "the directory")
        elif path.exists():
            texts, left_out = [read_text(given)], 0
        elif glob.has_magic(given):
            matches = sorted(Path(m) for m in glob.glob(given, recursive=True))
            if not matches:
                raise ExperimentError(f"--data {given}: the pattern matches no file")
            texts, left_out = _read_listed(matches, given, "what the pattern matches")
        else:
            raise ExperimentError(f"--data {given}: no such file or directory")
        parts += texts
        files, skipped = files + len(texts), skipped + left_out
    return Text(b"\n".join(parts), " ".join(sources), files, skipped)
