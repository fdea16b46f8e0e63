"""Helpers shared by the test files (importable as ``helpers``: pytest's ``pythonpath`` holds ``tests/``).

- :func:`run_cli`: the real command line, ``python -m rotary ...`` in a subprocess, with this
  checkout's ``src`` first on the path;
- :func:`hf_config`, :func:`text_config`, :func:`llama_config`: transformers configs built from
  dicts or a few numbers (models are built from configs with random weights, never downloaded);
- :func:`leaf_parsers`: every runnable subcommand of ``rotary`` with its argparse parser;
- :func:`make_qk` and :func:`tables_for`: q and k in either layout (optionally views into one fused
  qkv projection), and the tables of a ``RoPE`` for given positions;
- :func:`forbid_torch_path`: make the pure-torch rotation fail the test, so a test that compares the
  fused kernel with the torch path cannot pass by silently falling back to it;
- :func:`experiment_rows`: hand-made rows of ``rotary experiment`` (perplexities per method, seed and
  mode), for the claims and the report.
"""

from __future__ import annotations

import argparse
import copy
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

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
        [sys.executable, "-m", "rotary", *argv], cwd=cwd, env=env or cli_env(), capture_output=True, text=True,
        timeout=timeout,
    )
    if ok is True:
        assert proc.returncode == 0, proc.stderr
        assert "Traceback" not in proc.stderr
    elif ok is False:
        assert proc.returncode == 2, (proc.returncode, proc.stderr)
        assert "Traceback" not in proc.stderr, proc.stderr
    return proc


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
        hidden_size=head_dim * 4, num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim,
        max_position_embeddings=max_pos, rope_parameters={"rope_type": "default", "rope_theta": theta},
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


def tables_for(rope, positions: torch.Tensor | int, dtype: torch.dtype = torch.float32):
    """``rope.tables`` for explicit positions, or for ``arange(positions)`` given an int."""
    if isinstance(positions, int):
        positions = torch.arange(positions)
    return rope.tables(positions, dtype=dtype)


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

    ``rotary.deferred.host_checks`` is the one place that decides whether a device's checks read
    values on the host (the CPU) or are deferred to device flags (every other device); inside this
    context it answers "deferred" for the CPU too, and a dispatch mode raises :class:`HostReadError`
    on any op that reads values (``.item()``, ``int(t)``, ``bool(t)``, ``nonzero``, ``equal``, ...).
    ``Tensor.tolist`` and ``Tensor.numpy`` (which read memory without an aten op) raise too. The
    CPU kernel still computes the results, so they can be compared with the usual path.
    """

    def __enter__(self):
        import rotary.deferred as deferred

        self._saved = (deferred.host_checks, torch.Tensor.tolist, torch.Tensor.numpy)
        deferred.host_checks = lambda device: False

        def refuse(*args, **kwargs):
            raise HostReadError("tolist()/numpy() read tensor values on the host")

        torch.Tensor.tolist = refuse  # type: ignore[method-assign]
        torch.Tensor.numpy = refuse  # type: ignore[method-assign]
        self._mode = _NoHostReads()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        import rotary.deferred as deferred

        self._mode.__exit__(*exc)
        deferred.host_checks, torch.Tensor.tolist, torch.Tensor.numpy = self._saved
        return False


def experiment_rows(table: dict, lengths: list[int], *, second_seed: dict | None = None, passkey: int = 36,
                    passkey_model: tuple[str, str] = ("rope-ft-linear", "linear")):
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
                out.perplexity.append(PerplexityRow(model, seed, scaling, 1.0, mode, e, e if mode == "windows" else 64, loss, p,
                                                    loss / math.log(2), 1000))
    for seed in (0, 1):
        for e in lengths:
            out.passkey.append(PasskeyRow(*passkey_model[:1], seed, passkey_model[1], 4.0, e, 0.5, passkey, 40))
    return out
