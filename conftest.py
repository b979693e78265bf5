"""This checkout's tests: the parity pytest plugin (parity/pytest_plugin/) and pytester.

Installed (pip install -e .), the package's pytest11 entry point, named like the module,
loads the plugin before this file; naming the module here too registers nothing twice.
From a bare checkout (PYTHONPATH only) this line is what loads it.

Tests compile their jax programs with most of XLA's optimisations off and XLA:CPU's elemental
emitter, as TPU interpret mode does for the harness's own runs (parity.execute.compile_log): the
kernels the tests call directly compile in about a quarter of the time; TPU compiles keep the
compiler's defaults regardless. The flag is set before jax is imported (jax reads it then; spawned
workers inherit it), the emitter once per test process (`_interpret_effort`), with TPU interpret
mode's callbacks as the harness calls them (parity.execute.interpret_callbacks).

FLA's records and TPU compiles are not reused from the harness's cache (PARITY_FRESH=fla,tpu_compile,
unless set): a test that runs FLA or the compiler checks what they compute now, whatever an earlier
test or run stored (tests/test_reuse.py tests the reuse itself); the oracle's cache stays in use.

Every test function runs with room on CPython's frame stack (parity.execute.stack_room): its
speed does not depend on how deep pytest and xdist call it.
"""

import functools
import os

import pytest

os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
os.environ.setdefault("PARITY_FRESH", "fla,tpu_compile")  # parity.model.environ.FRESH

pytest_plugins = ["parity.pytest_plugin", "pytester"]


@pytest.fixture(scope="session", autouse=True)
def _interpret_effort():
    from parity.execute import compile_log, interpret_callbacks

    compile_log.install()
    interpret_callbacks.install()


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem):
    # late: this file sets jax's flag above before any harness module is imported
    from parity.execute.stack_room import call_with_stack_room

    test = pyfuncitem.obj
    pyfuncitem.obj = functools.partial(call_with_stack_room, test)
    try:
        return (yield)
    finally:
        pyfuncitem.obj = test
