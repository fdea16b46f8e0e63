"""The layout users import from: old module paths keep working after the moves (issue: a codebase a
newcomer can hold in their head)."""

from __future__ import annotations

import importlib

import rotary


def test_old_module_paths_keep_working():
    assert importlib.import_module("rotary.module").RoPE is rotary.RoPE
    assert importlib.import_module("rotary.module") is importlib.import_module("rotary.rope")
    assert importlib.import_module("rotary.config") is importlib.import_module("rotary.hf_config")
    from rotary.apply import apply_rotary, rotate, shares_elements
    from rotary.config import read_hf_config

    assert apply_rotary is rotary.apply_rotary and rotate is rotary.rotate
    assert read_hf_config is rotary.hf_config.read_hf_config
    assert shares_elements is rotary.kernels.overlap.shares_elements
