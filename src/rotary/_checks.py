"""Argument validators shared by the package, and their wording: each returns the checked value and raises an
error naming the argument, the value and what is allowed. Types are checked exactly (values from YAML, JSON or
command lines): ``bool`` is never an int, a string never a bool.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any, TypeVar

import torch
import torch.autograd.forward_ad as _fwad

from .errors import InputError, InputTypeError

__all__ = [
    "MAX_HEAD_DIM",
    "check_bool",
    "check_causal_rope",
    "check_choice",
    "check_finite",
    "check_int",
    "check_positive_float",
    "check_positive_int",
    "check_probability",
    "is_int",
    "is_number",
    "is_positive_int",
]

T = TypeVar("T")

#: the widest attention head accepted (real models use 64 to 512 channels): a wider one is a mistake in
#: a config (hidden_size where head_dim was meant), and its frequency tables could not be allocated
MAX_HEAD_DIM = 2**16


def is_int(value: Any) -> bool:
    """``True`` for Python ints and integer NumPy/torch scalars, never for ``bool``."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return type(value).__name__ in (
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
    ) and hasattr(value, "__index__")


def is_positive_int(value: Any) -> bool:
    """An int (as :func:`is_int`) ``> 0``."""
    return is_int(value) and value > 0


def is_number(value: Any) -> bool:
    """A finite real number, not ``bool`` (comparisons, so ``torch.compile(dynamic=True)`` traces it)."""
    return (is_int(value) or isinstance(value, float)) and -math.inf < value < math.inf


def check_int(value: Any, name: str, *, minimum: int | None = None) -> int:
    """An int (not a bool, not a float) ``>= minimum``; returned as a Python int."""
    if not is_int(value):
        bound = "" if minimum is None else f" >= {minimum}"
        raise InputError(f"{name} must be an int{bound}, got {value!r} ({type(value).__name__})")
    value = int(value)
    if minimum is not None and value < minimum:
        raise InputError(f"{name} must be an int >= {minimum}, got {value}")
    return value


def check_positive_int(value: Any, name: str) -> int:
    """An int > 0.

    Example:
        >>> check_positive_int(3, "num_heads")
        3
        >>> check_positive_int(True, "num_heads")
        Traceback (most recent call last):
        ...
        rotary.errors.InputError: num_heads must be a positive int, got True (bool)
    """
    if not is_int(value) or int(value) <= 0:
        raise InputError(f"{name} must be a positive int, got {value!r} ({type(value).__name__})")
    return int(value)


def check_positive_float(value: Any, name: str) -> float:
    """A finite number > 0, returned as a float."""
    if not is_number(value) or value <= 0:
        raise InputError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def check_finite(value: Any, name: str) -> float:
    """A finite number, returned as a float."""
    if not is_number(value):
        raise InputError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def check_probability(value: Any, name: str) -> float:
    """A number in ``[0, 1)`` (dropout rates)."""
    if not is_number(value) or not 0.0 <= value < 1.0:
        raise InputError(f"{name} must be in [0, 1), got {value!r}")
    return float(value)


def check_bool(value: Any, name: str) -> bool:
    """``True`` or ``False`` (also NumPy/torch booleans), never a string (``bool("false")`` is ``True``) or a number.

    Example:
        >>> check_bool(False, "interleaved")
        False
        >>> check_bool("false", "interleaved")
        Traceback (most recent call last):
        ...
        rotary.errors.InputTypeError: interleaved must be True or False, got 'false' (str)
    """
    if isinstance(value, bool) or type(value).__name__ in ("bool_", "bool"):
        return bool(value)
    raise InputTypeError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")


def check_choice(value: T, name: str, choices: Collection[T]) -> T:
    """One of ``choices``."""
    try:
        ok = value in choices
    except TypeError:  # unhashable
        ok = False
    if not ok:
        raise InputError(f"{name} must be one of {', '.join(repr(c) for c in choices)}, got {value!r}")
    return value


def check_causal_rope(rope: Any, causal: bool, layer: str) -> None:
    """Refuse a producer valid only under a causal mask (``requires_causal``: :class:`rotary.XPos`) if not causal."""
    reason = getattr(rope, "requires_causal", None)
    if reason and not causal:
        raise InputError(
            f"{type(rope).__name__} needs causal=True: {reason}. This {layer} has causal=False: set causal=True, "
            "or use a rope without this limit (e.g. rotary.RoPE) for bidirectional attention"
        )


# ------------------------------------------------------------------------------------------------
# torch.func transforms and forward-mode AD: rotary's kernels run on a tensor's primal and would drop what they add

TRANSFORMED = (
    "rotary: {name} is a tensor inside a torch.func transform (vmap, grad, vjp, jacrev, ...), a batched "
    "gradient (is_grads_batched=True) or a dual tensor of forward-mode AD (torch.autograd.forward_ad); rotary's "
    "rotation does not run under them. Call rotary outside the transform, or loop over the batch"
)


def transformed(x: torch.Tensor) -> bool:
    """Whether ``x`` is a torch.func wrapper (``grad``'s wrapped tensors, ``vmap``'s batched ones) or a forward-mode
    dual tensor (``False`` while ``torch.compile`` traces: it sees fake tensors, and cannot trace the check)."""
    if torch.compiler.is_compiling():
        return False
    functorch = torch._C._functorch
    return (
        functorch.is_functorch_wrapped_tensor(x)
        or functorch.is_batchedtensor(x)
        or (_fwad._current_level >= 0 and _fwad.unpack_dual(x).tangent is not None)  # (a dual level is open)
    )


def check_untransformed(x: torch.Tensor, name: str) -> None:
    """The one check that ``x`` is no torch.func wrapper or forward-mode dual tensor (:func:`transformed`): the
    kernels would run on its primal and drop what the transform adds."""
    if transformed(x):
        raise InputTypeError(TRANSFORMED.format(name=name))


def inside_a_transform() -> bool:
    """Whether a forward-AD dual level or a torch.func transform is open (outside them no tensor is dual or wrapped)."""
    return not torch.compiler.is_compiling() and (
        _fwad._current_level >= 0 or torch._C._functorch.peek_interpreter_stack() is not None
    )
