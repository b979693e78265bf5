"""Parity tests of the port's stages: one test per stage case of parity_cases.json.

pytest -m interpret   FLA's stage functions and the port's through their CPU interpreters
"""

import pytest


@pytest.mark.interpret
def test_interpret(parity_case, parity_check):
    parity_check(parity_case, "interpret")
