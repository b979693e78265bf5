"""Child processes that cannot outlive the harness, and a call run in one.

`die_with_parent()` (run first thing in a child): on Linux the kernel sends the child
SIGKILL when its parent dies, SIGKILL included (prctl PR_SET_PDEATHSIG); the child also
ignores SIGINT, so that a Ctrl-C reaches the parent, which ends its children itself.
`call_in_child(fn, args, timeout_s)` runs fn(*args) in a spawned child and returns
('ok', value), ('timeout', None) or ('died', exit code): for code that may hang or end
the process (a user's candidate module imported for the first time).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import multiprocessing as mp
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() == 1:  # the parent died before prctl took effect
            os._exit(1)


def _child(conn, fn, args) -> None:
    die_with_parent()
    conn.send(fn(*args))


def call_in_child(fn, args: tuple, timeout_s: float) -> tuple[str, object]:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_child, args=(child, fn, args), daemon=True)
    p.start()
    child.close()
    try:
        if parent.poll(timeout_s):
            try:
                return "ok", parent.recv()
            except (EOFError, OSError):
                pass
            p.join(5)
            return "died", p.exitcode
        return ("timeout", None) if p.is_alive() else ("died", p.exitcode)
    finally:
        if p.is_alive():
            p.kill()
        p.join(5)
        parent.close()
