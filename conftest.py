"""This checkout's tests: the parity pytest plugin (parity/pytest_plugin/) and pytester.

Installed (pip install -e .), the package's pytest11 entry point, named like the module,
loads the plugin before this file; naming the module here too registers nothing twice.
From a bare checkout (PYTHONPATH only) this line is what loads it.

Tests compile their jax programs with most of XLA's optimisations off, as TPU interpret mode does
for the harness's own runs (parity.execute.compile_log.optimisation): the kernels the tests call
directly compile in about half the time; TPU compiles keep the compiler's defaults regardless.
Set before jax is imported (jax reads it then); spawned workers inherit it.
"""

import os

os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")

pytest_plugins = ["parity.pytest_plugin", "pytester"]
