"""The analysis subcommands end to end: ``rotary inspect / plot / verify / report``.

The commands run in process (``helpers.run_main``: ``rotary.tools.cli.main`` with its output captured),
where a traceback shows up as an exception instead of exit status 1; the real entry point,
``python -m rotary`` in a subprocess, is checked for a success (JSON on stdout, status 0), a usage error
(one line, status 2) and a reader that closes the pipe early (status 0, nothing said).
"""

from __future__ import annotations

import base64
import json
import math
import os
import struct
import subprocess
import sys
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest

import rotary
from helpers import FIXTURES, ROOT, leaf_parsers, run_cli, run_main
from rotary import analysis
from rotary.tools.cli import main

# each distinct figure is drawn once per test process, whichever test asks for it first (conftest.py)
pytestmark = pytest.mark.usefixtures("figures_drawn_once")


def run(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    """``rotary *argv`` in process, asserted to exit 0."""
    return run_main(*argv, cwd=cwd)


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    width, height = struct.unpack(">II", data[16:24])  # IHDR
    assert width > 300 and height > 200, (path, width, height)


def assert_svg(path: Path) -> None:
    root = ET.parse(path).getroot()
    assert root.tag.endswith("svg"), path


def assert_figures(files: list[str], cwd: Path) -> None:
    assert files
    for f in files:
        p = cwd / f
        assert p.is_file(), p
        (assert_png if p.suffix == ".png" else assert_svg)(p)


def test_inspect_json_pair_0_wavelength_is_2pi(tmp_path):
    # the real entry point, in a subprocess: status 0, no traceback, the JSON on stdout
    proc = run_cli("inspect", "--head-dim", "64", "--max-position", "4096", "--json", cwd=tmp_path, timeout=300)
    out = json.loads(proc.stdout)
    assert out["pairs"][0]["wavelength"] == pytest.approx(2 * math.pi)
    assert out["pairs"][31]["wavelength"] == pytest.approx(2 * math.pi * 10000 ** (62 / 64), rel=1e-6)
    assert out["context"] == 4096 and out["attention_scaling"] == 1.0
    assert {p["kind"] for p in out["pairs"]} == {"unchanged"}
    assert any("never complete a turn" in w for w in out["warnings"])


def test_inspect_llama_3_1_names_the_interpolated_pairs(tmp_path):
    out = json.loads(run("inspect", str(FIXTURES / "llama3_1.json"), "--json", cwd=tmp_path).stdout)
    assert (out["rope_type"], out["head_dim"], out["context"]) == ("llama3", 128, 131072)
    # Llama 3.1: wavelengths above original / low_freq_factor = 8192 tokens are divided by factor 8,
    # those below original / high_freq_factor = 2048 kept, the rest smoothly blended
    wavelengths = [2 * math.pi * 500000.0 ** (2 * i / 128) for i in range(64)]
    assert out["interpolated_pairs"] == [i for i, w in enumerate(wavelengths) if w > 8192]
    assert out["extrapolated_pairs"] == [i for i, w in enumerate(wavelengths) if w < 2048]
    assert out["blended_pairs"] == [i for i, w in enumerate(wavelengths) if 2048 <= w <= 8192]
    assert all(out["pairs"][i]["factor"] == pytest.approx(8.0, rel=1e-6) for i in out["interpolated_pairs"])
    # and the table renders
    text = run("inspect", str(FIXTURES / "llama3_1.json"), cwd=tmp_path).stdout
    assert "interpolated" in text and "blended" in text and "warning:" in text


def test_verify_reports_every_check(tmp_path):
    out = json.loads(
        run("verify", "--head-dim", "32", "--interleaved", "--seq-len", "16", "--json", cwd=tmp_path).stdout
    )
    assert out["passed"] is True and len(out["checks"]) == 8
    assert all(c["worst_error"] <= c["tolerance"] for c in out["checks"])


def test_verify_exits_1_when_a_check_fails(monkeypatch, capsys):
    from rotary.tools.commands import verify as verify_cmd

    monkeypatch.setattr(verify_cmd, "verify", lambda *a, **k: [analysis.Check("broken", 1.0, 0.0)])
    assert main(["verify", "--head-dim", "8"]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_plot_decay_numbers_and_files(tmp_path):
    out = json.loads(
        run(
            "plot",
            "decay",
            "--measured",
            "--max-distance",
            "64",
            "--samples",
            "8",
            "-o",
            "figs/decay",
            "--json",
            cwd=tmp_path,
        ).stdout
    )
    assert out["files"] == ["figs/decay.png", "figs/decay.svg"]
    assert_figures(out["files"], tmp_path)
    assert out["bound"][0] == pytest.approx(32.5) and len(out["bound"]) == 65
    assert out["measured_ones"][0] == pytest.approx(128.0)  # q = k = ones: Σ 2 cos 0 over 64 pairs


def test_plot_scaling_yarn_blended_range(tmp_path):
    out = json.loads(
        run(
            "plot", "scaling", "--rope-type", "yarn", "--rope-type", "llama3", "-o", "docs", "--json", cwd=tmp_path
        ).stdout
    )
    assert_figures(out["files"], tmp_path)
    assert {Path(f).name for f in out["files"]} == {
        "scaling_yarn.png",
        "scaling_yarn.svg",
        "scaling_llama3.png",
        "scaling_llama3.svg",
    }
    yarn = out["methods"]["yarn"]
    d, base, orig = 128, 10000.0, yarn["scaling"]["original_max_position_embeddings"]

    def correction_dim(rotations: float) -> float:
        return d * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = math.floor(correction_dim(yarn["scaling"]["beta_fast"]))
    high = math.ceil(correction_dim(yarn["scaling"]["beta_slow"]))
    assert yarn["blended_pairs"] == list(range(low + 1, high))
    assert yarn["ramp"] == pytest.approx([min(max((i - low) / (high - low), 0), 1) for i in range(64)], abs=1e-5)


@pytest.mark.slow
def test_plot_frequencies_scores_positions(tmp_path):
    out = json.loads(
        run(
            "plot",
            "frequencies",
            str(FIXTURES / "llama3_1.json"),
            "--base",
            "10000",
            "--context",
            "4096",
            "--json",
            cwd=tmp_path,
        ).stdout
    )
    assert_figures(out["files"], tmp_path)
    assert set(out["wavelengths"]) == {"llama3_1", "d=128, base 10000"}
    assert out["wavelengths"]["d=128, base 10000"][0] == pytest.approx(2 * math.pi)
    main_args = ["--head-dim", "16", "--json"]
    out = json.loads(run("plot", "scores", "--seq-len", "12", *main_args, cwd=tmp_path).stdout)
    assert_figures(out["files"], tmp_path)
    assert len(out["logit_by_distance"]) == 12
    out = json.loads(run("plot", "positions", "--seq-len", "40", *main_args, cwd=tmp_path).stdout)
    assert_figures(out["files"], tmp_path)
    assert 0 < sum(out["explained_variance_ratio"]) <= 1


def test_plot_scores_with_given_vectors(tmp_path, capsys):
    import numpy as np

    np.save(tmp_path / "q.npy", np.ones(8))
    np.save(tmp_path / "k.npy", np.ones(8))
    out = tmp_path / "s"
    assert (
        main(
            [
                "plot",
                "scores",
                "--head-dim",
                "8",
                "--seq-len",
                "6",
                "--q",
                str(tmp_path / "q.npy"),
                "--k",
                str(tmp_path / "k.npy"),
                "-o",
                str(out),
                "--json",
            ]
        )
        == 0
    )
    numbers = json.loads(capsys.readouterr().out)
    inv = [10000 ** (-2 * i / 8) for i in range(4)]
    assert numbers["logit_by_distance"] == pytest.approx(
        [sum(2 * math.cos(m * t) for t in inv) for m in range(6)], rel=1e-5
    )


class _Images(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.srcs: list[str] = []
        self.tags: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "img":
            self.srcs.append(dict(attrs)["src"])


@pytest.mark.slow
def test_report_writes_html_json_and_figures(tmp_path):
    proc = run("report", str(FIXTURES / "llama3_1.json"), "-o", "rep", "--seq-len", "16", cwd=tmp_path)
    files = [line.removeprefix("wrote ") for line in proc.stdout.splitlines()]
    assert {Path(f).name for f in files} >= {
        "report.html",
        "report.json",
        "decay.png",
        "scaling_llama3.svg",
        "positions.png",
    }
    assert_figures([f for f in files if f.endswith((".png", ".svg"))], tmp_path)
    page = _Images()
    page.feed((tmp_path / "rep" / "report.html").read_text(encoding="utf-8"))
    assert page.tags[0] == "html" and len(page.srcs) == 5
    for src in page.srcs:  # self-contained: every figure embedded
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    numbers = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert numbers["verify"]["passed"] is True
    assert numbers["inspect"]["interpolated_pairs"][0] > 0
    assert numbers["figures"]["decay"]["bound"][0] == pytest.approx(32.5)


BAD = [
    (["inspect", "--head-dim", "-4"], "--head-dim"),
    (["inspect", "--head-dim", "15"], "head_dim"),
    (["inspect", "--scaling", "{bad"], "--scaling"),
    (["inspect", "--scaling", "[1]"], "--scaling"),
    (["inspect", "--scaling", '{"rope_type": "nope"}'], "nope"),
    (["inspect", "--scaling", '{"rope_type": "yarn"}'], "yarn"),
    (["inspect", "no/such/config.json"], "config"),
    (["inspect", "--layer-type", "x"], "--layer-type"),
    (["inspect", str(FIXTURES / "gemma3_nested.json"), "--layer-type", "local"], "sliding_attention"),
    (["verify", str(FIXTURES / "gemma3_nested.json"), "--layer-type", "local"], "sliding_attention"),
    (["plot", "scores", str(FIXTURES / "gemma3_nested.json"), "--layer-type", "local"], "sliding_attention"),
    (["plot"], "rotary plot: error: the following arguments are required: FIGURE"),
    (["plot", "decay", "--max-distance", "0"], "rotary plot decay: error: argument --max-distance"),
    (["plot", "decay", "--out-dir", "x"], "rotary plot decay: error: unrecognized arguments: --out-dir x"),
    (["plot", "scaling", "--rope-type", "bogus"], "bogus"),
    (["plot", "scaling", "--max-position", "8"], "give CONFIG or --scaling"),
    (["plot", "scores", "--q", "missing.npy"], "missing.npy"),
    (["verify", "--seq-len", "0"], "rotary verify: error: argument --seq-len"),
    (["demo", "--head-dim", "7"], "rotary demo: error: head_dim must be even"),
    (["bench", "--dtypes", "fp32", "--nosuch"], "rotary bench: error: unrecognized arguments: --nosuch"),
    (["build", "extra"], "rotary build: error: unrecognized arguments: extra"),
    # issue 11, item 20: each was a traceback
    (["inspect", "--base", "1e-300"], "base 1e-300"),
    (["inspect", "--scaling", '{"rope_type": "proportional", "partial_rotary_factor": 2}'], "proportional"),
    (["report", "--head-dim", "8", "-o", "/dev/null/x"], "-o /dev/null/x: cannot create the directory"),
    (["plot", "decay", "-o", "/dev/null/decay"], "-o /dev/null/decay: /dev/null exists and is not a directory"),
    (["plot", "decay", "-o", "/proc/rotary-test/decay"], "-o /proc/rotary-test/decay: cannot create the directory"),
    (["inspect", "-o", "/proc/rotary-test.txt"], "-o /proc/rotary-test.txt: cannot write"),
    (
        ["inspect", "--pairing", "interleaved", "--no-interleaved"],
        "argument --interleaved/--no-interleaved: not allowed with argument --pairing",
    ),
    (["inspect", "--pairing", "pairs"], "argument --pairing: invalid choice: 'pairs'"),
    (["verify", "--axial", "flux", "--pairing", "half"], "drop --pairing"),
    (["plot", "scaling", "--pairing", "half"], "--pairing describe a configuration"),
    # found by tests/test_cli_properties.py
    (["inspect", "-o", ""], "argument -o/--out: must name a file or directory, got ''"),
    (["inspect", ""], "CONFIG '' names no file"),
    (["inspect", "no_such.json"], "no_such.json: no such file"),
    # a Hub id: no network, so say where its config.json is and what to pass
    (
        ["inspect", "meta-llama/Llama-3.1-8B-Instruct"],
        "meta-llama/Llama-3.1-8B-Instruct is not a file here; if it is a "
        "Hugging Face Hub id, rotary reads no network: download "
        "https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct/resolve/main/config.json and pass that config.json",
    ),
    (
        ["verify", "Qwen/Qwen2.5-7B-Instruct"],
        "https://huggingface.co/Qwen/Qwen2.5-7B-Instruct/resolve/main/config.json",
    ),
    (["inspect", "models/missing.json"], "models/missing.json: no such file"),
    (["inspect", "."], ". is a directory without a config.json"),
    (["inspect", "--head-dim", "-1e16"], "must be written --head-dim=VALUE"),
    (
        ["inspect", str(FIXTURES / "llama3_1.json"), "--layer-type", "sliding_attention"],
        "has one RoPE block for every layer",
    ),
    (
        [
            "inspect",
            str(FIXTURES / "llama3_1.json"),
            "--scaling",
            '{"rope_type": "longrope", "factor": 4, '
            '"original_max_position_embeddings": 4096, "short_factor": [1, 1], "long_factor": [1, 1]}',
        ],
        "(settings from " + str(FIXTURES / "llama3_1.json") + " with --scaling)",
    ),
    (["plot", "decay", "--head-dim", "2048"], "argument --head-dim: must be at most 1024"),
    (["plot", "decay", "--measured", "--samples", "65536", "--max-distance", "65536"], "GiB of vectors at once"),
    (["verify", "--seed", "-1"], "argument --seed: must be an integer seed in 0 .. 2**63 - 1, got -1"),
    (["verify", "--seq-len", "4096"], "argument --seq-len: must be at most 2048"),
    (["bench", "--threads", "100000"], "argument --threads: must be at most"),
    (["plot", "scaling", "--no-interleaved"], "--no-interleaved describe a configuration"),
    (
        ["inspect", "--no-interleaved", "--scaling", '{"rope_type": "yarn"}'],
        "(settings from --scaling, --no-interleaved)",
    ),
]


@pytest.mark.parametrize("argv, needle", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_arguments_give_one_line_and_exit_2(argv, needle, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        sys.exit(main(argv))
    assert exc.value.code == 2
    captured = capsys.readouterr()
    assert len(captured.err.strip().splitlines()) == 1, captured.err
    assert needle in captured.err, captured.err
    assert captured.err.startswith(f"rotary {argv[0]}"), captured.err
    assert captured.out == ""
    assert not any(tmp_path.iterdir())  # nothing written on the way to the error


def _failing_demo(monkeypatch, exc: Exception) -> None:
    """``rotary demo`` that raises ``exc`` where it runs its checks."""
    from rotary.tools.commands import demo

    def run_checks(*args):
        raise exc

    monkeypatch.setattr(demo, "run_checks", run_checks)


@pytest.mark.parametrize(
    "exc",
    [rotary.InputError("bad value"), rotary.InputTypeError("bad type"), rotary.ConfigError("bad config")],
    ids=["InputError", "InputTypeError", "ConfigError"],
)
def test_an_input_error_is_one_line_and_exit_2(exc, monkeypatch, capsys):
    _failing_demo(monkeypatch, exc)
    assert main(["demo"]) == 2
    assert capsys.readouterr().err == f"rotary demo: error: {exc}\n"


@pytest.mark.parametrize("exc", [ValueError("from torch"), TypeError("from numpy"), RuntimeError("a bug")])
def test_any_other_error_keeps_its_traceback(exc, monkeypatch, capsys):
    """Only an InputError is the user's to fix; a ValueError or TypeError raised by anything else is a bug,
    and the command lets it through with its traceback."""
    _failing_demo(monkeypatch, exc)
    with pytest.raises(type(exc)) as raised:
        main(["demo"])
    assert raised.value is exc and capsys.readouterr().err == ""


def test_bad_arguments_in_a_subprocess(tmp_path):
    proc = run_cli("plot", "scaling", "--rope-type", "bogus", cwd=tmp_path, ok=False, timeout=300)
    assert len(proc.stderr.strip().splitlines()) == 1


def test_inspect_length_dependent_types(capsys):
    # dynamic NTK at 16384 tokens with factor 4 over 4096: base grows by (4·16384/4096 − 3)^(d/(d−2)),
    # so the slowest pair is slowed by exactly 13 and the fastest not at all
    scaling = '{"rope_type": "dynamic", "factor": 4, "max_position_embeddings": 4096}'
    assert main(["inspect", "--head-dim", "64", "--scaling", scaling, "--seq-len", "16384", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["seq_len"] == 16384 and out["full_factor"] == pytest.approx(13.0, rel=1e-5)
    assert out["interpolated_pairs"] == [31] and out["extrapolated_pairs"] == [0]
    # LongRoPE is shown at the full context by default: the long factors apply
    assert main(["inspect", str(FIXTURES / "phi3_longrope.json"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    long_factor = json.loads((FIXTURES / "phi3_longrope.json").read_text())["rope_scaling"]["long_factor"]
    assert out["seq_len"] == out["context"] == 131072
    assert [p["factor"] for p in out["pairs"]] == pytest.approx(long_factor, rel=1e-5)


@pytest.mark.parametrize(
    "argv",
    [
        ["inspect"],
        ["verify"],
        ["report"],
        ["plot"],
        ["demo"],
        ["bench"],
        ["build"],
        *[["plot", f] for f in ("decay", "frequencies", "scaling", "scores", "positions")],
    ],
)
def test_help_exits_0(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--help"])
    assert exc.value.code == 0
    assert "usage: rotary" in capsys.readouterr().out


# the context a scaling block enables (issue 13, item 2) ------------------------------------------

#: Qwen2.5-7B-Instruct's published config.json (the RoPE-relevant values) with the yarn block its model
#: card says to add for texts longer than 32768 tokens
QWEN2_5_7B_INSTRUCT = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 3584,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "num_hidden_layers": 28,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "sliding_window": 131072,
    "use_sliding_window": False,
    "vocab_size": 152064,
    "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"},
}


def inspect_json(capsys, *argv: str) -> dict:
    assert main(["inspect", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_inspect_qwen2_5_yarn_reports_the_context_the_block_enables(tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(QWEN2_5_7B_INSTRUCT))
    out = inspect_json(capsys, str(config))
    assert out["context"] == 4 * 32768 == 131072
    assert (
        out["context_source"] == "factor 4 × original_max_position_embeddings 32768; max_position_embeddings is 32768"
    )
    assert out["rope_type"] == "yarn" and out["head_dim"] == 128
    assert main(["inspect", str(config)]) == 0
    text = capsys.readouterr().out
    assert "context 131072 (from factor 4 × original_max_position_embeddings 32768" in text
    assert "turns in 131072" in text


def test_inspect_context_is_max_position_embeddings_when_larger(capsys):
    out = inspect_json(capsys, str(FIXTURES / "llama3_1.json"))  # factor 8 × 8192 = 65536 < 131072
    assert out["context"] == 131072
    assert (
        out["context_source"]
        == "max_position_embeddings; factor 8 × original_max_position_embeddings 8192 = 65536 is not larger"
    )
    out = inspect_json(capsys, str(FIXTURES / "llama3_1.json"), "--max-position", "1000")
    assert (out["context"], out["context_source"]) == (1000, "--max-position")


def test_inspect_context_from_flags(capsys):
    yarn = '{"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 1024}'
    out = inspect_json(capsys, "--head-dim", "16", "--scaling", yarn)
    assert out["context"] == 4096 and out["context_source"].startswith(
        "factor 4 × original_max_position_embeddings 1024"
    )
    out = inspect_json(capsys, "--head-dim", "16")
    assert out["context"] == 4096 and out["context_source"].startswith("default")


# one table per layer type ---------------------------------------------------------------------


def test_inspect_gemma3_shows_every_layer_type(capsys):
    out = inspect_json(capsys, str(FIXTURES / "gemma3_nested.json"))
    assert list(out["layer_types"]) == ["sliding_attention", "full_attention"]
    sliding, full = out["layer_types"]["sliding_attention"], out["layer_types"]["full_attention"]
    assert (sliding["rope_type"], sliding["base"], sliding["layer_type"]) == ("default", 10000.0, "sliding_attention")
    assert (full["rope_type"], full["base"], full["scaling"]["factor"]) == ("linear", 1000000.0, 8.0)
    assert full["pairs"][0]["factor"] == pytest.approx(8.0)  # linear: every pair slowed by 8
    assert main(["inspect", str(FIXTURES / "gemma3_nested.json")]) == 0
    text = capsys.readouterr().out
    assert text.index("layer type sliding_attention") < text.index("layer type full_attention")
    assert (
        "pairs of default RoPE (sliding_attention layers)" in text
        and "pairs of linear RoPE (full_attention layers)" in text
    )


def test_inspect_layer_type_picks_one(capsys):
    out = inspect_json(capsys, str(FIXTURES / "gemma3_nested.json"), "--layer-type", "full_attention")
    assert out["layer_type"] == "full_attention" and out["rope_type"] == "linear"


def test_inspect_gemma3_4x_config_without_layer_types(tmp_path, capsys):
    """Gemma-3's 4.x files state rope_local_base_freq and a rope_scaling block for the global layers
    and name no layer types: transformers' names are used."""
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "model_type": "gemma3_text",
                "head_dim": 256,
                "hidden_size": 2560,
                "num_attention_heads": 8,
                "max_position_embeddings": 131072,
                "rope_theta": 1000000.0,
                "rope_local_base_freq": 10000.0,
                "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                "sliding_window": 1024,
            }
        )
    )
    out = inspect_json(capsys, str(config))
    assert {k: (v["rope_type"], v["base"]) for k, v in out["layer_types"].items()} == {
        "sliding_attention": ("default", 10000.0),
        "full_attention": ("linear", 1000000.0),
    }


GEMMA3 = [FIXTURES / "gemma3_nested.json", FIXTURES / "published" / "gemma-3-4b-it.json"]
GEMMA3_TYPES = {"sliding_attention": ("default", 10000.0), "full_attention": ("linear", 1000000.0)}


@pytest.mark.parametrize("config", GEMMA3, ids=lambda p: p.name)
def test_verify_checks_every_layer_type(config, capsys, monkeypatch):
    assert main(["verify", str(config), "--seq-len", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["passed"] is True and list(out["layer_types"]) == list(GEMMA3_TYPES)
    for name, (rope_type, base) in GEMMA3_TYPES.items():
        checks = out["layer_types"][name]
        assert checks["layer_type"] == name and checks["passed"] is True and len(checks["checks"]) == 8
        assert f"rope_type='{rope_type}'" in checks["rope"] and f"base={base:g}" in checks["rope"]
    assert main(["verify", str(config), "--seq-len", "8"]) == 0
    text = capsys.readouterr().out
    assert text.index("layer type sliding_attention: verify") < text.index("layer type full_attention: verify")
    # --layer-type picks one: the JSON of one configuration
    assert main(["verify", str(config), "--layer-type", "full_attention", "--seq-len", "8", "--json"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert one["layer_type"] == "full_attention" and "rope_type='linear'" in one["rope"]
    # one failing layer type fails the command
    from rotary.tools.commands import verify as verify_cmd

    real = verify_cmd.verify
    monkeypatch.setattr(
        verify_cmd,
        "verify",
        lambda rope, **k: (
            real(rope, **k) if rope.freqs.rope_type == "default" else [analysis.Check("broken", 1.0, 0.0)]
        ),
    )
    assert main(["verify", str(config), "--seq-len", "8", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert (
        out["passed"],
        out["layer_types"]["sliding_attention"]["passed"],
        out["layer_types"]["full_attention"]["passed"],
    ) == (False, True, False)


@pytest.mark.parametrize("figure", ["scores", "positions"])
def test_plot_scores_and_positions_draw_every_layer_type(figure, tmp_path, capsys):
    config = str(GEMMA3[1])
    assert main(["plot", figure, config, "--seq-len", "8", "-o", str(tmp_path / figure), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [Path(f).name for f in out["files"]] == [
        f"{figure}_{t}.{ext}" for t in GEMMA3_TYPES for ext in ("png", "svg")
    ]
    assert_figures(out["files"], tmp_path)
    assert list(out["layer_types"]) == list(GEMMA3_TYPES)
    if figure == "scores":  # the two layer types rotate differently: their logits differ
        logits = [out["layer_types"][t]["logit_by_distance"] for t in GEMMA3_TYPES]
        assert logits[0][0] == pytest.approx(logits[1][0]) and logits[0][5] != pytest.approx(logits[1][5])
    assert (
        main(
            [
                "plot",
                figure,
                config,
                "--layer-type",
                "sliding_attention",
                "--seq-len",
                "8",
                "-o",
                str(tmp_path / "one"),
                "--json",
            ]
        )
        == 0
    )
    assert [Path(f).name for f in json.loads(capsys.readouterr().out)["files"]] == ["one.png", "one.svg"]


@pytest.mark.slow
def test_report_has_one_section_per_layer_type(tmp_path, capsys):
    assert main(["report", str(GEMMA3[1]), "-o", str(tmp_path / "rep"), "--seq-len", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    names = {Path(f).name for f in out["files"]}
    for t, (rope_type, _) in GEMMA3_TYPES.items():
        assert {f"decay_{t}.png", f"scores_{t}.svg", f"positions_{t}.png", f"scaling_{rope_type}_{t}.png"} <= names
    assert out["verify_passed"] is True
    numbers = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert list(numbers["layer_types"]) == list(GEMMA3_TYPES) and numbers["verify"]["passed"] is True
    for t, (rope_type, base) in GEMMA3_TYPES.items():
        assert (numbers["layer_types"][t]["inspect"]["rope_type"], numbers["layer_types"][t]["inspect"]["base"]) == (
            rope_type,
            base,
        )
    page_text = (tmp_path / "rep" / "report.html").read_text(encoding="utf-8")
    page = _Images()
    page.feed(page_text)
    assert len(page.srcs) == 10  # five figures per layer type, all embedded
    assert page_text.index("layer type sliding_attention") < page_text.index("layer type full_attention")


# CONFIG and flags combine: the flags override the file -----------------------------------------


def test_flags_override_the_config(capsys):
    llama = str(FIXTURES / "llama3_1.json")
    out = inspect_json(capsys, llama, "--head-dim", "64")
    assert (out["head_dim"], out["base"], out["rope_type"]) == (64, 500000.0, "llama3")
    assert out["pairs"][1]["original_wavelength"] == pytest.approx(2 * math.pi * 500000.0 ** (2 / 64), rel=1e-6)
    out = inspect_json(capsys, llama, "--base", "10000", "--scaling", '{"rope_type": "linear", "factor": 2}')
    assert (out["base"], out["rope_type"], out["scaling"]["factor"]) == (10000.0, "linear", 2)
    out = inspect_json(capsys, llama, "--interleaved")
    assert out["interleaved"] is True
    gptj = str(FIXTURES / "gptj.json")
    assert inspect_json(capsys, gptj)["interleaved"] is True
    assert inspect_json(capsys, gptj, "--no-interleaved")["interleaved"] is False
    assert inspect_json(capsys, gptj, "--pairing", "half")["interleaved"] is False
    assert inspect_json(capsys, llama, "--pairing", "interleaved")["interleaved"] is True
    assert inspect_json(capsys, llama, "--pairing", "half")["interleaved"] is False
    neox = str(FIXTURES / "gpt_neox.json")
    assert inspect_json(capsys, neox)["rotary_dim"] != 32
    assert inspect_json(capsys, neox, "--rotary-dim", "32")["rotary_dim"] == 32  # the file's rotary_pct gives way


# -o/--out: one convention ---------------------------------------------------------------------


def test_out_is_a_file_stem_a_directory_or_a_file(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    small = ["--max-distance", "8", "--head-dim", "16"]
    assert main(["plot", "decay", *small]) == 0  # default: ./decay.png, ./decay.svg
    assert {p.name for p in tmp_path.iterdir()} == {"decay.png", "decay.svg"}
    (tmp_path / "figs").mkdir()
    assert main(["plot", "decay", *small, "-o", "figs"]) == 0  # an existing directory: the default name inside
    assert main(["plot", "decay", *small, "--out", "new/dir/"]) == 0  # a trailing slash: a directory, created
    assert main(["plot", "decay", *small, "-o", "new/other.png"]) == 0  # a suffix: both files anyway
    for stem in ("figs/decay", "new/dir/decay", "new/other"):
        assert_figures([f"{stem}.png", f"{stem}.svg"], tmp_path)
    assert main(["plot", "scaling", "--rope-type", "linear", "--head-dim", "16"]) == 0  # several: ./scaling/
    assert_figures(["scaling/scaling_linear.png", "scaling/scaling_linear.svg"], tmp_path)
    assert main(["inspect", "--head-dim", "8", "--json", "-o", "out/inspect.json"]) == 0  # a printing command
    assert json.loads((tmp_path / "out" / "inspect.json").read_text())["head_dim"] == 8
    capsys.readouterr()
    assert main(["verify", "--head-dim", "8", "-o", "verify.txt"]) == 0
    assert capsys.readouterr().out == "" and "all checks passed" in (tmp_path / "verify.txt").read_text()


def test_defaults_never_write_into_the_projects_docs(tmp_path, monkeypatch):
    """Run from a directory that has docs/figures (as the repository does): the defaults stay out of it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "docs" / "figures").mkdir(parents=True)
    assert main(["plot", "scaling", "--rope-type", "ntk", "--head-dim", "16"]) == 0
    assert main(["plot", "decay", "--head-dim", "16", "--max-distance", "8"]) == 0
    assert not any((tmp_path / "docs" / "figures").iterdir())
    assert (tmp_path / "scaling" / "scaling_ntk.png").is_file() and (tmp_path / "decay.png").is_file()


def test_the_makefile_passes_the_docs_paths_explicitly():
    recipe = (ROOT / "Makefile").read_text().split("\nfigures:", 1)[1].split("\n\n", 1)[0]
    plots = [line.strip() for line in recipe.splitlines() if "rotary plot" in line]
    assert plots and all(" -o docs/figures" in line for line in plots)


def test_report_into_an_existing_file_is_an_error(tmp_path, capsys):
    existing = tmp_path / "existing"
    existing.write_text("keep me")
    assert main(["report", "--head-dim", "8", "-o", str(existing)]) == 2
    assert (
        capsys.readouterr().err
        == f"rotary report: error: -o {existing}: {existing} exists and is not a directory; choose another -o\n"
    )
    assert existing.read_text() == "keep me"


def test_save_crops_a_constrained_layout_figure_to_what_it_draws(tmp_path):
    """``plots.save`` measures the tight box after the layout engine has placed the axes: a constrained-layout
    figure (``plot axial``'s) comes out the size matplotlib's own ``bbox_inches="tight"`` gives it, colorbar and
    outer labels included (a box measured before the layout ran cut them off)."""
    import matplotlib.pyplot as plt

    from rotary.tools import plots

    def figure():
        fig, axes = plt.subplots(1, 2, figsize=(6, 2.5), layout="constrained")
        im = axes[0].imshow([[0.0, 1.0], [1.0, 0.0]])
        for ax in axes:
            ax.set_xlabel("a label below the axes")
            ax.set_ylabel("a label left of them")
        fig.colorbar(im, ax=axes.tolist(), label="a colorbar on the right")
        return fig

    png, _ = plots.save(figure(), tmp_path / "saved")
    reference = figure()
    reference.savefig(tmp_path / "tight.png", dpi=150, bbox_inches="tight")
    plt.close(reference)
    size = struct.unpack(">II", png.read_bytes()[16:24])
    tight = struct.unpack(">II", (tmp_path / "tight.png").read_bytes()[16:24])
    assert all(abs(a - b) <= 2 for a, b in zip(size, tight)), (size, tight)


def test_plot_into_a_read_only_directory(tmp_path, capsys, monkeypatch):
    """The permission check itself (root may write anywhere, so the permission answer is simulated;
    the /proc cases in BAD are real failures)."""
    import rotary.tools.commands.output as output

    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(output.os, "access", lambda p, mode: False if Path(p) == locked else real_access(p, mode))
    assert main(["plot", "decay", "-o", str(locked / "decay")]) == 2
    assert capsys.readouterr().err == (
        f"rotary plot decay: error: -o {locked / 'decay'}: the directory {locked} is not writable; choose another -o\n"
    )
    assert not any(locked.iterdir())


def test_every_command_has_out_and_json():
    leaves = list(leaf_parsers().items())
    assert {name for name, _ in leaves} >= {
        "demo",
        "inspect",
        "verify",
        "report",
        "bench",
        "build",
        "plot decay",
        "plot scaling",
    }
    for name, parser in leaves:
        options = {s for a in parser._actions for s in a.option_strings}
        assert {"-o", "--out", "--json"} <= options, name


# the published configs end to end -------------------------------------------------------------


@pytest.mark.parametrize("fixture", sorted(p.name for p in FIXTURES.glob("*.json")))
def test_every_fixture_config_inspects_and_verifies(fixture, capsys):
    path = str(FIXTURES / fixture)
    out = inspect_json(capsys, path)
    for info in out["layer_types"].values() if "layer_types" in out else [out]:
        assert info["context"] > 0 and len(info["pairs"]) == info["rotary_dim"] // 2
        extra = ["--layer-type", info["layer_type"]] if info["layer_type"] else []
        assert main(["verify", path, *extra, "--seq-len", "8", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["passed"] is True


def test_inspect_header_shows_sequence_parameters_by_length(capsys):
    """RoPE keeps LongRoPE's factors as tuples (a copy the caller cannot edit); the header printed
    them in full, 48 numbers each, on one line."""
    assert main(["inspect", str(FIXTURES / "phi3_longrope.json")]) == 0
    header = " ".join(capsys.readouterr().out.split("pairs of")[0].split())  # rich wraps long lines
    assert "short_factor=[48 values]" in header and "long_factor=[48 values]" in header
    assert "(1.0" not in header and "1.0, 1.0" not in header


def test_every_subcommand_help_has_a_one_line_summary_and_an_example_that_parses():
    import shlex

    from helpers import leaf_parsers
    from rotary.tools.cli import EXAMPLES, build_parser

    leaves = leaf_parsers()
    assert set(EXAMPLES) == set(leaves)
    for name, parser in leaves.items():
        text = parser.format_help()
        description = text.split("\n\n")[1]  # after the usage
        assert description.startswith(f"rotary {name}: ") and description.endswith("."), (name, description)
        assert ". " not in " ".join(description.split()), (name, description)  # one sentence
        assert text.rstrip().endswith(f"example:\n  {EXAMPLES[name]}"), name
        argv = shlex.split(EXAMPLES[name])
        assert argv[0] == "rotary" and " ".join(argv[1 : 1 + len(name.split())]) == name, name
        args = build_parser().parse_args(argv[1:])
        assert args._parser is parser or args._parser.prog == parser.prog, name


def _bad_vector_files():
    import numpy as np
    import torch

    def npy(array, **kwargs):
        return lambda path: np.save(path, array, **kwargs)

    def pt(value):
        return lambda path: torch.save(value, path)

    def raw(data: bytes):
        return lambda path: path.write_bytes(data)

    def truncated(path):
        np.save(path, np.ones(8))
        path.write_bytes(path.read_bytes()[:-20])

    def npz(path):
        with open(path, "wb") as fh:
            np.savez(fh, q=np.ones(8))

    # (file name, writer, what the one-line error says)
    return [
        (
            "object.npy",
            npy(np.array([1.0] * 8, dtype=object), allow_pickle=True),
            "holds an array of Python objects (dtype=object)",
        ),
        ("ragged.npy", npy(np.array([[1.0], [1.0, 2.0]], dtype=object), allow_pickle=True), "array of Python objects"),
        (
            "complex.npy",
            npy(np.ones(8, dtype=np.complex64)),
            "holds complex64 values (numpy kind 'c'); q/k must be real",
        ),
        ("strings.npy", npy(np.array(["a"] * 8)), "holds <U1 values (numpy kind 'U'); q/k must be real numbers"),
        ("bytes.npy", npy(np.array([b"a"] * 8)), "numpy kind 'S'"),
        ("bool.npy", npy(np.ones(8, dtype=bool)), "holds bool values"),
        ("dates.npy", npy(np.array(["2020-01-01"] * 8, dtype="datetime64[D]")), "numpy kind 'M'"),
        ("record.npy", npy(np.zeros(8, dtype=[("a", "f4"), ("b", "i4")])), "numpy kind 'V'"),
        ("scalar.npy", npy(np.array(3.0)), "holds shape (); expected a [8] vector (head_dim)"),
        ("matrix.npy", npy(np.ones((2, 8))), "holds shape (2, 8); expected a [8] vector"),
        (
            "nan.npy",
            npy(np.array([0.0, np.nan] + [1.0] * 6)),
            "holds 1 non-finite value(s) ([1]=nan); q/k must be finite",
        ),
        ("truncated.npy", truncated, "is not a readable NumPy .npy file"),
        ("junk.npy", raw(b"not numpy"), "is not a NumPy .npy file (the magic string is not correct"),
        ("empty.npy", raw(b""), "is not a NumPy .npy file"),
        ("archive.npy", npz, "is not a NumPy .npy file"),
        ("pickled.npy", raw(b"\x80\x04\x95\x05\x00\x00\x00\x00\x00\x00\x00]\x94."), "is not a NumPy .npy file"),
        ("complex.pt", pt(torch.ones(8, dtype=torch.complex64)), "holds torch.complex64 values; q/k must be real"),
        ("inf.pt", pt(torch.full((8,), float("inf"))), "holds 8 non-finite value(s) ([0]=inf, [1]=inf, [2]=inf ...)"),
        ("sparse.pt", pt(torch.ones(8).to_sparse()), "holds a torch.sparse_coo tensor; save a dense one"),
        ("junk.pt", raw(b"junk"), "cannot be read by torch.load(weights_only=True)"),
        ("dict.pt", pt({"q": torch.ones(8)}), "holds shape dict; expected a [8] vector"),
    ]


BAD_VECTOR_FILES = _bad_vector_files()


@pytest.mark.parametrize("name, write, needle", BAD_VECTOR_FILES, ids=[n for n, _, _ in BAD_VECTOR_FILES])
def test_plot_scores_names_a_bad_vector_file_in_one_line(name, write, needle, tmp_path, capsys):
    """issue 24: an object array (and other .npy / .pt files rotary cannot read as a vector) was a traceback."""
    path = tmp_path / name
    write(path)
    assert (
        main(["plot", "scores", "--head-dim", "8", "--seq-len", "4", "--q", str(path), "-o", str(tmp_path / "s")]) == 2
    )
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"rotary plot scores: error: {path}") and needle in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]  # nothing written


def test_plot_scores_reads_any_real_vector_and_refuses_overflowing_logits(tmp_path, capsys):
    import numpy as np
    import torch

    files = {
        "big_endian.npy": np.ones(8, dtype=">f8"),
        "half.npy": np.ones(8, dtype=np.float16),
        "int.npy": np.ones(8, dtype=np.int64),
        "fortran.npy": np.asfortranarray(np.ones(8)),
    }
    for name, array in files.items():
        np.save(tmp_path / name, array)
    torch.save(torch.nn.Parameter(torch.ones(8)), tmp_path / "param.pt")  # requires grad
    inv = [10000 ** (-2 * i / 8) for i in range(4)]
    for name in [*files, "param.pt"]:
        argv = [
            "plot",
            "scores",
            "--head-dim",
            "8",
            "--seq-len",
            "6",
            "--q",
            str(tmp_path / name),
            "--k",
            str(tmp_path / name),
            "-o",
            str(tmp_path / "s"),
            "--json",
        ]
        assert main(argv) == 0, name
        numbers = json.loads(capsys.readouterr().out)
        assert numbers["logit_by_distance"] == pytest.approx([sum(2 * math.cos(m * t) for t in inv) for m in range(6)])
    np.save(tmp_path / "huge.npy", np.full(8, 1e300))
    huge = str(tmp_path / "huge.npy")
    assert main(["plot", "scores", "--head-dim", "8", "--q", huge, "--k", huge, "-o", str(tmp_path / "h")]) == 2
    err = capsys.readouterr().err
    assert "overflow float64 (largest |q| entry 1e+300, |k| entry 1e+300); scale q and k down" in err, err


def test_version_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"rotary {rotary.__version__}"


@pytest.mark.parametrize("json_out", [False, True], ids=["rich", "json"])
def test_a_reader_that_closes_the_pipe_early_ends_the_command_quietly(json_out):
    """``rotary inspect ... | head -1``: the reader leaves before the output ends; rotary ends with
    status 0 and says nothing (rich's console exited 1; a buffered print failed at exit). Here the reader
    leaves at once, seconds before rotary (still importing torch) writes its first line. The RoPE comes
    from flags, not a config.json: the same table or JSON and the same printing, without importing
    transformers' configuration path (about 2 s of each process)."""
    from helpers import cli_env

    argv = [
        sys.executable,
        "-m",
        "rotary",
        "inspect",
        *("--head-dim", "128", "--base", "500000", "--max-position", "131072"),
        *(["--json"] if json_out else []),
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli_env())
    proc.stdout.close()  # the reader has gone: every write of rotary meets a closed pipe
    err = proc.stderr.read()
    assert proc.wait(timeout=300) == 0, err
    assert err == b"", err
