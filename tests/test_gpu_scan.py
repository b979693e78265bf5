"""tl.cumsum and tl.cumprod in the interpreter combine in the GPU's order (triton_interpreter 7.).

- The interpreter's scans of our own kernels (tests/scan_kernels.py: 1-D and 2-D along axis 0,
  forward and reverse, one to eight warps) equal, bit for bit, a simulation of Triton's lowering
  written here lane by lane and warp by warp, and differ from numpy's sequential cumsum; the
  launch's num_warps (Triton's 4 when it names none) reaches the scan's layout.
- gpu_scan is what Triton's own lowering computes: kernels compiled for sm_90 on this CPU by the
  installed Triton (tests/sm90_scans.py), FLA's cumsum kernels among them, executed from their LLVM
  IR thread by thread (tests/nvptx_ir.py); scan_layout gives the layout of their ttgir.
- FLA's chunk_local_cumsum through the harness: g_cumsum is gpu_scan's per chunk, within tolerance."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if torch.cuda.is_available():
    pytest.skip("these tests check the CPU interpreter path; a CUDA device is visible", allow_module_level=True)

from parity.execute.backends import gpu_scan, triton_interpreter  # noqa: E402

triton_interpreter.enable()
from tests import scan_kernels  # noqa: E402  (interpreted: imported after enable())
from tests.nvptx_ir import CTA  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
f32 = np.float32


def spread(rng, shape) -> np.ndarray:
    """float32 values over 2^-11 .. 2^11 in magnitude, both signs: sums in different orders round
    differently."""
    return (rng.standard_normal(shape) * np.exp(rng.uniform(-8, 8, shape))).astype(f32)


def simulated_gpu_scan(x: np.ndarray, S: int, L: int, W: int, combine) -> np.ndarray:
    """Triton's lowering of an inclusive scan of the 1-D float32 x (n = R W L S), thread by thread:
    the thread at repetition r, warp w, lane holds x[((r W + w) L + lane) S : ... + S] and scans
    them; each lane >= d then adds the total of lane - d (a shuffle up) for d = 1, 2, 4, ... < L;
    each warp-local chunk's last lane writes its total to shared memory, read back in chunk order;
    a chunk adds the running total of those before it, and a thread's first S - 1 elements the
    previous lane's last (lane 0: that running total)."""
    n = len(x)
    R = n // (S * L * W)
    start = lambda r, w, lane: ((r * W + w) * L + lane) * S
    thread = {}
    for r in range(R):
        for w in range(W):
            for lane in range(L):
                acc, mine = None, []
                for e in range(S):
                    v = x[start(r, w, lane) + e]
                    acc = v if acc is None else f32(combine(acc, v))
                    mine.append(acc)
                thread[r, w, lane] = mine
    warp_scanned = {}
    for r in range(R):
        for w in range(W):
            vals = [thread[r, w, lane][-1] for lane in range(L)]
            d = 1
            while d < L:
                vals = [f32(combine(vals[lane - d], vals[lane])) if lane >= d else vals[lane] for lane in range(L)]
                d *= 2
            warp_scanned[r, w] = vals
    out = np.empty(n, f32)
    running = None  # the total of the chunks read so far from shared memory
    for r in range(R):
        for w in range(W):
            carry = running
            total = warp_scanned[r, w][L - 1]
            running = total if running is None else f32(combine(running, total))
            last = [v if carry is None else f32(combine(carry, v)) for v in warp_scanned[r, w]]
            for lane in range(L):
                before = last[lane - 1] if lane > 0 else carry
                for e in range(S - 1):
                    v = thread[r, w, lane][e]
                    out[start(r, w, lane) + e] = v if before is None else f32(combine(before, v))
                out[start(r, w, lane) + S - 1] = last[lane]
    return out


def simulated(x: np.ndarray, S: int, L: int, W: int, reverse: bool, combine=np.add) -> np.ndarray:
    """simulated_gpu_scan of each column of x along axis 0; reverse: of the columns read backwards."""
    cols = x.reshape(len(x), -1)
    if reverse:
        cols = cols[::-1]
    out = np.stack([simulated_gpu_scan(cols[:, j], S, L, W, combine) for j in range(cols.shape[1])], axis=1)
    return (out[::-1] if reverse else out).reshape(x.shape)


