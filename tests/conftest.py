"""Shared fixtures and hypothesis settings for the test suite."""

import os

import pytest
import torch

import inductor_paths

# `make test` runs two xdist workers on a 2-core machine: each worker's torch would use as many intra-op
# threads as there are cores (OpenMP threads that spin while they wait), two workers four threads on two
# cores. Under xdist: one intra-op thread per worker, and OMP_NUM_THREADS=1 for the subprocesses they start
# (torch, NumPy and Triton's interpreter read it when they load; this process imported torch already).
# Measured on a slice of 13 files (2026-11-29, in the history of docs/testing.md): about a third less wall
# time and CPU at low load, more under load. A test about threads sets its own count (the one_intraop_thread
# fixture; bench's --threads); a run without xdist keeps torch's default.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)


# Inductor's C++ kernels compiled by another checkout are found from this one (tests/inductor_paths.py)
inductor_paths.one_torch_path_for_every_checkout()

try:
    from hypothesis import HealthCheck, settings
except ImportError:  # a machine without the [dev] extra (benchmarks/gpu_check.sh on a GPU machine): the
    settings = None  # test files that use hypothesis fail to import there, the others (e.g. -m cuda) run

# `make test` (profile "rotary") draws the same examples on every run: CI and main stay reproducible
# instead of each run finding, or not, a different rare failure. `make fuzz` (profile "explore")
# draws new examples every run, more of them, to look for failures nobody has found yet; each one
# found is fixed and then kept as an explicit test or @example.
if settings is not None:
    settings.register_profile(
        "rotary",
        max_examples=int(os.environ.get("ROTARY_HYPOTHESIS_EXAMPLES", "40")),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
        derandomize=True,
        database=None,
    )
    settings.register_profile(
        "explore",
        max_examples=int(os.environ.get("ROTARY_HYPOTHESIS_EXAMPLES", "200")),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
        derandomize=False,
        print_blob=True,
    )
    settings.load_profile(os.environ.get("ROTARY_HYPOTHESIS_PROFILE", "rotary"))


@pytest.fixture
def gen() -> torch.Generator:
    """A seeded generator: tests draw their tensors from it so failures reproduce."""
    return torch.Generator().manual_seed(1234)


def pytest_collection_modifyitems(config, items):
    """Tests marked ``cuda`` need a CUDA GPU: skipped, with the reason, where torch sees none."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


@pytest.fixture
def one_intraop_thread():
    """The Python threads, not intra-op parallelism, are what is tested; restore the setting after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def rotate_calls(monkeypatch):
    """Counts the tensors rotary rotates: through its backend dispatcher, through a recorded plan
    (``rotary.rotation.run_plan``, the compiled kernel's ``rope_layout``), or normalised and rotated by
    ``rotary.rmsnorm_rotate`` (QK-norm families; its general path or a recorded plan, ``rmsnorm_rope_layout``)."""
    import rotary.kernels.dispatch as dispatch
    import rotary.kernels.norm as norm
    import rotary.qk_norm as qk_norm
    import rotary.rotation as apply

    calls = []
    real, real_plan, real_norm = dispatch.rotate, apply.run_plan, norm.apply

    def counting_norm(rotation, *args, **kwargs):
        calls.extend(x.shape for x in rotation.xs)
        return real_norm(rotation, *args, **kwargs)

    def counting(rotation, *args, **kwargs):
        calls.extend(x.shape for x in rotation.xs)
        return real(rotation, *args, **kwargs)

    def counting_plan(plan, xs, *args):
        outs = real_plan(plan, xs, *args)
        if outs:  # (empty: the call's signature is not the plan's, and the general path runs)
            calls.extend(x.shape for x in xs)
        return outs

    def counting_norm_plan(plan, q, k, *args):  # a recorded rmsnorm_rotate plan's call (rotary.qk_norm)
        outs = real_norm_plan(plan, q, k, *args)
        if outs:
            calls.extend((q.shape, k.shape))
        return outs

    real_norm_plan = qk_norm._run_plan
    monkeypatch.setattr(dispatch, "rotate", counting)
    monkeypatch.setattr(apply, "run_plan", counting_plan)
    monkeypatch.setattr(norm, "apply", counting_norm)
    monkeypatch.setattr(qk_norm, "_run_plan", counting_norm_plan)
    return calls


@pytest.fixture
def figures_drawn_once():
    """``rotary.tools.plots.plot_*`` draw each distinct figure once per test process (``helpers.FIGURES``): a
    test that asks for a figure drawn before gets its bytes written again through rotary's ``save``. For tests
    that run plotting commands; the first test to ask for a figure draws it and checks what it checks."""
    from helpers import FIGURES

    with FIGURES.active():
        yield FIGURES
