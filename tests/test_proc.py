"""parity.execute.proc: workers forked from a server that imported their libraries start as a
spawned worker would: with the parent's environment and directory, each from a clean state (nothing
one worker did is seen by the next), and spawned where the server cannot serve them as they are."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from parity.execute import proc

ROOT = Path(__file__).resolve().parents[1]


def _look(_):
    """What this child sees, and a mark left on a preloaded module for the next child to find."""
    import numpy

    seen = getattr(numpy, "_parity_test_mark", None)
    numpy._parity_test_mark = os.getpid()
    os.environ["PARITY_TEST_LEFT_BY_A_CHILD"] = "1"
    return dict(
        ppid=os.getppid(),
        mark=seen,
        env=os.environ.get("PARITY_TEST_PROC"),
        fresh=os.environ.get("PARITY_FRESH"),
        cwd=os.getcwd(),
        preloaded=sorted(m for m in ("jax", "torch", "scipy.stats", "parity.execute.worker") if m in sys.modules),
    )


def _sleep(seconds):
    time.sleep(seconds)


def _look_in_child():
    status, value = proc.call_in_child(_look, (None,), 120)
    assert status == "ok", (status, value)
    return value


def test_workers_are_forked_from_one_server_with_their_libraries_and_nothing_of_each_other(monkeypatch):
    monkeypatch.delenv(proc.START_ENV, raising=False)
    a, b = _look_in_child(), _look_in_child()
    assert a["ppid"] == b["ppid"] != os.getpid()  # the same server, not this process
    assert a["preloaded"] == b["preloaded"] == ["jax", "parity.execute.worker", "scipy.stats", "torch"]
    assert a["mark"] is None and b["mark"] is None  # the first child's module state died with it
    assert "PARITY_TEST_LEFT_BY_A_CHILD" not in os.environ


def test_a_new_environment_or_directory_gets_a_new_server(monkeypatch, tmp_path):
    monkeypatch.delenv(proc.START_ENV, raising=False)
    monkeypatch.setenv("PARITY_FRESH", "oracle")
    first = _look_in_child()
    monkeypatch.setenv("PARITY_FRESH", "fla")  # taken at start: the same server, the new value
    again = _look_in_child()
    assert (again["ppid"], first["fresh"], again["fresh"]) == (first["ppid"], "oracle", "fla")
    monkeypatch.setenv("PARITY_TEST_PROC", "changed")
    second = _look_in_child()
    monkeypatch.chdir(tmp_path)
    third = _look_in_child()
    assert first["env"] is None and second["env"] == third["env"] == "changed"
    assert third["cwd"] == str(tmp_path)
    assert len({first["ppid"], second["ppid"], third["ppid"], os.getpid()}) == 4


def test_while_a_forked_worker_lives_a_new_environment_is_spawned_and_on_request_always(monkeypatch):
    monkeypatch.delenv(proc.START_ENV, raising=False)
    ctx = proc.worker_context()
    busy = ctx.Process(target=_sleep, args=(60,), daemon=True)
    busy.start()
    try:
        monkeypatch.setenv("PARITY_TEST_PROC", "while-busy")
        seen = _look_in_child()
        assert seen["ppid"] == os.getpid() and seen["env"] == "while-busy"  # spawned: the server stays
        assert busy.is_alive()
    finally:
        busy.kill()
        busy.join(10)
    monkeypatch.setenv(proc.START_ENV, "spawn")
    assert _look_in_child()["ppid"] == os.getpid()


SPY = """
import json, os, sys
read = set()
for name in ("__getitem__", "__contains__"):
    method = getattr(os._Environ, name)
    setattr(os._Environ, name, lambda self, key, _m=method: read.add(key) or _m(self, key))
import parity.execute.preload
print(json.dumps(sorted(read)))
"""


def test_no_preloaded_module_reads_a_variable_taken_at_start_as_it_is_imported():
    """What the server imports must not depend on what a child takes from its parent later."""
    out = subprocess.run([sys.executable, "-c", SPY], capture_output=True, text=True, timeout=300, check=True)
    read = set(json.loads(out.stdout.splitlines()[-1]))
    assert "JAX_PLATFORMS" in read  # the spy sees what jax reads as it is imported
    assert not read & proc.TAKEN_AT_START


COMMAND_IMPORTING_JAX_LATE = """
import json, os
from parity.execute import proc
from tests import test_proc
for name in proc.SET_BY_IMPORTS:
    os.environ.pop(name, None)
before = proc.call_in_child(test_proc._environment, (None,), 120)[1]
import jax, libtpu  # the command's own imports set what the server's set
after = proc.call_in_child(test_proc._environment, (None,), 120)[1]
parent = dict(os.environ)
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
changed = proc.call_in_child(test_proc._environment, (None,), 120)[1]
print(json.dumps([before, after, changed, parent]))
"""


def _environment(_):
    return os.getppid(), dict(os.environ)


def test_a_command_importing_jax_after_its_first_child_keeps_its_server():
    """jax and libtpu set variables as they are imported, in the server and later in the command:
    the same server serves the command's later children (its preload paid once per command), and
    it set exactly those variables, to the values the command gains (so its children see the
    environment a spawned child would); a value changed after that gets a new server."""
    out = subprocess.run(
        [sys.executable, "-c", COMMAND_IMPORTING_JAX_LATE], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    (ppid, seen), (ppid_after, _), (ppid_changed, seen_changed), parent = json.loads(out.stdout.splitlines()[-1])
    assert ppid == ppid_after != ppid_changed, out.stderr[-2000:]
    differs = {k for k in seen.keys() | parent.keys() if seen.get(k) != parent.get(k)} - proc.TAKEN_AT_START
    assert differs == set(), differs  # the server's imports set what the command's did, no more
    assert proc.SET_BY_IMPORTS <= seen.keys()
    assert seen_changed["TF_CPP_MIN_LOG_LEVEL"] == "3"


def _tpu_device_in(_):
    # late: the TPU compiler's set-up is what this child checks
    from parity.execute import tpu_compile

    return str(tpu_compile.device("v5e"))


COMMAND_WITHOUT_JAX = """
import sys
from parity.execute import proc
from tests import test_proc
assert "jax" not in sys.modules
print(proc.call_in_child(test_proc._tpu_device_in, (None,), 90))
"""


def test_a_child_of_a_command_that_never_imported_jax_reaches_libtpu_at_once():
    """The server's imports set what libtpu needs off a TPU (jax: TPU_SKIP_MDS_QUERY); a child
    keeps it although its parent, which never imported jax, has none (else libtpu queries the cloud's
    metadata server, 30 tries per variable: minutes)."""
    out = subprocess.run(
        [sys.executable, "-c", COMMAND_WITHOUT_JAX], capture_output=True, text=True, timeout=150, cwd=ROOT
    )
    assert out.stdout.strip().startswith("('ok', 'TPU_0"), out.stdout + out.stderr[-2000:]
