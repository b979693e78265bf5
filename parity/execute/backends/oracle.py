"""The `oracle` backend: references/ in float64 on CPU, cached on disk.

Cache key: case id + input sha256 + ORACLE_VERSION, so a cache directory copied to
another machine is reused there exactly when the inputs and the oracle are the same.
Location: $PARITY_CACHE/oracle, default ~/.cache/parity/oracle.

Each entry is verified on load: the archive holds, beside the tensors, the sha256 of
their names, dtypes, shapes and bytes (CONTENT_KEY) and the cache key it was written
under. A truncated, bit-flipped or edited entry, or one without the hash, is recomputed
and replaced, with a warning. Writers write a file of their own (unique temporary name)
and rename it into place, so concurrent writers of one entry cannot corrupt it: the last
rename wins and every candidate is a complete file.
"""

from __future__ import annotations

import hashlib
import os
import platform
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from cases import Case, input_hash
from parity.execute.backends.base import Execution
from references import ORACLE_VERSION, error_scales, oracle_names, oracle_run


def cache_dir() -> Path:
    root = os.environ.get("PARITY_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "parity")
    return Path(root) / "oracle"


CONTENT_KEY = "__content_sha256__"
KEY_KEY = "__cache_key__"


class OracleCacheWarning(UserWarning):
    """A damaged oracle cache entry was recomputed."""


def _key(case: Case, inputs: dict[str, np.ndarray]) -> str:
    return hashlib.sha256(f"{case.id}|{input_hash(inputs)}|oracle-v{ORACLE_VERSION}".encode()).hexdigest()[:32]


def cache_path(case: Case, inputs: dict[str, np.ndarray]) -> Path:
    return cache_dir() / f"{_key(case, inputs)}.npz"


def _load_verified(path: Path, case: Case, key: str) -> dict[str, np.ndarray]:
    """The entry's tensors; ValueError saying why when it is damaged or not this case's."""
    try:
        with np.load(path, allow_pickle=False) as z:
            out = {n: z[n] for n in oracle_names(case)}
            stored, stored_key = str(z[CONTENT_KEY]), str(z[KEY_KEY])
    except Exception as e:  # noqa: BLE001 - BadZipFile, EOFError, KeyError, OSError, zlib errors...
        raise ValueError(f"unreadable ({type(e).__name__}: {e})") from None
    if stored_key != key:
        raise ValueError(f"written under key {stored_key[:12]}..., not {key[:12]}...")
    if input_hash(out) != stored:
        raise ValueError("content hash does not match the tensors")
    return out


def cached_oracle(case: Case, inputs: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], bool, float]:
    """(tensors, cache_hit, seconds spent computing or loading)."""
    key = _key(case, inputs)
    path = cache_dir() / f"{key}.npz"
    t0 = time.perf_counter()
    if path.exists():
        try:
            return _load_verified(path, case, key), True, time.perf_counter() - t0
        except ValueError as e:
            warnings.warn(
                OracleCacheWarning(
                    f"oracle cache entry {path} for {case.id} is damaged ({e}): recomputed and replaced"
                ),
                stacklevel=2,
            )
    out = oracle_run(case, inputs)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".tmp-{os.getpid()}-", suffix=".npz")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **out, **{CONTENT_KEY: np.array(input_hash(out)), KEY_KEY: np.array(key)})
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
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
