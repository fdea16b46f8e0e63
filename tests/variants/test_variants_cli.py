"""The command line for the vision variants: ``rotary verify --axial PRESET`` (the N-D relative
property, can fail), ``rotary plot axial`` (score against (Δh, Δw)) and ``rotary plot learnable``."""

from __future__ import annotations

import json

import pytest
import torch

from rotary import AxialRoPE, RoPEMixed
from rotary.analysis import verify_axial
from rotary.cli import main
from rotary.variants import PRESETS


def run_json(capsys, *argv: str) -> tuple[int, dict]:
    status = main([*argv, "--json"])
    return status, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("preset", ["dinov3", "cogvideox"])
def test_verify_axial_preset_passes(capsys, preset):
    status, report = run_json(capsys, "verify", "--axial", preset)
    assert status == 0 and report["passed"]
    names = [c["name"] for c in report["checks"]]
    assert sum("depend on the offsets only" in n for n in names) == PRESETS[preset].kwargs(PRESETS[preset].head_dim)["axes"] + 1
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


def test_plot_axial_and_mixed(capsys, tmp_path):
    status, numbers = run_json(capsys, "plot", "axial", "--preset", "pixtral", "--preset", "dinov3", "--extent", "3", "-o", str(tmp_path / "axial"))
    assert status == 0 and [f.rsplit("/", 1)[-1] for f in numbers["files"]] == ["axial.png", "axial.svg"]
    pixtral, dinov3 = (torch.tensor(numbers["scores"][f"{p} (d = 64)"], dtype=torch.float64) for p in ("pixtral", "dinov3"))
    assert pixtral.shape == (7, 7) and float(pixtral[3, 3]) == 64.0  # q = k = ones: the dot product at no offset
    torch.testing.assert_close(dinov3, dinov3.T, rtol=0, atol=1e-12)  # the same frequencies on h and w: symmetric
    assert float((pixtral - pixtral.T).abs().max()) > 1.0  # Pixtral's h takes frequencies [::2], w [1::2]
    status, numbers = run_json(capsys, "plot", "axial", "--mixed", "--heads", "2", "--head-dim", "16", "--extent", "2", "-o", str(tmp_path / "mixed"))
    assert status == 0 and len(numbers["scores"]) == 2 and all(k.startswith("RoPE-Mixed head") for k in numbers["scores"])
    assert (tmp_path / "mixed.png").stat().st_size > 1000


def test_plot_learnable_recovers_the_teacher(capsys, tmp_path):
    status, numbers = run_json(capsys, "plot", "learnable", "--steps", "150", "-o", str(tmp_path / "learnable"))
    assert status == 0 and numbers["losses"][-1] < 1e-4 * numbers["losses"][0]
    assert all(abs(f - 0.8) < 1e-3 for f in numbers["learned_factor"])


def test_inspect_axial_preset_names_the_axis_of_every_pair(capsys):
    import json

    from rotary.cli import main
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
