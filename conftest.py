import pytest
import torch

import rotary


@pytest.fixture(autouse=True)
def _doctest_names(doctest_namespace):
    doctest_namespace["torch"] = torch
    doctest_namespace["rotary"] = rotary
    for name in rotary.__all__:
        doctest_namespace[name] = getattr(rotary, name)
