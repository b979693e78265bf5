"""Run unmodified Triton kernels (FLA's) on a CPU through Triton's interpreter.

`TRITON_INTERPRET=1` makes `triton.jit` build interpreted kernels, but alone it neither runs
FLA's kernels nor computes the numbers an H100 computes (1.-3. and 7. below).
`enable()` handles 2., 3. and 7. by patching the imported triton classes at run time; no
installed file is modified (and makes FLA take an H100's tiles, 4., and the interpreter faster,
5. and 6.); 1. is parity.execute.backends.fla_launches's, the same as on a GPU.
The patches work under Triton 3.6, 3.7 and 3.9 (3.6.0: torch 2.11's; 3.7.1: torch 2.12.1's; 3.9.0: the newest), with
the same bits (tests/test_triton_versions.py); what 3.6 and 3.7 need besides is in 1. and 3.:

1. Autotuning benchmarks every config, which needs a GPU driver. The interpreter times none:
   each autotuned kernel runs the config parity.execute.backends.fla_configs chooses for its
   key (a pinned config, a config table's, or the rule, as on a GPU), put in the autotuner's
   cache before Triton's run looks (fla_launches.install), so Triton 3.6, 3.7 and 3.9 alike
   take it without benchmarking. The rule's block sizes that change no bit (NEUTRAL_PARAMS)
   take their largest values, since the interpreter's time is per program instance
   (tests/test_fla_backend.py compares the outputs bit for bit).
2. A plain Python `range` (and `tl.range`) loop variable is a tensor in a compiled kernel
   (FLA calls `i_t.to(tl.int64)` on it) but an int in the interpreter. Kernel sources are
   rewritten so those loops yield interpreter int32 scalars.
3. The interpreter stores bfloat16 as raw uint16 bits and its numpy ops compute on the
   bits (a bf16 dot multiplies integers). Every arithmetic, comparison, dot, fma, cast,
   reduction and scan with a bfloat16 operand is made to widen to float32, compute, and round to nearest even
   back to bfloat16, as the GPU does. And as on the GPU, a float32 `tl.dot` with the
   default input precision ("tf32", which FLA's kernels use) rounds its operands to
   TF32 (10 mantissa bits; by truncation, see TF32_ROUNDING); "ieee" and "tf32x3" dots keep
   float32 operands. Every floating-point dot accumulates in float32 by one fused multiply-add
   per k in a fixed order (fixed_order_dot), never through numpy's BLAS, whose summation order
   follows the processor's BLAS kernel and the block shape: FLA's interpreted bits are the same
   under any BLAS kernel (OPENBLAS_CORETYPE), and a config's block shape changes no bit.
   Triton 3.6 and 3.7's interpreter has no bf16 scalar constant (get_bf16), rounds fma twice and
   lets a NaN operand through tl.minimum / tl.maximum / tl.clamp, which 3.9 and the GPU do not:
   there those are computed as in 3.9 (_patch_builder_as_in_triton_3_9).
4. FLA sizes its tiles and autotune config lists at import from the GPU's shared memory: on
   a CPU its probe finds no GPU, and FLA takes the tiles of the smallest GPU (BK 16, 32-wide
   chunk tiles), which no H100 runs. `request()` makes the probe answer as an H100 does
   (parity.model.gpu), so FLA takes an H100's tiles (BK 32 or 64, 128-wide tiles: its sums
   over K in the H100's blocks, and 4-16x fewer program instances to interpret). FLA's other
   probes (IS_NVIDIA_HOPPER: warps, Hopper-only backends) stay a CPU's.
5. Speed: every call of a `@triton.jit` helper from inside a kernel re-patches
   triton.language for the interpreter (inspect.getmembers over tl, tl.core, tl.math, ...),
   although the kernel's launch has patched it already and restores it when it ends: on
   kda-fwdbwd-B2-T128-H2-K64-V64-fp32-C64-g_stress-h0-ht 17,504 such calls took 25 s of
   FLA's 94 s (cProfile). A helper whose language modules the launch has patched skips it;
   what the kernel computes is the same (the same patched functions are in place).
6. Speed: two of triton's front-end steps, run at every interpreted operation, take their
   shortcut where the answer is known (`_patch_front_end`): the numpy dtype of a triton type
   (triton builds a 17-entry dict per call) is remembered per scalar type, and broadcasting two
   blocks of one shape, or two scalars, returns them as they are, as triton's own code does
   after comparing them dimension by dimension. kda-fwdbwd-B2-T128-H2-K64-V64-bf16-C128-g_logsig-h0:
   about 15% less CPU time; the same bits (tests/test_fla_backend.py). And the types every
   operation makes are made once: a block type per (element type, shape) (interned: a type is a
   value), a tensor's numel and shape constexprs per type (they depend on nothing else); a
   bfloat16 operand is told by its type's name (triton's dtype equality compares names); 5.'s
   language modules of a helper's module are found once (again when its globals change in
   number). kda-fwdbwd-B2-T128-H2-K64-V64-fp32-C64-g_stress-h0-ht 8.1 s -> 4.9 s of CPU, gla's
   K256/V512 case 3.0 -> 1.95 s; the ci and stages suites' FLA runs (`--seeds 2:2 -j 2`) 142 -> 95 s
   and 40 -> 33 s on 2 cores, every one of their 575 tensors' errors the same to the last bit.
7. `tl.cumsum` and `tl.cumprod` (and `tl.associative_scan` with their combine functions) combine
   in the order of Triton's GPU lowering of the scan, for the layout Triton gives the operand on
   sm_90 (parity.execute.backends.gpu_scan); numpy's cumsum adds sequentially, and FLA's g_cumsum
   came out with up to twice the GPU's error (H200). The layout follows the launch's num_warps
   and, for the kernels in SCAN_VECTOR_WIDTH, the vector width Triton's coalescing gives them
   (read from their ttgir); a scan with any other combine function stays sequential.
"""

