"""``rotary.hf.patch`` against the unpatched model, side by side in one process (CPU, random weights).

Default: the five small models of issue 46 (width 512, 4 layers, 8 query and 2 key/value heads of 64 channels,
fp32): Llama, Qwen3, Gemma 3, Qwen3.5 and Gemma 4. For each, outputs are checked equal first; then one decoding
step of 8 sequences after a 64-token prompt (on a copy of the prompt's KV cache made before each sample, not
timed) and a prefill of 1,024 tokens, patched and unpatched in alternation, best of the samples. Prints the load
average, each model's times and the speed of the patched model (unpatched time over patched: >= 1.0 means the
patch makes it no slower), and how many of the patched step's rotary calls a recorded plan ran and how many the
general path.

    python benchmarks/bench_hf_patch.py [--models llama,qwen3,gemma3_text,qwen3_5_text,gemma4_text]
        [--threads 2] [--repeats 9]

``--forward``: the older measurement, a small Llama's forward (``--seq``, ``--batch``, ``--hidden``, ...).
On a shared machine read the ratios (samples alternate), not the absolute times.
"""

from __future__ import annotations

import argparse
import copy
import os
import time
import warnings

import torch

from rotary import hf

#: the small models' sizes (issue 46)
SIZES = dict(
    hidden_size=512,
    intermediate_size=1024,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=64,
    vocab_size=1000,
    max_position_embeddings=4096,
)
MODELS = "llama,qwen3,gemma3_text,qwen3_5_text,gemma4_text"


def build(model_type: str):
    """A small random-weight causal LM of ``model_type`` (:data:`SIZES`), in eval mode."""
    import transformers

    extra = {}
    if model_type in ("gemma3_text", "gemma4_text"):
        extra = {"sliding_window": 512}
    if model_type == "qwen3_5_text":
        extra = {"layer_types": ["linear_attention", "full_attention"] * 2}
    config = transformers.AutoConfig.for_model(model_type, **SIZES, **extra)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(config)
    return model.eval()


def _plan_calls(model, step, cache) -> tuple[int, int]:
    """``(calls a recorded plan ran, calls the general path ran)`` in one patched decoding step (not timed): the
    general path counted where it checks (``rotation.plan``, ``qk_norm._general``)."""
    from rotary import qk_norm, rotation

    counts = [0, 0]
    real = (rotation.run_plan, qk_norm._run_plan, rotation.plan, qk_norm._general)

    def counted(f, planned):
        def call(*args, **kwargs):
            out = f(*args, **kwargs)
            counts[0 if planned else 1] += bool(out) if planned else 1
            return out

        return call

    rotation.run_plan, qk_norm._run_plan = counted(real[0], True), counted(real[1], True)
    rotation.plan, qk_norm._general = counted(real[2], False), counted(real[3], False)
    try:
        model(step, past_key_values=cache)
    finally:
        rotation.run_plan, qk_norm._run_plan, rotation.plan, qk_norm._general = real
    return counts[0], counts[1]


def time_models(models: dict[str, torch.nn.Module], repeats: int) -> tuple[dict, dict, torch.Tensor, dict]:
    """Best seconds of one decoding step and of a prefill for each of ``models``, samples alternating between them.

    The decoding step is of 8 sequences after a 64-token prompt, each sample on a fresh copy of the prompt's KV cache
    made before it (not timed); the prefill is of 1,024 tokens. Every model's step logits are checked equal to those of
    ``models["unpatched"]`` first. Returns ``(decode, prefill, step, caches)``: seconds by name, the step's tokens and
    each model's prompt cache.
    """
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(1, 1000, (8, 64), generator=gen)
    step = torch.randint(1, 1000, (8, 1), generator=gen)
    long = torch.randint(1, 1000, (1, 1024), generator=gen)
    caches = {name: model(prompt, use_cache=True).past_key_values for name, model in models.items()}
    outs = {name: model(step, past_key_values=copy.deepcopy(caches[name])).logits for name, model in models.items()}
    for name in models:
        torch.testing.assert_close(outs[name], outs["unpatched"], rtol=1e-4, atol=1e-4)
    decode = dict.fromkeys(models, float("inf"))
    for _ in range(5 * repeats):
        for name, model in models.items():
            cache = copy.deepcopy(caches[name])
            start = time.perf_counter()
            model(step, past_key_values=cache)
            decode[name] = min(decode[name], time.perf_counter() - start)
    prefill = dict.fromkeys(models, float("inf"))
    for _ in range(max(repeats // 2, 3)):
        for name, model in models.items():
            start = time.perf_counter()
            model(long, use_cache=False)
            prefill[name] = min(prefill[name], time.perf_counter() - start)
    return decode, prefill, step, caches


def built(model_type: str):
    """``build(model_type)``, or ``None`` (said in one line) for a type this transformers does not build."""
    try:
        return build(model_type)
    except Exception as exc:  # noqa: BLE001  a model type this transformers does not build from these sizes
        print(f"{model_type}: not built ({type(exc).__name__}: {str(exc)[:120]})", flush=True)
        return None


def model_rows(model_types: list[str], repeats: int) -> None:
    torch.set_grad_enabled(False)
    for model_type in model_types:
        base = built(model_type)
        if base is None:
            continue
        models = {"unpatched": base, "patched": hf.patch(copy.deepcopy(base))}
        decode, prefill, step, caches = time_models(models, repeats)
        planned, general = _plan_calls(models["patched"], step, copy.deepcopy(caches["patched"]))
        print(
            f"{model_type:13s} decode step (8 sequences) unpatched {decode['unpatched'] * 1e3:7.2f} ms, patched "
            f"{decode['patched'] * 1e3:7.2f} ms, speed {decode['unpatched'] / decode['patched']:.2f}x | prefill 1024 "
            f"unpatched {prefill['unpatched'] * 1e3:7.1f} ms, patched {prefill['patched'] * 1e3:7.1f} ms, speed "
            f"{prefill['unpatched'] / prefill['patched']:.2f}x | a step's rotary calls: {planned} by a plan, "
            f"{general} by the general path",
            flush=True,
        )


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
    """``{"unpatched": s, "patched": s, "ratio": patched / unpatched}``: best-of-``repeats`` Llama forward times."""
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
    parser.add_argument("--models", default=MODELS, help="comma-separated model types (default: the five of issue 46)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--forward", action="store_true", help="the older measurement: a small Llama's forward")
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}; threads {torch.get_num_threads()}", flush=True
    )
    if not args.forward:
        model_rows(args.models.split(","), args.repeats)
        print(f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)
        return
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
