"""The command line that reproduces a run, and the settings in which a stored run differs from this command."""

from __future__ import annotations

import dataclasses
from typing import Any

from .config import PRESETS, ExperimentConfig

__all__ = ["command_line", "differences"]


def differences(stored: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Settings whose values differ, each as ``"name: run has A, this command B"``.

    Example:
        >>> differences({"steps": 40, "seed": 0}, {"steps": 80, "seed": 0})
        ['steps: the run has 40, this command 80']
    """
    out = []
    for key in sorted(set(stored) | set(current)):
        a, b = stored.get(key, "(absent)"), current.get(key, "(absent)")
        if a != b:
            out.append(f"{key}: the run has {a!r}, this command {b!r}")
    return out


def _format(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return ",".join(_format(v) for v in value)
    return str(value)


def command_line(config: ExperimentConfig) -> str:
    """The ``rotary experiment`` command reproducing ``config``: its preset and every setting differing from it.

    >>> command_line(ExperimentConfig(**{**PRESETS["tiny"], "steps": 30, "device": "cpu"}))
    'rotary experiment --preset tiny --steps 30 --device cpu'
    """
    import shlex

    preset = dict(PRESETS[config.preset])
    preset["train_length"] = config.train_length  # so the derived lengths compare equal
    base = ExperimentConfig(**preset)
    parts = ["rotary", "experiment", "--preset", config.preset]
    if config.train_length != PRESETS[config.preset].get("train_length", ExperimentConfig.train_length):
        parts += ["--train-length", str(config.train_length)]
    for f in dataclasses.fields(config):
        if f.name in ("preset", "train_length"):
            continue
        value = getattr(config, f.name)
        if value != getattr(base, f.name) and value is not None:
            flag = "--" + f.name.replace("_", "-")
            parts += [flag, *value] if f.name == "data" else [flag, _format(value)]
    return shlex.join(parts)
