"""gdn2-pallas's GDN-2 (Gated DeltaNet-2) entry points, as parity candidates.

gdn2-pallas 0.1.1 (`pip install --no-deps --target <dir> "gdn2-pallas==0.1.1"`, setup.sh) ships the
top-level package `atomic_ops`, and so does atomic-ops 0.2.0 (examples/atomic_ops), with different
files (configs.py, gdn2_fwd.py, gdn2_bwd.py and __init__.py differ): installed into one
site-packages, whichever is installed last overwrites the other's files. Each is therefore
installed into its own --target directory, and `load()` puts this one first on sys.path
(default `<sys.prefix>/pkgs/gdn2-pallas-0.1.1`, or $GDN2_PALLAS_TARGET) and checks that the
`atomic_ops` it imports is the one from there.

The harness's calling convention for op gdn2 (FLA's `chunk_gdn2`):
    fn(q, k, v, g, b, w, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None)
        q, k [B, T, H, K]; v [B, T, HV, V]; g, b [B, T, HV, K] float32 (g: log decay);
        w [B, T, HV, V] in v's dtype (bfloat16 in a bfloat16 case); initial_state [N, HV, K, V]
        float32 -> (o [B, T, HV, V] in v's dtype, final state [N, HV, K, V] float32 or None);
        gradients in their inputs' dtypes (dq, dk, dv, dw the case's; dg, db, dh0 float32)
    S_t = (I - k_t (b_t * k_t)^T) Diag(exp(g_t)) S_{t-1} + k_t (w_t * v_t)^T,  o_t = scale q_t^T S_t
gdn2-pallas's public entry points (atomic_ops/fallback.py):
    gdn2_forward(q, k, v, w, b, g, scale, h0=None, config=None)            (inference)
    gdn2_forward_trainable(q, k, v, w, b, g, scale, h0=None, config=None)  (custom_vjp on a TPU)
        q, k, v, w, b, g all [B, L, H, D] (one head count, K = V = D); g a log decay (the kernels
        and the reference take exp(g)); b, w multiply k and v as above; scale required; h0
        [B, H, D, D] float32; returns (o [B, L, H, D] in q's dtype, h_final [B, H, D, D] float32)
        always. The same recurrence as FLA's (reference.py:gdn2_token_serial_reference).
    Both ask `utils.is_tpu_available()` (jax.devices("tpu")[0].platform == "tpu", any exception:
    False; utils.py:6-11) and D == 128: then the Pallas kernels (gdn2_fwd.gdn2_pallas_forward, or
    gdn2_pipeline.gdn2_pallas_forward_trainable with its fused Pallas backward); otherwise the
    pure-JAX `reference.gdn2_chunked_wy_reference(q, k, v, g, b, w, scale, chunk_size=config.bt,
    h0=h0)` (fallback.py:9-22), differentiated by jax's autodiff, with wy_eps 0 (the kernels
    damp the WY solve by config.wy_eps = 1e-3).
The adapter maps:
    argument order (w, b, g) <- (g, b, w); scale None -> K ** -0.5 (the library takes no default);
    config: DEFAULT_CONFIG (KAGGLE_MEDIUM: bt 256, bc 128, mb 16, clip 1e4, wy_eps 1e-3) with the
      case's chunk size as bt (bc = bt / 2, which KernelConfig requires; mb = min(16, bc)): the
      reference's chunk is config.bt and T must be a multiple of it;
    grouped value heads (HV = G * H): q and k repeated G times along heads (value head j reads
      q, k head j // G: exact, and their gradients sum back through the repeat);
    o cast to v's dtype (the Pallas forward returns float32 o for bfloat16 inputs, the reference
      q's dtype); the final state (float32) is returned only when the case asks for it;
    w as the case gives it (its dtype is v's): the kernels read every input as float32
      (gdn2_fwd.py:229) and the custom VJP returns each gradient in its input's dtype
      (gdn2_pipeline.py:130-136), so dw comes back in v's dtype, db and dg float32, as FLA's.
Not supported (supports()): other ops, varlen (no cu_seqlens), T not a multiple of the chunk,
K = 128 with V != 128 (on a TPU, K = 128 takes the Pallas path, which needs V = K).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
from pathlib import Path

import jax.numpy as jnp

DIST = "gdn2-pallas"
VERSION = "0.1.1"  # the version this adapter was written against
TARGET_ENV = "GDN2_PALLAS_TARGET"
MXU_D = 128  # fallback.py: the Pallas path only for q.shape[-1] == 128


def target() -> Path:
    """Where setup.sh installs gdn2-pallas (pip --target): $GDN2_PALLAS_TARGET, or
    <sys.prefix>/pkgs/gdn2-pallas-<VERSION>."""
    return Path(os.environ.get(TARGET_ENV) or Path(sys.prefix) / "pkgs" / f"{DIST}-{VERSION}")


def load():
    """gdn2-pallas's `atomic_ops`, from its --target directory (module docstring); ImportError with
    the set-up command when it is not there, or when another `atomic_ops` (atomic-ops') is
    imported already in this process."""
    where = target()
    if not (where / "atomic_ops" / "__init__.py").exists():
        raise ImportError(
            f"gdn2-pallas is not installed in {where}: "
            f'pip install --no-deps --target "{where}" "{DIST}=={VERSION}" (setup.sh)'
        )
    mod = sys.modules.get("atomic_ops")
    if mod is None:
        if str(where) in sys.path:
            sys.path.remove(str(where))
        sys.path.insert(0, str(where))
        mod = importlib.import_module("atomic_ops")
    if Path(mod.__file__).resolve().parent != (where / "atomic_ops").resolve():
        raise ImportError(
            f"atomic_ops is imported from {mod.__file__}, not from gdn2-pallas's {where}: gdn2-pallas and "
            "atomic-ops both ship a package named atomic_ops; run them in separate processes"
        )
    return mod


def config_for(ops, chunk_size: int):
    """DEFAULT_CONFIG with the case's chunk size as bt (bc = bt / 2, mb at most bc)."""
    base = ops.DEFAULT_CONFIG
    bc = chunk_size // 2
    return dataclasses.replace(base, bt=chunk_size, bc=bc, mb=min(base.mb, bc))


def _call(entry: str, q, k, v, g, b, w, scale, initial_state, output_final_state, cu_seqlens, chunk_size):
    if cu_seqlens is not None:
        raise NotImplementedError("gdn2-pallas has no varlen (cu_seqlens) entry point")
    ops = load()
    K, G = q.shape[-1], v.shape[2] // q.shape[2]
    if G > 1:  # grouped value heads: value head j reads q, k head j // G
        q, k = jnp.repeat(q, G, axis=2), jnp.repeat(k, G, axis=2)
    scale = K**-0.5 if scale is None else scale
    o, ht = getattr(ops, entry)(q, k, v, w, b, g, scale, h0=initial_state, config=config_for(ops, chunk_size))
    # o in v's dtype, as FLA's and the library's own reference return it: its Pallas forward
    # returns float32 o for bfloat16 inputs (gdn2_fwd.py:376, no cast)
    return o.astype(v.dtype), (ht if output_final_state else None)


def gdn2_forward_trainable(
    q, k, v, g, b, w, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None, chunk_size=64
):
    """atomic_ops.gdn2_forward_trainable (fallback.py:17) in the harness's gdn2 convention (module
    docstring); differentiated through the library's own path (its custom VJP on a TPU, jax's
    autodiff of the reference elsewhere)."""
    return _call(
        "gdn2_forward_trainable", q, k, v, g, b, w, scale, initial_state, output_final_state, cu_seqlens, chunk_size
    )


def gdn2_forward(
    q, k, v, g, b, w, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None, chunk_size=64
):
    """atomic_ops.gdn2_forward (fallback.py:9), the inference entry point: forward-only (its
    Pallas path, gdn2_fwd.gdn2_pallas_forward, has no VJP)."""
    return _call("gdn2_forward", q, k, v, g, b, w, scale, initial_state, output_final_state, cu_seqlens, chunk_size)


def supports(case) -> bool | str:
    """What the entry points run (module docstring)."""
    if case.op != "gdn2":
        return f"gdn2-pallas computes GDN-2 (op gdn2), not {case.op}"
    if case.seqlens is not None:
        return "gdn2-pallas has no varlen (cu_seqlens) entry point"
    if case.T % case.chunk_size:
        return f"gdn2-pallas needs T a multiple of its chunk (config.bt = {case.chunk_size}): T={case.T}"
    if case.chunk_size < 4:
        return f"KernelConfig needs bt = 2 bc with bc a multiple of mb: chunk {case.chunk_size}"
    if case.K == MXU_D and case.V != case.K:
        return f"on a TPU, K = {MXU_D} takes the Pallas path, which needs V = K (one D): K={case.K}, V={case.V}"
    return True


gdn2_forward_trainable.supports = supports
gdn2_forward.supports = supports
gdn2_forward.forward_only = True
