"""docs/models.md and README's count are what rotary.hf.coverage generates from the tables in the code."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("transformers")

from rotary.hf import coverage  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_docs_models_md_is_the_generated_table():
    with open(os.path.join(ROOT, "docs", "models.md"), encoding="utf-8") as fh:
        committed = fh.read()
    assert committed == coverage.markdown(), "docs/models.md is stale: run python -m rotary.hf.coverage --write"


def test_readme_states_the_generated_count():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as fh:
        readme = " ".join(fh.read().split())
    assert coverage.summary() in readme, f"README.md should say: {coverage.summary()}"


def test_every_rope_model_type_has_a_producer_or_a_reason():
    rows = coverage.coverage()
    assert len(rows) == len(coverage.rope_model_types()) > 300
    unplaced = [r.model_type for r in rows if r.producer is None and r.reason == "is not in rotary's tables"]
    assert not unplaced, f"model types in no table: {unplaced}"
    built = {r.model_type: r.producer for r in rows if r.producer}
    assert built["llama"] == "RoPE.from_hf_config" and built["qwen2_vl_text"] == "MRoPE.from_hf_config"
    assert built["gemma3"] == "RoPE.from_hf_config"  # a wrapper, read through its text_config
    assert next(r for r in rows if r.model_type == "gemma3").via == "gemma3_text"
    assert "nanochat" not in built
