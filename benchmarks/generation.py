"""Generation speed: rotary's `Decoder.generate` against Hugging Face `LlamaForCausalLM.generate`, end to end.

The same Llama-shaped model on both sides (RoPE, RMSNorm, SwiGLU, GQA, untied embeddings), random
weights shared by copying the Decoder's state into the Llama (no download), greedy decoding of exactly
``new`` tokens after a ``prompt``-token prompt, batch ``batch``. Rows:

- ``rotary dynamic``: ``Decoder.generate`` on growing KV caches (``torch.cat`` per step), eager;
- ``rotary static``: ``generate(cache="static")``, preallocated caches written in place, eager;
- ``rotary static + compile``: ``generate(capture="compile")``: the decoding step compiled by Inductor,
  with CUDA graphs on CUDA (``mode="reduce-overhead"``);
- ``rotary static + CUDA graph``: ``generate(capture="cuda_graph")``, the eager step replayed from one
  ``torch.cuda.CUDAGraph`` (CUDA only);
- ``HF dynamic`` / ``HF static``: ``LlamaForCausalLM.generate`` with its default cache and with
  ``cache_implementation="static"`` (which Hugging Face compiles by itself on CUDA, not on the CPU);
  skipped when transformers is not installed;
- ``... + rotary.hf.patch``: the same on a copy of the Llama patched by :func:`rotary.hf.patch` (RoPE
  applied by rotary's kernels): what patching costs or gains a Hugging Face user.

Each row: a first call (its time includes compilation and capture), then ``--repeats`` timed calls,
interleaved with the other rows; the best is reported as tokens/s (``batch * new / seconds``) and ms
per step (``seconds / new``, the prefill included). ``same tokens`` compares the greedy tokens with the
first row's (in bf16, logits that differ in the last bits may pick another token at a near tie).

    PYTHONPATH=src python benchmarks/generation.py --device cuda             # the issue-26 shape, bf16
    PYTHONPATH=src python benchmarks/generation.py --device cpu --threads 2  # the small CPU shape, fp32
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import time
from collections.abc import Callable

import torch

from rotary.models import Decoder, DecoderConfig


@dataclasses.dataclass(frozen=True)
class Shape:
    """A model and a generation workload."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    dtype: str
    batch: int
    prompt: int
    new: int


