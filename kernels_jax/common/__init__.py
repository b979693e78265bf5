"""Pieces shared by the kernels_jax ops."""
