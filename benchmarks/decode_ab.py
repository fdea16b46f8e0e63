"""The decoding step's rotation, this tree against another, interleaved in one process.

Run: ``python benchmarks/decode_ab.py OTHER_TREE [--general]`` (CPU, one thread). ``OTHER_TREE`` is a
checkout of rotary (e.g. a ``git worktree add --detach /tmp/old <commit>``); its ``src/rotary`` is
copied to a temporary folder and imported as ``rotary_other``, beside this tree's ``rotary``, so both
are timed in the same process, call after call: on a shared machine the ratio is the number to read,
the absolute times move with the load. Its fused CPU kernel is built once for the copy (about a
minute). ``--general`` turns off the other tree's decoding bypasses (``RoPE._fast`` and
``rotation._fast_pair``, where it has them) or its plans (``rotary.plans``), to time its general path.

Shapes: Llama-3-8B's decoding step, q ``[1, 32, 1, 128]``, k ``[1, 8, 1, 128]``, position 4096, fp32 and
bf16; Hugging Face's ``apply_rotary_pos_emb`` with the tables precomputed is the reference row. The
``rmsnorm_rotate`` rows (Qwen3's QK-norm then RoPE) use the same q and k, with a RoPE and with the model's own
tables as ``rotary.hf.patch`` passes them.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch


def _other(tree: str, general: bool):
    folder = Path(tempfile.mkdtemp(prefix="rotary_ab_"))
    shutil.copytree(Path(tree) / "src" / "rotary", folder / "rotary_other")
    sys.path.insert(0, str(folder))
    import rotary_other  # type: ignore[import-not-found]

    if general:
        if hasattr(rotary_other.rotation, "_fast_pair"):
            rotary_other.rotation._fast_pair = lambda *args: None
        if hasattr(rotary_other.rope.RoPE, "_fast"):
            rotary_other.rope.RoPE._fast = lambda self, *args: None
        if hasattr(rotary_other, "plans"):
            rotary_other.plans._state.off = True
    return rotary_other


def _hf_apply(q, k, cos, sin):
    def half(x):
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
        return torch.cat((-x2, x1), dim=-1)

    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + half(q) * sin, k * cos + half(k) * sin


def _calls(module, q, k):
    rope = module.RoPE(128, max_position=8192)
    ids = torch.tensor([[4096]])
    tables = rope.tables(ids)
    wq, wk = torch.rand(128).to(q.dtype), torch.rand(128).to(q.dtype)  # QK-norm weights, the model's dtype
    cos, sin = (t.to(q.dtype) for t in rope.cos_sin(ids))
    return {
        "rope(q, k, offset=4096)": lambda: rope(q, k, offset=4096),
        "rope(q, k, position_ids=ids)": lambda: rope(q, k, position_ids=ids),
        "rope(q, k, offset=4096, inplace=True)": lambda: rope(q, k, offset=4096, inplace=True),
        "rotate([q, k], tables)": lambda: module.rotate([q, k], tables, kinds=("q", "k")),
        "rmsnorm_rotate(q, k, wq, wk, rope, offset=4096)": lambda: module.rmsnorm_rotate(
            q, k, wq, wk, rope, offset=4096
        ),
        # as rotary.hf.patch calls it for Qwen3 and Gemma 3: the model's own [B, S, r] tables in its dtype
        "rmsnorm_rotate(..., model tables)": lambda: module.rmsnorm_rotate(
            q, k, wq, wk, module.RotaryTables.unchecked(cos, sin, False)
        ),
    }


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    import rotary

    other = _other(sys.argv[1], "--general" in sys.argv)
    torch.set_num_threads(1)
    for dtype in (torch.float32, torch.bfloat16):
        g = torch.Generator().manual_seed(0)
        q = torch.randn(1, 32, 1, 128, generator=g).to(dtype)
        k = torch.randn(1, 8, 1, 128, generator=g).to(dtype)
        cos, sin = rotary.RoPE(128).cos_sin(torch.tensor([[4096]]))
        hf_cos, hf_sin = cos.to(dtype), sin.to(dtype)
        mine, theirs = _calls(rotary, q, k), _calls(other, q, k)
        calls = {"HF apply_rotary_pos_emb": lambda: _hf_apply(q, k, hf_cos, hf_sin)}  # noqa: B023 (used in this loop)
        for name in mine:
            calls["other " + name], calls["this " + name] = theirs[name], mine[name]
        best = dict.fromkeys(calls, float("inf"))
        with torch.inference_mode():
            for call in calls.values():
                for _ in range(300):
                    call()
            for _ in range(11):
                for name, call in calls.items():
                    start = time.perf_counter()
                    for _ in range(1000):
                        call()
                    best[name] = min(best[name], (time.perf_counter() - start) * 1e3)  # µs per call
        hf = best["HF apply_rotary_pos_emb"]
        print(f"{dtype}: HF {hf:.1f} µs")
        for name in mine:
            this, that = best["this " + name], best["other " + name]
            print(
                f"  {name:40s} this {this:6.1f} µs  other {that:6.1f} µs  this/other {this / that:.2f}  "
                f"HF/this {hf / this:.2f}  HF/other {hf / that:.2f}"
            )


if __name__ == "__main__":
    main()
