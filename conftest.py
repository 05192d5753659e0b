"""Tests and doctests run with strict dtype promotion, so nothing leans on silent promotion.

Each test, doctests included, leaves the op registry as it found it: an op registered by
one test is not seen by another (error messages list the registered ops, and
docs/errors.md shows one), whatever the order and the worker that runs them."""

import jax
import pytest

jax.config.update("jax_numpy_dtype_promotion", "strict")


@pytest.fixture(autouse=True)
def _op_registry_restored():
    from mlaxgraph.core import registry

    saved = dict(registry._REGISTRY)
    yield
    registry._REGISTRY.clear()
    registry._REGISTRY.update(saved)
