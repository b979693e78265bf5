"""Input checks shared by the kernels_jax ops, run before any kernel is traced.

Every failure is a ValueError whose message starts with the argument's name, e.g.
"g_gamma must be <= 0 ...". Layout is FLA's: q, k [B, T, H, K]; v [B, T, H, V];
initial_state [N, H, K, V] with N = B, or the number of packed sequences with cu_seqlens.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

MAX_HEAD_DIM = 256
FLOAT_DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)
# what the kernels take as q, k, v on a TPU: Mosaic has no float16 vector loads ("Invalid vector
# type for load" on v5e, v6e and TPU7x alike, measured with the real compiler)
TPU_DTYPES = (jnp.float32, jnp.bfloat16)


class NoKernel(ValueError):
    """Valid input these kernels have no kernel for (yet): a head dim they cannot tile, a dtype
    they do not take. Not bad input: the harness reports the case `unsupported` with this message."""


def check_supported(op: str, K: int, V: int, dtype, dims_ok, dims_text: str, dtypes) -> None:
    """NoKernel naming the head dimension or dtype the op's kernels do not handle.
    dims_ok(d) -> bool says which head dims they tile (`dims_text` in words); dtypes, which
    q/k/v dtypes they take."""
    for name, d in (("K (q, k)", K), ("V (v)", V)):
        if not dims_ok(d):
            raise NoKernel(f"{op}: head dimension {name} = {d} has no kernel: supported {dims_text}")
    if dtype is not None and jnp.dtype(dtype) not in [jnp.dtype(t) for t in dtypes]:
        raise NoKernel(f"{op}: q, k, v dtype {jnp.dtype(dtype).name} has no kernel: supported "
                       f"{[jnp.dtype(t).name for t in dtypes]}")


def simple_gla_supported(K: int, V: int, dtype=None) -> None:
    """NoKernel unless the Simple GLA kernels take these head dims and dtype."""
    check_supported("simple_gla", K, V, dtype, lambda d: 1 <= d <= MAX_HEAD_DIM, f"1 to {MAX_HEAD_DIM}",
                    TPU_DTYPES)


def is_concrete(x) -> bool:
    """True when x's values are known now (not a tracer under jit/vmap/grad)."""
    return not isinstance(x, jax.core.Tracer)


def check_qkv(q, k, v) -> tuple[int, int, int, int, int]:
    """(B, T, H, K, V) of q, k [B, T, H, K] and v [B, T, H, V] after checking ranks and dtypes."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if jnp.ndim(x) != 4:
            raise ValueError(f"{name} must have rank 4 [B, T, H, D], got shape {jnp.shape(x)}")
        if jnp.result_type(x) not in FLOAT_DTYPES:
            raise ValueError(f"{name} must be float32, bfloat16 or float16, got {jnp.result_type(x)}")
    B, T, H, K = q.shape
    if k.shape != q.shape:
        raise ValueError(f"k must have the shape of q {q.shape} [B, T, H, K], got {k.shape}")
    if v.shape[:3] != (B, T, H):
        raise ValueError(f"v must have shape [B, T, H, V] = [{B}, {T}, {H}, V], got {v.shape}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k and v must share one dtype, got q {q.dtype}, k {k.dtype}, v {v.dtype}")
    V = v.shape[3]
    if T < 1 or H < 1 or B < 1:
        raise ValueError(f"q must have B, T, H >= 1, got shape {q.shape}")
    simple_gla_supported(K, V, q.dtype)
    return B, T, H, K, V


def check_float(name: str, x, shape: tuple[int, ...]) -> None:
    """x has exactly `shape` and a floating dtype."""
    if tuple(jnp.shape(x)) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(jnp.shape(x))}")
    if not jnp.issubdtype(jnp.result_type(x), jnp.floating):
        raise ValueError(f"{name} must be a floating dtype, got {jnp.result_type(x)}")


def check_nonpositive(name: str, x) -> None:
    """A log-decay must be <= 0 (exp of a positive decay overflows); checked when x is concrete."""
    if is_concrete(x):
        arr = np.asarray(x, dtype=np.float64)
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"{name} must be finite, got {arr.ravel()[~np.isfinite(arr.ravel())][:4]}")
        if np.any(arr > 0):
            raise ValueError(f"{name} must be <= 0 (a log-decay), got max {arr.max()}")


def check_chunk_size(chunk_size) -> int:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, np.integer)):
        raise ValueError(f"chunk_size must be an int, got {chunk_size!r}")
    c = int(chunk_size)
    if c < 16 or c & (c - 1):
        raise ValueError(f"chunk_size must be a power of two >= 16, got {c}")
    return c


def check_scale(scale, K: int, V: int | None = None) -> float:
    """The scale as a Python float (default K ** -0.5)."""
    if scale is None:
        from .mutation import active
        return (V if active("scale_from_v") and V else K) ** -0.5   # mutation: K and V swapped
    if not is_concrete(scale) or np.ndim(scale) != 0:
        raise ValueError(f"scale must be a Python number or None, got {scale!r}")
    s = float(scale)
    if not np.isfinite(s):
        raise ValueError(f"scale must be finite, got {s}")
    return s


def check_cu_seqlens(cu_seqlens, B: int, T: int) -> tuple[int, ...] | None:
    """The boundaries [N + 1] as a tuple of ints (0 = cu[0] < ... < cu[N] = T), or None."""
    if cu_seqlens is None:
        return None
    if not is_concrete(cu_seqlens):
        raise ValueError("cu_seqlens must be concrete (numpy or a concrete jax array), not traced: "
                         "the packed layout is planned on the host")
    cu = np.asarray(cu_seqlens)
    if not np.issubdtype(cu.dtype, np.integer):
        raise ValueError(f"cu_seqlens must be an integer array, got {cu.dtype}")
    if B != 1:
        raise ValueError(f"cu_seqlens requires B == 1 (packed sequences), got B={B}")
    if cu.ndim != 1 or cu.size < 2:
        raise ValueError(f"cu_seqlens must be a 1-D array [N + 1] with N >= 1, got shape {cu.shape}")
    if cu[0] != 0:
        raise ValueError(f"cu_seqlens must start at 0, got {cu[0]}")
    if np.any(np.diff(cu) <= 0):
        raise ValueError(f"cu_seqlens must be strictly increasing, got {cu.tolist()}")
    if cu[-1] != T:
        raise ValueError(f"cu_seqlens must end at T={T}, got {cu[-1]}")
    return tuple(int(x) for x in cu)
