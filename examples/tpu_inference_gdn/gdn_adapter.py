"""tpu-inference's Pallas TPU kernels for the gated delta rule, as parity candidates.

tpu-inference (pip install --no-deps "tpu-inference==0.32.0": the TPU backend of vLLM) ships its
GDN kernels in `tpu_inference.kernels.gdn`; they import only jax, but the package's own
`__init__` imports vLLM's platform code. `load(module)` imports a kernel module without running
that `__init__` (the top package is registered bare, with its path, when it is not imported
already), so no vLLM is needed.

The harness's calling convention, op kda (FLA's `chunk_kda`):
    fn(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None)
        q, k [B, T, H, K]; v [B, T, H, V]; g [B, T, H, K] (per-channel log decay) or [B, T, H]
        (per-head: GDN's); beta [B, T, H] in (0, 1); initial_state [N, H, K, V]
        -> (o [B, T, H, V], final state [N, H, K, V] float32, or None)
tpu-inference's convention, packed tokens and a state cache (`fused_gdn`, v1):
    fused_gdn(q [T, H_qk, K], k, v [T, H_v, V], cu_seqlens [N + 1], g [T, H_v, K] or [T, H_v],
              initial_state [num_states, H_v, K, V], state_indices [N], distribution [2], b [T, H_v])
        b is beta before its sigmoid (the kernel applies it); distribution = (decode requests,
        requests): the first requests, of one token each, go to the decode kernel
`Packed` does the conversion once, both ways; a per-head gate and H_v = G * H_qk (GDN, op gdn)
pass through unchanged. The kernels have no backward: the candidates are forward-only
(`forward_only = True`), judged on (o, final state) of every case.

    parity run --suite ci --backends oracle,fla --candidate v1=pallas:gdn_adapter:fused_gdn_v1 ...
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import sys
import types

import jax.numpy as jnp
import numpy as np

PACKAGE = "tpu_inference"
VERSION = "0.32.0"  # the version this adapter was written against


def load(module: str):
    """tpu_inference.<module>, imported without running tpu_inference/__init__.py (which imports
    vLLM); ImportError with the set-up command when tpu-inference is not installed."""
    if PACKAGE not in sys.modules:
        spec = importlib.util.find_spec(PACKAGE)
        if spec is None or not spec.submodule_search_locations:
            raise ImportError(f'{PACKAGE} is not installed: pip install --no-deps "tpu-inference=={VERSION}"')
        bare = types.ModuleType(PACKAGE)
        bare.__path__ = list(spec.submodule_search_locations)
        bare.__spec__ = spec
        sys.modules[PACKAGE] = bare
    return importlib.import_module(f"{PACKAGE}.{module}")


@dataclasses.dataclass(frozen=True)
class Packed:
    """A batch in tpu-inference's packed layout: B sequences of T tokens (or one packed
    sequence with cu_seqlens) as T_total = B * T tokens and N requests."""

    B: int
    T: int
    cu_seqlens: np.ndarray  # [N + 1] int32

    @classmethod
    def of(cls, q, cu_seqlens) -> Packed:
        B, T = q.shape[:2]
        cu = np.arange(B + 1, dtype=np.int32) * T if cu_seqlens is None else np.asarray(cu_seqlens, np.int32)
        return cls(B, T, cu)

    @property
    def N(self) -> int:
        return len(self.cu_seqlens) - 1

    def decode_requests(self) -> int:
        """The leading requests of one token each: tpu-inference's decode kernel runs those."""
        lengths = np.diff(self.cu_seqlens)
        return int(np.argmax(lengths != 1)) if (lengths != 1).any() else self.N

    def pack(self, x):
        """[B, T, ...] -> [B * T, ...]"""
        return x.reshape(self.B * self.T, *x.shape[2:])

    def unpack(self, x):
        """[B * T, ...] -> [B, T, ...]"""
        return x.reshape(self.B, self.T, *x.shape[1:])


def _raw_beta(beta):
    """The b whose sigmoid is beta (tpu-inference takes beta before its sigmoid), in float32."""
    beta = beta.astype(jnp.float32)
    return jnp.log(beta) - jnp.log1p(-beta)


def fused_gdn_v1(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
    """tpu-inference v1 `fused_gdn` (decode + recurrent Pallas kernels) in the kda convention
    (module docstring); shapes as there."""
    wrapper = load("kernels.gdn.v1.fused_gdn_kernel_wrapper")
    p = Packed.of(q, cu_seqlens)
    H, K, V = v.shape[2], q.shape[-1], v.shape[-1]
    state = jnp.zeros((p.N, H, K, V), jnp.float32) if initial_state is None else initial_state.astype(jnp.float32)
    o, new_state = wrapper.fused_gdn(
        p.pack(q),
        p.pack(k),
        p.pack(v),
        jnp.asarray(p.cu_seqlens),
        p.pack(g),
        state,
        jnp.arange(p.N, dtype=jnp.int32),
        jnp.asarray([p.decode_requests(), p.N], jnp.int32),
        b=p.pack(_raw_beta(beta)),
        scale=scale,
    )
    return p.unpack(o), (new_state if output_final_state else None)


LANES = 128  # a TPU vector register's lanes, v4 to TPU7x (pltpu.get_tpu_info().num_lanes)


def supports_v1(case) -> bool | str:
    """What fused_gdn runs: the gated delta rule (op kda; gdn, a per-head gate, once the harness
    has it) with K and V multiples of the TPU's lanes (its own check: validate_gdn_inputs)."""
    if case.op not in ("kda", "gdn"):
        return f"tpu-inference's GDN kernels compute the gated delta rule (kda, gdn), not {case.op}"
    if case.K % LANES or case.V % LANES:
        return f"fused_gdn needs K and V multiples of {LANES} (the TPU's lanes): K={case.K}, V={case.V}"
    return True


fused_gdn_v1.forward_only = True
fused_gdn_v1.supports = supports_v1
