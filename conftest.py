"""The pytest plugin: markers, options and hardware skips (logic lives in parity/)."""
from __future__ import annotations

import functools

import pytest

MARKERS = {
    "gpu": "FLA Triton kernels compiled on a CUDA GPU",
    "tpu": "kernels_jax Pallas kernels compiled on a TPU",
    "interpret": "FLA and Pallas kernels through their CPU interpreters (Triton interpreter, TPU interpret mode)",
    "slow": "long-running; excluded from the default unit-test pass",
}


def pytest_configure(config):
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")


@functools.cache
def _cuda_missing() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    return None if torch.cuda.is_available() else "no CUDA GPU visible to torch (gpu tests need FLA compiled on CUDA)"


@functools.cache
def _tpu_missing() -> str | None:
    from kernels_jax.common.platform import on_tpu
    return None if on_tpu() else "no TPU visible to jax (tpu tests need the Pallas kernels compiled by Mosaic)"


def pytest_runtest_setup(item):
    if item.get_closest_marker("gpu") and _cuda_missing():
        pytest.skip(_cuda_missing())
    if item.get_closest_marker("tpu") and _tpu_missing():
        pytest.skip(_tpu_missing())
