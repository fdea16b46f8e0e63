"""Measuring a trained model at and past its training length ``L``.

For every evaluation length ``E`` (and every scaling, for models with RoPE):

- perplexity and bits per byte on the held-out text cut into non-overlapping windows of ``E`` tokens
  (each window is predicted from its own tokens only, so a longer ``E`` means more context *and*
  positions further past ``L``);
- the loss by position bucket ``[0, L), [L, 2L), [2L, 4L), [4L, 8L)`` inside those windows: on
  ``8L`` windows this separates "the model breaks at positions past L" (the later buckets get
  worse) from "short windows give less context" (they get better);
- passkey retrieval at ``E`` tokens (:mod:`rotary.experiments.passkey`), by greedy decoding.

Scalings are applied at inference only, with factor ``E / L``: the trained weights are loaded
unchanged into a ``Decoder`` whose config carries the ``rope_scaling`` block (RoPE's tables and
frequencies are not part of the state dict). :func:`scaled_copy` is the one place that does this.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from .. import RoPE
from ..models import Decoder
from .config import SCALINGS, ExperimentConfig
from .data import derived_seed, windows
from .passkey import KEY_DIGITS, make_trials, passkey_accuracy
from .progress import Reporter
from .train import ModelSpec

__all__ = [
    "SCALING_LABELS",
    "bucket_edges",
    "evaluate_model",
    "greedy_continuation",
    "passkey_at",
    "perplexity_at",
    "rows_per_batch",
    "scaled_copy",
    "scaling_block",
    "token_losses",
    "uses_rope",
]

#: how each scaling is called in tables and figures
SCALING_LABELS = {"none": "", "linear": "PI (linear)", "ntk": "NTK", "dynamic": "dynamic NTK", "yarn": "YaRN"}


def scaling_block(name: str, factor: float, train_length: int) -> dict | None:
    """The Hugging Face-style ``rope_scaling`` block of scaling ``name`` with ``factor`` (``E / L``).

    ``dynamic`` is transformers' dynamic NTK with the same ``factor``: at a sequence of ``n`` tokens it
    raises the base as static NTK with ``alpha = factor * n / L - (factor - 1)`` would, i.e. with
    ``factor ** 2 - factor + 1`` at ``n = E``, more than static NTK's ``factor``.

    Example:
        >>> scaling_block("yarn", 4.0, 128)
        {'rope_type': 'yarn', 'factor': 4.0, 'original_max_position_embeddings': 128}
        >>> scaling_block("none", 4.0, 128) is None
        True
    """
    if name not in SCALINGS:
        raise ValueError(f"unknown scaling {name!r}; known: {', '.join(SCALINGS)}")
    factor = float(factor)
    if name == "none":
        return None
    if name in ("linear", "ntk"):
        return {"rope_type": name, "factor": factor}
    if name == "dynamic":
        return {"rope_type": "dynamic", "factor": factor, "max_position_embeddings": train_length}
    return {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": train_length}


def uses_rope(model: Decoder) -> bool:
    """True when the model rotates q and k with a :class:`rotary.RoPE` (scalings apply to it)."""
    return any(isinstance(m, RoPE) for m in model.modules())


def scaled_copy(model: Decoder, scaling: dict | None) -> Decoder:
    """A copy of ``model`` with the same weights and RoPE scaled by ``scaling``, in eval mode.

    The only place where a trained model's RoPE scaling changes: a new ``Decoder`` built from the
    model's config, loaded with its state dict (RoPE has no parameters, so the weights are exactly the
    trained ones) and given the scaling with ``Decoder.set_rope_scaling``; its RoPE state is fresh
    (dynamic NTK remembers the longest length it has seen). The trained model is never touched.
    Models without RoPE are copied as they are (``scaling`` must then be None).

    Args:
        model: a trained :class:`rotary.models.Decoder`.
        scaling: a ``rope_scaling`` block (:func:`scaling_block`) or None.

    Example:
        >>> from rotary.models import DecoderConfig
        >>> m = Decoder(DecoderConfig(hidden_size=32, num_layers=1, num_heads=2))
        >>> s = scaled_copy(m, scaling_block("linear", 2.0, 64))
        >>> torch.equal(s.lm_head.weight, m.lm_head.weight), s.config.rope_scaling["factor"], m.config.rope_scaling
        (True, 2.0, None)
    """
    with torch.random.fork_rng(devices=[]):  # building initialises weights: keep the caller's RNG untouched
        copy = Decoder(dataclasses.replace(model.config))
    copy.load_state_dict(model.state_dict())
    if uses_rope(copy):
        copy.set_rope_scaling(None if scaling is None else dict(scaling))
    elif scaling is not None:
        raise ValueError(f"position_encoding={model.config.position_encoding!r} has no RoPE to scale with {scaling}")
    return copy.to(next(model.parameters()).device).eval()


def rows_per_batch(length: int, num_heads: int, *, max_tokens: int = 16384, max_scores: int = 2**24) -> int:
    """Windows per forward: at most ``max_tokens`` tokens and ``max_scores`` attention scores
    (``rows * heads * E * E``; ALiBi, masks and biases hold that many fp32 values per layer).

    Example:
        >>> rows_per_batch(1024, 4), rows_per_batch(128, 4)
        (4, 128)
    """
    return max(1, min(max_tokens // length, max_scores // (num_heads * length * length)))


@torch.no_grad()
def token_losses(model: Decoder, windows: torch.Tensor, *, batch_rows: int | None = None) -> torch.Tensor:
    """Next-token cross-entropy (nats) at every position of every window.

    Args:
        model: a ``Decoder`` in eval mode.
        windows: int64 ``[N, E]``.
        batch_rows: windows per forward; default :func:`rows_per_batch`.

    Returns:
        fp32 ``[N, E - 1]``: entry ``[i, p]`` is the loss of predicting token ``p + 1`` from tokens
        ``0..p`` of window ``i`` (the query sits at position ``p``).
    """
    n, length = windows.shape
    rows = batch_rows or rows_per_batch(length, model.config.num_heads)
    device = next(model.parameters()).device
    out = []
    for start in range(0, n, rows):
        chunk = windows[start : start + rows].to(device)
        logits = model(chunk[:, :-1]).float()  # [b, E - 1, V]
        losses = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), chunk[:, 1:].reshape(-1), reduction="none")
        out.append(losses.view(chunk.shape[0], length - 1).cpu())
    return torch.cat(out)


def bucket_edges(config: ExperimentConfig) -> list[int]:
    """Bucket boundaries: 0 and every evaluation length, e.g. ``[0, L, 2L, 4L, 8L]``.

    Example:
        >>> bucket_edges(ExperimentConfig(train_length=128))
        [0, 128, 256, 512, 1024]
    """
    return [0, *sorted(config.eval_lengths)]


def perplexity_at(model: Decoder, tokens: torch.Tensor, length: int, edges: Sequence[int]) -> dict:
    """Loss, perplexity, bits per byte and loss per position bucket on windows of ``length`` tokens.

    Args:
        model: a ``Decoder`` in eval mode.
        tokens: int64 ``[T]`` held-out text (at least one window).
        length: the window length ``E``.
        edges: bucket boundaries (positions of the query); a bucket starting at or past ``E - 1`` is None.

    Returns:
        ``{"loss", "perplexity", "bits_per_byte", "windows", "predictions", "buckets": {"a-b": loss}}``.
        Tokens are bytes, so bits per byte is the loss in bits.
    """
    losses = token_losses(model, windows(tokens, length)).double()  # [N, E - 1]
    buckets: dict[str, float | None] = {}
    for a, b in zip(edges[:-1], edges[1:]):
        stop = min(b, length - 1)
        buckets[f"{a}-{b}"] = float(losses[:, a:stop].mean()) if a < stop else None
    loss = float(losses.mean())
    return {
        "loss": loss,
        "perplexity": math.inf if loss > 700 else math.exp(loss),  # exp overflows past ~709
        "bits_per_byte": loss / math.log(2),
        "windows": losses.shape[0],
        "predictions": losses.numel(),
        "buckets": buckets,
    }


@torch.no_grad()
def passkey_at(model: Decoder, length: int, config: ExperimentConfig) -> dict:
    """Passkey accuracy at ``length`` tokens (prompt plus the 5 answer digits) by greedy decoding.

    The trials depend only on the run's seed and ``length``, so every model gets the same prompts.
    """
    trials = make_trials(
        length, config.passkey_trials, config.passkey_depths, torch.Generator().manual_seed(derived_seed(config.seed, "passkey", length))
    )
    device = next(model.parameters()).device

    def answer(prompts: torch.Tensor) -> torch.Tensor:
        return greedy_continuation(model, prompts.to(device), KEY_DIGITS).cpu()

    return passkey_accuracy(answer, trials, batch_size=rows_per_batch(length, model.config.num_heads, max_scores=2**23))


@torch.no_grad()
def greedy_continuation(model: Decoder, prompts: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy decoding of ``new_tokens`` tokens after unpadded ``prompts`` ``[B, S]``: ``[B, new_tokens]``.

    The same tokens as ``model.generate(prompts, new_tokens)[:, S:]``, through the model's KV cache; without
    an attention mask (no padding here) the prompt runs on SDPA's causal path instead of an explicit
    ``[B, 1, S, S]`` mask.

    Example:
        >>> from rotary.models import DecoderConfig
        >>> m = Decoder(DecoderConfig(hidden_size=32, num_layers=1, num_heads=2)).eval()
        >>> p = torch.randint(256, (2, 7))
        >>> torch.equal(greedy_continuation(m, p, 3), m.generate(p, 3)[:, 7:])
        True
    """
    cache = model.new_cache()
    logits = model(prompts, cache=cache)[:, -1]
    tokens = []
    for i in range(new_tokens):
        tokens.append(logits.float().argmax(-1, keepdim=True))
        if i + 1 < new_tokens:
            logits = model(tokens[-1], cache=cache)[:, -1]
    return torch.cat(tokens, dim=1)


