"""The real TPU compiler on a machine without a TPU: compile a candidate's program for TPU targets.

`jax.export(..., platforms=["tpu"])` only lowers; Mosaic's own passes (layouts, matmul operand
types, VMEM limits) run when XLA:TPU compiles. With libtpu installed and `JAX_PLATFORMS=cpu`,
`jax.experimental.topologies.get_topology_desc` gives compile-only TPU devices: a program
lowered for one of them and compiled runs XLA:TPU and Mosaic for real, with no TPU attached
(nothing executes; a compile on CPU is a compile, not a run).

The target's compile-only device is the default device while the program is traced, lowered
and compiled (`jax.default_device`): Mosaic's own lowering (jnp.sign, 1-D blocks) and a kernel's
`pltpu.get_tpu_info()` at trace time ask the default device who it is, and must hear the target,
not this machine's CPU (parity.execute.tpu_identity).

For one case, candidate and target, `compile_case` compiles the case's program (the forward,
or forward and backward through jax.vjp: `parity.execute.backends.calling.jax_program`) and returns:
    ok, seconds, device_kind
    default_device         the default device while compiling, e.g. "tpu:TPU v5 lite (compile-only)"
    error, error_op        Mosaic's message in full and the MLIR operation it names
    vmem                   when it ran out of VMEM: the kernel, the buffers and sizes the compiler
                           names, and whether it fits the target's VMEM
                           (parity.execute.mosaic_llo.vmem_failure)
    kernels                the Mosaic kernels (pallas_call names) in the compiled TPU module
    memory                 XLA's memory analysis (argument, output, temp, code bytes)
    mosaic[kernel]         from Mosaic's lowered module (post-lower-to-llo, read by
                           parity.execute.mosaic_llo): vmem_bytes (the
                           kernel's VMEM operands, padded to their tiles: blocks and scratch),
                           weight_loads, and MXU matmul instructions by class:
                               bf16    bfloat16 operands, one pass
                               f32x1   float32 operands rounded to bfloat16, one pass
                               f32x6   float32 in six bfloat16 passes (HIGHEST)
    numerics               the same classes predicted by the TPU numerics model for each
                           kernel's dots (parity.measure.tpu_numerics), and every kernel where the
                           compiled module and the model disagree
    module_sha256          sha256 of the lowered module's text (StableHLO, the Mosaic kernels serialised
                           in it), what the compiler is given
    same_program_as        set instead of compiling: the backend of this case, in this run, whose
                           lowered module for this target had the same module_sha256 (same jax and
                           libtpu): its result is this one's (a mutant whose patch does not touch
                           the case's kernels compiles nothing new); `seconds` is then the trace
                           and lowering alone, and the numerics check is redone on this jaxpr
    reused                 set instead of compiling: {"from": when, "cache": path} of the harness's
                           compile cache ($PARITY_CACHE/tpu_compile) entry of the same lowered
                           module, target, libtpu, jax, LIBTPU_INIT_ARGS and Mosaic dump reader
                           (`compile_cache_key`): its compiled module's facts are this one's, judged
                           as for same_program_as; only modules that compiled and whose Mosaic
                           dumps were read are stored; --fresh (PARITY_FRESH=1) compiles again
    pallas                 each pallas_call of the traced program and its path as the code chose it
                           on the target's host (parity.execute.pallas_paths), and the cause when a
                           kernel is not a Mosaic kernel
    asked                  jax's platform questions the program asked while traced for the target,
                           answered as the target's host (parity.execute.tpu_identity.tpu_host)
A Pallas candidate whose compiled module holds no Mosaic kernel for every pallas_call fails, and
its error names which of three causes: no pallas_call in the program (plain XLA, or a library's
fallback), interpret=True (Pallas's generic interpreter), interpret=InterpretParams (TPU
interpret mode left on: bug class interpret-mode-left-on). `cost_analysis()` is not reported: it
is not meaningful for Mosaic custom calls.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from multiprocessing import util as mp_util
from pathlib import Path

from cases import Case
from parity.execute import compile_log, mosaic_llo, pallas_paths, tpu_identity, verified_cache
from parity.execute.backends.stage_calling import case_program
from parity.execute.mosaic_llo import (
    LloFormatError,
    is_vmem_error,
    model_matmuls,
    numerics_check,
    parse_llo,
    vmem_failure,
)
from parity.execute.stack_room import call_with_stack_room
from parity.measure import tpu_numerics
from parity.model.host import compile_only_slice, libtpu_version, tpu_attached
from parity.model.spec import Unsupported, as_spec
from parity.model.targets import TARGETS
from parity.records import (
    RecordError,
    base_record,
    check_compile,
    compile_repro_command,
    compile_verdict,
    read_checked,
    result_path,
    write_json,
)

DUMP_FLAG = "--xla_mosaic_dump_to"


# ------------------------------------------------------------------ libtpu set-up
@functools.cache
def _dump_dir() -> Path:
    """Where Mosaic writes its lowered modules in this process (the user's own --xla_mosaic_dump_to,
    or a temporary directory, removed when the process that made it exits; child processes
    inherit it); set in LIBTPU_INIT_ARGS before libtpu initialises."""
    args = os.environ.get("LIBTPU_INIT_ARGS", "")
    m = re.search(DUMP_FLAG + r"=(\S+)", args)
    if m:
        return Path(m.group(1))
    d = Path(tempfile.mkdtemp(prefix="parity-mosaic-"))
    # at exit, in a worker forked from the fork server too (it ends with os._exit: no atexit there)
    mp_util.Finalize(None, shutil.rmtree, (d,), {"ignore_errors": True}, exitpriority=0)
    os.environ["LIBTPU_INIT_ARGS"] = f"{args} {DUMP_FLAG}={d}".strip()
    return d


@functools.cache
def device(target: str):
    """A compile-only device of the target's topology."""
    _dump_dir()
    if not tpu_attached():
        # compile-only: several processes (parallel workers) may hold libtpu at once
        os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    compile_only_slice()  # before libtpu loads: no start-up errors about the slice a TPU host would be in
    from jax.experimental import topologies  # late: jax is heavy (runner imports this module)

    return topologies.get_topology_desc(topology_name=TARGETS[target], platform="tpu").devices[0]


