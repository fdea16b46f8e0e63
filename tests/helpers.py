"""Helpers shared by the test files (importable as ``helpers``: pytest's ``pythonpath`` holds ``tests/``).

- :func:`run_cli`: the real command line, ``python -m rotary ...`` in a subprocess, with this
  checkout's ``src`` first on the path;
- :func:`run_main`: the same command run in this process (``rotary.tools.cli.main``), its output
  captured: what a test of a command's output uses (a subprocess costs seconds of imports);
- :func:`run_interpreted`: a script in a fresh process under Triton's interpreter (the Triton kernels
  on CPU tensors), asserted to succeed (forked from one server per test process that has imported
  torch and triton);
- :func:`import_each_alone`: import each of many modules in its own process that has imported nothing
  of ``rotary`` (forked children of one interpreter that has imported torch), the failures returned;
- :func:`hf_config`, :func:`text_config`, :func:`llama_config`: transformers configs built from
  dicts or a few numbers (models are built from configs with random weights, never downloaded);
- :func:`leaf_parsers`: every runnable subcommand of ``rotary`` with its argparse parser;
- :func:`make_qk`: q and k in either layout (optionally views into one fused qkv projection);
- :func:`forbid_torch_path`: make the pure-torch rotation fail the test, so a test that compares the
  fused kernel with the torch path cannot pass by silently falling back to it;
- :func:`experiment_rows`: hand-made rows of ``rotary experiment`` (perplexities per method, seed and
  mode), for the claims and the report.
- :func:`build_tiny`: a transformers model built from its config with every weight set: weights its own
  initialisation leaves as they were allocated (some MoE experts are ``torch.empty``) are drawn too.
- :func:`small_lm`: a small :class:`rotary.models.Decoder` in eval mode (vocabulary 50, two layers),
  any of its config's fields overridden.
- :func:`run_threads`, :func:`outputs_from_threads`: one object called from several threads at once
  (with the ``one_intraop_thread`` fixture of conftest.py).
- :data:`NAMED` and :func:`assert_named`: what a property test accepts as an error for arbitrary input
  (hypothesis strategies are in ``strategies.py``).
- :func:`assert_named_error` and :func:`assert_sound`: the two ways a call of the configuration layer
  on a perturbed input may end: a ``ConfigError`` / ``ValueError`` / ``TypeError`` raised by rotary
  itself that names the offending key or value (never a bare ZeroDivisionError, KeyError,
  OverflowError, ... or "math domain error"), or frequencies that are finite and turn, with a finite
  attention scaling > 0.
- :func:`hf_frequencies` and :func:`computes`: transformers' frequencies of a scaling block as written, and
  whether rotary must accept them (the oracle of the perturbed-block property tests).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import copy
import io
import json
import math
import os
import pickle
import subprocess
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

import torch

import rotary
from rotary import ConfigError
from rotary.models import Decoder, DecoderConfig
from rotary.rope_types import ROPE_TYPES, proportional_pairs

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"


def cli_env(**extra: str) -> dict[str, str]:
    """The environment of a subprocess that must import this checkout's ``rotary``."""
    path = str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": path, **extra}


