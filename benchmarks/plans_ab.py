"""Issue 46's speed targets, this tree against another, interleaved in one process (CPU).

Run: ``python benchmarks/plans_ab.py OTHER_TREE [--threads 2] [--models llama,qwen3,...]``. ``OTHER_TREE`` is a
checkout of rotary (``git worktree add --detach /tmp/old 84b8fc4``), imported as ``rotary_other`` beside this
tree's ``rotary`` (as :mod:`decode_ab` does). Prints:

- ``apply_rotary(q, cos, sin, inplace=True)`` with its default checks on q and k ``[1, 32, 2048, 128]`` with
  per-token tables (the same tables every call, as a model's layers get them), fp32 and bf16, over one
  in-place pass (``q.mul_(1.0); k.mul_(1.0)``), this tree and the other;
- ``rotary.hf.patch`` on small models (width 512, 4 layers, random weights, fp32): one decoding step of 8
  sequences after a 64-token prompt (on a copy of the prompt's KV cache made before each sample, not timed),
  and a prefill of 1,024 tokens, patched with this tree and with the other tree over unpatched (outputs
  checked equal first).

On a shared machine the ratios are the numbers to read (samples alternate), not the absolute times.
For the decoding step's rotation alone, see :mod:`decode_ab`.
"""

from __future__ import annotations

import argparse
import copy
import time

import torch

from bench_hf_patch import built, time_models  # the five small models, timed as bench_hf_patch.py times them
from decode_ab import _other


def _best(calls: dict, repeats: int, inner: int) -> dict[str, float]:
    best = dict.fromkeys(calls, float("inf"))
    for call in calls.values():
        call()
    for _ in range(repeats):
        for name, call in calls.items():
            start = time.perf_counter()
            for _ in range(inner):
                call()
            best[name] = min(best[name], (time.perf_counter() - start) / inner)
    return best


def _apply_calls(mine, theirs, q, k, cos, sin) -> dict:
    return {
        "pass": lambda: (q.mul_(1.0), k.mul_(1.0)),
        "this": lambda: (mine.apply_rotary(q, cos, sin, inplace=True), mine.apply_rotary(k, cos, sin, inplace=True)),
        "other": lambda: (
            theirs.apply_rotary(q, cos, sin, inplace=True),
            theirs.apply_rotary(k, cos, sin, inplace=True),
        ),
    }


def apply_rows(mine, theirs, repeats: int) -> None:
    for dtype in (torch.float32, torch.bfloat16):
        g = torch.Generator().manual_seed(0)
        q = torch.randn(1, 32, 2048, 128, generator=g).to(dtype)
        k = torch.randn(1, 32, 2048, 128, generator=g).to(dtype)
        cos, sin = mine.RoPE(128).cos_sin(torch.arange(2048)[None])  # per-token [1, S, r], fp32
        best = _best(_apply_calls(mine, theirs, q, k, cos, sin), repeats, 3)
        print(
            f"apply_rotary in place, q and k [1, 32, 2048, 128] {dtype}: pass {best['pass'] * 1e3:.2f} ms, "
            f"this {best['this'] / best['pass']:.2f}x, other {best['other'] / best['pass']:.2f}x the pass",
            flush=True,
        )


def model_rows(mine, theirs, model_types: list[str], repeats: int) -> None:
    torch.set_grad_enabled(False)
    for model_type in model_types:
        base = built(model_type)
        if base is None:
            continue
        this, other = mine.hf.patch(copy.deepcopy(base)), theirs.hf.patch(copy.deepcopy(base))
        best, prefill, _, _ = time_models({"unpatched": base, "this": this, "other": other}, repeats)
        print(
            f"{model_type}: decode step (8 sequences) unpatched {best['unpatched'] * 1e3:.2f} ms, speed this "
            f"{best['unpatched'] / best['this']:.2f}x, other {best['unpatched'] / best['other']:.2f}x; prefill 1024 "
            f"unpatched {prefill['unpatched'] * 1e3:.1f} ms, this {prefill['unpatched'] / prefill['this']:.2f}x, "
            f"other {prefill['unpatched'] / prefill['other']:.2f}x (x: unpatched time over patched)",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("other")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--models", default="llama,qwen3,gemma3_text,qwen3_5_text,gemma4_text")
    parser.add_argument("--skip-apply", action="store_true")
    args = parser.parse_args()
    import rotary

    theirs = _other(args.other, False)
    torch.set_num_threads(args.threads)
    if not args.skip_apply:
        apply_rows(rotary, theirs, args.repeats)
    if args.models:
        model_rows(rotary, theirs, args.models.split(","), args.repeats)


if __name__ == "__main__":
    main()