# ------------------------------------------------------------------ the program
def compile_case(
    fn: Callable,
    case: Case,
    target: str,
    *,
    expect_mosaic: bool = True,
    compiled: dict[str, tuple[str, dict]] | None = None,
) -> dict:
    """Compile the case's program through fn for one TPU target (see the module docstring).
    `compiled`: module_sha256 -> (backend, its result) of modules this run already compiled for
    this target; a lowered module among them is not compiled again (same_program_as)."""

    def program_and_args(sharding):
        return case_program(case, fn, sharding)

    return compile_program(program_and_args, target, expect_mosaic=expect_mosaic, compiled=compiled)


def compile_program(
    program_and_args: Callable,
    target: str,
    *,
    expect_mosaic: bool = True,
    compiled: dict[str, tuple[str, dict]] | None = None,
) -> dict:
    """compile_case's result for any jax program: program_and_args(sharding) -> (program, args),
    args the program's positional arguments as ShapeDtypeStructs on `sharding` (the target's
    compile-only device). Used for cases (compile_case) and for kernels outside the registry
    (benchmarks/numerics_corpus.py)."""
    # tracing and lowering are deep Python: as fast at any depth of the caller
    return call_with_stack_room(
        _compile_program, program_and_args, target, expect_mosaic=expect_mosaic, compiled=compiled
    )


def _compile_program(program_and_args, target, *, expect_mosaic, compiled) -> dict:
    """compile_program's work (its docstring)."""
    # late: jax and kernels_jax.common.platform (which imports jax) are heavy; the runner imports this module
    import jax

    from kernels_jax.common.platform import compile_for_tpu

    t0 = time.perf_counter()
    out: dict = {"target": target, "topology": TARGETS[target], "ok": False}
    before: set[Path] = set()
    try:
        dev = device(target)
        out["device_kind"] = dev.device_kind
        program, args = program_and_args(jax.sharding.SingleDeviceSharding(dev))
        before = _dump_files()
        with (
            compile_for_tpu(),
            jax.default_device(dev),
            compile_log.for_tpu(),
            tpu_identity.tpu_host(target, [dev]) as host,
        ):
            out["default_device"] = _default_device()
            traced = jax.jit(program).trace(*args)
            out["pallas"] = pallas_paths.describe(pallas_paths.pallas_calls(traced.jaxpr), forced=False)
            out["asked"] = dict(sorted(host.asked.items()))
            lowered = traced.lower()
            out["module_sha256"] = hashlib.sha256(lowered.as_text().encode()).hexdigest()
            same = (compiled or {}).get(out["module_sha256"])
            if same is not None:
                return _same_program(out, same[1], traced, t0, expect_mosaic, same_program_as=same[0])
            cache_path, cache_key = _compile_cache_entry(target, out["module_sha256"])
            kept = verified_cache.lookup(cache_path, cache_key, f"TPU compile cache entry {cache_path} for {target}")
            if kept is not None:
                note = {"from": kept.meta["ran_at"], "cache": str(cache_path)}
                return _same_program(out, kept.meta["result"], traced, t0, expect_mosaic, reused=note)
            ran_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            executable = lowered.compile()
    except Exception as e:  # noqa: BLE001 - a compile error is this target's result
        out.update(seconds=time.perf_counter() - t0, **describe_error(e))
        new = _dump_files() - before
        if is_vmem_error(out["error"]):
            out["vmem"] = _vmem(out["error"], dev, new)
        _clear_dumps(new)
        return out
    out["seconds"] = time.perf_counter() - t0
    text = executable.as_text()
    out["kernels"] = mosaic_kernel_names(text)
    out["memory"] = _memory(executable)
    new = _dump_files() - before
    try:
        out["mosaic"] = _read_mosaic(new)
        if out["kernels"] and not out["mosaic"]:
            raise LloFormatError(
                f"no post-lower-to-llo module was written under {_dump_dir()} "
                f"(LIBTPU_INIT_ARGS={os.environ.get('LIBTPU_INIT_ARGS', '')!r})"
            )
        out["numerics"] = numerics_check(model_matmuls(traced.jaxpr), out["mosaic"])
        _store_compile(cache_path, cache_key, out, ran_at)
    except LloFormatError as e:
        out["numerics"] = {"error": f"{e} (libtpu {libtpu_version()})"}
    finally:
        _clear_dumps(new)
    return _judged(out, expect_mosaic)


