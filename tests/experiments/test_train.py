"""Training: the schedule, the learned table past L, and torchrun with DDP against one process."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from helpers import cli_env
from rotary.cli import main
from rotary.experiments.config import PRESETS, ExperimentConfig
from rotary.experiments.data import load_corpus
from rotary.experiments.progress import Reporter
from rotary.experiments.train import (
    Distributed,
    ModelSpec,
    build_model,
    learning_rate,
    load_checkpoint,
    param_groups,
    train_model,
)

CFG = ExperimentConfig(**{**PRESETS["tiny"], "device": "cpu"})


def test_learning_rate_warms_up_then_decays_to_the_minimum():
    cfg = ExperimentConfig(steps=50, warmup_steps=5, learning_rate=1e-2, min_learning_rate=1e-3)
    lrs = [learning_rate(s, cfg) for s in range(cfg.steps)]
    assert lrs[:5] == pytest.approx([2e-3, 4e-3, 6e-3, 8e-3, 1e-2])
    assert all(a >= b for a, b in zip(lrs[5:], lrs[6:]))
    assert lrs[-1] == pytest.approx(1e-3)


def test_weight_decay_only_on_linear_weights():
    model = build_model(ModelSpec("learned", "learned", 0), CFG)
    decay, rest = param_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    assert all(names[id(p)].endswith("proj.weight") or names[id(p)] == "lm_head.weight" for p in decay["params"])
    assert {names[id(p)] for p in rest["params"]} >= {"embed_tokens.weight", "embed_positions.embedding.weight", "norm.weight"}
    assert len(decay["params"]) + len(rest["params"]) == len(list(model.parameters()))


def test_learned_rows_past_L_stay_as_initialised():
    cfg = ExperimentConfig(**{**PRESETS["tiny"], "device": "cpu", "steps": 6})
    spec = ModelSpec("learned", "learned", 0)
    initial = build_model(spec, cfg).embed_positions.embedding.weight.detach().clone()
    trained = train_model(spec, cfg, load_corpus(cfg).train, run_dir=None, resume=False, reporter=Reporter(enabled=False))
    table = trained.model.embed_positions.embedding.weight.detach()
    assert table.shape[0] == cfg.longest == 8 * cfg.train_length
    assert torch.equal(table[cfg.train_length :], initial[cfg.train_length :])
    assert not torch.equal(table[: cfg.train_length], initial[: cfg.train_length])


def test_two_torchrun_processes_reach_the_parameters_of_one_process(tmp_path):
    flags = ["--preset", "tiny", "--device", "cpu", "--encodings", "rope,alibi", "--spread-encodings", "", "--scalings", "none",
             "--steps", "6", "--checkpoint-every", "6", "--eval-lengths", "112,224"]
    env = cli_env(OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         "-m", "rotary", "experiment", *flags, "--out", str(tmp_path / "two")],
        env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert main(["experiment", *flags, "--out", str(tmp_path / "one")]) == 0
    cfg = ExperimentConfig(**{**PRESETS["tiny"], "device": "cpu", "encodings": ("rope", "alibi"), "spread_encodings": (), "eval_lengths": (112, 224),
                              "scalings": ("none",), "steps": 6, "checkpoint_every": 6, "threads": 1})
    for name in ("rope", "alibi"):
        spec = ModelSpec(name, name, 0)
        one = load_checkpoint(tmp_path / "one" / "models" / name / "checkpoint.pt", spec, cfg)
        two = load_checkpoint(tmp_path / "two" / "models" / name / "checkpoint.pt", spec, cfg)
        assert one["step"] == two["step"] == 6
        for key, value in one["model"].items():
            torch.testing.assert_close(two["model"][key], value, rtol=1e-5, atol=2e-6, msg=f"{name} {key}")
        moved = [k for k, v in one["model"].items() if not torch.equal(v, build_model(spec, cfg).state_dict()[k])]
        assert moved, "training changed nothing: the comparison would be empty"
    assert (tmp_path / "two" / "results.json").is_file()


# ------------------------------------------------------------------------------------------------
# collectives: NCCL reduces CUDA tensors only, so every tensor a collective touches must be on the
# training device. No GPU here: a fake process group records where the tensors live.


class _Stop(Exception):
    """Raised by the fake all_reduce once it has seen its tensor (a meta tensor has no value to read)."""


@pytest.fixture
def fake_group(monkeypatch):
    seen: list[torch.device] = []

    def all_reduce(tensor, op=None):
        seen.append(tensor.device)
        raise _Stop

    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "all_reduce", all_reduce)
    return seen


def test_agree_reduces_a_flag_on_the_training_device(fake_group):
    # "meta" stands for cuda:1: any device but the CPU shows where the flag is created
    with pytest.raises(_Stop):
        Distributed(rank=1, world_size=2, local_rank=1).agree(True, torch.device("meta"))
    assert fake_group == [torch.device("meta")]
    assert Distributed(rank=1, world_size=2, local_rank=1).device("cuda") == torch.device("cuda", 1)


def test_the_logged_loss_is_reduced_where_it_was_computed(fake_group):
    with pytest.raises(_Stop):
        Distributed(rank=0, world_size=2).mean(torch.ones((), device="meta"))
    assert fake_group == [torch.device("meta")]


def test_cuda_joins_a_group_with_nccl_for_cuda_tensors_and_gloo_for_cpu_ones(monkeypatch):
    backends: list[str] = []
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda backend: backends.append(backend))
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: None)
    Distributed(rank=0, world_size=2).start("cuda")
    Distributed(rank=0, world_size=2).start("cpu")
    assert backends == ["cpu:gloo,cuda:nccl", "gloo"]


def test_every_collective_of_the_experiment_goes_through_distributed():
    """A collective called anywhere else could be handed a CPU tensor under nccl: only the methods of
    ``Distributed`` (which take the training device) may call ``torch.distributed``'s collectives."""
    import ast
    from pathlib import Path

    import rotary.experiments as package

    collectives = {"all_reduce", "all_gather", "all_gather_object", "broadcast", "broadcast_object_list", "reduce",
                   "gather", "scatter", "barrier", "all_to_all", "reduce_scatter", "send", "recv"}
    outside, inside = [], []
    for path in sorted(Path(package.__file__).parent.glob("*.py")):
        tree = ast.parse(path.read_text())
        owner = {}
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            for node in ast.walk(cls):
                owner[id(node)] = cls.name
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in collectives:
                where = f"{path.name}:{node.lineno} {node.attr}"
                (inside if owner.get(id(node)) == "Distributed" else outside).append(where)
    assert not outside, outside
    assert len(inside) == 2, inside  # agree() and mean(): the scan does see them
