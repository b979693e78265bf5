"""ejkernel's TPU Pallas gated delta rule (`ejkernel.kernels._pallas.tpu.gated_delta_rule`), as a
parity candidate for op gdn.

ejkernel 0.0.80.3 (setup.sh: `pip install --no-deps --target DIR "ejkernel==0.0.80.3"` plus what
this module's imports need, beartype, jaxtyping and its wadler_lindig, DIR its own directory,
`target()`: its wheel also brings top-level packages of other names) is EasyDeL's kernel library; its package
`__init__`s import every kernel of every backend (chex, pydantic, tqdm, the GPU backends...).
`load()` imports the gated delta rule without them: the parent packages (ejkernel,
ejkernel.kernels, ._pallas, ._pallas.tpu, ._xla) are registered bare, with their paths, when they
are not imported already; the modules it really imports are ejkernel/errors.py,
kernels/_registry.py, kernels/_xla/gated_delta_rule/ and kernels/_pallas/tpu/gated_delta_rule/.

The harness's calling convention for op gdn (FLA's `chunk_gated_delta_rule`):
    fn(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None)
        q, k [B, T, H, K] L2-normalised; v [B, T, HV, V]; g [B, T, HV] float32 log decay; beta
        [B, T, HV] float32 in (0, 1); initial_state [N, HV, K, V] float32
    S_t = (I - beta_t k_t k_t^T) exp(g_t) S_{t-1} + beta_t k_t v_t^T,  o_t = scale q_t^T S_t
ejkernel's entry point (_pallas/tpu/gated_delta_rule/_interface.py:30):
    gated_delta_rule(query, key, value, beta, decay=None, *, chunk_size=256, initial_state=None,
                     use_qk_l2norm=True, use_chunked=True, seg_ids=None) -> (o, final_state)
        query, key [B, T, H, K], value [B, T, H, V] (one head count: jaxtyping + beartype check
        the shapes), beta [B, T, H] (after its sigmoid: it multiplies), decay [B, T, H] a log
        decay, initial_state [B, H, K, V]; q scaled by K ** -0.5 inside (no scale argument);
        use_qk_l2norm L2-normalises q and k (eps 1e-6) first; seg_ids (packing) raises
        NotImplementedError. It returns o in q's dtype and the final state cast to q's dtype
        (_xla_impl_fwd.py:377; a bfloat16 state for bfloat16 inputs).
    Its paths (_interface.py:110-142): T == 1 with an initial state: a Pallas single-step decode
    kernel (_pallas_impl_fwd.py:817 _run_single_step_forward, custom VJP with a Pallas backward,
    _pallas_impl_bwd.py:704); otherwise `_chunk_gdr_fwd` (_pallas_impl_fwd.py:689), which for
    every T routes to the XLA chunked-WY implementation `_xla.gated_delta_rule._xla_impl_fwd.
    _recurrent_gdr_fwd` (no pallas_call; HIGHEST-precision einsums; jax's autodiff), "for
    numerical stability" (its docstring); the two-phase Pallas chunk kernel in the same file
    (_chunk_gdr_fwd_pallas_chunk) is not reached from the entry point. It asks no platform
    question (jax.default_backend, jax.devices, interpret: none in these modules); its
    pallas_calls pass no interpret, so without a TPU they run only where something supplies one.
The adapter maps:
    use_qk_l2norm=False (the harness's q, k are unit vectors already: normalising again would
      change them by ~1e-7 and project their gradients);
    scale: o times scale * K ** 0.5 where the case's scale is not K ** -0.5 (o is linear in q);
    grouped value heads (HV = G * H): q and k repeated G times along heads (exact);
    chunk_size: the case's (its XLA path's chunk; padded to a multiple);
    T == 1 without an initial state: zeros as initial_state, so that decode takes the Pallas
      kernel, as an inference engine calls it (h0 = 0 is the same recurrence);
    the final state back to float32 (its precision stays what the library returned);
    decode (T == 1): beta, g and the initial state cast to q's dtype before the call, the casts its
      decode path makes first (_pallas_impl_fwd.py:888, :897, :898), so the same values: its custom
      VJP returns their gradients in that dtype (bfloat16 for bfloat16 inputs), and the transpose
      of the adapter's cast brings them back as float32, the dtype of the harness's dg, dbeta, dh0
      (their precision stays what the library returned).
Not supported (supports()): other ops, varlen (cu_seqlens: seg_ids raises NotImplementedError).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types
from pathlib import Path

import jax.numpy as jnp

PACKAGE = "ejkernel"
VERSION = "0.0.80.3"  # the version this adapter was written against
TARGET_ENV = "EJKERNEL_TARGET"
BARE = (
    "ejkernel",
    "ejkernel.kernels",
    "ejkernel.kernels._pallas",
    "ejkernel.kernels._pallas.tpu",
    "ejkernel.kernels._xla",
)
MODULE = "ejkernel.kernels._pallas.tpu.gated_delta_rule"


def target() -> Path:
    """Where setup.sh installs ejkernel and its imports (pip --target): $EJKERNEL_TARGET, or
    <sys.prefix>/pkgs/ejkernel-<VERSION>."""
    return Path(os.environ.get(TARGET_ENV) or Path(sys.prefix) / "pkgs" / f"{PACKAGE}-{VERSION}")


def load():
    """ejkernel's Pallas TPU gated_delta_rule package, from the environment or else from
    `target()`, its parents' __init__s not run (module docstring); ImportError with the set-up
    command when ejkernel is in neither."""
    if MODULE in sys.modules:
        return sys.modules[MODULE]
    for name in BARE:
        if name in sys.modules:
            continue
        parent, _, child = name.rpartition(".")
        spec = importlib.util.find_spec(PACKAGE) if not parent else None
        if spec is None and not parent and (target() / PACKAGE).is_dir():
            sys.path.append(str(target()))
            spec = importlib.util.find_spec(PACKAGE)
        if spec is None and not parent:
            raise ImportError(
                f'{PACKAGE} is not installed: pip install --no-deps --target "{target()}" "{PACKAGE}=={VERSION}" '
                "beartype jaxtyping wadler_lindig (setup.sh)"
            )
        path = list(spec.submodule_search_locations) if not parent else [f"{sys.modules[parent].__path__[0]}/{child}"]
        bare = types.ModuleType(name)
        bare.__path__ = path
        bare.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        bare.__spec__.submodule_search_locations = path
        sys.modules[name] = bare
        if parent:
            setattr(sys.modules[parent], child, bare)
    return importlib.import_module(MODULE)


def gated_delta_rule(
    q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None, chunk_size=64
):
    """ejkernel's Pallas TPU `gated_delta_rule` in the harness's gdn convention (module docstring);
    differentiated through its own path (jax's autodiff of the XLA recurrence for T > 1, its
    custom VJP for decode)."""
    if cu_seqlens is not None:
        raise NotImplementedError("ejkernel's Pallas gated_delta_rule has no varlen (seg_ids raises)")
    gdr = load()
    B, T, H, K = q.shape
    G = v.shape[2] // H
    if G > 1:  # grouped value heads: value head j reads q, k head j // G
        q, k = jnp.repeat(q, G, axis=2), jnp.repeat(k, G, axis=2)
    if T == 1 and initial_state is None:  # decode: the Pallas single-step kernel needs a state
        initial_state = jnp.zeros((B, v.shape[2], K, v.shape[3]), jnp.float32)
    if T == 1:  # decode: the casts to q's dtype the library makes first, made here (exact); their
        # transposes bring its custom VJP's dbeta, dg, dh0 (in q's dtype) back to float32
        beta, g, initial_state = (x.astype(q.dtype) for x in (beta, g, initial_state))
    o, ht = gdr.gated_delta_rule(
        q, k, v, beta, g, chunk_size=chunk_size, initial_state=initial_state, use_qk_l2norm=False
    )
    if scale is not None and scale != K**-0.5:
        o = (o * (scale * K**0.5)).astype(v.dtype)
    return o, (ht.astype(jnp.float32) if output_final_state else None)


def supports(case) -> bool | str:
    """What gated_delta_rule runs (module docstring)."""
    if case.op != "gdn":
        return f"ejkernel's gated_delta_rule takes a per-head gate and beta (op gdn), not {case.op}"
    if case.seqlens is not None:
        return "ejkernel's Pallas gated_delta_rule has no varlen (seg_ids raises NotImplementedError)"
    return True


gated_delta_rule.supports = supports
