"""FLA through the Triton interpreter under each supported Triton version (3.6.0: torch 2.11's; 3.7.1:
torch 2.12.1's; 3.9.0: this environment's), each in a fresh process with that Triton first on
PYTHONPATH: the record ran, its output bits are those computed under Triton 3.9.0 and it records
the same kernel launches and configs.

The versions besides the environment's own are installed by scripts/env.sh, each into its own
--target directory <venv>/pkgs/triton-<version>; a missing one fails these tests (CI runs
scripts/env.sh first). Measured on this project's 2-core CPU machine: the case below takes
4.8-6.0 s a process (imports included) under each version, with the same bits under all three.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from functools import cache

import numpy as np
import pytest

from tests.helpers import fla_in_a_process, triton_env

torch = pytest.importorskip("torch")
if torch.cuda.is_available():
    pytest.skip("these tests check the CPU interpreter path; a CUDA device is visible", allow_module_level=True)

SUPPORTED = ("3.6.0", "3.7.1", "3.9.0")  # pyproject.toml's triton range
REFERENCE = "3.9.0"
OWN = importlib.metadata.version("triton")  # the environment's own (3.9.0 here)
# a bf16 case with a backward pass, from the smoke suite: bf16 arithmetic, dots, casts and scalar
# constants (3.6 and 3.7's interpreter has no bf16 constant: get_bf16), the state kernels forward
# and backward, with autotuned configs
CASE = "simple_gla-fwdbwd-B1-T96-H2-K64-V64-bf16-C128-gamma_alibi"


@cache
def fla_under(version: str) -> dict:
    """The case's run (fla_in_a_process) under Triton `version`."""
    return fla_in_a_process([CASE], triton_env(version))[CASE]


@pytest.mark.parametrize("version", sorted(set(SUPPORTED) | {OWN}))
def test_fla_runs_with_the_same_bits_under_each_triton(version):
    """The record ran in the interpreter under that Triton (3.6 and 3.7 need the autotuner's
    benchmark skipped and a bf16 constant builder: without them every FLA record was an error,
    "0 active drivers" / "no attribute 'get_bf16'"), and every output has the bits it has under
    Triton 3.9.0 (the interpreter patches compute the same arithmetic under each version)."""
    run = fla_under(version)
    record = run["record"]
    assert record["status"] == "ok", record["error"]
    assert record["platform"] == "cpu:triton-interpreter"
    assert record["versions"]["triton"] == version
    assert record["verdict"] == "pass"
    reference = fla_under(REFERENCE)
    assert run["sha256"] and run["sha256"] == reference["sha256"]
    assert run["launches"] and run["launches"] == reference["launches"]  # the same kernels and configs recorded


# A kernel of the builder operations whose interpreter code differs between the versions (Triton
# 3.6 and 3.7: fma rounded twice, NaN from tl.minimum / tl.maximum / tl.clamp, no bf16 constant;
# triton_interpreter._patch_builder_as_in_triton_3_9): their outputs' bytes, printed as hex
_BUILDER_OPS = """
import numpy as np, torch
from parity.execute.backends import triton_interpreter
triton_interpreter.enable()
import triton, triton.language as tl

@triton.jit
def ops(x_ptr, y_ptr, z_ptr, fma_ptr, min_ptr, max_ptr, clamp_ptr, const_ptr, N: tl.constexpr):
    r = tl.arange(0, N)
    x, y, z = tl.load(x_ptr + r), tl.load(y_ptr + r), tl.load(z_ptr + r)
    tl.store(fma_ptr + r, tl.fma(x, y, z))
    tl.store(min_ptr + r, tl.minimum(x, y))
    tl.store(max_ptr + r, tl.maximum(x, y))
    tl.store(clamp_ptr + r, tl.clamp(x, -0.5, 0.5))
    tl.store(const_ptr + r, x.to(tl.bfloat16) * 0.3)

N = 256
rng = np.random.default_rng(0)
x, y = rng.standard_normal((2, N)).astype(np.float32)
x[:4], y[4:8] = np.nan, np.nan
z = -(x.astype(np.float64) * y).astype(np.float32)  # x * y + z: the product's rounding error, fused
outs = [torch.empty(N) for _ in range(4)] + [torch.empty(N, dtype=torch.bfloat16)]
ops[(1,)](*(torch.from_numpy(a) for a in (x, y, z)), *outs, N=N)
print(triton.__version__, *(o.view(torch.int16 if o.dtype == torch.bfloat16 else torch.int32).numpy().tobytes().hex()
                            for o in outs))
"""


