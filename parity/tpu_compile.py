"""The real TPU compiler on a machine without a TPU: compile a candidate's program for TPU targets.

`jax.export(..., platforms=["tpu"])` only lowers; Mosaic's own passes (layouts, matmul operand
types, VMEM limits) run when XLA:TPU compiles. With libtpu installed and `JAX_PLATFORMS=cpu`,
`jax.experimental.topologies.get_topology_desc` gives compile-only TPU devices: a program
lowered for one of them and compiled runs XLA:TPU and Mosaic for real, with no TPU attached
(nothing executes; a compile on CPU is a compile, not a run).

For one case, candidate and target, `compile_case` compiles the case's program (the forward,
or forward and backward through jax.vjp: `parity.backends.calling.jax_program`) and returns:
    ok, seconds, device_kind
    error, error_op        Mosaic's message in full and the MLIR operation it names
    kernels                the Mosaic kernels (pallas_call names) in the compiled TPU module
    memory                 XLA's memory analysis (argument, output, temp, code bytes)
    mosaic[kernel]         from Mosaic's lowered module (post-lower-to-llo): vmem_bytes (the
                           kernel's VMEM operands, padded to their tiles: blocks and scratch),
                           weight_loads, and MXU matmul instructions by class:
                               bf16    bfloat16 operands, one pass
                               f32x1   float32 operands rounded to bfloat16, one pass
                               f32x6   float32 in six bfloat16 passes (HIGHEST)
    numerics               the same classes predicted by the TPU numerics model for each
                           kernel's dots (parity.tpu_numerics), and every kernel where the
                           compiled module and the model disagree
A Pallas candidate whose compiled module holds no Mosaic kernel (interpret mode left on,
seed 003) fails with that reason. `cost_analysis()` is not reported: it is not meaningful
for Mosaic custom calls.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import os
import re
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from cases import Case, input_shapes, storage_dtype

# short name -> topology (compile-only devices; device kinds "TPU v4", "TPU v5 lite", "TPU v5",
# "TPU v6 lite", "TPU7x")
TARGETS = {"v4": "v4:2x2x1", "v5e": "v5e:2x2", "v5p": "v5p:2x2x1", "v6e": "v6e:2x2", "tpu7x": "tpu7x:2x2x1"}
DEFAULT_TARGETS = ("v5e", "v6e", "tpu7x")
DUMP_FLAG = "--xla_mosaic_dump_to"
MATMUL_CLASSES = ("bf16", "f32x1", "f32x3", "f32x6")


def libtpu_version() -> str | None:
    try:
        return importlib.metadata.version("libtpu")
    except importlib.metadata.PackageNotFoundError:
        return None


def parse_targets(text: str | None) -> tuple[str, ...]:
    """'v5e,v6e' -> ('v5e', 'v6e'); 'none' or '' -> (); None -> the default for this machine."""
    if text is None:
        return default_targets()
    names = [t.strip() for t in text.split(",") if t.strip()]
    if names in ([], ["none"]):
        return ()
    bad = [t for t in names if t not in TARGETS]
    if bad:
        raise ValueError(
            f"--tpu-targets {text!r}: {bad[0]!r} is not a target: expected 'none' or a "
            f"comma-separated list of {list(TARGETS)}"
        )
    if libtpu_version() is None:
        raise ValueError(
            f"--tpu-targets {text!r}: libtpu is not installed (pip install 'jax[tpu]', "
            "the version jax pins), so nothing can compile for TPU here; use --tpu-targets none"
        )
    return tuple(dict.fromkeys(names))


def default_targets() -> tuple[str, ...]:
    """v5e, v6e and TPU7x where libtpu is installed and no TPU is attached; none otherwise (on a
    TPU the kernels compile for the TPU they run on)."""
    if libtpu_version() is None:
        return ()
    from kernels_jax.common.platform import on_tpu

    return () if on_tpu() else DEFAULT_TARGETS


# ------------------------------------------------------------------ libtpu set-up
@functools.cache
def _dump_dir() -> Path:
    """Where Mosaic writes its lowered modules in this process (the user's own --xla_mosaic_dump_to,
    or a temporary directory); set in LIBTPU_INIT_ARGS before libtpu initialises."""
    args = os.environ.get("LIBTPU_INIT_ARGS", "")
    m = re.search(DUMP_FLAG + r"=(\S+)", args)
    if m:
        return Path(m.group(1))
    d = Path(tempfile.mkdtemp(prefix="parity-mosaic-"))
    os.environ["LIBTPU_INIT_ARGS"] = f"{args} {DUMP_FLAG}={d}".strip()
    return d


@functools.cache
def device(target: str):
    """A compile-only device of the target's topology."""
    _dump_dir()
    from parity import tpu_attached

    if not tpu_attached():
        # compile-only: several processes (parallel workers) may hold libtpu at once
        os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies

    return topologies.get_topology_desc(topology_name=TARGETS[target], platform="tpu").devices[0]


