"""The fused-op suites of ``rotary bench``: :func:`rotary.rotate_and_cache` and :func:`rotary.rmsnorm_rotate`
against their unfused compositions, eager and compiled, and the traffic limit.

One group per shape (``BxS``: q 32 heads, k and v 8 heads of 128 channels; decoding after 1000 cached tokens)
and dtype. Rows: the fused op (checked against the composition first); the composition in plain torch, eager
and compiled; peers where importable (FlashInfer); and ``limit: traffic``, the bytes the fused op must move
over the copy bandwidth measured in the same run. How to read the tables: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .harness import DTYPE_NAMES, Result, installed, register_suite, suite_device, suite_repeats, time_interleaved
from .table import FUSED_RATIO

__all__ = [
    "FusedShape",
    "TRAFFIC_LIMIT",
    "copy_bandwidth",
    "rmsnorm_rotate_bytes",
    "rmsnorm_rotate_composition",
    "rmsnorm_rotate_suite",
    "rotate_and_cache_bytes",
    "rotate_and_cache_composition",
    "rotate_and_cache_suite",
    "suite_shapes",
]

#: the row every timed row of a fused-op group is divided by
TRAFFIC_LIMIT = "limit: traffic (bytes / copy bandwidth)"
#: ``BxS`` per device kind, and for ``--quick``
SHAPES = {"cuda": ("64x1", "1x4096", "8x2048"), "cpu": ("64x1", "1x512", "4x256"), "quick": ("4x1", "1x64")}
#: decoding rows: the tokens sit after this many cached ones
DECODE_START = 1000
FLASHINFER = "flashinfer"


@dataclass(frozen=True)
class FusedShape:
    """``batch`` sequences of ``seq`` tokens; q ``q_heads``, k and v ``kv_heads`` heads of ``head_dim``.

    >>> FusedShape.parse("64x1").describe()
    '64x1 (q 32 heads, k 8 heads, D 128)'
    """

    batch: int
    seq: int
    q_heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128

    @classmethod
    def parse(cls, text: str, *, q_heads: int = 32, kv_heads: int = 8, head_dim: int = 128) -> FusedShape:
        from ...errors import InputError

        try:
            batch, seq = (int(v) for v in text.lower().split("x"))
        except ValueError:
            batch = seq = 0
        if batch < 1 or seq < 1:
            raise InputError(f"shape {text!r}: give BxS with two positive integers, e.g. 64x1 or 1x4096")
        return cls(batch, seq, q_heads, kv_heads, head_dim)

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    def describe(self) -> str:
        return f"{self.batch}x{self.seq} (q {self.q_heads} heads, k {self.kv_heads} heads, D {self.head_dim})"

    def positions(self, device: torch.device) -> torch.Tensor:
        """int64 ``[B, S]``: ``0 .. S - 1``, or, decoding (S = 1), ``DECODE_START + b`` for sequence ``b``."""
        ids = torch.arange(self.seq, device=device).expand(self.batch, self.seq)
        if self.seq == 1:
            ids = ids + DECODE_START + torch.arange(self.batch, device=device)[:, None]
        return ids.contiguous()


def suite_shapes(options: argparse.Namespace, kind: str) -> list[FusedShape]:
    """The shapes of a fused-op suite: ``--quick``'s, or the device kind's."""
    return [FusedShape.parse(s) for s in SHAPES["quick" if getattr(options, "quick", False) else kind]]


# the compositions --------------------------------------------------------------------------------


def _rotate_half(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Hugging Face's rotation in fp32, rounded once to ``x``'s dtype (pairs (i, i + D/2))."""
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)
    return (xf * cos + torch.cat((-x2, x1), dim=-1) * sin).to(x.dtype)


