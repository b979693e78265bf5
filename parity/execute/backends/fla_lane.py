"""FLA's lanes: long-lived processes that run FLA's kernels for every worker of a run.

On a machine with CUDA GPUs, `parity run` (and the pytest plugin's controller) starts FLA's lanes
(`--fla-lanes`; default one per GPU) and the workers send their FLA calls there while they run the
oracle and the candidates on the CPU. Each lane imports torch, Triton and FLA once per run and keeps
its loaded kernels for the whole run. Before a lane takes its first call, the run's pre-compile
(parity.execute.backends.fla_compile) has compiled every (kernel, specialisation, config) the run's
cases launch, on every core, into Triton's cache (TRITON_CACHE_DIR, default $PARITY_CACHE/triton; a
user's own wins): a lane loads its kernels and compiles nothing, and no lane waits on another's
compile. Each autotuned kernel runs one config per key, chosen without timing
(parity.execute.backends.fla_configs); one lane per GPU is then enough: a case's FLA call is its
kernels (milliseconds) and their inputs' transfer, far less than what a worker spends on the case's
oracle and candidates. With --fla-autotune Triton times every config, as production FLA does: a lane
timing configs holds the GPU's lock file exclusive, every other FLA call holds it shared
(fla_launches.sharing_the_gpu, gpu_to_itself), so with several lanes on a GPU no other kernel runs
while configs are timed.

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
import dataclasses
import multiprocessing as mp
import os
import secrets
import tempfile
import threading
import time
import traceback
from multiprocessing.connection import Listener
from pathlib import Path

from cases import Case
from parity.execute.backends import fla_compile, fla_launches, triton_interpreter
from parity.execute.backends.fla import FlaBackend
from parity.execute.backends.fla_compile import triton_cache_env
from parity.execute.backends.fla_lane_client import FALLBACK_ENV, KEY_ENV, LANES_ENV, forget_connections
from parity.execute.proc import die_with_parent
from parity.model import environ
from parity.model.host import cuda_devices, keep_jax_on_the_cpu
from parity.model.spec import Unsupported


# ------------------------------------------------------------------ the lane process
def lane_main(address: str, key_hex: str, device: str, gpu_lock: str | None, compiled: str | None) -> None:
    """Serve FLA calls at `address` until the parent goes: device "cuda:<i>" (that GPU alone; gpu_lock:
    its lock file, fla_launches.sharing_the_gpu) or "cpu" (the Triton interpreter; GPUs hidden).
    compiled: a file that exists once the run's pre-compile has ended; the lane takes no call before.
    Nothing imported here imports torch or fla: CUDA_VISIBLE_DEVICES is set first."""
    die_with_parent()
    os.environ["CUDA_VISIBLE_DEVICES"] = device.split(":")[1] if device.startswith("cuda:") else ""
    if gpu_lock:
        os.environ[fla_launches.GPU_LOCK_ENV] = gpu_lock
    keep_jax_on_the_cpu()
    triton_cache_env(os.environ)
    if device == "cpu":
        triton_interpreter.request()
    else:
        import fla  # noqa: F401 - torch, Triton and FLA imported while the pre-compile runs

    backend, gpu = FlaBackend(), threading.Lock()
    listener = Listener(address, family="AF_UNIX", authkey=bytes.fromhex(key_hex))
    while True:
        conn = listener.accept()
        threading.Thread(target=_serve, args=(conn, backend, gpu, device, compiled), daemon=True).start()


def _serve(conn, backend, gpu: threading.Lock, device: str, compiled: str | None) -> None:
    """Answer one worker's calls, one FLA call on the device at a time, once the pre-compile has ended."""
    while True:
        try:
            case_dict, inputs = conn.recv()
        except (EOFError, OSError):
            return
        while compiled and not os.path.exists(compiled):
            time.sleep(0.05)
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


# ------------------------------------------------------------------ the parent's side
@dataclasses.dataclass
class Lanes:
    """A run's FLA lanes: their devices ([]: none) and the pre-compile they waited for (None: none)."""

    devices: list[str]
    precompile: Precompile | None = None


class Precompile(threading.Thread):
    """The run's pre-compile (fla_compile.precompile), in a thread of the parent while the lanes
    import FLA; `ready` is made when it ends, however it ends (the lanes wait for it)."""

    def __init__(self, cases: list[Case], ready: str):
        super().__init__(name="fla-precompile", daemon=True)
        self.cases, self.ready = cases, ready
        self.report: fla_compile.Report | None = None
        self.error: str | None = None
        self.pool = None

    def run(self) -> None:
        try:
            self.report = fla_compile.precompile(self.cases, on_pool=lambda pool: setattr(self, "pool", pool))
        except BaseException as e:  # noqa: BLE001 - the lanes compile what they launch, as without it
            self.error = f"{type(e).__name__}: {e}"
        finally:
            Path(self.ready).touch()

    def cancel(self) -> None:
        """End the pool's processes (the run ends before the pre-compile did)."""
        fla_compile.kill(self.pool)

    def summary(self) -> dict:
        """What it did (fla_compile.Report.to_dict), or why it did not."""
        self.join(1.0)
        if self.report is not None:
            return self.report.to_dict()
        return {"error": self.error or "still running when the run ended"}


@contextlib.contextmanager
def started(uses_fla: bool, lanes: int | None, fallback: bool, cases: list[Case] = ()):
    """Within: FLA's lanes running, their addresses in the environment the workers inherit; gives a
    Lanes. lanes: how many (None: one per CUDA GPU on a host with them, none on a host without one,
    where N lanes run FLA in the interpreter). On CUDA the run's `cases` are pre-compiled while the
    lanes start (Precompile), and no lane takes a call before that ends. fallback: an interpreter
    lane as well, for what CUDA refuses (only beside CUDA lanes)."""
    gpus = cuda_devices()
    n = gpus if lanes is None else lanes
    if not uses_fla or n == 0:
        yield Lanes([])
        return
    ctx = mp.get_context("spawn")
    key = secrets.token_bytes(16)
    with tempfile.TemporaryDirectory(prefix="parity-fla-") as tmp:
        devices = [f"cuda:{i % gpus}" if gpus else "cpu" for i in range(n)]
        if fallback and gpus:
            devices.append("cpu")
        precompile = Precompile(list(cases), os.path.join(tmp, "compiled")) if gpus and cases else None
        addresses = [os.path.join(tmp, f"lane{i}") for i in range(len(devices))]
        procs = []
        for address, device in zip(addresses, devices):
            lock = os.path.join(tmp, device.replace(":", "") + ".lock") if device != "cpu" else None
            compiled = precompile.ready if precompile is not None and device != "cpu" else None
            p = ctx.Process(target=lane_main, args=(address, key.hex(), device, lock, compiled), daemon=True)
            p.start()
            procs.append(p)
        if precompile is not None:
            precompile.start()
        values = {
            LANES_ENV: ";".join(addresses[:n]),
            KEY_ENV: key.hex(),
            FALLBACK_ENV: addresses[n] if len(addresses) > n else "",
        }
        try:
            with environ.exported(values):
                yield Lanes(devices, precompile)
        finally:
            if precompile is not None and precompile.is_alive():
                precompile.cancel()
            for p in procs:
                p.kill()
                p.join(5)
            forget_connections()
