"""Shared fixtures and hypothesis settings for the test suite."""

import os

import pytest
import torch
from hypothesis import HealthCheck, settings

settings.register_profile(
    "rotary", max_examples=int(os.environ.get("ROTARY_HYPOTHESIS_EXAMPLES", "40")), deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("rotary")


@pytest.fixture
def gen() -> torch.Generator:
    """A seeded generator: tests draw their tensors from it so failures reproduce."""
    return torch.Generator().manual_seed(1234)