# ------------------------------------------------------------------ the program
def program_structs(case: Case, fn: Callable, sharding):
    """(program, diff structs, cotangent structs) for fn on this case."""
    import jax

    from .backends.calling import cotangent_names, differentiable_inputs, jax_program

    shapes = input_shapes(case)
    struct = lambda n: jax.ShapeDtypeStruct(shapes[n], storage_dtype(case, n), sharding=sharding)
    diff = {n: struct(n) for n in differentiable_inputs(case, shapes)}
    cot = tuple(struct(n) for n in cotangent_names(case))
    return jax_program(fn, case), diff, cot


def compile_case(
    fn: Callable, case: Case, target: str, *, context: Callable = contextlib.nullcontext, expect_mosaic: bool = True
) -> dict:
    """Compile the case's program through fn for one TPU target (see the module docstring)."""
    import jax

    from kernels_jax.common.platform import compile_for_tpu

    t0 = time.perf_counter()
    out: dict = {"target": target, "topology": TARGETS[target], "ok": False}
    before: set[Path] = set()
    try:
        dev = device(target)
        out["device_kind"] = dev.device_kind
        program, diff, cot = program_structs(case, fn, jax.sharding.SingleDeviceSharding(dev))
        before = _dump_files()
        with context(), compile_for_tpu():
            traced = jax.jit(program).trace(diff, cot)
            lowered = traced.lower()
        compiled = lowered.compile()
    except Exception as e:  # noqa: BLE001 - a compile error is this target's result
        out.update(seconds=time.perf_counter() - t0, **describe_error(e))
        _clear_dumps(_dump_files() - before)
        return out
    out["seconds"] = time.perf_counter() - t0
    text = compiled.as_text()
    out["kernels"] = mosaic_kernel_names(text)
    out["memory"] = _memory(compiled)
    new = _dump_files() - before
    try:
        out["mosaic"] = {
            name: info
            for path in sorted(new)
            if path.name.endswith("post-lower-to-llo.txt")
            for name, info in [parse_llo(path.read_text())]
        }
        if out["kernels"] and not out["mosaic"]:
            raise LloFormatError(
                f"no post-lower-to-llo module was written under {_dump_dir()} "
                f"(LIBTPU_INIT_ARGS={os.environ.get('LIBTPU_INIT_ARGS', '')!r})"
            )
        out["numerics"] = numerics_check(model_matmuls(traced.jaxpr), out["mosaic"])
    except LloFormatError as e:
        out["numerics"] = {"error": f"{e} (libtpu {libtpu_version()})"}
    finally:
        _clear_dumps(new)
    if expect_mosaic and not out["kernels"]:
        out["error"] = (
            "no Mosaic kernel in the compiled TPU module: the Pallas kernel did not compile "
            "for TPU (interpret mode left on? seed 003)"
        )
        out["error_op"] = None
        return out
    out["ok"] = True
    return out


def describe_error(e: Exception) -> dict:
    """error (in full), error_line (one line for a terminal) and error_op (the MLIR operation
    Mosaic names, if any)."""
    msg = f"{type(e).__name__}: {e}"
    m = re.search(r"The MLIR operation involved:\s*\n\s*(.+)", msg)
    first = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
    return {"error": msg, "error_line": first[:300], "error_op": m.group(1).strip() if m else None}


def mosaic_kernel_names(hlo_text: str) -> list[str]:
    """Names of the Mosaic kernels (tpu_custom_call) in a compiled module, in order, once each."""
    names = []
    for line in hlo_text.splitlines():
        if 'custom_call_target="tpu_custom_call"' not in line:
            continue
        m = re.search(r'op_name="(?:[^"]*/)?([^"/]+)/pallas_call"', line)
        names.append(m.group(1) if m else "<unnamed>")
    return list(dict.fromkeys(names))


def _memory(compiled) -> dict:
    try:
        m = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 - not every backend exposes it
        return {}
    fields = ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes", "generated_code_size_in_bytes")
    return {f: int(getattr(m, f)) for f in fields if hasattr(m, f)}


def _dump_files() -> set[Path]:
    d = _dump_dir()
    return set(d.iterdir()) if d.exists() else set()


def _clear_dumps(paths) -> None:
    for p in paths:
        with contextlib.suppress(OSError):
            p.unlink()


# ------------------------------------------------------------------ Mosaic's lowered module
class LloFormatError(ValueError):
    """Mosaic's dump is not in the format this parser knows: never read as a pass."""


_ELEM_BYTES = {"f32": 4, "i32": 4, "bf16": 2, "f16": 2, "i16": 2, "i8": 1, "i1": 1, "f64": 8, "i64": 8}
_MATMUL = re.compile(r'llo\.vmatmul(?:\.\w+)*"\([^)]*\)\s*<\{([^}]*)\}')


