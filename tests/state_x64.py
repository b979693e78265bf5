"""tests/state_candidates.simple_gla, from a module that turns on jax's 64-bit types at import
(tests only: tests/test_isolation.py)."""

import jax

jax.config.update("jax_enable_x64", True)

from tests.state_candidates import simple_gla  # noqa: E402

__all__ = ["simple_gla"]
