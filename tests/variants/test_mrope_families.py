"""M-RoPE of every vision-language text model of transformers 5.23 (rotary.hf.MROPE_MODELS), against each
model's own rotary embedding and apply function: a tiny text model built from its config class (random
weights, nothing downloaded), positions that differ on every axis, queries and keys rotated by the
model's ``rotary_emb`` + ``apply_rotary_pos_emb`` and by ``MRoPE.from_hf_config`` of the same config.

HunYuan-VL's XD-RoPE is checked against an independent float64 form of its release code (Tencent's
``apply_rotary_pos_emb_xdrope``, also vLLM's); transformers 5.23 lays its four axes out differently
from both, which is not a rotation (see ``test_transformers_hunyuan_vl_is_not_a_rotation_on_image_tokens``).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import warnings

import pytest
import torch

import rotary
from rotary.hf import MROPE_MODELS, PAIRING
from rotary.hf.config import read_hf_config
from rotary.variants import MRoPE

transformers = pytest.importorskip("transformers")
from transformers.models.auto.configuration_auto import CONFIG_MAPPING, model_type_to_module_name  # noqa: E402

TINY = dict(
    hidden_size=64, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
    head_dim=32, vocab_size=128, max_position_embeddings=4096, num_experts=4, num_local_experts=4,
    n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, pad_token_id=0,
)  # fmt: skip


def block(section, **extra):
    return {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": list(section), **extra}


#: per model_type: the config of a tiny text model whose layout is the real one's at a smaller width
#: (GLM-4V / GLM-4.6V / GLM-OCR rotate half the head, Qwen3.5 a quarter, as their checkpoints do)
CASES: dict[str, dict] = {
    "qwen2_5_omni_text": {"rope_parameters": block([4, 6, 6])},
    "qwen2_5_omni_talker": {"rope_parameters": block([4, 6, 6])},
    "paddleocr_vl_text": {"rope_parameters": block([4, 6, 6])},
    "glm4v_text": {"rope_parameters": block([2, 3, 3], partial_rotary_factor=0.5)},
    "glm4v_moe_text": {"rope_parameters": block([2, 3, 3], partial_rotary_factor=0.5)},
    "glm_image_text": {"rope_parameters": block([2, 3, 3], partial_rotary_factor=0.5)},
    "glm_ocr_text": {"rope_parameters": block([2, 3, 3], partial_rotary_factor=0.5)},
    "qwen3_vl_moe_text": {"rope_parameters": block([8, 4, 4])},
    "qwen3_omni_moe_text": {"rope_parameters": block([8, 4, 4])},
    "cosmos3_edge_text": {"rope_parameters": block([8, 4, 4])},
    "qwen3_5_text": {"head_dim": 64, "rope_parameters": block([4, 2, 2], partial_rotary_factor=0.25)},
    "qwen3_5_moe_text": {"head_dim": 64, "rope_parameters": block([4, 2, 2], partial_rotary_factor=0.25)},
    "ernie4_5_vl_moe_text": {"moe_intermediate_size": [32, 32], "rope_parameters": block([6, 6, 4])},
}
NEW = sorted(CASES) + ["hunyuan_vl_text"]


def tiny_config(model_type: str, **extra):
    cls = CONFIG_MAPPING[model_type]
    fields = {f.name for f in dataclasses.fields(cls)}
    kwargs = {k: v for k, v in TINY.items() if k in fields}
    kwargs.update(CASES.get(model_type, {}), **extra)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cls(**kwargs)


def modeling(model_type: str):
    name = model_type_to_module_name(model_type)
    return importlib.import_module(f"transformers.models.{name}.modeling_{name}")


def rotary_embedding(model_type: str, config):
    """The text model's own rotary embedding module (its model class built from ``config``)."""
    module = modeling(model_type)
    for cls in vars(module).values():
        if (
            isinstance(cls, type)
            and issubclass(cls, transformers.PreTrainedModel)
            and cls.__dict__.get("config_class") is type(config)
        ):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model = cls(config)
            emb = getattr(model, "rotary_emb", None) or getattr(getattr(model, "model", None), "rotary_emb", None)
            if emb is not None:
                return emb
    raise AssertionError(f"no model class of {model_type} has a rotary_emb")


def per_axis_ids(axes: int, batch: int, seq_len: int, seed: int = 0) -> torch.Tensor:
    """``[A, B, S]`` ids that differ on every axis (and from one token to the next)."""
    return torch.randint(0, 300, (axes, batch, seq_len), generator=torch.Generator().manual_seed(seed))


def theirs(model_type: str, config, q, k, ids):
    cos, sin = rotary_embedding(model_type, config)(q, ids)
    return modeling(model_type).apply_rotary_pos_emb(q, k, cos, sin)