def _judged(out: dict, expect_mosaic: bool) -> dict:
    """A module that compiled: ok, unless it claims to be a Pallas kernel and holds no Mosaic
    kernel, or not for every pallas_call of its program; the error names the cause read from the
    traced program (parity.execute.pallas_paths: no pallas_call, the generic interpreter, or TPU
    interpret mode left on)."""
    cause = (out.get("pallas") or {}).get("cause")
    if expect_mosaic and (cause or not out["kernels"]):
        out["error"] = (
            f"no Mosaic kernel in the compiled TPU module for every Pallas kernel: {cause or 'unknown cause'}"
        )
        out["error_line"] = out["error"][:300]
        out["error_op"] = None
        return out
    out["ok"] = True
    return out


def compile_cache_key(target: str, module_sha256: str) -> dict:
    """What a compile of a lowered module for `target` depends on: the module's sha256, the target
    and its topology, libtpu's and jax's versions and LIBTPU_INIT_ARGS (the Mosaic dump flag aside);
    and what reads the compiler's output into the result: parity.execute.mosaic_llo's source."""
    import jax  # late: heavy (runner imports this module)

    flags = re.sub(DUMP_FLAG + r"=\S+", "", os.environ.get("LIBTPU_INIT_ARGS", "")).split()
    return {
        "module_sha256": module_sha256,
        "target": target,
        "topology": TARGETS[target],
        "libtpu": libtpu_version(),
        "jax": jax.__version__,
        "libtpu_init_args": flags,
        "reader_sha256": hashlib.sha256(Path(mosaic_llo.__file__).read_bytes()).hexdigest(),
        "format": 1,
    }


def _compile_cache_entry(target: str, module_sha256: str) -> tuple[Path, str]:
    """(path, key) of the compile cache's entry for the module and target."""
    key = verified_cache.key_of(compile_cache_key(target, module_sha256))
    return verified_cache.cache_dir("tpu_compile") / f"{key}.npz", key


def _store_compile(path: Path, key: str, out: dict, ran_at: str) -> None:
    """Keep what the compiler made of the module (kernels, memory, mosaic, numerics) for a later run."""
    result = {k: out[k] for k in ("kernels", "memory", "mosaic", "numerics") if k in out}
    with contextlib.suppress(TypeError):  # not JSON as it is: not stored, compiled again next time
        verified_cache.write(path, key, {}, {"result": result, "ran_at": ran_at})


def _same_program(out: dict, result: dict, traced, t0: float, expect_mosaic: bool, **note) -> dict:
    """`out` given `result`, the same lowered module compiled before (note: same_program_as=backend,
    this run's, or reused={"from", "cache"}, the compile cache's): its compile error, or its compiled
    module judged for this candidate (expect_mosaic) with the numerics check redone on this
    program's own jaxpr against that compile's Mosaic modules."""
    out.update(**note, seconds=time.perf_counter() - t0)
    if "kernels" not in result:  # the compiler refused the module
        out.update({k: result[k] for k in ("error", "error_line", "error_op", "vmem") if k in result})
        return out
    out.update({k: result[k] for k in ("kernels", "memory", "mosaic", "numerics") if k in result})
    if out.get("mosaic"):
        out["numerics"] = numerics_check(model_matmuls(traced.jaxpr), out["mosaic"])
    return _judged(out, expect_mosaic)


