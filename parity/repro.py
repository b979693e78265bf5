"""`parity repro CASE_ID [--candidate SPEC | --backend pallas] -o DIR [--reference RUN_DIR]`:
everything needed to rerun one case, for pasting into a kernel's own bug report, and a script that
reruns it through the harness and prints the harness's verdict.

DIR/inputs.npz   the case's inputs (bf16 stored as uint16 bits)
DIR/inputs-seed<S>.npz  the inputs of the further seeds the bound was judged over
DIR/oracle.npz   the float64 oracle's outputs and gradients (the case's own seed)
DIR/case.json    the case
DIR/judge.json   what the verdict needs: the backend spec, the seeds, the seed policy, the bound
                 factor and the reference's (fla's) result record, or null when there is none
DIR/repro.py     a short script saying what case, kernel, seeds and comparison it reruns, that
                 imports the harness that wrote it and calls `replay`: the case through the
                 backend as `parity run` runs it (inputs built by the harness and checked against
                 the .npz, the kernel called by the backend's own calling code, compared with the
                 oracle), rel_rms per tensor against oracle.npz, then the harness's verdict: both
                 errors, the tolerance, the bound, the rule that decided and the verdict; exit 1 on
                 a failure, as `parity gate`

The reference's record comes from a run directory (`--reference`: the original run's --out, or a
GPU machine's report directory) or, without one, from running the reference on this machine
beside the backend, as `parity run` would.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
from jinja2 import Template

import parity
from cases import Case, input_hash, seed_at
from parity.execute.backends import SpecError, Unsupported, as_spec, make_backend
from parity.execute.backends.base import Execution
from parity.execute.backends.oracle import cached_oracle
from parity.execute.case import build_backends, run_case
from parity.judge.gate import evaluate
from parity.judge.load import GateRefusal
from parity.judge.summary import format_summary
from parity.judge.words import fmt
from parity.measure import tpu_numerics
from parity.measure.compute_error import SEEDS_MAX, SEEDS_MIN
from parity.measure.compute_error import describe as describe_compute
from parity.model import environ
from parity.model.host import keep_jax_on_the_cpu
from parity.model.inputs import case_inputs
from parity.model.spec import REFERENCE
from parity.model.verdict import UNJUDGED, Verdict
from parity.records import RecordError, load_latest

HARNESS_ROOT = Path(parity.__file__).resolve().parents[1]  # the checkout holding parity, cases, references

SCRIPT = Template(
    '''\
"""Reproducer of {{ case_id }} on {{ name }}.

Case:     {{ case_id }} (case.json)
Backend:  {{ spec }}
Kernel:   {{ module }}.{{ function }} ({{ how }}),
          called as `parity run` calls it
Seeds:    {{ seeds }}
Compare:  per tensor ({{ outputs }}): rel_rms, max_abs and non-finite elements against the
          float64 oracle (oracle.npz); then the harness's verdict over the seeds:
          {{ verdict }}.
          Exit 0 on a pass, 1 on a failure, 2 refused, as `parity gate`.

