"""FLA's lanes: long-lived processes that run FLA's kernels for every worker of a run.

On a machine with CUDA GPUs, `parity run` (and the pytest plugin's controller) starts FLA's lanes
(`--fla-lanes`; default one per worker, at least one per GPU, spread over the GPUs) and the workers
send their FLA calls there while they run the oracle and the candidates on the CPU. A lane keeps
its compiled kernels and autotune results for the whole run; Triton's persist in the harness's
cache (TRITON_CACHE_DIR, default $PARITY_CACHE/triton, with TRITON_CACHE_AUTOTUNING=1; a user's
own TRITON_CACHE_DIR wins), so each kernel is compiled and tuned once per machine, a second run
reuses them and runs the same configs. The lanes of one GPU compile side by side but time their
autotuning with the GPU to themselves: every FLA call holds the GPU's lock file shared, and an
autotuner timing configs holds it exclusive (fla_launches.sharing_the_gpu, gpu_to_itself).

On a CPU the lane is the same process running FLA in Triton's interpreter (GPUs hidden from it):
`--fla-lanes N` starts N of them; by default FLA runs in the workers themselves there, which
computes the same (the interpreter has nothing to compile or tune) without a process more per
worker. Where CUDA refuses a case for a known reason of its environment (parity.model.fla_known:
FLA's #640 guard on Hopper with Triton < 3.7.1), `--fla-fallback interpreter` sends the case to
an interpreter lane on the same machine, and the record says so (notes.fallback).

Protocol (the workers' side: fla_lane_client): a worker connects (multiprocessing.connection over
a Unix socket, with the run's authkey) and sends (case dict, inputs); the lane answers ("ok",
Execution) or ("raised", kind, message, record fields): kind "unsupported" or "error", raised again
in the worker (LaneError).
"""

from __future__ import annotations

import contextlib
import glob
import multiprocessing as mp
import os
import secrets
import tempfile
import threading
import traceback
from multiprocessing.connection import Listener
from pathlib import Path

from cases import Case
from parity.execute.backends import fla_launches, triton_interpreter
from parity.execute.backends.fla import FlaBackend
from parity.execute.backends.fla_lane_client import FALLBACK_ENV, KEY_ENV, LANES_ENV, forget_connections
from parity.execute.proc import die_with_parent
from parity.model import environ
from parity.model.host import keep_jax_on_the_cpu
from parity.model.spec import Unsupported


# ------------------------------------------------------------------ the lane process
def lane_main(address: str, key_hex: str, device: str, gpu_lock: str | None) -> None:
    """Serve FLA calls at `address` until the parent goes: device "cuda:<i>" (that GPU alone; gpu_lock:
    its lock file, fla_launches.sharing_the_gpu) or "cpu" (the Triton interpreter; GPUs hidden).
    Nothing imported here imports torch or fla: CUDA_VISIBLE_DEVICES is set first."""
    die_with_parent()
    os.environ["CUDA_VISIBLE_DEVICES"] = device.split(":")[1] if device.startswith("cuda:") else ""
    if gpu_lock:
        os.environ[fla_launches.GPU_LOCK_ENV] = gpu_lock
    keep_jax_on_the_cpu()
    persist_autotuning(os.environ)
    if device == "cpu":
        triton_interpreter.request()
    backend, gpu = FlaBackend(), threading.Lock()
    listener = Listener(address, family="AF_UNIX", authkey=bytes.fromhex(key_hex))
    while True:
        conn = listener.accept()
        threading.Thread(target=_serve, args=(conn, backend, gpu, device), daemon=True).start()


def _serve(conn, backend, gpu: threading.Lock, device: str) -> None:
    """Answer one worker's calls, one FLA call on the device at a time."""
    while True:
        try:
            case_dict, inputs = conn.recv()
        except (EOFError, OSError):
            return
        with gpu, fla_launches.sharing_the_gpu():
            try:
                ex = backend.run_here(Case.from_dict(case_dict), inputs)
                ex.notes["fla_lane"] = f"ran in this run's FLA lane for {device} (process {os.getpid()})"
                reply = ("ok", ex)
            except Unsupported as e:
                reply = ("raised", "unsupported", str(e), {})
            except Exception as e:  # noqa: BLE001 - the worker records it
                tb = traceback.format_exc(limit=-6)
                reply = ("raised", "error", f"{type(e).__name__}: {e}\n{tb}", getattr(e, "record_fields", {}))
        try:
            conn.send(reply)
        except (EOFError, OSError):  # the worker was killed (its timeout): the next one connects anew
            return


def persist_autotuning(env) -> None:
    """Triton's autotune results kept in the harness's cache: TRITON_CACHE_DIR (a user's own wins)
    and TRITON_CACHE_AUTOTUNING=1."""
    root = env.get("PARITY_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "parity")
    env.setdefault("TRITON_CACHE_DIR", str(Path(root) / "triton"))
    env.setdefault("TRITON_CACHE_AUTOTUNING", "1")


# ------------------------------------------------------------------ the parent's side
def cuda_devices() -> int:
    """The CUDA GPUs this host shows (/dev/nvidia<N>, within CUDA_VISIBLE_DEVICES), without importing torch."""
    found = len(glob.glob("/dev/nvidia[0-9]*"))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return found
    return min(found, len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"]))


@contextlib.contextmanager
def started(uses_fla: bool, lanes: int | None, fallback: bool, jobs: int = 1):
    """Within: FLA's lanes running, their addresses in the environment the workers inherit. lanes:
    how many (None: on a host with CUDA GPUs one per worker, `jobs`, and at least one per GPU,
    spread over the GPUs; none on a host without one, where N lanes run FLA in the interpreter).
    Lanes on one GPU compile side by side and time their autotuning alone (fla_launches.gpu_to_itself).
    fallback: an interpreter lane as well, for what CUDA refuses (only beside CUDA lanes). Gives the
    lanes' devices."""
    gpus = cuda_devices()
    n = max(gpus, min(jobs, os.cpu_count() or 1)) if lanes is None and gpus else (lanes or 0)
    if not uses_fla or n == 0:
        yield []
        return
    ctx = mp.get_context("spawn")
    key = secrets.token_bytes(16)
    with tempfile.TemporaryDirectory(prefix="parity-fla-") as tmp:
        devices = [f"cuda:{i % gpus}" if gpus else "cpu" for i in range(n)]
        if fallback and gpus:
            devices.append("cpu")
        addresses = [os.path.join(tmp, f"lane{i}") for i in range(len(devices))]
        procs = []
        for address, device in zip(addresses, devices):
            lock = os.path.join(tmp, device.replace(":", "") + ".lock") if device != "cpu" else None
            p = ctx.Process(target=lane_main, args=(address, key.hex(), device, lock), daemon=True)
            p.start()
            procs.append(p)
        values = {
            LANES_ENV: ";".join(addresses[:n]),
            KEY_ENV: key.hex(),
            FALLBACK_ENV: addresses[n] if len(addresses) > n else "",
        }
        try:
            with environ.exported(values):
                yield devices
        finally:
            for p in procs:
                p.kill()
                p.join(5)
            forget_connections()
