"""NoPE layers in the Decoder (Llama 4's no_rope_layers and its attention temperature) and p-RoPE."""

from __future__ import annotations

import pytest
import torch

import rotary
from helpers import forbid_torch_path
from rotary.models import POSITION_ENCODINGS, Decoder, DecoderConfig
from rotary.variants import NoPETemperature, default_no_rope_layers, nope_temperature, rope_layer_flags

SMALL = dict(vocab_size=40, hidden_size=32, num_heads=4, num_kv_heads=2)


def test_default_layers_follow_transformers_llama4_and_smollm3():
    import transformers

    for layers in (4, 7, 12):
        llama4 = transformers.Llama4TextConfig(
            num_hidden_layers=layers, hidden_size=16, num_attention_heads=2, head_dim=8
        )
        smollm3 = transformers.SmolLM3Config(num_hidden_layers=layers, hidden_size=16, num_attention_heads=2)
        assert default_no_rope_layers(layers) == llama4.no_rope_layers == smollm3.no_rope_layers
    assert default_no_rope_layers(8) == [1, 1, 1, 0, 1, 1, 1, 0]  # 1 = RoPE: layers 3 and 7 are NoPE


def test_temperature_is_1_below_8191_and_1_0693_at_8191():
    tau = nope_temperature(torch.arange(8192))
    assert bool((tau[:8191] == 1.0).all())
    assert round(float(tau[8191]), 4) == 1.0693
    assert round(float(nope_temperature(torch.tensor([2 * 8192 - 1]))), 4) == 1.1099  # 1 + 0.1 ln 3


def test_temperature_matches_transformers_llama4_attention():
    import transformers
    from transformers import AttentionInterface
    from transformers.models.llama4.modeling_llama4 import Llama4TextAttention

    seen = {}

    def capture(module, query, key, value, attention_mask, **kwargs):
        seen["query"] = query
        return torch.zeros(query.shape[0], query.shape[2], query.shape[1], value.shape[-1]), None

    AttentionInterface.register("rotary_test_capture_query", capture)
    config = transformers.Llama4TextConfig(
        hidden_size=16,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        num_hidden_layers=4,
        intermediate_size=32,
        intermediate_size_mlp=32,
        vocab_size=32,
    )
    config._attn_implementation = "rotary_test_capture_query"
    attention = Llama4TextAttention(config, layer_idx=3)  # a NoPE layer by default
    assert not attention.use_rope

    class Past:  # 8185 tokens already cached: the new ones sit at positions 8185 .. 8196
        def get_seq_length(self, layer_idx):
            return 8185

        def update(self, key, value, layer_idx):
            return key, value

    x = torch.randn(1, 12, 16)
    with torch.no_grad():
        attention(x, None, None, past_key_values=Past())
        plain = attention.q_proj(x).view(1, 12, 2, 8).transpose(1, 2)
    theirs = (seen["query"] / plain)[0, 0, :, 0].double()
    ours = nope_temperature(torch.arange(8185, 8197), floor_scale=config.floor_scale, attn_scale=config.attn_scale)
    torch.testing.assert_close(theirs, ours, rtol=1e-6, atol=0)
    assert theirs[5] == 1.0 and theirs[6] > 1.06  # the step at position 8191


def test_flags_and_their_errors():
    assert rope_layer_flags(None, 3) == [True, True, True]
    assert rope_layer_flags([1, 0, 1], 3) == [True, False, True]
    with pytest.raises(ValueError, match=r"one flag per layer \(3\), 1 = the layer uses RoPE"):
        rope_layer_flags([1, 0], 3)
    with pytest.raises(ValueError, match="one flag per layer"):
        rope_layer_flags([1, 2, 1], 3)
    with pytest.raises(ValueError, match="no_rope_layers must hold one flag per layer"):
        DecoderConfig(**SMALL, num_layers=2, no_rope_layers=[1, 1, 0])
    with pytest.raises(ValueError, match="rotates none; use it with a rotary encoding"):
        Decoder(DecoderConfig(**SMALL, num_layers=4, position_encoding="alibi", no_rope_layers=True))


