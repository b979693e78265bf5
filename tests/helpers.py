"""Shared test helpers: run the harness in-process on small cases, build records."""

from __future__ import annotations

import copy
import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cases import Case, input_hash
from parity.execute.backends import BUILTIN, BackendResult, BackendSpec
from parity.execute.backends.oracle import cached_oracle
from parity.execute.case import _record
from parity.execute.runner import RunConfig, run_cases
from parity.measure.tol import NP_DTYPES, output_dtype
from parity.model.inputs import case_inputs
from parity.records import read_json, result_path, write_json
from parity.records.manifest import manifest_path, write_manifest
from references import error_scales

SMALL = Case("simple_gla", 1, 64, 1, 64, 64, h0=True, ht=True)


def _libtpu_missing() -> str | None:
    """Why nothing can compile for TPU here, or None. In CI (CI set) libtpu is part of the
    install (scripts/env.sh): its absence fails the tests that need it instead of skipping."""
    import os

    from parity.model.host import libtpu_version

    if libtpu_version() is not None or os.environ.get("CI"):
        return None
    return "libtpu is not installed (pip install 'jax[tpu]' at jax's own version): no TPU compiler here"


requires_libtpu = pytest.mark.skipif(_libtpu_missing() is not None, reason=str(_libtpu_missing()))
SMALL_BF16 = Case("simple_gla", 1, 64, 1, 64, 64, dtype="bfloat16", h0=True, ht=True)


def run(cases, backends, out: Path, **kw) -> dict:
    return run_cases(list(cases), RunConfig(out_dir=out, backends=list(backends), progress=False, **kw))


# FLA on cases in a fresh Python process, as the harness runs a backend (execute) and records it
# (_record, against the cached float64 oracle): per case id the record's status, platform, versions,
# verdict and error, and the sha256 of each output tensor's bytes
_FLA_IN_A_PROCESS = """
import hashlib, json, sys, time
from parity.execute.backends import triton_interpreter
triton_interpreter.enable()  # before anything imports triton or fla
from cases import Case, input_hash
from parity.execute.backends import execute
from parity.execute.backends.fla import FlaBackend
from parity.execute.backends.oracle import cached_oracle
from parity.execute.case import _record
from parity.model.inputs import case_inputs
from references import error_scales
out = {}
for cid in sys.argv[1:]:
    case = Case.from_id(cid)
    inputs = case_inputs(case)
    result = execute(FlaBackend(), case, inputs)
    oracle = cached_oracle(case, inputs)[0]
    rec = _record(case, "fla", result, oracle, input_hash(inputs), "test", error_scales(oracle))
    out[cid] = {
        "record": {k: rec[k] for k in ("status", "platform", "versions", "verdict", "error", "wall_time_s")},
        "launches": rec["notes"].get("fla_launches"),
        "sha256": {n: hashlib.sha256(t.tobytes()).hexdigest() for n, t in sorted(result.tensors.items())},
    }
print(json.dumps(out))
"""


def triton_dir(version: str) -> Path | None:
    """The directory Triton `version` is installed in for the tests (<venv>/pkgs/triton-<version>,
    scripts/env.sh), None for the environment's own; fails, naming the set-up step, where that
    version is not installed."""
    if version == importlib.metadata.version("triton"):
        return None
    target = Path(sys.prefix) / "pkgs" / f"triton-{version}"
    if not (target / "triton" / "__init__.py").is_file():
        pytest.fail(
            f"Triton {version} is not installed in {target}: scripts/env.sh installs it "
            f"(pip install --no-deps --target {target} triton=={version})"
        )
    return target


def triton_env(version: str) -> dict[str, str]:
    """This process's environment, with Triton `version` first on PYTHONPATH (triton_dir)."""
    env, target = dict(os.environ), triton_dir(version)
    if target is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(target), env.get("PYTHONPATH")) if p)
    return env


