"""Training the models of a run (:mod:`.plan`), in the manner of nanoGPT's ``train.py``: one process or torchrun.

    torchrun --standalone --nproc_per_node=2 -m rotary experiment --preset tiny

Under torchrun every rank builds the same model in DDP (gloo on CPU, nccl on GPU) and takes its own rows of
every global batch, so each update is the one a single process would make; rank 0 alone writes checkpoints.
Batches depend only on ``(seed, length, step)`` and the learning rate only on the step, so a resumed run
continues exactly as an uninterrupted one. A fine-tune starts from its ``parent``'s weights with a fresh AdamW.
On CUDA a step runs under bf16 autocast with fp32 weights, compiled where the run compiles, with a fused AdamW,
and the host reads the losses every :data:`READ_EVERY` steps; the CPU path is fp32, eager, and reads every step.

:class:`ForwardBackward` compiles each model after :func:`torch.compiler.reset`: a RoPE model is guarded on the
identity of its frequency objects, so models would pile up in Dynamo's cache, and past ``recompile_limit`` (8)
Dynamo silently runs eagerly. A compile that raises is logged in one line; that step and all later ones run eagerly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from rotary.models import Decoder, DecoderConfig, transfer_position_encoding

from ...errors import InputError
from .config import ExperimentConfig, ExperimentError
from .data import derived_seed, training_batch
from .distributed import Distributed, shard
from .plan import ModelSpec, scaling_block
from .progress import Reporter
from .tasks import task_training_batch

__all__ = [
    "CHECKPOINT",
    "COMPILE_MIN_STEPS",
    "COMPILING_CALLS",
    "READ_EVERY",
    "ForwardBackward",
    "ModelSpec",
    "TrainOutcome",
    "TrainingDiverged",
    "build_model",
    "decoder_config",
    "diverged_message",
    "learning_rate",
    "Schedule",
    "load_checkpoint",
    "make_optimizer",
    "read_interval",
    "start_model",
    "param_groups",
    "train_model",
    "trained_scaling",
]

CHECKPOINT = "checkpoint.pt"
CHECKPOINT_FORMAT = 2

#: Off the CPU, the losses and gradient norms of this many steps are read back at once (and always
#: before a checkpoint and at the last step): a read waits for the device to finish, and the host
#: then has no step queued behind it. On the CPU reading is free and happens every step.
READ_EVERY = 50

#: A model with fewer steps than this left to train runs eagerly even when the run compiles: compiling
#: (seconds, for every model: see :class:`ForwardBackward`) costs more than it saves on so few steps.
COMPILE_MIN_STEPS = 200

#: The calls of a compiled step that compile (see :class:`ForwardBackward`).
COMPILING_CALLS = 1


def decoder_config(
    encoding: str,
    config: ExperimentConfig,
    rope_scaling: dict | None = None,
    rope_base: float | None = None,
    *,
    stage: str = "pretrain",
) -> DecoderConfig:
    """The ``DecoderConfig`` of a model of this run (positions up to ``8L``; a task model ``task_hidden_size`` wide)."""
    return DecoderConfig(
        vocab_size=256,
        hidden_size=config.task_hidden_size if stage == "task" else config.hidden_size,
        num_layers=config.num_layers,
        num_heads=config.num_heads,
        max_position=max(config.longest, config.extension_length, max(config.task_lengths) if config.has_tasks else 0),
        position_encoding=encoding,
        rope_base=config.rope_base if rope_base is None else rope_base,
        rope_scaling=rope_scaling,
    )


def trained_scaling(spec: ModelSpec, config: ExperimentConfig) -> dict | None:
    """The ``rope_scaling`` a model is trained and evaluated with (None for ``none`` and task models)."""
    if spec.stage == "task":
        return None
    return scaling_block(spec.scaling, spec.length / config.train_length, config.train_length)


def build_model(spec: ModelSpec, config: ExperimentConfig) -> Decoder:
    """The model of ``spec`` with its initial weights (a function of the seed and the encoding only).

    >>> from rotary.tools.experiments.plan import model_specs
    >>> cfg = ExperimentConfig(preset="tiny", train_length=112, hidden_size=32, num_layers=1, num_heads=2, seeds=1)
    >>> a, b = build_model(model_specs(cfg)[0], cfg), build_model(model_specs(cfg)[0], cfg)
    >>> all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    True
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derived_seed(spec.seed, "init", spec.encoding))
        return Decoder(
            decoder_config(spec.encoding, config, trained_scaling(spec, config), spec.rope_base, stage=spec.stage)
        )


