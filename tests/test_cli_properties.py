"""Property test of the command line: every subcommand, run in process on generated argument lists that are
decided before they run.

Valid lists are made from the documented contract (each subcommand's --help, its module's docstrings,
docs/scaling.md, docs/experiment.md): values each option takes on its own, combined only as the documented
rules allow (``config_items`` and ``valid_items`` state each rule where they apply it: a rotated width no wider
than the head, a longrope block with one factor per rotated pair, no YaRN example block under a CONFIG whose
lengths disagree with it, --layer-type only with a config that has one block per layer type, --axial / --mixed
instead of a config, plot scaling's configuration flags only with CONFIG or --scaling, export's OUT or -o ...).
They must run to the end: status 0 (1 where commands/__init__.py documents it: a failed check of verify and demo,
build without a compiler), and a plotting run has written every figure it drew, PNG and SVG.

Invalid lists are a valid list with one value replaced by one its option refuses on its own (``_invalid_pool``:
read from the argparse types in rotary/tools/commands/ and the documents), or an unknown option. They must be
refused: status 2 and one line "rotary SUBCOMMAND: error: ..." naming an option or a value given. Either way
nothing escapes main (no traceback). The options are read from each argparse parser, and
``test_every_option_has_valid_and_invalid_values`` fails for an option that has no valid or no invalid values,
so a new option is decided before it is fuzzed.

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
from rotary.tools.commands.plot import AXIAL_FIGURE_PRESETS
from rotary.variants import PRESETS

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"


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
    heads = sorted({int(h) for h in HEAD_DIMS} | {facts[0] for facts in FIXTURE_FACTS.values()})
    for h in heads:
        np.save(d / f"vec{h}.npy", np.ones(h))
    return {
        "fixtures": fixtures,
        "vectors": {h: str(d / f"vec{h}.npy") for h in heads},
        "existing": str(d / "existing_file"),
        # configs each refused on its own: not JSON, not an object, empty, not UTF-8, a bad rope_theta, a head
        # width past the commands' 1024, a folder without config.json, missing, not a config (no_heads.json is
        # valid: transformers fills a llama config's sizes with LlamaConfig's defaults)
        "bad configs": [inputs[i] for i in (0, 1, 2, 3, 5, 6)]
        + [str(d / n) for n in ("empty_folder", "existing_file", "missing.json")]
        + [str(d / "vec8.npy"), "", "/"],
        # q/k files refused: a [2, 2] matrix, a dict, text, missing, of another width than any head here
        "bad vectors": [str(d / n) for n in ("matrix.npy", "dict.pt", "vec.txt", "missing.npy")],
        "ok cases": [str(d / "ok_cases.py")],
        # --cases files refused: raising, not Python, exiting, missing, not .py
        "bad cases": [str(d / n) for n in ("raising_cases.py", "syntax_cases.py", "exit_cases.py", "missing.py")]
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


# ---------------------------------------------------------------------------------------------------------------
# Values each option takes, and values it certainly refuses, on their own (read from the argparse types of
# rotary/tools/commands/ and the documents named beside each). Valid values are chosen so that each also fits
# every other option's valid values; where the documented contract ties two options together, the generator
# below (``valid_argv``) states the rule where it applies it.

#: a positive integer (``argument_types.positive_int`` and ``count``): not an int, or <= 0
NOT_POSITIVE_INT = ["0", "-1", "abc", "1.5", "nan", "", "0x10", "1e3", "8.0"]
#: ``count(maximum, ...)``: also one past the maximum its --help or type states
TOO_MANY = {
    "head_dim": "1025",  # argument_types.COMMAND_MAX_HEAD_DIM
    "rotary_dim": "1025",
    "seq_len": "2049",  # argument_types.MAX_SEQ_LEN (inspect and plot scaling take lengths: 2**40 + 1)
    "max_position": str(2**40 + 1),  # argument_types.MAX_LENGTH
    "context": str(2**40 + 1),
    "heads": "17",
    "extent": "257",
    "steps": "10001",
    "repeats": "101",  # "at most 100" (bench --help)
    "max_distance": "65537",
    "samples": "65537",
    "trials": "10001",
    "threads": "100000",
    "jobs": "100000",
}
#: inspect's and plot scaling's --seq-len are lengths (length_count), not the 2048 positions of the others
TOO_MANY_BY_COMMAND = {("inspect", "seq_len"): str(2**40 + 1), ("plot scaling", "seq_len"): str(2**40 + 1)}
#: ``positive_float``: not a finite number > 0; a RoPE base also not > 1 (docs/scaling.md, "What each
#: parameter may be": base "a finite number > 1", "≤ 1 ... refused always")
NOT_POSITIVE_FLOAT = ["0", "-1", "nan", "inf", "-inf", "abc", ""]
NOT_A_BASE = [*NOT_POSITIVE_FLOAT, "1", "0.5"]
#: ``argument_types.seed``: an int in 0 .. 2**63 - 1
NOT_A_SEED = ["-1", str(2**63), "abc", "1.5", ""]
#: experiment's ``_non_negative_int``, ``_float`` (finite)
NOT_NON_NEGATIVE_INT = ["-1", "abc", "1.5", "nan", ""]
NOT_FINITE = ["nan", "inf", "-inf", "abc", ""]
#: a name no list of choices holds
UNKNOWN_NAME = ["nosuch", "é"]
#: --scaling JSON: not JSON, not an object (configuration._scaling_json), or a block docs/scaling.md's
#: "Validation" table refuses (unknown rope_type, a missing required key, a number written as a string)
BAD_SCALING = [
    "{bad",
    "[1]",
    "null",
    '"yarn"',
    "1e999",
    '{"rope_type": "nosuch"}',
    '{"rope_type": "linear"}',
    '{"rope_type": "linear", "factor": "2.0"}',
]
#: flags (store_true, BooleanOptionalAction) have no value to get wrong; the wrong form is one with a value
FLAG_WITH_VALUE = "=1"

#: options left out of the draws: each valid use costs far more than the others (torch.compile of a baseline)
SKIP = {("bench", "--compile")}
#: options never drawn valid, with why (their invalid values are still drawn)
NOT_DRAWN_VALID = {
    ("experiment", "resume"): "a valid --resume needs an interrupted run of the same settings (tests/experiments)",
    ("experiment", "preset"): "the base gives --preset tiny; default and large read more text than a test can afford",
    ("sweep", "device_map"): "--device-map auto needs accelerate and spreads a model over devices (tests/test_sweep)",
}
#: always given to bench (the drawn options follow and override them): keeps a valid run at about a second
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
    "--suites",
    "none",
]
#: always given to sweep (overridable): one length, one short document, no passkey: a valid run in seconds;
#: --data takes several values, so it is not last (the MODEL drawn after it would be read as one)
SWEEP_BASE = ["--data", str(FIXTURES / "llama3_1.json"), "--lengths", "32", "--no-passkey", "--documents", "1"]
#: always given to experiment (overridable); its training is replaced by ReachedTraining below
EXPERIMENT_BASE = ["--preset", "tiny", "--device", "cpu"]
#: the tiny preset's training length L (experiments/config.py PRESETS["tiny"]), which the drawn values respect
TINY_L = 112


class ReachedTraining(Exception):
    """``rotary experiment`` got past every check of its arguments, data and run directory. Training and
    evaluation take seconds to minutes and are tested in tests/experiments; here they are not run."""


#: what each fixture config states (tests/fixtures/*.json), for the rules that tie the flags to it
FIXTURE_FACTS = {
    # name: (head_dim, a rotated width the file fixes or None, longrope lists of that width, layer types)
    "llama3_1.json": (128, None, False, ()),
    "gemma3_nested.json": (256, None, False, ("sliding_attention", "full_attention")),
    "phi3_longrope.json": (96, None, True, ()),
    "deepseek_v3.json": (64, None, False, ()),
    "gptj.json": (256, 64, False, ()),
}
HEAD_DIMS = ["8", "16", "32", "64", "96", "128", "256"]  # even and at most 1024: pairing.py, argument_types
ROTARY_DIMS = ["8", "16", "32", "64"]
BASES = ["2.5", "100", "10000", "500000", "1e6"]  # finite and > 1: docs/scaling.md
EXAMPLE_TYPES = sorted(t for t, spec in ROPE_TYPES.items() if spec.example)


def _out(kind: str) -> list[str]:
    """Valid -o values for an ``output.add_output_argument`` kind: a file stem, a directory or a printed file."""
    return {
        "stem": ["out", "out/", "sub/dir/stem", "x.png", "."],
        "dir": ["out", "out/", "sub/dir", "."],
        "file": ["out", "sub/dir/out.txt"],
        "new": ["out", "sub/dir"],  # a new directory: export's OUT, experiment's run directory
    }[kind]


def _bad_out(kind: str, pool: dict) -> list[str]:
    """-o values each kind refuses (output.py): empty, under a file, in a place no one can write."""
    bad = ["", pool["existing"] + "/x", "/dev/null/x", "/proc/rotary-test/x"]
    if kind in ("dir", "new"):
        bad.append(pool["existing"])  # "exists and is not a directory"
    if kind == "file":
        bad.append(".")  # "is a directory; give a file name"
    return bad


def _invalid_pool(command: str, action: argparse.Action, pool: dict) -> list[str]:
    """Values ``action`` of ``command`` refuses on their own (its argparse type, its choices, the docs)."""
    dest, kind = action.dest, action.type
    if action.nargs == 0 or isinstance(action, argparse.BooleanOptionalAction):
        return [FLAG_WITH_VALUE]
    if action.choices is not None:
        return UNKNOWN_NAME
    if dest == "out":
        return _bad_out(OUT_KIND.get(command, "file"), pool)
    if dest in ("config", "configs"):
        return pool["bad configs"]
    if dest in ("q", "k"):
        return pool["bad vectors"]
    if dest == "model" or dest == "source":
        return pool["bad configs"]
    if dest == "target":
        return _bad_out("new", pool)
    if dest == "resume":
        return [pool["existing"], "missing-run"]
    if dest == "cases":
        return pool["bad cases"]
    if dest == "data":
        return ["/nonexistent/x.txt"]
    if dest == "scaling":
        return BAD_SCALING
    if dest in ("base", "rope_base"):  # a RoPE base: > 1 (docs/scaling.md; experiment --rope-base's --help)
        return NOT_A_BASE
    if dest == "bases":  # experiment --bases: finite numbers > 1, each once (docs/experiment.md)
        return ["1", "0.5", "nan", "abc", "100,100"]
    if (command, dest) == ("experiment", "seeds"):
        return ["0", "-1", "abc"]
    if getattr(kind, "__name__", "") == "positive_int":
        return NOT_POSITIVE_INT
    if getattr(kind, "__name__", "") == "count":  # also one past its maximum
        return [*NOT_POSITIVE_INT, TOO_MANY_BY_COMMAND.get((command, dest), TOO_MANY[dest])]
    if getattr(kind, "__name__", "") == "positive_float":
        return NOT_POSITIVE_FLOAT
    if getattr(kind, "__name__", "") == "seed":
        return NOT_A_SEED
    if getattr(kind, "__name__", "") in ("_non_negative_int",):
        return NOT_NON_NEGATIVE_INT
    return INVALID_BY_DEST.get((command, dest), INVALID_BY_DEST.get(dest, []))


#: invalid values of options whose type says little (names, lists), by (command, dest) or dest
INVALID_BY_DEST = {
    ("plot positions", "seq_len"): [*NOT_POSITIVE_INT, "2", "2049"],  # 3 .. 2048 (plot positions --help)
    "layer_type": ["nosuch"],  # a layer type the config does not name (or no CONFIG at all)
    "rope_type": ["nosuch", "default"],  # plot scaling: "registered" scaling methods; default scales nothing
    "shapes": ["nosuch", "decode-small,decode-small"],  # bench --help: "shape names, each once"
    "dtypes": ["fp8", "nosuch"],  # bench --help: "fp32, bf16, fp16"
    "suites": ["nosuch", "decode,decode"],  # bench --help: "suites to run, each once"
    ("sweep", "lengths"): ["0", "-1", "abc", ""],  # sweep._ints: positive integers
    ("sweep", "scalings"): ["nosuch", "longrope"],  # "every one the checkpoint admits": not LongRoPE (docs/sweep.md)
    ("sweep", "depths"): ["2", "-0.5", "abc", ""],  # "passkey depths in [0, 1]"
    ("sweep", "device"): ["nosuch", "tpu"],  # "cpu, cuda, cuda:1, ..."
    ("experiment", "eval_lengths"): ["0", "-1", "abc", "56"],  # positive; 56 < L (docs/experiment.md errors table)
    ("experiment", "encodings"): ["nosuch", ""],  # "unknown --encodings ... or none at all"
    ("experiment", "scalings"): ["nosuch", "none,none"],
    ("experiment", "extend_scalings"): ["nosuch", "dynamic"],  # docs/experiment.md: dynamic NTK is not fine-tuned
    ("experiment", "passkey_depths"): ["2", "-0.5", "nan", "abc"],  # "fractions in [0, 1]"
    ("experiment", "passkey_fraction"): ["2", "-1", "nan"],  # "fraction", [0, 1]
    ("experiment", "held_out_fraction"): ["0", "1", "2", "nan"],  # "last fraction of the text": (0, 1)
    ("experiment", "weight_decay"): ["-1", "nan", "inf"],  # docs/experiment.md: finite numbers
    ("experiment", "retrieval_distances"): ["0", "abc", "100000"],  # must fit in the longest evaluation length
}

#: the -o kind of each subcommand (output.add_output_argument); export's and experiment's are new directories
OUT_KIND = {
    "plot scaling": "dir",
    "plot variants": "dir",
    "report": "dir",
    "sweep": "dir",
    "export": "new",
    "experiment": "new",
    **dict.fromkeys(["plot decay", "plot frequencies", "plot scores", "plot positions", "plot axial"], "stem"),
    **dict.fromkeys(["plot learnable"], "stem"),
}

#: valid values by (command, dest) or dest; a callable takes the draw's context (the values drawn so far,
#: in parser order) and returns the values that fit it, an empty list where none does
VALID_BY_DEST = {
    "base": BASES,
    "max_position": ["16", "4096", "131072", str(2**40)],
    "pairing": ["half", "interleaved"],
    "seed": ["0", "1", str(2**63 - 1)],
    ("inspect", "seq_len"): ["1", "8", "4096", "131072"],
    ("plot scaling", "seq_len"): ["1", "4096", "131072"],
    ("plot scaling", "rope_type"): EXAMPLE_TYPES,
    ("plot positions", "seq_len"): ["3", "8", "33", "64"],  # at least 3 (plot positions --help)
    "seq_len": ["1", "2", "8", "33", "64"],  # verify, scores, demo: at most 2048
    ("verify", "heads"): ["1", "2", "4"],
    ("plot axial", "heads"): ["1", "2", "4"],
    "extent": ["1", "3", "8"],
    ("plot learnable", "steps"): ["1", "5", "12"],
    ("plot decay", "head_dim"): ["8", "16", "64", "128"],
    ("plot decay", "max_distance"): ["1", "16", "300"],
    ("plot decay", "samples"): ["1", "8", "64"],
    ("plot frequencies", "head_dim"): ["8", "64", "128"],
    ("plot frequencies", "context"): ["4096", "131072"],
    ("demo", "head_dim"): ["6", "8", "64", "128"],
    # bench: --shapes and --suites are not both none (bench --help); BENCH_BASE gives --suites none
    ("bench", "device"): ["cpu"] + (["cuda"] if torch.cuda.is_available() else []),
    ("bench", "dtypes"): ["fp32", "bf16", "fp32,bf16"],
    ("bench", "shapes"): ["decode-small", "prefill-small"],
    ("bench", "suites"): ["decode", "rmsnorm_rotate"],
    ("bench", "repeats"): ["1", "2"],
    ("bench", "threads"): ["1", "2"],
    # sweep: a tiny Llama checkpoint, lengths past its 16 positions
    ("sweep", "lengths"): ["32", "16,32"],
    ("sweep", "scalings"): ["none", "none,linear", "yarn", "ntk,dynamic"],
    ("sweep", "original_length"): ["8", "16"],
    ("sweep", "documents"): ["1", "2"],
    # --stride: fewer tokens than the shortest length (sweep --help); the base's --lengths is 32
    ("sweep", "stride"): lambda c: [
        v for v in ("8", "16") if int(v) < min(map(int, c.get("lengths", "32").split(",")))
    ],
    ("sweep", "max_windows"): ["1", "2"],
    ("sweep", "depths"): ["0,0.5,1", "0.25"],
    ("sweep", "trials"): ["1", "2"],
    ("sweep", "device"): ["cpu"],
    ("sweep", "data"): [str(FIXTURES / "llama3_1.json"), str(FIXTURES / "gptj.json")],  # text files, one document each
    ("sweep", "threads"): ["1", "2"],
    # experiment: each value fits the tiny preset and every other value here; those tied to L by the docs
    # (experiments/config.py field comments, docs/experiment.md "Errors") are functions of the drawn L
    ("experiment", "jobs"): ["1", "2"],
    ("experiment", "study"): ["base", "transfer"],
    ("experiment", "train_length"): ["112", "128"],  # at least the passkey sample's 110 tokens (docs/experiment.md)
    ("experiment", "eval_lengths"): lambda c: [f"{c['L']}", f"{c['L']},{2 * c['L']}", f"{c['L']},{4 * c['L']}"],
    # the extension stage (tiny: 4 steps) fine-tunes the RoPE model: rope stays among the encodings
    ("experiment", "encodings"): ["rope", "rope,alibi", "none,learned,rope", "xpos,rope"],
    # --scalings: 'none' (the trained model as it is) is always among them (the --help text says so)
    ("experiment", "scalings"): ["none", "none,linear,yarn", "dynamic,none"],
    ("experiment", "seeds"): ["1", "2"],
    ("experiment", "extend_steps"): ["0", "2"],
    ("experiment", "extend_length"): lambda c: [str(2 * c["L"]), str(4 * c["L"])],  # "longer than L"
    ("experiment", "extend_scalings"): ["none", "linear,yarn", "ntk"],
    ("experiment", "extend_batch_size"): ["2", "4"],
    ("experiment", "finetune_learning_rate"): ["0.001"],
    ("experiment", "bases"): ["100,10000", "20"],  # finite, > 1, each once
    ("experiment", "transfer_steps"): ["2", "4"],  # fewer than --steps: a sinusoidal step comes first
    ("experiment", "hidden_size"): ["16", "32", "64"],  # splits into 1, 2 or 4 heads of an even width
    ("experiment", "num_layers"): ["1", "2"],
    ("experiment", "num_heads"): ["1", "2", "4"],
    ("experiment", "rope_base"): ["500", "10000"],
    ("experiment", "batch_size"): ["3", "8"],
    ("experiment", "steps"): ["8", "12"],
    ("experiment", "learning_rate"): ["0.001", "0.01"],
    ("experiment", "min_learning_rate"): ["0.0001"],
    ("experiment", "warmup_steps"): ["0", "2"],
    ("experiment", "weight_decay"): ["0", "0.1"],
    ("experiment", "grad_clip"): ["1.0"],
    ("experiment", "passkey_fraction"): ["0", "0.5"],
    ("experiment", "passkey_trials"): ["0", "50"],
    ("experiment", "passkey_depths"): ["0,0.5,1", "0.25"],
    ("experiment", "eval_tokens"): ["1792", "4096"],  # a window of the longest length (512) and 224 sliding tokens
    ("experiment", "eval_stride"): lambda c: ["16", str(c["L"] // 2), str(c["L"])],  # at most L
    ("experiment", "sliding_tokens"): ["0", "224"],  # 0, or at least one stride (at most L = 128)
    ("experiment", "retrieval_trials"): ["0", "2"],
    ("experiment", "retrieval_span"): ["8", "16"],
    ("experiment", "retrieval_distances"): ["32", "32,48"],  # 2 x span .. L - 32 - span
    ("experiment", "task_steps"): ["0", "2"],
    ("experiment", "task_seeds"): ["1"],  # at most --seeds
    ("experiment", "task_length"): ["32", "64"],  # at least 4 x --task-pairs
    ("experiment", "task_hidden_size"): ["32", "64"],  # splits into --num-heads heads of an even width
    ("experiment", "task_batch_size"): ["2", "8"],
    ("experiment", "task_learning_rate"): ["0.001"],
    ("experiment", "task_trials"): ["2", "8"],
    ("experiment", "task_pairs"): ["2", "4", "8"],
    ("experiment", "held_out_fraction"): ["0.1", "0.5"],
    ("experiment", "seed"): ["0", "1", "12345"],
    ("experiment", "checkpoint_every"): ["4", "100"],
    ("experiment", "device"): ["cpu"] + (["cuda"] if torch.cuda.is_available() else []),  # docs/experiment.md
    ("experiment", "threads"): ["1", "2"],
    ("experiment", "data"): ["builtin:pydoc"],
}


#: the subcommands whose options are CONFIG and the configuration flags (configuration.add_config_arguments)
CONFIG_COMMANDS = {"inspect", "verify", "report", "plot scaling", "plot scores", "plot positions"}
CONFIG_DESTS = {"config", "layer_type", "head_dim", "base", "rotary_dim", "scaling", "max_position", "pairing"}
CONFIG_DESTS |= {"interleaved"}
#: positionals and options whose valid values ``config_items`` / ``valid_items`` make (not drawn from ``rest``)
MADE_HERE = CONFIG_DESTS | {"model", "source", "target", "configs", "axial", "mixed", "preset"}
#: options whose valid values ``option_tokens`` makes from the pool (files) or the -o kind
TOKENS_HERE = {"out", "cases", "q", "k"}


def _axial_fits(preset: str, head_dim: int) -> bool:
    """Whether an axial preset takes ``head_dim`` channels (variants' presets, as their errors say and
    docs/vision.md lists them): flux's axes are 16, 56, 56 channels (128 only); cogvideox splits D into D/4, 3D/8,
    3D/8 even blocks (a multiple of 16); the others split an even width."""
    if preset == "flux":
        return head_dim == 128
    if preset == "cogvideox":
        return head_dim % 16 == 0
    return head_dim % 2 == 0


@st.composite
def config_items(draw, command: str, pool: dict) -> list[tuple[str, list[str]]]:
    """CONFIG and configuration flags that the documented contract says work together, as (dest, tokens)."""
    items: list[tuple[str, list[str]]] = []
    vision = command in ("inspect", "verify") and draw(st.integers(0, 3)) == 0
    if vision:  # --axial / --mixed: "instead of a config" (inspect and verify --help): no CONFIG, no config flag
        # but --head-dim, which must fit the preset (_axial_fits) and RoPE-Mixed (even)
        presets = sorted(PRESETS)
        axial = draw(st.none() | st.sampled_from(presets)) if command == "verify" else draw(st.sampled_from(presets))
        mixed = command == "verify" and (axial is None or draw(st.booleans()))
        if axial:
            items.append(("axial", ["--axial", axial]))
        if mixed:
            items.append(("mixed", ["--mixed"]))
            if draw(st.booleans()):  # --heads "needs --mixed" (verify --help)
                items.append(("heads", ["--heads", draw(st.sampled_from(VALID_BY_DEST[("verify", "heads")]))]))
        fitting = [h for h in HEAD_DIMS if axial is None or _axial_fits(axial, int(h))]
        if draw(st.booleans()):
            items.append(("head_dim", ["--head-dim", draw(st.sampled_from(fitting))]))
        return items
    fixture = draw(st.none() | st.sampled_from(sorted(FIXTURE_FACTS)))
    head, fixed_rotary, longrope_lists, layer_types = FIXTURE_FACTS.get(fixture, (128, None, False, ()))
    if fixture:
        items.append(("config", [str(FIXTURES / fixture)]))
    flags = {"layer_type", "head_dim", "base", "rotary_dim", "scaling", "max_position", "pairing"}
    if command == "plot scaling" and not fixture:
        # plot scaling --help: without CONFIG or --scaling "--head-dim, --base and --seq-len apply to the examples";
        # the others describe a configuration, so they come only with --scaling
        scaling_given = draw(st.booleans())
        if not scaling_given:
            flags = {"head_dim", "base"}
    chosen = draw(st.sets(st.sampled_from(sorted(flags)), max_size=3))
    if command == "plot scaling" and not fixture and flags != {"head_dim", "base"}:
        chosen.add("scaling")
    if "layer_type" in chosen and layer_types:  # a layer type the config names: "per-layer rope parameters"
        items.append(("layer_type", ["--layer-type", draw(st.sampled_from(layer_types))]))
    # the rotated width: --rotary-dim, else the file's own (GPT-J's rotary_dim), else head_dim; 0 < r <= head_dim
    # (pairing.py: "both even, 0 < rotary_dim <= head_dim")
    head_flag = draw(st.sampled_from(HEAD_DIMS)) if "head_dim" in chosen else None
    head = int(head_flag) if head_flag else head
    rotary_flag = None
    if "rotary_dim" in chosen:
        rotary_flag = draw(st.sampled_from([r for r in ROTARY_DIMS if int(r) <= head]))
    elif fixed_rotary and fixed_rotary > head:  # GPT-J's 64 rotated channels do not fit a smaller --head-dim
        rotary_flag = str(max(int(r) for r in ROTARY_DIMS if int(r) <= head))
    rotary = int(rotary_flag) if rotary_flag else fixed_rotary or head
    # --scaling replaces the file's block; a config's max_position_embeddings stays and YaRN's factor must agree
    # with it (docs/scaling.md, "Validation": "YaRN factor against the lengths"), so no YaRN example with a CONFIG;
    # the longrope example's lists are made for the rotated width ("one factor per pair", the same table)
    types = [t for t in EXAMPLE_TYPES if not (fixture and t == "yarn")]
    scaling = draw(st.sampled_from(types)) if "scaling" in chosen else None
    if longrope_lists and scaling is None and rotary != head_of(fixture):
        # Phi-3's longrope lists have one factor per pair of its own width: a flag may not change that width
        if head >= head_of(fixture):
            rotary_flag, rotary = str(head_of(fixture)), head_of(fixture)
        else:
            head_flag, rotary_flag, head, rotary = None, None, head_of(fixture), head_of(fixture)
    if head_flag:
        items.append(("head_dim", ["--head-dim", head_flag]))
    if "base" in chosen:
        items.append(("base", ["--base", draw(st.sampled_from(BASES))]))
    if rotary_flag:
        items.append(("rotary_dim", ["--rotary-dim", rotary_flag]))
    if scaling:
        items.append(("scaling", ["--scaling", json.dumps(ROPE_TYPES[scaling].example(rotary).block)]))
    if "max_position" in chosen:
        items.append(("max_position", ["--max-position", draw(st.sampled_from(VALID_BY_DEST["max_position"]))]))
    if "pairing" in chosen:  # one of a mutually exclusive group (usage: [--pairing ... | --interleaved | ...])
        pairing = draw(st.sampled_from([["--pairing", "half"], ["--pairing", "interleaved"]] + [["--interleaved"]]))
        items.append(("pairing" if pairing[0] == "--pairing" else "interleaved", pairing))
    return items


def head_of(fixture: str | None) -> int:
    return FIXTURE_FACTS[fixture][0] if fixture else 128


def _head_dim(items: list[tuple[str, list[str]]]) -> int:
    """The head width the configuration items describe (for --q/--k vectors of [head_dim] entries)."""
    given = dict(items)
    if "head_dim" in given:
        return int(given["head_dim"][1])
    return head_of(Path(given["config"][0]).name if "config" in given else None)


def _flag(action: argparse.Action) -> str:
    return action.option_strings[-1]


def options_of(command: str) -> list[argparse.Action]:
    """Every option of ``command`` read from its parser, but --help and SKIP."""
    return [
        a
        for a in leaf_parsers()[command]._actions
        if a.option_strings and not isinstance(a, argparse._HelpAction) and (command, _flag(a)) not in SKIP
    ]


def positionals_of(command: str) -> list[argparse.Action]:
    return [
        a
        for a in leaf_parsers()[command]._actions
        if not a.option_strings and not isinstance(a, argparse._SubParsersAction)
    ]


#: options that argparse (a mutually exclusive group) or the --help text rules out together, by subcommand
EXCLUSIVE = {
    "bench": [{"json", "markdown"}],  # usage: [--json | --markdown]
}


@st.composite
def valid_items(draw, command: str, pool: dict) -> list[tuple[str, list[str]]]:
    """A valid argument list of ``command`` as (dest, tokens) items: the positionals first, then options."""
    items: list[tuple[str, list[str]]] = []
    ctx: dict = {"L": TINY_L}
    if command in CONFIG_COMMANDS:
        items += draw(config_items(command, pool))
    elif command == "plot frequencies":
        for path in draw(st.lists(st.sampled_from(pool["fixtures"]), max_size=2)):
            items.append(("configs", [path]))
    elif command == "sweep":
        items.append(("model", [pool["checkpoint"]]))
    elif command == "export":  # OUT or -o OUT, a new directory (export --help); both only naming one place
        items.append(("source", [pool["run model"]]))
        target = draw(st.sampled_from(_out("new")))
        form = draw(st.sampled_from(["OUT", "-o", "both"]))
        if form in ("OUT", "both"):
            items.append(("target", [target]))
        if form in ("-o", "both"):
            items.append(("out", ["-o", target]))
    elif command == "plot axial":
        presets = draw(st.lists(st.sampled_from(sorted(PRESETS)), max_size=2))
        items += [("preset", ["--preset", p]) for p in presets]
        mixed = draw(st.booleans())
        if mixed:
            items.append(("mixed", ["--mixed"]))
            if draw(st.booleans()):  # --heads "needs --mixed" (plot axial --help)
                items.append(("heads", ["--heads", draw(st.sampled_from(VALID_BY_DEST[("plot axial", "heads")]))]))
        # --head-dim must fit every preset drawn: the named ones, else the default four unless --mixed alone
        drawn = presets or ([] if mixed else list(AXIAL_FIGURE_PRESETS))
        fitting = [h for h in HEAD_DIMS if all(_axial_fits(p, int(h)) for p in drawn)]
        if fitting and draw(st.booleans()):
            items.append(("head_dim", ["--head-dim", draw(st.sampled_from(fitting))]))
    given = {dest for dest, _ in items}
    rest = [a for a in options_of(command) if a.dest not in MADE_HERE | given | {"heads"}]
    if command in ("plot axial",):
        rest = [a for a in options_of(command) if a.dest not in given | {"preset", "mixed", "head_dim", "heads"}]
    rest = [a for a in rest if not (a.dest == "out" and ("out" in given or command == "export"))]
    rest = [a for a in rest if (command, a.dest) not in NOT_DRAWN_VALID]
    if command == "plot scaling" and given & {"config", "scaling"}:  # --rope-type: "with example parameters"
        rest = [a for a in rest if a.dest != "rope_type"]
    if command == "inspect" and "axial" in given:  # the preset's pairs: no sequence length applies
        rest = [a for a in rest if a.dest != "seq_len"]
    picked = draw(st.sets(st.sampled_from(range(len(rest))), max_size=4)) if rest else set()
    for i in sorted(picked):
        action = rest[i]
        if any(action.dest in group and group & {d for d, _ in items} for group in EXCLUSIVE.get(command, [])):
            continue
        tokens = draw(option_tokens(command, action, ctx, pool, items))
        if tokens:
            items.append((action.dest, tokens))
            ctx[action.dest] = tokens[-1]
            if action.dest == "train_length":
                ctx["L"] = int(tokens[-1])
    return items


@st.composite
def option_tokens(draw, command: str, action: argparse.Action, ctx: dict, pool: dict, items) -> list[str]:
    """A valid ``flag value`` of one option in the context drawn so far ([] where none fits)."""
    flag, dest = _flag(action), action.dest
    if action.nargs == 0:
        return [flag]
    if isinstance(action, argparse.BooleanOptionalAction):
        return [draw(st.sampled_from([flag, "--no-" + flag.removeprefix("--")]))]
    if dest == "out":
        values = _out(OUT_KIND.get(command, "file"))
    elif dest == "cases":
        values = pool["ok cases"]
    elif dest in ("q", "k"):  # "vector [head_dim] (.npy or .pt)" (plot scores --help)
        values = [pool["vectors"][_head_dim(items)]]
    else:
        values = VALID_BY_DEST.get((command, dest), VALID_BY_DEST.get(dest))
        if callable(values):
            values = values(ctx)
        if values is None and action.choices is not None:
            values = sorted(map(str, action.choices))
    assert values is not None, f"{command} {flag}: no valid values (add them to VALID_BY_DEST)"
    return [flag, draw(st.sampled_from(values))]


@st.composite
def invalid_items(draw, command: str, pool: dict) -> list[tuple[str, list[str]]]:
    """A valid argument list with one value made invalid on its own, or an unknown option added."""
    items = draw(valid_items(command, pool))
    actions = [*positionals_of(command), *options_of(command)]
    target = draw(st.sampled_from(actions + [None]))
    if target is None:
        return items + [("unknown", [draw(st.sampled_from(["--nosuch", "--no-such-option"]))])]
    bad = draw(st.sampled_from(_invalid_pool(command, target, pool)))
    if not target.option_strings:  # a positional: replace it (the first of plot frequencies' CONFIGs)
        kept = [(d, t) for d, t in items if d != target.dest]
        return [(target.dest, [bad]), *kept]
    kept = [(d, t) for d, t in items if d != target.dest]
    if bad == FLAG_WITH_VALUE:
        return [*kept, (target.dest, [_flag(target) + FLAG_WITH_VALUE])]
    return [*kept, (target.dest, [_flag(target), bad])]


def flatten(command: str, items: list[tuple[str, list[str]]]) -> list[str]:
    """``rotary COMMAND`` argv: base arguments, positionals (in their parser order), options."""
    base = {"bench": BENCH_BASE, "experiment": EXPERIMENT_BASE, "sweep": SWEEP_BASE}.get(command, [])
    order = [a.dest for a in positionals_of(command)]
    positional = sorted((order.index(d), t) for d, t in items if d in order)
    options = [t for d, t in items if d not in order]
    return [*command.split(), *base, *(x for _, t in positional for x in t), *(x for t in options for x in t)]


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


def check(argv: list[str], command: str, figures: DrawnOnce | None = None) -> tuple[int, str]:
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
    return status, err


#: examples per subcommand under `make test` (the same examples every run): the fast ones get many, the ones
#: that draw figures a few (each distinct figure costs about a second); `make fuzz` (hypothesis profile
#: "explore", new examples every run) draws FUZZ_FACTOR times as many
BUDGET = {
    "inspect": 50,
    "verify": 16,
    "demo": 15,
    "plot decay": 15,
    "plot frequencies": 12,
    "plot scaling": 8,
    "plot scores": 12,
    "plot positions": 12,
    "report": 3,
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
def test_valid_arguments_run_and_invalid_ones_are_refused_by_name(command, pool):
    """Each example is decided before it runs: half are valid by construction (``valid_items``: values each
    option takes, combined as the documented rules allow) and must run to the end, status 0 (build: 0, or 1
    without a compiler, as its --help says); the other half are a valid list with one value replaced by one its
    option refuses on its own, or an unknown option (``invalid_items``), and must be refused: status 2 and one
    line naming the subcommand and an option or value given. Nothing escapes main either way."""
    figures = FIGURES
    # status 1 is a run to the end, not a refusal, where commands/__init__.py documents it: a check that fails
    # (verify, demo; e.g. verify at --max-position 2**40, where float positions lose the relative property), a
    # kernel that cannot be built (build)
    finished = (0, 1) if command in ("build", "verify", "demo") else (0,)

    @settings(
        max_examples=BUDGET.get(command, 10) * FUZZ_FACTOR,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(valid=st.booleans(), data=st.data())
    def prop(valid, data):
        items = data.draw(valid_items(command, pool) if valid else invalid_items(command, pool))
        argv = flatten(command, items)
        status, err = check(argv, command, figures)
        if valid:
            assert status in finished, f"a valid argument list was refused ({status}): rotary {argv}: {err}"
        else:
            assert status == 2, f"an invalid argument list was not refused ({status}): rotary {argv}: {err}"

    prop()


def test_every_option_has_valid_and_invalid_values():
    """A new option must say which values it takes and which it refuses before it is fuzzed: every option and
    positional of every subcommand has a valid pool (or is made by the generator, or listed in NOT_DRAWN_VALID
    with a reason) and a non-empty invalid pool."""
    fake_pool = {k: "x" for k in ("existing",)} | {
        k: ["x"] for k in ("bad configs", "bad vectors", "bad cases", "fixtures", "ok cases")
    }
    missing = []
    for command in leaf_parsers():
        for action in [*positionals_of(command), *options_of(command)]:
            dest = action.dest
            has_valid = (
                action.nargs == 0
                or isinstance(action, argparse.BooleanOptionalAction)
                or action.choices is not None
                or dest in MADE_HERE | TOKENS_HERE
                or (command, dest) in VALID_BY_DEST
                or dest in VALID_BY_DEST
                or (command, dest) in NOT_DRAWN_VALID
            )
            if not has_valid or not _invalid_pool(command, action, fake_pool):
                missing.append(
                    f"{command} {dest}: valid {has_valid}, invalid {_invalid_pool(command, action, fake_pool)}"
                )
    assert not missing, missing


def test_the_budget_names_every_subcommand():
    """A new subcommand gets a budget chosen for its cost, not the default, once it is listed here."""
    assert set(BUDGET) == set(leaf_parsers())


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        # docs/scaling.md: a base is a finite number > 1; plot decay took 0.5 unless --measured built a RoPE
        (["plot", "decay", "--base", "0.5"], "--base"),
        # a 2-D PCA needs 3 positions: refused by the flag (it was refused later, in words --help did not say)
        (["plot", "positions", "--seq-len", "2"], "--seq-len"),
        # "an axial RoPE preset instead of a config" (inspect --help): config flags were silently ignored
        (["inspect", "--axial", "pixtral", "--layer-type", "full_attention"], "--layer-type"),
        (["inspect", "--axial", "pixtral", "--base", "500000"], "--base"),
        # the message named neither the flag nor the value as given ("passkey depths ... got [2.0]")
        (["experiment", *EXPERIMENT_BASE, "--passkey-depths", "0,2"], "--passkey-depths"),
        # a RoPE base <= 1 passed the experiment's checks and failed when the model was built
        (["experiment", *EXPERIMENT_BASE, "--rope-base", "0.5"], "--rope-base"),
        # --heads without --mixed was silently ignored by plot axial (verify refused it)
        (["plot", "axial", "--heads", "2"], "--heads"),
    ],
)
def test_refusals_found_by_the_property_test(argv, named):
    """Refusals the decided draws found wrong (or missing), each as an explicit example: status 2, named."""
    status, err = check(argv, argv[0] if argv[0] != "plot" else " ".join(argv[:2]))
    assert status == 2 and named in err, (argv, status, err)


def test_export_into_a_file_names_the_out_given(pool):
    """OUT under a regular file: the error names OUT as given (it named only the folder above it)."""
    out = pool["existing"] + "/x"
    status, err = check(["export", pool["run model"], out], "export")
    assert status == 2 and out in err, err


def test_an_empty_model_or_out_is_refused_by_name(pool):
    """An empty MODEL (sweep), RUN/models/NAME or OUT (export) named the current directory, or was passed over
    for -o."""
    status, err = check(["sweep", ""], "sweep")
    assert status == 2 and "MODEL ''" in err, err
    status, err = check(["export", pool["run model"], "", "-o", "out"], "export")
    assert status == 2 and "OUT" in err, err
    status, err = check(["export", "", "out"], "export")
    assert status == 2 and "RUN/models/NAME ''" in err, err