from __future__ import annotations

import ast
import builtins
import functools
import os

import numpy as np

from parity.execute.backends import gpu_scan
from parity.model import gpu

_enabled = False
# How a float32 dot operand becomes TF32 (env PARITY_TF32_ROUNDING): "truncate" (the tensor
# cores read the top 19 bits of operands loaded as float32; measured on an H100, FLA fp32
# error through the interpreter matches CUDA this way) or "nearest" (even; what a TMA load
# through a TF32 tensor map does).
TF32_ROUNDING = os.environ.get("PARITY_TF32_ROUNDING", "truncate")


def to_tf32(x: np.ndarray) -> np.ndarray:
    """float32 -> the TF32 value (10 mantissa bits) kept in float32; Inf and NaN unchanged."""
    x = np.asarray(x, dtype=np.float32)
    bits = x.view(np.uint32)
    if TF32_ROUNDING == "nearest":
        bits = bits + ((bits >> np.uint32(13)) & np.uint32(1)) + np.uint32(0x00000FFF)
    elif TF32_ROUNDING != "truncate":
        raise ValueError(f"PARITY_TF32_ROUNDING={TF32_ROUNDING!r}: expected 'truncate' or 'nearest'")
    special = (x.view(np.uint32) & np.uint32(0x7F800000)) == np.uint32(0x7F800000)
    return np.where(special, x, (bits & np.uint32(0xFFFFE000)).view(np.float32))


def what_the_bits_depend_on() -> str:
    """What FLA's interpreted bits depend on besides the inputs, the chunk size and the recorded
    versions, in one line: not the BLAS kernel (fixed_order_dot), but numpy's elementwise
    functions (exp, log, ...), which numpy computes with the SIMD code of the processor's features
    (measured: with AVX-512 disabled, NPY_DISABLE_CPU_FEATURES="X86_V4 AVX512_ICL AVX512_SPR",
    FLA's gla and kda outputs changed in their last bits)."""
    simd = np.__config__.CONFIG.get("SIMD Extensions", {})
    found = ", ".join(simd.get("found", [])) or "none"
    return (
        "the same under any BLAS kernel (dots accumulated in a fixed order); numpy's elementwise functions "
        f"(exp, log, ...) by its SIMD code for {found} (baseline {', '.join(simd.get('baseline', []))}): "
        "a processor with other SIMD features can change last bits"
    )


def numerics() -> str:
    """The emulation's tag, FLA's record's `numerics` in the interpreter (a change of what the
    emulation computes changes its version: v4)."""
    return (
        f"triton-interpreter-gpu-v4 (tf32 {TF32_ROUNDING}, bf16 rne, "
        "fixed-order fp32 dots, sm_90 scan order, H100 tiles)"
    )