def run_cli(
    *argv: str, cwd: Path | str | None = None, ok: bool | None = True, timeout: float = 600, env: dict | None = None
) -> subprocess.CompletedProcess:
    """Run ``python -m rotary *argv``; with ``ok=True`` assert success and no traceback on stderr.

    ``ok=False`` asserts a failure that is a one-line error (status 2, no traceback); ``ok=None``
    asserts nothing and returns the completed process.
    """
    proc = subprocess.run(
        [sys.executable, "-m", "rotary", *argv],
        cwd=cwd,
        env=env or cli_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return _checked(proc, ok)


def _checked(proc: subprocess.CompletedProcess, ok: bool | None) -> subprocess.CompletedProcess:
    """``ok=True``: status 0; ``ok=False``: status 2 (a usage error); either way no traceback on stderr."""
    if ok is True:
        assert proc.returncode == 0, proc.stderr
        assert "Traceback" not in proc.stderr, proc.stderr
    elif ok is False:
        assert proc.returncode == 2, (proc.returncode, proc.stderr)
        assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def run_main(*argv: str, cwd: Path | str, ok: bool | None = True) -> subprocess.CompletedProcess:
    """``rotary *argv`` in this process, in ``cwd``: :func:`run_cli`'s result and checks without a subprocess.

    ``main`` returns the exit status or raises ``SystemExit`` (argparse); stdout and stderr are captured. An
    uncaught exception propagates (it fails the test with its traceback: a subprocess would exit 1 with one
    on stderr). ``ok`` as in :func:`run_cli`.
    """
    import contextlib
    import io

    from rotary.tools.cli import main

    out, err, before = io.StringIO(), io.StringIO(), os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = main(list(argv))
            except SystemExit as exc:
                status = exc.code if isinstance(exc.code, int) else 1
    finally:
        os.chdir(before)
    return _checked(subprocess.CompletedProcess(["rotary", *argv], status, out.getvalue(), err.getvalue()), ok)


_INTERPRETER = r"""
import json, os, sys, traceback
import torch, triton  # once, under TRITON_INTERPRET=1: what every script would import first


def patch_each_language_once_per_launch():
    # Triton's interpreter patches triton.language (every builtin of tl, tl.core, tl.math and tl.tensor
    # wrapped, found by inspect.getmembers) at each launch, and again at every call of a @triton.jit helper
    # inside it, although the launch's patches stay in place until it ends (the helper's are never undone):
    # a fifth of an interpreted kernel's time. A helper call inside a launch skips the patching when each
    # language module its globals hold (tl, tl.core) was patched in this launch already; one that holds
    # another (triton.language.standard's helpers see only tl.core) patches as before. Patching again would
    # set the same wrappers: the kernels run the same operations (a missing patch would fail loudly, "Did
    # you forget to add @triton.jit?", never compute something else). Left as it is on another Triton.
    from triton.runtime import interpreter as it

    lang = getattr(it, "tl", None)
    patch, grid_call = getattr(it, "_patch_lang", None), getattr(getattr(it, "GridExecutor", None), "__call__", None)
    if lang is None or patch is None or grid_call is None or not hasattr(lang, "core"):
        return
    state = {"depth": 0, "patched": None}  # languages patched in the running launch (None: not yet)

    def languages(fn):
        return {id(v) for v in fn.__globals__.values() if v is lang or v is lang.core}

    def patch_once(fn):
        wanted, patched = languages(fn), state["patched"]
        if patched is not None and wanted and wanted <= patched:
            return None  # only a helper call inside a launch gets here: its return value is unused
        scope = patch(fn)
        if state["depth"]:
            state["patched"] = wanted | (patched or set())
        return scope

    def launch(self, *args, **kwargs):
        outer, state["patched"] = state["patched"], None  # a launch patches for itself first
        state["depth"] += 1
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            state["depth"] -= 1
            state["patched"] = outer

    it._patch_lang, it.GridExecutor.__call__ = patch_once, launch


def check_int_overflow_in_numpy():
    # Triton's interpreter (3.9) sanitizes int32 overflow the way the compiler does: each integer add,
    # subtract and multiply of 32 bits or fewer is redone in int64 (two casts, the operation, two constants,
    # two comparisons and an `and`, each an interpreted op) and handed to device_assert, which does nothing
    # unless the options' `debug` is on; the interpreter's options are built with debug=False and never
    # changed, so the check cost half of an interpreted kernel's time and could never fail. Here the same
    # condition is evaluated on the operands' NumPy arrays, and an overflow raises with Triton's message
    # ("int32 overflow detected for operation mul"): cheaper, and a check that can fail. Every lane is
    # checked, as Triton's compiled check does (no mask). Left as it is on another Triton.
    import numpy as np
    from triton.language import semantic

    impl = getattr(getattr(semantic, "TritonSemantic", None), "binary_op_sanitize_overflow_impl", None)
    if impl is None:
        return
    ops = {"add": np.add, "sub": np.subtract, "mul": np.multiply}

    def sanitize(self, lhs, rhs, binary_op):
        scalar = lhs.type.scalar
        if scalar.int_bitwidth >= 64 or not self.builder.options.sanitize_overflow:
            return
        if scalar != rhs.type.scalar or not scalar.is_int() or binary_op.__name__ not in ops:
            return impl(self, lhs, rhs, binary_op)  # what the checks below do not cover: Triton's own code
        a, b = np.asarray(lhs.handle.data, np.int64), np.asarray(rhs.handle.data, np.int64)
        # exact in int64 (a uint32 product past 2**63 wraps negative: refused too)
        exact = ops[binary_op.__name__](a, b)
        if exact.size and (exact.max() > scalar.get_int_max_value() or exact.min() < scalar.get_int_min_value()):
            raise AssertionError(f"int{scalar.int_bitwidth} overflow detected for operation {binary_op.__name__}")

    semantic.TritonSemantic.binary_op_sanitize_overflow_impl = sanitize


patch_each_language_once_per_launch()
check_int_overflow_in_numpy()
for line in sys.stdin:  # a request: [script, args, cwd, stdout file, stderr file]
    script, args, cwd, out, err = json.loads(line)
    pid = os.fork()
    if pid == 0:  # the child runs the script as `python -c script *args` would, in cwd
        code = 0
        try:
            os.chdir(cwd)
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            for fd, name in ((1, out), (2, err)):
                os.dup2(os.open(name, os.O_WRONLY | os.O_TRUNC), fd)
            sys.argv = ["-c", *args]
            exec(compile(script, "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if not isinstance(exc.code, (int, type(None))):
                print(exc.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # not sys.exit: tearing down the copied torch heap checks nothing of the script
    print(json.dumps(pid), flush=True)
    print(json.dumps(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])), flush=True)
"""

_interpreter: dict = {}  # this process's interpreter server: the Popen and the environment it started with
_interpreter_lock = threading.Lock()


def _interpreter_server() -> subprocess.Popen:
    # pytest names the running test in PYTEST_CURRENT_TEST, a new value at every test: left out, or the
    # server would be started again (torch and triton imported again, about 3 s of CPU) for every script
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    # nor what Inductor writes into os.environ for its own use when a test first compiles, maybe after the server
    # started (which that would start again): the address of an object of this process, which a script cannot use
    # (one that compiles sets its own), and its cache directory when it is the default, which a script finds alike
    env.pop("_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR", None)
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    if env.get("TORCHINDUCTOR_CACHE_DIR") == os.path.abspath(default_cache_dir()):
        del env["TORCHINDUCTOR_CACHE_DIR"]
    env["TRITON_INTERPRET"] = "1"
    server = _interpreter.get("server")
    if server is None or server.poll() is not None or _interpreter.get("env") != env:
        if server is not None and server.poll() is None:
            server.kill()
            server.wait()
        # tests/ first on the scripts' path: they import covering (rows of a product, tests/covering.py)
        server = subprocess.Popen(
            [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})\n" + _INTERPRETER],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        _interpreter.update(server=server, env=env)
    return server


@atexit.register
def _stop_interpreter_server() -> None:
    """End of the test process: the server reads the end of its input and leaves; it is waited for."""
    server = _interpreter.get("server")
    if server is not None:
        server.stdin.close()
        server.wait(timeout=60)


def run_interpreted(script: str, *args: str, timeout: float = 600) -> str:
    """Run ``script`` (Python source) as a fresh process under Triton's interpreter (``TRITON_INTERPRET=1``:
    it must be on before Triton is imported, and other tests import it first); assert it succeeded and
    return its stdout.

    The process is a child forked from a server that has imported torch and triton (and nothing of
    rotary) with ``TRITON_INTERPRET=1`` and this environment: each script starts where ``python -c script``
    stands after those two imports (a copy: what one script changes, the next never sees), without paying
    about 2 s of CPU for them again; it leaves with ``os._exit`` once its output is flushed (the exit
    handlers of torch's copied heap would cost time and check nothing of the script). The server is started
    once per test process, again if the environment has changed since (the name of the running test aside).
    """
    import tempfile

    with _interpreter_lock, tempfile.TemporaryDirectory() as tmp:
        out, err = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
        for name in (out, err):
            open(name, "w").close()
        server = _interpreter_server()
        server.stdin.write(json.dumps([script, list(args), os.getcwd(), out, err]) + "\n")
        server.stdin.flush()
        pid = json.loads(server.stdout.readline())
        timer = threading.Timer(timeout, lambda: os.kill(pid, 9))
        timer.start()
        try:
            line = server.stdout.readline()
        finally:
            timer.cancel()
        assert line, "the interpreter server died"
        status = json.loads(line)
        with open(out) as fh_out, open(err) as fh_err:
            stdout, stderr = fh_out.read(), fh_err.read()
    assert status != -9, f"the script ran past {timeout} s: " + stdout[-4000:] + stderr[-6000:]
    assert status == 0, stdout[-4000:] + stderr[-6000:]
    return stdout


_IMPORT_EACH = r"""
import atexit, importlib, json, os, sys, threading, traceback

preload, modules, workers = json.loads(sys.argv[1])
for name in preload:
    importlib.import_module(name)
loaded = sorted(m for m in sys.modules if m == "rotary" or m.startswith("rotary."))
if loaded:
    raise SystemExit(f"the preloaded modules {preload} imported {loaded}: the children would not import alone")
listed = set(modules)
failed, results, running, forked = {}, {}, {}, 0
todo = sorted(modules, key=lambda name: name.count("."))  # each package before the modules inside it


def ready(name):  # its package's child has ended, or its package is not listed
    package = name.rpartition(".")[0]
    return package not in listed or package in results


while todo or running:
    while todo and len(running) < workers and any(ready(name) for name in todo):
        name = next(name for name in todo if ready(name))
        todo.remove(name)
        package = name.rpartition(".")[0]
        if package in results and name in results[package][1]:
            # the package's child imported this module too and succeeded: its own child would import the package
            # the same way (a module's packages are imported first), find the module loaded, and succeed too
            results[name] = results[package]  # and its modules, as the same child imported them
            continue
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: import one module; run what it left for the exit; leave
            os.close(read)
            code, report = 0, {"error": None, "loaded": []}
            try:
                importlib.import_module(name)
                report["loaded"] = sorted(m for m in listed if m in sys.modules)
                atexit._run_exitfuncs()
                sys.stdout.flush()
                sys.stderr.flush()
                threads = [t.name for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon]
                if threads:
                    raise RuntimeError(
                        f"importing {name} left threads that would keep the interpreter alive: {threads}"
                    )
            except BaseException:
                report = {"error": traceback.format_exc()[-2000:], "loaded": []}
                code = 1
            os.write(write, json.dumps(report).encode())  # a few KiB: fits the pipe, read after the child ends
            os._exit(code)  # not sys.exit: tearing down torch's copied heap costs seconds per child
        os.close(write)
        running[pid] = (name, read)
        forked += 1
    if not running:
        continue
    pid, status = os.wait()
    name, read = running.pop(pid)
    message = b"".join(iter(lambda: os.read(read, 65536), b"")).decode(errors="replace")
    os.close(read)
    code = os.waitstatus_to_exitcode(status)
    try:
        report = json.loads(message)
    except ValueError:  # killed, or it wrote something else
        report = {"error": message, "loaded": []}
    error = None if code == 0 else f"exit status {code}: {report['error']}"
    results[name] = error, set(report["loaded"]) if error is None else set()
    if error is not None:
        failed[name] = error
print(json.dumps({"failed": failed, "checked": len(results), "forked": forked}))
"""


def import_each_alone(
    modules: list[str], preload: tuple[str, ...] | None = None, workers: int = 2, timeout: float = 600
) -> dict[str, str]:
    """Import each module of ``modules`` in a process of its own in which nothing of ``rotary`` was imported
    before; return ``{module: error}`` for those that fail (an empty dict when all import).

    One fresh interpreter imports ``preload`` (third-party packages, which must import nothing of rotary:
    checked; by default torch, and triton where it is installed) and then forks one child per module
    (``workers`` at a time); the child imports its module, runs the exit handlers (``atexit``) and fails
    if a thread would keep the interpreter alive, so a failure at import or at exit is seen. Each child
    starts from the state a fresh interpreter reaches after importing those packages (sys.path, cwd and
    environment alike), without paying for them again. It leaves with ``os._exit`` once its checks are
    done: the interpreter's own teardown of the copied torch heap would cost seconds per child and checks
    nothing of rotary.

    A module that its package's child imported along with the package (``rotary/__init__.py`` imports most
    of rotary) gets no child of its own when that child succeeded: Python imports a module's packages first,
    so its child would run the very same imports as the package's, find the module loaded, and succeed the
    same way (in src/ on 2026-12-01: 19 children for 121 modules). Under a package that fails alone, each
    module has its own child.
    """
    import importlib.util
    import json

    if preload is None:  # the third-party packages rotary imports at once (triton: 0.4 s of each child's 0.5)
        preload = ("torch", "triton") if importlib.util.find_spec("triton") else ("torch",)
    done = subprocess.run(
        [sys.executable, "-c", _IMPORT_EACH, json.dumps([list(preload), list(modules), workers])],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["checked"] == len(set(modules)) and report["forked"] <= report["checked"]
    return report["failed"]


def leaf_parsers() -> dict[str, argparse.ArgumentParser]:
    """Every runnable subcommand's parser, by its name (``"inspect"``, ``"plot decay"``, ...)."""
    from rotary.tools.cli import build_parser

    def walk(parser: argparse.ArgumentParser, name: str):
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            yield name, parser
        for action in subs:
            for sub_name, sub in action.choices.items():
                yield from walk(sub, f"{name} {sub_name}".strip())

    return dict(walk(build_parser(), ""))


def hf_config(d: dict[str, Any]):
    """``transformers.AutoConfig.for_model(**d)`` on a deep copy (``d`` holds ``model_type``)."""
    from transformers import AutoConfig

    return AutoConfig.for_model(**copy.deepcopy(d))


def text_config(d: dict[str, Any]):
    """The text part of :func:`hf_config` (multimodal configs nest it as ``text_config``)."""
    cfg = hf_config(d)
    return getattr(cfg, "text_config", None) or cfg


def llama_config(head_dim: int = 64, theta: float = 10000.0, max_pos: int = 2048, **overrides: Any):
    """A small ``LlamaConfig``: 4 query heads, 2 key/value heads, default RoPE with base ``theta``."""
    from transformers import LlamaConfig

    kwargs: dict[str, Any] = dict(
        hidden_size=head_dim * 4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=head_dim,
        max_position_embeddings=max_pos,
        rope_parameters={"rope_type": "default", "rope_theta": theta},
    )
    kwargs.update(overrides)
    return LlamaConfig(**kwargs)


def make_qk(
    shape: tuple[int, int, int, int, int],
    *,
    dtype: torch.dtype = torch.float32,
    layout: str = "bhsd",
    strided: bool = False,
    gen: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """q, k for ``shape = (B, S, Hq, Hk, D)`` in ``layout``, and the fused projection they view (or None).

    ``strided=True`` makes q and k views into one ``[B, S, Hq + 2 Hk, D]`` qkv projection, as a fused
    ``Linear`` gives them.
    """
    B, S, Hq, Hk, D = shape
    if strided:
        qkv = torch.randn(B, S, Hq + 2 * Hk, D, generator=gen).to(dtype)
        q, k = qkv[:, :, :Hq], qkv[:, :, Hq : Hq + Hk]
        if layout == "bhsd":
            q, k = q.transpose(1, 2), k.transpose(1, 2)
        return q, k, qkv
    dims = (lambda h: (B, h, S, D)) if layout == "bhsd" else (lambda h: (B, S, h, D))
    return torch.randn(dims(Hq), generator=gen).to(dtype), torch.randn(dims(Hk), generator=gen).to(dtype), None


def forbid_torch_path(monkeypatch) -> None:
    """Fail the test if a rotation or a table gradient takes the pure-torch path.

    The dispatcher falls back to pure torch (bit-identical on CPU for fp32) when no fused kernel
    takes the tensors; a test meant to exercise the fused kernel would then still pass. With this
    in place such a fallback fails the test instead. Oracles computed with
    ``rotary.kernels.eager.rotate_torch`` are still allowed.
    """
    import pytest

    from rotary.kernels import eager, ops

    def fail(*args, **kwargs):
        pytest.fail("took the pure-torch path instead of the fused kernel")

    monkeypatch.setattr(eager, "run_torch", fail)
    monkeypatch.setattr(ops, "run_torch", fail)
    monkeypatch.setattr(ops, "table_grad_torch", fail)


# the no-synchronisation rule, proven on the CPU ------------------------------------------------

#: aten ops that read a tensor's values on the host (a device-to-host synchronisation on a GPU), or
#: whose output shape depends on values (the same)
HOST_READS = frozenset({
    "_local_scalar_dense", "item", "nonzero", "equal", "is_nonzero", "masked_select", "unique", "_unique",
    "_unique2", "unique_consecutive", "unique_dim", "repeat_interleave", "allclose", "bincount", "histc",
})  # fmt: skip


class HostReadError(AssertionError):
    """A value of a tensor was read on the host inside :func:`accelerator_rules`."""


class _NoHostReads(torch.utils._python_dispatch.TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name.split("::")[-1]
        if name in HOST_READS:
            raise HostReadError(f"{func} reads tensor values on the host")
        return func(*args, **(kwargs or {}))


class accelerator_rules:
    """Run rotary on CPU tensors as if they were on an accelerator, and fail on any host read.

    ``rotary.devices.host_checks`` is the one place that decides whether a device's checks read
    values on the host (the CPU) or read nothing (every other device); inside this context it
    answers "read nothing" for the CPU too, and a dispatch mode raises :class:`HostReadError`
    on any op that reads values (``.item()``, ``int(t)``, ``bool(t)``, ``nonzero``, ``equal``, ...).
    ``Tensor.tolist`` and ``Tensor.numpy`` (which read memory without an aten op) raise too. The
    CPU kernel still computes the results, so they can be compared with the usual path.
    """

    def __enter__(self):
        import rotary.devices as checks

        self._saved = (checks.host_checks, torch.Tensor.tolist, torch.Tensor.numpy)
        checks.host_checks = lambda device: False

        def refuse(*args, **kwargs):
            raise HostReadError("tolist()/numpy() read tensor values on the host")

        torch.Tensor.tolist = refuse  # type: ignore[method-assign]
        torch.Tensor.numpy = refuse  # type: ignore[method-assign]
        self._mode = _NoHostReads()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        import rotary.devices as checks

        self._mode.__exit__(*exc)
        checks.host_checks, torch.Tensor.tolist, torch.Tensor.numpy = self._saved
        return False


def use_static_write(monkeypatch, path: str) -> list[None]:
    """Make :class:`rotary.nn.StaticKVCache` take new unrotated q and k by ``path``, for the rest of the test:
    ``"fused"`` (what it does: one ``rotary.rotate_and_cache`` call) or ``"rotate_then_copy"`` (the path
    before it: rotate q and k, then ``index_copy_`` k and v into the buffers). Returns a list that gets one
    entry per call.
    """
    import rotary
    import rotary.nn.cache
    from rotary.serving import rotate_and_cache

    assert path in ("fused", "rotate_then_copy"), path
    calls: list[None] = []

    def rotate_then_copy(q, k, v, k_cache, v_cache, slots, tables, *, layout, cache_layout, inplace):
        assert layout == cache_layout == "bhsd"
        q, k = rotary.rotate([q, k], tables, kinds=("q", "k"), names=("q", "k"), inplace=inplace)
        with torch.no_grad():
            k_cache.index_copy_(2, slots[0], k)  # every row writes the same slots
            v_cache.index_copy_(2, slots[0], v)
        return q, k

    def counted(*args, **kwargs):
        calls.append(None)
        return (rotate_and_cache if path == "fused" else rotate_then_copy)(*args, **kwargs)

    monkeypatch.setattr(rotary.nn.cache, "rotate_and_cache", counted)
    return calls


def experiment_rows(
    table: dict,
    lengths: list[int],
    *,
    second_seed: dict | None = None,
    passkey: int = 36,
    passkey_model: tuple[str, str] = ("rope-ft-linear", "linear"),
):
    """``rotary.tools.experiments.rows.Measurements`` for seeds 0 and 1 from perplexities.

    Args:
        table: ``(model, scaling, mode) -> [perplexity at each of lengths]`` of seed 0.
        lengths: the evaluation lengths.
        second_seed: seed 1's perplexities where they are not seed 0's 0.1% higher.
        passkey: correct answers of 40 per length and seed, for ``passkey_model``.
    """
    import math

    from rotary.tools.experiments.rows import Measurements, PasskeyRow, PerplexityRow

    out = Measurements()
    for (model, scaling, mode), values in table.items():
        for seed in (0, 1):
            ppls = (second_seed or {}).get((model, scaling, mode), [v * 1.001 for v in values]) if seed else values
            for e, p in zip(lengths, ppls):
                loss = math.log(p) if p > 0 and math.isfinite(p) else p
                out.perplexity.append(
                    PerplexityRow(
                        model,
                        seed,
                        scaling,
                        1.0,
                        mode,
                        e,
                        e if mode == "windows" else 64,
                        loss,
                        p,
                        loss / math.log(2),
                        1000,
                    )
                )
    for seed in (0, 1):
        for e in lengths:
            out.passkey.append(PasskeyRow(*passkey_model[:1], seed, passkey_model[1], 4.0, e, 0.5, passkey, 40))
    return out


def small_lm(**over):
    """A small ``Decoder`` (vocab_size 50, hidden_size 32, 2 layers, 4 heads) in eval mode; ``over``: DecoderConfig
    fields."""
    return Decoder(DecoderConfig(**dict(dict(vocab_size=50, hidden_size=32, num_layers=2, num_heads=4), **over))).eval()


def run_threads(work, n_threads=4):
    """``work(i)`` in ``n_threads`` threads at once; any exception in one of them fails the test."""
    errors: list[BaseException] = []

    def target(i):
        try:
            work(i)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=target, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def outputs_from_threads(call, count, reps=3, alternate=False):
    """``call(i)`` for every ``i < count``, ``reps`` times in each of 4 threads (``alternate``: every
    other pass in reverse order); the outputs as ``{(thread, rep, i): output}``, all of them present."""
    got = {}

    def work(t):
        for rep in range(reps):
            order = range(count)
            for i in reversed(order) if alternate and not (t + rep) % 2 else order:
                got[(t, rep, i)] = call(i)

    run_threads(work)
    assert len(got) == 4 * reps * count
    return got


#: the errors a property test accepts from arbitrary input: a ``ValueError`` or ``TypeError`` raised by rotary
#: with a message naming what is wrong (never a wrong tensor, never a bare internal exception)
NAMED = (ValueError, TypeError)


def assert_named(exc: BaseException, *names: str) -> None:
    """The message of ``exc`` names one of ``names`` (the argument that was wrong)."""
    message = str(exc)
    assert any(name in message for name in names), f"the error names none of {names}: {message}"


ROTARY_SOURCE = os.path.dirname(rotary.__file__)


BAD_TYPES = (ZeroDivisionError, KeyError, AttributeError, OverflowError, IndexError, RuntimeError, AssertionError)


def _mentions(message: str, key, value) -> bool:
    """The message names the offending key or value (in any of the ways a message prints one)."""
    texts = {repr(value), str(value)}
    if isinstance(value, float) and math.isfinite(value):
        texts |= {f"{value:g}", repr(float(value))}
    if isinstance(value, (list, tuple)):
        texts |= {repr(v) for v in value} | {str(v) for v in value}
    return any(t and t in message for t in texts) or (key is not None and str(key) in message)


def assert_named_error(exc: BaseException, *suspects: tuple) -> None:
    """``exc`` is a named error raised by rotary, naming one of the ``(key, value)`` suspects (if any given)."""
    assert not isinstance(exc, BAD_TYPES), f"bare {type(exc).__name__}: {exc}"
    assert isinstance(exc, (ConfigError, ValueError, TypeError)), f"unexpected {type(exc).__name__}: {exc}"
    assert "math domain error" not in str(exc)
    origin = traceback.extract_tb(exc.__traceback__)[-1].filename
    assert origin.startswith(ROTARY_SOURCE), f"{type(exc).__name__} raised outside rotary ({origin}): {exc}"
    if suspects:
        assert any(_mentions(str(exc), key, value) for key, value in suspects), (
            f"the message names none of {suspects}: {exc}"
        )


def assert_sound(f: rotary.Frequencies) -> None:
    inv_freq = f.inv_freq
    assert inv_freq.dtype == torch.float32 and bool(torch.isfinite(inv_freq).all()), inv_freq
    turning = proportional_pairs(f.head_dim, f.scaling) if ROPE_TYPES[f.rope_type].rotates_every_pair else len(inv_freq)
    assert bool((inv_freq[:turning] > 0).all()), inv_freq
    assert math.isfinite(f.attention_scaling) and f.attention_scaling > 0


def numpy_cos_sin(
    ids: torch.Tensor, inv_freq: torch.Tensor, *, attention_scaling: float = 1.0, interleaved: bool = False
):
    """The tables' oracle in NumPy float64: ``cos`` and ``sin`` of ``ids x inv_freq`` times ``attention_scaling``,
    each pair's value on both of its channels (``(i, i + r/2)`` or ``(2i, 2i + 1)``), and per entry the bound a
    result in fp32 may differ by: the fp32 rounding plus the float64 rounding of the angle (its ulp grows with
    the position: 2**40 rad carries 2**-12)."""
    import numpy as np

    angle = ids.to(torch.float64).numpy()[..., None] * inv_freq.detach().to(torch.float64).numpy()
    cos, sin = np.cos(angle) * attention_scaling, np.sin(angle) * attention_scaling
    bound = (4 * np.abs(angle) * 2.0**-52 + 2.0**-23) * max(1.0, abs(attention_scaling))

    def channels(a):
        return np.repeat(a, 2, axis=-1) if interleaved else np.concatenate([a, a], axis=-1)

    return tuple(torch.from_numpy(channels(a)) for a in (cos, sin, bound))


def assert_tables_match(got: tuple[torch.Tensor, torch.Tensor], want: tuple) -> None:
    """``got`` (cos, sin) against :func:`numpy_cos_sin`'s ``(cos, sin, bound)``, entry by entry."""
    cos, sin, bound = want
    for table, oracle in zip(got, (cos, sin)):
        assert table.shape == oracle.shape, (table.shape, oracle.shape)
        excess = (table.double() - oracle).abs() - bound
        assert float(excess.max()) <= 0 if excess.numel() else True, float(excess.max())


def build_tiny(cls, config, *, seed: int = 0):
    """``cls(config)`` in eval mode, weights drawn from ``seed``, none left as uninitialised memory.

    Some transformers models leave parameters as ``torch.empty`` allocated them (Qwen3-Omni's talker's MoE
    experts): their values, and whether they are finite, then depend on what the process freed before. The model
    is built with uninitialised memory filled with NaN, and each parameter still holding NaN is drawn from
    N(0, initializer_range) with its own seeded generator, so a model is the same in every process and order.
    """
    import torch

    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)  # with fill_uninitialized_memory: torch.empty gives NaN
    try:
        torch.manual_seed(seed)
        model = cls(config).eval()
    finally:
        torch.use_deterministic_algorithms(was)
    std = getattr(config, "initializer_range", 0.02) or 0.02
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.is_floating_point() and p.isnan().any():
                p.copy_(torch.randn(p.shape, generator=generator, dtype=p.dtype) * std)
    return model


# ------------------------------------------------------------------------------------------------
# transformers as the oracle of a scaling block


class _RopeConfig:
    """What transformers' init functions read of a config (``rope_parameters``, the head width, the context
    length), holding the block as written: a config class refuses a float length, which rotary computes with,
    as transformers' functions do, when strict=False (and importing one costs seconds). ``standardize_rope_params``
    has nothing to do: the block names its type and base, and a type with a trained length carries it."""

    def __init__(self, params: dict, max_position_embeddings, head_dim: int) -> None:
        self.rope_parameters, self.max_position_embeddings = params, max_position_embeddings
        self.head_dim, self.hidden_size, self.num_attention_heads = head_dim, 2 * head_dim, 2

    def standardize_rope_params(self) -> None:
        pass


def hf_frequencies(block: dict, base: float, rotary_dim: int, seq_len: int | None = None, head_dim: int = 64):
    """The oracle of an accepted block: transformers' init function for its type, given a config holding the
    block as written (:class:`_RopeConfig`), an explicit null read as "not given" (docs/scaling.md); for ``default``
    the formula of each model's class, for ``ntk`` (no transformers type) the documented base
    ``base * factor ** (d / (d - 2))`` in that formula; LongRoPE's ``short_mscale`` / ``long_mscale`` as the
    attention factor of their set (docs/scaling.md, longrope). Arithmetic errors propagate."""
    legacy = block.get("type")
    rope_type = block.get("rope_type", legacy if legacy is not None else "default")
    keep_null = {"factor"} if rope_type in ("yarn", "longrope") else set()  # the ratio of the two lengths
    params = {k: v for k, v in block.items() if k != "type" and (v is not None or k in keep_null)}
    params.update(rope_type=rope_type, rope_theta=base)
    if rope_type in ("default", "ntk"):
        if rope_type == "ntk":
            base = base * params["factor"] ** (rotary_dim / (rotary_dim - 2))
        exponent = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
        return 1.0 / (base**exponent), 1.0
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS as HF_ROPE_INIT_FUNCTIONS

    cfg = _RopeConfig(params, block.get("max_position_embeddings"), head_dim)
    inv_freq, scaling = HF_ROPE_INIT_FUNCTIONS[rope_type](cfg, "cpu", seq_len=seq_len)
    if rope_type == "longrope":  # Phi-3.5-MoE's own attention factor of each set, which Phi-3's function ignores
        long = seq_len is not None and seq_len > params["original_max_position_embeddings"]
        mscale = params.get("long_mscale" if long else "short_mscale")
        scaling = scaling if mscale is None else mscale
    return inv_freq, scaling


def computes(block: dict, base: float, rotary_dim: int, seq_len: int | None, head_dim: int = 64):
    """transformers' ``(inv_freq, attention_scaling)`` at ``seq_len`` if they are what rotary accepts
    (docs/scaling.md: every frequency finite, every pair that should turn turning, the attention scaling a
    number > 0 that float32 tables hold, for dynamic and longrope also at the length the block targets when no
    length is given), else ``None``."""
    rope_type = block.get("rope_type", block.get("type") if block.get("type") is not None else "default")
    lengths = [seq_len]
    if seq_len is None and rope_type == "dynamic":  # factor x max_position_embeddings tokens
        lengths.append(
            max(math.ceil(block["factor"] * block["max_position_embeddings"]), block["max_position_embeddings"])
        )
    if seq_len is None and rope_type == "longrope":  # past the trained length: the long factors
        lengths.append(block["original_max_position_embeddings"] + 1)
    fraction = block.get("partial_rotary_factor")
    turning = int((1.0 if fraction is None else fraction) * head_dim // 2) if rope_type == "proportional" else None
    results = []
    for length in lengths:
        try:
            inv_freq, scaling = hf_frequencies(block, base, rotary_dim, length, head_dim)
        except (ArithmeticError, ValueError):  # ZeroDivisionError, OverflowError, math domain error
            return None
        inv_freq = inv_freq.float()
        rotating = inv_freq[:turning]
        finite = bool(torch.isfinite(inv_freq).all()) and bool((rotating > 0).all())
        if not (finite and isinstance(scaling, (int, float)) and 0 < scaling <= torch.finfo(torch.float32).max):
            return None
        results.append((inv_freq, scaling))
    return results[0]


# figures drawn once per test process -------------------------------------------------------------------------
def _tensor_key(dtype: str, shape: tuple, data: bytes) -> None:
    """Stands for a tensor in a figure's key (never called: the key is only compared)."""


class _KeyPickler(pickle.Pickler):
    """Pickles a plot function's arguments into a key: tensors as their dtype, shape and bytes."""

    def reducer_override(self, obj):
        if isinstance(obj, torch.Tensor):
            t = obj.detach().cpu().contiguous().reshape(-1)
            return _tensor_key, (str(obj.dtype), tuple(obj.shape), t.view(torch.uint8).numpy().tobytes())
        return NotImplemented


class DrawnOnce:
    """Wraps each ``rotary.tools.plots.plot_*``: a call with the arguments of an earlier one returns that call's
    figure, whose ``savefig`` writes the bytes it rendered the first time (through the same ``open`` of the path,
    so an unwritable place fails the same way). Arguments it cannot key draw a new figure.

    The same data draws the same figure (the plot functions are deterministic): the first call draws and renders
    it, and the test that made that call checks it as it checks any figure; a later call, in the same test or
    another one in this process (:data:`FIGURES`), gets the same bytes written through rotary's own ``save``."""

    def __init__(self) -> None:
        self.figures: dict[bytes, object] = {}
        self.calls = 0  # figures asked for
        self.drawn = 0  # figures drawn (the others were replayed)

    def wrap(self, name: str, plot):
        def cached(*args, **kwargs):
            self.calls += 1
            buffer = io.BytesIO()
            try:
                _KeyPickler(buffer).dump((name, args, sorted(kwargs.items())))
            except Exception:  # noqa: BLE001  an argument pickle cannot take: no key, draw it
                self.drawn += 1
                return plot(*args, **kwargs)
            key = buffer.getvalue()
            if key not in self.figures:
                self.drawn += 1
                self.figures[key] = self._remembering(plot(*args, **kwargs))
            return self.figures[key]

        return cached

    @staticmethod
    def _remembering(fig):
        real, rendered = fig.savefig, {}

        def savefig(fname, **kwargs):
            how = (Path(fname).suffix, repr(sorted(kwargs.items())))
            if how in rendered:
                with open(fname, "wb") as fh:  # what savefig does with a path
                    fh.write(rendered[how])
            else:
                real(fname, **kwargs)
                rendered[how] = Path(fname).read_bytes()

        fig.savefig = savefig
        return fig

    def patches(self) -> list:
        from unittest import mock

        from rotary.tools import plots

        return [
            mock.patch.object(plots, n, self.wrap(n, getattr(plots, n))) for n in plots.__all__ if n.startswith("plot_")
        ]

    @contextlib.contextmanager
    def active(self):
        """The plot functions wrapped while the block runs."""
        with contextlib.ExitStack() as stack:
            for patch in self.patches():
                stack.enter_context(patch)
            yield self


#: the figures of this test process: the command-line, docs and figure tests ask for the same ones (``rotary
#: plot scaling``'s eight by tests/test_docs.py, tests/test_cli.py and tests/test_cli_properties.py)
FIGURES = DrawnOnce()
