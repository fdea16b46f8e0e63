"""benchmarks/rotate_and_cache.py runs on the CPU: every row printed with a time and a ratio to the traffic
limit, and the fused op equal to the plain-torch composition it is timed against (no difference line)."""

from __future__ import annotations

import os
import subprocess
import sys

from helpers import ROOT


def test_benchmark_runs_on_the_cpu():
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "rotate_and_cache.py"), "--device", "cpu", "--shapes", "2x1", "1x8",
         "--heads", "4", "--kv-heads", "2", "--head-dim", "16", "--repeats", "1", "--no-compile"],
        env=dict(os.environ, PYTHONPATH=str(ROOT / "src")), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "differ" not in done.stdout, done.stdout
    rows = [line.split() for line in done.stdout.splitlines() if line.strip().startswith(("2x1", "1x8"))]
    assert [r[1] for r in rows] == ["fused", "torch", "traffic"] * 2, done.stdout
    assert all(float(r[-2]) > 0 and float(r[-1]) > 0 for r in rows), done.stdout
