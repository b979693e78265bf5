"""Parity tests of ejkernel's Pallas TPU gated delta rule: one test per case of parity_cases.json and marker.

pytest -m interpret   FLA and the candidates through their CPU interpreters (any machine)
pytest -m gpu         FLA compiled on CUDA: the reference side (skips without a GPU)
pytest -m tpu         the candidates compiled on a TPU (skips without a TPU)
"""

import pytest


@pytest.mark.interpret
def test_interpret(parity_case, parity_check):
    parity_check(parity_case, "interpret")


@pytest.mark.gpu
def test_gpu(parity_case, parity_check):
    parity_check(parity_case, "gpu")


@pytest.mark.tpu
def test_tpu(parity_case, parity_check):
    parity_check(parity_case, "tpu")
