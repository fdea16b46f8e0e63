"""Every code block of README.md and docs/*.md runs as written, and the output shown is the output
printed (issue 13, item 6).

Only fenced blocks with a language are allowed (an indented code block, or a fence without a
language, says nothing about what it holds). By language:

- ``python``: executed on its own, in a fresh namespace, in an empty working directory; a value the
  text shows is stated as an ``assert`` in the block, and a block that asserts nothing fails (it would
  only be run);
- ``console``: each ``$ `` line is a command (a trailing ``\\`` continues it, ``# ...`` is a comment),
  and the lines up to the next ``$ `` are its output. ``rotary ...`` runs in process and must exit 0;
  the output shown, if any, must equal what it prints (or begin it, when the last line shown is
  ``...``). Commands that cannot run inside the test suite
  (minutes of training or timing, installing packages, make) are in :data:`NOT_RUN` with the reason,
  and are checked without running: their arguments parse, the make target exists, the pinned torch and
  the extras are those of the Makefile and pyproject.toml;
- ``text``: diagrams, formulas, tables of numbers; not code, not run.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from rotary.tools.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LANGUAGES = {"python", "console", "text"}

#: commands shown in the docs that the test suite does not run -> why; each is checked another way
NOT_RUN = {
    "make demo": "trains the default experiment, up to 10 minutes",
    "rotary experiment --study base": "trains ten RoPE models at the default preset, minutes",
    "rotary experiment --study transfer": "trains ten models at the default preset, minutes",
    "make test": "runs this test suite",
    "rotary experiment --preset tiny": (
        "trains the tiny preset's 34 models, about 20 s; tests/experiments/test_run.py runs it, one model at a time "
        "and two at a time (killed and resumed), and checks every file it writes"
    ),
    "make bench": "times every benchmark group, minutes",
    ".venv/bin/python benchmarks/write_experiment_docs.py runs/experiment-20261122T130426Z": (
        "needs a finished default run; tests/experiments/test_run.py runs it on a tiny run, into a copy of the docs"
    ),
    "rotary experiment --preset large --device cuda": "needs a GPU",
    "rotary experiment --data notes/ 'papers/**/*.txt' --encodings rope,alibi --extend-steps 0": (
        "trains on files of the reader's"
    ),
    "torchrun --standalone --nproc_per_node=2 -m rotary experiment --preset default --extend-batch-size 4": (
        "two processes, minutes"
    ),
    "rotary bench --device cuda --markdown": "needs a GPU (tests/test_bench.py runs the GPU path on a CPU stand-in)",
    "bash benchmarks/gpu_check.sh": "needs a GPU; minutes",
    "rotary bench --no-compile --no-memory --shapes prefill --dtypes fp32 --repeats 9 --threads 2 --json": (
        "times the CPU kernels, a minute"
    ),
    "rotary bench --device cuda --markdown --shapes interleaved --no-compile --no-memory --repeats 5": "needs a GPU",
    "rotary bench --shapes none --suites rotate_and_cache,rmsnorm_rotate,generation --threads 2 --markdown": (
        "times three suites, half a minute; tests/test_bench_suites.py runs them at --quick's shapes"
    ),
    "rotary bench --device cuda --shapes none --suites generation": "needs a GPU; minutes",
    "rotary bench --device cuda --shapes none --suites generation --repeats 1": "needs a GPU; a minute",
    "rotary bench --device cuda --shapes none --suites rmsnorm_rotate": "needs a GPU",
    ".venv/bin/python benchmarks/triton_compile.py --hot": (
        "compiles the kernels for sm_90, seconds; tests/kernels/test_triton_compile.py runs it"
    ),
    ".venv/bin/python benchmarks/triton_compile.py --host": (
        "times the launch paths, seconds; tests/kernels/test_triton_compile.py runs it"
    ),
    "python benchmarks/cpu_kernel_ab.py --against 01b918b --threads 2 --repeats 9": (
        "builds a second copy of the CPU kernel, a minute; tests/test_bench.py checks its errors"
    ),
    "python benchmarks/cpu_kernel_ab.py --against df6d45a --shapes 64x1,1x512,4x256 --repeats 9": (
        "builds a second copy of the CPU kernel, a minute; tests/test_bench.py checks its errors"
    ),
    "rotary bench --shapes none --suites generation_qk_norm --threads 2 --markdown --repeats 9": (
        "times six generation rows, half a minute; tests/test_bench_suites.py runs the suite at --quick's shapes"
    ),
    "rotary sweep path/to/checkpoint --lengths 2048,4096,8192,16384 -o sweeps/my-model": (
        "needs a checkpoint of the reader's"
    ),
    "rotary export runs/default/models/rope-0 exported/rope-0": (
        "needs a finished default run; tests/sweep/test_export.py exports a run's model written by the test"
    ),
    "rotary sweep exported/rope-0 --lengths 128,256,512,1024 -o sweeps/rope-0": (
        "needs the exported model above, a minute; tests/sweep/test_sweep.py sweeps tiny checkpoints"
    ),
    "rotary sweep huggyllama/llama-7b --data pg19/test --documents 100 --lengths 2048,4096,8192 --scalings none,linear "
    "--stride 256 --max-windows 1000000 --no-passkey --dtype bfloat16 -o sweeps/pi-pg19": (
        "a 7B model and PG19: a GPU, hours"
    ),
    "rotary sweep meta-llama/Llama-2-7b-hf --data proof-pile/test --documents 10 --lengths "
    "2048,4096,8192,16384,32768,65536,131072 --scalings none,linear,dynamic,yarn --no-passkey --dtype bfloat16 "
    "--device-map auto -o sweeps/yarn-proofpile": "a 7B model at 128k tokens: GPUs, hours",
    "rotary sweep microsoft/Phi-3-mini-128k-instruct --data proof-pile/test --documents 10 --lengths "
    "4096,8192,16384,32768,65536,131072 --scalings none,longrope --dtype bfloat16 -o sweeps/longrope": (
        "a 3.8B model at 128k tokens: a GPU, hours"
    ),
    "python -m venv .venv": "creates an environment",
    ". .venv/bin/activate": "changes the shell's environment",
    "pip install torch==2.13.0": "installs packages",
    "pip install -e '.[plot]'": "installs packages",
    "pip install ninja": "installs packages",
}


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    language: str
    body: str

    @property
    def where(self) -> str:
        path = self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path
        return f"{path}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of ``path``; an indented code block is reported as language ``"indented"``."""
    found: list[Block] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    fence: tuple[int, str, str] | None = None  # (line, language, indentation)
    body: list[str] = []
    previous_blank = True
    item_indent: int | None = None  # where the text of the current list item starts
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if fence is None and stripped.startswith("```"):
            fence, body = (number, stripped[3:].strip(), line[:indent]), []
        elif fence is not None and stripped == "```":
            found.append(Block(path, fence[0], fence[1], "\n".join(body) + "\n"))
            fence = None
        elif fence is not None:
            body.append(line[len(fence[2]) :] if line.startswith(fence[2]) else line)
        elif stripped:
            item = re.match(r" *(?:[-*+]|\d+\.) +", line)
            if item:
                item_indent = len(item.group(0))
            else:
                if item_indent is not None and previous_blank and indent < item_indent:
                    item_indent = None  # the list has ended
                if previous_blank and indent >= (item_indent or 0) + 4:  # Markdown's indented code block
                    found.append(Block(path, number, "indented", stripped + "\n"))
        previous_blank = fence is None and not stripped
    assert fence is None, f"{path.name}:{fence[0]}: a fence that is never closed"
    return found


