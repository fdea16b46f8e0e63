"""``rotary bench``: how fast RoPE is applied, against Hugging Face and the memory-traffic limit.

Applying RoPE reads q and k and writes them back; nothing else is needed. Two proxies bound what any
implementation can reach on the machine at hand: one in-place pass over q and k (``mul_(1.0)``) and
one out-of-place copy (``clone``). Every method is timed in one process, with the methods of a
group (one shape, one dtype) interleaved repeat after repeat, so that a neighbour's load on a shared
machine hits all of them alike; the median is reported. Ratios are taken within a group.

Adding a case: a *method* is a function ``make(inputs) -> call`` returning the zero-argument
callable to time (see :class:`Inputs`); register it with :func:`register_method`. A whole
different kind of measurement (e.g. a patched vs unpatched model forward) is a *suite*: a function
``suite(options) -> list[Result]`` registered with :func:`register_suite`; it can use
:func:`time_interleaved` and :func:`extra_peak_bytes`. Files defining either are loaded with
``rotary bench --cases FILE.py`` (see ``benchmarks/``); ``with scoped_registrations():`` undoes the
registrations made inside the block.

Built-in suites: ``decode`` (CPU), ``rotate_and_cache`` and ``rmsnorm_rotate`` (:mod:`.fused`: each
fused op against its composition, eager and compiled, and the traffic limit), ``generation``
(:mod:`.generation`: ``Decoder.generate`` against Hugging Face ``generate``, in tokens/s) and
``generation_qk_norm`` (Hugging Face's Qwen3, patched by :func:`rotary.hf.patch` and not); all but the first
run on the CPU and with ``--device cuda``. ``--suites NAME`` runs only the named ones, and ``--shapes
none`` leaves out the RoPE groups.
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