def test_decoder_layers_switch_rope_off_and_decode_like_the_full_pass():
    torch.manual_seed(0)
    model = Decoder(DecoderConfig(**SMALL, num_layers=4, no_rope_layers=True, no_rope_layer_interval=2)).eval()
    assert model.config.no_rope_layers == [1, 0, 1, 0]
    for i, layer in enumerate(model.layers):
        if i in (1, 3):
            assert isinstance(layer.attn.rope, NoPETemperature)
        else:
            assert layer.attn.rope is model.rope
    ids = torch.randint(40, (2, 9))
    full = model(ids)
    cache = model.new_cache()
    steps = torch.cat(
        [model(ids[:, :4], cache=cache)] + [model(ids[:, i : i + 1], cache=cache) for i in range(4, 9)], dim=1
    )
    torch.testing.assert_close(steps, full, rtol=1e-5, atol=1e-5)
    # rescaling the context touches the RoPE layers only
    model.set_rope_scaling({"rope_type": "linear", "factor": 2.0})
    assert isinstance(model.layers[1].attn.rope, NoPETemperature) and model.layers[2].attn.rope is model.rope
    plain = Decoder(DecoderConfig(**SMALL, num_layers=4, no_rope_layers=True, attn_temperature_tuning=False))
    assert plain.nope is None and plain.layers[3].attn.rope is None


def test_temperature_tables_run_on_the_fused_cpu_kernel(monkeypatch, gen):
    from rotary.kernels import extension

    assert extension.load_cpu_extension() is not None, extension.cpu_extension_error()
    forbid_torch_path(monkeypatch)
    producer = NoPETemperature(16, floor_scale=4)
    ids = torch.tensor([[0, 2, 3, 7, 11], [1, 4, 8, 12, 40]])
    tables = producer.tables(ids)
    q, k = torch.randn(2, 4, 5, 16, generator=gen), torch.randn(2, 2, 5, 16, generator=gen)
    q_out, k_out = rotary.rotate([q, k], tables, kinds=("q", "k"))
    tau = nope_temperature(ids, floor_scale=4).float()  # [B, S]
    assert torch.equal(q_out, q * tau[:, None, :, None]) and torch.equal(k_out, k)  # x·τ + rot(x)·0, keys x·1
    assert float(tau.max()) > 1.0  # the check would see a missing temperature
    # and a whole decoder with NoPE layers (forward and backward) never takes the torch path
    torch.manual_seed(0)
    model = Decoder(DecoderConfig(**SMALL, num_layers=2, no_rope_layers=[1, 0]))
    model.loss(torch.randint(40, (2, 6))).backward()


def test_nope_layers_see_positions_only_through_the_temperature():
    torch.manual_seed(0)
    model = Decoder(DecoderConfig(**SMALL, num_layers=2, no_rope_layers=[0, 0])).eval()  # every layer NoPE
    ids = torch.randint(40, (1, 6))

    def logits(start: int) -> torch.Tensor:
        return model(ids, position_ids=torch.arange(start, start + 6)[None])

    torch.testing.assert_close(logits(100), logits(0), rtol=0, atol=1e-6)  # τ = 1: no position information
    later = logits(9000)  # τ = 1.0693 everywhere: sharper attention, other logits
    assert (later - logits(0)).abs().max() > 1e-4
    no_temperature = Decoder(DecoderConfig(**SMALL, num_layers=2, no_rope_layers=[0, 0], attn_temperature_tuning=False))
    no_temperature.load_state_dict(model.state_dict())
    no_temperature.eval()
    torch.testing.assert_close(
        no_temperature(ids, position_ids=torch.arange(9000, 9006)[None]), logits(0), rtol=0, atol=1e-6
    )


