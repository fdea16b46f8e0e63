"""Build (once, on first use) and load the fused CPU kernel in ``cpu/`` (:data:`UNITS`, :data:`HEADERS`).

The sources are compiled with ``torch.utils.cpp_extension.load`` (ninja) into ``$ROTARY_CACHE_DIR``, else
``~/.cache/rotary``, for the instruction set of the building machine (``-march=native``). The build name
fingerprints the CPU, the compiler flags, torch's build, Python's version and the sources' bytes, so machines
sharing a home directory get one build per CPU model; it omits where torch is installed, and sources are
compiled from copies inside the build folder, so every virtualenv and checkout of the same sources loads the
one build (imported directly, without ninja or a compiler). When the build is impossible (no compiler, no
ninja) the library warns once and takes the pure-torch path (silently with ``ROTARY_NO_EXTENSION=1``). A new
build prints a one-line notice (about half a minute on two cores); ``rotary build`` (:func:`build_cpu_extension`)
compiles ahead of time.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
import time
import warnings
from pathlib import Path
from types import ModuleType

import torch

__all__ = [
    "build_cpu_extension",
    "cpu_extension_error",
    "cpu_extension_path",
    "load_cpu_extension",
    "SOURCE",
    "UNITS",
    "HEADERS",
]

SOURCE = Path(__file__).with_name("cpu") / "rotary.cpp"
#: the files of the build, beside :data:`SOURCE`: two translation units, compiled in parallel (ninja), and
#: the kernels they share
UNITS = ("rotary.cpp", "rotary_cache.cpp")
HEADERS = ("rotary.h",)
# -ffp-contract=off: no fused multiply-add, so results are bit-identical to the pure-torch path
# (separate fp32 multiplies and adds), which the tests assert.
CFLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fopenmp", "-DNDEBUG"]
LDFLAGS = ["-fopenmp"]

#: a build lock older than this was left by a build that was killed (a build takes about half a minute)
STALE_LOCK_SECONDS = 15 * 60

_module: ModuleType | None = None
_error: str | None = None
_tried = False


def _cpu_fingerprint() -> str:
    """Model name and flags of this CPU: what ``-march=native`` compiles for."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        keep = [ln for ln in lines if ln.split(":")[0].strip() in ("model name", "flags", "Features", "CPU part")]
        return "\n".join(sorted(set(keep)))
    except OSError:
        return platform.processor() + platform.machine()


def _build_name() -> str:
    h = hashlib.sha256()
    # the build of torch it links against (version, commit, C++ ABI), not where it is installed: every
    # virtualenv with that torch (each checkout's .venv, a fresh clone's) loads the one build, which
    # resolves torch's libraries from the torch already imported (it records no path to them)
    for part in (
        *(path.read_bytes() for path in _files()),
        " ".join(CFLAGS).encode(),
        torch.__version__.encode(),
        str(torch.version.git_version).encode(),
        str(torch._C._GLIBCXX_USE_CXX11_ABI).encode(),
        platform.python_version().encode(),
        _cpu_fingerprint().encode(),
    ):
        h.update(part)
    return f"rotary_cpu_{h.hexdigest()[:16]}"


def _files() -> list[Path]:
    """The sources of the build (the units, then the headers), in the folder of :data:`SOURCE`."""
    return [SOURCE.with_name(name) for name in (*UNITS, *HEADERS)]


