"""`parity repro CASE_ID [--candidate SPEC | --backend pallas] -o DIR [--reference RUN_DIR]`:
everything needed to rerun one case outside the harness, for pasting into a kernel's own bug
report, and the harness's verdict on what it printed.

DIR/inputs.npz   the case's inputs (bf16 stored as uint16 bits, see repro.py)
DIR/inputs-seed<S>.npz  the inputs of the further seeds the bound was judged over
DIR/oracle.npz   the float64 oracle's outputs and gradients (the case's own seed)
DIR/case.json    the case
DIR/judge.json   what the verdict needs: the backend spec, the seeds, the seed policy, the bound
                 factor and the reference's (fla's) result record, or null when there is none
DIR/repro.py     a script that calls the kernel (numpy + jax or torch + the kernel's module, found
                 by itself), takes gradients and prints rel_rms per tensor against the oracle; then,
                 where the harness is importable, the harness's verdict (`judge_bundle`): both
                 errors, the tolerance, the bound, the rule that decided and the verdict; exit 1 on a
                 failure, as `parity gate`
DIR/tpu_numerics.py  (jax kernels) a copy of parity/measure/tpu_numerics.py: off a TPU the script
                 computes the kernel's matmuls under the same TPU numerics model as the
                 harness did, so it prints the epsilons the harness measured

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
from cases import Case, input_hash
from cases.stages import stage_arguments, stage_kwargs, stage_of
from parity.execute.backends import Unsupported, as_spec, make_backend
from parity.execute.backends.base import Execution
from parity.execute.backends.oracle import cached_oracle
from parity.execute.case import build_backends, run_case
from parity.judge.gate import evaluate
from parity.judge.load import GateRefusal
from parity.judge.summary import format_summary
from parity.measure import tpu_numerics
from parity.measure.compare import fmt
from parity.measure.compute_error import SEEDS_MAX, SEEDS_MIN
from parity.measure.compute_error import describe as describe_compute
from parity.model.host import COMPILE_ONLY_SLICE, TPU_SLICE_ENV
from parity.model.inputs import case_inputs
from parity.model.spec import REFERENCE
from parity.records import UNJUDGED, RecordError, load_latest

HARNESS_ROOT = Path(parity.__file__).resolve().parents[1]  # the checkout holding parity, cases, references

SCRIPT = Template('''\
"""Standalone reproducer for {{ case_id }}.