def fp32_atol(ids: torch.Tensor, x: torch.Tensor) -> float:
    """transformers forms the angles in fp32 (off by up to angle * 2^-24 each); ours are float64."""
    return 2 * float(x.abs().max()) * (int(ids.max()) + 1) * 2.0**-23


@pytest.mark.parametrize("model_type", sorted(CASES))
def test_rotation_matches_the_models_own_rotary_embedding_and_apply(model_type):
    config = tiny_config(model_type)
    mrope = MRoPE.from_hf_config(config)
    gen = torch.Generator().manual_seed(1)
    head_dim = mrope.head_dim
    q, k = torch.randn(2, 2, 9, head_dim, generator=gen), torch.randn(2, 1, 9, head_dim, generator=gen)
    ids = per_axis_ids(3, 2, 9)
    want_q, want_k = theirs(model_type, config, q, k, ids)
    got_q, got_k = mrope(q, k, position_ids=ids)
    torch.testing.assert_close(got_q, want_q, rtol=0, atol=fp32_atol(ids, q))
    torch.testing.assert_close(got_k, want_k, rtol=0, atol=fp32_atol(ids, k))
    # the check can fail: the same rotation with the axes of the positions swapped is far off
    swapped_q, _ = mrope(q, k, position_ids=ids[[1, 2, 0]])
    assert (swapped_q - want_q).abs().max() > 0.1


@pytest.mark.parametrize("model_type", NEW)
def test_rope_from_hf_config_points_at_mrope(model_type):
    config = tiny_config(model_type, **({"rope_parameters": block([4, 4, 4, 4])} if "hunyuan" in model_type else {}))
    with pytest.raises(rotary.ConfigError, match=r"load it with rotary.MRoPE.from_hf_config\(config\)"):
        rotary.RoPE.from_hf_config(config)
    assert model_type in MROPE_MODELS and model_type in PAIRING


def test_default_sections_are_the_models_defaults():
    for model_type in NEW:
        default, _ = MROPE_MODELS[model_type]
        if default is None:
            config = tiny_config(model_type, rope_parameters=block([4, 4, 4, 4]))
        else:  # a head as wide as the default sections need (ERNIE's rotary embedding needs that much)
            partial = CASES[model_type]["rope_parameters"].get("partial_rotary_factor", 1.0)
            head_dim = int(2 * sum(default) / partial)
            extra = {"rope_parameters": block(default, **({"partial_rotary_factor": partial} if partial != 1 else {}))}
            if "head_dim" in {f.name for f in dataclasses.fields(CONFIG_MAPPING[model_type])}:
                extra["head_dim"] = head_dim
            config = tiny_config(model_type, hidden_size=2 * head_dim, **extra)
        config.rope_parameters.pop("mrope_section")  # what the model's rotary embedding falls back to
        if default is None:  # HunYuan-VL: no default, and its model cannot run without sections
            with pytest.raises(rotary.ConfigError, match=r"needs rope_parameters\['mrope_section'\]"):
                read_hf_config(config)
            with pytest.raises(TypeError):
                rotary_embedding(model_type, config)(torch.zeros(1), torch.zeros(1, 1, 2, dtype=torch.int64))
            continue
        assert tuple(rotary_embedding(model_type, config).mrope_section) == default, model_type


# ------------------------------------------------------------------------------------------------
# HunYuan-VL's XD-RoPE


def xdrope_release_form(q: torch.Tensor, ids: torch.Tensor, section: list[int], base: float) -> torch.Tensor:
    """Tencent's ``apply_rotary_pos_emb_xdrope`` in float64, written from its formula: per axis a 1-D
    cos/sin table ``cat(freqs, freqs)`` of the axis' positions, split by ``xdrope_section * 2`` (the list
    repeated: the same sections on both halves), section ``i`` taken from axis ``i % A``, then
    ``q * cos + rotate_half(q) * sin``. q ``[B, H, S, D]``, ids ``[A, B, S]``."""
    d = q.shape[-1]
    inv_freq = (1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float32) / d))).double()  # fp32, as every HF model
    freqs = ids.double()[..., None] * inv_freq  # [A, B, S, D/2]
    emb = torch.cat([freqs, freqs], dim=-1)  # [A, B, S, D]
    parts = emb.split(section * 2, dim=-1)
    angle = torch.cat([m[i % len(section)] for i, m in enumerate(parts)], dim=-1)[:, None]  # [B, 1, S, D]
    x = q.double()
    half = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], dim=-1)
    return x * angle.cos() + half * angle.sin()


