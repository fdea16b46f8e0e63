"""``rotary bench``: how fast RoPE is applied, against Hugging Face and the memory-traffic limit.

Applying RoPE reads q and k and writes them back. Two proxies bound what any implementation can reach on the
machine: one in-place pass over q and k (``mul_(1.0)``) and one copy (``clone``). The methods of a group (one
shape, one dtype) are timed interleaved, repeat after repeat, so a neighbour's load hits all alike; the median
is reported and ratios are taken within a group. How to read the tables: docs/benchmarks.md.

Adding a case: a *method* ``make(inputs) -> call`` (:func:`register_method`), or a *suite*
``suite(options) -> list[Result]`` for another kind of measurement (:func:`register_suite`; it can use
:func:`time_interleaved` and :func:`extra_peak_bytes`), in a file loaded with ``rotary bench --cases FILE.py``.
Built-in suites: ``decode`` (CPU), ``rotate_and_cache`` and ``rmsnorm_rotate`` (:mod:`.fused`), ``generation``
and ``generation_qk_norm`` (:mod:`.generation`); ``--suites NAME`` runs the named ones, ``--shapes none``
leaves out the RoPE groups.
"""

from . import fused as _fused  # noqa: F401  (registers the fused-op suites)
from . import generation as _generation  # noqa: F401  (registers the generation suite)
from . import methods as _methods  # noqa: F401  (registers the built-in methods)
from .harness import (
    DTYPE_NAMES,
    METHODS,
    QUICK_SHAPES,
    SHAPES,
    SUITES,
    Inputs,
    Method,
    Prepared,
    Result,
    Shape,
    allocations,
    extra_peak_bytes,
    head_shape,
    make_inputs,
    register_method,
    register_suite,
    scoped_registrations,
    suite_device,
    suite_repeats,
    time_interleaved,
)
from .runner import run
from .table import format_table

__all__ = [
    "DTYPE_NAMES",
    "Inputs",
    "Method",
    "Prepared",
    "Result",
    "SHAPES",
    "QUICK_SHAPES",
    "Shape",
    "METHODS",
    "SUITES",
    "register_method",
    "register_suite",
    "scoped_registrations",
    "suite_device",
    "suite_repeats",
    "time_interleaved",
    "extra_peak_bytes",
    "allocations",
    "make_inputs",
    "run",
    "format_table",
    "head_shape",
]
