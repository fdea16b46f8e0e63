"""Training: the schedules, the learned table past L, fine-tunes that start from their parent, and
torchrun with DDP against one process (the extension stage included)."""

from __future__ import annotations

import json
import subprocess
import sys
from hashlib import sha256
from pathlib import Path

import pytest
import torch

from helpers import cli_env
from rotary.models import position_state_names
from rotary.tools.experiments import train as train_module
from rotary.tools.experiments.config import PRESETS, ExperimentConfig
from rotary.tools.experiments.data import load_corpus, training_batch
from rotary.tools.experiments.distributed import Distributed
from rotary.tools.experiments.plan import model_specs
from rotary.tools.experiments.progress import Reporter
from rotary.tools.experiments.train import (
    COMPILE_MIN_STEPS,
    ForwardBackward,
    Schedule,
    TrainingDiverged,
    build_model,
    learning_rate,
    load_checkpoint,
    param_groups,
    start_model,
    train_model,
)

CFG = ExperimentConfig(**{**PRESETS["tiny"], "device": "cpu"})
SPECS = {s.name: s for s in model_specs(CFG)}


def test_learning_rate_warms_up_then_decays_to_the_minimum():
    schedule = Schedule(steps=50, warmup_steps=5, peak=1e-2, floor=1e-3)
    lrs = [learning_rate(s, schedule) for s in range(schedule.steps)]
    assert lrs[:5] == pytest.approx([2e-3, 4e-3, 6e-3, 8e-3, 1e-2])
    assert all(a >= b for a, b in zip(lrs[5:], lrs[6:]))
    assert lrs[-1] == pytest.approx(1e-3)


def test_pretraining_and_fine_tuning_have_their_own_schedules():
    cfg = ExperimentConfig(steps=600, warmup_steps=30, learning_rate=3e-3, finetune_learning_rate=1e-3, extend_steps=60)
    specs = {s.model: s for s in model_specs(cfg)}
    assert Schedule.of(specs["rope"], cfg) == Schedule(600, 30, 3e-3, cfg.min_learning_rate)
    assert Schedule.of(specs["rope-scratch"], cfg) == Schedule(600, 30, 3e-3, cfg.min_learning_rate)
    assert Schedule.of(specs["rope-ft-yarn"], cfg) == Schedule(60, 6, 1e-3, cfg.min_learning_rate)
    # a task model: its own steps and peak, a twentieth of warm-up, decay to a tenth; its own width and length
    task = specs["task-rope"]
    assert (task.stage, task.length, task.steps, task.rows) == ("task", 32, 1000, 32)
    assert Schedule.of(task, cfg) == Schedule(1000, 50, 3e-3, pytest.approx(3e-4))
    assert build_model(task, cfg).config.hidden_size == 64 and build_model(specs["rope"], cfg).config.hidden_size == 128
    default = ExperimentConfig(**PRESETS["default"])  # task models for the first seed only (the time budget)
    assert [s.name for s in model_specs(default) if s.stage == "task"] == [f"task-{e}-0" for e in default.encodings]


def test_a_fine_tune_starts_from_its_parent_and_a_transfer_from_its_non_position_weights():
    parent = build_model(SPECS["rope-0"], CFG)
    with torch.no_grad():
        for p in parent.parameters():
            p.add_(1.0)
    tuned = start_model(SPECS["rope-ft-yarn-0"], CFG, parent)
    assert all(torch.equal(a, b) for a, b in zip(tuned.state_dict().values(), parent.state_dict().values()))
    assert tuned.config.rope_scaling == {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": CFG.train_length,
    }
    study = ExperimentConfig(**{**PRESETS["tiny"], "device": "cpu", "study": "transfer"})
    specs = {s.name: s for s in model_specs(study)}
    sinusoidal = build_model(specs["sinusoidal-short-0"], study)
    moved = start_model(specs["transfer-0"], study, sinusoidal)
    assert moved.config.position_encoding == "rope" and position_state_names(sinusoidal) == set()
    assert all(torch.equal(moved.state_dict()[k], v) for k, v in sinusoidal.state_dict().items())
    with pytest.raises(ValueError, match="starts from rope-0"):
        start_model(SPECS["rope-ft-yarn-0"], CFG)


def test_weight_decay_only_on_linear_weights():
    model = build_model(SPECS["learned-0"], CFG)
    decay, rest = param_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    assert all(names[id(p)].endswith("proj.weight") or names[id(p)] == "lm_head.weight" for p in decay["params"])
    assert {names[id(p)] for p in rest["params"]} >= {
        "embed_tokens.weight",
        "embed_positions.embedding.weight",
        "norm.weight",
    }
    assert len(decay["params"]) + len(rest["params"]) == len(list(model.parameters()))