@pytest.mark.parametrize("section", [[4, 4, 4, 4], [2, 6, 4, 4], [6, 5, 5]])
def test_xdrope_equals_the_release_form_in_float64(section):
    config = tiny_config("hunyuan_vl_text", rope_parameters=block(section))
    mrope = MRoPE.from_hf_config(config)
    assert mrope.num_axes == len(section)
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(2, 2, 9, 32, generator=gen, dtype=torch.float64)
    ids = per_axis_ids(len(section), 2, 9, seed=3)
    got, _ = mrope(q, q, position_ids=ids)
    torch.testing.assert_close(got, xdrope_release_form(q, ids, section, 10000.0), rtol=0, atol=1e-12)


def test_xdrope_reads_its_legacy_key_and_float_sections():
    config = {
        "model_type": "hunyuan_vl_text",
        "hidden_size": 128,
        "num_attention_heads": 4,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "xdrope_section": [4.0, 4.0, 4.0, 4.0]},
    }
    assert MRoPE.from_hf_config(config).slot_axes() == "0000111122223333"


def test_xdrope_equals_transformers_on_text_positions():
    config = tiny_config("hunyuan_vl_text", rope_parameters=block([4, 4, 4, 4]))
    gen = torch.Generator().manual_seed(4)
    q, k = torch.randn(1, 2, 9, 32, generator=gen), torch.randn(1, 1, 9, 32, generator=gen)
    ids = torch.randint(0, 300, (1, 1, 9), generator=gen).expand(4, 1, 9)
    want_q, want_k = theirs("hunyuan_vl_text", config, q, k, ids)
    got_q, got_k = MRoPE.from_hf_config(config)(q, k, position_ids=ids)
    torch.testing.assert_close(got_q, want_q, rtol=0, atol=fp32_atol(ids, q))
    torch.testing.assert_close(got_k, want_k, rtol=0, atol=fp32_atol(ids, k))


def test_transformers_hunyuan_vl_is_not_a_rotation_on_image_tokens():
    """transformers 5.23 splits ``cat(freqs, freqs)`` by ``[2 * s for s in sections]``: channel c and its
    partner c + D/2 then read different axes, and the map is not a rotation (it changes norms) where the
    axes differ. rotary keeps the release code's layout, a rotation; both agree on text tokens."""
    config = tiny_config("hunyuan_vl_text", rope_parameters=block([4, 4, 4, 4]))
    q = torch.randn(1, 1, 9, 32, generator=torch.Generator().manual_seed(5), dtype=torch.float32)
    ids = per_axis_ids(4, 1, 9, seed=6)
    want, _ = theirs("hunyuan_vl_text", config, q, q, ids)
    got, _ = MRoPE.from_hf_config(config)(q, q, position_ids=ids)
    torch.testing.assert_close(got.norm(dim=-1), q.norm(dim=-1), rtol=1e-5, atol=0)
    assert (want.norm(dim=-1) - q.norm(dim=-1)).abs().max() > 1e-2


def test_the_docs_table_says_what_the_tables_say():
    import pathlib
    import re

    doc = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "variants.md").read_text()
    start = doc.index("| model_type | layout | default `mrope_section` | pairs |")
    rows = re.findall(r"^\| `(\w+)` \| `(\w+)` \| (.+?) \| (.+?) \|$", doc[start : doc.index("\n\n", start)], re.M)
    want = {
        t: (
            layout,
            f"`{list(section)}`" if section else "none: the config states it",
            "(2i, 2i+1)" if PAIRING[t] == "interleaved" else "(i, i + r/2)",
        )
        for t, (section, layout) in MROPE_MODELS.items()
    }
    assert {t: (layout, section, pairs) for t, layout, section, pairs in rows} == want


