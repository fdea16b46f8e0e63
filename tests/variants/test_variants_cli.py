"""The command line for the variants: ``rotary verify --axial PRESET`` / ``--mixed`` (the N-D relative
property, can fail), ``rotary verify CONFIG`` of a Qwen-VL config (M-RoPE's checks, not a 1-D RoPE's),
``rotary plot axial`` (score against (Δh, Δw)) and ``rotary plot learnable``."""

from __future__ import annotations

import json

import pytest
import torch

from rotary import AxialRoPE, MRoPE, RoPEMixed
from rotary.analysis import verify_axial, verify_mrope
from rotary.tools.cli import main
from rotary.variants import PRESETS

# each distinct figure is drawn once per test process, whichever test asks for it first (conftest.py)
pytestmark = pytest.mark.usefixtures("figures_drawn_once")


def run_json(capsys, *argv: str) -> tuple[int, dict]:
    status = main([*argv, "--json"])
    return status, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("preset", ["dinov3", "cogvideox"])
def test_verify_axial_preset_passes(capsys, preset):
    status, report = run_json(capsys, "verify", "--axial", preset)
    assert status == 0 and report["passed"]
    names = [c["name"] for c in report["checks"]]
    assert (
        sum("depend on the offsets only" in n for n in names)
        == PRESETS[preset].kwargs(PRESETS[preset].head_dim)["axes"] + 1
    )
    assert "fast == block-diagonal N-D matrix" in names


def test_verify_axial_catches_a_rope_that_is_not_relative():
    """The check can fail: tables that depend on the absolute coordinate (here a coordinate squared)."""
    rope = AxialRoPE(16)
    real = rope.coordinates

    def squared(positions, **kwargs):
        c = real(positions, **kwargs)
        return type(c)(c.values**2, c.identity)

    rope.coordinates = squared  # type: ignore[method-assign]
    checks = verify_axial(rope)
    assert any(not c.passed for c in checks if "offsets only" in c.name)
    assert all(c.passed for c in verify_axial(RoPEMixed(16, 2, generator=torch.Generator().manual_seed(0))))


def test_verify_axial_refuses_configuration_flags(capsys):
    assert main(["verify", "--axial", "flux", "--base", "3"]) == 2
    assert "--axial flux takes the preset's configuration; drop --base" in capsys.readouterr().err


def test_verify_mixed_checks_rope_mixed_per_head_and_with_a_preset(capsys):
    status, report = run_json(capsys, "verify", "--mixed", "--heads", "2", "--head-dim", "16", "--seed", "3")
    assert status == 0 and report["passed"] and report["rope"].startswith("RoPEMixed(head_dim=16, num_heads=2")
    names = [c["name"] for c in report["checks"]]
    assert sum("depend on the offsets only" in n for n in names) == 3  # along h, along w, along both
    assert "fast == block-diagonal N-D matrix" in names
    # the same per-head angles as RoPEMixed(16, 2) seeded with --seed: the checks see that module
    mixed = RoPEMixed(16, 2, generator=torch.Generator().manual_seed(3))
    assert [c.worst_error for c in verify_axial(mixed, seed=3)] == [c["worst_error"] for c in report["checks"]]
    status, report = run_json(capsys, "verify", "--axial", "dinov3", "--mixed", "--head-dim", "16")
    names = [c["name"] for c in report["checks"]]
    assert status == 0 and " and RoPEMixed(" in report["rope"]
    assert sum(n.startswith("axial dinov3: ") for n in names) == sum(n.startswith("RoPE-Mixed: ") for n in names) == 7
    assert main(["verify", "--heads", "2"]) == 2
    assert "--heads 2 sets the heads of a RoPE-Mixed: add --mixed" in capsys.readouterr().err
    assert main(["verify", "--mixed", "--base", "3"]) == 2
    assert "--mixed takes RoPE-Mixed's configuration; drop --base" in capsys.readouterr().err
    assert main(["verify", "--mixed", "--head-dim", "18"]) == 2
    assert "rotary_dim divisible by 4" in capsys.readouterr().err


def qwen_vl_config(tmp_path, model_type: str, section: list[int]) -> str:
    """A small Qwen-VL config.json (head_dim 32), as transformers writes it."""
    from helpers import hf_config

    text = dict(
        hidden_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        num_hidden_layers=1,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": section},
    )
    hf_config({"model_type": model_type, "text_config": text}).save_pretrained(tmp_path / model_type)
    return str(tmp_path / model_type / "config.json")


