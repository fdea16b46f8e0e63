"""Property test of the command line: every subcommand, run in process on generated argument lists
(bad numbers, NaN, inf, huge values, strings, missing and unwritable paths, malformed JSON, unknown
names), exits 0, 1 or 2 with no traceback; status 2 comes with one line "rotary SUBCOMMAND: error: ..."
that names an option or a value the user gave. An uncaught exception fails the test with the argv.

The options of each subcommand are read from its argparse parser, so an option added later is
fuzzed too. Values come from pools chosen by the option's name: half the examples take only values
that fit each option on its own (so they reach the command's code, where combinations still clash),
the other half anything. Each subcommand must run to the end on at least one example, and a plotting
run (``plot ...``, ``report``) that exits 0 has written every figure it drew, PNG and SVG.

The same data draws the same figure: each distinct figure (a ``rotary.tools.plots.plot_*`` call with
arguments equal to an earlier one's) is drawn and rendered once per test process (``helpers.FIGURES``, shared
with the other command-line and docs tests), and every later argument list that asks for it gets it written
through rotary's own ``save`` (the same paths, the same errors for an unwritable place). Generated argument
lists ask for the same figures again and again (``plot scaling``: 34 figures, 10 distinct), and drawing one
costs about a second.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import tempfile
from pathlib import Path
from unittest import mock

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import FIGURES, DrawnOnce, leaf_parsers
from rotary.rope_types import ROPE_TYPES
from rotary.tools import plots
from rotary.tools.bench import harness
from rotary.tools.cli import main

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"

NUMBERS = [
    "0",
    "-1",
    "1",
    "2",
    "3",
    "7",
    "8",
    "16",
    "64",
    "128",
    "1000",
    "4096",
    "65537",
    "2147483648",
    "1099511627777",
    "99999999999999999999",
    "1e-300",
    "1e300",
    "1e-5",
    "0.5",
    "1.5",
    "nan",
    "inf",
    "-inf",
    "abc",
    "",
    " 8",
    "0x10",
    "8.0",
]
NAMES = [
    "",
    ",",
    "nosuch",
    "sliding_attention",
    "full_attention",
    "yarn",
    "linear",
    "default",
    "fp32",
    "fp8",
    "decode-small",
    "decode",
    "mine",
    "llama3",
    "dynamic",
    "longrope",
    "proportional",
    "ntk",
    "é",
    "a,b",
]
SCALING_KEYS = [
    "rope_type",
    "type",
    "factor",
    "original_max_position_embeddings",
    "max_position_embeddings",
    "beta_fast",
    "beta_slow",
    "low_freq_factor",
    "high_freq_factor",
    "short_factor",
    "long_factor",
    "attention_factor",
    "mscale",
    "mscale_all_dim",
    "partial_rotary_factor",
    "truncate",
    "rope_theta",
    "bogus",
]
JSON_VALUES = st.one_of(
    st.sampled_from(["yarn", "linear", "dynamic", "longrope", "llama3", "ntk", "proportional", "default", "nope"]),
    st.integers(-10, 10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.lists(st.floats(-2, 100, allow_nan=False), max_size=3),
    st.sampled_from([1e-300, 1e300, 0.0, -0.0, 2.0, 32, 4096]),
)
SCALING = st.one_of(
    st.sampled_from(["{bad", "[1]", "null", '"yarn"', "{}", "1e999", '{"rope_type": "yarn"}']),
    st.dictionaries(st.sampled_from(SCALING_KEYS), JSON_VALUES, max_size=5).map(
        lambda d: json.dumps(d, allow_nan=True)
    ),
)


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    """Files the generated arguments point at: configs good and bad, q/k vectors, cases files, unwritable places."""
    import numpy as np

    d = tmp_path_factory.mktemp("pool")
    (d / "not_json.json").write_text("{not json")
    (d / "list.json").write_text("[1, 2]")
    (d / "empty.json").write_text("")
    (d / "latin1.json").write_bytes(b'{"model_type": "llama", "name": "caf\xe9"}')
    (d / "no_heads.json").write_text('{"model_type": "llama"}')
    (d / "bad_theta.json").write_text('{"model_type": "llama", "head_dim": 64, "rope_theta": -1}')
    (d / "huge.json").write_text('{"model_type": "llama", "head_dim": 1048576, "max_position_embeddings": 1e30}')
    (d / "folder").mkdir()
    (d / "folder" / "config.json").write_text((FIXTURES / "qwen2.json").read_text())
    (d / "empty_folder").mkdir()
    (d / "existing_file").write_text("x")
    np.save(d / "vec8.npy", np.ones(8))
    np.save(d / "vec128.npy", np.ones(128))
    np.save(d / "matrix.npy", np.ones((2, 2)))
    torch.save({"not": "a tensor"}, d / "dict.pt")
    (d / "vec.txt").write_text("1 2 3")
    (d / "ok_cases.py").write_text("x = 1\n")
    (d / "raising_cases.py").write_text("raise RuntimeError('boom')\n")
    (d / "syntax_cases.py").write_text("def (:\n")
    (d / "exit_cases.py").write_text("import sys\nsys.exit(3)\n")
    checkpoint, run_model = _sweep_inputs(d)
    fixtures = [
        str(FIXTURES / f)
        for f in ("llama3_1.json", "gemma3_nested.json", "phi3_longrope.json", "deepseek_v3.json", "gptj.json")
    ]
    inputs = [
        str(d / n)
        for n in (
            "not_json.json",
            "list.json",
            "empty.json",
            "latin1.json",
            "no_heads.json",
            "bad_theta.json",
            "huge.json",
            "folder",
            "empty_folder",
            "existing_file",
            "missing.json",
            "vec8.npy",
            "vec128.npy",
            "matrix.npy",
            "dict.pt",
            "vec.txt",
        )
    ]
    return {
        "fixtures": fixtures,
        "vectors": [str(d / "vec8.npy"), str(d / "vec128.npy")],
        "plausible outputs": ["out", "out/", "sub/dir/stem", "x.png"],
        "inputs": fixtures + inputs + ["/dev/null", "/proc/self/status", "/", ""],
        "outputs": [
            "out",
            "out/",
            "sub/dir/stem",
            "x.png",
            "x.svg",
            str(d / "existing_file"),
            str(d / "existing_file/x"),
            "/dev/null/x",
            "/proc/rotary-test/x",
            "/proc/rotary-test",
            "",
            ".",
            "/",
        ],
        "cases": [
            str(d / n) for n in ("ok_cases.py", "raising_cases.py", "syntax_cases.py", "exit_cases.py", "missing.py")
        ]
        + [str(d / "vec.txt")],
        "checkpoint": checkpoint,
        "run model": run_model,
    }


def _sweep_inputs(d: Path) -> tuple[str, str]:
    """A tiny transformers checkpoint (rotary sweep's MODEL) and a run's model directory (rotary export's)."""
    import dataclasses

    import transformers

    from rotary.tools.experiments.config import ExperimentConfig
    from rotary.tools.experiments.plan import model_specs
    from rotary.tools.experiments.train import CHECKPOINT, CHECKPOINT_FORMAT, build_model
    from rotary.tools.sweep.export import byte_tokenizer

    config = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=16,
    )
    transformers.LlamaForCausalLM(config).save_pretrained(d / "checkpoint")
    byte_tokenizer().save_pretrained(d / "checkpoint")
    run = ExperimentConfig(preset="tiny", train_length=64, hidden_size=16, num_layers=1, num_heads=2, seeds=1)
    spec = next(s for s in model_specs(run) if s.encoding == "rope")
    (d / "run_model").mkdir()
    payload = {
        "format": CHECKPOINT_FORMAT,
        "spec": dataclasses.asdict(spec),
        "config": run.to_dict(),
        "step": 1,
        "model": build_model(spec, run).state_dict(),
        "optimizer": {},
        "losses": [0.0],
        "seconds": 0.0,
    }
    torch.save(payload, d / "run_model" / CHECKPOINT)
    return str(d / "checkpoint"), str(d / "run_model")


#: values that fit each option, by its dest: half the examples draw from these so that they get past
#: argparse into the commands' own code (and their combinations: --rotary-dim above --head-dim, a
#: longrope block of another width, a layer type the config lacks, ... still fail there)
PLAUSIBLE = {
    "head_dim": ["8", "16", "32", "64", "128", "6"],
    "rotary_dim": ["4", "8", "16", "32", "64"],
    "base": ["10000", "500000", "1000000", "2.5", "100"],
    "max_position": ["16", "4096", "131072", str(2**40)],
    "seq_len": ["1", "2", "8", "33", "64"],
    "context": ["4096", "131072"],
    "max_distance": ["1", "16", "300"],
    "samples": ["1", "8", "64"],
    "seed": ["0", "1", str(2**63 - 1)],
    "threads": ["1", "2"],
    "repeats": ["1", "2"],
    "layer_type": ["sliding_attention", "full_attention"],
    "rope_type": sorted(t for t, spec in ROPE_TYPES.items() if spec.example),
    "shapes": ["decode-small", "prefill-small"],
    "dtypes": ["fp32", "bf16", "fp32,bf16"],
    "pairing": ["half", "interleaved"],
    "suites": ["hf_llama_patch"],
    # rotary plot axial / learnable
    "heads": ["1", "2", "4"],
    "extent": ["1", "3", "8"],
    "steps": ["1", "5", "20"],
    # rotary experiment
    "train_length": ["16", "64", "112"],
    "eval_lengths": ["112,224", "64", "16,32,64"],
    "encodings": ["rope", "rope,alibi", "none,learned", "xpos"],
    "scalings": ["none", "linear,yarn", "dynamic"],
    "seeds": ["1", "2"],
    "jobs": ["1", "2"],
    "extend_steps": ["0", "2"],
    "extend_length": ["224", "448"],
    "extend_scalings": ["none", "linear,yarn"],
    "extend_batch_size": ["2", "4"],
    "finetune_learning_rate": ["0.001"],
    "bases": ["100,10000", "20"],
    "transfer_steps": ["2", "4"],
    "eval_stride": ["56", "16"],
    "sliding_tokens": ["0", "224"],
    "retrieval_trials": ["2", "4"],
    "retrieval_span": ["8", "16"],
    "retrieval_distances": ["56,112", "64"],
    "hidden_size": ["16", "32"],
    "num_layers": ["1", "2"],
    "num_heads": ["1", "2", "4"],
    "rope_base": ["10000", "500"],
    "batch_size": ["3", "8"],
    "learning_rate": ["0.001", "0.01"],
    "min_learning_rate": ["0.0001"],
    "warmup_steps": ["0", "2"],
    "weight_decay": ["0", "0.1"],
    "grad_clip": ["1.0"],
    "passkey_fraction": ["0", "0.5"],
    "passkey_trials": ["50", "64"],
    "passkey_depths": ["0,0.5,1", "0.25"],
    "eval_tokens": ["896", "4096"],
    "held_out_fraction": ["0.1", "0.5"],
    "checkpoint_every": ["4", "100"],
}
#: every registered rope_type's example block, as --scaling takes it
SCALING_EXAMPLES = [json.dumps(spec.example(64).block) for spec in ROPE_TYPES.values() if spec.example]


def value_for(action: argparse.Action, pool: dict, wild: bool) -> st.SearchStrategy[str]:
    """A value for ``action``: from its plausible pool unless ``wild`` (then anything of its kind)."""
    name = action.dest
    if action.choices is not None and not wild:
        return st.sampled_from(sorted(map(str, action.choices)))
    if name == "out":
        return st.sampled_from(pool["plausible outputs"] if not wild else pool["outputs"])
    if name == "scaling":
        return st.sampled_from(SCALING_EXAMPLES) if not wild else SCALING
    if name in ("config", "configs", "data"):
        return st.sampled_from(pool["fixtures"] if not wild else pool["inputs"])
    if name == "model":  # rotary sweep
        return st.sampled_from([pool["checkpoint"]] if not wild else [pool["checkpoint"], *pool["inputs"]])
    if name == "source":  # rotary export
        return st.sampled_from([pool["run model"]] if not wild else [pool["run model"], *pool["inputs"]])
    if name == "target":
        return st.sampled_from(pool["plausible outputs"] if not wild else pool["outputs"])
    if name in ("q", "k"):
        return st.sampled_from(pool["vectors"] if not wild else pool["inputs"])
    if name == "resume":
        return st.sampled_from(pool["outputs"] + pool["inputs"])
    if name == "cases":
        return st.sampled_from(pool["cases"][:1] if not wild else pool["cases"])
    if not wild and name in PLAUSIBLE:
        return st.sampled_from(PLAUSIBLE[name])
    if name in ("layer_type", "rope_type", "suites", "dtypes", "shapes", "pairing"):
        return st.sampled_from(NAMES)
    return st.one_of(
        st.sampled_from(NUMBERS), st.integers(-(2**70), 2**70).map(str), st.floats().map(repr), st.sampled_from(NAMES)
    )


#: options left out: each valid use costs far more than the others (torch.compile of a baseline)
SKIP = {("bench", "--compile")}
#: always given to bench (the fuzzed options still override them): keeps a valid run at about a second
BENCH_BASE = [
    "--quick",
    "--no-memory",
    "--no-compile",
    "--repeats",
    "1",
    "--shapes",
    "decode-small",
    "--dtypes",
    "fp32",
]
#: always given to sweep (overridable): one length, one short document, no passkey: a valid run in seconds;
#: --data takes several values, so it is not last (the MODEL drawn after it would be read as one)
SWEEP_BASE = ["--data", str(FIXTURES / "llama3_1.json"), "--lengths", "32", "--no-passkey", "--documents", "1"]
#: always given to experiment (overridable); its training is replaced by ReachedTraining below
EXPERIMENT_BASE = ["--preset", "tiny", "--device", "cpu"]


class ReachedTraining(Exception):
    """``rotary experiment`` got past every check of its arguments, data and run directory. Training and
    evaluation take seconds to minutes and are tested in tests/experiments; here they are not run."""


@st.composite
def argv_for(draw, command: str, pool: dict) -> list[str]:
    parser = leaf_parsers()[command]
    argv = command.split()
    argv += {"bench": BENCH_BASE, "experiment": EXPERIMENT_BASE, "sweep": SWEEP_BASE}.get(command, [])
    positionals = [a for a in parser._actions if not a.option_strings and not isinstance(a, argparse._SubParsersAction)]
    options = [
        a
        for a in parser._actions
        if a.option_strings and not isinstance(a, argparse._HelpAction) and (command, a.option_strings[-1]) not in SKIP
    ]
    wild = draw(st.booleans())  # else every value fits its option on its own
    for action in positionals:  # a required one (sweep's MODEL, export's two) always: argparse's "required" names none
        if action.nargs is None or draw(st.booleans()):
            argv.append(draw(value_for(action, pool, wild)))
    for action in draw(st.lists(st.sampled_from(options), max_size=4)) if options else []:
        flag = draw(st.sampled_from(action.option_strings))
        if action.nargs == 0:
            argv.append(flag)
        elif isinstance(action, argparse.BooleanOptionalAction):
            argv.append(draw(st.sampled_from([flag, "--no-" + flag.removeprefix("--")])))
        else:
            argv += [flag, draw(value_for(action, pool, wild))]
    if wild and draw(st.integers(0, 4)) == 0:
        argv.append(draw(st.sampled_from(["--nosuch", "extra", "-x", "--json=1"])))
    return argv


def assert_figure(path: Path) -> None:
    data = path.read_bytes()
    if path.suffix == ".png":
        assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    else:
        assert path.suffix == ".svg" and b"<svg" in data[:2000], path


def run_in_process(argv: list[str], figures: DrawnOnce | None = None) -> tuple[int, str]:
    """``main(argv)`` in a fresh working directory; returns (status, stderr). Registries and torch's
    thread count that a run may change are restored. A run that exits 0 has written, as PNG and SVG,
    every figure it saved (``figures``: each distinct figure drawn once, see :class:`DrawnOnce`)."""
    threads = torch.get_num_threads()
    cwd = os.getcwd()
    err = io.StringIO()
    saved: list[Path] = []
    real_save = plots.save
    drawn_before = figures.calls if figures is not None else 0

    def save(fig, path):
        files = real_save(fig, path)
        saved.extend(Path(f).absolute() for f in files)
        return files

    with tempfile.TemporaryDirectory() as work:
        os.chdir(work)
        try:
            with contextlib.ExitStack() as stack:
                stack.enter_context(harness.scoped_registrations())  # --cases FILE.py registers methods, suites
                stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
                stack.enter_context(contextlib.redirect_stderr(err))
                stack.enter_context(mock.patch("rotary.tools.experiments.run.train_model", side_effect=ReachedTraining))
                # two models at a time (--jobs 2, or the default on 2 cores) train in worker processes
                stack.enter_context(
                    mock.patch("rotary.tools.experiments.run.run_in_parallel", side_effect=ReachedTraining)
                )
                stack.enter_context(mock.patch.object(plots, "save", save))
                for patch in figures.patches() if figures is not None else []:
                    stack.enter_context(patch)
                try:
                    status = main(argv)
                except SystemExit as exc:  # argparse: --help (0) and usage errors (2)
                    status = exc.code if isinstance(exc.code, int) else 1
                except ReachedTraining:
                    status = 0
        except Exception as exc:  # noqa: BLE001  the property: nothing escapes main
            pytest.fail(f"rotary {' '.join(argv)!s} raised {type(exc).__name__}: {exc}")
        finally:
            os.chdir(cwd)
            torch.set_num_threads(threads)
        if status == 0 and figures is not None:  # every figure drawn was written, as PNG and SVG
            drawn = figures.calls - drawn_before
            assert len(saved) == 2 * drawn and {p.suffix for p in saved} <= {".png", ".svg"}, (argv, drawn, saved)
            for path in saved:
                assert_figure(path)
    return status, err.getvalue()


def names(message: str, token: str) -> bool:
    """Whether ``message`` names ``token``: as a substring, or for one character as a word of its own
    ("got head_dim=3" names "3"; "-o .: is a directory" names "."), or quoted when empty."""
    if len(token) >= 2:
        return token in message
    if not token:
        return "''" in message
    return re.search(rf"(?<![\w.]){re.escape(token)}(?![\w.])", message) is not None


def check(argv: list[str], command: str, figures: DrawnOnce | None = None) -> int:
    """Run ``argv``; a usage error must be one line that names the subcommand and something the user gave."""
    status, err = run_in_process(argv, figures)
    assert status in (0, 1, 2), (argv, status, err)
    assert "Traceback" not in err, (argv, err)
    if status == 2:
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1, (argv, err)
        prefix = f"rotary {command}: error: "
        assert lines[0].startswith(prefix), (argv, err)
        message = lines[0][len(prefix) :]
        given = [token.split("=")[0] for token in argv[len(command.split()) :]] + argv[len(command.split()) :]
        assert any(names(message, token) for token in given), (
            f"the error names neither an option nor a value given: {err!r}",
            argv,
        )
    return status


#: examples per subcommand under `make test` (the same examples every run): the fast ones get many, the ones
#: that draw figures a few (each distinct figure costs about a second); `make fuzz` (hypothesis profile
#: "explore", new examples every run) draws FUZZ_FACTOR times as many
BUDGET = {
    "inspect": 50,
    "verify": 30,
    "demo": 15,
    "plot decay": 15,
    "plot frequencies": 12,
    "plot scaling": 8,
    "plot scores": 12,
    "plot positions": 12,
    "report": 4,
    "bench": 8,
    "build": 4,
    "plot axial": 5,
    "plot learnable": 5,
    "plot variants": 3,
    "experiment": 25,
    "sweep": 6,
    "export": 10,
}
FUZZ_FACTOR = 4 if os.environ.get("ROTARY_HYPOTHESIS_PROFILE") == "explore" else 1


@pytest.mark.slow
@pytest.mark.parametrize("command", sorted(leaf_parsers()))
def test_every_subcommand_exits_cleanly_on_generated_arguments(command, pool):
    statuses: list[int] = []
    figures = FIGURES

    @settings(
        max_examples=BUDGET.get(command, 10) * FUZZ_FACTOR,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(argv_for(command, pool))
    def prop(argv):
        statuses.append(check(argv, command, figures))

    prop()
    # the generators reach the commands' own code, not only argparse's checks (build: 1 without a compiler)
    finished = (0, 1) if command == "build" else (0,)
    assert any(s in finished for s in statuses), (
        f"no generated argument list for {command!r} ran to the end: {statuses}"
    )


def test_the_budget_names_every_subcommand():
    """A new subcommand gets a budget chosen for its cost, not the default, once it is listed here."""
    assert set(BUDGET) == set(leaf_parsers())