def request() -> None:
    """Ask for interpreted kernels with an H100's tiles (4.): must happen before the kernels'
    modules are imported."""
    gpu.interpret_as_an_h100()


def interpreting_fla() -> bool:
    """False when some already-imported fla kernel was built for a GPU (compiled mode)."""
    import sys

    from triton.runtime.jit import JITFunction

    for name, module in list(sys.modules.items()):
        if not name.startswith("fla.") or module is None:
            continue
        for obj in vars(module).values():
            while hasattr(obj, "fn") and not isinstance(obj, JITFunction):
                obj = obj.fn
            if type(obj) is JITFunction:  # Gluon kernels (a subclass) are never interpreted
                return False
    return True


def enable() -> None:
    """Request the interpreter and install the fixes and speed-ups 1.-3. and 5.-7. (idempotent)."""
    global _enabled
    request()
    if _enabled:
        return
    from triton.runtime import interpreter

    _patch_range(interpreter)
    _patch_builder_as_in_triton_3_9(interpreter)
    _patch_scan_order(interpreter)  # before 3., whose bfloat16 wrapper wraps the scans installed here
    _patch_bfloat16(interpreter)
    _patch_lang_once_per_launch(interpreter)
    _patch_front_end(interpreter)
    _enabled = True


# 2. range loop variables -----------------------------------------------------------------

RANGE_NAME = "_parity_tensor_range"


def _patch_range(interpreter) -> None:
    import triton.language as tl

    def tensor_range(*args, **kwargs):
        """range(...) yielding interpreter int32 scalars; extra tl.range kwargs are hints."""
        step = kwargs.get("step")
        ints = [int(a.handle.data.item()) if hasattr(a, "handle") else int(a) for a in args]
        if step is not None:
            ints.append(int(step.handle.data.item()) if hasattr(step, "handle") else int(step))
        for i in range(*ints):
            yield tl.tensor(interpreter.TensorHandle(np.array([i], dtype=np.int32), tl.int32), tl.int32)

    class RangeToTensor(interpreter.ASTTransformer):
        def visit_Call(self, node):
            node = self.generic_visit(node)
            f = node.func
            is_range = (isinstance(f, ast.Name) and f.id == "range") or (
                isinstance(f, ast.Attribute)
                and f.attr == "range"
                and isinstance(f.value, ast.Name)
                and f.value.id in ("tl", "triton")
            )
            if is_range:
                node.func = ast.copy_location(ast.Name(id=RANGE_NAME, ctx=ast.Load()), f)
            return node

    # FunctionRewriter copies the interpreter module's globals into each kernel's globals.
    setattr(interpreter, RANGE_NAME, tensor_range)
    interpreter.FunctionRewriter.ast_transformer = RangeToTensor()
    interpreter.InterpretedFunction.rewritten_fn.clear()


# 3. bfloat16 arithmetic ------------------------------------------------------------------


def fused_fma32(x: np.ndarray, y: np.ndarray, z: np.ndarray) -> np.ndarray:
    """x * y + z in float32 rounded once (to nearest even), as the GPU's fma.rn.f32 and Triton
    3.9's interpreter (its C++ fma_fp32) compute it. The product is exact in float64 (24 + 24
    bits); the float64 sum is rounded to odd (TwoSum gives its exact error; an inexact sum with
    an even last bit moves one ulp towards the exact value), and a float64 rounded to odd rounds
    to float32 correctly (53 >= 24 + 2 bits): no double rounding."""
    x, y, z = np.broadcast_arrays(*(np.asarray(a, np.float32) for a in (x, y, z)))
    p = x.astype(np.float64) * y.astype(np.float64)
    z64 = z.astype(np.float64)
    s = p + z64
    b = s - p
    e = (p - (s - b)) + (z64 - b)  # s + e == p + z exactly
    even = (s.view(np.uint64) & np.uint64(1)) == 0
    s = np.where((e != 0) & even & np.isfinite(s), np.nextafter(s, np.where(e > 0, np.inf, -np.inf)), s)
    return s.astype(np.float32)


