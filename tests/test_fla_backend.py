"""The fla backend: FLA's real Triton kernels through the Triton interpreter on CPU.

The interpreter fixes are checked on small Triton kernels of our own against numpy on the
same (bfloat16-rounded) values, then FLA's four ops (gdn and kda with grouped value heads
too) are checked against the float64 oracle within the tolerance for every output and
gradient, in float32 and bfloat16.
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from cases import Case, make_inputs
from parity.execute.backends.fla import FlaBackend, fla_chunk_size
from parity.execute.backends.oracle import cached_oracle
from parity.measure.compare import compare_tensor
from parity.model.spec import Unsupported
from tests.helpers import fla_in_a_process

torch = pytest.importorskip("torch")
if torch.cuda.is_available():
    pytest.skip("these tests check the CPU interpreter path; a CUDA device is visible", allow_module_level=True)

from parity.execute.backends import fla_configs, fla_launches, triton_interpreter  # noqa: E402

triton_interpreter.enable()
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

BF16_EPS = 2.0**-8  # unit roundoff of bfloat16


@triton.jit
def _bf16_ops_kernel(a_ptr, b_ptr, dot_ptr, sum_ptr, max_ptr, cumsum_ptr, exp_ptr, lt_ptr, cast_ptr, N: tl.constexpr):
    r = tl.arange(0, N)
    a = tl.load(a_ptr + r[:, None] * N + r[None, :])  # bf16 [N, N]
    b = tl.load(b_ptr + r[:, None] * N + r[None, :])
    tl.store(dot_ptr + r[:, None] * N + r[None, :], tl.dot(a, b))  # fp32 accumulate
    tl.store(sum_ptr + r, tl.sum(a * b, axis=1))  # bf16 mul, bf16 sum
    tl.store(max_ptr + r, tl.max(a, axis=1))
    tl.store(cumsum_ptr + r[:, None] * N + r[None, :], tl.cumsum(a, axis=1))
    tl.store(exp_ptr + r[:, None] * N + r[None, :], tl.exp(a.to(tl.float32)).to(tl.bfloat16) + b)
    tl.store(lt_ptr + r[:, None] * N + r[None, :], (a < b).to(tl.int32))
    tl.store(cast_ptr + r, (r - N // 2).to(tl.bfloat16))


@triton.jit
def _f32_to_bf16_kernel(x_ptr, y_ptr, N: tl.constexpr):
    r = tl.arange(0, N)
    tl.store(y_ptr + r, tl.load(x_ptr + r).to(tl.bfloat16))


def test_float32_to_bfloat16_rounds_to_nearest_even_like_the_gpu():
    """The interpreter's own cast truncates; the GPU's cvt.rn.bf16.f32 rounds to nearest even.
    Measured on an H100: with truncation FLA's bf16 rel_rms came out 2.5x the GPU's."""
    N = 64
    x = np.random.default_rng(2).standard_normal(N).astype(np.float32)
    y = torch.empty(N, dtype=torch.bfloat16)
    _f32_to_bf16_kernel[(1,)](torch.from_numpy(x), y, N=N)
    np.testing.assert_array_equal(_np(y), x.astype(ml_dtypes.bfloat16).astype(np.float64))


def _t(x):
    return torch.from_numpy(np.ascontiguousarray(x).view(np.int16)).view(torch.bfloat16)


def _np(t):
    return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16).astype(np.float64)


def test_interpreter_computes_bfloat16_on_values_not_bits():
    """Unpatched, the interpreter's bf16 dot multiplies uint16 bit patterns (off by ~1e10)."""
    N = 16
    rng = np.random.default_rng(0)
    a = rng.standard_normal((N, N)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((N, N)).astype(ml_dtypes.bfloat16)
    af, bf = a.astype(np.float64), b.astype(np.float64)
    out = {
        "dot": torch.empty(N, N),
        "sum": torch.empty(N, dtype=torch.bfloat16),
        "max": torch.empty(N, dtype=torch.bfloat16),
        "cumsum": torch.empty(N, N, dtype=torch.bfloat16),
        "exp": torch.empty(N, N, dtype=torch.bfloat16),
        "lt": torch.empty(N, N, dtype=torch.int32),
        "cast": torch.empty(N, dtype=torch.bfloat16),
    }
    _bf16_ops_kernel[(1,)](_t(a), _t(b), *out.values(), N=N)
    np.testing.assert_allclose(out["dot"].numpy(), af @ bf, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_np(out["sum"]), (af * bf).sum(1), atol=N * BF16_EPS * np.abs(af * bf).sum(1).max())
    np.testing.assert_array_equal(_np(out["max"]), af.max(1))  # negatives included: bits would order them wrongly
    np.testing.assert_allclose(_np(out["cumsum"]), np.cumsum(af, 1), atol=4 * N * BF16_EPS)
    np.testing.assert_allclose(_np(out["exp"]), np.exp(af) + bf, rtol=4 * BF16_EPS, atol=4 * BF16_EPS)
    np.testing.assert_array_equal(out["lt"].numpy(), (af < bf).astype(np.int32))
    np.testing.assert_array_equal(_np(out["cast"]), np.arange(N) - N // 2)


@triton.jit
def _fp32_dot_kernel(a_ptr, b_ptr, tf32_ptr, ieee_ptr, N: tl.constexpr):
    r = tl.arange(0, N)
    a = tl.load(a_ptr + r[:, None] * N + r[None, :])
    b = tl.load(b_ptr + r[:, None] * N + r[None, :])
    tl.store(tf32_ptr + r[:, None] * N + r[None, :], tl.dot(a, b))  # default: tf32
    tl.store(ieee_ptr + r[:, None] * N + r[None, :], tl.dot(a, b, input_precision="ieee"))


def _truncate_tf32(x):
    """float32 -> its top 19 bits (sign, exponent, 10 mantissa bits): what the tensor cores read."""
    return (x.astype(np.float32).view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64)


def test_float32_dot_uses_tf32_like_the_gpu_unless_ieee_is_asked():
    N = 16
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((2, N, N)).astype(np.float32)
    tf32, ieee = torch.empty(N, N), torch.empty(N, N)
    _fp32_dot_kernel[(1,)](torch.from_numpy(a), torch.from_numpy(b), tf32, ieee, N=N)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(ieee.numpy(), exact, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(tf32.numpy(), _truncate_tf32(a) @ _truncate_tf32(b), rtol=1e-5, atol=1e-5)
    assert np.abs(tf32.numpy() - exact).max() > 1e-4  # TF32's error, far above float32's


@triton.jit
def _range_kernel(out_ptr, n):
    acc = tl.zeros([1], dtype=tl.int64)
    for i in range(n):
        acc += i.to(tl.int64)  # a tensor method: fails on a Python int
    for j in tl.range(0, n, 2):
        acc += j.to(tl.int64) * 100
    tl.store(out_ptr + tl.arange(0, 1), acc)


def test_range_loop_variables_are_tensors_as_when_compiled():
    out = torch.zeros(1, dtype=torch.int64)
    _range_kernel[(1,)](out, 5)
    assert out.item() == sum(range(5)) + 100 * sum(range(0, 5, 2))


@triton.autotune(configs=[triton.Config({"BLOCK": 4}), triton.Config({"BLOCK": 8})], key=["n"])
@triton.jit
def _autotuned_kernel(x_ptr, n, BLOCK: tl.constexpr):
    r = tl.arange(0, BLOCK)
    tl.store(x_ptr + r, r * 0 + BLOCK, mask=r < n)


def test_autotuner_takes_the_rules_config_without_benchmarking(monkeypatch):
    from triton.runtime.autotuner import Autotuner

    fla_launches.install(interpreted=True)

    def timed(*args, **kwargs):
        raise AssertionError("a config was timed")

    monkeypatch.setattr(Autotuner, "_bench", timed)
    x = torch.zeros(8, dtype=torch.int32)
    with fla_launches.recording() as ran:
        _autotuned_kernel[(1,)](x, 8)  # benchmarking would need a GPU driver
    assert x[:4].tolist() == [4] * 4 and x[4:].tolist() == [0] * 4
    (launch,) = ran.launches.values()
    assert (launch["chosen_by"], launch["meta"]["BLOCK"], launch["key"]) == ("rule", 4, ["8", "torch.int32"])


def test_neutral_parameters_take_their_largest_values_and_nothing_else_changes():
    from parity.execute.backends.fla_configs import choose_config

    configs = [triton.Config({"BH": bh, "BT": bt}, num_warps=w) for bt in (16, 32) for bh in (1, 2, 8) for w in (1, 4)]
    chosen = choose_config("chunk_kda_fwd_kernel_intra_token_parallel", configs)
    assert chosen.kwargs == {"BH": 8, "BT": 16}  # BT stays the first config's
    assert choose_config("some_other_kernel", configs) is configs[0]
    configs = [triton.Config({"BK": bk, "BV": bv}, num_warps=w) for bk in (32, 64) for bv in (32, 64) for w in (1, 4)]
    assert choose_config("chunk_fwd_kernel_h", configs).kwargs == {"BK": 64, "BV": 64}
    assert choose_config("chunk_gla_fwd_kernel_o", configs) is configs[0]  # its dot sums over K: BK is not neutral


# (case, kernel, the grid axis that counts its program instances, its sizes with NEUTRAL_PARAMS and without)
NEUTRAL_CASES = [
    # kda's BH: H = 3 heads, one instance per token, lanes past H masked: all 3 heads, then 1
    (Case("kda", 1, 40, 3, 32, 32, dtype="bfloat16", chunk_size=32, gate="g_logsig", h0=True, ht=True),
     "chunk_kda_fwd_kernel_intra_token_parallel", 1, (1, 3)),
    # the state kernels' BK, BV: K = 64, V = 128 in 1 x 2 blocks of (64, 64), then 2 x 4 of (32, 32),
    # per sequence and head (2 of them)
    (Case("gla", 1, 80, 2, 64, 128, dtype="bfloat16", gate="g_logsig", h0=True, ht=True),
     "chunk_fwd_kernel_h", 0, (4, 16)),
    (Case("simple_gla", 1, 90, 1, 64, 128, gate="g_logsig", h0=True, ht=True, seqlens=(37, 53)),
     "chunk_bwd_kernel_dh", 0, (4, 16)),
]  # fmt: skip


@pytest.mark.parametrize("case,kernel,axis,instances", NEUTRAL_CASES, ids=lambda x: getattr(x, "id", None))
def test_neutral_parameters_change_no_bit_of_fla(monkeypatch, case, kernel, axis, instances):
    """Fix 1's neutral parameters: FLA with them at their largest (fewer program instances)
    equals FLA with the first config, every tensor, bit for bit, forward and backward."""
    from triton.runtime import interpreter

    inputs = make_inputs(case)
    grids = []
    launch = interpreter.GridExecutor.__call__

    def record_grid(self, *a, **kw):
        if self.fn.__name__ == kernel:
            grids.append(self.grid(kw) if callable(self.grid) else self.grid)
        return launch(self, *a, **kw)

    def tuners():  # the autotuners keep the config chosen per key: choose afresh
        import triton.runtime.autotuner as autotuner

        for module in [m for n, m in sys.modules.items() if n.startswith("fla.ops.") and m is not None]:
            for obj in vars(module).values():
                while obj is not None and not isinstance(obj, autotuner.Autotuner) and hasattr(obj, "fn"):
                    obj = obj.fn
                if isinstance(obj, autotuner.Autotuner) and obj.base_fn.__name__ == kernel:
                    monkeypatch.setattr(obj, "cache", {})

    monkeypatch.setattr(interpreter.GridExecutor, "__call__", record_grid)
    FlaBackend().run(case, inputs)  # imports the kernel's module
    tuners()
    grids.clear()
    neutral = FlaBackend().run(case, inputs).tensors
    monkeypatch.setattr(fla_configs, "NEUTRAL_PARAMS", {})
    tuners()
    first = FlaBackend().run(case, inputs).tensors
    assert set(neutral) == set(first) == set(case.output_names()) - {"dg_gamma"}
    for name in first:
        assert np.array_equal(neutral[name], first[name], equal_nan=True), name
    counts = sorted({tuple(g)[axis] for g in grids})
    assert (counts[0], counts[-1]) == instances, grids


def test_fixed_order_dot_accumulates_by_fused_multiply_adds_in_k_order():
    """The interpreter's tl.dot against an independent formulation (a Python loop over k of one
    fused multiply-add each, the exact product and the accumulator rounded once to float32, d added
    last), bit for bit; and a block of rows or columns of a dot equals that block of the whole dot
    (no dependence on the block shape, which np.matmul's BLAS has)."""
    rng = np.random.default_rng(5)
    M, K, N = 48, 64, 40
    a = (rng.standard_normal((M, K)) * np.exp2(rng.integers(-12, 12, (M, K)))).astype(np.float32)
    b = rng.standard_normal((K, N)).astype(np.float32)
    d = rng.standard_normal((M, N)).astype(np.float32)
    acc = np.zeros((M, N), np.float32)
    for k in range(K):
        acc = (acc.astype(np.float64) + np.multiply.outer(a[:, k].astype(np.float64), b[k])).astype(np.float32)
    whole = triton_interpreter.fixed_order_dot(a, b, d)
    assert whole.dtype == np.float32 and np.array_equal(whole, acc + d)
    assert np.array_equal(triton_interpreter.fixed_order_dot(a[:16], b[:, 8:], d[:16, 8:]), whole[:16, 8:])


# FLA's outputs under either BLAS kernel: a case whose state kernel's blocks differ by config
# (test_neutral_parameters_change_no_bit_of_fla) and a stage case along time with a bf16 dot
_BLAS_CASES = (
    "gla-fwdbwd-B1-T80-H2-K64-V128-bf16-C64-g_logsig-h0-ht",
    "kda:bwd_dAv-fwd-B2-T128-H2-K64-V64-bf16-C64-g_logsig-h0-ht",
)


def test_fla_bits_do_not_depend_on_the_blas_kernel():
    """The same FLA bits with OpenBLAS's Haswell kernel (OPENBLAS_CORETYPE=Haswell, as some hosts
    set it) and with the kernel OpenBLAS picks for this processor: the interpreter's dots do not go
    through BLAS (fixed_order_dot). With np.matmul, the Haswell kernel changed FLA's ht and dh0 bits."""
    runs = []
    for coretype in ("Haswell", None):
        env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
        if coretype:
            env.update(OPENBLAS_CORETYPE=coretype, OPENBLAS_L2_SIZE="512")
        runs.append({c: r["sha256"] for c, r in fla_in_a_process(_BLAS_CASES, env).items()})
    haswell, native = runs
    assert set(haswell) == set(_BLAS_CASES) and all(haswell[c] for c in _BLAS_CASES)
    assert haswell == native


KDA_BF16 = Case("kda", 1, 40, 2, 32, 32, dtype="bfloat16", chunk_size=64, gate="g_logsig", h0=True, ht=True)


def _same_bits(fast: dict, slow: dict, case: Case) -> None:
    assert set(fast) == set(slow) == set(case.output_names())
    for name in fast:
        assert np.array_equal(fast[name], slow[name], equal_nan=True), name


def test_helpers_inside_a_kernel_reuse_the_launchs_patches_with_the_same_numbers(monkeypatch):
    """Fix 5 skips re-patching triton.language at each @triton.jit helper call; FLA's kda
    (helpers such as exp2 in every kernel, bf16 and the TF32 dots) computes the same bits as
    with triton's own per-call patching."""
    from triton.runtime import interpreter

    inputs = make_inputs(KDA_BF16)
    scans = collections.Counter()  # triton.language scans (_patch_builtin) per run
    scan = interpreter._patch_builtin
    monkeypatch.setattr(interpreter, "_patch_builtin", lambda *a: scans.update([run]) or scan(*a))
    run = "once per launch"
    fast = FlaBackend().run(KDA_BF16, inputs).tensors
    run = "at every helper call"
    monkeypatch.setattr(interpreter, "_patch_lang", interpreter._patch_lang.original)
    _same_bits(fast, FlaBackend().run(KDA_BF16, inputs).tensors, KDA_BF16)
    assert 0 < 10 * scans["once per launch"] < scans["at every helper call"], scans


def test_front_end_shortcuts_compute_the_same_bits(monkeypatch):
    """Speed-up 6: the remembered numpy dtypes, the no-op broadcasts, the interned block types and
    the tensors' shapes made once per type give FLA's kda (bf16 and float32 values, pointers, blocks
    and scalars) the same bits as triton's own front end."""
    import triton.language as tl
    from triton.language import semantic
    from triton.runtime import interpreter

    inputs = make_inputs(KDA_BF16)
    fast = FlaBackend().run(KDA_BF16, inputs).tensors
    for owner, name in (
        (semantic.TritonSemantic, "broadcast_impl_value"),
        (interpreter, "_get_np_dtype"),
        (tl.tensor, "__init__"),
        (tl.block_type, "__init__"),
    ):
        monkeypatch.setattr(owner, name, getattr(owner, name).original)  # AttributeError: not installed
    monkeypatch.setattr(tl.block_type, "__new__", lambda cls, *a: object.__new__(cls))  # one per operation
    _same_bits(fast, FlaBackend().run(KDA_BF16, inputs).tensors, KDA_BF16)


SHAPE = dict(B=1, T=80, H=2, K=64, V=64, h0=True, ht=True)
FLA_CASES = (
    [
        Case(op, **SHAPE, dtype=dt, gate="g_logsig", chunk_size=64)
        for op in ("simple_gla", "gla", "kda")
        for dt in ("float32", "bfloat16")
    ]
    + [
        Case("simple_gla", 1, 96, 2, 64, 64, dtype="bfloat16", chunk_size=128, gate="gamma_alibi"),
        Case(
            "simple_gla",
            1,
            100,
            2,
            64,
            64,
            dtype="float32",
            chunk_size=32,
            gate="g_logsig",
            h0=True,
            ht=True,
            seqlens=(37, 1, 62),
        ),
    ]
    + [  # the small-dims end (parity.measure.tol's floor at 64): FLA at 1.6-3.9x its tolerance without it
        Case.from_id(i)
        for i in (
            "kda-fwdbwd-B1-T17-H2-K8-V8-bf16-C16-g_logsig-h0-ht",
            "kda-fwdbwd-B1-T17-H2-K8-V64-fp32-C16-g_logsig-h0-ht",
            "gla-fwdbwd-B1-T1-H2-K8-V8-fp32-C16-g_logsig-h0-ht",
            "simple_gla-fwdbwd-B1-T2-H2-K8-V8-fp32-C16-g_logsig-h0-ht",
        )
    ]
    + [  # the gated delta rule (chunk_gated_delta_rule) and grouped value heads (HV = 2 H) on both delta-rule ops
        Case("gdn", 1, 80, 1, 32, 32, dtype="float32", gate="g_logsig", HV=2, h0=True, ht=True),
        Case("kda", 1, 64, 1, 32, 32, dtype="bfloat16", gate="g_logsig", HV=2, h0=True, ht=True, seqlens=(30, 34)),
    ]
    + [  # GDN-2 (chunk_gdn2): fp32 with h0 / ht; bf16 packed, at chunk 128 (FLA runs its only chunk, 64)
        Case("gdn2", 1, 64, 2, 64, 64, dtype="float32", gate="g_logsig", h0=True, ht=True),
        Case("gdn2", 1, 64, 1, 32, 32, dtype="bfloat16", chunk_size=128, h0=True, ht=True, seqlens=(30, 34)),
    ]
)


@pytest.mark.parametrize("case", FLA_CASES, ids=lambda c: c.id)
def test_fla_in_the_interpreter_is_within_tolerance_of_the_oracle(case):
    inputs = make_inputs(case)
    oracle = cached_oracle(case, inputs)[0]
    ex = FlaBackend().run(case, inputs)
    assert ex.platform == "cpu:triton-interpreter"
    assert ex.notes["chunk_size"] == fla_chunk_size(case)
    unsupported = ex.notes.get("unsupported_tensors", {})
    assert set(ex.tensors) | set(unsupported) == set(case.output_names())
    for name, x in ex.tensors.items():
        m = compare_tensor(case, name, x, oracle[name])
        assert m["verdict"] == "pass", (name, m["rel_rms"], m["tol"], m["nan"], m["inf"])


def test_gdn2_s_write_gate_comes_in_v_s_dtype_and_fla_takes_it_as_it_is():
    """chunk_gdn2's backward needs w in v's dtype: the registry stores it so (the same bytes for every
    backend), FLA runs the bf16 case's backward and returns dw in that dtype."""
    case = next(c for c in FLA_CASES if c.op == "gdn2" and c.dtype == "bfloat16")
    inputs = make_inputs(case)
    assert inputs["w"].dtype == inputs["v"].dtype and inputs["b"].dtype == np.float32
    ex = FlaBackend().run(case, inputs)
    assert "inputs" not in ex.notes and np.isfinite(ex.tensors["dw"].astype(np.float32)).all()


@pytest.mark.parametrize(
    "case_id, reason",
    [
        ("gdn2-fwdbwd-B1-T64-H1-K32-V32-fp32-C64-g_logsig-HV2", "no grouped value heads"),
        ("gdn2-fwd-B1-T16-H1-K512-V64-fp32-C64-g_logsig", "K <= 256"),
    ],
)
def test_fla_declares_what_chunk_gdn2_cannot_run_unsupported(case_id, reason):
    """FLA 0.6.0's chunk_gdn2 asserts v with H heads and K <= 256: such cases are `unsupported`, with the
    reason, before anything is imported or run."""
    from parity.execute.backends.base import execute

    case = Case.from_id(case_id)
    with pytest.raises(Unsupported, match=reason):
        FlaBackend.kernel_call(case)
    r = execute(FlaBackend(), case, make_inputs(case))
    assert r.status == "unsupported" and reason in r.error


def test_fla_takes_an_h100s_tiles_in_the_interpreter():
    """FLA sizes its tiles at import from the GPU's shared memory: in the interpreter they are an
    H100's (on a CPU its probe would find none: BK 16 and 32-wide chunk tiles, no H100's)."""
    from fla.ops.common import chunk_h, chunk_o
    from fla.ops.gla import chunk as gla_chunk
    from fla.utils import check_shared_mem

    case = FLA_CASES[0]
    ex = FlaBackend().run(case, make_inputs(case))
    assert "H100 tiles" in ex.numerics and "H100" in ex.notes["emulation"]
    # what the CPU reference's bits depend on: numpy's SIMD code, not the BLAS kernel
    assert "any BLAS kernel" in ex.notes["cpu_bits"] and "numpy" in ex.versions and "fixed-order" in ex.numerics
    assert check_shared_mem("hopper") and check_shared_mem("ampere")
    assert chunk_h.BKV_LIST == [32, 64] and chunk_o.BKV_LIST == [64, 128]
    assert gla_chunk.BK_LIST == [32, 64] and gla_chunk.BV_LIST == [64, 128]


def test_a_users_test_importing_fla_first_gets_an_h100s_tiles_from_the_plugin(tmp_path):
    """The pytest plugin asks for the interpreter and the H100's tiles before any test module
    imports fla (a user's test may import it at its top)."""
    (tmp_path / "test_tiles.py").write_text(
        "from fla.ops.common import chunk_h\n"
        "from fla.ops.gla import chunk\n\n"
        "def test_tiles():\n"
        "    assert chunk_h.BKV_LIST == [32, 64] and chunk.BV_LIST == [64, 128]\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("TRITON_INTERPRET", "PYTEST_ADDOPTS")}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "test_tiles.py"]
    p = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0 and "1 passed" in p.stdout, p.stdout[-3000:] + p.stderr[-2000:]


def test_fla_gives_no_g_gamma_gradient_and_says_so():
    case = next(c for c in FLA_CASES if c.uses_g_gamma)
    ex = FlaBackend().run(case, make_inputs(case))
    assert "dg_gamma" not in ex.tensors
    assert "dg_gamma" in ex.notes["unsupported_tensors"]


def _fla_run_after(prelude: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """A fresh process that runs `prelude`, then FLA through the backend on a small case."""
    code = (
        f"{prelude}\n"
        "from cases import Case, make_inputs\n"
        "from parity.execute.backends.fla import FlaBackend\n"
        "c = Case('simple_gla', 1, 16, 1, 64, 64)\n"
        "FlaBackend().run(c, make_inputs(c))\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)


def test_fla_imported_for_a_gpu_is_refused_with_the_fix():
    env = {k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"}
    p = _fla_run_after("import os; os.environ.pop('TRITON_INTERPRET', None)\nimport fla.ops.simple_gla", env)
    assert p.returncode != 0
    assert "TRITON_INTERPRET=1" in p.stderr and "FlaImportedTooEarly" in p.stderr


def test_fla_interpreted_with_a_cpus_tiles_is_refused_with_the_fix():
    """fla imported interpreted but before request(): its tiles are no H100's, and the backend says so."""
    p = _fla_run_after("import os; os.environ['TRITON_INTERPRET'] = '1'\nimport fla.ops.simple_gla")
    assert p.returncode != 0
    assert "FlaImportedTooEarly" in p.stderr and "not an H100" in p.stderr, p.stderr[-2000:]