def test_learned_rows_past_L_stay_as_initialised():
    cfg = ExperimentConfig(**{**PRESETS["tiny"], "device": "cpu", "steps": 6})
    spec = {s.name: s for s in model_specs(cfg)}["learned-0"]
    initial = build_model(spec, cfg).embed_positions.embedding.weight.detach().clone()
    trained = train_model(
        spec, cfg, load_corpus(cfg).train, run_dir=None, resume=False, reporter=Reporter(enabled=False)
    )
    table = trained.model.embed_positions.embedding.weight.detach()
    assert table.shape[0] == cfg.longest == 8 * cfg.train_length
    assert torch.equal(table[cfg.train_length :], initial[cfg.train_length :])
    assert not torch.equal(table[: cfg.train_length], initial[: cfg.train_length])


PROBE = Path(__file__).with_name("torchrun_probe.py")
RANKS = 4


def test_four_torchrun_processes_train_on_their_shards_average_like_one_process_and_leave_cleanly(
    tmp_path, tmp_path_factory
):
    """A real ``torchrun --standalone --nproc_per_node=4`` (gloo, CPU) under :mod:`torchrun_probe`:

    - each rank trains on its own quarter of every global batch, rank 0 on the first rows;
    - DDP's averaged gradients are those of the whole batch: after k steps the parameters and the
      logged losses are those of one process on the same global batches, to fp32 rounding;
    - ranks 1 to 3 write nothing: no file or directory under the test's directory (the probe watches
      Python's audit events), and their working directories, where the default ``runs/`` would go,
      stay empty; rank 0 writes the whole run there;
    - every process exits with status 0. Ranks 1 to 3 leave the group (:meth:`Distributed.stop`: the
      wrapper dropped, cycles collected, one last barrier) and exit while rank 0 still evaluates and
      writes the report. A direct ``destroy_process_group`` with DDP still alive sometimes aborted the
      rank that left first ("terminate called without an active exception", 2 of 8 two-rank runs on the
      2-core development machine; once in CI); four ranks give three that leave while rank 0 is busy.

    One launch checks all of it (the run without figures, ``--no-figures``: nobody looks at them here).
    """
    flags = [
        "--preset",
        "tiny",
        "--device",
        "cpu",
        "--threads",
        "1",
        "--encodings",
        "rope,alibi",
        "--seeds",
        "1",
        "--scalings",
        "none",
        "--steps",
        "6",
        "--checkpoint-every",
        "3",
        "--eval-lengths",
        "112,224",
        "--passkey-trials",
        "5",
        "--extend-steps",
        "2",
        "--extend-length",
        "224",
        "--extend-scalings",
        "yarn",
        "--finetune-learning-rate",
        "3e-4",
        "--task-steps",
        "0",
        "--no-figures",
    ]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={RANKS}",
            str(PROBE),
            "experiment",
            *flags,
        ],
        # torchrun's temporary directories beside tmp_path, not in it: the probe watches tmp_path for writes
        env=cli_env(OMP_NUM_THREADS="1", PROBE_ROOT=str(tmp_path), TMPDIR=str(tmp_path_factory.mktemp("torchrun"))),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "terminate called" not in proc.stderr, proc.stderr[-3000:]
    probes = {p["rank"]: p for p in (json.loads(f.read_text()) for f in sorted(tmp_path.glob("probe-rank*.json")))}
    assert sorted(probes) == list(range(RANKS)) and all(p["status"] == 0 for p in probes.values()), probes

    cfg = ExperimentConfig(
        **{
            **PRESETS["tiny"],
            "device": "cpu",
            "threads": 1,
            "encodings": ("rope", "alibi"),
            "seeds": 1,
            "scalings": ("none",),
            "steps": 6,
            "checkpoint_every": 3,
            "eval_lengths": (112, 224),
            "passkey_trials": 5,
            "extend_steps": 2,
            "extend_length": 224,
            "extend_scalings": ("yarn",),
            "finetune_learning_rate": 3e-4,
            "task_steps": 0,
        }
    )
    specs = model_specs(cfg)
    assert [s.model for s in specs] == [
        "rope",
        "alibi",
        "rope-ft-yarn",
        "rope-scratch",
    ]  # the extension stage under DDP too
    train_tokens = load_corpus(cfg).train

    def rows(spec, step, rank):  # rank r trains on rows r * B/4 .. (r + 1) * B/4 - 1 of every global batch
        batch = training_batch(
            train_tokens, spec.first_batch + step, cfg, spec.seed, rows=spec.rows, length=spec.length
        )
        part = spec.rows // RANKS
        return sha256(batch[rank * part : (rank + 1) * part].numpy().tobytes()).hexdigest()

    for rank in range(RANKS):  # model after model
        expected = [rows(spec, step, rank) for spec in specs for step in range(spec.steps)]
        assert probes[rank]["shards"] == expected, f"rank {rank} did not train on its own rows of each global batch"
    assert all(len(set(shards)) == RANKS for shards in zip(*(probes[r]["shards"] for r in range(RANKS)))), (
        "two ranks trained on the same rows"
    )

    for rank in range(1, RANKS):
        assert probes[rank]["writes"] == [], f"rank {rank} wrote {probes[rank]['writes']}"
        assert list((tmp_path / f"rank{rank}").iterdir()) == []
    assert any("results.json" in w for w in probes[0]["writes"]), (
        "the probe saw none of rank 0's writes: its watch is blind"
    )
    (run,) = (tmp_path / "rank0" / "runs").iterdir()  # the default run directory, written by rank 0 alone
    assert {"config.json", "results.json", "results.csv", "report.md"} <= {f.name for f in run.iterdir()}
    assert json.loads((run / "results.json").read_text())["environment"]["world_size"] == RANKS

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the ranks (--threads 1): the sums of one process in the same order
    try:
        _compare_with_one_process(run, specs, cfg, train_tokens)
    finally:
        torch.set_num_threads(threads)