ALL = [b for path in DOCS for b in blocks(path)]
PYTHON = [b for b in ALL if b.language == "python"]
CONSOLE = [b for b in ALL if b.language == "console"]


def test_every_block_says_what_it_holds():
    bad = [f"{b.where} ({b.language or 'no language'})" for b in ALL if b.language not in LANGUAGES]
    assert not bad, f"give these a fenced block with one of {sorted(LANGUAGES)}: {', '.join(bad)}"


def test_the_docs_have_code_to_check():
    assert len(PYTHON) >= 10 and len(CONSOLE) >= 4
    assert {b.path.name for b in PYTHON} >= {
        "README.md",
        "core.md",
        "scaling.md",
        "experiment.md",
        "variants.md",
        "attention.md",
    }


def registries_scoped() -> contextlib.ExitStack:
    """A block may register a rope_type, a position encoding or a benchmark; the rest of the suite must not see it."""
    from rotary.models import POSITION_ENCODINGS
    from rotary.rope_types import ROPE_TYPES  # (ROPE_INIT_FUNCTIONS is a view of it)
    from rotary.tools.bench import scoped_registrations

    stack = contextlib.ExitStack()
    for scope in (ROPE_TYPES.scope(), POSITION_ENCODINGS.scope(), scoped_registrations()):
        stack.enter_context(scope)
    return stack


