"""Child processes that cannot outlive the harness, started with their libraries already imported.

`start(target, args)` starts target(*args) in a child with this process's environment as it is now.
On Linux the child is forked from a fork server (multiprocessing's "forkserver"): one process,
started with the harness's environment, working directory and standard streams, imports what every
worker imports (parity.execute.preload: numpy, scipy.stats, jax, torch and the worker's own
modules, ~2.5 s) once, and each child is forked from it with nothing else run: every child starts
from the same just-imported state a freshly spawned one reaches after its imports, and no
candidate's code ever runs in the server. The server is kept while what its imports read stays the
same (the environment, less TAKEN_AT_START: variables read where they are used, which each child
takes from its parent as it starts, and less SET_BY_IMPORTS where the parent gained them as the
server's imports set them; the working directory; the standard streams); when that
changes it is replaced, or, while children forked from it are still alive, the child is spawned.
Elsewhere, or with PARITY_WORKER_START=spawn, every child is spawned. `worker_context()` is the
context to start from now (for a pool that starts its own processes: `parity compile`'s).

`die_with_parent()` (run first thing in a child): on Linux the child is sent SIGKILL when the
process that started it dies, SIGKILL included: a spawned child by the kernel (prctl
PR_SET_PDEATHSIG); a child forked by the fork server, whose parent is the server, by a thread that
waits for the harness's end of their pipe to close. The child also ignores SIGINT, so that a Ctrl-C
reaches the parent, which ends its children itself.
`call_in_child(fn, args, timeout_s)` runs fn(*args) in a child and returns ('ok', value),
('timeout', None) or ('died', exit code): for code that may hang or end the process (a user's
candidate module imported for the first time).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import multiprocessing as mp
import os
import signal
import sys
import threading
from multiprocessing import connection

PR_SET_PDEATHSIG = 1
PRELOAD = "parity.execute.preload"
START_ENV = "PARITY_WORKER_START"  # "spawn": never fork workers from a server

# Read where they are used, never as a preloaded module is imported (tests/test_proc.py checks):
# the harness's own per-run settings, pytest's name of the running test, and libtpu's, read when
# libtpu loads. A child takes them from its parent as it starts; a change needs no new server.
TAKEN_AT_START = frozenset(
    {
        "PYTEST_CURRENT_TEST",
        "PARITY_CACHE",
        "PARITY_FRESH",
        "PARITY_TPU_INTERPRET_AS",
        "PARITY_TPU_INTERPRET_AS_SOURCE",
        "PARITY_FLA_LANES",
        "PARITY_FLA_FALLBACK",
        "PARITY_FLA_LANE_KEY",
        "LIBTPU_INIT_ARGS",
        "ALLOW_MULTIPLE_LIBTPU_LOAD",
        "TPU_HOST_BOUNDS",
        "TPU_WORKER_HOSTNAMES",
    }
)

# Set by the server's own imports where unset (jax/__init__: TF_CPP_MIN_LOG_LEVEL; jax, off a TPU:
# TPU_SKIP_MDS_QUERY; libtpu: TPU_LIBRARY_PATH): a parent that gains one of them with the value the
# imports give it, as it imports them itself, still matches a server started without it.
SET_BY_IMPORTS = frozenset({"TF_CPP_MIN_LOG_LEVEL", "TPU_SKIP_MDS_QUERY", "TPU_LIBRARY_PATH"})

_server_key: tuple | None = None  # what the running fork server was started with
_server_unset: frozenset = frozenset()  # the SET_BY_IMPORTS variables it was started without


def die_with_parent() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(1)
    starter = mp.parent_process()
    if starter is not None and starter.pid != os.getppid():  # forked by the fork server
        threading.Thread(target=_die_with, args=(starter.sentinel,), name="die-with-parent", daemon=True).start()


def _die_with(sentinel) -> None:
    """Wait until the process that started this one has closed its end of our pipe (it died, or let
    go of this process), then end this process as the kernel would."""
    connection.wait([sentinel])
    os.kill(os.getpid(), signal.SIGKILL)


def start(target, args: tuple = (), daemon: bool = True):
    """target(*args) started in a child (module docstring), with this process's environment as it
    is now; the multiprocessing Process."""
    p = worker_context().Process(target=_with_environment, args=(taken_at_start(), target, args), daemon=daemon)
    p.start()
    return p


def _with_environment(env: dict, target, args: tuple) -> None:
    take_environment(env)
    target(*args)


def taken_at_start() -> dict[str, str]:
    """This process's TAKEN_AT_START variables, for a child it starts (take_environment)."""
    return {name: os.environ[name] for name in TAKEN_AT_START if name in os.environ}


def take_environment(taken: dict[str, str]) -> None:
    """In a child: its parent's TAKEN_AT_START variables as they were when it started it (unset
    where the parent had none). The rest of the environment is the parent's already, as the fork
    server was started with it, with what the server's imports set themselves (jax sets
    TPU_SKIP_MDS_QUERY off a TPU, libtpu TPU_LIBRARY_PATH), as a spawned child's own imports do."""
    for name in TAKEN_AT_START:
        if name in taken:
            os.environ[name] = taken[name]
        else:
            os.environ.pop(name, None)


def worker_context():
    """The context to start a harness child from now (module docstring); a child started from it
    directly calls take_environment first."""
    global _server_key, _server_unset
    if not sys.platform.startswith("linux") or os.environ.get(START_ENV) == "spawn":
        return mp.get_context("spawn")
    from multiprocessing import context, forkserver

    key = _start_key(_server_unset)
    if key != _server_key:
        if any(isinstance(p, context.ForkServerProcess) for p in mp.active_children()):
            return mp.get_context("spawn")  # stopping the server would wait for them
        forkserver._forkserver._stop()
        forkserver.set_forkserver_preload([PRELOAD])
        _server_unset = SET_BY_IMPORTS - os.environ.keys()
        _server_key = _start_key(_server_unset)
    return mp.get_context("forkserver")


def _set_by_imports() -> dict[str, str]:
    """SET_BY_IMPORTS with the values the imports give them (TPU_LIBRARY_PATH's once this process
    imported libtpu: the path of the libtpu it imported)."""
    values = {"TF_CPP_MIN_LOG_LEVEL": "1", "TPU_SKIP_MDS_QUERY": "1"}
    if "libtpu" in sys.modules:
        values["TPU_LIBRARY_PATH"] = sys.modules["libtpu"].get_library_path()
    return values


def _start_key(unset_at_start: frozenset) -> tuple:
    """What a server's imports read: the environment less TAKEN_AT_START and less the variables,
    unset when the server started, that hold the value its imports gave them; the working
    directory; the standard streams."""
    streams = []
    for fd in (0, 1, 2):
        try:
            st = os.fstat(fd)
            streams.append((st.st_dev, st.st_ino))
        except OSError:
            streams.append(None)
    by_imports = {k: v for k, v in _set_by_imports().items() if k in unset_at_start}
    imports_read = sorted((k, v) for k, v in os.environ.items() if k not in TAKEN_AT_START and by_imports.get(k) != v)
    return tuple(imports_read), os.getcwd(), tuple(streams)


def _child(conn, fn, args) -> None:
    die_with_parent()
    conn.send(fn(*args))


def call_in_child(fn, args: tuple, timeout_s: float) -> tuple[str, object]:
    parent, child = mp.Pipe(duplex=False)
    p = start(_child, (child, fn, args))
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