def rotate_and_cache_composition(q, k, v, k_cache, v_cache, slots, positions, cos_sin_cache):
    """RoPE at ``positions`` and the KV-cache write in plain torch; returns the rotated q and k.

    q, k, v ``[B, S, H, D]``, caches ``[B, T, Hk, D]``, ``slots``/``positions`` int64 ``[B, S]``, fp32
    ``cos_sin_cache`` ``[P, D]`` (cos of the D/2 pairs, then their sin).

    >>> q, k, v = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 2, 8), torch.randn(1, 2, 2, 8)
    >>> kc, vc, ids = torch.zeros(1, 5, 2, 8), torch.zeros(1, 5, 2, 8), torch.tensor([[3, 4]])
    >>> cache = torch.cat((torch.ones(8, 4), torch.zeros(8, 4)), dim=-1)  # every angle 0
    >>> q_rot, k_rot = rotate_and_cache_composition(q, k, v, kc, vc, ids, ids, cache)
    >>> torch.equal(q_rot, q), torch.equal(kc[:, 3:5], k), torch.equal(vc[:, 3:5], v)
    (True, True, True)
    """
    cos, sin = cos_sin_cache[positions].chunk(2, dim=-1)  # [B, S, D/2] each
    cos, sin = torch.cat((cos, cos), dim=-1)[:, :, None], torch.cat((sin, sin), dim=-1)[:, :, None]
    q_rot, k_rot = _rotate_half(q, cos, sin), _rotate_half(k, cos, sin)
    rows = torch.arange(q.shape[0], device=q.device)[:, None].expand_as(slots)
    k_cache.index_put_((rows, slots), k_rot)
    v_cache.index_put_((rows, slots), v)
    return q_rot, k_rot


def rmsnorm_rotate_composition(q, k, wq, wk, cos, sin, eps: float):
    """QK-norm (Qwen3's ``RMSNorm``) then RoPE in plain torch: q, k ``[B, S, H, D]``, fp32 cos/sin ``[B, S, D]``."""

    def norm(x, w):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        return w * xf.to(x.dtype)

    c, s = cos[:, :, None], sin[:, :, None]
    return _rotate_half(norm(q, wq), c, s), _rotate_half(norm(k, wk), c, s)


def rotate_and_cache_bytes(shape: FusedShape, dtype: torch.dtype) -> int:
    """Bytes moved: q, k, v read; q, k and the k, v cache rows written; fp32 cos and sin per token.

    >>> rotate_and_cache_bytes(FusedShape(1, 1, 2, 1, 4), torch.bfloat16)  # 2 * 4 * (4 + 2 + 1 + 2) + 16
    88
    """
    element = torch.finfo(dtype).bits // 8
    hq, hk, d = shape.q_heads, shape.kv_heads, shape.head_dim
    return shape.tokens * (element * d * (2 * hq + 2 * hk + hk + 2 * hk) + d * 4)


def rmsnorm_rotate_bytes(shape: FusedShape, dtype: torch.dtype) -> int:
    """Bytes moved: q and k read and written, fp32 cos and sin per token, one fp32 rstd per head.

    >>> rmsnorm_rotate_bytes(FusedShape(1, 1, 2, 1, 4), torch.bfloat16)  # 2*3*4*2 + 2*4*4 + 3*4
    92
    """
    element = torch.finfo(dtype).bits // 8
    heads = shape.q_heads + shape.kv_heads
    return shape.tokens * (2 * heads * shape.head_dim * element + 2 * shape.head_dim * 4 + heads * 4)


# timing ------------------------------------------------------------------------------------------

_bandwidths: dict[tuple[str, bool, bool], float] = {}


def copy_bandwidth(options: argparse.Namespace, device: torch.device) -> float:
    """Bytes per second (read and written) of a 256 MiB ``copy_`` (64 MiB ``--quick``), once per device and run."""
    quick = bool(getattr(options, "quick", False))
    key = (str(device), quick, getattr(options, "backend", None) is None)
    if key not in _bandwidths:
        src = torch.ones((32 if quick else 128) << 20, dtype=torch.int16, device=device)
        dst = torch.empty_like(src)
        seconds = _time(options, {"copy": lambda: dst.copy_(src)})["copy"][0]
        _bandwidths[key] = 2 * src.numel() * src.element_size() / seconds
    return _bandwidths[key]


def _time(options: argparse.Namespace, calls: dict[str, Callable[[], object]]) -> dict:
    """name -> (seconds per call, host seconds or None, how timed, note), with the suite's timer."""
    repeats = suite_repeats(options)
    backend = getattr(options, "backend", None)
    if backend is None:
        return {name: (s, None, "", "") for name, s in time_interleaved(calls, repeats).items()}
    from . import cuda

    timings = cuda.time_on_device(calls, repeats, backend)  # type: ignore[arg-type]
    return {name: (t.gpu_s, t.host_s, t.gpu_timing, t.note) for name, t in timings.items()}


def _add_compiled(calls: dict, options: argparse.Namespace, composition: Callable[..., object], args: tuple) -> None:
    """The composition compiled by Inductor as a row (unless ``--no-compile``, or ``--quick`` without ``--compile``)."""
    if _compiled_rows(options):
        torch._dynamo.reset()
        compiled = torch.compile(composition, dynamic=False)
        calls["torch composition, torch.compile (Inductor)"] = lambda: compiled(*args)