# (BT, num_warps, S, L, W): the 1-D kernel's scan of [BT] in Triton's layout before coalescing, the
# one the interpreter takes for a kernel not in SCAN_VECTOR_WIDTH: sizePerThread [1],
# threadsPerWarp [32], warpsPerCTA [num_warps], lanes and warps past BT repeating data
SCANS_1D = [
    (64, 1, 1, 32, 1),  # two chunks of 32 in each thread's registers
    (64, 2, 1, 32, 2),  # two warps
    (64, 8, 1, 32, 2),  # warps 2-7 repeat warps 0-1
    (128, 2, 1, 32, 2),  # two repetitions of two warps
    (16, 1, 1, 16, 1),  # lanes 16-31 repeat lanes 0-15
]
# (BT, BS, num_warps, vector width along BS, S, L, W) of the 2-D kernel along axis 0: blocked
# layouts with sizePerThread [1, width]: threadsPerWarp [32 / (BS / width), BS / width]
SCANS_2D = [
    (64, 4, 2, 1, 1, 8, 2),
    (64, 32, 2, 4, 1, 4, 2),  # FLA's local cumsum vector kernel at its first config
    (64, 32, 4, 2, 1, 2, 4),
    (32, 64, 1, 4, 1, 2, 1),
]


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("BT,num_warps,S,L,W", SCANS_1D)
def test_interpreted_1d_cumsum_is_the_gpus_lane_and_warp_order(BT, num_warps, S, L, W, reverse):
    x = spread(np.random.default_rng(BT + num_warps), BT)
    y = torch.empty(BT)
    scan_kernels.scan_1d[(1,)](torch.from_numpy(x), y, BT, BT=BT, REVERSE=reverse, PROD=False, num_warps=num_warps)
    expected = simulated(x, S, L, W, reverse)
    np.testing.assert_array_equal(y.numpy().view(np.uint32), expected.view(np.uint32))
    sequential = np.cumsum(x[::-1])[::-1] if reverse else np.cumsum(x)
    assert (y.numpy() != sequential).any()


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("BT,BS,num_warps,width,S,L,W", SCANS_2D)
def test_interpreted_2d_cumsum_is_the_gpus_order_for_the_kernels_layout(
    monkeypatch, BT, BS, num_warps, width, S, L, W, reverse
):
    """Along axis 0 of [BT, BS], with the kernel's vector width along BS given as for FLA's kernels."""
    monkeypatch.setitem(triton_interpreter.SCAN_VECTOR_WIDTH, "scan_2d", lambda args: width)
    x = spread(np.random.default_rng(BT * BS + num_warps), (BT, BS))
    y = torch.empty(BT, BS)
    scan_kernels.scan_2d[(1,)](torch.from_numpy(x), y, BT, BT=BT, BS=BS, REVERSE=reverse, num_warps=num_warps)
    expected = simulated(x, S, L, W, reverse)
    np.testing.assert_array_equal(y.numpy().view(np.uint32), expected.view(np.uint32))
    sequential = np.cumsum(x[::-1], 0)[::-1] if reverse else np.cumsum(x, 0)
    assert (y.numpy() != sequential).any()


def test_interpreted_cumprod_multiplies_in_the_same_order():
    rng = np.random.default_rng(7)
    x = (1 + rng.standard_normal(128) / 8).astype(f32)
    y = torch.empty(128)
    scan_kernels.scan_1d[(1,)](torch.from_numpy(x), y, 128, BT=128, REVERSE=False, PROD=True, num_warps=2)
    np.testing.assert_array_equal(y.numpy(), simulated(x, 1, 32, 2, False, np.multiply))
    assert (y.numpy() != np.cumprod(x)).any()


