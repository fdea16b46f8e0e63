"""Smoke test of benchmarks/generation.py: every row runs on a tiny workload, and the table reports it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "generation.py"


def load():
    spec = importlib.util.spec_from_file_location("generation_benchmark", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = script  # its dataclass looks its module up there
    spec.loader.exec_module(script)
    return script


def test_the_generation_script_times_every_row(capsys):
    pytest.importorskip("transformers")
    script = load()
    rows = ["rotary dynamic", "rotary static", "HF dynamic", "HF static"]
    argv = ["--device", "cpu", "--batch", "2", "--prompt", "5", "--new-tokens", "4", "--repeats", "1", "--methods", ",".join(rows)]
    assert script.main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("cpu: ") and "load average" in out[0]
    assert "batch 2, prompt 5, 4 new tokens" in out[1]
    table = [line.split(" | ") for line in out[out.index("| generation | tokens/s | ms per step | first call (s) | same tokens |") + 2 :]]
    assert [cells[0].lstrip("| ") for cells in table] == rows
    for cells in table:
        tokens_per_s, ms_per_step = float(cells[1].replace(",", "")), float(cells[2])
        assert tokens_per_s > 0 and ms_per_step > 0
        # tokens/s and ms per step describe the same best time: batch * new / (new * ms)
        assert tokens_per_s == pytest.approx(2 / (ms_per_step / 1e3), rel=0.02)
        assert cells[4].rstrip(" |") == "yes"  # fp32 greedy: HF with the same weights picks the same tokens


def test_the_generation_script_refuses_bad_arguments():
    script = load()
    with pytest.raises(SystemExit):
        script.main(["--methods", "rotary paged"])
    with pytest.raises(SystemExit):
        script.main(["--new-tokens", "0"])


def test_llama_state_names_every_weight():
    transformers = pytest.importorskip("transformers")
    script = load()
    shape = script.Shape(layers=1, hidden=32, heads=4, kv_heads=2, intermediate=64, vocab=50, dtype="fp32", batch=1, prompt=2, new=1)
    decoder, llama = script.build_models(shape, __import__("torch").device("cpu"), with_hf=True)
    assert isinstance(llama, transformers.LlamaForCausalLM)
    assert set(script.llama_state(decoder)) == set(llama.state_dict())