Kernel: {{ framework }} {{ module }}.{{ function }}   (FLA calling convention)
Run:    python repro.py       (from any directory; needs numpy, {{ framework }}, ml_dtypes and the kernel's module)
Prints rel_rms = ||x - oracle|| / ||oracle|| per tensor (the float64 oracle is in oracle.npz), then,
where the harness (parity) is importable, its verdict: both errors, the tolerance, the bound and the
rule that decided, over the seeds the bound was judged on. Exit 1 on a failure.
"""
import importlib
import json
import os
import sys

import ml_dtypes
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
MODULE_ROOT = {{ module_root }}   # the sys.path entry the harness imported the kernel's module from
HARNESS_ROOT = {{ harness_root }}   # the harness's checkout (for the verdict)
CASE = json.load(open(os.path.join(HERE, "case.json")))
SEEDS = json.load(open(os.path.join(HERE, "judge.json")))["seeds"]   # the case's own seed first
BF16 = {{ bf16 }}          # inputs stored as uint16 bits of bfloat16
GRAD_NAMES = {"q": "dq", "k": "dk", "v": "dv", "g": "dg", "g_gamma": "dg_gamma", "beta": "dbeta",
              "b": "db", "w": "dw", "initial_state": "dh0"}


def load_inputs(seed):
    name = "inputs.npz" if seed == SEEDS[0] else f"inputs-seed{seed}.npz"
    raw = dict(np.load(os.path.join(HERE, name)))
    return {n: (a.view(ml_dtypes.bfloat16) if n in BF16 else a) for n, a in raw.items()}


if MODULE_ROOT is not None and os.path.isdir(MODULE_ROOT):
    sys.path.insert(0, MODULE_ROOT)  # first: the module the harness ran, not another of its name
try:
    module = importlib.import_module("{{ module }}")
except ModuleNotFoundError as e:
    sys.exit(f"cannot import {{ module }} ({e}): run PYTHONPATH=<the directory that holds it> python repro.py")
fn = getattr(module, "{{ function }}")
x = load_inputs(SEEDS[0])
oracle = dict(np.load(os.path.join(HERE, "oracle.npz")))
diff_names = [n for n in ("q", "k", "v", "g", "g_gamma", "beta", "b", "w", "initial_state") if n in x]
kwargs = {"scale": {{ scale }}, "output_final_state": {{ ht }}}
{% if chunk_size %}kwargs["chunk_size"] = {{ chunk_size }}
{% endif %}
{% if stage %}
# a stage case: FLA's stage function called as FLA's op calls it (keyword arguments)
STAGE_INPUTS = {{ stage_inputs }}   # its tensor arguments; None where the case has none
STAGE_KWARGS = {{ stage_kwargs }}
STAGE_OUTPUTS = {{ stage_outputs }}   # what it returns, in order
{% endif %}
{% if framework == "jax" %}
import contextlib
import glob

if not (glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*")):
    os.environ.setdefault("JAX_PLATFORMS", "cpu")   # no TPU here: stay on the CPU
    if not any(name in os.environ for name in {{ tpu_slice_env }}):
        os.environ.update({{ compile_only_slice }})  # libtpu told it is one host: no start-up errors logged
import jax
import jax.numpy as jnp
from jax.experimental.pallas import tpu as pltpu

on_tpu = any(d.platform == "tpu" for d in jax.devices())
if not on_tpu:  # the matmuls as the TPU's MXU computes them (the harness's numerics model)
    import tpu_numerics
    tpu_numerics.activate("{{ numerics }}")


{% if stage %}
def run_kernel(x):
    """The stage function's outputs for inputs x (keyword arguments, FLA's names), as numpy arrays."""
    kw = {n: (jnp.asarray(x[n]) if n in x else None) for n in STAGE_INPUTS}
    kw.update(STAGE_KWARGS, cu_seqlens=jnp.asarray(x["cu_seqlens"], jnp.int32) if "cu_seqlens" in x else None)
    with (contextlib.nullcontext() if on_tpu else pltpu.force_tpu_interpret_mode()):
        out = fn(**kw)
    out = out if len(STAGE_OUTPUTS) > 1 else (out,)
    return {n: np.asarray(a) for n, a in zip(STAGE_OUTPUTS, out) if a is not None}
{% else %}
def run_kernel(x):
    """The kernel's outputs and gradients for inputs x, as numpy arrays in the kernel's dtypes."""
    kw = dict(kwargs)
    if "cu_seqlens" in x:
        kw["cu_seqlens"] = jnp.asarray(x["cu_seqlens"], jnp.int32)

    def f(d):
        o, ht = fn(d["q"], d["k"], d["v"], **{n: d[n] for n in diff_names[3:]}, **kw)
        return (o, ht) if kw["output_final_state"] else (o,)

    with (contextlib.nullcontext() if on_tpu else pltpu.force_tpu_interpret_mode()):
        d = {n: jnp.asarray(x[n]) for n in diff_names}
        if {{ backward }}:
            outs, vjp = jax.vjp(f, d)
            dht = (jnp.asarray(x["dht"], outs[1].dtype),) if len(outs) > 1 else ()
            cot = (jnp.asarray(x["do"], outs[0].dtype),) + dht
            (grads,) = vjp(cot)
        else:
            outs, grads = f(d), {}
    result = {"o": np.asarray(outs[0])}
    if len(outs) > 1:
        result["ht"] = np.asarray(outs[1])
    result.update({GRAD_NAMES[n]: np.asarray(g) for n, g in grads.items()})
    return result
{% endif %}
{% else %}
import torch
dev = "cuda" if torch.cuda.is_available() else "cpu"


def tt(a):
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16).to(dev)
    return torch.from_numpy(np.ascontiguousarray(a)).to(dev)


def npy(t):
    """A tensor as numpy in its own dtype (bfloat16 as ml_dtypes.bfloat16)."""
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.float().numpy().astype(ml_dtypes.bfloat16)
    return t.numpy()


{% if stage %}
def run_kernel(x):
    """The stage function's outputs for inputs x (keyword arguments, FLA's names), as numpy arrays."""
    kw = {n: (tt(x[n]) if n in x else None) for n in STAGE_INPUTS}
    kw.update(STAGE_KWARGS, cu_seqlens=None)
    if "cu_seqlens" in x:
        kw["cu_seqlens"] = torch.from_numpy(x["cu_seqlens"]).to(dev){{ ".long()" if cu_seqlens_int64 else "" }}
    with torch.no_grad():
        out = fn(**kw)
    out = out if len(STAGE_OUTPUTS) > 1 else (out,)
    return {n: npy(t) for n, t in zip(STAGE_OUTPUTS, out) if t is not None}
{% else %}
def run_kernel(x):
    """The kernel's outputs and gradients for inputs x, as numpy arrays in the kernel's dtypes."""
    kw = dict(kwargs)
    if "cu_seqlens" in x:
        kw["cu_seqlens"] = torch.from_numpy(x["cu_seqlens"]).to(dev){{ ".long()" if cu_seqlens_int64 else "" }}
    d = {n: tt(x[n]).requires_grad_({{ backward }}) for n in diff_names}
    o, ht = fn(d["q"], d["k"], d["v"], **{n: d[n] for n in diff_names[3:]}, **kw)
    if {{ backward }}:
        outs, cots = [o], [tt(x["do"]).to(o.dtype)]
        if kw["output_final_state"]:
            outs.append(ht)
            cots.append(tt(x["dht"]).to(ht.dtype))
        torch.autograd.backward(outs, cots)
    result = {"o": npy(o)}
    if kw["output_final_state"]:
        result["ht"] = npy(ht)
    result.update({GRAD_NAMES[n]: npy(t.grad) for n, t in d.items() if t.grad is not None})
    return result
{% endif %}
{% endif %}

result = run_kernel(x)
print(f"{CASE['id']}")
for name, ref in oracle.items():
    if name not in result:
        print(f"  {name:8s} not returned")
        continue
    got = np.asarray(result[name], np.float64)
    bad = int(np.sum(~np.isfinite(got)))
    err = np.linalg.norm(np.nan_to_num(got) - ref) / max(np.linalg.norm(ref), 1e-300)
    print(f"  {name:8s} rel_rms {err:.3e}  max_abs {np.max(np.abs(np.nan_to_num(got) - ref)):.3e}  non-finite {bad}")

# the verdict: the harness's own comparison, tolerance and bound (parity.repro.judge_bundle)
try:
    if HARNESS_ROOT not in sys.path:
        sys.path.append(HARNESS_ROOT)
    from parity.repro import judge_bundle
except ImportError as e:
    print(f"verdict: not judged here: the harness cannot be imported ({e}); the rel_rms above are the kernel's")
    sys.exit(0)
results = {SEEDS[0]: result}
for seed in SEEDS[1:]:
    results[seed] = run_kernel(load_inputs(seed))
sys.exit(judge_bundle(HERE, results))
''')


def write_repro(case: Case, spec, out: Path, reference: Path | None = None, run_reference: bool = False) -> Path:
    """Write the repro directory for `case` and the backend `spec` (a BackendSpec or its text:
    'pallas', 'pallas-fused', 'fla' or a candidate NAME=FRAMEWORK:MODULE:FUNCTION). The kernel,
    and the chunk size passed to it, are the backend's own `kernel_call(case)`: what the harness
    ran. The reference's record for the bound: from the run directory `reference`, else, with
    `run_reference`, from running it here beside the backend (`reference_run`); neither: the
    script judges the tolerance alone. ValueError when the backend has no standalone kernel for
    the case or the directory holds no reference record of it."""
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
    if call.framework == "jax":
        (out / "tpu_numerics.py").write_text(Path(tpu_numerics.__file__).read_text())
    script = SCRIPT.render(
        case_id=case.id,
        framework=call.framework,
        module=call.module,
        function=call.function,
        module_root=repr(module_root(call.module)),
        harness_root=repr(str(HARNESS_ROOT)),
        bf16=sorted(n for n, a in inputs.items() if a.dtype.name == "bfloat16"),
        scale=repr(case.scale),
        ht=case.ht,
        backward=case.backward,
        chunk_size=call.chunk_size,
        cu_seqlens_int64=call.cu_seqlens_int64,
        numerics=tpu_numerics.active(),
        tpu_slice_env=repr(TPU_SLICE_ENV),
        compile_only_slice=repr(COMPILE_ONLY_SLICE),
        **_stage_fields(case),
    )
    (out / "repro.py").write_text(script)
    return out / "repro.py"


def _stage_fields(case: Case) -> dict:
    """The template's fields of a stage case's call (stage_calling.call_kwargs, in the script)."""
    if case.stage is None:
        return {"stage": None}
    stage = stage_of(case.op, case.stage)
    inputs = stage_arguments(case)
    kwargs = stage_kwargs(case)
    return {
        "stage": case.stage,
        "stage_inputs": repr(inputs),
        "stage_kwargs": repr(kwargs),
        "stage_outputs": repr(stage.outputs),
    }


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
    further seeds; bfloat16 arrays stored as their uint16 bits."""
    own = None
    for seed in seeds:
        inputs = case_inputs(case.replace(seed=seed))
        own = inputs if own is None else own
        name = "inputs.npz" if seed == case.seed else f"inputs-seed{seed}.npz"
        np.savez(out / name, **{n: (a.view(np.uint16) if a.dtype.name == "bfloat16" else a) for n, a in inputs.items()})
    return own


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


