"""The `oracle` backend: references/ in float64 on CPU, cached on disk.

Cache key: case id + input sha256 + ORACLE_VERSION, so a cache directory copied to
another machine is reused there exactly when the inputs and the oracle are the same.
Location: $PARITY_CACHE/oracle, default ~/.cache/parity/oracle.

Each entry is verified on load (parity.execute.verified_cache): the archive holds, beside the
tensors, the sha256 of their names, dtypes, shapes and bytes (CONTENT_KEY) and the cache key it
was written under. A truncated, bit-flipped or edited entry, or one without the hash, is
recomputed and replaced, with a warning. Writers write a file of their own (unique temporary
name) and rename it into place, so concurrent writers of one entry cannot corrupt it: the last
rename wins and every candidate is a complete file. PARITY_FRESH=1 (--fresh) recomputes.
"""

from __future__ import annotations

import hashlib
import platform
import time
from pathlib import Path

import numpy as np

from cases import Case, input_hash
from parity.execute import verified_cache
from parity.execute.backends.base import Execution
from parity.execute.verified_cache import CONTENT_KEY, KEY_KEY  # noqa: F401 - the entry's fields, for tests
from references import ORACLE_VERSION, error_scales, oracle_run


def cache_dir() -> Path:
    return verified_cache.cache_dir("oracle")


class OracleCacheWarning(verified_cache.CacheWarning):
    """A damaged oracle cache entry was recomputed."""


def _key(case: Case, inputs: dict[str, np.ndarray]) -> str:
    return hashlib.sha256(f"{case.id}|{input_hash(inputs)}|oracle-v{ORACLE_VERSION}".encode()).hexdigest()[:32]


def cache_path(case: Case, inputs: dict[str, np.ndarray]) -> Path:
    return cache_dir() / f"{_key(case, inputs)}.npz"


def cached_oracle(case: Case, inputs: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], bool, float]:
    """(tensors, cache_hit, seconds spent computing or loading)."""
    key = _key(case, inputs)
    path = cache_dir() / f"{key}.npz"
    t0 = time.perf_counter()
    entry = verified_cache.lookup(path, key, f"oracle cache entry {path} for {case.id}", OracleCacheWarning)
    if entry is not None:
        return entry.arrays, True, time.perf_counter() - t0
    out = oracle_run(case, inputs)
    verified_cache.write(path, key, out)
    return out, False, time.perf_counter() - t0


class OracleBackend:
    name = "oracle"
    side = "oracle"

    @staticmethod
    def kernel_call(case: Case):
        raise ValueError("the oracle is the float64 reference, not a kernel to reproduce")

    def run(self, case: Case, inputs: dict[str, np.ndarray]) -> Execution:
        import jax

        tensors, hit, seconds = cached_oracle(case, inputs)
        return Execution(
            tensors=tensors,
            platform=f"cpu:float64 ({platform.machine()})",
            implementation=(
                f"references.{case.op} (float64, chunked; the recurrence defines it)"
                if case.stage is None
                else f"references.stages.{case.op} {case.stage} (float64, from the recurrence)"
            ),
            versions={"oracle": ORACLE_VERSION, "jax": jax.__version__},
            kernel_time_s=seconds,
            numerics="float64",
            # what the comparator measures errors against where it is not a tensor's rms (dg_gamma)
            notes={"cache_hit": hit, "error_scales": error_scales(tensors)},
        )
