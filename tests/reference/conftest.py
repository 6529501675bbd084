"""Tests in this folder exercise the reference executor (the oracle), whatever the default executor is."""
import pytest

from pypto_rt import config


@pytest.fixture(autouse=True)
def reference_executor():
    with config.scope(EXECUTOR="reference"):
        yield
