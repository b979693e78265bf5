"""Mosaic's lowered module (its post-lower-to-llo dump) read, and checked against the numerics model.

`parse_llo` reads one kernel's dump: its VMEM operands (padded to their tiles), weight loads and
MXU matmul instructions by class (MATMUL_CLASSES); `model_matmuls` gives the classes the TPU
numerics model (parity.measure.tpu_numerics) computes each Pallas kernel's dots in, and
`numerics_check` compares the two per kernel. A dump this parser does not know raises
LloFormatError, never reads as a pass. `vmem_failure` reads a compile that ran out of VMEM: the
kernel, the buffers and sizes the compiler's message names, Mosaic's count of the kernel's VMEM
operands (from its dump, when one was written) and whether the kernel fits the target's VMEM.
Used by the compile check (parity.execute.tpu_compile).
"""

from __future__ import annotations

import re
from collections import Counter

from parity.measure import tpu_numerics

MATMUL_CLASSES = ("bf16", "f32x1", "f32x3", "f32x6")


# ------------------------------------------------------------------ Mosaic's lowered module
class LloFormatError(ValueError):
    """Mosaic's dump is not in the format this parser knows: never read as a pass."""


_ELEM_BYTES = {"f32": 4, "i32": 4, "bf16": 2, "f16": 2, "i16": 2, "i8": 1, "i1": 1, "f64": 8, "i64": 8}
_MATMUL = re.compile(r'llo\.vmatmul(?:\.\w+)*"\([^)]*\)\s*<\{([^}]*)\}')


def parse_llo(text: str) -> tuple[str, dict]:
    """(kernel name, {vmem_bytes, weight_loads, matmuls: {class: instructions}}) of one
    post-lower-to-llo module."""
    # the kernel is the module's first function (the index maps, transform_0..., follow it); MLIR
    # quotes a symbol name that is not an identifier: @"decoding_gdn-bt_8"
    m = re.search(r'func\.func @(?:"([^"]+)"|([\w.$]+))\(', text)
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
    return m.group(1) or m.group(2), {
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
    """{kernel name: {class: dots}}: each Pallas kernel's dots as the TPU numerics model computes
    them on the MXU (dots outside kernels are XLA's, not Mosaic's, and are not listed)."""
    out: dict[str, Counter] = {}
    for eqn in _walk(closed_jaxpr.jaxpr):
        if eqn.primitive.name != "pallas_call":
            continue
        counts = out.setdefault(tpu_numerics.kernel_name(eqn.params), Counter())
        for inner in _walk(eqn.params["jaxpr"]):
            if inner.primitive.name == "dot_general":
                a, b = (v.aval.dtype for v in inner.invars[:2])
                counts[tpu_numerics.dot_class(a, b, inner.params.get("precision"))] += 1
    return {k: dict(sorted(v.items())) for k, v in out.items()}


def _walk(jaxpr):
    from jax._src import core  # late: jax is heavy, only a compile needs it

    for eqn in jaxpr.eqns:
        yield eqn
        for sub in core.jaxprs_in_params(eqn.params):
            yield from _walk(sub)


def vector_unit(model: dict, compiled: dict) -> dict[str, list[str]]:
    """{kernel: [class, ...]}: the classes of a Pallas kernel's dots that its compiled module
    computes without the MXU (the model has dots of the class, Mosaic emitted no MXU matmul of
    it: the vector unit, in float32). Only kernels in both; decided per kernel and class (a
    kernel with two float32 DEFAULT dots, one on each unit, reads as both on the MXU)."""
    out = {}
    for name in sorted(set(model) & set(compiled)):
        got = set((compiled[name] or {}).get("matmuls") or {})
        off = sorted(set(model[name]) - got)
        if off:
            out[name] = off
    return out


def numerics_check(model: dict, compiled: dict) -> dict:
    """Per Pallas kernel, its dots' classes under the model (`model`: model_matmuls') vs the MXU
    classes in its compiled module (`compiled`: {kernel: parse_llo's}, Mosaic kernels only):
    `vector_unit` the classes the compile left to the vector unit (vector_unit(); computed in
    float32 by the model once decided), and the kernel agrees when every MXU class it was
    compiled to is one the model computes it in (dot counts differ from instruction counts by
    tiling, so sets are compared). A compiled MXU class the model has no dot of (a kernel
    the model has no dots for, or one it computes in another class) is a mismatch, and so is a
    kernel on one side only: names are Pallas kernel names on both sides (XLA's own fusions
    are not Mosaic kernels and are in neither)."""
    kernels, mismatches = {}, []
    off = vector_unit(model, compiled)
    for name in sorted(set(model) | set(compiled)):
        want = set(model.get(name) or {})
        got = set((compiled.get(name) or {}).get("matmuls") or {})
        agree = name in model and name in compiled and got <= want
        kernels[name] = {
            "model": model.get(name, {}),
            "compiled": (compiled.get(name) or {}).get("matmuls", {}),
            "vector_unit": off.get(name, []),
            "agree": agree,
        }
        if agree:
            continue
        if name not in compiled:
            why = "no compiled Mosaic kernel of this name"
        elif name not in model:
            why = "no Pallas kernel of this name in the program"
        else:
            why = f"compiled {sorted(got - want)} that the model has no dot of"
        mismatches.append(
            f"{name}: model {sorted(want) or 'no dots'}, compiled {sorted(got) or 'no MXU matmul'} ({why})"
        )
    return {"model": "tpu-mxu-v1", "kernels": kernels, "vector_unit": off, "mismatches": mismatches}


# ------------------------------------------------------------------ out of VMEM
_SIZE = r"([\d.]+)([KMG]?)B?"  # XLA's sizes: "128.00M" is 128 MiB
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def _bytes(number: str, unit: str) -> int:
    return round(float(number) * _UNITS[unit])


def _kernel(label: str) -> str:
    """The kernel's name in an XLA label ('jit(f)/my_kernel/pallas_call', 'my_kernel.1')."""
    m = re.search(r"([^/\s]+)/pallas_call", label)
    return m.group(1) if m else re.sub(r"\.\d+$", "", label.lstrip("%"))


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.2f} MiB"


