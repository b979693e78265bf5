"""tests/state_candidates.simple_gla, from a module that sets jax's default matmul precision to
"highest" at import (tests only: tests/test_isolation.py)."""

import jax

jax.config.update("jax_default_matmul_precision", "highest")

from tests.state_candidates import simple_gla  # noqa: E402

__all__ = ["simple_gla"]
