"""Environment variables set for a while: what a run exports for the processes it starts to inherit."""

from __future__ import annotations

import contextlib
import os


@contextlib.contextmanager
def exported(values: dict[str, str]):
    """Within: `values` in os.environ (spawned processes inherit them); every variable as it was after."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
