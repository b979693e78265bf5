"""Registry-driven parity tests: one test per case of --parity-suite (or --parity-cases), per marker.

    pytest -m interpret --parity-suite smoke   FLA and Pallas through their CPU interpreters
    pytest -m gpu --parity-suite ci            FLA compiled on CUDA (skips without a GPU)
    pytest -m tpu --parity-suite ci            Pallas compiled on TPU (skips without a TPU)
Records go to --parity-report-dir; the gate runs over them at session end (parity/pytest_plugin/).
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