def _compiled_rows(options: argparse.Namespace) -> bool:
    if getattr(options, "no_compile", False):
        return False
    return not getattr(options, "quick", False) or bool(getattr(options, "compile", False))


def _dtypes(options: argparse.Namespace) -> list[str]:
    """``--dtypes``, else bf16."""
    return options.dtypes.split(",") if getattr(options, "dtypes", None) else ["bf16"]


def _group_results(
    group: str,
    calls: dict[str, Callable[[], object]],
    notes: dict[str, str],
    limit_s: float,
    limit_note: str,
    options: argparse.Namespace,
) -> list[Result]:
    """One row per call and the traffic-limit row, with "x traffic limit" ratios."""
    timed = _time(options, calls)
    repeats = suite_repeats(options)
    results = []
    for name, (seconds, host_s, how, note) in timed.items():
        r = Result(group, name, False, seconds, repeats, note="; ".join(filter(None, [notes.get(name, ""), note])))
        r.host_s, r.gpu_timing, r.kind = host_s, how, "fused"
        if math.isfinite(seconds) and limit_s > 0:
            r.ratios[FUSED_RATIO] = seconds / limit_s
        results.append(r)
    limit = Result(group, TRAFFIC_LIMIT, False, limit_s, repeats, note=limit_note, ratios={FUSED_RATIO: 1.0})
    limit.kind, limit.gpu_timing = "fused", ("" if getattr(options, "backend", None) is None else "computed")
    results.append(limit)
    return results


def _agreement(fused: tuple[torch.Tensor, ...], reference: tuple[torch.Tensor, ...]) -> str:
    if all(torch.equal(a, b) for a, b in zip(fused, reference)):
        return ""
    diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(fused, reference))
    return f"differs from the eager composition by up to {diff:.3g} (rounding of intermediate values)"


# the suites --------------------------------------------------------------------------------------


def _every_group(options: argparse.Namespace, group: Callable[..., list[Result]]) -> list[Result]:
    device, kind = suite_device(options)
    bandwidth = copy_bandwidth(options, device)
    return [
        row
        for shape in suite_shapes(options, kind)
        for dtype_name in _dtypes(options)
        for row in group(options, shape, dtype_name, device, bandwidth)
    ]


def rotate_and_cache_suite(options: argparse.Namespace) -> list[Result]:
    """:func:`rotary.rotate_and_cache` against the composition, eager and compiled, FlashInfer's RoPE plus a
    cache write (CUDA, when importable), and the traffic limit.
    """
    return _every_group(options, _rotate_and_cache_group)


def _rotate_and_cache_group(
    options: argparse.Namespace, shape: FusedShape, dtype_name: str, device: torch.device, bandwidth: float
) -> list[Result]:
    import rotary

    dtype = DTYPE_NAMES[dtype_name]
    g = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(shape.batch, shape.seq, h, shape.head_dim, generator=g).to(device, dtype)
        for h in (shape.q_heads, shape.kv_heads, shape.kv_heads)
    )
    positions = shape.positions(device)
    capacity = DECODE_START + shape.batch + shape.seq
    k_cache = torch.zeros(shape.batch, capacity, shape.kv_heads, shape.head_dim, dtype=dtype, device=device)
    v_cache = torch.zeros_like(k_cache)
    rope = rotary.RoPE(shape.head_dim, base=1e6, max_position=capacity)
    angles = torch.outer(torch.arange(capacity, dtype=torch.float64), rope.inv_freq.double())
    cos_sin_cache = torch.cat((angles.cos(), angles.sin()), dim=-1).float().to(device)  # vLLM's [P, D]
    args = (q, k, v, k_cache, v_cache, positions, positions, cos_sin_cache)

    def fused() -> tuple[torch.Tensor, torch.Tensor]:
        return rotary.rotate_and_cache(
            q, k, v, k_cache, v_cache, positions, positions=positions, cos_sin_cache=cos_sin_cache
        )

    calls: dict[str, Callable[[], object]] = {
        "rotary.rotate_and_cache": fused,
        "torch composition (eager)": lambda: rotate_and_cache_composition(*args),
    }
    _add_compiled(calls, options, rotate_and_cache_composition, args)
    notes = {"rotary.rotate_and_cache": _agreement(fused(), rotate_and_cache_composition(*args))}
    if device.type == "cuda" and installed(FLASHINFER + ".rope"):
        name = "FlashInfer RoPE in place + torch cache write"
        calls[name] = _flashinfer_rotate_and_cache(*args)
        notes[name] = "flashinfer.rope.apply_rope_with_cos_sin_cache_inplace, then index_put_ of k and v"
    limit = rotate_and_cache_bytes(shape, dtype) / bandwidth
    group = f"rotate_and_cache {shape.describe()} {dtype_name}"
    return _group_results(group, calls, notes, limit, _limit_note(bandwidth), options)


