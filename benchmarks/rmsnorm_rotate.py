"""rotary.rmsnorm_rotate against the unfused composition (QK-norm then RoPE), per call, and the traffic limit.

Rows, on the same q, k, weights and tables (built before timing, as a model builds them once per forward):

- ``fused``: :func:`rotary.rmsnorm_rotate` (the CPU kernel, or one Triton launch on CUDA);
- ``eager composition``: :func:`rotary.qk_norm.rms_norm` on q and on k (Hugging Face's ``Qwen3RMSNorm``
  operations), then :func:`rotary.rotate` (one rotation call for both);
- ``torch composition``: the same in plain torch operations, the rotation as Hugging Face writes it
  (``rotate_half``) in fp32 with per-token tables ``[B, S, D]``;
- ``compiled composition``: that function compiled by Inductor (``torch.compile``, compilation excluded);
- ``traffic limit``: bytes read and written by the fused op (q and k once each way, the table rows it
  reads, the rstd it writes) over a measured copy bandwidth (``dst.copy_(src)`` of 256 MiB): no kernel
  that reads and writes them can take less.

On CUDA each call is timed by replaying a CUDA graph of 20 calls (no launch overhead, no Python), the
median of ``--repeats`` replays, in µs per call; on the CPU, the median of interleaved samples
(:func:`rotary.tools.bench.time_interleaved`). Shapes ``BxS`` with q 32 heads and k 8 heads of 128 channels
(``--heads``, ``--head-dim``), bf16 by default, decoding rows at per-sequence positions.

    PYTHONPATH=src python benchmarks/rmsnorm_rotate.py --device cuda           # 64x1, 1x4096, 8x2048
    PYTHONPATH=src python benchmarks/rmsnorm_rotate.py --device cpu            # 64x1, 1x512, 4x256
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import torch

import rotary
from rotary.qk_norm import rms_norm
from rotary.tools.bench import time_interleaved

SHAPES = {"cuda": ["64x1", "1x4096", "8x2048"], "cpu": ["64x1", "1x512", "4x256"]}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def torch_composition(q, k, wq, wk, cos, sin, eps: float):
    """QK-norm then RoPE in plain torch operations: ``q``, ``k`` ``[B, S, H, D]``, fp32 ``cos``/``sin`` ``[B, S, D]``."""

    def norm(x, w):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        return w * xf.to(x.dtype)

    c, s = cos[:, :, None], sin[:, :, None]

    def rotate(x):
        xf = x.float()
        x1, x2 = xf.chunk(2, dim=-1)
        return (xf * c + torch.cat((-x2, x1), dim=-1) * s).to(x.dtype)

    return rotate(norm(q, wq)), rotate(norm(k, wk))


def copy_bandwidth(device: torch.device, repeats: int) -> float:
    """Bytes per second of ``dst.copy_(src)`` for 256 MiB (read and written: 512 MiB moved)."""
    src = torch.ones(128 << 20, dtype=torch.int16, device=device)
    dst = torch.empty_like(src)
    seconds = time_call(lambda: dst.copy_(src), device, repeats, inner=5)
    return 2 * src.numel() * src.element_size() / seconds


def time_call(call: Callable[[], object], device: torch.device, repeats: int, inner: int = 20) -> float:
    """Median seconds per call: CUDA-graph replays of ``inner`` calls on CUDA, interleaved samples on the CPU."""
    if device.type != "cuda":
        return time_interleaved({"call": call}, repeats)["call"]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # warm-up: Triton and Inductor compile, tables and flags are made outside the capture
            call()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(inner):
                call()
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / inner)
    return statistics.median(times)


def fused_bytes(batch: int, seq: int, hq: int, hk: int, head_dim: int, rotary_dim: int, dtype: torch.dtype) -> int:
    """What the fused op must move: q and k read and written, cos and sin rows of every token, fp32 rstds."""
    tokens = batch * seq
    element = torch.finfo(dtype).bits // 8
    return 2 * tokens * (hq + hk) * head_dim * element + 2 * tokens * rotary_dim * 4 + tokens * (hq + hk) * 4


def run_shape(args: argparse.Namespace, text: str, device: torch.device, bandwidth: float) -> list[tuple[str, float]]:
    batch, seq = (int(v) for v in text.lower().split("x"))
    dtype, hq, hk, head_dim = DTYPES[args.dtype], args.heads, args.kv_heads, args.head_dim
    g = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(batch, seq, hq, head_dim, generator=g, device=device).to(dtype)
    k = torch.randn(batch, seq, hk, head_dim, generator=g, device=device).to(dtype)
    wq = (1 + 0.1 * torch.randn(head_dim, generator=g, device=device)).to(dtype)
    wk = (1 + 0.1 * torch.randn(head_dim, generator=g, device=device)).to(dtype)
    rope = rotary.RoPE(head_dim, base=1e6, max_position=8192).to(device).prepare(8192, device=device)
    positions = torch.arange(seq, device=device).expand(batch, seq)
    if seq == 1:  # decoding: each sequence at its own position
        positions = positions + 1000 + torch.arange(batch, device=device)[:, None]
    tables = rope.tables(positions)
    cos, sin = tables.gather()  # per token [B, S, D], as Hugging Face's rotary embedding hands them to layers
    eps = 1e-6

    def fused():
        return rotary.rmsnorm_rotate(q, k, wq, wk, tables, eps=eps, layout="bshd")

    def eager():
        return rotary.rotate([rms_norm(q, wq, eps=eps), rms_norm(k, wk, eps=eps)], tables, layout="bshd", kinds=("q", "k"))

    calls = {"fused": fused, "eager composition": eager, "torch composition": lambda: torch_composition(q, k, wq, wk, cos, sin, eps)}
    if not args.no_compile:
        torch._dynamo.reset()
        compiled = torch.compile(torch_composition, dynamic=False)
        calls["compiled composition"] = lambda: compiled(q, k, wq, wk, cos, sin, eps)
    rows = [(name, time_call(call, device, args.repeats)) for name, call in calls.items()]
    limit = fused_bytes(batch, seq, hq, hk, head_dim, head_dim, dtype) / bandwidth
    rows.append(("traffic limit", limit))
    return rows


def fused_op_cli(
    argv: list[str] | None, description: str, op: str, kv: str, run: Callable[..., list[tuple[str, float]]]
) -> int:
    """The command line of a fused-op benchmark: parse, print the machine line, then each shape's rows
    (``run(args, shape, device, bandwidth)``, the traffic limit last) as µs per call and x the limit."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"])
    parser.add_argument("--shapes", nargs="*", help="BxS (default: 64x1 1x4096 8x2048 on CUDA, 64x1 1x512 4x256 on the CPU)")
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    parser.add_argument("--heads", type=int, default=32, help="q heads (default 32)")
    parser.add_argument("--kv-heads", type=int, default=8, help=f"{kv} heads (default 8)")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=0, help="CPU threads for torch (default: torch's setting)")
    parser.add_argument("--no-compile", action="store_true", help="skip the Inductor-compiled composition")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA GPU here")
    if args.threads:
        torch.set_num_threads(args.threads)
    bandwidth = copy_bandwidth(device, args.repeats)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"{op} on {name}, torch {torch.__version__}, {args.dtype}, q {args.heads} heads, {kv} {args.kv_heads}, "
          f"D {args.head_dim}; copy bandwidth {bandwidth / 1e9:.1f} GB/s")  # fmt: skip
    print(f"{'shape':>8}  {'method':<22}{'µs per call':>12}  {'x traffic limit':>15}")
    for text in args.shapes or SHAPES[device.type]:
        rows = run(args, text, device, bandwidth)
        limit = rows[-1][1]
        for method, seconds in rows:
            print(f"{text:>8}  {method:<22}{seconds * 1e6:>12.2f}  {seconds / limit:>15.2f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return fused_op_cli(argv, __doc__.splitlines()[0], "rmsnorm_rotate", "k", run_shape)


if __name__ == "__main__":
    raise SystemExit(main())