def parse_llo(text: str) -> tuple[str, dict]:
    """(kernel name, {vmem_bytes, weight_loads, matmuls: {class: instructions}}) of one
    post-lower-to-llo module."""
    m = re.search(r"func\.func @([\w.$-]+)\(([^{]*?)\)\s*attributes", text, re.S) or re.search(
        r"func\.func @([\w.$-]+)\((.*?)\{", text, re.S
    )
    if not m:
        raise LloFormatError("no func.func in Mosaic's post-lower-to-llo module")
    head = text[m.start() : text.find("\n", m.end())]
    vmem = sum(
        _memref_bytes(shape, elem, tile)
        for shape, elem, tile in re.findall(
            r"memref<([\dx]+)x(\w+),\s*#tpu\.tiled<\(([\d,]+)\)[^>]*>,\s*#tpu\.memory_space<vmem>>", head
        )
    )
    classes: Counter = Counter()
    for attrs in _MATMUL.findall(text):
        fmt = re.search(r"matmul_data_format<(\w+)>", attrs)
        mode = re.search(r"matmul_mode<(\w+)>", attrs)
        if not (fmt and mode):
            raise LloFormatError(f"unrecognised llo.vmatmul attributes: {attrs[:200]}")
        classes[_matmul_class(fmt.group(1), mode.group(1))] += 1
    if "llo.vmatmul" in text and not classes:
        raise LloFormatError("llo.vmatmul present but none parsed")
    return m.group(1), {
        "vmem_bytes": vmem,
        "weight_loads": text.count('llo.vdwg"'),
        "matmuls": dict(sorted(classes.items())),
    }


def _matmul_class(data_format: str, mode: str) -> str:
    if data_format == "bf16":
        return "bf16"
    if data_format == "f32" and mode == "round":
        return "f32x1"
    if data_format == "f32" and mode in ("high", "low", "soft_low_eight", "soft_middle_eight"):
        return "f32x6"
    raise LloFormatError(f"unknown MXU matmul data_format={data_format} mode={mode}")


