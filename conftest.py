"""Tests and doctests run with strict dtype promotion, so nothing leans on silent promotion."""

import jax

jax.config.update("jax_numpy_dtype_promotion", "strict")
