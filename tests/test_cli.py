"""The analysis subcommands end to end: ``rotary inspect / plot / verify / report``.

Each command runs once in a subprocess (the real entry point); bad arguments are checked in
process, where a traceback would show up as an exception instead of exit status 2.
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

from rotary import analysis
from rotary.cli import main

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"


def run(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-m", "rotary", *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc


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
    out = json.loads(run("inspect", "--head-dim", "64", "--max-position", "4096", "--json", cwd=tmp_path).stdout)
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
    out = json.loads(run("verify", "--head-dim", "32", "--interleaved", "--seq-len", "16", "--json", cwd=tmp_path).stdout)
    assert out["passed"] is True and len(out["checks"]) == 8
    assert all(c["worst_error"] <= c["tolerance"] for c in out["checks"])


def test_verify_exits_1_when_a_check_fails(monkeypatch, capsys):
    from rotary.commands import verify as verify_cmd

    monkeypatch.setattr(verify_cmd, "verify", lambda *a, **k: [analysis.Check("broken", 1.0, 0.0)])
    assert main(["verify", "--head-dim", "8"]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_plot_decay_numbers_and_files(tmp_path):
    out = json.loads(run("plot", "decay", "--measured", "--max-distance", "64", "--samples", "8", "-o", "figs/decay", "--json", cwd=tmp_path).stdout)
    assert out["files"] == ["figs/decay.png", "figs/decay.svg"]
    assert_figures(out["files"], tmp_path)
    assert out["bound"][0] == pytest.approx(32.5) and len(out["bound"]) == 65
    assert out["measured_ones"][0] == pytest.approx(128.0)  # q = k = ones: Σ 2 cos 0 over 64 pairs


def test_plot_scaling_yarn_blended_range(tmp_path):
    out = json.loads(run("plot", "scaling", "--rope-type", "yarn", "--rope-type", "llama3", "--out-dir", "docs", "--json", cwd=tmp_path).stdout)
    assert_figures(out["files"], tmp_path)
    assert {Path(f).name for f in out["files"]} == {"scaling_yarn.png", "scaling_yarn.svg", "scaling_llama3.png", "scaling_llama3.svg"}
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
    out = json.loads(run("plot", "frequencies", str(FIXTURES / "llama3_1.json"), "--base", "10000", "--context", "4096", "--json", cwd=tmp_path).stdout)
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
    assert main(["plot", "scores", "--head-dim", "8", "--seq-len", "6", "--q", str(tmp_path / "q.npy"), "--k", str(tmp_path / "k.npy"), "-o", str(out), "--json"]) == 0
    numbers = json.loads(capsys.readouterr().out)
    inv = [10000 ** (-2 * i / 8) for i in range(4)]
    assert numbers["logit_by_distance"] == pytest.approx([sum(2 * math.cos(m * t) for t in inv) for m in range(6)], rel=1e-5)


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
    assert {Path(f).name for f in files} >= {"report.html", "report.json", "decay.png", "scaling_llama3.svg", "positions.png"}
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
    (["inspect", str(FIXTURES / "llama3_1.json"), "--head-dim", "64"], "not both"),
    (["inspect", "--layer-type", "x"], "--layer-type"),
    (["plot"], "FIGURE"),
    (["plot", "decay", "--max-distance", "0"], "--max-distance"),
    (["plot", "scaling", "--rope-type", "bogus"], "bogus"),
    (["plot", "scores", "--q", "missing.npy"], "missing.npy"),
    (["verify", "--seq-len", "0"], "--seq-len"),
    (["report", "--head-dim", "8"], "-o"),
]


@pytest.mark.parametrize("argv, needle", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_arguments_give_one_line_and_exit_2(argv, needle, capsys):
    with pytest.raises(SystemExit) as exc:
        sys.exit(main(argv))
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert needle in err, err


def test_bad_arguments_in_a_subprocess(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, "-m", "rotary", "plot", "scaling", "--rope-type", "bogus"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


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


@pytest.mark.parametrize("argv", [["inspect"], ["verify"], ["report"], ["plot"], *[["plot", f] for f in ("decay", "frequencies", "scaling", "scores", "positions")]])
def test_help_exits_0(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--help"])
    assert exc.value.code == 0
    assert "usage: rotary" in capsys.readouterr().out