def _memref_bytes(shape: str, elem: str, tile: str) -> int:
    dims = [int(d) for d in shape.split("x")]
    tiles = [int(t) for t in tile.split(",")]
    for i, t in enumerate(reversed(tiles)):
        j = len(dims) - 1 - i
        if j >= 0:
            dims[j] = -(-dims[j] // t) * t
    n = 1
    for d in dims:
        n *= d
    if elem not in _ELEM_BYTES:
        raise LloFormatError(f"unknown element type {elem} in a VMEM memref")
    return n * _ELEM_BYTES[elem]


# ------------------------------------------------------------------ the model's side
def model_matmuls(closed_jaxpr) -> dict[str, dict[str, int]]:
    """{kernel name: {class: dots}}: each Pallas kernel's dots as the TPU numerics model
    computes them (dots outside kernels are XLA's, not Mosaic's, and are not listed)."""
    from jax._src.interpreters import mlir

    from . import tpu_numerics

    out: dict[str, Counter] = {}
    for eqn in _walk(closed_jaxpr.jaxpr):
        if eqn.primitive.name != "pallas_call":
            continue
        # the name Mosaic gives the kernel: pallas_call's name=, else the kernel function's
        name = mlir.sanitize_name(eqn.params["name"] or eqn.params["jaxpr"].debug_info.func_name)
        counts = out.setdefault(name, Counter())
        for inner in _walk(eqn.params["jaxpr"]):
            if inner.primitive.name == "dot_general":
                a, b = (v.aval.dtype for v in inner.invars[:2])
                n = tpu_numerics.passes(a, b, inner.params.get("precision"))
                counts[{0: "bf16", 1: "f32x1", 3: "f32x3", 6: "f32x6"}[n]] += 1
    return {k: dict(sorted(v.items())) for k, v in out.items()}


def _walk(jaxpr):
    from jax._src import core

    for eqn in jaxpr.eqns:
        yield eqn
        for sub in core.jaxprs_in_params(eqn.params):
            yield from _walk(sub)


def numerics_check(model: dict, compiled: dict) -> dict:
    """Per kernel: the classes the model uses for its dots vs the MXU classes Mosaic emitted.
    A kernel agrees when both use the same set of classes (dot counts differ from instruction
    counts by tiling, so sets are compared); a dot the model puts on the MXU that Mosaic
    computed elsewhere (the vector unit), or the reverse, is a mismatch."""
    kernels, mismatches = {}, []
    for name in sorted(set(model) | set(compiled)):
        want = set((model.get(name) or {}).keys())
        got = set(((compiled.get(name) or {}).get("matmuls") or {}).keys())
        agree = want == got
        kernels[name] = {
            "model": model.get(name, {}),
            "compiled": (compiled.get(name) or {}).get("matmuls", {}),
            "agree": agree,
        }
        if not agree:
            mismatches.append(f"{name}: model {sorted(want) or 'no dots'}, compiled {sorted(got) or 'no MXU matmul'}")
    return {"model": "tpu-mxu-v1", "kernels": kernels, "mismatches": mismatches}


# ------------------------------------------------------------------ records
def compile_record(case: Case, spec: str, backend: str, subject, targets, run_id: str) -> dict:
    """The kind "compile" record of one case and candidate over the TPU targets."""
    import jax

    from . import tpu_numerics
    from .records import base_record, compile_repro_command

    results = {
        t: compile_case(subject.fn, case, t, context=subject.context, expect_mosaic=subject.expect_mosaic)
        for t in targets
    }
    rec = base_record(case, spec, backend, "candidate", "", run_id)
    rec.update(
        kind="compile",
        implementation=subject.implementation,
        repro=compile_repro_command(case.id, spec, targets),
        program="fwd+bwd" if case.backward else "fwd",
        libtpu=libtpu_version(),
        jax=jax.__version__,
        numerics=tpu_numerics.active(),
        targets=results,
        verdict=compile_verdict(results),
    )
    return rec


def compile_verdict(results: dict) -> str:
    """compile-error when any target failed; numerics-mismatch when the compiled module's
    matmuls disagree with the numerics model (or could not be read); pass otherwise."""
    if any(not r["ok"] for r in results.values()):
        return "compile-error"
    if any(
        r.get("numerics", {}).get("mismatches") or "error" in r.get("numerics", {"error": "missing"})
        for r in results.values()
    ):
        return "numerics-mismatch"
    return "pass"


# ------------------------------------------------------------------ many cases (`parity compile`)
def _compile_task(case_dict: dict, spec: str, targets: tuple[str, ...], out_dir: str, run_id: str) -> dict | None:
    from .runner import compile_for_targets

    return compile_for_targets(Case.from_dict(case_dict), spec, _backend(spec), targets, Path(out_dir), run_id)


@functools.cache
def _backend(spec: str):
    """One backend per spec and process."""
    from .backends import make_backend

    return make_backend(spec)


def compile_suite(
    cases: list[Case], specs: list[str], targets: tuple[str, ...], out_dir: Path, jobs: int = 1
) -> list[dict]:
    """Compile every (case, candidate) for the targets in `jobs` spawned processes; the compile
    records (also written under out_dir), in case order. Nothing executes."""
    import concurrent.futures as cf
    import multiprocessing as mp
    import uuid

    from .backends import Unsupported, backend_name
    from .manifest import write_manifest

    run_id = "compile-" + uuid.uuid4().hex[:10]
    # what is meant to be compiled, written before anything compiles (the gate refuses what is missing)
    expected = []
    for spec in specs:
        backend = _backend(spec)
        for c in cases:
            try:
                backend.compile_subject(c)
            except Unsupported:
                continue
            expected.append((c.id, backend_name(spec)))
    write_manifest(
        out_dir,
        run_id,
        "parity compile",
        [c.id for c in cases],
        [backend_name(s) for s in specs],
        tpu_targets=targets,
        compiles=expected,
    )
    tasks = [(c.to_dict(), s, tuple(targets), str(out_dir), run_id) for c in cases for s in specs]
    if jobs <= 1:
        done = [_compile_task(*t) for t in tasks]
    else:
        with cf.ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn")) as pool:
            done = list(pool.map(_compile_task, *zip(*tasks)))
    return [r for r in done if r is not None]


def format_compile_table(records: list[dict], verbose: bool = False) -> str:
    """One line per (case, candidate): ok or the first error per target; with verbose, each
    kernel's MXU matmul classes per target and whether the numerics model agrees."""
    from .gate import compile_problems

    lines = []
    for r in records:
        cells = "  ".join(
            f"{t}:{'ok' if x['ok'] else 'ERROR'}({x.get('seconds', 0):.1f}s)" for t, x in r["targets"].items()
        )
        lines.append(f"{r['case_id']} [{r['backend']}] {r['verdict']}  {cells}")
        lines += [f"    {p}" for p in compile_problems(r)]
        if verbose:
            for t, x in r["targets"].items():
                for kernel, k in (x.get("mosaic") or {}).items():
                    agree = (x.get("numerics", {}).get("kernels", {}).get(kernel) or {}).get("agree")
                    lines.append(
                        f"    {t} {kernel}: vmem {k['vmem_bytes'] / 1024:.0f} KiB, weight loads "
                        f"{k['weight_loads']}, matmuls {k['matmuls'] or 'none'}; model "
                        f"{'agrees' if agree else 'DISAGREES'}"
                    )
    return "\n".join(lines)
