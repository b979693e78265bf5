"""SIGTERM as Ctrl-C: an interrupt, never an internal error.

Python raises KeyboardInterrupt in the main thread at SIGINT; SIGTERM (what `timeout`, a CI runner
or a batch system sends) would end the process without a word. Within `terminated_as_interrupt()`
it raises `Terminated`, a KeyboardInterrupt, so that every phase of a command (starting FLA's lanes
and the pre-compile, draining the workers, closing the progress line, judging, writing the page)
ends the same way for both signals: what handles KeyboardInterrupt handles both, and no
`except Exception` on the way catches either. The exit status is 128 + the signal's number.
"""

from __future__ import annotations

import contextlib
import signal
import threading


class Terminated(KeyboardInterrupt):
    """SIGTERM reached the process (raised in its main thread). Its text names KeyboardInterrupt, so
    that pytest reports it as it reports Ctrl-C (one line, not a traceback)."""

    def __init__(self):
        super().__init__("SIGTERM, raised as a KeyboardInterrupt")


def signal_name(e: KeyboardInterrupt) -> str:
    """Which signal raised `e`: SIGTERM (Terminated), else SIGINT."""
    return "SIGTERM" if isinstance(e, Terminated) else "SIGINT"


def signal_of(e: BaseException) -> str | None:
    """SIGTERM or SIGINT where a signal raised `e`; None for an interrupt of another kind (a
    KeyboardInterrupt subclass a library raises itself: pytest-xdist's stop at --maxfail)."""
    if isinstance(e, Terminated):
        return "SIGTERM"
    return "SIGINT" if type(e) is KeyboardInterrupt else None


def exit_status(name: str) -> int:
    """128 + the signal's number: 130 for SIGINT, 143 for SIGTERM."""
    return 128 + (signal.SIGTERM if name == "SIGTERM" else signal.SIGINT)


def _raise_terminated(signum, frame):
    raise Terminated()


@contextlib.contextmanager
def terminated_as_interrupt():
    """Within (in the main thread; elsewhere it does nothing): SIGTERM raises Terminated."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


@contextlib.contextmanager
def deferred():
    """Within (in the main thread): SIGINT and SIGTERM wait, and are raised on leaving as if they came
    then (cleaning up after a run is not cut short by them)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    old = {s: signal.signal(s, lambda signum, frame: got.append(signum)) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        if got:
            raise Terminated() if got[0] == signal.SIGTERM else KeyboardInterrupt()
