"""The documents a sweep measures perplexity on: the user's text files, or a built-in text that needs no network.

``--data`` takes files, directories and glob patterns (UTF-8 text), one document per file; without it, the
largest ``*.py`` files of the running Python's standard library (offline, long, but code; docs/sweep.md).
"""

from __future__ import annotations

import glob
import hashlib
import os
import sysconfig
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from ...errors import InputError

__all__ = ["BUILTIN", "Documents", "load_documents"]

BUILTIN = "builtin:stdlib"
#: files a sweep reads at most looking for documents (``--data /`` would otherwise read the whole disk)
MAX_FILES = 10000


@dataclass(frozen=True)
class Documents:
    """Tokenized documents: int64 ``tokens`` each (longest first), ``names``, ``source``, ``sha256``."""

    tokens: list[torch.Tensor]
    names: list[str]
    source: str
    sha256: str


def _walk(directory: Path) -> Iterator[Path]:
    """Regular files under ``directory`` in sorted order, hidden ones left out, found as they are needed."""
    for root, dirs, files in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if not name.startswith(".") and os.path.isfile(os.path.join(root, name)):
                yield Path(root, name)


def _files(sources: Sequence[str]) -> Iterator[tuple[Path, bool]]:
    """``(file, named)`` of every source in order; ``named``: given itself, not found in a directory."""
    for source in sources:
        path = Path(source)
        if path.is_file():
            yield path, True
        elif path.is_dir():
            yield from ((p, False) for p in _walk(path))
        else:
            matched = sorted(Path(p) for p in glob.glob(source, recursive=True) if Path(p).is_file())
            if not matched:
                raise InputError(f"--data {source}: no such file, directory or matching pattern")
            yield from ((p, False) for p in matched)


def _builtin_files(count: int) -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [p for p in root.glob("*.py") if p.is_file()]
    files += [p for p in root.glob("*/*.py") if p.is_file() and "site-packages" not in p.parts]
    files.sort(key=lambda p: (-p.stat().st_size, p.name))
    return files[: max(count, 1)]


def load_documents(sources: Sequence[str] | None, tokenizer, *, longest: int, limit: int) -> Documents:
    """Read and tokenize the documents, keeping at most ``limit`` of those with ``longest`` tokens or more.

    Raises:
        rotary.errors.InputError: a missing file, text that is not UTF-8, or no document that long (naming the
            longest found).
    """
    files = ((p, False) for p in _builtin_files(limit * 4)) if not sources else _files(sources)
    source = BUILTIN if not sources else " ".join(sources)
    digest = hashlib.sha256()
    tokens, names, longest_found = [], [], 0
    for seen, (path, named) in enumerate(files):
        if seen == MAX_FILES:
            raise InputError(
                f"--data {source}: {MAX_FILES} files read and {len(tokens)} documents of {longest} tokens found; "
                "give the files or a smaller directory"
            )
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError) as exc:
            if named:
                why = f"not UTF-8 text (byte {exc.start})" if isinstance(exc, UnicodeDecodeError) else exc.strerror
                raise InputError(f"--data {path}: {why}; give text files") from None
            continue  # a binary or unreadable file inside a directory: not a document
        ids = torch.tensor(tokenizer(text)["input_ids"], dtype=torch.int64)
        longest_found = max(longest_found, ids.numel())
        if ids.numel() < longest:
            continue
        digest.update(text.encode())
        tokens.append(ids)
        names.append(os.fspath(path))
        if len(tokens) == limit:
            break
    if not tokens:
        raise InputError(
            f"--data {source}: the longest document has {longest_found} tokens, shorter than the longest length "
            f"{longest}; give longer text (one document per file) or shorter --lengths"
        )
    return Documents(tokens, names, source, digest.hexdigest())