def _cache_dir() -> Path:
    root = os.environ.get("ROTARY_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "rotary")
    return Path(root)


def cpu_extension_path() -> Path:
    """Where the compiled kernel for this machine, torch and source lives (whether built yet or not)."""
    name = _build_name()
    return _cache_dir() / name / (name + (".pyd" if sys.platform == "win32" else ".so"))


def _clear_stale_lock(directory: Path) -> None:
    """Remove a build lock older than :data:`STALE_LOCK_SECONDS`: torch's loader would wait for it forever."""
    lock = directory / "lock"
    try:
        age = time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return
    if age > STALE_LOCK_SECONDS:
        lock.unlink(missing_ok=True)
        print(
            f"rotary: removed {lock}, left {age / 60:.0f} min ago by a build that did not finish",
            file=sys.stderr,
            flush=True,
        )


def _load_built(path: Path) -> ModuleType:
    """Import the finished build at ``path`` as torch's loader does once ninja is done, without running ninja
    (which would rebuild the kernel for another virtualenv's include paths) or needing a compiler."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _build() -> ModuleType:
    import shutil

    from torch.utils import cpp_extension

    # ninja installed in a virtualenv sits beside its python, which may not be on PATH (make test).
    if shutil.which("ninja") is None:
        os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    target = cpu_extension_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    _clear_stale_lock(target.parent)
    if target.is_file() and not (target.parent / "lock").exists():  # built, and no build under way
        try:
            return _load_built(target)
        except (ImportError, OSError):
            target.unlink(missing_ok=True)  # a file that does not import: built again below
    if not target.is_file():  # a cached build loads in well under a second: no notice then
        # found missing before a build starts: no notice of a build that cannot happen, and none of
        # torch's own multi-line warnings about the compiler
        compiler = os.environ.get("CXX") or "c++"  # what torch.utils.cpp_extension runs on Linux and macOS
        if sys.platform != "win32" and shutil.which(compiler) is None:
            raise RuntimeError(f"no C++ compiler: {compiler!r} is not on PATH (install g++ or clang, or set CXX)")
        if shutil.which("ninja") is None:
            raise RuntimeError("ninja is not installed (pip install ninja)")
        print(
            f"rotary: building the fused CPU kernel once, about half a minute (into {target.parent}); "
            "set ROTARY_NO_EXTENSION=1 to skip it and use the pure-torch path",
            file=sys.stderr,
            flush=True,
        )
    return cpp_extension.load(
        name=target.parent.name,
        sources=[str(path) for path in _build_sources(target.parent)],
        # copies: torch appends its libraries to extra_ldflags in place, and a changed argument list
        # makes its versioner build the kernel again under a new name (_v1, _v2, ...) on the next load
        extra_cflags=list(CFLAGS),
        extra_ldflags=list(LDFLAGS),
        build_directory=str(target.parent),
        verbose=False,
    )


def _build_sources(directory: Path) -> list[Path]:
    """The copies of the build's files (:func:`_files`) in the build folder ``directory``, and the units among
    them, which the build compiles. Each is written once: the folder's name carries the files' hash, so an
    existing copy holds these very bytes, and leaving it untouched keeps its time stamp, which ninja compares."""
    copies = []
    for path in _files():
        copy = directory / path.name
        if not copy.is_file():
            partial = directory / f".{path.name}.{os.getpid()}"  # a rename: no build ever sees half a file
            partial.write_bytes(path.read_bytes())
            os.replace(partial, copy)
        copies.append(copy)
    return copies[: len(UNITS)]


def _reason(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[-1] if text else ''}"


def build_cpu_extension() -> Path:
    """Compile the fused CPU kernel now (or load the cached build) and return the compiled file's path.

    What ``rotary build`` runs; it builds even when ``ROTARY_NO_EXTENSION`` is set.

    Raises:
        RuntimeError: the kernel cannot be built; the message says why (no compiler, no ninja, ...).

    Example:
        >>> path = build_cpu_extension()  # half a minute the first time on this machine, then cached
        >>> path == cpu_extension_path() and path.is_file()
        True
    """
    global _module, _error, _tried
    try:
        module = _build()
    except Exception as exc:  # a compiler error, a missing ninja, an unwritable cache directory...
        raise RuntimeError(_reason(exc)) from exc
    if os.environ.get("ROTARY_NO_EXTENSION", "") in ("", "0"):
        _module, _error, _tried = module, None, True
    return Path(module.__file__) if getattr(module, "__file__", None) else cpu_extension_path()


def load_cpu_extension() -> ModuleType | None:
    """The compiled kernel module, building it on the first call; ``None`` (after one warning) if unavailable."""
    global _module, _error, _tried
    if _tried:
        return _module
    _tried = True
    if os.environ.get("ROTARY_NO_EXTENSION", "") not in ("", "0"):
        _error = "disabled by ROTARY_NO_EXTENSION"  # asked for: no warning
        return None
    try:
        _module = _build()
    except Exception as exc:  # any build failure means: fall back, do not crash the caller
        _error = _reason(exc)
        # one line on stderr: warn_explicit names no source line to print under the message
        warnings.warn_explicit(
            f"the fused CPU kernel is unavailable ({_error}); using the slower pure-torch path "
            "(set ROTARY_NO_EXTENSION=1 to silence this)",
            RuntimeWarning,
            filename="rotary",
            lineno=0,
            module="rotary",
        )
    return _module


def cpu_extension_error() -> str | None:
    """Why the extension is unavailable (``None`` if it loaded or was never tried)."""
    return _error
