"""Settings: every numeric flag refuses NaN and infinity, on the command line and in ExperimentConfig."""

from __future__ import annotations

import dataclasses
import math

import pytest

from rotary.tools.cli import main
from rotary.tools.commands.argument_types import positive_float
from rotary.tools.commands.experiment import SETTINGS, _float, _float_list
from rotary.tools.experiments.config import PRESETS, ExperimentConfig, ExperimentError

FLOAT_FLAGS = [name for name, (kind, _) in SETTINGS.items() if kind in (_float, positive_float, _float_list)]
FLOAT_FIELDS = [f.name for f in dataclasses.fields(ExperimentConfig) if f.type in ("float", "tuple[float, ...]")]


def test_the_float_flags_are_the_float_settings():
    assert sorted(FLOAT_FLAGS) == sorted(FLOAT_FIELDS) and len(FLOAT_FLAGS) >= 8


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
@pytest.mark.parametrize("name", FLOAT_FLAGS)
def test_non_finite_flags_are_one_line_and_status_2(capsys, tmp_path, name, value):
    flag = "--" + name.replace("_", "-")
    with pytest.raises(SystemExit) as exc:
        main(["experiment", "--preset", "tiny", "--device", "cpu", "--out", str(tmp_path / "o"), f"{flag}={value}"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"argument {flag}: must be" in err and "finite" in err and value.lstrip("-") in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("value", [math.nan, math.inf])
@pytest.mark.parametrize("name", FLOAT_FIELDS)
def test_non_finite_settings_are_refused_by_validate(name, value):
    default = getattr(ExperimentConfig(), name)
    bad = (value,) * len(default) if isinstance(default, tuple) else value
    config = ExperimentConfig(**{**PRESETS["tiny"], "device": "cpu", name: bad})
    with pytest.raises(ExperimentError, match=name.replace("_", "-")):
        config.validate()


def test_precision_and_compile_flags_reach_the_config_and_its_command():
    from rotary.tools.cli import build_parser
    from rotary.tools.commands.experiment import config_from_args
    from rotary.tools.experiments.reproduce import command_line

    args = build_parser().parse_args(["experiment", "--preset", "tiny", "--precision", "bf16", "--compile", "on"])
    config = config_from_args(args)
    assert (config.precision, config.compile) == ("bf16", "on")
    assert config.mixed_precision("cpu") and config.compiles("cpu")
    assert command_line(config) == "rotary experiment --preset tiny --precision bf16 --compile on"
    default = config_from_args(build_parser().parse_args(["experiment", "--preset", "tiny"]))
    assert (default.precision, default.compile) == ("auto", "off")


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_the_cpu_stays_fp32_and_eager_and_only_the_large_preset_compiles_on_cuda(preset):
    config = ExperimentConfig(**PRESETS[preset])
    assert not config.mixed_precision("cpu") and not config.compiles("cpu")
    assert config.mixed_precision("cuda")
    assert config.compiles("cuda") == (preset == "large")


@pytest.mark.parametrize(("flag", "value"), [("--precision", "fp16"), ("--compile", "yes")])
def test_an_unknown_precision_or_compile_mode_is_one_line_and_status_2(capsys, tmp_path, flag, value):
    with pytest.raises(SystemExit) as exc:
        main(["experiment", "--preset", "tiny", "--out", str(tmp_path / "o"), flag, value])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and f"argument {flag}: invalid choice: '{value}'" in err
    assert not (tmp_path / "o").exists()
    with pytest.raises(ExperimentError, match=flag):
        ExperimentConfig(**{**PRESETS["tiny"], "device": "cpu", flag.strip("-"): value}).validate()
