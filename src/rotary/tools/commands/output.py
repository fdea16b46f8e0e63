"""The ``-o/--out PATH`` convention: where a subcommand writes (missing directories are created).

A file stem for one figure (``-o figs/decay`` writes ``figs/decay.png`` and ``.svg``; a directory gets the
default name inside it), a directory for several files (``plot scaling``, ``report``), or, for a command that
prints, a file that takes the printed text or JSON instead of stdout.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ...errors import InputError

__all__ = ["add_output_argument", "open_output_file", "output_directory", "output_path", "output_stem"]


def output_path(text: str) -> str:
    """argparse type of ``-o``: a non-empty path (an empty one would silently mean the current directory)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"must name a file or directory, got {text!r}")
    return text


def add_output_argument(p: argparse.ArgumentParser, kind: str, default: str | None, what: str) -> None:
    """Add ``-o/--out PATH`` of ``kind`` ``"stem"``, ``"dir"`` or ``"file"`` (default stdout)."""
    metavar = {"stem": "PATH", "dir": "DIR", "file": "FILE"}[kind]
    where = f"default {default}" if default else "default: stdout"
    p.add_argument(
        "-o",
        "--out",
        type=output_path,
        metavar=metavar,
        default=default,
        help=f"{what} ({where}; directories are created)",
    )
    p.set_defaults(out_kind=kind)


def _make_directory(directory: Path, given: str) -> None:
    if directory.exists() and not directory.is_dir():
        raise InputError(f"-o {given}: {directory} exists and is not a directory; choose another -o")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(
            f"-o {given}: cannot create the directory {directory} ({exc.strerror}); choose another -o"
        ) from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise InputError(f"-o {given}: the directory {directory} is not writable; choose another -o")


def output_stem(given: str, default_name: str) -> Path:
    """The file stem ``-o`` names for one figure (``.png``/``.svg`` dropped; a directory gets ``default_name``),
    its parent created.
    """
    stem = Path(given)
    if given.endswith(("/", os.sep)) or stem.is_dir():
        stem = stem / default_name
    if stem.suffix.lower() in (".png", ".svg"):
        stem = stem.with_suffix("")
    _make_directory(stem.parent, given)
    for suffix in (".png", ".svg"):
        target = stem.with_name(stem.name + suffix)
        if target.is_dir():
            raise InputError(
                f"-o {given}: {target} is a directory; give a file stem such as {stem.parent / default_name}"
            )
    return stem


def output_directory(given: str) -> Path:
    """The directory ``-o`` names for several files, created if missing."""
    directory = Path(given)
    _make_directory(directory, given)
    return directory


def open_output_file(given: str):
    """The file ``-o`` names for a printing command, opened for writing (its directory created)."""
    path = Path(given)
    if path.is_dir():
        raise InputError(f"-o {given}: is a directory; give a file name for the output")
    _make_directory(path.parent, given)
    try:
        return open(path, "w", encoding="utf-8")
    except OSError as exc:
        raise InputError(f"-o {given}: cannot write ({exc.strerror}); choose another -o") from None