def test_the_launchs_num_warps_reaches_the_scan_and_defaults_to_tritons_4(monkeypatch):
    """[16, 16] loaded 4 floats at a time: the coalesce pass caps a thread's vector at the tensor's
    elements per thread, 256 / (32 num_warps), which sets the lanes along the scan: 8 warps take
    1 element (16 lanes along BS, 2 along the scan), 4 warps 2 (4 along the scan), 2 warps 4 (8)."""
    monkeypatch.setitem(triton_interpreter.SCAN_VECTOR_WIDTH, "scan_2d", lambda args: 4)
    x = spread(np.random.default_rng(11), (16, 16))
    out = {}
    for num_warps in (8, None, 2):
        y = torch.empty(16, 16)
        warps = {} if num_warps is None else {"num_warps": num_warps}
        scan_kernels.scan_2d[(1,)](torch.from_numpy(x), y, 16, BT=16, BS=16, REVERSE=False, **warps)
        out[num_warps] = y.numpy()
    np.testing.assert_array_equal(out[8], simulated(x, 1, 2, 8, False))
    np.testing.assert_array_equal(out[None], simulated(x, 1, 4, 4, False))  # Triton's default: 4 warps
    np.testing.assert_array_equal(out[2], simulated(x, 1, 8, 2, False))
    assert (out[8] != out[None]).any() and (out[None] != out[2]).any()


# --- against Triton's own lowering for sm_90 ------------------------------------------------

# compiled by tests/sm90_scans.py; "run": execute the LLVM IR on inputs of this shape
_1D = {"x_ptr": "*fp32", "y_ptr": "*fp32"}
_FLA_LOCAL = {"s": "*fp32", "o": "*fp32", "scale": "fp32", "cu_seqlens": "constexpr", "chunk_indices": "constexpr"}
_FLA_CONST = {"cu_seqlens": None, "chunk_indices": None, "B": 2, "H": 2, "HAS_SCALE": True, "IS_VARLEN": False}
_GLA = {n: "*fp32" for n in ("q", "k", "v", "g", "h", "do", "dh", "dq", "dk", "dq2", "dk2", "dg")}
_GLA.update(scale="fp32")
_GLA_CONST = {"cu_seqlens": None, "chunk_indices": None, "H": 2, "V": 64, "BT": 64, "BK": 32, "BV": 64}
_GLA_CONST.update(IS_VARLEN=False, STATE_V_FIRST=False)
LOWERED = [
    dict(kernel="scan_1d", num_warps=1, types=_1D, constexprs=dict(BT=64, REVERSE=False, PROD=False), run=[64]),
    dict(kernel="scan_1d", num_warps=8, types=_1D, constexprs=dict(BT=64, REVERSE=True, PROD=False), run=[64]),
    dict(kernel="scan_1d", num_warps=2, types=_1D, constexprs=dict(BT=256, REVERSE=False, PROD=False), run=[256]),
    dict(kernel="scan_2d", num_warps=2, types=_1D, constexprs=dict(BT=64, BS=32, REVERSE=True), run=[64, 32],
         scan=(64, 32), args={}),
    dict(kernel="scan_2d", num_warps=4, types=_1D, constexprs=dict(BT=16, BS=64, REVERSE=False), run=[16, 64],
         scan=(16, 64), args={}),
    dict(kernel="scan_2d", num_warps=8, types=_1D, constexprs=dict(BT=16, BS=32, REVERSE=False), run=[16, 32],
         scan=(16, 32), args={}),
    dict(kernel="scan_2d", num_warps=4, types=_1D, constexprs=dict(BT=16, BS=16, REVERSE=True), run=[16, 16],
         scan=(16, 16), args={}),
    dict(kernel="fla_local_scalar", num_warps=1, types=_FLA_LOCAL, constexprs=dict(_FLA_CONST, BT=64, REVERSE=True),
         run=[2, 64, 2], scan=(64,), args={}),
    dict(kernel="fla_local_vector", num_warps=2, types=_FLA_LOCAL,
         constexprs=dict(_FLA_CONST, S=64, BT=64, BS=32, REVERSE=False), run=[2, 64, 2, 64], scan=(64, 32),
         args={"S": 64, "o": "float32"}),
    dict(kernel="fla_local_vector", num_warps=4, types=_FLA_LOCAL,
         constexprs=dict(_FLA_CONST, S=128, BT=64, BS=64, REVERSE=True), run=[2, 64, 2, 128], scan=(64, 64),
         args={"S": 128, "o": "float32"}),
    dict(kernel="fla_local_vector", num_warps=2, types=dict(_FLA_LOCAL, s="*bf16"),
         constexprs=dict(_FLA_CONST, S=6, BT=64, BS=32, REVERSE=False), scan=(64, 32), args={"S": 6, "o": "float32"}),
    dict(kernel="fla_local_vector", num_warps=2, types=dict(_FLA_LOCAL, o="*bf16"),
         constexprs=dict(_FLA_CONST, S=64, BT=64, BS=32, REVERSE=False), scan=(64, 32),
         args={"S": 64, "o": "bfloat16"}),
    dict(kernel="fla_gla_bwd_inter", num_warps=2, types=_GLA, constexprs=dict(_GLA_CONST, K=64), scan=(64, 32),
         args={"K": 64, "q": "float32"}),
    dict(kernel="fla_gla_bwd_inter", num_warps=2, types=dict(_GLA, q="*bf16", k="*bf16", v="*bf16", do="*bf16"),
         constexprs=dict(_GLA_CONST, K=100), scan=(64, 32), args={"K": 100, "q": "bfloat16"}),
    dict(kernel="fla_gla_bwd_inter", num_warps=2, types=dict(_GLA, q="*bf16", k="*bf16", v="*bf16", do="*bf16"),
         constexprs=dict(_GLA_CONST, K=64), scan=(64, 32), args={"K": 64, "q": "bfloat16"}),
]  # fmt: skip
KERNEL_NAME = {
    "scan_2d": "scan_2d",  # its rows, BS elements apart, are loaded and stored 4 floats at a time
    "fla_local_scalar": "chunk_local_cumsum_scalar_kernel",
    "fla_local_vector": "chunk_local_cumsum_vector_kernel",
    "fla_gla_bwd_inter": "chunk_gla_bwd_kernel_inter",
}