def _patch_builder_as_in_triton_3_9(interpreter) -> None:
    """Where the installed InterpreterBuilder lacks what Triton 3.9's computes as the GPU does,
    the same computation (each checked on the builder itself; Triton 3.9 takes none of them,
    3.6 and 3.7 all four):
    - get_bf16, a bfloat16 scalar constant (`b_x * 0.5` with b_x bf16, in FLA's backward
      kernels): 3.6 and 3.7's semantic asks the builder for it and their builder has none
      (AttributeError). Added as 3.9 has it: the float32 constant through create_fp_trunc,
      which cast_impl rounds to nearest even.
    - create_fma: 3.6 and 3.7 compute x * y + z with numpy, rounding twice; the GPU's fma (and
      3.9's, through triton's C++ fma_fp32) rounds once. Where triton has no fma_fp32: float32
      by fused_fma32, float16 as 3.9 computes it (float64 product and sum, then float16); a
      float64 fma stays the builder's own, rounded twice (numpy has no float64 fma; no FLA
      kernel here has one).
    - create_minnumf / create_maxnumf (tl.minimum / tl.maximum, propagate_nan NONE): 3.6 and
      3.7 use np.minimum / np.maximum, which return NaN where one operand is NaN; the GPU's
      min.f32 / max.f32 (and 3.9: np.fmin / np.fmax) return the other operand.
    - create_clampf with propagate_nan NONE: 3.6 and 3.7 np.clip (NaN stays NaN); 3.9, as the
      GPU's maxnum then minnum, np.fmax then np.fmin (a NaN becomes the lower bound)."""
    import triton.language as tl

    Builder, TensorHandle = interpreter.InterpreterBuilder, interpreter.TensorHandle
    if not hasattr(Builder, "get_bf16"):
        Builder.get_bf16 = lambda self, value: self.create_fp_trunc(self.get_fp32(value), tl.bfloat16)
    if not hasattr(interpreter._interpreter, "fma_fp32"):
        own_fma = Builder.create_fma

        def create_fma(self, x, y, z):
            if z.data.dtype == np.float32:
                return TensorHandle(fused_fma32(x.data, y.data, z.data), z.dtype.scalar)
            if z.data.dtype == np.float64:
                return own_fma(self, x, y, z)
            product = np.multiply(x.data, y.data, dtype=np.float64)
            return TensorHandle(np.add(product, z.data, dtype=np.float64).astype(z.data.dtype), z.dtype.scalar)

        Builder.create_fma = create_fma
    builder = Builder()
    nan, zero, one = (TensorHandle(np.array([v], np.float32), tl.float32) for v in (np.nan, 0.0, 1.0))
    if np.isnan(builder.create_minnumf(nan, one).data[0]):
        Builder.create_minnumf = lambda self, lhs, rhs: self.binary_op(lhs, rhs, np.fmin)
        Builder.create_maxnumf = lambda self, lhs, rhs: self.binary_op(lhs, rhs, np.fmax)
    if np.isnan(builder.create_clampf(nan, zero, one, tl.PropagateNan.NONE).data[0]):
        own_clamp = Builder.create_clampf

        def create_clampf(self, arg, lo, hi, propagate_nans):
            if propagate_nans == tl.PropagateNan.NONE:
                return self.binary_op(self.binary_op(arg, lo, np.fmax), hi, np.fmin)
            return own_clamp(self, arg, lo, hi, propagate_nans)

        Builder.create_clampf = create_clampf


class _Bfloat16:
    """The interpreter's bfloat16 handles (raw uint16 bits) as float32 values and back."""

    def __init__(self, interpreter):
        import ml_dtypes
        import triton.language as tl

        self.tl = tl
        self.TensorHandle = interpreter.TensorHandle
        self.np_bfloat16 = np.dtype(ml_dtypes.bfloat16)

    def is_bf16(self, h) -> bool:
        return h is not None and h.dtype.scalar.name == "bf16"  # triton's dtype equality, by name

    def widen(self, h):
        """bfloat16 bits -> the float32 handle of their value; others unchanged."""
        if not self.is_bf16(h):
            return h
        f32 = (h.data.astype(np.uint32) << np.uint32(16)).view(np.float32)
        return self.TensorHandle(f32, self.tl.float32)

    def narrow(self, h):
        """float32 result -> bfloat16 bits (round to nearest even); others unchanged."""
        if h.data.dtype != np.float32:
            return h
        bits = np.asarray(h.data, np.float32).astype(self.np_bfloat16).view(np.uint16)
        return self.TensorHandle(bits, self.tl.bfloat16)


