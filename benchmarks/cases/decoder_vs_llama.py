"""Extra `rotary bench` suite: training tokens per second of `rotary.models.Decoder` against
`transformers.LlamaForCausalLM` of the same configuration (RoPE, width, depth, heads, SwiGLU, RMSNorm,
untied embeddings), in one process: forward, cross-entropy, backward and an AdamW step.

Loaded by `make bench` (every file in benchmarks/cases/ is passed as `--cases`); skipped (no rows)
when transformers is not installed. `--quick` uses a smaller batch.

    python benchmarks/cases/decoder_vs_llama.py --profile   # where one step's time goes, per model
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from rotary.models import Decoder, DecoderConfig
from rotary.tools import bench
from rotary.tools.bench.generation import llama_state

#: not a preset's shape: between the experiment's `default` preset (width 128, 2 layers, 4 heads) and its `large`
#: preset (width 512, 8 layers, 8 heads), with the byte vocabulary they share; big enough that both implementations
#: are compute-bound, small enough to time on 2 CPU cores
SHAPE = dict(vocab_size=256, hidden_size=256, num_layers=4, num_heads=8)


def build(name: str, seed: int = 0) -> torch.nn.Module:
    """``"decoder"`` or ``"llama"``: the same architecture, random weights."""
    config = DecoderConfig(**SHAPE, max_position=2048)
    torch.manual_seed(seed)
    if name == "decoder":
        return Decoder(config)
    import transformers

    llama = transformers.LlamaConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        max_position_embeddings=config.max_position,
        rms_norm_eps=config.rms_norm_eps,
        tie_word_embeddings=False,
        attention_bias=False,
        mlp_bias=False,
    )
    llama._attn_implementation = "sdpa"
    return transformers.LlamaForCausalLM(llama)


def train_step(model: torch.nn.Module, ids: torch.Tensor):
    """One training step on ``ids`` ``[B, S + 1]``: the same loss and optimizer for both models."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    is_decoder = isinstance(model, Decoder)

    def step() -> None:
        out = model(ids[:, :-1])
        logits = out if is_decoder else out.logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def suite(options) -> list[bench.Result]:
    try:
        import transformers  # noqa: F401
    except ImportError:
        return []
    batch, seq = (2, 128) if options.quick else (8, 512)
    ids = torch.randint(SHAPE["vocab_size"], (batch, seq + 1), generator=torch.Generator().manual_seed(0))
    models = {name: build(name) for name in ("decoder", "llama")}
    with torch.no_grad():  # the same function: equal logits from equal weights
        models["llama"].load_state_dict(llama_state(models["decoder"]), strict=True)
        torch.testing.assert_close(
            models["llama"](ids[:, :-1]).logits, models["decoder"](ids[:, :-1]), rtol=1e-4, atol=1e-4
        )
    repeats = options.repeats or 3
    medians = bench.time_interleaved({name: train_step(m, ids) for name, m in models.items()}, repeats)
    group = (
        f"training step (fwd + loss + bwd + AdamW), width {SHAPE['hidden_size']}, {SHAPE['num_layers']} layers, "
        f"{SHAPE['num_heads']} heads, {batch}x{seq} fp32"
    )
    results = []
    for name, label in (("decoder", "rotary.models.Decoder"), ("llama", "transformers LlamaForCausalLM (sdpa)")):
        r = bench.Result(
            group, label, True, medians[name], repeats, note=f"{batch * seq / medians[name]:,.0f} tokens/s"
        )
        r.ratios["HF eager speedup"] = medians["llama"] / medians[name]
        results.append(r)
    return results


def profile(name: str, batch: int = 8, seq: int = 512, rows: int = 12) -> str:
    """A table of the operators one training step of ``name`` spends its CPU time in."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    model = build(name)
    ids = torch.randint(SHAPE["vocab_size"], (batch, seq + 1), generator=torch.Generator().manual_seed(0))
    step = train_step(model, ids)
    step()
    step()
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)


bench.register_suite("decoder_vs_llama", suite)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", action="store_true", help="print where one step's CPU time goes, per model")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    for model_name in ("decoder", "llama"):
        print(f"== {model_name} ==")
        print(profile(model_name))
