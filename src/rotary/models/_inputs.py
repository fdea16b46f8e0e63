"""Checks of what a model is fed: token ids against the embedding tables they index.

``nn.Embedding`` reports an id outside its table as ``IndexError: index out of range in self`` (on a GPU a
device-side assert that poisons the process). On the CPU one ``aminmax`` per call names the id, the table and
the fix (:func:`check_token_ids`); on accelerators and under ``torch.compile`` nothing is read:
:func:`embedding_ids` clamps bad ids into the table and marks them, to be embedded as 0.
"""

from __future__ import annotations

import torch

from .. import devices
from ..errors import InputError, InputTypeError

__all__ = ["check_token_ids", "embedding_ids"]


def check_token_ids(
    ids: object, size: int, *, name: str = "input_ids", table: str = "vocab_size", shape: tuple | None = None
) -> torch.Tensor:
    """Integer ids ``[B, S]`` (int64 / int32) with every id in ``0 .. size - 1``; returned unchanged.

    ``size``: the rows of the embedding they index; ``name``, ``table``: the argument and the config field that sets
    ``size``, for messages; ``shape``: the shape the ids must have. Raises ``rotary.errors.InputError`` for another
    shape or an id out of range (InputTypeError for another dtype).

    Example:
        >>> check_token_ids(torch.tensor([[3, 7]]), 8).tolist()
        [[3, 7]]
        >>> check_token_ids(torch.tensor([[3, 8]]), 8)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        rotary.errors.InputError: input_ids hold id 8, but vocab_size is 8 (ids must be in 0 .. 7); the tokenizer ...
    """
    _check_form(ids, name, shape)
    assert isinstance(ids, torch.Tensor)
    if torch.compiler.is_compiling() or not ids.numel():
        return ids
    low, high = (int(v) for v in torch.aminmax(ids))
    if low < 0:
        raise InputError(
            f"{name} hold id {low}, but ids must be in 0 .. {size - 1} ({table}={size}); negative ids such as -100 "
            "mark ignored labels, not inputs: give padding a real id and mask it with attention_mask"
        )
    if high >= size:
        raise InputError(
            f"{name} hold id {high}, but {table} is {size} (ids must be in 0 .. {size - 1}); "
            + (
                f"the tokenizer does not match this model, or build it with {table} >= {high + 1}"
                if table == "vocab_size"
                else f"build the model with {table} >= {high + 1}"
            )
        )
    return ids


def _check_form(ids: object, name: str, shape: tuple | None) -> None:
    """An int64/int32 tensor ``[B, S]`` (of ``shape`` when given): metadata only, nothing read."""
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.is_floating_point() or ids.is_complex():
        raise InputError(f"{name} must be an integer tensor [B, S], got {getattr(ids, 'shape', type(ids).__name__)}")
    if ids.dtype not in (torch.int64, torch.int32):
        raise InputTypeError(f"{name} must be int64 or int32, got {ids.dtype}; convert with .long()")
    if shape is not None and tuple(ids.shape) != tuple(shape):
        raise InputError(f"{name} must have the shape of input_ids {tuple(shape)}, got {tuple(ids.shape)}")


def embedding_ids(
    ids: object, size: int, *, name: str = "input_ids", table: str = "vocab_size"
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token ids ready for an embedding lookup, checked without a host read where a read would synchronise.

    Arguments as :func:`check_token_ids`. Returns ``(ids, unknown)``: ids safe to look up (off the CPU, bad ones
    clamped) and a bool ``[B, S]`` of the out-of-range ones, whose embeddings the caller zeroes (``None`` where
    checked on the host, which raises as :func:`check_token_ids`).

    Example:
        >>> embedding_ids(torch.tensor([[3, 7]]), 8)
        (tensor([[3, 7]]), None)
    """
    _check_form(ids, name, None)
    assert isinstance(ids, torch.Tensor)
    if torch.compiler.is_compiling() or not ids.numel():
        return ids, None
    if devices.host_checks(ids.device):
        return check_token_ids(ids, size, name=name, table=table), None
    unknown = (ids < 0) | (ids >= size)
    return ids.clamp(0, size - 1), unknown
