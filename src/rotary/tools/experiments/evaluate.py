"""Measuring a trained model at and past its training length ``L``; how each measure is read: docs/experiment.md.

For every evaluation length ``E`` (and every scaling, for models with RoPE): perplexity and bits per byte in
non-overlapping and in sliding windows (every scored token sees at least ``E - stride`` tokens; "Train Short,
Test Long", appendix B, shows why both are needed); the loss by query position in bins of ``L / 8``; passkey
retrieval and the retrieval probe; for a task model, copy and associative-recall accuracy only.

Scalings of a pretrained model apply at inference only, with factor ``E / L``; a model fine-tuned with a
scaling is evaluated at its own factor. :func:`scaled_copy` is the one place a scaling changes; a measurement
equal to one already made is not repeated (:func:`same_rope`). Evaluation runs under the run's mixed
precision, losses from fp32 logits.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
from collections.abc import Callable, Iterator
from copy import deepcopy
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rotary import RoPE
from rotary import positions as P
from rotary.models import Decoder

from ...errors import InputError
from .config import ExperimentConfig
from .data import derived_seed, windows
from .passkey import KEY_DIGITS, make_trials, passkey_accuracy
from .plan import SCALING_LABELS, ModelSpec, scaling_block
from .progress import Reporter
from .retrieval import PREFIX, retrieval_scores
from .retrieval import make_trials as make_retrieval_trials
from .rows import CSV_FILES, Measurements, PasskeyRow, PerplexityRow, PositionRow, RetrievalRow, TaskRow
from .tasks import TASKS, task_scores, task_trials
from .train import trained_scaling

__all__ = [
    "SCALING_LABELS",
    "EvaluationText",
    "eval_rows",
    "evaluate_model",
    "evaluate_tasks",
    "evaluation_scalings",
    "greedy_continuation",
    "passkey_at",
    "position_bins",
    "rows_per_batch",
    "same_rope",
    "scaled_copy",
    "scored_tail",
    "scaling_block",
    "sliding_losses",
    "summarise",
    "token_losses",
    "uses_rope",
]


@dataclass(frozen=True)
class EvaluationText:
    """The held-out text of each measurement, int64: ``windows`` ``[T]`` (cut into windows), ``sliding``
    (where the sliding windows' scored strides begin; may be empty), ``held_out`` ``[N]`` (for the retrieval trials).
    """

    windows: torch.Tensor
    sliding: tuple[int, ...]
    held_out: torch.Tensor


def uses_rope(model: Decoder) -> bool:
    """True when the model rotates q and k with a :class:`rotary.RoPE` (scalings apply to it)."""
    return any(isinstance(m, RoPE) for m in model.modules())


def scaled_copy(model: Decoder, scaling: dict | None) -> Decoder:
    """A copy of ``model`` in eval mode, same weights, RoPE scaled by ``scaling`` (None: unscaled).

    Example:
        >>> from rotary.models import DecoderConfig
        >>> m = Decoder(DecoderConfig(hidden_size=32, num_layers=1, num_heads=2))
        >>> s = scaled_copy(m, scaling_block("linear", 2.0, 64))
        >>> torch.equal(s.lm_head.weight, m.lm_head.weight), s.config.rope_scaling["factor"], m.config.rope_scaling
        (True, 2.0, None)
    """
    # a copy on the model's device (no initialisation, no host round trip: on a GPU this is cheap enough
    # to make one per measurement); set_rope_scaling gives it a RoPE built afresh from the config
    copy = deepcopy(model)
    if uses_rope(copy):
        copy.set_rope_scaling(None if scaling is None else dict(scaling))
    elif scaling is not None:
        raise InputError(f"position_encoding={model.config.position_encoding!r} has no RoPE to scale with {scaling}")
    return copy.to(next(model.parameters()).device).eval()


def rows_per_batch(length: int, num_heads: int, *, max_tokens: int = 16384, max_scores: int = 2**24) -> int:
    """Windows per forward: at most ``max_tokens`` tokens and ``max_scores`` scores (``rows * heads * E²``).

    >>> rows_per_batch(1024, 4), rows_per_batch(128, 4)
    (4, 128)
    """
    return max(1, min(max_tokens // length, max_scores // (num_heads * length * length)))


#: (tokens, attention scores) per forward on a GPU. SDPA's flash and memory-efficient kernels hold no
#: ``[E, E]`` scores for causal attention; a score bias (ALiBi) builds ``[rows, heads, E, E]`` fp32 values
#: per layer, and a static cache's prefill a ``[rows, 1, E, E]`` mask (``heads`` of them with a bias):
#: 2**28 of them is 1 GiB per copy, a few GiB at the peak.
GPU_BATCH = (2**18, 2**28)


def eval_rows(model: Decoder, length: int, *, generate: bool = False) -> int:
    """Windows (or, ``generate``, passkey prompts) of ``length`` per forward: :func:`rows_per_batch` on the
    CPU, the budget :data:`GPU_BATCH` elsewhere.
    """
    heads = model.config.num_heads
    if next(model.parameters()).device.type == "cpu":
        return rows_per_batch(length, heads, max_scores=2**23 if generate else 2**24)
    biased = any(layer.attn.position_bias is not None for layer in model.layers)
    max_tokens, max_scores = GPU_BATCH
    return rows_per_batch(length, heads if biased else 1, max_tokens=max_tokens, max_scores=max_scores)


@contextlib.contextmanager
def scored_tail(model: Decoder, keep: int | None) -> Iterator[None]:
    """Within it, ``model(ids)`` returns the logits of the last ``keep`` positions only, ``[B, keep, V]``.

    >>> from rotary.models import DecoderConfig
    >>> m = Decoder(DecoderConfig(hidden_size=32, num_layers=1, num_heads=2)).eval()
    >>> ids = torch.randint(256, (3, 20))
    >>> with torch.no_grad(), scored_tail(m, 4):
    ...     tail = m(ids)
    >>> tail.shape, torch.equal(tail, m(ids)[:, -4:].detach())
    (torch.Size([3, 4, 256]), True)
    """
    if keep is None:
        yield
        return
    handle = model.norm.register_forward_pre_hook(lambda _norm, args: (args[0][:, -keep:],))
    try:
        yield
    finally:
        handle.remove()


@torch.no_grad()
def token_losses(
    model: Decoder, windows: torch.Tensor, *, batch_rows: int | None = None, last: int | None = None
) -> torch.Tensor:
    """Next-token cross-entropy (nats) of int64 ``windows`` ``[N, E]``: fp32 ``[N, E - 1]`` (``[i, p]``
    predicts token ``p + 1``), or ``[N, last]`` for the last ``last`` targets only.
    """
    n, length = windows.shape
    rows = batch_rows or eval_rows(model, length)
    scored = length - 1 if last is None else last
    device = next(model.parameters()).device
    out = []
    for start in range(0, n, rows):
        chunk = windows[start : start + rows].to(device)
        with scored_tail(model, last):
            logits = model(chunk[:, :-1]).float()  # [b, scored, V]
        losses = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), chunk[:, length - scored :].reshape(-1), reduction="none"
        )
        out.append(losses.view(chunk.shape[0], scored).cpu())
    return torch.cat(out)


@torch.no_grad()
def sliding_losses(
    model: Decoder, text: torch.Tensor, length: int, stride: int, starts: tuple[int, ...]
) -> torch.Tensor:
    """Losses of the ``stride`` tokens from each of ``starts`` in int64 ``text`` ``[T]``, each predicted by the
    ``length`` tokens ending there: fp32 ``[len(starts) * stride]``.

    >>> from rotary.models import DecoderConfig
    >>> m = Decoder(DecoderConfig(hidden_size=32, num_layers=1, num_heads=2, position_encoding="alibi")).eval()
    >>> text = torch.randint(256, (24,))
    >>> full = token_losses(m, text[None, 8:24])[0]  # one window of 16: its last 8 tokens see 8 or more
    >>> torch.allclose(sliding_losses(m, text, 16, 8, (16,)), full[-8:])
    True
    """
    if any(p < length - stride or p + stride > text.numel() for p in starts):
        raise InputError(
            f"a window of {length} needs at least {length - stride} tokens before each scored stride, and the "
            f"stride inside the {text.numel()} tokens; got strides at {list(starts)[:4]}"
        )
    # window k covers text[p - (length - stride) : p + stride] and scores its last `stride` targets
    wins = torch.stack([text[p + stride - length : p + stride] for p in starts])  # [K, E]
    return token_losses(model, wins, last=stride).reshape(-1)  # [K, stride], flattened


def position_bins(config: ExperimentConfig) -> list[tuple[int, int]]:
    """Query-position ranges for the loss on the longest windows: bins of ``L / 8``, the last ending at ``longest - 1``.

    >>> position_bins(ExperimentConfig(train_length=128))[:3], position_bins(ExperimentConfig(train_length=128))[-1]
    ([(0, 16), (16, 32), (32, 48)], (1008, 1023))
    """
    width = max(1, config.train_length // 8)
    last = config.longest - 1
    return [(a, min(a + width, last)) for a in range(0, last, width)]


def summarise(losses: torch.Tensor) -> dict:
    """Loss, perplexity and bits per byte of a tensor of losses (nats); perplexity is inf past 700 nats."""
    loss = float(losses.double().mean())
    return {
        "loss": loss,
        "perplexity": math.inf if loss > 700 else math.exp(loss),  # exp overflows past ~709
        "bits_per_byte": loss / math.log(2),
        "predictions": losses.numel(),
    }


@torch.no_grad()
def passkey_at(model: Decoder, length: int, config: ExperimentConfig) -> dict:
    """Passkey accuracy at ``length`` tokens by greedy decoding (the same trials for every model)."""
    trials = make_trials(
        length,
        config.passkey_trials,
        config.passkey_depths,
        torch.Generator().manual_seed(derived_seed(config.seed, "passkey", length)),
    )
    device = next(model.parameters()).device

    def answer(prompts: torch.Tensor) -> torch.Tensor:
        return greedy_continuation(model, prompts.to(device), KEY_DIGITS).cpu()

    return passkey_accuracy(answer, trials, batch_size=eval_rows(model, length, generate=True))


@torch.no_grad()
def greedy_continuation(model: Decoder, prompts: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy decoding of ``new_tokens`` after unpadded ``prompts`` ``[B, S]`` with static KV caches.

    >>> from rotary.models import DecoderConfig
    >>> m = Decoder(DecoderConfig(hidden_size=32, num_layers=1, num_heads=2)).eval()
    >>> p = torch.randint(256, (2, 7))
    >>> torch.equal(greedy_continuation(m, p, 3), m.generate(p, 3)[:, 7:])
    True
    """
    batch, length = prompts.shape
    device = prompts.device
    dtype = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else None
    caches = model.new_cache(batch=batch, max_len=length + new_tokens - 1, dtype=dtype)
    with scored_tail(model, 1):  # the prefill's last position is the only one read
        tokens = [model(prompts, cache=caches)[:, -1].float().argmax(-1, keepdim=True)]  # [B, 1]
    for _ in range(new_tokens - 1):
        tokens.append(model.decode_step(tokens[-1], caches).argmax(-1, keepdim=True))
    return torch.cat(tokens, dim=1)


def evaluation_scalings(spec: ModelSpec, model: Decoder, config: ExperimentConfig) -> list[tuple[str, float | None]]:
    """``(scaling, factor)`` pairs a model is measured with (factor None: ``E / L`` at each length)."""
    if spec.stage == "extend":
        return [(spec.scaling, spec.length / config.train_length if spec.scaling != "none" else 1.0)]
    if spec.stage in ("pretrain", "task") and config.study is None and uses_rope(model):
        return [(s, None) for s in config.scalings]
    return [("none", 1.0)]


def same_rope(a: Decoder, b: Decoder, length: int) -> bool:
    """Whether two copies of one model rotate positions ``0 .. length - 1`` with equal tables.

    >>> from rotary.models import DecoderConfig
    >>> m = Decoder(DecoderConfig(hidden_size=32, num_layers=1, num_heads=2))
    >>> plain = scaled_copy(m, None)
    >>> same_rope(plain, scaled_copy(m, scaling_block("yarn", 1.0, 64)), 64)
    True
    >>> same_rope(plain, scaled_copy(m, scaling_block("yarn", 2.0, 64)), 64)
    False
    """
    if not (uses_rope(a) and uses_rope(b)):
        return False
    # throwaway copies of the RoPE modules: dynamic NTK remembers the longest length it has seen
    ra, rb = deepcopy(a.rope), deepcopy(b.rope)
    positions = P.arange(length, device=ra.inv_freq.device)
    ta, tb = ra.tables(positions), rb.tables(positions)
    return all(
        x is y or (x is not None and y is not None and torch.equal(x, y))
        for x, y in ((ta.cos, tb.cos), (ta.sin, tb.sin), (ta.k_cos, tb.k_cos), (ta.k_sin, tb.k_sin))
    )


def _relabelled(rows: Measurements, scaling: str) -> Measurements:
    return Measurements(
        **{name: [dataclasses.replace(r, scaling=scaling) for r in getattr(rows, name)] for name in CSV_FILES}
    )


def evaluate_model(
    spec: ModelSpec, model: Decoder, text: EvaluationText, config: ExperimentConfig, reporter: Reporter
) -> Measurements:
    """Every measurement of one trained model, as rows (:mod:`.rows`); one equal to an earlier one is reused."""
    L = config.train_length
    scalings = evaluation_scalings(spec, model, config)
    lengths = sorted(config.eval_lengths)
    out = Measurements()

    def factor_of(scaling: str, fixed: float | None, length: int) -> float:
        if spec.stage == "extend":
            return fixed  # type: ignore[return-value]
        return 1.0 if scaling == "none" else (fixed if fixed is not None else max(length / L, 1.0))

    # one copy per rope_scaling block, used by every measurement with it: in eval mode without gradients a
    # forward leaves a copy as it found it (RoPE's table cache holds rows equal to the rows it computes),
    # except under dynamic NTK, which remembers the longest length it has seen: a fresh copy each time then
    copies: dict[str, Decoder] = {}

    def copy_at(scaling: str, fixed: float | None, length: int) -> tuple[Decoder, float]:
        factor = factor_of(scaling, fixed, length)
        block = trained_scaling(spec, config) if spec.stage == "extend" else scaling_block(scaling, factor, L)
        if block is not None and block["rope_type"] == "dynamic":
            return scaled_copy(model, block), factor
        key = json.dumps(block, sort_keys=True)
        if key not in copies:
            copies[key] = scaled_copy(model, block)
        return copies[key], factor

    # (what, length) -> (a copy measured at factor 1, its rows): what a later scaling that is the same
    # function there would measure again
    at_factor_one: dict[tuple[str, int], tuple[Decoder, Measurements]] = {}

    def once(
        what: str, length: int, scaling: str, fixed: float | None, measure: Callable[..., Measurements], *args: int
    ) -> None:
        """``measure(scaling, fixed, *args)``, or the rows of the same function measured before."""
        if factor_of(scaling, fixed, length) != 1.0:
            out.extend(measure(scaling, fixed, *args))
            return
        scaled, _ = copy_at(scaling, fixed, length)  # only compared, never run
        found = at_factor_one.get((what, length))
        if found is not None and same_rope(found[0], scaled, length):
            out.extend(_relabelled(found[1], scaling))
            return
        rows = measure(scaling, fixed, *args)
        if found is None:
            at_factor_one[(what, length)] = (scaled, rows)
        out.extend(rows)

    def at_length(scaling: str, fixed: float | None, length: int) -> Measurements:
        key = dict(model=spec.model, seed=spec.seed, scaling=scaling)
        rows = Measurements()
        scaled, factor = copy_at(scaling, fixed, length)
        losses = token_losses(scaled, windows(text.windows, length))  # [N, E - 1]
        rows.perplexity.append(
            PerplexityRow(**key, factor=factor, mode="windows", eval_length=length, stride=length, **summarise(losses))
        )
        if length == config.longest:
            for a, b in position_bins(config):
                rows.positions.append(
                    PositionRow(
                        **key,
                        factor=factor,
                        eval_length=length,
                        start=a,
                        end=b,
                        loss=float(losses[:, a:b].double().mean()),
                        predictions=losses[:, a:b].numel(),
                    )
                )
        if text.sliding:
            # copy_at again: under dynamic NTK a fresh copy, which does not start from the state the last one left
            scaled, _ = copy_at(scaling, fixed, length)
            slid = sliding_losses(scaled, text.windows, length, config.stride, text.sliding)
            rows.perplexity.append(
                PerplexityRow(
                    **key, factor=factor, mode="sliding", eval_length=length, stride=config.stride, **summarise(slid)
                )
            )
        if config.passkey_trials:
            scaled, _ = copy_at(scaling, fixed, length)
            passkey = passkey_at(scaled, length, config)
            for depth, (correct, trials) in passkey["counts"].items():
                rows.passkey.append(
                    PasskeyRow(**key, factor=factor, eval_length=length, depth=depth, correct=correct, trials=trials)
                )
        return rows

    def at_distance(scaling: str, fixed: float | None, distance: int) -> Measurements:
        trials = make_retrieval_trials(
            text.held_out,
            distance,
            trials=config.retrieval_trials,
            span=config.retrieval_span,
            generator=torch.Generator().manual_seed(derived_seed(config.seed, "retrieval", distance)),
        )
        scaled, factor = copy_at(scaling, fixed, trials.length)

        def logits(x: torch.Tensor) -> torch.Tensor:
            with scored_tail(scaled, trials.span - 1):  # the scored queries are the last span - 1
                return scaled(x.to(device))

        scores = retrieval_scores(logits, trials, batch_rows=eval_rows(scaled, trials.length))
        row = RetrievalRow(
            model=spec.model,
            seed=spec.seed,
            scaling=scaling,
            factor=factor,
            distance=distance,
            length=trials.length,
            span=config.retrieval_span,
            **scores,
        )
        return Measurements(retrieval=[row])

    device = next(model.parameters()).device
    autocast = (
        torch.autocast(device.type, dtype=torch.bfloat16)
        if config.mixed_precision(device.type)
        else contextlib.nullcontext()
    )
    if spec.stage == "task":
        with autocast:
            return evaluate_tasks(spec, model, config, reporter)
    distances = config.distances if config.retrieval_trials else ()
    with (
        reporter.task(f"evaluate {spec.name:<15}", total=len(scalings) * (len(lengths) + bool(distances))) as task,
        autocast,
    ):
        for scaling, fixed in scalings:
            for length in lengths:
                once("length", length, scaling, fixed, at_length, length)
                task.advance(scaling=scaling, length=length)
            for distance in distances:
                sequence = PREFIX + distance + config.retrieval_span  # the trials' length
                once(f"distance {distance}", sequence, scaling, fixed, at_distance, distance)
            if distances:
                task.advance(scaling=scaling, retrieval="done")
    return out


def _on_device(model: Decoder) -> Callable[[torch.Tensor], torch.Tensor]:
    device = next(model.parameters()).device
    return lambda ids: model(ids.to(device))


def evaluate_tasks(spec: ModelSpec, model: Decoder, config: ExperimentConfig, reporter: Reporter) -> Measurements:
    """A task model on every task, length (:attr:`~.config.ExperimentConfig.task_lengths`) and scaling: task rows."""
    base = config.task_length
    lengths = config.task_lengths
    out = Measurements()
    at_factor_one: dict[int, tuple[Decoder, list[TaskRow]]] = {}
    scalings = evaluation_scalings(spec, model, config)
    with reporter.task(f"evaluate {spec.name:<15}", total=len(scalings) * len(lengths)) as task:
        for scaling, _ in scalings:
            for length in lengths:
                factor = 1.0 if scaling == "none" else length / base
                scaled = scaled_copy(model, scaling_block(scaling, factor, base))
                found = at_factor_one.get(length) if factor == 1.0 else None
                if found is not None and same_rope(found[0], scaled, length):
                    out.tasks.extend(dataclasses.replace(r, scaling=scaling) for r in found[1])
                    task.advance(scaling=scaling, length=length)
                    continue
                rows = []
                for name in TASKS:
                    trials = task_trials(name, length, config)
                    scores = task_scores(_on_device(scaled), trials, batch_rows=eval_rows(scaled, length))
                    rows.append(
                        TaskRow(
                            model=spec.model,
                            seed=spec.seed,
                            scaling=scaling,
                            factor=factor,
                            task=name,
                            eval_length=length,
                            **scores,
                        )
                    )
                if factor == 1.0 and length not in at_factor_one:
                    at_factor_one[length] = (scaled, rows)
                out.tasks.extend(rows)
                task.advance(scaling=scaling, length=length)
    return out