def evaluate_model(
    spec: ModelSpec, model: Decoder, tokens: torch.Tensor, config: ExperimentConfig, reporter: Reporter
) -> list[dict]:
    """Every measurement of one trained model: one row per scaling x evaluation length.

    Models without RoPE are measured as they are (scaling ``none``) only.

    Returns:
        rows with ``model, encoding, seed, scaling, eval_length, factor`` and the numbers of
        :func:`perplexity_at` and :func:`passkey_at` (``passkey_accuracy``, ``passkey_by_depth`` ...).
    """
    # scalings apply to RoPE models; a repeat run only measures the spread, as trained
    scalings = config.scalings if uses_rope(model) and not spec.repeat else ("none",)
    edges = bucket_edges(config)
    rows = []
    with reporter.task(f"evaluate {spec.name:<11}", total=len(scalings) * len(config.eval_lengths)) as task:
        for scaling in scalings:
            for length in sorted(config.eval_lengths):
                factor = max(length / config.train_length, 1.0)
                block = scaling_block(scaling, factor, config.train_length)
                measured = perplexity_at(scaled_copy(model, block), tokens, length, edges)
                # a fresh copy: dynamic NTK would otherwise start from the state the windows left
                passkey = passkey_at(scaled_copy(model, block), length, config)
                rows.append({
                    "model": spec.name, "encoding": spec.encoding, "seed": spec.seed, "scaling": scaling,
                    "eval_length": length, "factor": factor, **measured,
                    "passkey_accuracy": passkey["accuracy"], "passkey_correct": passkey["correct"],
                    "passkey_trials": passkey["trials"],
                    "passkey_by_depth": {f"{d:g}": a for d, a in passkey["by_depth"].items()},
                })
                task.advance(scaling=scaling, length=length)
    return rows