def _compare_with_one_process(run: Path, specs, cfg: ExperimentConfig, train_tokens: torch.Tensor) -> None:
    # one process trains each model the way the experiment does (train_model, here without checkpoints
    # or the evaluation, which the comparison does not read) on the same global batches
    for spec in specs:
        ranks = load_checkpoint(run / "models" / spec.name / "checkpoint.pt", spec, cfg)
        if spec.parent is None:  # one process from the same initial weights
            one = train_model(spec, cfg, train_tokens, run_dir=None, resume=False, reporter=Reporter(enabled=False))
            losses, state = one.losses, one.model.state_dict()
        else:
            # a fine-tune, on one process, from the weights the ranks' parent ended with: the parents
            # of the two runs differ by fp32 rounding, which Adam's first steps amplify where a trained
            # model's gradients are near zero (|g| ~ eps), so the fine-tunes are compared from the same start,
            # at a learning rate (3e-4, the large preset's) whose first full step does not push that
            # rounding past the tolerance the pretrained models are held to
            parent = build_model(next(s for s in specs if s.name == spec.parent_name), cfg)
            parent.load_state_dict(
                load_checkpoint(
                    run / "models" / spec.parent_name / "checkpoint.pt",
                    next(s for s in specs if s.name == spec.parent_name),
                    cfg,
                )["model"]
            )
            tuned = train_model(
                spec, cfg, train_tokens, parent=parent, run_dir=None, resume=False, reporter=Reporter(enabled=False)
            )
            losses, state = tuned.losses, tuned.model.state_dict()
        assert ranks["step"] == spec.steps == len(losses)
        # the logged loss of the processes is the mean of their shards' losses: the global batch's
        assert ranks["losses"] == pytest.approx(losses, rel=1e-5)
        initial = build_model(spec, cfg).state_dict()
        for key, value in state.items():
            torch.testing.assert_close(ranks["model"][key], value, rtol=1e-5, atol=2e-6, msg=f"{spec.name} {key}")
        assert any(not torch.equal(v, initial[k]) for k, v in state.items()), "training changed nothing"


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

    import rotary.tools.experiments as package

    collectives = {
        "all_reduce",
        "all_gather",
        "all_gather_object",
        "broadcast",
        "broadcast_object_list",
        "reduce",
        "gather",
        "scatter",
        "barrier",
        "all_to_all",
        "reduce_scatter",
        "send",
        "recv",
    }
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
    assert [where.split()[1] for where in inside] == ["all_reduce", "all_reduce", "barrier"], (
        inside
    )  # agree(), mean(), stop(): the scan does see them


# ------------------------------------------------------------------------------------------------
# the GPU path's pieces, checked on the CPU: compiled and bf16 steps, reading the losses in groups


def _batch(rows: int = 4, length: int = 33) -> torch.Tensor:
    return torch.randint(256, (rows, length), generator=torch.Generator().manual_seed(3))


def _step_results(model, **options):
    step = ForwardBackward(model, device=torch.device("cpu"), **options)
    batch = _batch()
    losses = [step(batch[:, :-1], batch[:, 1:]) for _ in range(2)]  # the second call reuses what the first compiled
    return losses, {n: p.grad.clone() for n, p in model.named_parameters()}, step


