"""atomic-ops's GDN-2 Block-Local-Rescaling Pallas kernels (`atomic_gdn2`), as parity candidates.

atomic-ops 0.2.0 (`pip install --no-deps --target <dir> "atomic-ops==0.2.0"`, setup.sh) ships two
top-level packages: `atomic_gdn2` (the BLR kernels used here) and `atomic_ops`, which gdn2-pallas
0.1.1 (examples/gdn2_pallas) ships too, with different files: in one site-packages the one
installed last overwrites the other's. Each is therefore installed into its own --target
directory; `load()` appends this one to sys.path (default `<sys.prefix>/pkgs/atomic-ops-0.2.0`,
or $ATOMIC_OPS_TARGET) and imports only `atomic_gdn2`, which imports nothing from `atomic_ops`.

The harness's calling convention for op gdn2 (FLA's `chunk_gdn2`):
    fn(q, k, v, g, b, w, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None)
        q, k [B, T, H, K]; v [B, T, HV, V]; g, b [B, T, HV, K] float32 (g: log decay);
        w [B, T, HV, V] in v's dtype (bfloat16 in a bfloat16 case); initial_state [N, HV, K, V]
        float32 -> (o [B, T, HV, V] in v's dtype, final state float32 or None); gradients in
        their inputs' dtypes (dq, dk, dv, dw the case's; dg, db, dh0 float32)
    S_t = (I - k_t (b_t * k_t)^T) Diag(exp(g_t)) S_{t-1} + k_t (w_t * v_t)^T,  o_t = scale q_t^T S_t
atomic-ops's entry point (atomic_gdn2/pipeline.py):
    make_blr_trainable(cfg, scale) -> call(q, k, v, w, b, g, h0=None)
        head-major q, k, v, w, b, g [B, H, L, D] (one head count, K = V = D), L a multiple of
        cfg.bt; g a log decay <= 0 (domain.py I-1), b, w as above; h0 [B, H, D, D] float32;
        returns (o [B, H, L, D] float32, h_final [B, H, D, D] float32). A jax.custom_vjp whose
        forward is three pallas_calls (fwd/scores.py build_scores, fwd/solve.py
        wy_solve_leafbatched, fwd/cd_slim.py recompute_and_scan_slim) and whose backward is one
        (bwd/mega.py backward_mega); sequences longer than cfg.max_chunks_per_call (32) chunks
        are cut into segments, the state carried.
    Every pallas_call passes interpret=cfg.interpret, and BLRConfig.interpret's default is
    `dc.field(default_factory=_default_interpret)` with `_default_interpret() = jax.default_backend()
    != "tpu"` (config.py:15-16, :47): asked when the BLRConfig is constructed (make_cfg), not when
    the kernels run. On this host it is True: Pallas's generic interpreter (not TPU interpret mode).
    cfg (make_cfg, the PROD preset): bt 128 = 2 bc, score_bs 128, bs2 32, mb 8, diag "btl",
    wy_eps 1e-3 (the WY solve inverts I + (1 - 1e-3) Akk, not I + Akk), dot_mode "highest" (scores,
    recompute and scan), solve_dot_mode and b3_dot_mode "bf16x3" (three DEFAULT-precision bf16
    products, hi*hi + hi*lo + lo*hi). Its domain (domain.py): g <= 0; beta |k|^2 <= 2; and half
    the decay's span over a block of bs2 tokens below 88 (exp's float32 range), which its layer
    enforces by clamping each token's g at g_max = 160 / bs2.
The adapter maps:
    [B, T, H, D] <-> head-major [B, H, T, D] (transposes); argument order (w, b, g) <- (g, b, w);
    scale None -> K ** -0.5;
    cfg = make_cfg(bt=C, bc=C / 2, score_bs=min(C, 128), bs2=min(C, 32)) with C the case's chunk
      size (the PROD preset's geometry at C = 128), constructed inside the call (so its
      `interpret` default is asked there), everything else make_cfg's: `blr_gdn2`. `blr_gdn2_exact`
      is the same with wy_eps 0 and every dot mode "highest": the exact problem, to tell the
      damping and the bf16x3 products apart from the rest;
    grouped value heads (HV = G * H): q and k repeated G times along heads (exact);
    o cast to v's dtype (the kernels return float32 o); w as the case gives it (v's dtype): the
      kernels read every input as float32 (fwd/cd_slim.py:14, bwd/mega.py:22) and the custom VJP
      returns each gradient in its input's dtype (pipeline.py:44-47): dw in v's dtype, db, dg float32;
    the final state is returned only when the case asks for it.
Not supported (supports()): other ops, K != V, varlen (no cu_seqlens), T not a multiple of the
chunk, a gate beyond its domain (g_stress with |g| above g_max).
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import jax.numpy as jnp

DIST = "atomic-ops"
VERSION = "0.2.0"  # the version this adapter was written against
TARGET_ENV = "ATOMIC_OPS_TARGET"


def target() -> Path:
    """Where setup.sh installs atomic-ops (pip --target): $ATOMIC_OPS_TARGET, or
    <sys.prefix>/pkgs/atomic-ops-<VERSION>."""
    return Path(os.environ.get(TARGET_ENV) or Path(sys.prefix) / "pkgs" / f"{DIST}-{VERSION}")


def load():
    """atomic-ops's `atomic_gdn2`, from its --target directory (module docstring); ImportError with
    the set-up command when it is not there."""
    where = target()
    if not (where / "atomic_gdn2" / "__init__.py").exists():
        raise ImportError(
            f"atomic-ops is not installed in {where}: "
            f'pip install --no-deps --target "{where}" "{DIST}=={VERSION}" (setup.sh)'
        )
    if str(where) not in sys.path:
        sys.path.append(str(where))
    mod = importlib.import_module("atomic_gdn2")
    if Path(mod.__file__).resolve().parent != (where / "atomic_gdn2").resolve():
        raise ImportError(f"atomic_gdn2 is imported from {mod.__file__}, not from {where}")
    return mod


def geometry(chunk_size: int) -> dict:
    """make_cfg's geometry for chunk C: bt = C = 2 bc, score_bs = min(C, 128), bs2 = min(C, 32)."""
    return dict(bt=chunk_size, bc=chunk_size // 2, score_bs=min(chunk_size, 128), bs2=min(chunk_size, 32))


EXACT = dict(wy_eps=0.0, dot_mode="highest", solve_dot_mode="highest", b3_dot_mode="highest")


def _blr(overrides, q, k, v, g, b, w, scale, initial_state, output_final_state, cu_seqlens, chunk_size):
    if cu_seqlens is not None:
        raise NotImplementedError("atomic-ops has no varlen (cu_seqlens) entry point")
    blr = load()
    K, G = q.shape[-1], v.shape[2] // q.shape[2]
    if G > 1:  # grouped value heads: value head j reads q, k head j // G
        q, k = jnp.repeat(q, G, axis=2), jnp.repeat(k, G, axis=2)
    scale = K**-0.5 if scale is None else scale
    cfg = overrides.get("cfg") or blr.make_cfg(**geometry(chunk_size), **overrides)  # interpret asked here
    hm = [jnp.swapaxes(x, 1, 2) for x in (q, k, v, w, b, g)]
    o, ht = blr.make_blr_trainable(cfg, scale)(*hm, initial_state)
    return jnp.swapaxes(o, 1, 2).astype(v.dtype), (ht if output_final_state else None)


def blr_gdn2(
    q, k, v, g, b, w, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None, chunk_size=64
):
    """atomic_gdn2.make_blr_trainable under make_cfg's settings, in the harness's gdn2 convention
    (module docstring); forward and backward through its custom VJP."""
    return _blr({}, q, k, v, g, b, w, scale, initial_state, output_final_state, cu_seqlens, chunk_size)


def blr_gdn2_exact(
    q, k, v, g, b, w, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None, chunk_size=64
):
    """`blr_gdn2` with wy_eps 0 and every dot mode "highest" (EXACT)."""
    return _blr(EXACT, q, k, v, g, b, w, scale, initial_state, output_final_state, cu_seqlens, chunk_size)


# A BLRConfig made when this module is imported, as a model's module-level config would be: its
# `interpret` is the answer jax.default_backend() gave at import time (config.py:47), whatever the
# platform is when the kernels run. `blr_gdn2_import_time_cfg` runs on it (chunk 64 only).
IMPORT_TIME_CHUNK = 64
try:
    IMPORT_TIME_CFG = load().make_cfg(**geometry(IMPORT_TIME_CHUNK))
except ImportError:  # atomic-ops not installed: the candidates say so when called
    IMPORT_TIME_CFG = None


def blr_gdn2_import_time_cfg(
    q, k, v, g, b, w, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None, chunk_size=64
):
    """`blr_gdn2` on IMPORT_TIME_CFG, the BLRConfig made when this module was imported."""
    if IMPORT_TIME_CFG is None:
        load()  # raises ImportError with the set-up command
    if chunk_size != IMPORT_TIME_CHUNK:
        raise NotImplementedError(f"IMPORT_TIME_CFG is for chunk {IMPORT_TIME_CHUNK}: chunk {chunk_size}")
    return _blr(
        {"cfg": IMPORT_TIME_CFG}, q, k, v, g, b, w, scale, initial_state, output_final_state, cu_seqlens, chunk_size
    )


def supports(case) -> bool | str:
    """What make_blr_trainable runs (module docstring)."""
    if case.op != "gdn2":
        return f"atomic-ops computes GDN-2 (op gdn2), not {case.op}"
    if case.K != case.V:
        return f"atomic-ops's kernels take one head dim D for q, k, v, w, b, g (K = V): K={case.K}, V={case.V}"
    if case.seqlens is not None:
        return "atomic-ops has no varlen (cu_seqlens) entry point"
    if case.T % case.chunk_size:
        return f"atomic-ops needs T a multiple of its chunk (cfg.bt = {case.chunk_size}): T={case.T}"
    bs2 = geometry(case.chunk_size)["bs2"]
    if case.gate == "g_stress" and 1.5 * case.gate_kwargs["mag"] > 160.0 / bs2:
        g_max, reach = 160.0 / bs2, 1.5 * case.gate_kwargs["mag"]
        return f"atomic-ops's domain (domain.py I-3): |g| <= g_max = {g_max} per token; g_stress reaches {reach}"
    return True


blr_gdn2.supports = supports
blr_gdn2_exact.supports = supports
blr_gdn2_import_time_cfg.supports = supports