@pytest.mark.parametrize(
    "model_type, section, layout",
    [("qwen2_vl", [4, 6, 6], "chunked"), ("qwen2_5_vl", [4, 6, 6], "chunked"), ("qwen3_vl", [8, 4, 4], "interleaved")],
)
def test_verify_a_qwen_vl_config_checks_mrope(capsys, tmp_path, model_type, section, layout):
    """A multimodal config is verified as M-RoPE (per axis, jointly, against the N-D matrix), not as
    the 1-D RoPE of its text positions that `verify` used to check and pass."""
    path = qwen_vl_config(tmp_path, model_type, section)
    status, report = run_json(capsys, "verify", path, "--seq-len", "16")
    assert status == 0 and report["passed"]
    assert (
        report["rope"].startswith("MRoPE(head_dim=32") and f"mrope_section={section}, layout={layout}" in report["rope"]
    )
    names = [c["name"] for c in report["checks"]]
    moved = [n for n in names if n.startswith("scores depend on (Δt, Δh, Δw) only")]
    assert [n.rsplit("along ", 1)[1].rstrip(")") for n in moved] == ["t", "h", "w", "t, h and w at once"]
    assert "fast == block-diagonal N-D matrix" in names and "text ids (t = h = w) give the 1-D RoPE's tables" in names
    assert f"each slot turns with its own axis only ({layout} mrope_section {section})" in names
    # the same module and checks as the library's, with the config's context as the shift
    mrope = MRoPE.from_hf_config(path)
    want = verify_mrope(mrope, seq_len=16, shift=128000 if model_type == "qwen3_vl" else 32768)
    assert [c.worst_error for c in want] == [c["worst_error"] for c in report["checks"]]
    # flags apply to the M-RoPE too: a head_dim its mrope_section does not fit is refused, naming both
    assert main(["verify", path, "--head-dim", "64"]) == 2
    assert "mrope_section" in capsys.readouterr().err


def test_verify_mrope_can_fail():
    """Each kind of check fails for a module that breaks it."""
    names = lambda checks: {c.name.split(" (")[0] for c in checks if not c.passed}  # noqa: E731
    assert not names(verify_mrope(MRoPE(16, mrope_section=[2, 3, 3]), seq_len=8))
    absolute = MRoPE(16, mrope_section=[2, 3, 3])
    real = absolute.positions
    absolute.positions = lambda ids: real(ids * ids if isinstance(ids, torch.Tensor) else ids)  # type: ignore[method-assign]
    assert "scores depend on" in names(verify_mrope(absolute, seq_len=8))
    swapped = MRoPE(16, mrope_section=[2, 3, 3])
    swapped.inv_freq_axes = swapped.inv_freq_axes[[1, 0, 2]]  # t's slots read h and h's read t
    assert "each slot turns with its own axis only" in names(verify_mrope(swapped, seq_len=8))
    wrong = MRoPE(16, mrope_section=[2, 3, 3])
    wrong.inv_freq_axes = wrong.inv_freq_axes * 1.5  # the slots turn faster than the 1-D RoPE's frequencies
    assert {"text ids", "each slot turns with its own axis only"} <= names(verify_mrope(wrong, seq_len=8))


def test_plot_axial_and_mixed(capsys, tmp_path):
    status, numbers = run_json(
        capsys,
        "plot",
        "axial",
        "--preset",
        "pixtral",
        "--preset",
        "dinov3",
        "--extent",
        "3",
        "-o",
        str(tmp_path / "axial"),
    )
    assert status == 0 and [f.rsplit("/", 1)[-1] for f in numbers["files"]] == ["axial.png", "axial.svg"]
    pixtral, dinov3 = (
        torch.tensor(numbers["scores"][f"{p} (d = 64)"], dtype=torch.float64) for p in ("pixtral", "dinov3")
    )
    assert pixtral.shape == (7, 7) and float(pixtral[3, 3]) == 64.0  # q = k = ones: the dot product at no offset
    torch.testing.assert_close(dinov3, dinov3.T, rtol=0, atol=1e-12)  # the same frequencies on h and w: symmetric
    assert float((pixtral - pixtral.T).abs().max()) > 1.0  # Pixtral's h takes frequencies [::2], w [1::2]
    status, numbers = run_json(
        capsys,
        "plot",
        "axial",
        "--mixed",
        "--heads",
        "2",
        "--head-dim",
        "16",
        "--extent",
        "2",
        "-o",
        str(tmp_path / "mixed"),
    )
    assert (
        status == 0 and len(numbers["scores"]) == 2 and all(k.startswith("RoPE-Mixed head") for k in numbers["scores"])
    )
    assert (tmp_path / "mixed.png").stat().st_size > 1000


def test_plot_learnable_recovers_the_teacher(capsys, tmp_path):
    status, numbers = run_json(capsys, "plot", "learnable", "--steps", "150", "-o", str(tmp_path / "learnable"))
    assert status == 0 and numbers["losses"][-1] < 1e-4 * numbers["losses"][0]
    assert all(abs(f - 0.8) < 1e-3 for f in numbers["learned_factor"])


def test_inspect_axial_preset_names_the_axis_of_every_pair(capsys):
    import json

    from rotary.tools.cli import main
    from rotary.variants import AxialRoPE

    for name in ("pixtral", "cogvideox", "flux"):
        assert main(["inspect", "--axial", name, "--json"]) == 0
        d = json.loads(capsys.readouterr().out)
        rope = AxialRoPE.preset(name)
        assert [p["axis"] for p in d["pairs"]] == list(rope.slot_axes)
        # each axis gets as many pairs as its split gives it channels / 2
        assert [sum(p["axis"] == a for p in d["pairs"]) for a in range(d["axes"])] == [c // 2 for c in d["split"]]
        assert [p["wavelength"] for p in d["pairs"]] == rope.wavelengths.tolist()
    assert main(["inspect", "--axial", "pixtral"]) == 0
    assert "axis" in capsys.readouterr().out
    assert main(["inspect", "--axial", "flux", "--head-dim", "6"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "head_dim must be 128, got 6" in err