@pytest.mark.parametrize(
    "model_type, section, layout, moved",
    [
        ("ernie4_5_vl_moe_text", [6, 6, 4], "paired_hw", ["t", "h", "w", "t, h and w at once"]),
        (
            "hunyuan_vl_text",
            [4, 4, 4, 4],
            "chunked",
            ["axis 0", "axis 1", "axis 2", "axis 3", "axis 0, axis 1, axis 2 and axis 3 at once"],
        ),
    ],
)
def test_rotary_verify_and_inspect_build_the_models_layout(capsys, tmp_path, model_type, section, layout, moved):
    import json

    from rotary.tools.cli import main

    path = tmp_path / "config.json"
    path.write_text(
        json.dumps(
            {"model_type": model_type, "hidden_size": 64, "num_attention_heads": 2, "rope_parameters": block(section)}
        )
    )
    assert main(["verify", str(path), "--seq-len", "16", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    names = [c["name"] for c in report["checks"]]
    assert report["passed"] and f"each slot turns with its own axis only ({layout} mrope_section {section})" in names
    assert [n.rsplit("along ", 1)[1].rstrip(")") for n in names if "tokens moved" in n] == moved
    assert main(["inspect", str(path), "--json"]) == 0
    inspected = json.loads(capsys.readouterr().out)
    mrope = MRoPE.from_hf_config(str(path))
    assert json.dumps({"layout": layout, "axes": mrope.slot_axes()})[1:-1] in json.dumps(inspected)


def test_hunyuan_ocr_xdrope_type_reads_as_transformers_renames_it():
    """HunyuanOCR's config.json says ``"type": "xdrope"``, which transformers' config class renames "dynamic"
    (with ``alpha``: NTK by alpha, static; without: dynamic NTK, which M-RoPE refuses by name)."""
    config = {
        "model_type": "hunyuan_vl_text",
        "hidden_size": 1024,
        "num_attention_heads": 16,
        "rope_theta": 1e4,
        "rope_scaling": {"type": "xdrope", "factor": 1.0, "xdrope_section": [8, 8, 8, 8]},
    }
    assert read_hf_config(config).scaling["rope_type"] == "dynamic"
    with pytest.raises(
        rotary.ConfigError, match="rope_type 'dynamic' changes the frequencies with the sequence length"
    ):
        MRoPE.from_hf_config(config)
    want = transformers.HunYuanVLTextConfig(**{k: v for k, v in config.items() if k != "model_type"})
    assert want.rope_parameters["rope_type"] == "dynamic"


# ------------------------------------------------------------------------------------------------
# rotary.hf.patch on the text models


def text_model(model_type: str, config):
    module = modeling(model_type)
    for cls in vars(module).values():
        if (
            isinstance(cls, type)
            and issubclass(cls, transformers.PreTrainedModel)
            and cls.__dict__.get("config_class") is type(config)
            and hasattr(cls, "get_input_embeddings")
            and "input_ids" in inspect.signature(cls.forward).parameters
            and not hasattr(cls, "generate") | hasattr(cls, "lm_head")
        ):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.manual_seed(0)
                return cls(config).eval()
    raise AssertionError(model_type)


PATCHED = sorted(t for t in CASES if t != "qwen2_5_omni_talker") + ["qwen2_5_omni_talker"]


@pytest.mark.parametrize("model_type", PATCHED)
def test_hf_patch_gives_the_same_hidden_states_with_per_axis_positions(model_type, monkeypatch):
    extra = {"embedding_size": 64} if "talker" in model_type else {}
    if model_type.startswith("qwen3_5"):  # attention layers (its default pattern starts with linear-attention ones)
        extra["layer_types"] = ["full_attention", "linear_attention"]
    config = tiny_config(model_type, num_hidden_layers=2, **extra)
    config._attn_implementation = "eager"
    model = text_model(model_type, config)
    ids = torch.randint(1, 100, (2, 9), generator=torch.Generator().manual_seed(3))
    position_ids = per_axis_ids(3, 2, 9, seed=4)
    inputs = {"position_ids": position_ids, "use_cache": False}
    inputs |= {"inputs_embeds": torch.randn(2, 9, 64)} if "talker" in model_type else {"input_ids": ids}
    calls = []
    rotate = rotary.hf.patching.rotate
    with torch.no_grad():
        before = model(**inputs).last_hidden_state
        monkeypatch.setattr(rotary.hf.patching, "rotate", lambda *a, **k: calls.append(1) or rotate(*a, **k))
        run_plan = rotary.rotation.run_plan  # a later layer's call with the same signature: its recorded plan
        monkeypatch.setattr(
            rotary.rotation, "run_plan", lambda *a: (lambda o: o and calls.append(1) or o)(run_plan(*a))
        )
        rotary.hf.patch(model)
        patched = model(**inputs).last_hidden_state
        attention_layers = sum(1 for m in model.modules() if rotary.hf.patching._MARK in m.__dict__)
        assert attention_layers >= 1 and len(calls) == attention_layers  # every text attention, through rotary
        torch.testing.assert_close(patched, before, rtol=1e-5, atol=1e-5)
        rotary.hf.unpatch(model)
        assert torch.equal(model(**inputs).last_hidden_state, before)


def test_hf_patch_refuses_hunyuan_vl():
    config = tiny_config("hunyuan_vl_text", rope_parameters=block([4, 4, 4, 4]))
    with pytest.raises(rotary.errors.InputError, match="does not support model_type 'hunyuan_vl_text'"):
        rotary.hf.patch(text_model("hunyuan_vl_text", config))