@pytest.fixture(scope="module")
def lowered():
    """LOWERED compiled for sm_90 by the installed Triton: its version, and per spec the scan
    operand's layout and the LLVM IR (where `run` is given)."""
    specs = [{"kernel": s["kernel"], "num_warps": s["num_warps"], "types": s["types"],
              "constexprs": s["constexprs"], "llir": "run" in s} for s in LOWERED]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-m", "tests.sm90_scans"], input=json.dumps(specs), cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if done.returncode != 0 and "No module named 'triton.backends.nvidia'" in done.stderr:
        pytest.skip("this Triton has no NVIDIA backend to compile for sm_90")
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _execute(llir: str, num_warps: int, kernel: str, x: np.ndarray) -> np.ndarray:
    """One CTA of the kernel (program ids 0) on x; its output, shaped as x."""
    memory = np.zeros(1 << 21, np.uint8)
    x_at, y_at = 1 << 12, 1 << 20
    memory[x_at : x_at + x.nbytes] = x.view(np.uint8).ravel()
    if kernel.startswith("scan_"):
        params = [x_at, y_at, x.shape[0]]  # x_ptr, y_ptr, n
    else:
        params = [x_at, y_at, 1.0, x.shape[1]]  # s, o, scale, T: one chunk per sequence
    CTA(llir, num_warps * 32, params, memory).run()
    return memory[y_at : y_at + x.nbytes].view(np.float32).reshape(x.shape)


