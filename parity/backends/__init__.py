"""Backends: oracle (float64), fla (FLA Triton), pallas (kernels_jax), user candidates."""