def _flashinfer_rotate_and_cache(q, k, v, k_cache, v_cache, slots, positions, cos_sin_cache) -> Callable[[], object]:
    from flashinfer.rope import apply_rope_with_cos_sin_cache_inplace

    q2, k2 = q.clone().flatten(2), k.clone().flatten(2)  # [B, S, H * D]: rotated in place, call after call
    q2, k2 = q2.view(-1, q2.shape[-1]), k2.view(-1, k2.shape[-1])
    flat = positions.reshape(-1)
    rows = torch.arange(q.shape[0], device=q.device)[:, None].expand_as(slots)

    def call():
        apply_rope_with_cos_sin_cache_inplace(flat, q2, k2, q.shape[-1], cos_sin_cache, True)
        k_cache.index_put_((rows, slots), k2.view_as(k))
        v_cache.index_put_((rows, slots), v)

    return call


def rmsnorm_rotate_suite(options: argparse.Namespace) -> list[Result]:
    """:func:`rotary.rmsnorm_rotate` against rotary's own two steps, the plain-torch composition eager and
    compiled, and the traffic limit.
    """
    return _every_group(options, _rmsnorm_rotate_group)


def _rmsnorm_rotate_group(
    options: argparse.Namespace, shape: FusedShape, dtype_name: str, device: torch.device, bandwidth: float
) -> list[Result]:
    import rotary
    from rotary.qk_norm import rms_norm

    eps = 1e-6
    dtype = DTYPE_NAMES[dtype_name]
    g = torch.Generator().manual_seed(0)
    q = torch.randn(shape.batch, shape.seq, shape.q_heads, shape.head_dim, generator=g).to(device, dtype)
    k = torch.randn(shape.batch, shape.seq, shape.kv_heads, shape.head_dim, generator=g).to(device, dtype)
    wq, wk = ((1 + 0.1 * torch.randn(shape.head_dim, generator=g)).to(device, dtype) for _ in range(2))
    rows = DECODE_START + shape.batch + shape.seq
    rope = rotary.RoPE(shape.head_dim, base=1e6, max_position=rows)
    if device.type != "cpu":
        rope = rope.to(device).prepare(rows, device=device)
    tables = rope.tables(shape.positions(device))
    cos, sin = tables.gather()  # per token [B, S, D]
    args = (q, k, wq, wk, cos, sin, eps)

    def fused() -> tuple[torch.Tensor, torch.Tensor]:
        return rotary.rmsnorm_rotate(q, k, wq, wk, tables, eps=eps, layout="bshd")

    def two_steps() -> tuple[torch.Tensor, torch.Tensor]:
        normed = [rms_norm(q, wq, eps=eps), rms_norm(k, wk, eps=eps)]
        return rotary.rotate(normed, tables, layout="bshd", kinds=("q", "k"))  # type: ignore[return-value]

    calls: dict[str, Callable[[], object]] = {
        "rotary.rmsnorm_rotate": fused,
        "rotary rms_norm + rotate (two steps)": two_steps,
        "torch composition (eager)": lambda: rmsnorm_rotate_composition(*args),
    }
    _add_compiled(calls, options, rmsnorm_rotate_composition, args)
    notes = {"rotary.rmsnorm_rotate": _agreement(fused(), two_steps())}
    limit = rmsnorm_rotate_bytes(shape, dtype) / bandwidth
    group = f"rmsnorm_rotate {shape.describe()} {dtype_name}"
    return _group_results(group, calls, notes, limit, _limit_note(bandwidth), options)


def _limit_note(bandwidth: float) -> str:
    return f"copy bandwidth {bandwidth / 1e9:.1f} GB/s"


register_suite("rotate_and_cache", rotate_and_cache_suite, devices=("cpu", "cuda"))
register_suite("rmsnorm_rotate", rmsnorm_rotate_suite, devices=("cpu", "cuda"))