def fla_in_a_process(case_ids, env: dict[str, str] | None = None) -> dict:
    """Run FLA (the CPU interpreter path) on each case id in a fresh Python process with the
    environment `env` (default: this process's): case id -> {"record": its record's status,
    platform, versions, verdict, error and wall_time_s; "launches": its notes.fla_launches; "sha256":
    tensor name -> sha256 of its bytes}."""
    done = subprocess.run([sys.executable, "-c", _FLA_IN_A_PROCESS, *case_ids], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def record_from_tensors(
    case: Case, backend: str, side: str, tensors: dict[str, np.ndarray], platform: str = "test"
) -> dict:
    """A result record for `tensors`, compared against the real oracle by the real comparator."""
    inputs = case_inputs(case)
    oracle = cached_oracle(case, inputs)[0]
    res = BackendResult(
        backend=backend,
        side=side,
        status="ok",
        tensors=tensors,
        platform=platform,
        implementation="test",
        wall_time_s=0.0,
    )
    spec = (
        backend
        if backend in BUILTIN
        else BackendSpec(
            f"{backend}=jax:tests.helpers:fixture", backend, side, "candidate-jax", "tests.helpers:fixture", platform
        )
    )
    return _record(case, spec, res, oracle, input_hash(inputs), "test", error_scales(oracle))


def write_records(out: Path, *recs: dict, run_id: str = "test") -> None:
    """Records into out/<backend>/<case_id>.json and a manifest listing their cases and
    backends (added to the one already there), as parity run writes them."""
    path = manifest_path(out, run_id)
    m = read_json(path) if path.exists() else {"cases": [], "backends": []}
    cases = [c["id"] for c in m["cases"]]
    backends = list(m["backends"])
    for rec in recs:
        write_json(result_path(out, rec["backend"], rec["case_id"]), rec)
        cases += [rec["case_id"]] if rec["case_id"] not in cases else []
        backends += [rec["backend"]] if rec["backend"] not in backends else []
    write_manifest(out, run_id, "test", cases, backends)


def perturbed(case: Case, towards: dict[str, np.ndarray], times: float) -> dict[str, np.ndarray]:
    """oracle + times * (towards - oracle): a result whose error is `times` that of `towards`."""
    oracle = cached_oracle(case, case_inputs(case))[0]
    return {n: oracle[n] + times * (np.asarray(towards[n], np.float64) - oracle[n]) for n in towards}


def reference_like(case: Case) -> dict[str, np.ndarray]:
    """A reference result with realistic error: the oracle with 1.5e-3 relative noise, rounded to
    each tensor's output dtype (FLA compiled on an H100 measured about 1e-3 to 4e-3 rel_rms on bf16
    outputs and gradients)."""
    r = cached_oracle(case, case_inputs(case))[0]
    rng = np.random.default_rng(0)
    return {
        n: (a * (1 + 1.5e-3 * rng.standard_normal(a.shape))).astype(NP_DTYPES[output_dtype(case, n)])
        for n, a in r.items()
        if n in case.output_names()
    }


def deep(d):
    return copy.deepcopy(d)


def assert_matches_oracle(case: Case, tensors: dict[str, np.ndarray]) -> None:
    """Every output and gradient the case asks for is present and passes the comparator
    (finite, rel_rms within tol) against the float64 oracle."""
    from parity.measure.compare import compare_tensor

    oracle = cached_oracle(case, case_inputs(case))[0]
    assert set(tensors) == set(case.output_names())
    failures = {}
    for name in case.output_names():
        m = compare_tensor(case, name, tensors[name], oracle[name], error_scales(oracle).get(name))
        if m["verdict"] != "pass":
            failures[name] = (m["verdict"], m["rel_rms"], m["tol"], m["nan"], m["inf"])
    assert not failures, failures


def noise_run(
    case: Case, out: Path, ref_rel: float, cand_rel: float, seeds=(3, 8), cand_name: str = "cand"
) -> dict[str, dict]:
    """run_case on `case` with two noise backends (parity.execute.backends.noise): a reference named
    fla whose low-precision tensors carry compute error ref_rel, a candidate with cand_rel; the
    records by backend name (the real seed loop: sequential seeds up to `seeds`)."""
    from parity.execute.backends.noise import NoiseBackend
    from parity.execute.case import LazyBackends, run_case

    ref = BackendSpec(f"noise:{ref_rel}", "fla", "reference", "noise", str(ref_rel), "cpu")
    cand = BackendSpec(f"noise:{cand_rel}", cand_name, "candidate", "noise", str(cand_rel), "cpu")
    backends = LazyBackends()
    backends[ref], backends[cand] = NoiseBackend(ref), NoiseBackend(cand)
    recs, _, _ = run_case(case, ["oracle", ref, cand], backends, out, "test-noise", seeds=seeds)
    return {r["backend"]: r for r in recs}