def _patch_bfloat16(interpreter) -> None:
    bf16 = _Bfloat16(interpreter)
    Builder = interpreter.InterpreterBuilder
    _patch_bf16_elementwise(Builder, bf16)
    _patch_dot(Builder, bf16)
    _patch_bf16_cast(Builder, bf16)
    _patch_bf16_reductions(interpreter, bf16)


def _patch_bf16_elementwise(Builder, bf16: _Bfloat16) -> None:
    """Arithmetic, comparisons, fma, rsqrt, erf and where() on bf16 operands compute on float32 values."""
    TensorHandle = bf16.TensorHandle

    def on_values(method):
        """Wrap a builder method so bf16 operands are computed on as float32 values."""

        @functools.wraps(method)
        def wrapped(self, *args):
            if not any(isinstance(a, TensorHandle) and bf16.is_bf16(a) for a in args):
                return method(self, *args)
            out = method(self, *[bf16.widen(a) if isinstance(a, TensorHandle) else a for a in args])
            return bf16.narrow(out)

        return wrapped

    Builder.binary_op = on_values(Builder.binary_op)
    Builder.unary_op = on_values(Builder.unary_op)
    Builder.create_fma = on_values(Builder.create_fma)
    Builder.create_rsqrt = on_values(Builder.create_rsqrt)
    Builder.create_erf = on_values(Builder.create_erf)

    original_ternary = Builder.ternary_op

    def ternary_op(self, lhs, rhs, other, op):
        if op is np.where and bf16.is_bf16(rhs) == bf16.is_bf16(other):
            return original_ternary(self, lhs, rhs, other, op)  # selecting bits is exact
        args = [bf16.widen(x) for x in (lhs, rhs, other)]
        out = original_ternary(self, *args, op)
        return bf16.narrow(out) if any(bf16.is_bf16(x) for x in (rhs, other)) else out

    Builder.ternary_op = ternary_op


def fixed_order_dot(a: np.ndarray, b: np.ndarray, d: np.ndarray) -> np.ndarray:
    """a @ b + d for a [M, K], b [K, N], d [M, N] (float32 or float16 values), in d's dtype, as
    a GPU's dot accumulates: from zero, one fused multiply-add per k in the order k = 0, 1, ...,
    K - 1, each rounded to d's dtype (the exact product plus the accumulator, formed in float64),
    then d added (as triton's interpreter adds the accumulator after the product). Every element
    depends on its row of a, its column of b and its d alone, in a fixed order: the same bits
    whatever BLAS numpy uses, on any CPU, and whatever block shape the kernel's config gives the
    dot (np.matmul's sum order follows the BLAS kernel the processor gets and the block shape)."""
    products = a.astype(np.float64).T[:, :, None] * b.astype(np.float64)[:, None, :]  # [K, M, N], exact
    acc = np.zeros(d.shape, d.dtype)
    for p in products:  # the accumulator + the exact product in float64, rounded once into acc
        np.add(acc, p, out=acc, casting="unsafe")
    return acc + d


def _patch_dot(Builder, bf16: _Bfloat16) -> None:
    """tl.dot as on the GPU: float32 operands of a "tf32" dot rounded to TF32 (to_tf32), bf16
    operands computed on as float32 values, a bf16 accumulator rounded back; floating-point dots
    summed by fixed_order_dot instead of BLAS."""
    from triton._C.libtriton import ir

    original_dot = Builder.create_dot
    tf32 = ir.INPUT_PRECISION.TF32
    fixed_order = {np.dtype(np.float32), np.dtype(np.float16)}

    def as_tf32(h):
        if h.dtype.scalar != bf16.tl.float32:
            return h
        return bf16.TensorHandle(to_tf32(h.data), bf16.tl.float32)

    def dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if {a.data.dtype, b.data.dtype, d.data.dtype} <= fixed_order:
            return bf16.TensorHandle(fixed_order_dot(a.data, b.data, d.data), d.dtype.scalar)
        return original_dot(self, a, b, d, input_precision, max_num_imprecise_acc)  # integer and fp8 dots

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if input_precision == tf32:  # the GPU's default for float32 operands: TF32 tensor cores
            a, b = as_tf32(a), as_tf32(b)
        if not (bf16.is_bf16(a) or bf16.is_bf16(b) or bf16.is_bf16(d)):
            return dot(self, a, b, d, input_precision, max_num_imprecise_acc)
        out = dot(self, bf16.widen(a), bf16.widen(b), bf16.widen(d), input_precision, max_num_imprecise_acc)
        return bf16.narrow(out) if bf16.is_bf16(d) else out

    Builder.create_dot = create_dot