class _Outputs:
    """A backend whose results are the tensors repro.py computed, per input seed."""

    def __init__(self, spec, results: dict[int, dict[str, np.ndarray]]):
        self.name, self.side, self.results = spec.name, spec.side, results

    def run(self, case: Case, inputs) -> Execution:
        got = self.results[case.seed]
        tensors = {n: np.asarray(got[n]) for n in case.output_names() if n in got}  # dtypes checked as the harness's
        absent = {n: "not returned by the kernel" for n in case.output_names() if n not in got}
        return Execution(tensors, "repro.py", "repro.py", {}, notes={"unsupported_tensors": absent} if absent else {})


def judge_bundle(bundle: str | Path, results: dict[int, dict[str, np.ndarray]]) -> int:
    """The harness's verdict on the outputs repro.py computed (`results`: seed -> tensor name ->
    array), printed: per tensor both errors, the tolerance, the bound and the rule, then the gate's
    lines and `verdict: WORD`. Returns the gate's exit status (0 pass, 1 fail, 2 refused)."""
    bundle = Path(bundle)
    meta = json.loads((bundle / "case.json").read_text())
    case = Case.from_dict({k: v for k, v in meta.items() if k != "input_hash"})
    judge = json.loads((bundle / "judge.json").read_text())
    spec, ref = as_spec(judge["spec"]), judge["reference"]
    seeds = (len(judge["seeds"]),) * 2  # exactly the bundle's seeds
    with tempfile.TemporaryDirectory() as tmp:
        records, _, _ = run_case(case, [spec], {spec: _Outputs(spec, results)}, Path(tmp), "repro", seeds=seeds)
    cand = records[0]
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
    print(f"over {seeds[0]} seed(s), bound factor {judge['bound_factor']}; {REFERENCE} ran on {ref.get('platform')}")
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
    return 0 if cand["verdict"] in ("pass", "unsupported") else 1


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
