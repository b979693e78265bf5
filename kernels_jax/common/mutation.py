"""Named switches for the mutation suite (`parity mutants`), read by kernels at trace time.

A kernel that has a known-bug variant checks `active("name")` while it is traced and, when
the switch is on, builds the buggy variant instead (for example the unmasked exp of seed
000). Every switch is off unless `parity mutants` turns one on, in its own process, through
`enabled(name)`; entering or leaving a switch clears jax's compilation caches so that no
trace of one variant is reused for the other.
"""

from __future__ import annotations

import contextlib

import jax

_active: frozenset[str] = frozenset()


def active(name: str) -> bool:
    """True while the mutation `name` is switched on (read at trace time)."""
    return name in _active


@contextlib.contextmanager
def enabled(*names: str):
    global _active
    prev, _active = _active, frozenset(names)
    jax.clear_caches()
    try:
        yield
    finally:
        _active = prev
        jax.clear_caches()
