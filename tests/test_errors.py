"""rotary.errors: every check raises an InputError (a ValueError), a wrong type an InputTypeError (also a
TypeError); a sample of bad calls across the modules says so."""

from __future__ import annotations

import pytest
import torch

import rotary
from rotary import positions as P
from rotary.errors import ConfigError, InputError, InputTypeError
from rotary.models import DecoderConfig
from rotary.nn import RotaryAttention

Q = torch.randn(1, 2, 4, 8)
LLAMA = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4}

#: (module, bad call) -> an InputError that is not a TypeError
BAD_VALUES = {
    "frequencies: odd head_dim": lambda: rotary.frequencies(7),
    "rope_types: unknown rope_type": lambda: rotary.frequencies(64, scaling={"rope_type": "no-such-type"}),
    "rope_types: empty name": lambda: rotary.register_rope_type(""),
    "rope: negative base": lambda: rotary.RoPE(64, base=-1),
    "positions: negative id": lambda: P.from_ids(torch.tensor([[-1, 0]])),
    "rotation: tables wider than the head": lambda: rotary.rotate([Q], rotary.RoPE(16).tables(P.arange(4))),
    "functional: tables shorter than x": lambda: rotary.apply_rotary(Q, torch.ones(2, 8), torch.zeros(2, 8)),
    "tables: all-zero tables": lambda: rotary.check_tables(torch.zeros(4, 8), torch.zeros(4, 8), interleaved=False),
    "pairing: odd head_dim": lambda: rotary.to_half(torch.randn(3, 7)),
    "pairing: unknown target": lambda: rotary.permute_qk_weight(torch.randn(16, 4), 8, to="sideways"),
    "hf_config: negative rope_theta": lambda: rotary.RoPE.from_hf_config({**LLAMA, "rope_theta": -5}),
    "variants.axial: no axes": lambda: rotary.AxialRoPE(64, axes=0),
    "variants.mrope: sections that do not fill the head": lambda: rotary.MRoPE(64, mrope_section=[1, 2]),
    "variants.xpos: odd head_dim": lambda: rotary.XPos(7),
    "variants.mixed: no heads": lambda: rotary.RoPEMixed(64, 0),
    "nn.attention: heads that do not divide the width": lambda: RotaryAttention(64, 5),
    "models.decoder: empty vocabulary": lambda: DecoderConfig(vocab_size=0),
    "analysis: negative distance": lambda: rotary.analysis.decay_bound(8, [-1]),
    "qk_norm: weight of the wrong width": lambda: rotary.rmsnorm_rotate(
        Q, Q, torch.ones(4), torch.ones(8), rotary.RoPE(8)
    ),
    "reference: coordinates for the wrong number of axes": lambda: rotary.reference.rotation_matrix_nd(
        8, torch.ones(2, 2), [1.0]
    ),
}

#: (module, call with an argument of the wrong type) -> an InputTypeError
BAD_TYPES = {
    "rope: interleaved as a string": lambda: rotary.RoPE(64, interleaved="false"),
    "rope_types: keys as one string": lambda: rotary.register_rope_type("x", required="factor"),
    "frequencies: the block is read-only": lambda: rotary.frequencies(
        64, scaling={"rope_type": "linear", "factor": 2.0}
    ).scaling.__setitem__("factor", 3),
    "positions: a list": lambda: P.from_ids([[0, 1]]),
    "positions: float ids": lambda: P.from_ids(torch.tensor([[0.5, 1.0]])),
    "tables: cos as a list": lambda: rotary.RotaryTables([1.0], [0.0], False),
    "functional: x as a list": lambda: rotary.apply_rotary([1.0], torch.ones(4, 8), torch.zeros(4, 8)),
    "hf_config: a number for a config": lambda: rotary.RoPE.from_hf_config(42),
    "nn.attention: rope as a string": lambda: RotaryAttention(64, 4, rope="yes"),
    "qk_norm: eps as a tensor": lambda: rotary.rmsnorm_rotate(
        Q, Q, torch.ones(8), torch.ones(8), rotary.RoPE(8), eps=torch.tensor(1e-6)
    ),
    "hf: not a transformers model": lambda: rotary.hf.patch(object()),
}


@pytest.mark.parametrize("call", BAD_VALUES.values(), ids=BAD_VALUES.keys())
def test_a_bad_value_is_an_input_error(call):
    with pytest.raises(InputError) as raised:
        call()
    assert not isinstance(raised.value, TypeError), type(raised.value)
    assert isinstance(raised.value, ValueError)  # code that catches ValueError keeps working


@pytest.mark.parametrize("call", BAD_TYPES.values(), ids=BAD_TYPES.keys())
def test_a_wrong_type_is_an_input_type_error(call):
    with pytest.raises(InputTypeError) as raised:
        call()
    assert isinstance(raised.value, TypeError) and isinstance(raised.value, InputError)


def test_the_kinds_of_input_error_and_where_they_are_exported():
    assert issubclass(InputError, ValueError) and not issubclass(InputError, TypeError)
    assert issubclass(InputTypeError, InputError) and issubclass(InputTypeError, TypeError)
    assert issubclass(ConfigError, InputError)
    assert (rotary.InputError, rotary.InputTypeError, rotary.ConfigError) == (InputError, InputTypeError, ConfigError)
    assert not hasattr(rotary, "DeviceInputError") and not hasattr(rotary, "check_device_errors")  # no flags to poll
    assert rotary.rope_types.ConfigError is ConfigError and rotary.hf.config.ConfigError is ConfigError
    with pytest.raises(ConfigError):  # a Hugging Face config that cannot be right
        rotary.RoPE.from_hf_config({**LLAMA, "rope_scaling": {"rope_type": "linear"}})


def test_no_bare_value_or_type_error_is_raised_in_the_library():
    """Every raise of a ValueError or TypeError in src/ is one of the InputError kinds; the one exception is the
    kernel contract's own field check, a bug in rotary if it fires."""
    import re
    from pathlib import Path

    src = Path(rotary.__file__).resolve().parent
    found = [
        f"{path.relative_to(src)}:{number}: {line.strip()}"
        for path in sorted(src.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\braise (ValueError|TypeError)\b", line) and "Rotation has no field" not in line
    ]
    assert not found, found
