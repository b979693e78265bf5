"""Compile scan kernels for an sm_90 GPU on this CPU and print, as JSON, each one's scan operand
layout (the #blocked of its ttgir) and, where asked, its LLVM IR. Triton's front end and LLVM only:
no GPU, no ptxas. Run without TRITON_INTERPRET (tests/test_gpu_scan.py runs it in a subprocess):

    python -m tests.sm90_scans < specs.json

specs: a list of {"kernel": "scan_1d" | "scan_2d" | "fla_local_scalar" | "fla_local_vector" |
"fla_gla_bwd_inter", "num_warps": int, "constexprs": {...}, "types": {name: "*fp32", ...},
"llir": bool}; the pointers are taken 16-byte aligned, as torch allocates them.
"""

import json
import re
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

BLOCKED = re.compile(
    r"sizePerThread = \[([\d, ]+)\], threadsPerWarp = \[([\d, ]+)\], "
    r"warpsPerCTA = \[([\d, ]+)\], order = \[([\d, ]+)\]"
)


def kernel(name: str):
    if name.startswith("scan_"):
        from tests import scan_kernels

        return getattr(scan_kernels, name)
    if name == "fla_gla_bwd_inter":
        from fla.ops.gla.chunk import chunk_gla_bwd_kernel_inter as k
    else:
        from fla.ops.utils import cumsum

        k = {"fla_local_scalar": cumsum.chunk_local_cumsum_scalar_kernel,
             "fla_local_vector": cumsum.chunk_local_cumsum_vector_kernel}[name]  # fmt: skip
    while not isinstance(k, triton.runtime.jit.JITFunction):  # under autotune and heuristics
        k = k.fn
    return k


def scan_operand_layout(ttgir: str) -> list:
    """[sizePerThread, threadsPerWarp, warpsPerCTA, order] of the first tt.scan's operand."""
    scan = ttgir[ttgir.index('"tt.scan"') :]
    name = re.search(r"\}\) : \(tensor<[^,]+, (#\w+)>", scan).group(1)
    definition = re.search(rf"^{name} = .*$", ttgir, re.M).group(0)
    return [[int(v) for v in g.split(",")] for g in BLOCKED.search(definition).groups()]


def compile_spec(spec: dict) -> dict:
    fn = kernel(spec["kernel"])
    types = {n: spec["types"].get(n, "constexpr" if n in spec["constexprs"] else "i32") for n in fn.arg_names}
    aligned = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names) if types[n].startswith("*")}
    source = ASTSource(fn, types, spec["constexprs"], aligned)
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": spec["num_warps"]})
    return {
        "layout": scan_operand_layout(compiled.asm["ttgir"]),
        "llir": compiled.asm["llir"] if spec["llir"] else None,
    }


if __name__ == "__main__":
    print(json.dumps({"triton": triton.__version__, "results": [compile_spec(s) for s in json.load(sys.stdin)]}))
