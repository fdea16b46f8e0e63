"""rotary export: an experiment model as a transformers checkpoint computes the model's own logits."""

import dataclasses

import pytest
import torch

from rotary.models import Decoder, DecoderConfig
from rotary.tools.cli import main
from rotary.tools.experiments.config import ExperimentConfig
from rotary.tools.experiments.plan import model_specs
from rotary.tools.experiments.train import CHECKPOINT, CHECKPOINT_FORMAT, build_model
from rotary.tools.sweep.export import ExportError, hf_config_of, to_hf_state_dict

transformers = pytest.importorskip("transformers")

CONFIG = ExperimentConfig(preset="tiny", train_length=64, hidden_size=32, num_layers=2, num_heads=2, seeds=1)


def save_run_model(root, encoding="rope"):
    """A run's model directory, as rotary experiment writes it (weights as initialised: any weights do)."""
    spec = next(s for s in model_specs(CONFIG) if s.encoding == encoding)
    model = build_model(spec, CONFIG)
    directory = root / "run" / "models" / spec.name
    directory.mkdir(parents=True)
    payload = {
        "format": CHECKPOINT_FORMAT,
        "spec": dataclasses.asdict(spec),
        "config": CONFIG.to_dict(),
        "step": 1,
        "model": model.state_dict(),
        "optimizer": {},
        "losses": [0.0],
        "seconds": 0.0,
    }
    torch.save(payload, directory / CHECKPOINT)
    return directory, model.eval()


def hf_model_of(model: Decoder):
    config = hf_config_of(model, 64)
    hf = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config))
    missing, unexpected = hf.load_state_dict(to_hf_state_dict(model), strict=False)
    assert set(missing) <= {"lm_head.weight"} and not unexpected
    return hf.eval()


def test_export_cli_writes_a_checkpoint_with_the_models_logits_and_a_byte_tokenizer(tmp_path, capsys):
    source, model = save_run_model(tmp_path)
    assert main(["export", str(source), str(tmp_path / "out")]) == 0
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    text = "The pass key is 41279. é\n\x00"
    ids = torch.tensor([tokenizer(text)["input_ids"]])
    assert ids[0].tolist() == list(text.encode())
    assert tokenizer.decode(ids[0]) == text
    with torch.no_grad():
        assert torch.allclose(hf(ids).logits, model(ids), atol=1e-5, rtol=0)
    assert (tmp_path / "out" / "model.safetensors").is_file()
    # an existing checkpoint is never overwritten
    assert main(["export", str(source), str(tmp_path / "out")]) == 2
    assert "already exists" in capsys.readouterr().err


@pytest.mark.parametrize(
    "config",
    [
        dict(rope_interleaved=True, num_kv_heads=1, tie_word_embeddings=True),
        dict(rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}),
        dict(rope_scaling={"rope_type": "ntk", "factor": 4.0}),
        dict(position_encoding="none"),
    ],
    ids=["interleaved-gqa-tied", "yarn", "ntk", "nope"],
)
def test_logits_equal_for_pairing_scaling_gqa_tying_and_nope(config):
    torch.manual_seed(0)
    model = Decoder(DecoderConfig(hidden_size=32, num_layers=2, num_heads=4, max_position=256, **config)).eval()
    for p in model.parameters():  # norms away from 1, so a misplaced norm weight shows
        p.data.add_(torch.randn_like(p) * 0.05)
    ids = torch.randint(256, (2, 200))  # past the yarn model's original length
    with torch.no_grad():
        assert torch.allclose(hf_model_of(model)(ids).logits, model(ids), atol=2e-5, rtol=0)


def test_encodings_without_a_llama_equivalent_are_refused_by_name(tmp_path, capsys):
    with pytest.raises(ExportError, match="position_encoding='alibi' has no transformers Llama equivalent"):
        hf_config_of(Decoder(DecoderConfig(hidden_size=32, num_layers=1, num_heads=2, position_encoding="alibi")), 64)
    assert main(["export", str(tmp_path / "missing"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no checkpoint.pt there" in err and not (tmp_path / "out").exists()
