"""FLA's records kept and reused: $PARITY_CACHE/fla (parity.execute.verified_cache's entries).

FLA's Execution of a case (its tensors and every field: platform, implementation, versions,
kernel_time_s, numerics, notes) is stored after FLA computed it, and reused, instead of running
FLA, when everything its bits depend on is the same (`key_parts`):
    case            the case's dict (its seed among it)
    inputs_sha256   cases.input_hash of the inputs FLA is given
    versions        fla-core, triton, torch and numpy as installed (importlib.metadata)
    platform        "cuda:<device name>" or "cpu:triton-interpreter"
    numerics        "cuda", or the interpreter emulation's tag (triton_interpreter.numerics())
    tf32_rounding   PARITY_TF32_ROUNDING's value (the interpreter's TF32 rounding)
    configs         where FLA's autotuned kernels take their configs: the pins file's and the
                    config table's sha256, and whether Triton tuned them (fla_configs.Source)
    cpu_features    in the interpreter: the SIMD features numpy uses here (its elementwise functions'
                    last bits follow them: triton_interpreter.what_the_bits_depend_on)
    format          FORMAT, this module's entry format
A reused Execution says so: notes.reused = {"from": when FLA computed it (ISO time), "cache": the
entry's path}. Errors and unsupported cases raise before anything is stored: never cached.
On a host without /dev/nvidia<N> the key needs no torch, triton or fla import (`platform_without_torch`):
FlaBackend.run looks up before anything of FLA's is imported; on a CUDA host the device's name comes
from torch, and the lookup happens where FLA runs (FlaBackend.run_here).
"""

from __future__ import annotations

import dataclasses
import glob
import os
import time
from importlib import metadata
from pathlib import Path

import numpy as np

from cases import Case, input_hash
from parity.execute import verified_cache
from parity.execute.backends import fla_configs, triton_interpreter
from parity.execute.backends.base import Execution

FORMAT = 2
INTERPRETER = "cpu:triton-interpreter"
PACKAGES = ("fla-core", "triton", "torch", "numpy")


class FlaCacheWarning(verified_cache.CacheWarning):
    """A damaged FLA cache entry was not used: FLA ran again."""


def installed_versions() -> dict[str, str | None]:
    """{package: its installed version, None if absent} for PACKAGES, without importing them."""
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def platform_without_torch() -> str | None:
    """INTERPRETER where this process sees no CUDA device (no /dev/nvidia<N>, or CUDA_VISIBLE_DEVICES
    empty or -1): FLA runs in the interpreter here; None where only torch can say (a CUDA host)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    hidden = visible is not None and not [d for d in visible.split(",") if d.strip() and d.strip() != "-1"]
    return INTERPRETER if hidden or not glob.glob("/dev/nvidia[0-9]*") else None


def _numpy_cpu_features() -> list[str]:
    """The SIMD features numpy dispatches to in this process (NPY_DISABLE_CPU_FEATURES applied)."""
    from numpy._core._multiarray_umath import __cpu_features__

    return sorted(name for name, on in __cpu_features__.items() if on)


def key_parts(case: Case, inputs: dict[str, np.ndarray], platform: str) -> dict:
    """What FLA's result for `case` depends on, on `platform` (the module docstring)."""
    return {
        "case": case.to_dict(),
        "inputs_sha256": input_hash(inputs),
        "versions": installed_versions(),
        "platform": platform,
        "numerics": "cuda" if platform.startswith("cuda:") else triton_interpreter.numerics(),
        "tf32_rounding": triton_interpreter.TF32_ROUNDING,
        "configs": fla_configs.source(
            platform.removeprefix("cuda:") if platform.startswith("cuda:") else None
        ).fingerprint(),
        "cpu_features": None if platform.startswith("cuda:") else _numpy_cpu_features(),
        "format": FORMAT,
    }


def _where(case: Case, inputs: dict, platform: str) -> tuple[Path, str] | None:
    """(entry path, key), or None where the key cannot be formed (a pins file or table that cannot be read)."""
    try:
        key = verified_cache.key_of(key_parts(case, inputs, platform))
    except OSError:
        return None
    return verified_cache.cache_dir("fla") / f"{key}.npz", key


def reused(case: Case, inputs: dict[str, np.ndarray], platform: str) -> Execution | None:
    """FLA's stored Execution of the case on `platform`, notes.reused added; None: not stored, or
    --fresh, or damaged (FlaCacheWarning)."""
    where = _where(case, inputs, platform)
    if where is None:
        return None
    path, key = where
    entry = verified_cache.lookup(path, key, f"FLA cache entry {path} for {case.id}", FlaCacheWarning)
    if entry is None:
        return None
    fields = dict(entry.meta["execution"])
    fields["notes"] = {**fields["notes"], "reused": {"from": entry.meta["ran_at"], "cache": str(path)}}
    return Execution(tensors=entry.arrays, **fields)


def store(case: Case, inputs: dict[str, np.ndarray], ex: Execution, ran_at: str) -> None:
    """Keep FLA's Execution of the case (computed at `ran_at`, ISO time) for `reused`."""
    where = _where(case, inputs, ex.platform)
    if where is None:
        return
    path, key = where
    fields = {f.name: getattr(ex, f.name) for f in dataclasses.fields(ex) if f.name != "tensors"}
    try:
        verified_cache.write(path, key, ex.tensors, {"execution": fields, "ran_at": ran_at})
    except TypeError:  # notes JSON cannot hold as they are: not stored (FLA runs again next time)
        return


def now() -> str:
    """This moment as ISO 8601 in UTC, seconds."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