def compiled_in_run(out_dir: Path, case_id: str, run_id: str, skip: str) -> dict[str, dict[str, tuple[str, dict]]]:
    """target -> module_sha256 -> (backend, result) of the modules compiled (not themselves
    reused) for `case_id` by run `run_id` under this jax and libtpu, from the compile records in
    `out_dir` (other than backend `skip`'s); an unreadable record is passed over."""
    import jax  # late: heavy (runner imports this module)

    found: dict[str, dict[str, tuple[str, dict]]] = {}
    for path in sorted(Path(out_dir).glob(f"*/{case_id}.compile.json")):
        try:
            rec = read_checked(path)
            check_compile(rec, path)
        except RecordError:
            continue
        if (rec["run_id"], rec.get("libtpu"), rec.get("jax")) != (run_id, libtpu_version(), jax.__version__):
            continue
        if rec["backend"] == skip or rec["case_id"] != case_id:
            continue
        for target, r in rec["targets"].items():
            if r.get("module_sha256") and not r.get("same_program_as"):
                found.setdefault(target, {}).setdefault(r["module_sha256"], (rec["backend"], r))
    return found


def _default_device() -> str:
    """The default device jax traces and compiles for now, e.g. 'tpu:TPU v5 lite (compile-only)'
    (a topology's devices are compile-only, TPU attached or not) or 'cpu:cpu'."""
    import jax  # late: heavy (runner imports this module)
    from jax._src import xla_bridge  # the real host's devices: jax.devices() answers as the target here

    d = jax.config.jax_default_device or xla_bridge.local_devices()[0]
    return f"{d.platform}:{d.device_kind}" + ("" if d in xla_bridge.devices() else " (compile-only)")


def _vmem(message: str, dev, dumps) -> dict:
    """mosaic_llo.vmem_failure of an out-of-VMEM compile, with Mosaic's dumps when it wrote them
    and the target's VMEM as get_tpu_info() states it for `dev`."""
    try:
        mosaic = _read_mosaic(dumps)
    except LloFormatError:
        mosaic = {}
    capacity = tpu_identity.tpu_info_for(dev).vmem_capacity_bytes
    return vmem_failure(message, mosaic, capacity, dev.device_kind)


def _read_mosaic(paths) -> dict:
    """{kernel: parse_llo's} of the post-lower-to-llo modules among paths."""
    return {
        name: info
        for path in sorted(paths)
        if path.name.endswith("post-lower-to-llo.txt")
        for name, info in [parse_llo(path.read_text())]
    }


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


# ------------------------------------------------------------------ records
def compile_record(
    case: Case, spec: str, backend: str, subject, targets, run_id: str, compiled=None, out_dir: Path | None = None
) -> dict:
    """The kind "compile" record of one case and candidate over the TPU targets (`compiled`:
    compiled_in_run's, modules not to compile again; `out_dir`: where its repro writes)."""
    import jax  # late: heavy (runner imports this module)

    program_case = dataclasses.replace(case, direction="fwd") if subject.forward_only else case
    results = {
        t: compile_case(
            subject.fn,
            program_case,
            t,
            expect_mosaic=subject.expect_mosaic,
            compiled=(compiled or {}).get(t),
        )
        for t in targets
    }
    rec = base_record(case, spec, backend, "candidate", "", run_id)
    rec.update(
        kind="compile",
        implementation=subject.implementation,
        repro=compile_repro_command(case.id, spec, targets, out_dir),
        program="fwd+bwd" if program_case.backward else "fwd",
        libtpu=libtpu_version(),
        jax=jax.__version__,
        numerics=tpu_numerics.active(),
        targets=results,
        verdict=compile_verdict(results),
    )
    return rec


def compile_for_targets(case: Case, spec, backend, targets, out_dir: Path, run_id: str) -> dict | None:
    """Compile a jax candidate's program for the TPU targets; write and return its compile
    record (None for a backend that compiles nothing for TPU, or has no kernel for the case).
    spec: a BackendSpec or its text."""
    if not targets or getattr(backend, "side", None) != "candidate" or not hasattr(backend, "compile_subject"):
        return None
    try:
        subject = backend.compile_subject(case)
    except Unsupported:
        return None
    spec = as_spec(spec)
    compiled = compiled_in_run(out_dir, case.id, run_id, spec.name)
    rec = compile_record(case, spec.text, spec.name, subject, targets, run_id, compiled, Path(out_dir))
    write_json(result_path(Path(out_dir), spec.name, case.id, kind="compile"), rec)
    return rec