def test_p_rope_is_the_proportional_rope_type():
    assert "p_rope" in POSITION_ENCODINGS
    model = Decoder(
        DecoderConfig(**{**SMALL, "hidden_size": 64}, num_layers=1, position_encoding="p_rope", p_rope_fraction=0.25)
    )
    inv_freq = model.rope.inv_freq
    want = rotary.frequencies(16, scaling={"rope_type": "proportional", "partial_rotary_factor": 0.25}).inv_freq
    assert torch.equal(inv_freq, want)
    # the fastest quarter of the pairs rotates (θ_i = 10000^(-2i/16)), the rest never turns
    assert torch.equal(inv_freq[:2], rotary.frequencies(16).inv_freq[:2]) and bool((inv_freq[2:] == 0).all())
    model.eval()
    ids = torch.randint(40, (1, 6))
    cache = model.new_cache()
    steps = torch.cat(
        [model(ids[:, :3], cache=cache)] + [model(ids[:, i : i + 1], cache=cache) for i in range(3, 6)], dim=1
    )
    torch.testing.assert_close(steps, model(ids), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"p_rope_fraction must be in \(0, 1\], got 0"):
        DecoderConfig(**SMALL, position_encoding="p_rope", p_rope_fraction=0)
    with pytest.raises(
        ValueError, match="'p_rope' is the 'proportional' rope_type; rope_scaling has rope_type 'linear'"
    ):
        Decoder(DecoderConfig(**SMALL, position_encoding="p_rope", rope_scaling={"rope_type": "linear", "factor": 2.0}))


def test_configs_with_nope_layers_are_read():
    import transformers

    from rotary.hf import read_hf_config

    llama4 = transformers.Llama4TextConfig(num_hidden_layers=8, hidden_size=64, num_attention_heads=4, head_dim=16)
    s = read_hf_config(llama4)
    assert s.rope_layers == tuple(bool(v) for v in llama4.no_rope_layers) == (True, True, True, False) * 2
    assert s.nope_temperature == {"floor_scale": llama4.floor_scale, "attn_scale": llama4.attn_scale}
    assert s.interleaved  # Llama 4 rotates pairs (2i, 2i+1)
    # a config.json may leave no_rope_layers empty (Llama 4 then fills it) or give its own
    d = dict(llama4.to_dict(), no_rope_layers=[], no_rope_layer_interval=2, attn_temperature_tuning=False)
    s = read_hf_config(d)
    assert s.rope_layers == (True, False) * 4 and s.nope_temperature is None
    assert read_hf_config(dict(d, no_rope_layers=[1] * 8)).rope_layers == (True,) * 8
    smollm3 = transformers.SmolLM3Config(num_hidden_layers=4, hidden_size=64, num_attention_heads=4)
    s = read_hf_config(smollm3)
    assert s.rope_layers == (True, True, True, False) and s.nope_temperature is None
    assert read_hf_config({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4}).rope_layers is None
    with pytest.raises(
        rotary.ConfigError, match=r"no_rope_layers must be a list of 0/1 flags \(1 = the layer uses RoPE\)"
    ):
        read_hf_config(dict(d, no_rope_layers=[1, 2] * 4))
    with pytest.raises(rotary.ConfigError, match="no_rope_layers has 3 flags but the model has 8 layers"):
        read_hf_config(dict(d, no_rope_layers=[1, 1, 0]))


def test_rotary_inspect_names_the_nope_layers_and_the_temperature(tmp_path, capsys):
    import json

    import transformers

    from rotary.tools.cli import main

    transformers.Llama4TextConfig(num_hidden_layers=8).save_pretrained(tmp_path)
    assert main(["inspect", str(tmp_path / "config.json"), "--max-position", "8192", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["nope_layers"] == [3, 7] and out["num_layers"] == 8
    assert out["nope_temperature"]["floor_scale"] == 8192 and round(out["nope_temperature"]["at_context"], 4) == 1.0693
    assert main(["inspect", str(tmp_path / "config.json"), "--max-position", "8191"]) == 0
    text = " ".join(capsys.readouterr().out.split())  # rich wraps long lines at the terminal's width
    assert "NoPE layers (no rotation) 3, 7 of 8" in text and "1 at position 8190" in text
