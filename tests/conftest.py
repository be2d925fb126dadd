"""Shared test settings: hypothesis profiles sized for CI, and the optional PyTorch peer."""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

# "default" keeps the whole suite within CI's budget on 2 cores; "thorough" is for a long local run:
#   HYPOTHESIS_PROFILE=thorough python -m pytest
settings.register_profile("default", max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(12345)