@pytest.mark.slow
@pytest.mark.parametrize("encoding", ["rope", "alibi"])
def test_a_compiled_step_equals_the_eager_step_on_the_cpu(encoding):
    eager_losses, eager_grads, _ = _step_results(
        build_model(SPECS[f"{encoding}-0"], CFG).train(), mixed_precision=False, compile=False
    )
    losses, grads, step = _step_results(
        build_model(SPECS[f"{encoding}-0"], CFG).train(), mixed_precision=False, compile=True
    )
    assert step.is_compiled and step.compile_seconds > 0
    for a, b in zip(losses, eager_losses):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), (a, b)  # Inductor fuses and reorders fp32 sums
    for name, grad in grads.items():
        assert torch.allclose(grad, eager_grads[name], rtol=1e-4, atol=1e-6), name


def test_a_compile_that_fails_says_so_once_and_the_step_runs_eagerly(monkeypatch):
    def broken(module, **kwargs):
        def call(*args, **kw):
            module(*args, **kw).sum().backward()  # half a step done: its gradients must not count
            raise RuntimeError("no C++ compiler found\n(details)")

        return call

    monkeypatch.setattr(torch, "compile", broken)
    lines: list[str] = []
    eager_losses, eager_grads, _ = _step_results(
        build_model(SPECS["rope-0"], CFG).train(), mixed_precision=False, compile=False
    )
    losses, grads, step = _step_results(
        build_model(SPECS["rope-0"], CFG).train(), mixed_precision=False, compile=True, log=lines.append
    )
    assert lines == ["torch.compile failed (RuntimeError: no C++ compiler found); training eagerly"]
    assert not step.is_compiled and step.compile_seconds == 0
    assert all(torch.equal(a, b) for a, b in zip(losses, eager_losses))
    assert all(torch.equal(grads[n], eager_grads[n]) for n in grads)


def test_a_bf16_step_keeps_fp32_weights_and_stays_near_the_fp32_loss():
    model = build_model(SPECS["rope-0"], CFG).train()
    fp32_losses, _, _ = _step_results(build_model(SPECS["rope-0"], CFG).train(), mixed_precision=False, compile=False)
    losses, grads, _ = _step_results(model, mixed_precision=True, compile=False)
    assert all(p.dtype == torch.float32 for p in model.parameters()) and all(
        g.dtype == torch.float32 for g in grads.values()
    )
    assert losses[0].dtype == torch.float32
    assert abs(float(losses[0]) - float(fp32_losses[0])) < 0.05  # bf16 keeps ~3 significant digits of a loss of ~5.5


def _tiny_training(monkeypatch, tmp_path, read_every: int, **changes):
    monkeypatch.setattr(train_module, "read_interval", lambda device: read_every)
    cfg = ExperimentConfig(**{**PRESETS["tiny"], "device": "cpu", "checkpoint_every": 5, **changes})
    spec = model_specs(cfg)[0]
    corpus = load_corpus(cfg)
    return (
        cfg,
        spec,
        lambda: train_model(spec, cfg, corpus.train, run_dir=tmp_path, resume=False, reporter=Reporter(enabled=False)),
    )


def test_losses_read_in_groups_are_the_losses_read_every_step(monkeypatch, tmp_path):
    _, _, every_step = _tiny_training(monkeypatch, tmp_path / "a", 1)
    expected = every_step()
    _, _, grouped = _tiny_training(
        monkeypatch, tmp_path / "b", 3
    )  # as on a GPU: 12 steps read after steps 3, 5, 8, 10 and 12
    outcome = grouped()
    assert outcome.losses == expected.losses and len(outcome.losses) == 12
    assert all(
        torch.equal(a, b) for a, b in zip(outcome.model.state_dict().values(), expected.model.state_dict().values())
    )


def test_a_divergence_read_late_names_its_step_and_leaves_finite_checkpoints(monkeypatch, tmp_path):
    cfg, spec, train = _tiny_training(monkeypatch, tmp_path, 4, learning_rate=1e9, warmup_steps=0)
    with pytest.raises(TrainingDiverged, match=r"diverged at step 2 of 12"):
        train()  # step 2 diverges; the group of steps 1-4 is read at step 4, and nothing was saved before
    assert not (tmp_path / "models" / spec.name / "checkpoint.pt").exists()


def test_short_fine_tunes_are_not_compiled():
    assert COMPILE_MIN_STEPS > PRESETS["large"]["extend_steps"]  # compiling costs more than 75 eager steps
    assert COMPILE_MIN_STEPS <= PRESETS["large"]["steps"]