Run: python repro.py, from any directory. The harness (parity, imported from HARNESS_ROOT, the
checkout that wrote this) builds the inputs, checks them against the bundled .npz, calls the kernel
(its module imported from MODULE_ROOT, where the harness found it) and judges its outputs.
"""

import os
import sys

HARNESS_ROOT = {{ harness_root }}  # the harness's checkout: parity, cases, references
MODULE_ROOT = {{ module_root }}  # the sys.path entry the harness imported {{ module }} from
{% if framework == "jax" -%}
os.environ["{{ numerics_env }}"] = "{{ numerics }}"  # off a TPU: matmuls as the TPU's MXU computes them
{% endif %}
for root in (HARNESS_ROOT, MODULE_ROOT):  # MODULE_ROOT first: the module the harness ran, not another of its name
    if root and os.path.isdir(root):
        sys.path.insert(0, root)
try:
    from parity.repro import replay
except ImportError as e:
    sys.exit(f"cannot import the harness ({e}): run PYTHONPATH=<its checkout> python repro.py")

sys.exit(replay(os.path.dirname(os.path.abspath(__file__))))
''',
    keep_trailing_newline=True,
)


def write_repro(case: Case, spec, out: Path, reference: Path | None = None, run_reference: bool = False) -> Path:
    """Write the repro directory for `case` and the backend `spec` (a BackendSpec or its text:
    'pallas', 'pallas-fused', 'fla' or a candidate NAME=FRAMEWORK:MODULE:FUNCTION). The script
    names the kernel and the chunk size passed to it by the backend's own `kernel_call(case)`, and
    runs the case through the backend itself (`replay`). The reference's record for the bound:
    from the run directory `reference`, else, with `run_reference`, from running it here beside
    the backend (`reference_run`); neither: the script judges the tolerance alone. ValueError
    when the backend has no standalone kernel for the case or the directory holds no reference
    record of it."""
    spec = as_spec(spec)
    backend = make_backend(spec)
    try:
        call = backend.kernel_call(case)
    except Unsupported as e:
        raise ValueError(f"{backend.name} has no kernel for {case.id}: {e}") from None
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if spec.name == REFERENCE:
        ref, cand = None, None
    elif reference is not None:
        ref, cand = reference_records(case, spec, Path(reference))
    elif run_reference:
        ref, cand = reference_run(case, spec, out / "run")
    else:
        ref, cand = None, None
    judge = bundle_seeds(case, ref, cand)
    judge.update(spec=spec.text, reference=ref)
    inputs = _write_inputs(case, judge["seeds"], out)
    oracle = cached_oracle(case, inputs)[0]
    np.savez(out / "oracle.npz", **{n: oracle[n] for n in case.output_names()})
    (out / "case.json").write_text(
        json.dumps({"id": case.id, **case.to_dict(), "input_hash": input_hash(inputs)}, indent=1)
    )
    (out / "judge.json").write_text(json.dumps(judge, indent=1))
    chunk = "" if call.chunk_size is None else f", chunk_size={call.chunk_size}"  # where it is passed
    script = SCRIPT.render(
        case_id=case.id,
        spec=spec.text,
        name=spec.name,
        framework=call.framework,
        module=call.module,
        function=call.function,
        how=f"{call.framework}, FLA's calling convention{chunk}",
        seeds=_seeds_text(judge["seeds"]),
        outputs=", ".join(case.output_names()),
        verdict=(
            f"both errors, the tolerance, the bound by {REFERENCE}'s record (judge.json), the rule that decided"
            if ref
            else f"its error against its tolerance alone (no {REFERENCE} record, no bound)"
        ),
        harness_root=repr(str(HARNESS_ROOT)),
        module_root=repr(module_root(call.module)),
        numerics_env=tpu_numerics.ENV,
        numerics=tpu_numerics.active(),
    )
    (out / "repro.py").write_text(script)
    return out / "repro.py"


def _seeds_text(seeds: list[int]) -> str:
    """The bundle's input seeds and their files, for the script's docstring."""
    further = f"; then {', '.join(map(str, seeds[1:]))} (inputs-seed<S>.npz)" if seeds[1:] else ""
    return f"{seeds[0]}, the case's own (inputs.npz){further}"


def module_root(module: str) -> str | None:
    """The sys.path entry `module` (dotted) is imported from in this process, or None when it
    cannot be found (the script then imports it from its own environment only)."""
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if found is None or not found.origin or not Path(found.origin).is_file():
        return None
    levels = module.count(".") + (2 if Path(found.origin).name == "__init__.py" else 1)
    return str(Path(found.origin).resolve().parents[levels - 1])


def _write_inputs(case: Case, seeds: list[int], out: Path) -> dict:
    """inputs.npz (the case's own seed, whose inputs are returned) and inputs-seed<S>.npz for the
    further seeds, as `_stored`."""
    built = {seed: case_inputs(case.replace(seed=seed)) for seed in seeds}
    for seed, inputs in built.items():
        np.savez(out / _inputs_file(case, seed), **_stored(inputs))
    return built[case.seed]


def _inputs_file(case: Case, seed: int) -> str:
    return "inputs.npz" if seed == case.seed else f"inputs-seed{seed}.npz"


def _stored(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Inputs as the bundle stores them: bfloat16 arrays as their uint16 bits (npz has no bfloat16)."""
    return {n: (a.view(np.uint16) if a.dtype.name == "bfloat16" else a) for n, a in inputs.items()}


def reference_records(case: Case, spec, run_dir: Path) -> tuple[dict, dict | None]:
    """(the reference's result record of `case` under `run_dir`, the backend's own record there or
    None); ValueError when there is no usable reference record."""
    try:
        recs = load_latest([run_dir]).get(case.id, {})
    except RecordError as e:
        raise ValueError(f"--reference {run_dir}: {e}") from None
    ref = recs.get(REFERENCE)
    if ref is None:
        raise ValueError(f"--reference {run_dir}: no {REFERENCE} (reference) record of {case.id} there")
    if ref["status"] != "ok":
        raise ValueError(
            f"--reference {run_dir}: the {REFERENCE} record of {case.id} is {ref['status']}: nothing to bound by"
        )
    return ref, recs.get(as_spec(spec).name)


def reference_run(case: Case, spec, run_dir: Path) -> tuple[dict, dict]:
    """Run the reference and the backend on `case` here, as `parity run` does (seeds while the
    bound is undecided), records under `run_dir`: (reference record, backend record)."""
    spec = as_spec(spec)
    todo = [as_spec(REFERENCE), spec]
    print(
        f"parity repro: running {REFERENCE} and {spec.name} on {case.id} here for the bound "
        "(--reference RUN_DIR uses a run's records instead)",
        file=sys.stderr,
    )
    records, _, _ = run_case(case, todo, build_backends(todo), run_dir, "repro", seeds=(SEEDS_MIN, SEEDS_MAX))
    ref, cand = records
    if ref["status"] != "ok":
        why = (ref.get("error") or "").strip()[:300]
        raise ValueError(f"{REFERENCE} did not run on {case.id} here ({ref['status']}): {why}")
    return ref, cand


def bundle_seeds(case: Case, ref: dict | None, cand: dict | None) -> dict:
    """The seeds the bound was judged over (those of the reference's record, and of the backend's
    own where it is known; the case's own seed alone without a reference) and the seed policy."""
    seeds = [s["seed"] for s in ref["seeds"]] if ref else []
    if cand is not None and cand.get("seeds"):
        ran = {s["seed"] for s in cand["seeds"]}
        seeds = [s for s in seeds if s in ran]
    seeds = [case.seed, *(s for s in seeds if s != case.seed)]  # the case's own seed first
    policy = (cand or {}).get("seed_policy") or {"min": SEEDS_MIN, "max": SEEDS_MAX}
    return {"seeds": seeds, "seed_policy": policy, "bound_factor": 1.0}


def replay(bundle: str | Path) -> int:
    """What repro.py runs: the bundle's case through its backend as `parity run` runs it (run_case:
    the inputs built by the harness, the backend's own calling code, the comparison with the
    oracle, the bundle's seeds), after checking that those inputs are the bundled .npz; then the
    case's id and, per tensor of the case's own seed, rel_rms, max_abs and non-finite elements
    against oracle.npz, and the harness's verdict (`judge_replay`). Returns the exit status: 0
    pass, 1 fail, 2 refused."""
    bundle = Path(bundle)
    meta = json.loads((bundle / "case.json").read_text())
    case = Case.from_dict({k: v for k, v in meta.items() if k != "input_hash"})
    judge = json.loads((bundle / "judge.json").read_text())
    spec = as_spec(judge["spec"])
    keep_jax_on_the_cpu()  # as the `parity` command does, before jax is imported
    differs = _inputs_differ(case, judge["seeds"], bundle)
    if differs:
        print(f"verdict: refused: {differs}")
        return 2
    try:
        backend = _Kept(make_backend(spec))
    except SpecError as e:
        print(f"{e}: run PYTHONPATH=<the directory that holds it> python repro.py", file=sys.stderr)
        return 1
    seeds = (len(judge["seeds"]),) * 2  # exactly the bundle's seeds
    # a repro reruns the kernel: FLA's result is computed, never read from the harness's cache
    with tempfile.TemporaryDirectory() as tmp, environ.exported(environ.fresh_also("fla")):
        records, _, _ = run_case(case, [spec], {spec: backend}, Path(tmp), "repro", seeds=seeds)
    print(case.id)
    got = backend.tensors.get(case.seed, {})
    for name, ref in np.load(bundle / "oracle.npz").items():
        print(f"  {error_line(name, got[name], ref)}" if name in got else f"  {name:8s} not returned")
    cand = records[0]
    if cand["status"] != "ok":  # the kernel raised, declined the case, or returned what the harness refuses
        print(f"{spec.name} {cand['status']}: {cand['error']}")
    return judge_replay(case, spec, cand, judge)


def _inputs_differ(case: Case, seeds: list[int], bundle: Path) -> str | None:
    """Why the inputs the harness builds for the bundle's seeds are not the bundled ones (the seeds
    not those run_case runs, or other bytes), or None."""
    expected = [seed_at(case.seed, k) for k in range(len(seeds))]
    if seeds != expected:
        return f"the bundle's seeds {seeds} are not the case's seeds in run order {expected}"
    for seed in seeds:
        stored = dict(np.load(bundle / _inputs_file(case, seed)))
        if input_hash(_stored(case_inputs(case.replace(seed=seed)))) != input_hash(stored):
            return f"the harness builds other inputs for seed {seed} than {_inputs_file(case, seed)} holds"
    return None


class _Kept:
    """A backend that keeps the tensors it returns, per input seed (the errors repro.py prints)."""

    def __init__(self, backend):
        self.backend, self.name, self.side = backend, backend.name, backend.side
        self.module = getattr(backend, "module", None)  # execute isolates a candidate's module by it
        self.tensors: dict[int, dict[str, np.ndarray]] = {}

    def run(self, case: Case, inputs: dict[str, np.ndarray]) -> Execution:
        ex = self.backend.run(case, inputs)
        self.tensors[case.seed] = ex.tensors
        return ex


def error_line(name: str, got: np.ndarray, ref: np.ndarray) -> str:
    """One tensor against the oracle: ||x - oracle|| / ||oracle||, the largest absolute difference
    and the count of non-finite elements (NaN and Inf taken as 0 in both figures)."""
    x = np.asarray(got, np.float64)
    diff = np.nan_to_num(x) - ref
    err = np.linalg.norm(diff) / max(np.linalg.norm(ref), 1e-300)
    bad = int(np.sum(~np.isfinite(x)))
    return f"{name:8s} rel_rms {err:.3e}  max_abs {np.max(np.abs(diff)):.3e}  non-finite {bad}"


def judge_replay(case: Case, spec, cand: dict, judge: dict) -> int:
    """The harness's verdict on the backend's record `cand` of the replayed case, printed: per tensor
    both errors, the tolerance, the bound and the rule, then the gate's lines and `verdict: WORD`
    (without a reference record: the tolerance alone). Returns the gate's exit status (0 pass, 1
    fail, 2 refused)."""
    ref = judge["reference"]
    cand["seed_policy"] = judge["seed_policy"]  # judged by the policy of the original run's verdict
    if ref is None:
        return _tolerance_only(cand)
    try:
        result = evaluate(
            {case.id: {REFERENCE: ref, spec.name: cand}}, judge["bound_factor"], allow_mixed_numerics=True
        )
    except GateRefusal as e:
        print(f"verdict: refused: {e}")
        return 2
    entry = result["cases"][0]
    seeds, factor = len(judge["seeds"]), judge["bound_factor"]
    print(f"over {seeds} seed(s), bound factor {factor}; {REFERENCE} ran on {ref.get('platform')}")
    for name, t in entry["tensors"].items():
        print("  " + tensor_line(name, t, ref))
    print(format_summary(result))
    print(f"verdict: {entry['verdict']}")
    return 0 if result["ok"] else 1


def _tolerance_only(cand: dict) -> int:
    """Print the candidate record's tensors against their tolerance and its verdict; 0 on a pass."""
    print(f"bound: not judged (no {REFERENCE} record: parity repro --reference RUN_DIR); tolerance only")
    for name, t in cand["tensors"].items():
        judged = t["verdict"] not in UNJUDGED
        what = f"eps {fmt(t.get('rel_rms'))}  tol {fmt(t.get('tol'))}" if judged else t.get("reason", "")
        print(f"  {name:8s} {t['verdict']:14s} {what}")
    print(f"verdict: {cand['verdict']}")
    return 0 if cand["verdict"] in (Verdict.PASS, Verdict.UNSUPPORTED) else 1


def tensor_line(name: str, t: dict, ref: dict) -> str:
    """One tensor of a gate entry: verdict, both epsilons (the case's own seed), tolerance, the
    bound's limit and the rule that decided it."""
    if t["verdict"] in UNJUDGED:
        return f"{name:8s} {t['verdict']:14s} {t.get('bound_note', '')}"
    rt = ref.get("tensors", {}).get(name) or {}
    b = t.get("bound") or {}
    line = (
        f"{name:8s} {t['verdict']:14s} eps {fmt(t.get('rel_rms'))}  eps_{REFERENCE} {fmt(rt.get('rel_rms'))}  "
        f"tol {fmt(t.get('tol'))} ({t['accuracy']})"
    )
    if b:
        limit = (b.get("rel_rms") or {}).get("limit")
        line += f"  bound {b['verdict']}" + (f" limit {fmt(limit)}" if limit is not None else "")
        line += f": {describe_compute(b.get('compute'))}" if b.get("compute") else ""
    else:
        line += f"  bound: {t.get('bound_note', 'none')}"
    return line
