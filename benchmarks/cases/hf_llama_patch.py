"""Extra `rotary bench` suite: a small random-weight Llama, rotary.hf.patch vs unpatched: the forward,
a training step (forward, cross-entropy loss, backward; the optimiser step is left out, it does not
touch RoPE), and a decoding step (one token after a cached prefix, the cache cut back after each call).

Loaded by `make bench` (every file in benchmarks/cases/ is passed as `--cases`). The whole model
runs, so RoPE is a small part of the time: the ratio shows what patching buys end to end.
Skipped (no rows) when transformers is not installed. `--quick` uses a shorter sequence.
"""

import importlib.util
from pathlib import Path

import torch

from rotary import hf
from rotary.tools import bench

_spec = importlib.util.spec_from_file_location(
    "bench_hf_patch", Path(__file__).resolve().parents[1] / "bench_hf_patch.py"
)
_models = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_models)


def suite(options) -> list[bench.Result]:
    try:
        import transformers  # noqa: F401
    except ImportError:
        return []
    batch, seq = (1, 64) if options.quick else (4, 512)
    unpatched = _models.build_llama(256, 4, 8, 2)
    patched = hf.patch(_models.build_llama(256, 4, 8, 2))
    ids = torch.randint(1000, (batch, seq))
    with torch.no_grad():
        torch.testing.assert_close(patched(ids).logits, unpatched(ids).logits, rtol=1e-4, atol=1e-5)

        def forward(model):
            return lambda: model(ids)

        medians = bench.time_interleaved(
            {"unpatched": forward(unpatched), "patched": forward(patched)}, options.repeats or 3
        )
    group = f"small Llama forward (hidden 256, 4 layers, 8/2 heads) {batch}x{seq} fp32"
    results = _rows(group, medians, False, options.repeats or 3)

    # a training step: the same gradients either way (checked once), then timed
    labels = torch.randint(1000, (batch, seq))
    grads = []
    for model in (unpatched, patched):
        model.zero_grad(set_to_none=True)
        model(ids, labels=labels).loss.backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for g_unpatched, g_patched in zip(*grads):
        torch.testing.assert_close(g_patched, g_unpatched, rtol=1e-4, atol=1e-5)

    def step(model):
        def call():
            model.zero_grad(set_to_none=True)
            model(ids, labels=labels).loss.backward()

        return call

    medians = bench.time_interleaved({"unpatched": step(unpatched), "patched": step(patched)}, options.repeats or 3)
    group = f"small Llama training step (hidden 256, 4 layers, 8/2 heads) {batch}x{seq} fp32"
    results += _rows(group, medians, True, options.repeats or 3)

    # a decoding step: one token after a cached prefix of `seq` tokens; the cache is cut back to the
    # prefix after each call, so every call sees the same cache length (the same logits, checked)
    token = torch.randint(1000, (batch, 1))
    calls, logits = {}, []
    with torch.no_grad():
        for name, model in (("unpatched", unpatched), ("patched", patched)):
            cache = model(ids, use_cache=True).past_key_values

            def decode(model=model, cache=cache):
                out = model(token, past_key_values=cache, use_cache=True)
                cache.crop(-1)
                return out

            first, again = decode().logits, decode().logits
            assert torch.equal(first, again) and cache.get_seq_length() == seq
            logits.append(first)
            calls[name] = decode
        torch.testing.assert_close(logits[1], logits[0], rtol=1e-4, atol=1e-5)
        medians = bench.time_interleaved(calls, options.repeats or 3)
    group = f"small Llama decoding step (hidden 256, 4 layers, 8/2 heads) {batch}x1 after {seq} fp32"
    return results + _rows(group, medians, False, options.repeats or 3)


def _rows(group: str, medians: dict[str, float], backward: bool, repeats: int) -> list[bench.Result]:
    results = []
    for name, label in (("unpatched", "HF Llama, unpatched"), ("patched", "HF Llama, rotary.hf.patch")):
        r = bench.Result(group, label, backward, medians[name], repeats)
        r.ratios["HF eager speedup"] = medians["unpatched"] / medians[name]
        results.append(r)
    return results


bench.register_suite("hf_llama_patch", suite)