def _patch_bf16_cast(Builder, bf16: _Bfloat16) -> None:
    tl = bf16.tl
    original_cast = Builder.cast_impl

    def cast_impl(self, src, dst_type):
        """Casts into or out of bfloat16 go through float32 values, never through bits, and
        round to nearest even into bfloat16 (measured on an H100: with the interpreter's own
        truncating cast, FLA's bf16 error comes out 2.5x the GPU's)."""
        src_bf16, dst_bf16 = bf16.is_bf16(src), dst_type.scalar == tl.bfloat16
        if src_bf16 and dst_bf16:
            return src
        if src_bf16:
            widened = bf16.widen(src)
            return widened if dst_type.scalar == tl.float32 else original_cast(self, widened, dst_type)
        if dst_bf16:  # round to nearest even, as the GPU's cvt.rn.bf16.f32 (the interpreter truncates)
            return bf16.narrow(src if src.dtype.scalar == tl.float32 else original_cast(self, src, tl.float32))
        return original_cast(self, src, dst_type)

    Builder.cast_impl = cast_impl  # create_fp_ext, create_si_to_fp, ... all call self.cast_impl


def _patch_bf16_reductions(interpreter, bf16: _Bfloat16) -> None:
    """The ReduceOps/ScanOps numpy fast paths (sum, min/max, cumsum, cumprod) on bf16 inputs
    compute on float32 values and round their float32 results back to bfloat16."""
    tl = bf16.tl

    def reduce_on_values(method):
        @functools.wraps(method)
        def wrapped(self, input, *rest, **kw):
            if input.dtype != tl.bfloat16:
                return method(self, input, *rest, **kw)
            out = method(self, self.to_tensor(bf16.widen(input.handle).data, tl.float32), *rest, **kw)

            def back(t):
                if isinstance(t, tl.tensor) and t.dtype == tl.float32:
                    return self.to_tensor(bf16.narrow(t.handle).data, tl.bfloat16)
                return t

            return type(out)(map(back, out)) if isinstance(out, (list, tuple)) else back(out)

        return wrapped

    for ops, names in ((interpreter.ReduceOps, ("sum", "min_max")), (interpreter.ScanOps, ("cumsum", "cumprod"))):
        for name in names:
            setattr(ops, name, reduce_on_values(getattr(ops, name)))


# 4. the H100's tiles (parity.model.gpu) --------------------------------------------------


def fla_tiles_are_an_h100s() -> bool:
    """Whether the imported fla sized its tiles for an H100's shared memory (False when fla's
    modules were imported before request())."""
    from fla.ops.common import chunk_h
    from fla.utils import check_shared_mem

    return check_shared_mem("hopper") and chunk_h.BKV_LIST == [32, 64]


# 5. speed: patch triton.language once per kernel launch ----------------------------------


def _patch_lang_once_per_launch(interpreter) -> None:
    import inspect

    import triton.language as tl

    original = interpreter._patch_lang
    launches: list[set[int]] = []  # per running launch: ids of the language modules it patched

    class Launch:
        """The launch's own patch scope; restoring it ends the launch."""

        def __init__(self, scope, langs):
            self.scope = scope
            launches.append(langs)

        def restore(self):
            launches.pop()
            self.scope.restore()

    class AlreadyPatched:
        def restore(self):
            pass

    found: dict[int, tuple[int, set[int]]] = {}  # id of a module's globals -> (their count, its language modules)

    def language_modules(fn) -> set[int]:
        """Ids of triton.language and triton.language.core among fn's module's globals (looked up
        again when that module's globals change in number)."""
        g = fn.__globals__
        known = found.get(id(g))
        if known is None or known[0] != len(g):
            known = found[id(g)] = (len(g), {id(m) for m in g.values() if inspect.ismodule(m) and m in (tl, tl.core)})
        return known[1]

    def patch_lang(fn):
        langs = language_modules(fn)
        if not launches:  # a kernel launch (GridExecutor): it restores the scope when it ends
            return Launch(original(fn), langs)
        if langs <= launches[-1]:  # a helper called inside the launch: nothing left to patch
            return AlreadyPatched()
        launches[-1] = launches[-1] | langs
        return original(fn)  # as triton does: the helper's scope is never restored

    patch_lang.original = original  # triton's own (tests compare the two)
    interpreter._patch_lang = patch_lang


