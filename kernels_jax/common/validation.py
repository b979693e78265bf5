"""The one input contract of the kernels_jax ops, checked before anything is traced.

Every op takes FLA's layout: q, k [B, T, H, K]; v [B, T, HV, V]; initial_state [N, HV, K, V]
with N = B, or the number of packed sequences when cu_seqlens [N + 1] is given (B == 1); HV = H,
except for the delta-rule ops (kda, gdn, gdn2), where HV may be any multiple G * H (FLA's grouped
value heads: value head j reads q, k head j // G). One rule set for all five ops (`validate`):

    q, k, v      rank 4, one float dtype; B, T, H >= 1
    gates        simple_gla: g [B, T, H] or g_gamma [H] or neither (not both);
                 gla: g [B, T, H, K]; kda: g [B, T, HV, K] and beta [B, T, HV];
                 gdn: g [B, T, HV] and beta [B, T, HV]
                 gdn2: g [B, T, HV, K], erase gate b [B, T, HV, K], write gate w [B, T, HV, V]
                 log-decays (g, g_gamma) must be finite and <= 0 where their values are known
                 (a positive decay overflows exp inside a chunk, as in split-decay-overflow)
    scale        None (K ** -0.5) or a finite number > 0
    chunk_size   one of CHUNK_SIZES
    cu_seqlens   integer [N + 1], B == 1, from 0 to T, non-decreasing (an empty sequence
                 passes its initial state through); concrete or traced
    initial_state  floating [N, H, K, V]

Bad input raises ValueError: "<op>: <argument> must ..., got ...". Valid input the kernels
have no kernel for (a head dim past MAX_K / MAX_V, float16) raises NoKernel, which the
harness records as `unsupported`.
"""

from __future__ import annotations

import dataclasses
import numbers

import jax
import jax.numpy as jnp
import numpy as np

OPS = ("simple_gla", "gla", "kda", "gdn", "gdn2")
DELTA_OPS = ("kda", "gdn", "gdn2")  # grouped value heads; beta (kda, gdn) or the gates b, w (gdn2)
CHUNK_SIZES = (16, 32, 64, 128)
MAX_K = 256
MAX_V = 512
FLOAT_DTYPES = tuple(jnp.dtype(t) for t in (jnp.float32, jnp.bfloat16, jnp.float16))
# what the kernels take as q, k, v on a TPU: Mosaic has no float16 vector loads ("Invalid vector
# type for load" on v5e, v6e and TPU7x alike, measured with the real compiler)
TPU_DTYPES = tuple(jnp.dtype(t) for t in (jnp.float32, jnp.bfloat16))


class NoKernel(ValueError):
    """Valid input these kernels have no kernel for (yet): a head dim past MAX_K / MAX_V, a dtype
    they do not take. Not bad input: the harness reports the case `unsupported` with this message."""


@dataclasses.dataclass(frozen=True)
class Problem:
    """What a valid call asks for: sizes, the scale to use and the chunk size."""

    op: str
    B: int
    T: int
    H: int
    K: int
    V: int
    N: int  # sequences (rows of the state): B, or len(cu_seqlens) - 1
    chunk_size: int
    scale: float
    HV: int  # value heads (of v, o, g, beta, the state): H, or G * H for kda, gdn and gdn2


def check_supported(K: int, V: int, dtype=None, op: str = "kernels_jax") -> None:
    """NoKernel naming the head dimension or dtype no kernel handles (the same for every op:
    any K in 1..MAX_K and V in 1..MAX_V, padded to the op's tiles; float32 or bfloat16)."""
    for name, d, top in (("K (q, k)", K, MAX_K), ("V (v)", V, MAX_V)):
        if not 1 <= d <= top:
            raise NoKernel(f"{op}: head dimension {name} = {d} has no kernel: supported 1 to {top}")
    if dtype is not None and jnp.dtype(dtype) not in TPU_DTYPES:
        raise NoKernel(
            f"{op}: q, k, v dtype {jnp.dtype(dtype).name} has no kernel: supported {[t.name for t in TPU_DTYPES]}"
        )


