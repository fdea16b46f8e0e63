"""Follow ``position_ids`` from ``RoPE.forward``: which rotary modules it enters, and how often it comes back.

A call counts when a function of a ``rotary`` module is entered with the ids tensor itself, or a
``Positions`` / ``RotaryTables`` / ``Rotation`` (or a list or tuple) holding that very tensor, as an
argument. Prints the functions in call order, the modules entered, and how many times the path
returns to a module it had left (issues 34 and 46 ask for at most 4 modules and at most 1 return): on the
general path (the first call of a signature) and through a recorded plan (later calls).

Run: ``python benchmarks/position_ids_path.py`` (CPU; positions past the cached table and inside it).
"""

from __future__ import annotations

import inspect
import sys

import torch

import rotary
from rotary.kernels.contract import Rotation
from rotary.positions import Positions
from rotary.tables import RotaryTables


def _holds(value: object, ids: torch.Tensor) -> bool:
    if value is ids:
        return True
    if isinstance(value, Positions):
        return value.__dict__.get("ids") is ids or value.__dict__.get("_ids") is ids
    if isinstance(value, RotaryTables):
        return value.rows is ids
    if isinstance(value, Rotation):
        return value.__dict__.get("positions") is ids
    if isinstance(value, (list, tuple)):  # (a function's *args too)
        return any(v is ids for v in value)
    if isinstance(value, dict):  # a function's **kwargs
        return any(v is ids for v in value.values())
    return False


def follow(call, ids: torch.Tensor) -> tuple[list[str], list[str], int]:
    """``(functions in call order, modules entered, returns to a module left)`` of ``call()``."""
    seen: list[tuple[str, str]] = []

    def profile(frame, event, arg):  # noqa: ARG001
        if event != "call":
            return
        module = frame.f_globals.get("__name__", "")
        if not module.startswith("rotary"):
            return
        code = frame.f_code
        count = code.co_argcount + code.co_kwonlyargcount
        count += bool(code.co_flags & inspect.CO_VARARGS) + bool(code.co_flags & inspect.CO_VARKEYWORDS)
        names = code.co_varnames[:count]
        if any(_holds(frame.f_locals.get(n), ids) for n in names):
            seen.append((module, code.co_name))

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    runs: list[str] = []
    for module, _ in seen:
        if not runs or runs[-1] != module:
            runs.append(module)
    modules = list(dict.fromkeys(runs))
    return [f"{m}.{f}" for m, f in seen], modules, len(runs) - len(modules)


def main() -> None:
    rope = rotary.RoPE(64)
    q, k = torch.randn(1, 4, 3, 64), torch.randn(1, 2, 3, 64)
    for label, ids in (("inside the cache", torch.tensor([[5, 6, 7]])), ("past it", torch.tensor([[5, 6, 7000]]))):
        for grad in (False, True):
            qi = q.clone().requires_grad_(grad)
            with rotary.plans.general_path():  # the general path: what the first call of a signature runs
                functions, modules, back = follow(lambda: rope(qi, k, position_ids=ids), ids)  # noqa: B023
            print(f"{label}, {'autograd' if grad else 'no grad'}: {len(modules)} modules, {back} returns")
            print("   ", " -> ".join(functions))
            if not grad:  # a later call with the same signature: its recorded plan (rotary.plans)
                rope(qi, k, position_ids=ids)
                functions, modules, back = follow(lambda: rope(qi, k, position_ids=ids), ids)  # noqa: B023
                print(f"{label}, no grad, a recorded plan: {len(modules)} modules, {back} returns")
                print("   ", " -> ".join(functions))


if __name__ == "__main__":
    main()
