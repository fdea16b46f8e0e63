"""``rotary demo``: rotate a small batch and check RoPE's defining properties numerically."""

from __future__ import annotations

import argparse
import math

import torch

from rotary import reference
from rotary.pairing import permute_qk_weight
from rotary.rope import RoPE

from .argument_types import head_dim_count, seq_len_count
from .output import add_output_argument
from .printing import print_json

__all__ = ["run_checks", "register"]


def run_checks(head_dim: int = 64, seq_len: int = 32, seed: int = 0) -> list[tuple[str, float, float]]:
    """Run the core property checks; returns ``(name, worst_error, tolerance)`` rows.

    Example:
        >>> all(err <= tol for _, err, tol in run_checks(head_dim=16, seq_len=8))
        True
    """
    g = torch.Generator().manual_seed(seed)
    rows: list[tuple[str, float, float]] = []
    q = torch.randn(2, 4, seq_len, head_dim, generator=g, dtype=torch.float64)
    k = torch.randn(2, 4, seq_len, head_dim, generator=g, dtype=torch.float64)
    pos = torch.arange(seq_len)
    for interleaved in (False, True):
        tag = "interleaved" if interleaved else "half"
        rope = RoPE(head_dim, interleaved=interleaved)
        qr, kr = rope(q, k)
        rows.append((f"norm preserved [{tag}]", float((qr.norm(dim=-1) - q.norm(dim=-1)).abs().max()), 1e-5))
        rows.append((f"f(x, 0) == x [{tag}]", float((rope.rotate(q[:, :, :1]) - q[:, :, :1]).abs().max()), 0.0))
        shift = 1000
        qs, ks = rope(q, k, offset=shift)
        s0 = torch.einsum("bhmd,bhnd->bhmn", qr, kr)
        s1 = torch.einsum("bhmd,bhnd->bhmn", qs, ks)
        rows.append((f"scores depend on m-n only [{tag}]", float((s0 - s1).abs().max()), 1e-4))
        ref = reference.rotate_matrix(q, pos, rope.inv_freq, interleaved=interleaved)
        rows.append((f"fast == block-diagonal matrix [{tag}]", float((qr - ref).abs().max()), 1e-6))
    # one checkpoint, two pairings: permuting the projection rows gives the same attention scores
    x = torch.randn(seq_len, 128, generator=g, dtype=torch.float64)
    wq, wk = (torch.randn(2 * head_dim, 128, generator=g, dtype=torch.float64) for _ in range(2))

    def scores(wq: torch.Tensor, wk: torch.Tensor, interleaved: bool) -> torch.Tensor:
        rope = RoPE(head_dim, interleaved=interleaved)
        qq, kk = ((x @ w.T).view(1, seq_len, 2, head_dim) for w in (wq, wk))
        qq, kk = rope(qq, kk, layout="bshd")
        return torch.einsum("bmhd,bnhd->bhmn", qq, kk)

    conv = scores(permute_qk_weight(wq, head_dim), permute_qk_weight(wk, head_dim), False)
    rows.append(("permute_qk_weight: interleaved == half", float((conv - scores(wq, wk, True)).abs().max()), 1e-9))
    return rows


def _demo(args: argparse.Namespace) -> int:
    rope = RoPE(args.head_dim)
    inv = rope.inv_freq
    rows = run_checks(args.head_dim, args.seq_len)
    failed = sum(err > tol for _, err, tol in rows)
    if args.json:
        print_json(
            {
                "rope": repr(rope),
                "passed": not failed,
                "checks": [
                    {"name": name, "worst_error": err, "tolerance": tol, "passed": err <= tol}
                    for name, err, tol in rows
                ],
            }
        )
        return 1 if failed else 0
    print(f"rotary demo: {rope}")
    print(
        f"inv_freq: {inv.numel()} values, min {float(inv.min()):.6f}, max {float(inv.max()):.1f}, "
        f"mean {float(inv.mean()):.6f}; shortest wavelength {2 * math.pi:.3f} tokens, "
        f"longest {2 * math.pi / float(inv.min()):.0f} tokens"
    )
    width = max(len(r[0]) for r in rows)
    for name, err, tol in rows:
        print(f"  {'PASS' if err <= tol else 'FAIL'}  {name:<{width}}  worst error {err:.2e} (tolerance {tol:.0e})")
    print("all checks passed" if not failed else f"{failed} check(s) FAILED")
    return 1 if failed else 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="rotate a small batch and check RoPE's properties", description=__doc__)
    p.add_argument("--head-dim", type=head_dim_count, default=64, help="channels per head (default 64)")
    p.add_argument("--seq-len", type=seq_len_count, default=32, help="positions (default 32)")
    p.add_argument("--json", action="store_true", help="print the checks as JSON")
    add_output_argument(p, "file", None, "write the output to this file")
    p.set_defaults(func=_demo)
