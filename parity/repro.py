"""`parity repro CASE_ID [--candidate SPEC | --backend pallas] -o DIR`: everything needed to
rerun one case outside the harness, for pasting into a kernel's own bug report.

DIR/inputs.npz   the case's inputs (bf16 stored as uint16 bits, see repro.py)
DIR/oracle.npz   the float64 oracle's outputs and gradients
DIR/case.json    the case
DIR/repro.py     a standalone script (numpy + jax or torch + the kernel's module; it does
                 not import this harness) that calls the kernel, takes gradients and prints
                 rel_rms per tensor against the oracle
DIR/tpu_numerics.py  (jax kernels) a copy of parity/measure/tpu_numerics.py: off a TPU the script
                 computes the kernel's matmuls under the same TPU numerics model as the
                 harness did, so it prints the epsilons the harness measured
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from jinja2 import Template

from cases import Case, input_hash, make_inputs
from parity.execute.backends import Unsupported, as_spec, make_backend
from parity.execute.backends.oracle import cached_oracle
from parity.measure import tpu_numerics

SCRIPT = Template('''\
"""Standalone reproducer for {{ case_id }}.

Kernel: {{ framework }} {{ module }}.{{ function }}   (FLA calling convention)
Run:    python repro.py       (from this directory; needs numpy, {{ framework }}, ml_dtypes and the kernel's module)
Prints rel_rms = ||x - oracle|| / ||oracle|| per tensor; the float64 oracle is in oracle.npz.
"""
import importlib
import json

import ml_dtypes
import numpy as np

CASE = json.load(open("case.json"))
BF16 = {{ bf16 }}          # inputs stored as uint16 bits of bfloat16
GRAD_NAMES = {"q": "dq", "k": "dk", "v": "dv", "g": "dg", "g_gamma": "dg_gamma", "beta": "dbeta",
              "b": "db", "w": "dw", "initial_state": "dh0"}

raw = dict(np.load("inputs.npz"))
x = {n: (a.view(ml_dtypes.bfloat16) if n in BF16 else a) for n, a in raw.items()}
oracle = dict(np.load("oracle.npz"))
fn = getattr(importlib.import_module("{{ module }}"), "{{ function }}")
diff_names = [n for n in ("q", "k", "v", "g", "g_gamma", "beta", "b", "w", "initial_state") if n in x]
kwargs = {"scale": {{ scale }}, "output_final_state": {{ ht }}}
if "cu_seqlens" in x:
    kwargs["cu_seqlens"] = x["cu_seqlens"]
{% if chunk_size %}kwargs["chunk_size"] = {{ chunk_size }}
{% endif %}
{% if framework == "jax" %}
import contextlib
import glob
import os

if not (glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*")):
    os.environ.setdefault("JAX_PLATFORMS", "cpu")   # no TPU here: stay on the CPU
import jax
import jax.numpy as jnp
from jax.experimental.pallas import tpu as pltpu

def f(d):
    o, ht = fn(d["q"], d["k"], d["v"], **{n: d[n] for n in diff_names[3:]}, **kwargs)
    return (o, ht) if kwargs["output_final_state"] else (o,)

if "cu_seqlens" in kwargs:
    kwargs["cu_seqlens"] = jnp.asarray(kwargs["cu_seqlens"], jnp.int32)
on_tpu = any(d.platform == "tpu" for d in jax.devices())
if not on_tpu:  # the matmuls as the TPU's MXU computes them (the harness's numerics model)
    import tpu_numerics
    tpu_numerics.activate("{{ numerics }}")
with (contextlib.nullcontext() if on_tpu else pltpu.force_tpu_interpret_mode()):
    d = {n: jnp.asarray(x[n]) for n in diff_names}
    if {{ backward }}:
        outs, vjp = jax.vjp(f, d)
        dht = (jnp.asarray(x["dht"], outs[1].dtype),) if len(outs) > 1 else ()
        cot = (jnp.asarray(x["do"], outs[0].dtype),) + dht
        (grads,) = vjp(cot)
    else:
        outs, grads = f(d), {}
result = {"o": np.asarray(outs[0], np.float64)}
if len(outs) > 1:
    result["ht"] = np.asarray(outs[1], np.float64)
result.update({GRAD_NAMES[n]: np.asarray(g, np.float64) for n, g in grads.items()})
{% else %}
import torch
dev = "cuda" if torch.cuda.is_available() else "cpu"
def tt(a):
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16).to(dev)
    return torch.from_numpy(np.ascontiguousarray(a)).to(dev)
d = {n: tt(x[n]).requires_grad_({{ backward }}) for n in diff_names}
if "cu_seqlens" in kwargs:
    kwargs["cu_seqlens"] = torch.from_numpy(kwargs["cu_seqlens"]).to(dev){{ ".long()" if cu_seqlens_int64 else "" }}
o, ht = fn(d["q"], d["k"], d["v"], **{n: d[n] for n in diff_names[3:]}, **kwargs)
if {{ backward }}:
    outs, cots = [o], [tt(x["do"]).to(o.dtype)]
    if kwargs["output_final_state"]:
        outs.append(ht)
        cots.append(tt(x["dht"]).to(ht.dtype))
    torch.autograd.backward(outs, cots)
result = {"o": o.detach().float().cpu().double().numpy()}
if kwargs["output_final_state"]:
    result["ht"] = ht.detach().float().cpu().double().numpy()
result.update({GRAD_NAMES[n]: t.grad.float().cpu().double().numpy() for n, t in d.items() if t.grad is not None})
{% endif %}
print(f"{CASE['id']}")
for name, ref in oracle.items():
    if name not in result:
        print(f"  {name:8s} not returned")
        continue
    got = result[name]
    bad = int(np.sum(~np.isfinite(got)))
    err = np.linalg.norm(np.nan_to_num(got) - ref) / max(np.linalg.norm(ref), 1e-300)
    print(f"  {name:8s} rel_rms {err:.3e}  max_abs {np.max(np.abs(np.nan_to_num(got) - ref)):.3e}  non-finite {bad}")
''')


def write_repro(case: Case, spec, out: Path) -> Path:
    """Write the repro directory for `case` and the backend `spec` (a BackendSpec or its text:
    'pallas', 'pallas-fused', 'fla' or a candidate NAME=FRAMEWORK:MODULE:FUNCTION). The kernel,
    and the chunk size passed to it, are the backend's own `kernel_call(case)`: what the harness
    ran. ValueError when the backend has no standalone kernel for the case."""
    backend = make_backend(as_spec(spec))
    try:
        call = backend.kernel_call(case)
    except Unsupported as e:
        raise ValueError(f"{backend.name} has no kernel for {case.id}: {e}") from None
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    inputs = make_inputs(case)
    bf16 = sorted(n for n, a in inputs.items() if a.dtype.name == "bfloat16")
    np.savez(out / "inputs.npz", **{n: (a.view(np.uint16) if n in bf16 else a) for n, a in inputs.items()})
    oracle = cached_oracle(case, inputs)[0]
    np.savez(out / "oracle.npz", **{n: oracle[n] for n in case.output_names()})
    (out / "case.json").write_text(
        json.dumps({"id": case.id, **case.to_dict(), "input_hash": input_hash(inputs)}, indent=1)
    )
    if call.framework == "jax":
        (out / "tpu_numerics.py").write_text(Path(tpu_numerics.__file__).read_text())
    script = SCRIPT.render(
        case_id=case.id,
        framework=call.framework,
        module=call.module,
        function=call.function,
        bf16=bf16,
        scale=repr(case.scale),
        ht=case.ht,
        backward=case.backward,
        chunk_size=call.chunk_size,
        cu_seqlens_int64=call.cu_seqlens_int64,
        numerics=tpu_numerics.active(),
    )
    (out / "repro.py").write_text(script)
    return out / "repro.py"
