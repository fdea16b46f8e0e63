"""The generation suite of ``rotary bench``: :meth:`rotary.models.Decoder.generate` against Hugging Face
``LlamaForCausalLM.generate``, end to end, in tokens per second.

The same Llama-shaped model on both sides (weights copied), greedy decoding of exactly ``new`` tokens. Rows:
rotary's dynamic and static caches, eager, compiled and as a CUDA graph; Hugging Face's dynamic and static
caches, with and without :func:`rotary.hf.patch`, and (CPU) its static cache compiled. Each row: a first call
(compiling included), then ``--repeats`` interleaved calls; the median as tokens/s, ``vs HF static`` and
``same tokens``. The tables: docs/benchmarks.md, "Fused ops and generation".
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .harness import DTYPE_NAMES, Result, installed, register_suite, suite_device, suite_repeats

__all__ = [
    "COMPILED",
    "CPU_ONLY",
    "GenerationShape",
    "QK_NORM_ROWS",
    "SHAPES",
    "ROWS",
    "build_models",
    "build_qwen3",
    "generation_suite",
    "llama_state",
    "qk_norm_generation_suite",
    "row_calls",
]


@dataclass(frozen=True)
class GenerationShape:
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

    def describe(self) -> str:
        return (
            f"generation: {self.layers} layers, width {self.hidden}, {self.heads}/{self.kv_heads} heads, intermediate "
            f"{self.intermediate}, vocabulary {self.vocab}, {self.dtype}; batch {self.batch}, prompt {self.prompt}, "
            f"{self.new} new tokens, greedy"
        )


SHAPES = {
    # Llama-shaped, with Llama's vocabulary: the shape of the generation table in docs/gpu.md
    "cuda": GenerationShape(8, 1024, 16, 4, 2816, 32000, "bf16", batch=8, prompt=128, new=128),
    # a few seconds per row on 2 CPU cores
    "cpu": GenerationShape(2, 256, 8, 2, 688, 1024, "fp32", batch=4, prompt=32, new=32),
    "quick": GenerationShape(1, 64, 4, 2, 128, 128, "fp32", batch=2, prompt=6, new=6),
}
#: every row, in table order
ROWS = (
    "rotary dynamic",
    "rotary static",
    "rotary static + torch.compile",
    "rotary static + CUDA graph",
    "HF dynamic",
    "HF static",
    "HF static + torch.compile",
    "HF dynamic + rotary.hf.patch",
    "HF static + rotary.hf.patch",
    "HF static + torch.compile + rotary.hf.patch",
)
HF_STATIC = "HF static"
#: the rows compiled by torch.compile: left out by --no-compile (and --quick without --compile)
COMPILED = ("rotary static + torch.compile", "HF static + torch.compile", "HF static + torch.compile + rotary.hf.patch")
#: CPU only: on CUDA Hugging Face compiles its static-cache step by itself (the HF static rows are compiled)
CPU_ONLY = ("HF static + torch.compile", "HF static + torch.compile + rotary.hf.patch")
#: the QK-norm suite's rows: Hugging Face's Qwen3 (per-head q_norm and k_norm, then RoPE), patched or not
QWEN3 = "HF Qwen3"
QK_NORM_ROWS = tuple(f"{QWEN3}{name[2:]}" for name in ROWS if name.startswith("HF"))


def build_models(
    shape: GenerationShape, device: torch.device, with_hf: bool
) -> tuple[torch.nn.Module, torch.nn.Module | None]:
    """The Decoder with seeded random weights and a ``LlamaForCausalLM`` holding the same (``None`` without
    ``with_hf``), in eval mode on ``device`` in the shape's dtype.
    """
    from rotary.models import Decoder, DecoderConfig

    config = DecoderConfig(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        num_layers=shape.layers,
        num_heads=shape.heads,
        num_kv_heads=shape.kv_heads,
        intermediate_size=shape.intermediate,
        max_position=max(2048, shape.prompt + shape.new),
    )
    torch.manual_seed(0)
    decoder = Decoder(config).eval()
    llama = None
    if with_hf:
        import transformers

        hf_config = transformers.LlamaConfig(
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            num_hidden_layers=config.num_layers,
            num_attention_heads=config.num_heads,
            num_key_value_heads=config.num_kv_heads,
            max_position_embeddings=config.max_position,
            rms_norm_eps=config.rms_norm_eps,
            rope_parameters={"rope_type": "default", "rope_theta": config.rope_base},
            tie_word_embeddings=False,
            attention_bias=False,
            mlp_bias=False,
        )
        hf_config._attn_implementation = "sdpa"
        llama = transformers.LlamaForCausalLM(hf_config).eval()
        llama.load_state_dict(llama_state(decoder), strict=True)
        llama.generation_config.eos_token_id = None  # exactly `new` tokens
        llama.generation_config.pad_token_id = 0
        llama = llama.to(device, DTYPE_NAMES[shape.dtype])
    return decoder.to(device, DTYPE_NAMES[shape.dtype]), llama


def build_qwen3(shape: GenerationShape, device: torch.device) -> torch.nn.Module:
    """A seeded random ``Qwen3ForCausalLM`` of the shape, in eval mode on ``device`` in its dtype."""
    import transformers

    config = transformers.Qwen3Config(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.hidden // shape.heads,
        max_position_embeddings=max(2048, shape.prompt + shape.new),
        tie_word_embeddings=False,
        attention_bias=False,
        use_sliding_window=False,
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(config).eval()
    with torch.no_grad():  # norm weights away from their initial ones, as a trained model's are
        for name, param in model.named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                param.uniform_(0.5, 1.5)
    model.generation_config.eos_token_id = None  # exactly `new` tokens
    model.generation_config.pad_token_id = 0
    return model.to(device, DTYPE_NAMES[shape.dtype])


def llama_state(decoder: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A Decoder's weights under ``LlamaForCausalLM``'s names (both pair (i, i + d/2))."""
    names = {
        "embed_tokens": "model.embed_tokens",
        "norm": "model.norm",
        "lm_head": "lm_head",
        "attn_norm": "input_layernorm",
        "mlp_norm": "post_attention_layernorm",
        "attn": "self_attn",
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


def row_calls(
    decoder: torch.nn.Module, llama: torch.nn.Module | None, ids: torch.Tensor, new: int, rows: list[str]
) -> dict[str, Callable[[], torch.Tensor]]:
    """One callable per row of ``rows`` that can run here, each returning the ids ``[B, S + new]``."""
    mask = torch.ones_like(ids)
    calls: dict[str, Callable[[], torch.Tensor]] = {
        "rotary dynamic": lambda: decoder.generate(ids, new),
        "rotary static": lambda: decoder.generate(ids, new, cache="static"),
        "rotary static + torch.compile": lambda: decoder.generate(ids, new, capture="compile"),
    }
    if ids.device.type == "cuda":
        calls["rotary static + CUDA graph"] = lambda: decoder.generate(ids, new, capture="cuda_graph")
    if llama is not None:
        hf = dict(attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False)
        calls["HF dynamic"] = lambda: llama.generate(ids, **hf)
        calls[HF_STATIC] = lambda: llama.generate(ids, cache_implementation="static", **hf)
        calls["HF static + torch.compile"] = _hf_compiled(llama, ids, hf)
        if any(name.endswith("rotary.hf.patch") for name in rows):
            import copy

            import rotary

            patched = rotary.hf.patch(copy.deepcopy(llama))
            calls["HF dynamic + rotary.hf.patch"] = lambda: patched.generate(ids, **hf)
            calls["HF static + rotary.hf.patch"] = lambda: patched.generate(ids, cache_implementation="static", **hf)
            calls["HF static + torch.compile + rotary.hf.patch"] = _hf_compiled(patched, ids, hf)
    return {name: calls[name] for name in rows if name in calls}


def _hf_compiled(model: torch.nn.Module, ids: torch.Tensor, hf: dict) -> Callable[[], torch.Tensor]:
    """``generate`` with the static cache and HF's compiled decoding step on any device; raises when
    transformers did not compile.
    """
    from transformers import CompileConfig

    config = CompileConfig()
    config._compile_all_devices = True  # transformers' switch for devices other than accelerators

    def call() -> torch.Tensor:
        out = model.generate(ids, cache_implementation="static", compile_config=config, **hf)
        if getattr(model, "_compiled_call", None) is None:
            raise RuntimeError("transformers did not compile the decoding step on this device")
        return out

    return call


def _timed(call: Callable[[], torch.Tensor], device: torch.device) -> tuple[float, torch.Tensor]:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    out = call()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start, out


def _selected(options: argparse.Namespace, names: tuple[str, ...], kind: str) -> list[str]:
    """The rows of ``names`` that run with these options on this kind of device."""
    rows = [name for name in names if not (kind == "cuda" and name.replace(QWEN3, "HF") in CPU_ONLY)]
    if getattr(options, "no_compile", False) or (
        bool(getattr(options, "quick", False)) and not getattr(options, "compile", False)
    ):
        rows = [name for name in rows if name.replace(QWEN3, "HF") not in COMPILED]
    return rows


def generation_suite(options: argparse.Namespace) -> list[Result]:
    """The generation group (see the module's docstring): one row per way of generating."""
    device, kind = suite_device(options)
    shape = SHAPES["quick" if getattr(options, "quick", False) else kind]
    rows = _selected(options, ROWS, kind)
    with_hf = installed("transformers")
    decoder, llama = build_models(shape, device, with_hf)
    ids = torch.randint(1, shape.vocab, (shape.batch, shape.prompt), generator=torch.Generator().manual_seed(0))
    calls = row_calls(decoder, llama, ids.to(device), shape.new, rows)
    failed = {
        name: "needs transformers (pip install transformers)" for name in rows if name.startswith("HF") and not with_hf
    }
    return _time_rows(shape, shape.describe(), ROWS, HF_STATIC, calls, failed, suite_repeats(options), device)


def qk_norm_generation_suite(options: argparse.Namespace) -> list[Result]:
    """``--suites generation_qk_norm``: Hugging Face's Qwen3 generating, unpatched and patched by
    :func:`rotary.hf.patch` (which fuses QK-norm and the rotation); "vs HF static" is over Qwen3's own static row.
    """
    device, kind = suite_device(options)
    shape = SHAPES["quick" if getattr(options, "quick", False) else kind]
    rows = _selected(options, QK_NORM_ROWS, kind)
    group = f"{shape.describe()}; Qwen3 (QK-norm)"
    if not installed("transformers"):
        failed = dict.fromkeys(rows, "needs transformers (pip install transformers)")
        return _time_rows(shape, group, QK_NORM_ROWS, f"{QWEN3} static", {}, failed, 0, device)
    import copy

    import rotary

    model = build_qwen3(shape, device)
    patched = rotary.hf.patch(copy.deepcopy(model))
    ids = torch.randint(1, shape.vocab, (shape.batch, shape.prompt), generator=torch.Generator().manual_seed(0)).to(
        device
    )
    hf = dict(attention_mask=torch.ones_like(ids), max_new_tokens=shape.new, min_new_tokens=shape.new, do_sample=False)
    calls: dict[str, Callable[[], torch.Tensor]] = {}
    for suffix, m in (("", model), (" + rotary.hf.patch", patched)):
        calls[f"{QWEN3} dynamic{suffix}"] = lambda m=m: m.generate(ids, **hf)
        calls[f"{QWEN3} static{suffix}"] = lambda m=m: m.generate(ids, cache_implementation="static", **hf)
        calls[f"{QWEN3} static + torch.compile{suffix}"] = _hf_compiled(m, ids, hf)
    calls = {name: calls[name] for name in rows}
    return _time_rows(shape, group, QK_NORM_ROWS, f"{QWEN3} static", calls, {}, suite_repeats(options), device)


def _time_rows(
    shape: GenerationShape,
    group: str,
    order: tuple[str, ...],
    static: str,
    calls: dict[str, Callable[[], torch.Tensor]],
    failed: dict[str, str],
    repeats: int,
    device: torch.device,
) -> list[Result]:
    """Each call once (compiling included), then ``repeats`` rounds in turn; a call that raises is a noted row."""
    first: dict[str, float] = {}
    tokens: dict[str, torch.Tensor] = {}
    failed = dict(failed)
    for name, call in calls.items():
        try:
            first[name], out = _timed(call, device)
            tokens[name] = out.cpu()
        except Exception as exc:  # one row that cannot run (e.g. no compiler here) is a note, not the end
            failed[name] = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]
    times: dict[str, list[float]] = {name: [] for name in first}
    for _ in range(repeats):
        for name in first:
            times[name].append(_timed(calls[name], device)[0])
    return _rows(shape, group, order, static, repeats, first, times, tokens, failed)


def _rows(shape, group, order, static, repeats, first, times, tokens, failed) -> list[Result]:
    reference = next(iter(tokens.values()), None)
    medians = {name: statistics.median(values) for name, values in times.items()}
    hf_static = medians.get(static)
    results = []
    for name in [n for n in order if n in medians or n in failed]:
        if name in failed:
            results.append(Result(group, name, False, float("nan"), repeats, note=failed[name], kind="generation"))
            continue
        seconds = medians[name]
        same = (tokens[name] == reference).float().mean().item()  # type: ignore[operator]
        values = {
            "tokens/s": shape.batch * shape.new / seconds,
            "ms per step": seconds / shape.new * 1e3,
            "first call s": first[name],
            "same tokens": same,
        }
        if hf_static:
            values["vs HF static"] = hf_static / seconds
        results.append(Result(group, name, False, seconds, repeats, kind="generation", values=values))
    return results


register_suite("generation", generation_suite, devices=("cpu", "cuda"))
register_suite("generation_qk_norm", qk_norm_generation_suite, devices=("cpu", "cuda"))
