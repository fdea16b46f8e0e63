"""``rotary.hf.patch`` where users compile and generate: no graph breaks in a patched forward (dynamic
and static cache), and patched generation equal to unpatched, token for token (fp32, greedy), with
Hugging Face's dynamic and static caches. Models are built from configs with random weights."""

from __future__ import annotations

import pytest
import torch

import rotary

transformers = pytest.importorskip("transformers")

FAMILIES = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
}


def _model(family: str, seed: int = 0, layers: int = 2):
    """A tiny model of ``family``: two layers, where the second replays the plan the first recorded (eager); one
    for dynamo, which traces every layer through the same plain-torch branch of the patched apply (no plans)."""
    config_cls, model_cls = FAMILIES[family]
    config = config_cls(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    torch.manual_seed(seed)
    return model_cls(config).eval(), config


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("static", [False, True])
def test_a_patched_forward_has_no_graph_break(family, static):
    model, config = _model(family, layers=1)
    rotary.hf.patch(model)
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    kwargs = {}
    if static:
        kwargs = dict(past_key_values=transformers.StaticCache(config=config, max_cache_len=32), use_cache=True)
    torch._dynamo.reset()
    with torch.no_grad():
        explained = torch._dynamo.explain(model)(ids, **kwargs)
    assert explained.graph_break_count == 0, [str(b.reason) for b in explained.break_reasons]
    assert explained.graph_count == 1


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("cache_implementation", [None, "static"])
def test_patched_generation_equals_unpatched(family, cache_implementation):
    prompt = torch.randint(0, 64, (2, 6), generator=torch.Generator().manual_seed(2))
    outputs = []
    for patched in (False, True):
        model, _ = _model(family)
        if patched:
            rotary.hf.patch(model)
        kwargs = dict(max_new_tokens=8, do_sample=False, pad_token_id=0)
        if cache_implementation:
            kwargs["cache_implementation"] = cache_implementation
        with torch.no_grad():
            outputs.append(model.generate(prompt, attention_mask=torch.ones_like(prompt), **kwargs))
    assert torch.equal(outputs[0], outputs[1])
    assert outputs[0].shape == (2, 14)
    assert outputs[0][:, 6:].unique().numel() > 2  # a continuation that could differ, not one repeated token


def test_a_compiled_patched_llama_rotates_with_plain_torch_that_inductor_can_fuse():
    """Under torch.compile the patched half-pairing apply traces as plain torch operations (no rotary
    custom op in the graph), so Inductor fuses it with its neighbours; the logits equal the eager
    patched model's (fp32)."""
    model, _ = _model("llama", layers=1)
    rotary.hf.patch(model)
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(3))
    targets: list[str] = []

    def recording(gm, example_inputs):
        targets.extend(str(node.target) for node in gm.graph.nodes if node.op == "call_function")
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        eager = model(ids).logits
        compiled = torch.compile(model, backend=recording, fullgraph=True)(ids).logits
    assert targets and not [t for t in targets if "rotary" in t], [t for t in targets if "rotary" in t]
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)
