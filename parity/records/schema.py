"""The shape of the records under a run directory: the schema version, the typed fields of a
result and a compile record, and a compile record's verdict."""

from __future__ import annotations

from typing import Any, TypedDict

from parity.model.verdict import Verdict

SCHEMA_VERSION = 2  # 2: per-seed figures (tensors.*.seeds, seeds, seed_policy)


class TensorMetrics(TypedDict, total=False):
    """A candidate's or the reference's tensor against the oracle (parity.measure.compare.compare_tensor);
    a tensor the backend does not return has only verdict "unsupported" and reason, a backward
    tensor of a forward-only candidate only verdict "not-judged" and reason."""

    verdict: str  # a Verdict (parity.model.verdict)
    reason: str  # why unsupported, or not judged
    dtype: str
    shape: list[int]
    rel_rms: float | None  # ||x - r|| / ||r|| (rms((x - r) / error_scale) given one); null when NaN/Inf
    error_scale: list[float]  # dg_gamma: per head, what its error is measured against (references.error_scales)
    max_abs: float
    max_abs_over_rms: float | None
    max_ulp: float
    nan: int
    inf: int
    oracle_nonfinite: int
    oracle_rms: float
    oracle_max_abs: float
    floor_rel: float
    floor_abs: float
    tol: float  # parity.measure.tol.tol(case, tensor)
    worst: list[dict]  # [{"index", "value", "oracle"}], worst first
    profile: list  # error per chunk along T (or per state row)
    heatmap: list
    row_heatmap: list
    sequences: list | None
    localisation: dict
    # per input seed, the case's own first (parity.execute.case): {"seed", "input_hash", "rel_rms",
    # "floor_rel", "max_abs", "nan", "inf", "verdict", "err2": [...], "floor2": [...]}, err2 and floor2
    # per independent block (parity.measure.compute_error)
    seeds: list[dict]
    rms: float  # the oracle's own records: its rms and non-finite count
    nonfinite: int


class ResultRecord(TypedDict, total=False):
    """DIR/<backend>/<case_id>.json (kind "result"), checked on read by check_result."""

    schema: int
    kind: str  # "result"
    run_id: str
    case_id: str
    case: dict  # cases.Case.to_dict()
    input_hash: str | None
    oracle_version: Any
    tol_version: str
    backend: str  # BackendSpec.name
    side: str  # "oracle", "reference" or "candidate"
    host: str
    created: str  # %Y-%m-%dT%H:%M:%S%z: of two records the later wins (load_latest)
    repro: str  # the `parity run` command that reruns this case and backend
    status: str  # ok, error, timeout, unsupported
    verdict: str  # a Verdict (parity.model.verdict)
    platform: str  # where it really ran, e.g. 'cpu:tpu-interpret'
    implementation: str
    versions: dict[str, str]
    numerics: str
    kernel_time_s: float | None
    wall_time_s: float | None
    error: str | None
    # free-form facts; in TPU interpret mode "tpu_identity": the TPU get_tpu_info() answered as,
    # {"emulated": "v5e", "device_kind": "TPU v5 lite", "num_cores": 1, "source": "--tpu-targets"},
    # and "tpu_numerics": the Pallas kernels' dot classes computed on the vector unit and what
    # decided it, {"vector_unit": {"my_kernel": ["f32x1"]}, "source": "compile for v5e (...)"}
    notes: dict[str, Any]
    tensors: dict[str, TensorMetrics]  # the oracle's: shape, rms, max_abs, nonfinite, verdict
    seeds: list[dict]  # the input seeds it ran, in order: [{"seed", "input_hash"}] (cases.seed_at)
    seed_policy: dict  # {"min", "max"}: the seeds per case its run asked for (parity run --seeds)
    encoded_nonfinite: list[str]


class CompileRecord(TypedDict, total=False):
    """DIR/<backend>/<case_id>.compile.json (kind "compile", parity.execute.tpu_compile), checked by check_compile."""

    schema: int
    kind: str  # "compile"
    run_id: str
    case_id: str
    case: dict
    backend: str
    created: str
    repro: str
    verdict: str  # pass, compile-error or numerics-mismatch (compile_verdict of targets)
    # target -> {"ok": bool, "error": str, "seconds", "device_kind", "default_device" (the default
    # device while compiling), "vmem" (an out-of-VMEM failure read: mosaic_llo.vmem_failure),
    # "mosaic", "numerics", ...}
    targets: dict[str, dict]


ByCase = dict[str, dict[str, ResultRecord]]  # case_id -> backend -> record


def tpu_kernel_problem(rec: dict) -> str | None:
    """Why a candidate that is a Pallas TPU kernel (`pallas:` candidates, kernels_jax and its
    mutants: notes.pallas.required) did not run as one: its program had no pallas_call, or one
    that is no Mosaic kernel (notes.pallas.cause, parity.execute.pallas_paths); None otherwise.
    Such a result is never passed."""
    paths = (rec.get("notes") or {}).get("pallas") or {}
    if paths.get("required") and paths.get("cause"):
        return f"not run as a TPU kernel: {paths['cause']}"
    return None


def compile_verdict(results: dict) -> Verdict:
    """compile-error when any target failed; numerics-mismatch when the compiled module's
    matmuls disagree with the numerics model (or could not be read); pass otherwise."""
    if any(not r["ok"] for r in results.values()):
        return Verdict.COMPILE_ERROR
    if any(
        r.get("numerics", {}).get("mismatches") or "error" in r.get("numerics", {"error": "missing"})
        for r in results.values()
    ):
        return Verdict.NUMERICS_MISMATCH
    return Verdict.PASS


class RecordError(ValueError):
    """A file under a run directory that cannot be read, or a record of the wrong shape;
    the message names the file and the field."""