def is_concrete(x) -> bool:
    """True when x's values are known now (not a tracer under jit/vmap/grad, nor a shape alone)."""
    return not isinstance(x, (jax.core.Tracer, jax.ShapeDtypeStruct))


class _Checker:
    """Raises ValueError("<op>: <name> must ..., got ...")."""

    def __init__(self, op: str):
        self.op = op

    def fail(self, name: str, must: str, got) -> None:
        raise ValueError(f"{self.op}: {name} must {must}, got {got}")

    def array(self, name: str, x, shape: tuple[int, ...] | None = None, rank: int | None = None):
        if not (hasattr(x, "shape") and hasattr(x, "dtype")):
            self.fail(name, "be an array", type(x).__name__)
        if rank is not None and len(x.shape) != rank:
            self.fail(name, f"have rank {rank}", f"shape {tuple(x.shape)}")
        if shape is not None and tuple(x.shape) != tuple(shape):
            self.fail(name, f"have shape {tuple(shape)}", tuple(x.shape))

    def floating(self, name: str, x, shape: tuple[int, ...]):
        self.array(name, x, shape)
        if not jnp.issubdtype(x.dtype, jnp.floating):
            self.fail(name, "be floating point", x.dtype)

    def log_decay(self, name: str, x, shape: tuple[int, ...]):
        self.floating(name, x, shape)
        if is_concrete(x):
            arr = np.asarray(x, np.float64)
            if not np.all(np.isfinite(arr)):
                self.fail(name, "be finite", f"{arr[~np.isfinite(arr)][:4]}")
            if np.any(arr > 0):
                self.fail(name, "be <= 0 (a log-decay: exp of a positive decay overflows)", f"max {arr.max()}")

    def absent(self, name: str, x, why: str):
        if x is not None:
            self.fail(name, f"be None ({why})", type(x).__name__)


