"""scripts/install.py (what ``make`` fills ``.venv`` with): uv gets pip's settings that decide what is installed, and
any setting it cannot pass, or any failure of uv, makes the install pip's. No package is installed here: the commands
it would run are recorded."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "install.py"
CONFIG = """\
:env:.cert='/certs/bundle.crt'
:env:.find-links='/opt/env-wheels'
:env:.default-timeout='180'
global.find-links='/opt/wheels'
global.extra-index-url='file:///opt/a/simple file:///opt/b/simple'
global.constraint='/etc/pip/constraints.txt'
download.index-url='https://never.used/simple'
"""


@pytest.fixture
def install():
    spec = importlib.util.spec_from_file_location("install_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def recorder(monkeypatch, install, config: str, uv_status: int = 0):
    """subprocess.run replaced: ``pip config list`` prints ``config``, uv exits ``uv_status``, the rest 0."""
    calls = []

    def run(command, **kwargs):
        command = [str(c) for c in command]
        calls.append((command, kwargs.get("env")))
        if command[1:4] == ["-m", "pip", "config"]:
            return subprocess.CompletedProcess(command, 0, stdout=config)
        return subprocess.CompletedProcess(command, uv_status if command[0].endswith("/uv") else 0)

    monkeypatch.setattr(install.subprocess, "run", run)
    monkeypatch.setattr(install.Path, "exists", lambda self: True)
    return calls


def test_the_settings_are_pip_install_s_environment_over_files_and_install_over_global(monkeypatch, install):
    recorder(monkeypatch, install, CONFIG)
    assert install.pip_settings() == {
        "cert": "/certs/bundle.crt",
        "find-links": "/opt/env-wheels",  # PIP_FIND_LINKS over the file's
        "default-timeout": "180",
        "extra-index-url": "file:///opt/a/simple file:///opt/b/simple",
        "constraint": "/etc/pip/constraints.txt",
    }  # the download section is not install's


def test_uv_gets_every_index_find_links_constraint_and_the_certificates(monkeypatch, install):
    calls = recorder(monkeypatch, install, CONFIG)
    assert install.main(["torch==2.13.0", "-e", ".[dev]"]) == 0
    command, env = calls[-1]
    assert command[0].endswith("/uv") and command[-3:] == ["torch==2.13.0", "-e", ".[dev]"]
    assert command[command.index("--index-strategy") + 1] == "unsafe-best-match"  # pip's rule: the best of any index
    pairs = list(zip(command, command[1:]))
    for pair in [
        ("--find-links", "/opt/env-wheels"),
        ("--extra-index-url", "file:///opt/a/simple"),
        ("--extra-index-url", "file:///opt/b/simple"),
        ("--constraint", "/etc/pip/constraints.txt"),
    ]:
        assert pair in pairs
    assert ("--find-links", "/opt/wheels") not in pairs and "--index-url" not in command
    assert env["SSL_CERT_FILE"] == "/certs/bundle.crt"
    assert not any(c[0][1:4] == ["-m", "pip", "install"] and "-e" in c[0] for c in calls)  # pip did not install


@pytest.mark.parametrize(
    ("config", "uv_status", "reason"),
    [
        (CONFIG + "global.trusted-host='mirror.local'\n", 0, "pip setting(s) trusted-host"),
        (":env:.no-index='1'\nglobal.proxy='http://p:3128'\n", 0, "pip setting(s) no-index, proxy"),
        (CONFIG, 1, "uv pip install failed"),
    ],
)
def test_a_setting_uv_is_not_given_or_a_failing_uv_installs_with_pip(
    monkeypatch, install, capsys, config, uv_status, reason
):
    calls = recorder(monkeypatch, install, config, uv_status)
    assert install.main(["torch==2.13.0", "-e", ".[dev]"]) == 0
    assert calls[-1][0][1:] == ["-m", "pip", "install", "-q", "--no-compile", "torch==2.13.0", "-e", ".[dev]"]
    assert f"installing with pip: {reason}" in capsys.readouterr().err