@pytest.mark.parametrize("block", PYTHON, ids=[b.where for b in PYTHON])
def test_python_block_runs(block, tmp_path, monkeypatch):
    """Each Python block runs, and what it claims holds: a block states its claims (the shapes, values
    and equalities its comments describe) as ``assert`` statements, which this run checks. A block
    without one would only be run, so it fails here."""
    assert re.search(r"^\s*assert ", block.body, re.MULTILINE), (
        f"{block.where}: the block asserts nothing; state what its comments claim as asserts"
    )
    monkeypatch.chdir(tmp_path)
    with registries_scoped(), contextlib.redirect_stdout(io.StringIO()):
        exec(compile(block.body, block.where, "exec"), {"__name__": "__docs__"})


@dataclass
class Command:
    argv: list[str]  # continuation lines joined, the comment dropped
    output: list[str]  # the lines shown under it


def commands(block: Block) -> list[Command]:
    found: list[Command] = []
    lines = block.body.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        assert line.startswith("$ "), f"{block.where}: output shown before any command: {line!r}"
        text = line[2:]
        while text.rstrip().endswith("\\"):
            i += 1
            text = text.rstrip()[:-1].rstrip() + " " + lines[i].strip()
        argv = shlex.split(text, comments=True)
        assert argv, f"{block.where}: an empty command"
        i += 1
        output = []
        while i < len(lines) and not lines[i].startswith("$ "):
            output.append(lines[i].rstrip())
            i += 1
        while output and not output[-1]:
            output.pop()
        found.append(Command(argv, output))
    return found


def _shown(command: Command) -> str:
    """The command as NOT_RUN spells it: the words, quoted only where the shell needs it."""
    return " ".join(a if re.fullmatch(r"[\w./=,:@%+-]+", a) else shlex.quote(a) for a in command.argv)


def _rotary_argv(argv: list[str]) -> list[str] | None:
    """The arguments of ``rotary``, ``python -m rotary`` or ``torchrun ... -m rotary``; None for other programs."""
    if argv[:1] == ["rotary"]:
        return argv[1:]
    if "-m" in argv and argv[0] in ("python", "python3", "torchrun"):
        i = argv.index("-m")
        if argv[i + 1 : i + 2] == ["rotary"]:
            return argv[i + 2 :]
    return None