@cache
def builder_ops_under(version: str) -> list[np.ndarray]:
    """The outputs of _BUILDER_OPS under Triton `version`: fma, minimum, maximum, clamp (float32)
    and the bf16 constant's product (as float32)."""
    env = triton_env(version)
    done = subprocess.run([sys.executable, "-c", _BUILDER_OPS], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    ran, *hexes = done.stdout.split()
    assert ran == version
    f32 = [np.frombuffer(bytes.fromhex(h), np.float32) for h in hexes[:4]]
    bf16 = np.frombuffer(bytes.fromhex(hexes[4]), np.uint16).astype(np.uint32) << np.uint32(16)
    return [*f32, bf16.view(np.float32)]


@pytest.mark.parametrize("version", sorted(set(SUPPORTED) | {OWN}))
def test_builder_operations_compute_as_the_gpu_under_each_triton(version):
    """fma rounded once, tl.minimum / tl.maximum / tl.clamp (propagate_nan NONE) returning the
    operand that is not NaN, a bf16 scalar constant rounded to nearest even: as the GPU computes
    them, with the same bits under each version."""
    fma, lo, hi, clamp, const = builder_ops_under(version)
    assert np.count_nonzero(fma[8:]) > 200  # the product's rounding error survives: one rounding
    assert not np.isnan(lo).any() and not np.isnan(hi).any() and not np.isnan(clamp).any()
    assert (clamp[:4] == -0.5).all()
    reference = builder_ops_under(REFERENCE)
    for got, want in zip((fma, lo, hi, clamp, const), reference):
        assert got.tobytes() == want.tobytes()


def test_fused_fma32_rounds_once_like_triton_3_9s_fma():
    """triton_interpreter.fused_fma32 (the fma under Triton 3.6 and 3.7) against Triton 3.9's
    C++ fma_fp32, bit for bit: products whose rounding error the addend exposes, sums that a
    float64 sum rounded to float32 would round twice (wrong in all 1000), signed zeros,
    subnormals, overflow, Inf and NaN."""
    from parity.execute.backends import triton_interpreter

    triton_interpreter.request()  # as the harness does before triton is imported
    try:
        from triton._C.libtriton.interpreter import fma_fp32
    except ImportError:
        pytest.fail(f"the environment's Triton {OWN} has no fma_fp32: install Triton 3.9.0")
    rng = np.random.default_rng(1)
    n = 200_000
    with np.errstate(all="ignore"):  # exponents past float32's range: Inf and NaN operands too
        x, y = (rng.standard_normal((2, n)) * np.exp2(rng.integers(-130, 130, (2, n)))).astype(np.float32)
        near = -(x.astype(np.float64) * y).astype(np.float32) * (1 + rng.integers(-3, 4, n) * 2.0**-23)
        z = np.where(rng.random(n) < 0.5, near, rng.standard_normal(n) * np.exp2(rng.integers(-130, 130, n)))
        z = z.astype(np.float32)
        # x * y + z just below a float32 tie that rounds away from z: float64's rounding lands on the
        # tie, and rounding that to float32 goes the wrong way (double rounding); z's last bit odd
        sign, k = rng.choice([-1.0, 1.0], 1000), np.exp2(rng.integers(-100, 100, 1000))
        tx = (sign * (1 + 2.0**-23) * k).astype(np.float32)
        ty = np.full(1000, 2.0**-24 * (1 - 2.0**-23), np.float32)  # x * y = sign k 2^-24 (1 - 2^-46)
        tz = (sign * (1 + (2 * rng.integers(0, 2**22, 1000) + 1) * 2.0**-23) * k).astype(np.float32)
        special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 3.4e38, -3.4e38, 1.0], np.float32)
        sx, sy, sz = (a.ravel() for a in np.meshgrid(special, special, special))
        for a, b, c in ((x, y, z), (tx, ty, tz), (sx, sy, sz)):
            want, got = fma_fp32(a, b, c), triton_interpreter.fused_fma32(a, b, c)
            same = (want.view(np.uint32) == got.view(np.uint32)) | (np.isnan(want) & np.isnan(got))
            assert same.all(), (a[~same][:4], b[~same][:4], c[~same][:4])