@pytest.mark.parametrize("index", [i for i, s in enumerate(LOWERED) if "run" in s])
def test_gpu_scan_is_what_tritons_lowering_computes(lowered, index):
    """The LLVM IR Triton emits for sm_90, executed thread by thread, gives gpu_scan's bits for the
    layout in its ttgir; numpy's sequential cumsum differs."""
    spec, got = LOWERED[index], lowered["results"][index]
    spt, tpw, wpc, order = got["layout"]
    layout = gpu_scan.Blocked(tuple(spt), tuple(tpw), tuple(wpc), tuple(order))
    x = spread(np.random.default_rng(index), spec["run"])
    y = _execute(got["llir"], spec["num_warps"], spec["kernel"], x)
    reverse = spec["constexprs"]["REVERSE"]
    if spec["kernel"].startswith("scan_"):
        x_scanned, y_scanned = x, y
    elif spec["kernel"] == "fla_local_scalar":  # [B, T, H]: program 0 scans batch 0, head 0
        x_scanned, y_scanned = x[0, :, 0], y[0, :, 0]
    else:  # [B, T, H, S]: program 0 scans batch 0, head 0, columns 0:BS
        bs = spec["constexprs"]["BS"]
        x_scanned, y_scanned = x[0, :, 0, :bs], y[0, :, 0, :bs]
    along = gpu_scan.scan_axis(layout, x_scanned.shape, 0)
    expected = gpu_scan.gpu_scan(x_scanned, 0, along, reverse=reverse)
    np.testing.assert_array_equal(y_scanned.view(np.uint32), expected.view(np.uint32))
    sequential = np.cumsum(x_scanned[::-1], 0)[::-1] if reverse else np.cumsum(x_scanned, 0)
    assert (y_scanned != sequential).any()


@pytest.mark.parametrize("index", [i for i, s in enumerate(LOWERED) if "args" in s])
def test_scan_layout_is_the_layout_triton_gives_the_scans(monkeypatch, lowered, index):
    """scan_layout (SCAN_VECTOR_WIDTH's rule for FLA's kernels, 4 for scan_2d) gives the ttgir's
    layout, whatever the launch's num_warps, block sizes and dtypes."""
    monkeypatch.setitem(triton_interpreter.SCAN_VECTOR_WIDTH, "scan_2d", lambda args: 4)
    spec, got = LOWERED[index], lowered["results"][index]
    args = {k: torch.empty(0, dtype=getattr(torch, v)) if isinstance(v, str) else v for k, v in spec["args"].items()}
    predicted = triton_interpreter.scan_layout(KERNEL_NAME[spec["kernel"]], args, spec["num_warps"], spec["scan"])
    spt, tpw, wpc, order = got["layout"]
    assert predicted == gpu_scan.Blocked(tuple(spt), tuple(tpw), tuple(wpc), tuple(order)), lowered["triton"]


# --- FLA through the harness ----------------------------------------------------------------


@pytest.mark.parametrize(
    "case_id,along",
    [  # simple_gla's g [B, T, H]: the scalar kernel, [64] in 32 lanes; gla's [B, T, H, K]: the
        # vector kernel at BS 32, rows in 4 lanes (sizePerThread [1, 4], threadsPerWarp [4, 8])
        ("simple_gla:local_cumsum-fwd-B2-T100-H2-K64-V64-fp32-C64-g_logsig", gpu_scan.ScanAxis(1, 32, 1)),
        ("gla:local_cumsum-fwd-B1-T100-H2-K64-V64-fp32-C64-g_logsig", gpu_scan.ScanAxis(1, 4, 2)),
    ],
)
def test_flas_local_cumsum_scans_each_chunk_in_the_gpus_order_within_tolerance(case_id, along):
    from cases import Case
    from cases.stages import RCP_LN2
    from parity.execute.backends.fla import FlaBackend
    from parity.execute.backends.oracle import cached_oracle
    from parity.measure.compare import compare_tensor
    from parity.model.inputs import case_inputs

    case = Case.from_id(case_id)
    inputs = case_inputs(case)
    got = FlaBackend().run(case, inputs).tensors["g_cumsum"]
    g, C = inputs["g"], case.chunk_size
    T = g.shape[1]
    padded = np.zeros((g.shape[0], -(-T // C) * C, *g.shape[2:]), np.float32)
    padded[:, :T] = g  # the kernel reads the last chunk's rows past T as 0
    chunks = padded.reshape(g.shape[0], -1, C, *g.shape[2:])
    expected = gpu_scan.gpu_scan(chunks, 2, along) * f32(RCP_LN2)
    expected = expected.reshape(padded.shape)[:, :T]
    np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))
    sequential = np.cumsum(chunks, 2, dtype=f32).reshape(padded.shape)[:, :T] * f32(RCP_LN2)
    assert (got != sequential).any()
    m = compare_tensor(case, "g_cumsum", got, cached_oracle(case, inputs)[0]["g_cumsum"])
    assert m["verdict"] == "pass", m
