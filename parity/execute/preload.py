"""What the fork server imports once for every worker forked from it (parity.execute.proc): the
libraries each worker imports before or in its first case, under the harness's own process set-up
(jax kept on the CPU off a TPU, as a worker does first). Nothing here runs a candidate, initialises
a jax backend, CUDA or libtpu, or imports triton or fla: their kernels (triton.language's own
functions among them) are built as they are imported, for a GPU or for Triton's interpreter, as the
worker decides when it sets TRITON_INTERPRET. A module that fails to import is left for the worker
to meet in its case's timed window, where the failure is recorded."""

import importlib

from parity.model.host import keep_jax_on_the_cpu

MODULES = (
    "numpy",
    "scipy.stats",
    "jax",
    "jax.numpy",
    "jax.experimental.pallas",
    "jax.experimental.pallas.tpu",
    "torch",
    "parity.execute.worker",
)

keep_jax_on_the_cpu()
for _name in MODULES:
    try:
        importlib.import_module(_name)
    except Exception:  # noqa: BLE001, S110 - the worker imports it again and records what fails
        pass