# 6. speed: front-end shortcuts -----------------------------------------------------------


def _patch_front_end(interpreter) -> None:
    import triton.language as tl
    from triton.language import semantic

    np_dtype = interpreter._get_np_dtype
    by_name: dict[str, np.dtype] = {}
    u64 = np.dtype(np.uint64)

    def get_np_dtype(tt_dtype):
        """triton's _get_np_dtype (a pure function of the scalar type's name; pointers are uint64),
        remembered per name."""
        scalar = tt_dtype.element_ty if isinstance(tt_dtype, tl.block_type) else tt_dtype
        if isinstance(scalar, tl.pointer_type):
            return u64
        found = by_name.get(scalar.name)
        if found is None:
            found = by_name[scalar.name] = np_dtype(scalar)
        return found

    get_np_dtype.original = np_dtype
    interpreter._get_np_dtype = get_np_dtype  # the interpreter's callers look it up as a module global

    broadcast = semantic.TritonSemantic.broadcast_impl_value

    def broadcast_impl_value(self, lhs, rhs):
        """triton's, with its no-op cases first: two blocks of one shape, or two scalars."""
        lhs_block, rhs_block = lhs.type.is_block(), rhs.type.is_block()
        if lhs_block == rhs_block and (not lhs_block or lhs.type.shape == rhs.type.shape):
            return lhs, rhs
        return broadcast(self, lhs, rhs)

    broadcast_impl_value.original = broadcast
    semantic.TritonSemantic.broadcast_impl_value = broadcast_impl_value

    tensor_init = tl.tensor.__init__
    by_type: dict[str, tuple] = {}

    def tensor(self, handle, type):
        """triton's tensor.__init__, its numel and shape (constexprs, a function of its type alone,
        which no code changes) made once per type: every operation makes a tensor."""
        made = by_type.get(type.name)
        if made is None:
            tensor_init(self, handle, type)
            by_type[type.name] = (self.numel, self.shape)
            return
        self.handle, self.type, self.dtype = handle, type, type.scalar
        self.numel, self.shape = made

    tensor.original = tensor_init
    tl.tensor.__init__ = tensor

    block_init = tl.block_type.__init__
    interned: dict[tuple, object] = {}

    def block_type(cls, element_ty, shape):
        """triton's block types made once per (element type, shape): a block type is a value (its
        element type, shape, numel and name), and every operation asks for its result's."""
        key = (element_ty.name, builtins.tuple(getattr(s, "value", s) for s in shape))
        made = interned.get(key)
        if made is None:
            made = interned[key] = object.__new__(cls)
            block_init(made, element_ty, shape)
        return made

    tl.block_type.__new__ = block_type
    tl.block_type.__init__ = lambda self, element_ty, shape: None  # made in __new__
    tl.block_type.__init__.original = block_init


# 7. the GPU's scan order -----------------------------------------------------------------

# the num_warps of a launch that names none (triton's CUDAOptions.num_warps)
DEFAULT_NUM_WARPS = 4
VECTOR_BITS = 128  # the widest global load or store of one thread


def _pow2_divisor(n: int) -> int:
    """The largest power of two dividing n: the alignment, in elements, of rows n elements apart."""
    return n & -n


def _bits(tensor) -> int:
    return tensor.element_size() * 8


