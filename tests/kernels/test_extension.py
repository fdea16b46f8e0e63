"""Building the fused CPU kernel: the notice before a build, ``rotary build``, one build per environment."""

from __future__ import annotations

import json
import os
import types
from pathlib import Path

import pytest
import torch

from rotary.kernels import extension
from rotary.tools.cli import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fake_compiler(monkeypatch, tmp_path):
    """``cpp_extension.load`` replaced by a fake that 'compiles' by writing the .so file; the cache moved
    to ``tmp_path`` and the loader's state restored afterwards (the real kernel stays loaded elsewhere)."""
    from torch.utils import cpp_extension

    monkeypatch.setenv("ROTARY_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("ROTARY_NO_EXTENSION", raising=False)
    for name in ("_module", "_tried", "_error"):
        monkeypatch.setattr(extension, name, getattr(extension, name))
    builds = []

    def load(name, build_directory, **kwargs):
        builds.append(name)
        target = Path(build_directory) / f"{name}.so"
        target.write_bytes(FAKE_BUILD)
        return types.SimpleNamespace(__file__=str(target))

    def load_built(path):  # what importing the fake build gives, and a file that does not import
        if path.read_bytes() != FAKE_BUILD:
            raise ImportError(f"{path}: invalid ELF header")
        builds.append(f"loaded {path.name}")
        return types.SimpleNamespace(__file__=str(path))

    monkeypatch.setattr(cpp_extension, "load", load)
    monkeypatch.setattr(extension, "_load_built", load_built)
    return builds


FAKE_BUILD = b"a fake build"


def test_a_build_prints_one_notice_and_a_cached_build_none(fake_compiler, capsys):
    path = extension.build_cpu_extension()
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "building the fused CPU kernel once, about half a minute" in err and "ROTARY_NO_EXTENSION=1" in err
    assert path == extension.cpu_extension_path() and path.is_file()
    assert extension.build_cpu_extension() == path  # cached now
    assert capsys.readouterr().err == ""
    assert fake_compiler == [path.stem, f"loaded {path.name}"]  # built once, then imported without ninja


def test_a_finished_build_loads_without_a_compiler_or_ninja(fake_compiler, monkeypatch):
    """Another virtualenv's torch (the same build of it) or an image without a compiler: a finished build is
    imported as it is; ninja would have compiled it again for this environment's include paths."""
    import shutil

    path = extension.build_cpu_extension()
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setenv("CXX", "no-such-compiler")
    assert extension.build_cpu_extension() == path
    assert fake_compiler == [path.stem, f"loaded {path.name}"]


def test_a_build_that_does_not_import_is_built_again(fake_compiler, capsys):
    path = extension.cpu_extension_path()
    path.parent.mkdir(parents=True)
    path.write_bytes(b"half a file")  # a build killed while it linked, or a file damaged since
    assert extension.build_cpu_extension() == path
    assert fake_compiler == [path.stem] and path.read_bytes() == FAKE_BUILD
    assert "building the fused CPU kernel once" in capsys.readouterr().err


def test_while_a_build_holds_its_lock_the_file_is_left_to_torchs_loader(fake_compiler):
    """A build in another process: torch's loader waits for its lock, then finds the build done; the file is
    not imported while the linker may still be writing it."""
    path = extension.build_cpu_extension()
    (path.parent / "lock").write_text("")
    assert extension.build_cpu_extension() == path
    assert fake_compiler == [path.stem, path.stem]


def test_torch_gets_copies_of_the_compiler_flags(fake_compiler, monkeypatch):
    """torch.utils.cpp_extension.load appends its libraries to extra_ldflags; on the module's own list
    a second build in one process saw other flags, and torch's versioner compiled the kernel again
    (about 25 s) under a new name."""
    from torch.utils import cpp_extension

    fake = cpp_extension.load
    seen = []

    def load(**kwargs):
        seen.append((list(kwargs["extra_cflags"]), list(kwargs["extra_ldflags"])))
        kwargs["extra_ldflags"].append("-ltorch")  # what torch does
        return fake(**kwargs)

    monkeypatch.setattr(cpp_extension, "load", load)
    cflags, ldflags = list(extension.CFLAGS), list(extension.LDFLAGS)
    first = extension.build_cpu_extension()
    first.unlink()  # built again in this process
    assert extension.build_cpu_extension() == first
    assert seen[0] == seen[1] == (cflags, ldflags)
    assert (extension.CFLAGS, extension.LDFLAGS) == (cflags, ldflags)


def test_first_use_prints_the_notice_too(fake_compiler, capsys):
    extension._tried = False
    assert extension.load_cpu_extension() is not None
    assert "building the fused CPU kernel once" in capsys.readouterr().err


def test_rotary_build_reports_where_the_kernel_lives(fake_compiler, capsys):
    assert main(["build", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["path"] == str(extension.cpu_extension_path()) and out["cached"] is False
    assert main(["build"]) == 0
    captured = capsys.readouterr()
    assert f"fused CPU kernel already built: {extension.cpu_extension_path()}" in captured.out
    assert captured.err == ""


def test_rotary_build_exits_1_with_the_reason(monkeypatch, capsys, tmp_path):
    from torch.utils import cpp_extension

    monkeypatch.setenv("ROTARY_CACHE_DIR", str(tmp_path))

    def no_compiler(**kwargs):
        raise RuntimeError("Error building extension 'rotary_cpu'\nc++: command not found")

    monkeypatch.setattr(cpp_extension, "load", no_compiler)
    assert main(["build"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(
        "rotary build: error: the fused CPU kernel cannot be built (RuntimeError: c++: command not found)"
    )
    assert "Traceback" not in "\n".join(err)


def test_build_against_the_real_cache(tmp_path):
    """``rotary build`` against the real cache: the kernel the test suite already uses. In process
    (``run_main``: the same ``main`` as ``python -m rotary``, whose own process test_cli.py checks)."""
    from helpers import run_main

    extension.build_cpu_extension()  # cached by the suite's first kernel call (half a minute otherwise)
    done = run_main("build", cwd=tmp_path)
    assert done.stdout.startswith("fused CPU kernel already built: ") and done.stderr == ""
    assert Path(done.stdout.splitlines()[0].split(": ", 1)[1]).is_file()


def test_checkouts_of_one_source_share_one_build_compiled_from_its_own_copy(fake_compiler, monkeypatch, tmp_path):
    """Two checkouts (a fresh clone, a worktree) of the same source bytes at two paths: one build name, and
    the build compiles the copy inside its own folder, so neither checkout's path is in its ninja file and
    the second checkout loads the first one's build; other bytes, another build."""
    from torch.utils import cpp_extension

    real_load, sources = cpp_extension.load, []
    monkeypatch.setattr(cpp_extension, "load", lambda **kw: sources.append(kw["sources"]) or real_load(**kw))
    path = extension.build_cpu_extension()
    elsewhere = tmp_path / "elsewhere" / "cpu"
    elsewhere.mkdir(parents=True)
    for name in (*extension.UNITS, *extension.HEADERS):
        (elsewhere / name).write_bytes(extension.SOURCE.with_name(name).read_bytes())
    monkeypatch.setattr(extension, "SOURCE", elsewhere / "rotary.cpp")
    assert extension.cpu_extension_path() == path
    built = [path.parent / name for name in extension.UNITS]
    stamps = [p.stat().st_mtime_ns for p in built]
    assert extension.build_cpu_extension() == path
    assert sources == [[str(p) for p in built]] and fake_compiler[-1] == f"loaded {path.name}"
    for name in (*extension.UNITS, *extension.HEADERS):
        assert (path.parent / name).read_bytes() == (elsewhere / name).read_bytes(), name
    assert [p.stat().st_mtime_ns for p in built] == stamps  # written once: ninja finds nothing to rebuild
    header = elsewhere / "rotary.h"  # a change to any file of the build, the header's too, is another build
    header.write_bytes(header.read_bytes() + b"// another revision\n")
    assert extension.cpu_extension_path() != path


def test_build_name_carries_the_cpu_flags(monkeypatch):
    """-march=native compiles for this CPU's instruction set: its flags are part of the build name."""
    fingerprint = extension._cpu_fingerprint()
    if Path("/proc/cpuinfo").is_file():
        flags = [ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.split(":")[0].strip() == "flags"]
        assert flags and flags[0] in fingerprint.splitlines()
    name = extension._build_name()
    monkeypatch.setattr(extension, "_cpu_fingerprint", lambda: fingerprint.replace("avx512f", "no-avx512f") + "x")
    assert extension._build_name() != name


def test_build_name_is_one_per_build_of_torch_not_per_installation(monkeypatch):
    """Each checkout's .venv installs the same torch somewhere else: one build for all of them; another
    torch (version, commit or C++ ABI) is another build."""
    name = extension._build_name()
    monkeypatch.setattr(torch, "__file__", "/another/env/site-packages/torch/__init__.py")
    assert extension._build_name() == name
    monkeypatch.setattr(torch.version, "git_version", "0" * 40)
    assert extension._build_name() != name
    monkeypatch.undo()
    monkeypatch.setattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", not torch._C._GLIBCXX_USE_CXX11_ABI)
    assert extension._build_name() != name


FIRST_USE = """
import json, os, sys, tempfile
os.environ.pop("ROTARY_NO_EXTENSION", None)
os.environ.update(json.loads(sys.argv[1]))
captured = tempfile.TemporaryFile()
sys.stderr.flush()
os.dup2(captured.fileno(), 2)  # what the first use writes on stderr, a compiler's own output included
import torch, rotary
q = torch.randn(1, 2, 4, 8)
rotary.RoPE(8)(q, q)
sys.stderr.flush()
captured.seek(0)
print(json.dumps({"rotated": True, "stderr": captured.read().decode()}))
"""


def _stderr_of_first_use(tmp_path, **env: str) -> str:
    """stderr of a fresh process's first rope(q, k), with an empty kernel cache: a child forked from the
    interpreter server (``helpers.run_interpreted``: torch imported, nothing of rotary), its environment set
    before rotary is imported."""
    from helpers import run_interpreted

    out = run_interpreted(FIRST_USE, json.dumps({"ROTARY_CACHE_DIR": str(tmp_path / "cache"), **env}))
    (line,) = out.splitlines()  # nothing else on stdout
    result = json.loads(line)
    assert result["rotated"], out
    return result["stderr"]


def test_without_a_compiler_the_fallback_says_so_in_one_line(tmp_path):
    err = _stderr_of_first_use(tmp_path, CXX=str(tmp_path / "no-such-compiler"))
    assert len(err.splitlines()) == 1, err
    assert "fused CPU kernel is unavailable" in err and "no C++ compiler" in err and "no-such-compiler" in err
    assert "ROTARY_NO_EXTENSION=1" in err and "building" not in err


def test_rotary_no_extension_is_silent(tmp_path):
    assert _stderr_of_first_use(tmp_path, ROTARY_NO_EXTENSION="1") == ""


def test_a_lock_left_by_a_killed_build_is_removed_and_the_build_goes_on(fake_compiler, capsys):
    """torch's loader waits forever for ``<build dir>/lock``: a build killed mid-way hung every later import."""
    directory = extension.cpu_extension_path().parent
    directory.mkdir(parents=True)
    lock = directory / "lock"
    lock.write_text("")
    old = lock.stat().st_mtime - extension.STALE_LOCK_SECONDS - 60
    os.utime(lock, (old, old))
    path = extension.build_cpu_extension()
    assert path.is_file() and not lock.exists()
    err = capsys.readouterr().err
    assert f"removed {lock}" in err and "did not finish" in err


def test_a_fresh_lock_is_left_to_the_build_that_holds_it(fake_compiler, capsys):
    directory = extension.cpu_extension_path().parent
    directory.mkdir(parents=True)
    lock = directory / "lock"
    lock.write_text("")  # another process is building right now
    extension._clear_stale_lock(directory)
    assert lock.exists() and "removed" not in capsys.readouterr().err