def validate(
    op: str,
    q,
    k,
    v,
    *,
    g=None,
    g_gamma=None,
    beta=None,
    b=None,
    w=None,
    scale=None,
    initial_state=None,
    output_final_state=False,
    cu_seqlens=None,
    chunk_size=64,
    require_g_gamma=False,
) -> Problem:
    """Check every argument of an op's entry point (op: one of OPS); -> Problem.
    require_g_gamma: the fused Simple GLA path, which takes per-head g_gamma gating only."""
    chk = _Checker(op)
    for name, x in (("q", q), ("k", k), ("v", v)):
        chk.array(name, x, rank=4)
        if jnp.dtype(x.dtype) not in FLOAT_DTYPES:
            chk.fail(name, f"have a float dtype {[t.name for t in FLOAT_DTYPES]}", x.dtype)
    B, T, H, K = q.shape
    if min(B, T, H, K) < 1:
        chk.fail("q", "have B, T, H, K >= 1", f"shape {tuple(q.shape)}")
    chk.array("k", k, shape=q.shape)
    HV, V = v.shape[2], v.shape[3]
    grouped = op in DELTA_OPS and HV >= 1 and HV % H == 0  # HV = G * H value heads
    if tuple(v.shape[:2]) != (B, T) or V < 1 or not (HV == H or grouped):
        also = ", or HV = G * H value heads in place of H" if op in DELTA_OPS else ""
        chk.fail("v", f"have shape [B, T, H, V] = [{B}, {T}, {H}, V >= 1]{also}", tuple(v.shape))
    if not jnp.dtype(q.dtype) == jnp.dtype(k.dtype) == jnp.dtype(v.dtype):
        chk.fail("k and v", f"have q's dtype {q.dtype} (one dtype)", f"k {k.dtype}, v {v.dtype}")
    if isinstance(chunk_size, bool) or chunk_size not in CHUNK_SIZES:
        chk.fail("chunk_size", f"be one of {CHUNK_SIZES}", repr(chunk_size))
    if op == "simple_gla":
        if g is not None and g_gamma is not None:
            chk.fail("g", "be None when g_gamma is given (one gate, not both)", "both")
        if require_g_gamma and g_gamma is None:
            chk.fail("g_gamma", "be given: the fused path supports per-head g_gamma gating only", None)
        if g is not None:
            chk.log_decay("g", g, (B, T, H))
        if g_gamma is not None:
            chk.log_decay("g_gamma", g_gamma, (H,))
        chk.absent("beta", beta, "simple_gla has no beta")
    elif op in ("gla", "kda", "gdn", "gdn2"):
        per_head = op == "gdn"
        heads = "H" if op == "gla" else "HV"
        shape, named = (
            ((B, T, HV), f"per-head log-decay [B, T, {heads}]")
            if per_head
            else ((B, T, HV, K), f"per-channel log-decay [B, T, {heads}, K]")
        )
        if g is None:
            chk.fail("g", f"be given: {op} needs a {named}", None)
        chk.log_decay("g", g, shape)
        chk.absent("g_gamma", g_gamma, f"{op} gates with g")
        if op == "gdn2":
            chk.absent("beta", beta, "gdn2 gates with b and w")
            if b is None or w is None:
                chk.fail("b" if b is None else "w", "be given: gdn2 needs b [B, T, HV, K] and w [B, T, HV, V]", None)
            chk.floating("b", b, (B, T, HV, K))
            chk.floating("w", w, (B, T, HV, V))
        elif op in DELTA_OPS:
            if beta is None:
                chk.fail("beta", f"be given: {op} needs beta [B, T, HV]", None)
            chk.floating("beta", beta, (B, T, HV))
        else:
            chk.absent("beta", beta, "gla has no beta")
    else:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    if op != "gdn2":
        chk.absent("b", b, f"{op} has no erase gate b")
        chk.absent("w", w, f"{op} has no write gate w")
    if scale is not None:
        if (
            isinstance(scale, bool)
            or not isinstance(scale, (numbers.Real, np.ndarray, jax.Array))
            or not is_concrete(scale)
            or np.ndim(scale) != 0
        ):
            chk.fail("scale", "be None (K ** -0.5) or a Python number", repr(scale))
        if not (np.isfinite(float(scale)) and float(scale) > 0):
            chk.fail("scale", "be finite and > 0", float(scale))
    if not isinstance(output_final_state, (bool, np.bool_)):
        chk.fail("output_final_state", "be a bool", repr(output_final_state))
    N = B
    if cu_seqlens is not None:
        chk.array("cu_seqlens", cu_seqlens, rank=1)
        if not jnp.issubdtype(cu_seqlens.dtype, jnp.integer):
            chk.fail("cu_seqlens", "be an integer array [N + 1]", cu_seqlens.dtype)
        if cu_seqlens.shape[0] < 2:
            chk.fail("cu_seqlens", "have N + 1 >= 2 entries", f"shape {tuple(cu_seqlens.shape)}")
        if B != 1:
            chk.fail("cu_seqlens", "come with B == 1 (sequences packed along T)", f"B = {B}")
        if is_concrete(cu_seqlens):
            cu = np.asarray(cu_seqlens)
            if cu[0] != 0 or cu[-1] != T or np.any(np.diff(cu) < 0):
                chk.fail("cu_seqlens", f"rise from 0 to T = {T} without decreasing", cu.tolist())
        N = cu_seqlens.shape[0] - 1
    if initial_state is not None:
        chk.floating("initial_state", initial_state, (N, HV, K, V))
    check_supported(K, V, q.dtype, op)
    if scale is None:
        scale = K**-0.5
    return Problem(op, B, T, H, K, V, N, int(chunk_size), float(scale), HV)
