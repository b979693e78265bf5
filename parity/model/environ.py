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


# "1": every cache lookup misses (oracle, fla, tpu_compile; `parity run --fresh`); or the caches to
# ignore, comma-separated (this checkout's tests ignore fla and tpu_compile: conftest.py)
FRESH = "PARITY_FRESH"
# FLA's kernel configs (`parity run --fla-configs`): a JSON file of configs to pin, or a directory of
# FLA config tables (parity.execute.backends.fla_configs)
FLA_CONFIGS = "PARITY_FLA_CONFIGS"
# "1": FLA's autotuned kernels are tuned by Triton's autotuner, as production FLA does (`--fla-autotune`)
FLA_AUTOTUNE = "PARITY_FLA_AUTOTUNE"


def fresh(kind: str) -> bool:
    """Whether this process was asked to ignore the harness's cache `kind` (PARITY_FRESH)."""
    value = os.environ.get(FRESH, "")
    return value == "1" or kind in value.split(",")


def fresh_also(kind: str) -> dict[str, str]:
    """PARITY_FRESH's value that ignores the cache `kind` as well as what it ignores now, for
    `exported`."""
    value = os.environ.get(FRESH, "")
    return {FRESH: value if value == "1" or kind in value.split(",") else ",".join(filter(None, (value, kind)))}