def check_without_running(command: Command) -> None:
    argv, shown = command.argv, _shown(command)
    assert not command.output, f"{shown!r} is not run by the tests, so the output shown under it cannot be checked"
    rotary_args = _rotary_argv(argv)
    if rotary_args is not None:
        with contextlib.redirect_stderr(io.StringIO()) as err:
            try:
                build_parser().parse_args(rotary_args)
            except SystemExit as exc:
                pytest.fail(f"{shown!r} does not parse: {err.getvalue().strip()} (status {exc.code})")
    elif argv[0] == "make":
        targets = re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), flags=re.M)
        assert argv[1] in targets, f"{shown!r}: the Makefile has no target {argv[1]!r}"
    elif argv[0] in (".venv/bin/python", "bash"):
        assert (ROOT / argv[1]).is_file(), f"{shown!r}: no script {argv[1]} in the repository"
    elif argv[:2] == ["pip", "install"]:
        pinned = re.search(r"^TORCH\s*:=\s*(\S+)", (ROOT / "Makefile").read_text(), flags=re.M).group(1)
        pyproject = (ROOT / "pyproject.toml").read_text()
        extras_table = pyproject.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
        extras = dict(re.findall(r"^(\w+) = \[(.*?)\]$", extras_table, flags=re.M | re.S))  # (tomllib is 3.11+)
        for requirement in argv[2:]:
            if requirement.startswith("torch"):
                assert requirement == pinned, f"{shown!r}: the Makefile pins {pinned}"
            elif requirement.startswith("."):
                wanted = re.fullmatch(r"\.(?:\[([\w,]+)\])?", requirement)
                assert wanted, f"{shown!r}: {requirement!r} is not the project with extras"
                for extra in filter(None, (wanted.group(1) or "").split(",")):
                    assert extra in extras, f"{shown!r}: pyproject.toml has no extra {extra!r}"
            elif requirement == "ninja":
                assert '"ninja' in extras["dev"], f"{shown!r}: ninja is not in the dev extra"
            else:
                assert requirement == "-e", f"{shown!r}: nothing checks {requirement!r}; add a check here"


@pytest.mark.parametrize("block", CONSOLE, ids=[b.where for b in CONSOLE])
@pytest.mark.usefixtures("figures_drawn_once")  # a figure another test drew is written again, not redrawn
def test_console_block_runs_and_prints_what_it_shows(block, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "120")  # rich tables are as wide as the terminal, at least 100 columns
    for command in commands(block):
        shown = _shown(command)
        if shown in NOT_RUN:
            check_without_running(command)
            continue
        rotary_args = _rotary_argv(command.argv)
        assert rotary_args is not None, f"{block.where}: {shown!r} is neither a rotary command nor in NOT_RUN"
        out, err = io.StringIO(), io.StringIO()
        with registries_scoped(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = main(rotary_args)
        assert status == 0, f"{block.where}: {shown!r} exited {status}: {err.getvalue()}"
        if command.output:
            printed = [line.rstrip() for line in out.getvalue().rstrip().splitlines()]
            expected = command.output
            if expected[-1] == "...":  # the output shown is the beginning of what is printed
                expected, printed = expected[:-1], printed[: len(expected) - 1]
            assert printed == expected, f"{block.where}: {shown!r} printed\n" + "\n".join(printed)


def test_not_run_lists_only_commands_the_docs_show():
    shown = {_shown(c) for b in CONSOLE for c in commands(b)}
    assert set(NOT_RUN) <= shown, f"no longer in the docs: {sorted(set(NOT_RUN) - shown)}"


def test_the_block_reader_finds_indented_code_and_output(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text(
        "text\n\n    indented code\n\n- item\n\n    continued item\n\n```console\n$ rotary demo \\\n"
        "    --json  # a comment\nout\n\n```\n\n  ```python\n  x = 1\n  ```\n"
    )
    found = [(b.language, b.line, b.body) for b in blocks(doc)]
    assert found == [  # "continued item" is a paragraph of the list item, not code
        ("indented", 3, "indented code\n"),
        ("console", 9, "$ rotary demo \\\n    --json  # a comment\nout\n\n"),
        ("python", 16, "x = 1\n"),
    ]
    block = Block(doc, 9, "console", found[1][2])
    (command,) = commands(block)
    assert command.argv == ["rotary", "demo", "--json"] and command.output == ["out"]
    assert _shown(command) == "rotary demo --json"
    assert _shown(Command(["pip", "install", "-e", ".[plot]"], [])) == "pip install -e '.[plot]'"
