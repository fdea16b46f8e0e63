"""Install packages into this interpreter's environment: with uv where it can do exactly what pip would, else pip.

``make`` runs it to fill ``.venv`` (``python scripts/install.py torch==2.13.0 -e ".[dev]"``). pip takes about 40 s
for the development extras on a 2-core machine, most of it evaluating every file of every release on the indexes;
uv installs the same packages in about 10. uv does not read pip's configuration, so the settings that decide what
gets installed (index URLs, find-links, constraint files, the certificate bundle) are read with ``pip config list``
and passed to it, with pip's rule of taking the best version from any index. A setting this script does not know
how to pass, a uv that cannot be installed, or a uv install that fails makes it install with pip instead: the
result is the same environment, only slower.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

#: pip settings uv takes as options (pip splits each value at whitespace)
PASSED = {
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
}
#: pip settings that change how pip talks or prints, not what it installs (cert is passed as SSL_CERT_FILE)
IGNORED = {"cert", "default-timeout", "timeout", "disable-pip-version-check", "no-compile", "quiet", "progress-bar"}
#: sections of pip's configuration that ``pip install`` reads, lowest precedence first
SECTIONS = ("global", "install", ":env:")


def pip_settings() -> dict[str, str]:
    """pip's configuration as ``pip install`` sees it: {key: value}, environment over files, install over global."""
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True
    ).stdout
    found: dict[str, tuple[int, str]] = {}
    for line in listed.splitlines():
        name, _, value = line.partition("=")
        section, _, key = name.rpartition(".")
        if section in SECTIONS and SECTIONS.index(section) >= found.get(key, (-1, ""))[0]:
            found[key] = (SECTIONS.index(section), ast.literal_eval(value))
    return {key: value for key, (_, value) in found.items()}


def with_uv(packages: list[str]) -> str | None:
    """Install ``packages`` with uv; None when done, else why pip is used instead."""
    settings = pip_settings()
    unknown = sorted(set(settings) - set(PASSED) - IGNORED)
    if unknown:
        return f"pip setting(s) {', '.join(unknown)} that this script does not pass to uv"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-compile", "uv>=0.8"]
    uv = Path(sys.executable).parent / "uv"
    if subprocess.run(pip).returncode != 0 or not uv.exists():
        return "uv could not be installed"
    options = [opt for key, flag in PASSED.items() for value in settings.get(key, "").split() for opt in (flag, value)]
    env = {**os.environ, "SSL_CERT_FILE": settings["cert"]} if "cert" in settings else None
    command = [str(uv), "pip", "install", "-q", "--python", sys.executable, "--index-strategy", "unsafe-best-match"]
    if subprocess.run([*command, *options, *packages], env=env).returncode != 0:
        return "uv pip install failed"
    return None


def main(packages: list[str]) -> int:
    reason = with_uv(packages)
    if reason is None:
        return 0
    print(f"installing with pip: {reason}", file=sys.stderr)
    return subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-compile", *packages]).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
