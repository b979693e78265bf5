"""This checkout's tests: the parity pytest plugin (parity/pytest_plugin/) and pytester.

Installed (pip install -e .), the package's pytest11 entry point, named like the module,
loads the plugin before this file; naming the module here too registers nothing twice.
From a bare checkout (PYTHONPATH only) this line is what loads it.
"""

pytest_plugins = ["parity.pytest_plugin", "pytester"]