def start_model(spec: ModelSpec, config: ExperimentConfig, parent: Decoder | None = None) -> Decoder:
    """The model of ``spec`` before its first step: :func:`build_model`, or a fine-tune's ``parent``'s weights;
    InputError for a fine-tune without its parent, or a parent for a model that has none.
    """
    if (spec.parent is None) != (parent is None):
        raise InputError(
            f"model {spec.name} starts from {spec.parent_name or 'nothing'}, got "
            f"{'a parent' if parent is not None else 'none'}"
        )
    if parent is None:
        return build_model(spec, config)
    if parent.config.position_encoding == spec.encoding:
        model = build_model(spec, config)
        model.load_state_dict(parent.state_dict())
        return model
    with torch.random.fork_rng(devices=[]):  # the new encoding's own weights, if any, start as build_model's would
        torch.manual_seed(derived_seed(spec.seed, "init", spec.encoding))
        return transfer_position_encoding(
            parent, spec.encoding, rope_base=spec.rope_base, rope_scaling=trained_scaling(spec, config)
        )


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """AdamW groups: weight decay on linear layers' weights only (an untrained learned position keeps its value)."""
    decay = {id(m.weight): m.weight for m in model.modules() if isinstance(m, nn.Linear)}
    rest = [p for p in model.parameters() if id(p) not in decay]
    return [{"params": list(decay.values()), "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


@dataclass(frozen=True)
class Schedule:
    """A learning-rate schedule: linear warm-up to ``peak`` over ``warmup_steps``, then cosine decay to
    ``floor`` at the last of ``steps``."""

    steps: int
    warmup_steps: int
    peak: float
    floor: float

    @classmethod
    def of(cls, spec: ModelSpec, config: ExperimentConfig) -> Schedule:
        """Pretraining's schedule, a fine-tune's (a tenth of its steps of warm-up) or a task model's (a twentieth).

        >>> from rotary.tools.experiments.plan import ModelSpec
        >>> Schedule.of(ModelSpec("rope-ft-yarn", "rope", 0, "", steps=60, parent="rope"), ExperimentConfig())
        Schedule(steps=60, warmup_steps=6, peak=0.001, floor=0.0003)
        """
        if spec.fine_tune:
            return cls(spec.steps, max(1, spec.steps // 10), config.finetune_learning_rate, config.min_learning_rate)
        if spec.stage == "task":
            peak = config.task_learning_rate
            return cls(spec.steps, max(1, spec.steps // 20), peak, peak / 10)
        return cls(spec.steps, config.warmup_steps, config.learning_rate, config.min_learning_rate)


def learning_rate(step: int, schedule: Schedule) -> float:
    """The learning rate at ``step`` (0-based) of ``schedule``.

    >>> s = Schedule(steps=100, warmup_steps=10, peak=1.0, floor=0.1)
    >>> learning_rate(0, s), learning_rate(10, s), round(learning_rate(99, s), 3)
    (0.1, 1.0, 0.1)
    """
    if step < schedule.warmup_steps:
        return schedule.peak * (step + 1) / schedule.warmup_steps
    span = max(schedule.steps - 1 - schedule.warmup_steps, 1)
    progress = min((step - schedule.warmup_steps) / span, 1.0)
    return schedule.floor + 0.5 * (1 + math.cos(math.pi * progress)) * (schedule.peak - schedule.floor)


def read_interval(device: torch.device) -> int:
    """Steps between reads of the losses on the host: 1 on the CPU, :data:`READ_EVERY` elsewhere."""
    return 1 if device.type == "cpu" else READ_EVERY


def make_optimizer(model: nn.Module, config: ExperimentConfig, peak: float, device: torch.device) -> torch.optim.AdamW:
    """AdamW (β = 0.9, 0.95) over :func:`param_groups`; on CUDA its fused kernel (one launch per step)."""
    fused = {"fused": True} if device.type == "cuda" else {}
    return torch.optim.AdamW(param_groups(model, config.weight_decay), lr=peak, betas=(0.9, 0.95), eps=1e-8, **fused)


class ForwardBackward:
    """The forward, the loss and the backward of one training step; the optimizer step is the caller's.

    ``module`` (the model or its DDP wrapper: ``input_ids [B, S] -> logits [B, S, V]``) runs under bf16 autocast
    when ``mixed_precision`` (loss from fp32 logits) and through ``torch.compile(module, dynamic=False)`` when
    ``compile``; a compile that raises logs one line to ``log`` and falls back to eager (module docstring).

    >>> from rotary.models import DecoderConfig
    >>> model = Decoder(DecoderConfig(hidden_size=32, num_layers=1, num_heads=2))
    >>> step = ForwardBackward(model, mixed_precision=False, compile=False, device=torch.device("cpu"))
    >>> batch = torch.randint(256, (2, 9))
    >>> loss = step(batch[:, :-1], batch[:, 1:])
    >>> loss.dtype, model.lm_head.weight.grad.shape
    (torch.float32, torch.Size([256, 32]))
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        mixed_precision: bool,
        compile: bool,
        device: torch.device,
        log: Callable[[str], None] = print,
    ) -> None:
        self.module, self.device, self.log = module, device, log
        self.mixed_precision = mixed_precision
        self.compiled: Callable[[torch.Tensor], torch.Tensor] | None = None
        self.compile_seconds = 0.0
        self.calls = 0
        if compile:
            torch.compiler.reset()
            self.compiled = torch.compile(module, dynamic=False)

    def _run(
        self, forward: Callable[[torch.Tensor], torch.Tensor], inputs: torch.Tensor, targets: torch.Tensor
    ) -> torch.Tensor:
        autocast = (
            torch.autocast(self.device.type, dtype=torch.bfloat16) if self.mixed_precision else contextlib.nullcontext()
        )
        with autocast:
            logits = forward(inputs)  # [B, S, V]
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))
        loss.backward()
        return loss.detach()

    def __call__(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Forward and backward of ``inputs``, ``targets`` int64 ``[B, S]``, accumulating gradients;
        returns the mean loss, 0-dim fp32 on the device (not read on the host).
        """
        self.calls += 1
        if self.compiled is not None and self.calls <= COMPILING_CALLS:
            started = time.perf_counter()
            try:
                loss = self._run(self.compiled, inputs, targets)
            except Exception as exc:  # anything torch.compile raises: Dynamo, AOTAutograd, Inductor, a compiler
                first = (str(exc).strip().splitlines() or [""])[0][:200]
                self.log(f"torch.compile failed ({type(exc).__name__}: {first}); training eagerly")
                self.compiled, self.compile_seconds = None, 0.0
                for p in self.module.parameters():
                    p.grad = None
            else:
                self.compile_seconds += time.perf_counter() - started
                return loss
        return self._run(self.compiled if self.compiled is not None else self.module, inputs, targets)

    @property
    def is_compiled(self) -> bool:
        """Whether the steps run compiled (False after a fallback)."""
        return self.compiled is not None


@dataclass
class TrainOutcome:
    """A trained model and how its training went (wall time summed over resumed segments;
    ``compile_seconds``, the first, compiling steps, is part of ``seconds``).
    """

    model: Decoder
    losses: list[float]
    seconds: float
    tokens_per_second: float
    resumed_at: int = 0
    compiled: bool = False
    compile_seconds: float = 0.0


def load_checkpoint(path: Path, spec: ModelSpec, config: ExperimentConfig) -> dict:
    """Read a checkpoint and check it is this model's; ExperimentError naming the file and the fix otherwise."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a truncated zip, a garbage file, a pickle error: all one message
        raise ExperimentError(
            f"checkpoint {path} is corrupted ({type(exc).__name__}); delete it to train "
            f"{spec.name} again from the start"
        ) from None
    if (
        not isinstance(state, dict)
        or state.get("format") != CHECKPOINT_FORMAT
        or state.get("spec") != dataclasses.asdict(spec)
    ):
        raise ExperimentError(f"checkpoint {path} is not a checkpoint of model {spec.name} of this run; delete it")
    if state.get("config") != config.to_dict():
        raise ExperimentError(
            f"checkpoint {path} was written with other settings than this run's config.json; delete it"
        )
    missing = {"step", "model", "optimizer", "losses", "seconds"} - set(state)
    if missing or not 0 < state["step"] <= spec.steps or len(state["losses"]) != state["step"]:
        raise ExperimentError(
            f"checkpoint {path} is corrupted (missing or inconsistent {sorted(missing) or 'step'}); delete it"
        )
    return state


def _save_checkpoint(path: Path, payload: dict) -> None:
    # written beside and renamed: a kill while writing leaves the previous checkpoint intact
    tmp = path.with_name(path.name + ".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)


class TrainingDiverged(ExperimentError):
    """The training loss or gradient norm stopped being finite: the run stops (exit status 2)."""


def diverged_message(
    spec: ModelSpec, config: ExperimentConfig, step: int, loss: float, norm: float, run_dir: Path | None = None
) -> str:
    """One line: which model diverged at which step, and which setting to lower.

    Example:
        >>> from rotary.tools.experiments.plan import ModelSpec
        >>> cfg = ExperimentConfig(learning_rate=1e9, steps=3, warmup_steps=0)
        >>> spec = ModelSpec("rope", "rope", 0, "RoPE", steps=3)
        >>> print(diverged_message(spec, cfg, 1, float("nan"), float("inf")))  # doctest: +NORMALIZE_WHITESPACE
        training rope (encoding rope, seed 0) diverged at step 2 of 3: loss nan, gradient norm inf at learning rate
        5e+08; nothing was evaluated. Start a new run with a lower --learning-rate (this run: 1e+09)
    """
    schedule = Schedule.of(spec, config)
    flag = (
        "--finetune-learning-rate"
        if spec.fine_tune
        else ("--task-learning-rate" if spec.stage == "task" else "--learning-rate")
    )
    text = (
        f"training {spec.model} (encoding {spec.encoding}, seed {spec.seed}) diverged at step {step + 1} of "
        f"{spec.steps}: loss {loss:.4g}, gradient norm {norm:.4g} at learning rate "
        f"{learning_rate(step, schedule):.3g}; nothing was "
        f"evaluated{'' if run_dir is None else f' and {run_dir} has no results.json (not a finished run)'}. Start a "
        f"new run with a lower {flag} (this run: {schedule.peak:g})"
    )
    if config.weight_decay > 1 and schedule.peak * config.weight_decay >= 0.5:
        text += (
            f" or a lower --weight-decay (this run: {config.weight_decay:g}; every step multiplies the weights by "
            f"1 - learning rate x weight decay)"
        )
    return text


def train_model(
    spec: ModelSpec,
    config: ExperimentConfig,
    train_tokens: torch.Tensor,
    *,
    parent: Decoder | None = None,
    run_dir: Path | None,
    resume: bool,
    reporter: Reporter,
    dist: Distributed = Distributed(),
) -> TrainOutcome:
    """Train (or continue) the model of ``spec`` on uint8 ``train_tokens`` ``[N]``; returns it in eval mode.

    ``parent``: the trained model ``spec.parent`` names; ``run_dir``: where rank 0 writes checkpoints (None: none).

    Raises:
        TrainingDiverged: a loss or gradient norm is not finite (the last checkpoint is the last finite one).
        ExperimentError: a checkpoint that does not belong to this run or does not fit the model.
    """
    device = dist.device(config.device)
    model = start_model(spec, config, parent).to(device)
    if spec.steps == 0:  # a transfer measured as it is
        return TrainOutcome(model.eval(), [], 0.0, 0.0)
    schedule = Schedule.of(spec, config)
    optimizer = make_optimizer(model, config, schedule.peak, device)
    path = None if run_dir is None else run_dir / "models" / spec.name / CHECKPOINT
    start, losses, seconds_before = 0, [], 0.0
    if resume and path is not None and path.exists():
        state = load_checkpoint(path, spec, config)
        try:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
        except (RuntimeError, ValueError, KeyError) as exc:
            raise ExperimentError(
                f"checkpoint {path} does not fit model {spec.name} ({str(exc).splitlines()[0]}); delete it"
            ) from None
        start, losses, seconds_before = state["step"], list(state["losses"]), float(state["seconds"])

    if dist.world_size > 1:
        wrapped: nn.Module = nn.parallel.DistributedDataParallel(
            model, device_ids=[dist.local_rank] if device.type == "cuda" else None
        )
    else:
        wrapped = model
    forward_backward = ForwardBackward(
        wrapped,
        mixed_precision=config.mixed_precision(device.type),
        device=device,
        log=reporter.log,
        compile=config.compiles(device.type) and spec.steps - start >= COMPILE_MIN_STEPS,
    )
    read_every = read_interval(device)

    def save(step: int, seconds: float) -> None:
        if path is None or not dist.is_main:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        _save_checkpoint(
            path,
            {
                "format": CHECKPOINT_FORMAT,
                "spec": dataclasses.asdict(spec),
                "config": config.to_dict(),
                "step": step,
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "losses": losses,
                "seconds": seconds,
            },
        )

    # (step, loss, gradient norm) not read back yet; the loss is the global batch's, the norm that of the
    # averaged gradients: the same on every rank, so every rank stops at the same step
    pending: list[tuple[int, torch.Tensor, torch.Tensor]] = []

    def read(task: Any) -> None:
        """Read the pending steps' losses and norms (one transfer); the first that is not finite stops the run."""
        if not pending:
            return
        values = torch.stack([torch.stack((loss, norm.float())) for _, loss, norm in pending]).tolist()
        for (step, _, _), (loss, norm) in zip(pending, values):
            if not (math.isfinite(loss) and math.isfinite(norm)):
                raise TrainingDiverged(diverged_message(spec, config, step, loss, norm, run_dir))
            losses.append(loss)
        recent = losses[-20:]
        task.advance(len(pending), loss=sum(recent) / len(recent))
        pending.clear()

    model.train()
    started = time.perf_counter()
    with reporter.task(f"train {spec.name:<18}", total=spec.steps, completed=start) as task:
        for step in range(start, spec.steps):
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(step, schedule)
            if spec.stage == "task":  # inputs and targets apart: only the answers are scored
                inputs, targets = (
                    shard(t, dist) for t in task_training_batch(spec.first_batch + step, config, spec.seed, spec.rows)
                )
            else:
                batch = shard(
                    training_batch(
                        train_tokens, spec.first_batch + step, config, spec.seed, rows=spec.rows, length=spec.length
                    ),
                    dist,
                )
                inputs, targets = batch[:, :-1], batch[:, 1:]
            if device.type == "cuda":  # from pinned memory the copy does not wait for the queued steps
                inputs, targets = (t.pin_memory().to(device, non_blocking=True) for t in (inputs, targets))
            else:
                inputs, targets = inputs.to(device), targets.to(device)
            loss = forward_backward(inputs, targets)
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
            pending.append((step, dist.mean(loss), norm))
            last = step + 1 == spec.steps
            checkpoint = (step + 1) % config.checkpoint_every == 0 or last
            if len(pending) >= read_every or checkpoint:
                read(task)  # on the CPU: every step, before its optimizer step (a diverged step is never applied)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if checkpoint:  # every step up to this one was read and finite
                save(step + 1, seconds_before + time.perf_counter() - started)
    if start == spec.steps:  # finished before: its time is the checkpoint's
        seconds = seconds_before
    else:
        seconds = seconds_before + time.perf_counter() - started
    tokens_per_second = spec.steps * spec.rows * spec.length / max(seconds, 1e-9)
    del wrapped  # the DDP wrapper (and its hooks on the process group) ends with training
    compiled, compile_seconds = forward_backward.is_compiled, forward_backward.compile_seconds
    del forward_backward  # the compiled module holds the wrapper
    model.eval()
    return TrainOutcome(
        model, losses, seconds, tokens_per_second, resumed_at=start, compiled=compiled, compile_seconds=compile_seconds
    )
