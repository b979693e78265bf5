"""Run a command with a signal sent to its own process as one of its phases begins:

    python -m tests.signal_at SIGNAL MODULE:ATTR [parity|pytest] ARGS...

MODULE:ATTR names the function (or method, Class.method) that starts the phase, where the command
looks it up; the first time it is called, the process sends itself SIGNAL, which Python handles at
once, in that call. Then `parity ARGS` (parity.cli.main) or `pytest ARGS` (pytest.main) runs, and
its exit status is this process's."""

import functools
import importlib
import os
import signal
import sys


def signal_at(sig: int, target: str) -> None:
    module, attr = target.split(":")
    owner = importlib.import_module(module)
    *path, name = attr.split(".")
    for part in path:
        owner = getattr(owner, part)
    original = getattr(owner, name)
    sent = []

    @functools.wraps(original)
    def at_phase(*args, **kwargs):
        if not sent:
            sent.append(True)
            os.kill(os.getpid(), sig)
        return original(*args, **kwargs)

    setattr(owner, name, at_phase)


if __name__ == "__main__":
    sig, target, command, *args = sys.argv[1:]
    signal_at(getattr(signal, sig), target)
    if command == "parity":
        from parity.cli import main

        sys.exit(main(args))
    import pytest

    sys.exit(pytest.main(args))
