"""Forward time of a small random-weight Llama, patched with rotary.hf.patch vs unpatched.

Prints both times and the ratio patched / unpatched (< 1 means rotary's path is faster). The
model is built from a config (no download). Times are best-of-N, measured in alternation.

    PYTHONPATH=src python benchmarks/bench_hf_patch.py [--seq 512] [--batch 4] [--repeats 10]
"""

from __future__ import annotations

import argparse
import time

import torch

from rotary import hf


def build_llama(hidden: int, layers: int, heads: int, kv_heads: int):
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=1000,
        hidden_size=hidden,
        intermediate_size=hidden * 8 // 3,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=4096,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def measure(
    *,
    seq: int = 512,
    batch: int = 4,
    hidden: int = 256,
    layers: int = 4,
    heads: int = 8,
    kv_heads: int = 2,
    repeats: int = 10,
) -> dict[str, float]:
    """``{"unpatched": s, "patched": s, "ratio": patched / unpatched}``: best-of-``repeats`` forward times."""
    torch.set_grad_enabled(False)
    unpatched = build_llama(hidden, layers, heads, kv_heads)
    patched = hf.patch(build_llama(hidden, layers, heads, kv_heads))
    ids = torch.randint(1000, (batch, seq))
    torch.testing.assert_close(patched(ids).logits, unpatched(ids).logits, rtol=1e-4, atol=1e-5)  # same model
    best = {"unpatched": float("inf"), "patched": float("inf")}
    for _ in range(repeats):
        for name, model in (("unpatched", unpatched), ("patched", patched)):
            start = time.perf_counter()
            model(ids)
            best[name] = min(best[name], time.perf_counter() - start)
    best["ratio"] = best["patched"] / best["unpatched"]
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 is steadier on a shared machine)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    result = measure(
        seq=args.seq,
        batch=args.batch,
        hidden=args.hidden,
        layers=args.layers,
        heads=args.heads,
        kv_heads=args.kv_heads,
        repeats=args.repeats,
    )
    print(
        f"Llama hidden={args.hidden} layers={args.layers} heads={args.heads}/{args.kv_heads} "
        f"batch={args.batch} seq={args.seq} threads={torch.get_num_threads()}"
    )
    print(f"unpatched {result['unpatched'] * 1e3:8.2f} ms")
    print(f"patched   {result['patched'] * 1e3:8.2f} ms")
    print(f"ratio patched/unpatched {result['ratio']:.3f}")


if __name__ == "__main__":
    main()