def is_vmem_error(message: str) -> bool:
    return "RESOURCE_EXHAUSTED" in message and "vmem" in message.lower()


def vmem_failure(message: str, mosaic: dict, capacity: int, device_kind: str = "the target") -> dict:
    """A compile that ran out of VMEM (is_vmem_error), read from the compiler's message:
        kernel           the Pallas kernel it names
        needed_bytes     what the compiler says it needed (the program's VMEM, or the one
                         allocation or scoped area that failed; XLA's "M" figures are MiB to
                         two decimals), limit_bytes the limit it hit,
                         limit "capacity" (the TPU's VMEM) or "scoped limit" (vmem_limit_bytes
                         or XLA's default scoped limit, which CompilerParams can raise)
        buffers          [{kernel, bytes, what, shape, buffering}] as the message lists them
        mosaic_vmem_bytes  the kernel's VMEM operands (blocks once, scratch) in Mosaic's lowered
                         module, when its dump was written (mosaic: parse_llo's, by kernel)
        capacity_bytes   the target's VMEM per TensorCore as jax's get_tpu_info() states it
        fits             needed_bytes <= capacity_bytes (None when the message was not read)
        summary          one line
    Three messages are known (libtpu 0.0.42): "Used 256.00M of 128.00M vmem" with the largest
    allocations listed; "Scoped allocation with size 64.00M and limit 16.00M exceeded scoped vmem
    limit"; "Allocation (size=N) would exceed memory (size=N) :: #allocation [shape, size, tag]"."""
    needed, limit, kind, buffers = _vmem_message(message)
    kernel = buffers[0]["kernel"] if buffers else (next(iter(mosaic)) if len(mosaic) == 1 else None)
    operands = (mosaic.get(kernel) or {}).get("vmem_bytes")
    fits = None if needed is None else needed <= capacity
    if needed is None:
        summary = "out of VMEM, in a message this parser does not know: see the error"
    else:
        verdict = "does not fit at this configuration"
        if fits:
            verdict = "fits: raise vmem_limit_bytes (pltpu.CompilerParams)" if kind == "scoped limit" else "fits"
        summary = (
            f"kernel {kernel or '?'} needs {_mib(needed)} of VMEM (over the compiler's {kind} of {_mib(limit)}); "
            f"{device_kind} has {_mib(capacity)} (get_tpu_info): {verdict}"
        )
    return {
        "kernel": kernel,
        "needed_bytes": needed,
        "limit_bytes": limit,
        "limit": kind,
        "buffers": buffers,
        "mosaic_vmem_bytes": operands,
        "capacity_bytes": capacity,
        "fits": fits,
        "summary": summary,
    }


def _vmem_message(message: str) -> tuple[int | None, int | None, str | None, list[dict]]:
    """(needed_bytes, limit_bytes, limit, buffers) read from one of the three known out-of-VMEM
    messages (vmem_failure); (None, None, None, []) for a message of another form."""
    buffers, needed, limit, kind = [], None, None, None
    if m := re.search(rf"Used {_SIZE} of {_SIZE} vmem", message):
        needed, limit, kind = _bytes(*m.groups()[:2]), _bytes(*m.groups()[2:]), "capacity"
        for b in re.finditer(
            rf"Size: {_SIZE}\s+Operator: op_name=\"([^\"]*)\"\s+Shape: \S+\s+(?:Unpadded size: \S+\s+)?Tag: ([^\n]*)",
            message,
        ):
            tag = b.group(4)
            shape = re.search(r"window shape is (\w+\[[\d,]*\])", tag)
            levels = re.search(r"has (\d+) buffering levels", tag)
            buffers.append(
                {
                    "kernel": _kernel(b.group(3)),
                    "bytes": _bytes(b.group(1), b.group(2)),
                    "what": tag.split(". ")[0],
                    "shape": shape.group(1) if shape else None,
                    "buffering": int(levels.group(1)) if levels else None,
                }
            )
    elif m := re.search(rf"Scoped allocation with size {_SIZE} and limit {_SIZE} exceeded", message):
        needed, limit, kind = _bytes(*m.groups()[:2]), _bytes(*m.groups()[2:]), "scoped limit"
        label = re.search(r"allocating on stack for %\S+.*?op_name=\"([^\"]*)\"", message, re.S)
        if label:
            buffers.append({"kernel": _kernel(label.group(1)), "bytes": needed, "what": "scoped allocation"})
    elif m := re.search(r"Allocation \(size=(\d+)\) would exceed memory \(size=(\d+)\)", message):
        needed, limit, kind = int(m.group(1)), int(m.group(2)), "capacity"
        allocation = r"\[shape = '([^'{]*)[^']*', space=vmem, size = (0x[0-9a-fA-F]+),[^\]]*?tag = '([^']*)'\] :: (\S+)"
        for b in re.finditer(allocation, message):
            kernel, size = _kernel(b.group(4)), int(b.group(2), 16)
            buffers.append({"kernel": kernel, "bytes": size, "what": b.group(3), "shape": b.group(1)})
    return needed, limit, kind, buffers