SHAPES = {
    # the shape of issue 26's table (measured there on an H100): Llama's vocabulary
    "issue26": Shape(layers=8, hidden=1024, heads=16, kv_heads=4, intermediate=2816, vocab=32000, dtype="bf16", batch=8, prompt=128, new=128),
    # small enough for 2 CPU cores: a few seconds per row
    "small": Shape(layers=2, hidden=256, heads=8, kv_heads=2, intermediate=688, vocab=1024, dtype="fp32", batch=4, prompt=32, new=32),
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
METHODS = (
    "rotary dynamic", "rotary static", "rotary static + compile", "rotary static + CUDA graph", "HF dynamic", "HF static",
    "HF dynamic + rotary.hf.patch", "HF static + rotary.hf.patch",
)


def build_models(shape: Shape, device: torch.device, with_hf: bool) -> tuple[Decoder, torch.nn.Module | None]:
    """The Decoder with random weights, and a LlamaForCausalLM holding the same weights (or None)."""
    config = DecoderConfig(
        vocab_size=shape.vocab, hidden_size=shape.hidden, num_layers=shape.layers, num_heads=shape.heads,
        num_kv_heads=shape.kv_heads, intermediate_size=shape.intermediate, max_position=max(2048, shape.prompt + shape.new),
    )
    torch.manual_seed(0)
    decoder = Decoder(config).eval()
    llama = None
    if with_hf:
        import transformers

        hf_config = transformers.LlamaConfig(
            vocab_size=config.vocab_size, hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
            num_hidden_layers=config.num_layers, num_attention_heads=config.num_heads,
            num_key_value_heads=config.num_kv_heads, max_position_embeddings=config.max_position,
            rms_norm_eps=config.rms_norm_eps, rope_parameters={"rope_type": "default", "rope_theta": config.rope_base},
            tie_word_embeddings=False,
            attention_bias=False, mlp_bias=False,
        )
        hf_config._attn_implementation = "sdpa"
        llama = transformers.LlamaForCausalLM(hf_config).eval()
        llama.load_state_dict(llama_state(decoder), strict=True)
        llama.generation_config.eos_token_id = None  # exactly `new` tokens
        llama.generation_config.pad_token_id = 0
        llama = llama.to(device, DTYPES[shape.dtype])
    return decoder.to(device, DTYPES[shape.dtype]), llama


def llama_state(decoder: Decoder) -> dict[str, torch.Tensor]:
    """The Decoder's weights under Llama's names (both pair RoPE channels as (i, i + d/2))."""
    names = {
        "embed_tokens": "model.embed_tokens", "norm": "model.norm", "lm_head": "lm_head",
        "attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm", "attn": "self_attn",
    }
    out = {}
    for key, value in decoder.state_dict().items():
        parts = key.split(".")
        if parts[0] == "layers":
            parts = ["model", "layers", parts[1], names.get(parts[2], parts[2]), *parts[3:]]
        else:
            parts = [names.get(parts[0], parts[0]), *parts[1:]]
        out[".".join(parts)] = value
    return out


def generators(
    decoder: Decoder, llama: torch.nn.Module | None, ids: torch.Tensor, new: int, methods: list[str]
) -> dict[str, Callable[[], torch.Tensor]]:
    """One callable per row, each returning the generated ids ``[B, S + new]``."""
    mask = torch.ones_like(ids)
    calls: dict[str, Callable[[], torch.Tensor]] = {
        "rotary dynamic": lambda: decoder.generate(ids, new),
        "rotary static": lambda: decoder.generate(ids, new, cache="static"),
        "rotary static + compile": lambda: decoder.generate(ids, new, capture="compile"),
        "rotary static + CUDA graph": lambda: decoder.generate(ids, new, capture="cuda_graph"),
    }
    if llama is not None:
        hf = dict(attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False)
        calls["HF dynamic"] = lambda: llama.generate(ids, **hf)
        calls["HF static"] = lambda: llama.generate(ids, cache_implementation="static", **hf)
        if any(name.endswith("rotary.hf.patch") for name in methods):
            import copy

            import rotary

            patched = rotary.hf.patch(copy.deepcopy(llama))
            calls["HF dynamic + rotary.hf.patch"] = lambda: patched.generate(ids, **hf)
            calls["HF static + rotary.hf.patch"] = lambda: patched.generate(ids, cache_implementation="static", **hf)
    return {name: calls[name] for name in methods if name in calls}


def _timed(call: Callable[[], torch.Tensor], device: torch.device) -> tuple[float, torch.Tensor]:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    out = call()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start, out


def measure(calls: dict[str, Callable[[], torch.Tensor]], device: torch.device, repeats: int) -> dict[str, dict]:
    """Per row: the first call's seconds, the best of ``repeats`` later calls, and the tokens."""
    found: dict[str, dict] = {}
    for name, call in calls.items():
        first, tokens = _timed(call, device)
        found[name] = dict(first=first, times=[], tokens=tokens.cpu())
    for _ in range(repeats):
        for name, call in calls.items():
            found[name]["times"].append(_timed(call, device)[0])
    return found


def table(shape: Shape, device: torch.device, found: dict[str, dict]) -> str:
    """The markdown table of :func:`measure`'s results."""
    tokens = shape.batch * shape.new
    reference = next(iter(found.values()))["tokens"] if found else None
    lines = [
        "| generation | tokens/s | ms per step | first call (s) | same tokens |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    for name, row in found.items():
        best = min(row["times"]) if row["times"] else row["first"]
        same = (row["tokens"] == reference).float().mean().item()  # type: ignore[operator]
        lines.append(
            f"| {name} | {tokens / best:,.0f} | {best / shape.new * 1e3:.2f} | {row['first']:.2f} | "
            f"{'yes' if same == 1.0 else f'{same:.0%} of ids'} |"
        )
    return "\n".join(lines)


def machine(device: torch.device) -> str:
    """One line: the device, torch and transformers versions, threads and the load average."""
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or platform.machine())
    try:
        import transformers

        hf = f", transformers {transformers.__version__}"
    except ImportError:
        hf = ", transformers not installed"
    load = ", load average {:.1f} {:.1f} {:.1f}".format(*os.getloadavg()) if hasattr(os, "getloadavg") else ""
    return f"{device.type}: {where}; torch {torch.__version__}{hf}; {torch.get_num_threads()} threads{load}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--shape", choices=sorted(SHAPES), default=None, help="default: issue26 on cuda, small on cpu")
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--prompt", type=int, default=None)
    parser.add_argument("--new-tokens", type=int, default=None)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=None)
    parser.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated rows among: {', '.join(METHODS)}")
    parser.add_argument("--repeats", type=int, default=2, help="timed calls per row after the first (best reported)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's setting)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: CUDA is not available here")
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        parser.error(f"--methods: unknown row(s) {unknown}; choose among {list(METHODS)}")
    if args.repeats < 0:
        parser.error(f"--repeats {args.repeats}: give 0 or more")
    shape = SHAPES[args.shape or ("issue26" if device.type == "cuda" else "small")]
    overrides = dict(batch=args.batch, prompt=args.prompt, new=args.new_tokens, dtype=args.dtype)
    for name, value in overrides.items():
        if isinstance(value, int) and value < 1:
            parser.error(f"--{name.replace('new', 'new-tokens')} {value}: give 1 or more")
    shape = dataclasses.replace(shape, **{k: v for k, v in overrides.items() if v is not None})
    if args.threads:
        torch.set_num_threads(args.threads)
    if device.type != "cuda":
        methods = [m for m in methods if m != "rotary static + CUDA graph"]
    try:
        import transformers  # noqa: F401

        with_hf = any(m.startswith("HF") for m in methods)
    except ImportError:
        with_hf = False
    decoder, llama = build_models(shape, device, with_hf)
    ids = torch.randint(1, shape.vocab, (shape.batch, shape.prompt), generator=torch.Generator().manual_seed(0)).to(device)
    found = measure(generators(decoder, llama, ids, shape.new, methods), device, args.repeats)
    print(machine(device))
    print(
        f"shape: {shape.layers} layers, width {shape.hidden}, {shape.heads} query / {shape.kv_heads} kv heads, "
        f"intermediate {shape.intermediate}, vocab {shape.vocab}, {shape.dtype}; batch {shape.batch}, prompt "
        f"{shape.prompt}, {shape.new} new tokens, greedy; best of {args.repeats} after a first call"
    )
    print()
    print(table(shape, device, found))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
