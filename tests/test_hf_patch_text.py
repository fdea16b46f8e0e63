"""rotary.hf.patch on the text families added with the 2026 model types: a tiny model of each (built as
tests/test_hf_architectures.py builds it, the large parts that do not rotate made small there) gives the
same outputs patched as unpatched in fp32, and its module's apply_rotary_pos_emb / rotate_half are Llama's line for
line, so Llama's replacement fits them."""

from __future__ import annotations

import importlib
import inspect
import re
import warnings

import pytest
import torch
import transformers

import rotary
from test_hf_architectures import S, _text_model_class, model_inputs, tiny_config

transformers.logging.set_verbosity_error()

#: the families whose patch this file checks (the others are checked by tests/test_hf_patch.py)
NEW_TEXT = (
    "chameleon csm dbrx deepseek_ocr2_text dia embedding_gemma2_text gradium_phonon_tts granitemoehybrid idefics "
    "jetmoe kyutai_speech_to_text lfm2_moe pocket_tts t5gemma voxtral_realtime_text zamba2"
).split()
#: families whose apply function is their own (partial rotation, fp32, one tensor per call, pairs (2i, 2i+1)):
#: Llama's replacement, or the one of the family whose form they share; checked by their outputs only
OWN_APPLY = (
    "bamba esm evolla phi4_multimodal zaya gemma3n_text gemma4_text diffusion_gemma_text qwen4_exp_text moonshine "
    "longcat_flash step3p5 deepseek_v4"
).split()
NEW_TEXT += OWN_APPLY


def _source(module, name: str) -> str:
    src = inspect.getsource(getattr(module, name))
    src = re.sub(r'""".*?"""', "", src, flags=re.S)
    src = re.sub(r"#.*|@.*\n", "", src)
    return " ".join(src.split())


def test_the_new_families_are_supported():
    assert set(NEW_TEXT) <= set(rotary.hf.SUPPORTED)


@pytest.mark.parametrize("model_type", sorted(set(NEW_TEXT) - set(OWN_APPLY)))
def test_apply_function_is_llamas(model_type):
    llama = importlib.import_module("transformers.models.llama.modeling_llama")
    module = importlib.import_module(rotary.hf.SUPPORTED[model_type].module)
    for name in ("apply_rotary_pos_emb", "rotate_half"):
        assert _source(module, name) == _source(llama, name), f"{model_type}: its {name} is not Llama's"


@pytest.mark.slow
@pytest.mark.parametrize("model_type", NEW_TEXT)
def test_patched_outputs_equal_unpatched(model_type, rotate_calls):
    calls = rotate_calls  # the tensors rotary rotates (tests/conftest.py)
    config = tiny_config(model_type)
    torch.manual_seed(0)
    model = _text_model_class(model_type, config)(config).eval()
    ids = torch.randint(1, 100, (1, S), generator=torch.Generator().manual_seed(1))
    inputs = model_inputs(model_type, config, model, ids)
    inputs.pop("position_ids", None)  # the model's own positions

    def run():
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = model(**inputs)
        return out[0] if isinstance(out, tuple) else next(v for v in out.values() if isinstance(v, torch.Tensor))

    before = run()
    assert not calls
    rotary.hf.patch(model)
    try:
        assert rotary.hf.is_patched(model)
        after = run()
    finally:
        rotary.hf.unpatch(model)
    assert len(calls) >= 2, f"{model_type}: q and k did not go through rotary ({calls})"
    rotated = len(calls)
    assert not rotary.hf.is_patched(model)
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-5)
    assert torch.equal(run(), before)  # unpatched: exactly as before
    assert len(calls) == rotated  # and rotary is no longer called


#: of OWN_APPLY, the families whose transformers function rotates the first r = cos.shape[-1] channels only
PARTIAL = {"deepseek_v4", "step3p5", "bamba", "phi4_multimodal", "zaya", "qwen4_exp_text", "moonshine"}


@pytest.mark.parametrize("model_type", OWN_APPLY)
def test_own_apply_equals_transformers_function(model_type):
    """rotary's replacement gives transformers' own function's output (fp32), on [θ, θ] tables as the models
    build them, over the whole head and (where transformers allows it) its first half only."""
    family = rotary.hf.SUPPORTED[model_type]
    module = importlib.import_module(family.module)
    gen = torch.Generator().manual_seed(2)
    q, k = torch.randn(2, 4, 5, 16, generator=gen), torch.randn(2, 4, 5, 16, generator=gen)
    for r in (16, 8) if model_type in PARTIAL else (16,):
        theta = torch.rand(2, 5, r // 2, generator=gen) * 6
        cos, sin = torch.cat([theta.cos()] * 2, -1), torch.cat([theta.sin()] * 2, -1)
        for name, ours in family.replacements.items():
            theirs = getattr(module, name)
            if model_type == "deepseek_v4":  # one tensor, one angle per pair, the last r channels; and back (-sin)
                c, s_ = theta.cos(), theta.sin()
                torch.testing.assert_close(ours(q, c, s_), theirs(q, c, s_))
                torch.testing.assert_close(ours(q, c, -s_), theirs(q, c, -s_))
                continue
            if model_type in ("gemma3n_text", "gemma4_text", "diffusion_gemma_text"):  # one tensor, [B, S, H, D]
                x = q.transpose(1, 2)
                torch.testing.assert_close(ours(x, cos, sin, unsqueeze_dim=2), theirs(x, cos, sin, unsqueeze_dim=2))
                continue
            for got, want in zip(ours(q, k, cos, sin), theirs(q, k, cos, sin)):
                torch.testing.assert_close(got, want)
            if model_type == "qwen4_exp_text":  # q alone, and its index's pooled keys [N, 1, D] with tables [N, r]
                x = q.transpose(1, 2)
                torch.testing.assert_close(
                    ours(x, cos=cos, sin=sin, unsqueeze_dim=2), theirs(x, cos=cos, sin=sin, unsqueeze_dim=2)
                )
                keys = q[0, :1].transpose(0, 1)  # [5, 1, 16]
                torch.testing.assert_close(ours(keys, cos=cos[0], sin=sin[0]), theirs(keys, cos=cos[0], sin=sin[0]))