# kernel name -> the scan operand's elements per thread along its last (fastest) dimension on sm_90,
# from the launch's arguments by name: the vector width Triton's coalesce pass gives the kernel's
# global loads and stores, which the scan takes. Read from the ttgir of FLA 0.6.0's kernels compiled
# for sm_90 by Triton 3.6, 3.8 and 3.9 (tests/test_gpu_scan.py checks the installed Triton's):
# - chunk_local_cumsum_scalar_kernel: [BT] read with stride H from offsets of unknown alignment:
#   sizePerThread [1], threadsPerWarp [32], warpsPerCTA [num_warps], whatever H.
# - chunk_local_cumsum_vector_kernel: [BT, BS] of rows S elements apart; the scan takes the store's
#   layout: 128 bits of o's dtype, at most the alignment of S (fp32 o, S = 64: sizePerThread [1, 4],
#   threadsPerWarp [4, 8] at BS 32, [2, 16] at BS 64; S = 6: [1, 2]; an fp32 s with a bf16 o: [1, 8];
#   a bf16 s with an fp32 o: [1, 4]).
# - chunk_gla_bwd_kernel_inter: dg [BT, BK] from q, k and their gradients, rows K apart: 128 bits of
#   q's dtype, at most the alignment of K (fp32: [1, 4]; bf16: [1, 8]; bf16 at K = 100: [1, 4]).
# A scan in any other kernel is taken in Triton's layout before coalescing, one element per thread
# along every dimension: an assumption, right where the operand was loaded without known alignment.
SCAN_VECTOR_WIDTH = {
    "chunk_local_cumsum_scalar_kernel": lambda args: 1,
    "chunk_local_cumsum_vector_kernel": lambda args: min(VECTOR_BITS // _bits(args["o"]), _pow2_divisor(args["S"])),
    "chunk_gla_bwd_kernel_inter": lambda args: min(VECTOR_BITS // _bits(args["q"]), _pow2_divisor(args["K"])),
}


def scan_layout(kernel: str, arguments: dict, num_warps: int, shape: tuple[int, ...]):
    """The blocked layout Triton gives a scan operand of `shape` in `kernel` launched with
    `arguments` (by name) and `num_warps` on sm_90: SCAN_VECTOR_WIDTH's elements per thread along
    the last dimension (1 for a kernel not listed, and for 1-D operands), at most the tensor's
    elements per thread (the coalesce pass's cap), and gpu_scan.blocked_layout's lanes and warps."""
    rule = SCAN_VECTOR_WIDTH.get(kernel)
    width = rule(arguments) if rule is not None and len(shape) > 1 else 1
    elements = int(np.prod(shape))
    width = max(1, min(width, shape[-1], elements // (gpu_scan.WARP_SIZE * num_warps)))
    return gpu_scan.blocked_layout(shape, num_warps, (1,) * (len(shape) - 1) + (width,))


def _patch_scan_order(interpreter) -> None:
    """The interpreter's cumsum and cumprod fast paths (ScanOps, which gets the axis already read
    backwards for reverse=True) combine in gpu_scan's order for scan_layout of the running launch,
    which InterpretedFunction.run records: its kernel, arguments and num_warps (an autotuner's
    config passes num_warps there; the interpreter itself ignores it). Integer scans are exact in
    any order and stay numpy's."""
    running: list[tuple[str, dict, int]] = []  # per launch in progress: kernel, arguments, num_warps
    original_run = interpreter.InterpretedFunction.run

    @functools.wraps(original_run)
    def run(self, *args, grid, warmup, **kwargs):
        arguments = {**dict(zip(self.arg_names, args)), **kwargs}
        running.append((self.fn.__name__, arguments, kwargs.get("num_warps") or DEFAULT_NUM_WARPS))
        try:
            return original_run(self, *args, grid=grid, warmup=warmup, **kwargs)
        finally:
            running.pop()

    def in_gpu_order(combine, original):
        @functools.wraps(original)
        def scan(self, input):
            data = input.handle.data
            if not np.issubdtype(data.dtype, np.floating):
                return original(self, input)
            kernel, arguments, num_warps = running[-1] if running else ("", {}, DEFAULT_NUM_WARPS)
            layout = scan_layout(kernel, arguments, num_warps, data.shape)
            along = gpu_scan.scan_axis(layout, data.shape, self.axis)
            return [self.to_tensor(gpu_scan.gpu_scan(data, self.axis, along, combine), dtype=input.dtype)]

        scan.original = original
        return scan

    interpreter.InterpretedFunction.run = run
    interpreter.ScanOps.cumsum = in_gpu_order(np.add, interpreter.ScanOps.cumsum)
    interpreter.ScanOps.cumprod = in_gpu_order(np.multiply, interpreter.ScanOps.cumprod)
