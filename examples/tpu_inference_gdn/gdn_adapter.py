"""tpu-inference's Pallas TPU kernels for the gated delta rule, as parity candidates.

tpu-inference (pip install --no-deps "tpu-inference==0.32.0": the TPU backend of vLLM) ships its
GDN kernels in `tpu_inference.kernels.gdn`; they import only jax, but the package's own
`__init__` imports vLLM's platform code. `load(module)` imports a kernel module without running
that `__init__` (the top package is registered bare, with its path, when it is not imported
already), so no vLLM is needed.

The harness's calling convention, ops kda (FLA's `chunk_kda`) and gdn (`chunk_gated_delta_rule`):
    fn(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None)
        q, k [B, T, H, K]; v [B, T, HV, V]; g [B, T, HV, K] (kda: per-channel log decay) or
        [B, T, HV] (gdn: per head); beta [B, T, HV] in (0, 1); initial_state [N, HV, K, V]
        -> (o [B, T, HV, V], final state [N, HV, K, V] float32, or None)
tpu-inference's convention, packed tokens and a state cache (`fused_gdn`, v1):
    fused_gdn(q [T, H_qk, K], k, v [T, H_v, V], cu_seqlens [N + 1], g [T, H_v, K] or [T, H_v],
              initial_state [num_states, H_v, K, V], state_indices [N], distribution [2], b [T, H_v])
        b is beta before its sigmoid (the kernel applies it); distribution = (decode requests,
        requests): the first requests, of one token each, go to the decode kernel
`Packed` does the conversion once, both ways; a per-head gate and H_v = G * H_qk (GDN, op gdn)
pass through unchanged. v2 (`recurrent_scan_v2.recurrent_scan`: mixed qkv, GDN's A_log,
dt_bias, a gate, SiLU and L2 norm inside) is `recurrent_scan_v2` below, through SiLU
pre-images, float32 only (its docstring). The kernels have no backward: the candidates are
forward-only (`forward_only = True`), judged on (o, final state) of every case.

v3 (`v3.wrapper.fused_conv1d_gdn`) is not a candidate: it computes a causal conv1d of the mixed
qkv, then SiLU of the conv's output (v3/wrapper.py:110-111, `qkv_out_compact =
jax.nn.silu(qkv_out_compact)`, unconditional), then GDN. The conv alone could be an exact
identity (weights [dim, 1, width] that select the current token, conv_bias None: it runs in
float32, wrapper.py:86-94), but the SiLU after it cannot: the harness's gdn op has no
activation, values below SiLU's minimum (-0.278) have no pre-image at all, and in floating point
the pre-image of the others comes back through SiLU only approximately, so no input makes v3
compute GDN on the case's q, k, v exactly. v2 applies the same SiLU, and runs here only through
computed pre-images of power-of-two-scaled inputs (back to 2.5e-7 in float32, not exactly); v3
would need the same, which this adapter does not add.

    parity run --suite ci --backends oracle,fla --candidate v1=pallas:gdn_adapter:fused_gdn_v1 \
        --candidate v2=pallas:gdn_adapter:recurrent_scan_v2 ...
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import sys
import types

import jax
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

    def state(self, initial_state, v, K: int):
        """The state cache, float32 [N, HV, K, V]: the initial state, or zeros (v [B, T, HV, V])."""
        if initial_state is not None:
            return initial_state.astype(jnp.float32)
        return jnp.zeros((self.N, v.shape[2], K, v.shape[3]), jnp.float32)

    def state_indices(self):
        """Request i reads and writes state slot i."""
        return jnp.arange(self.N, dtype=jnp.int32)


def _raw_beta(beta):
    """The b whose sigmoid is beta (tpu-inference takes beta before its sigmoid), in float32."""
    beta = beta.astype(jnp.float32)
    return jnp.log(beta) - jnp.log1p(-beta)


def fused_gdn_v1(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
    """tpu-inference v1 `fused_gdn` (decode + recurrent Pallas kernels) in the kda convention
    (module docstring); shapes as there."""
    wrapper = load("kernels.gdn.v1.fused_gdn_kernel_wrapper")
    p = Packed.of(q, cu_seqlens)
    o, new_state = wrapper.fused_gdn(
        p.pack(q),
        p.pack(k),
        p.pack(v),
        jnp.asarray(p.cu_seqlens),
        p.pack(g),
        p.state(initial_state, v, q.shape[-1]),
        p.state_indices(),
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


# v2: recurrent_scan_v2.recurrent_scan, the token-packed recurrent scan for Qwen3-Next's layer.
# It takes the conv1d's output, before its activation: the kernel itself applies SiLU to the
# whole mixed qkv (recurrent_scan_impl.py:336 regular prefill, :524 transition prefill, :770
# decode: `qkv = jax.nn.silu(qkv)`, unconditionally), then L2-normalises q and k
# (use_qk_norm_in_gdn, eps 1e-6 under the root: :27-29, :370-372) and scales q by d_k ** -0.5
# (:385; it takes no scale). The gate is g = max(-exp(A_log) * softplus(a + dt_bias), -100)
# (:348-356, :803-804) and beta = sigmoid(b) (:347). So the adapter gives it SiLU pre-images.
SILU_FLOOR = 0.25  # pre-images of values >= -0.25: SiLU's minimum is -0.2785 (at x = -1.2785)
NEWTON_STEPS = 8  # from x = y + 0.3; 6 reach float32's accuracy (max |silu(x) - y| / |y| 2.5e-7)
G_FLOOR = -100.0  # v2 clamps its log gate there


def _silu_preimage(y):
    """x on SiLU's increasing branch (x > -1.2785) with silu(x) = y, for y >= -SILU_FLOOR, in
    float32: Newton's method from x = y + 0.3, which lies right of the root (x - silu(x) <= 0.28
    there) where SiLU is increasing and convex, so the iterates decrease to it monotonically."""
    y = y.astype(jnp.float32)
    x = y + 0.3
    for _ in range(NEWTON_STEPS):
        s = jax.nn.sigmoid(x)
        x = x - (x * s - y) / (s * (1.0 + x * (1.0 - s)))
    return x


def _pow2_scale(x, axis=None):
    """2 ** n <= 1, the largest with 2 ** n * min(x) >= -SILU_FLOOR (over `axis`, kept): a
    power of two, so that scaling by it, and back, is exact in floating point."""
    worst = jnp.maximum(-jnp.min(x.astype(jnp.float32), axis=axis, keepdims=axis is not None), 2.0**-60)
    n = jnp.minimum(jnp.floor(jnp.log2(SILU_FLOOR / worst)), 0.0).astype(jnp.int32)
    return jnp.ldexp(jnp.ones_like(worst), n)


def _raw_gate(g):
    """a with softplus(a) = -g (v2's gate with A_log = 0, dt_bias = 0), in float32, stably:
    softplus^-1(x) = log(expm1(x)) = x + log(-expm1(-x)) for x = -g >= 0 (-inf at g = 0,
    whose softplus is 0)."""
    x = -g.astype(jnp.float32)
    return x + jnp.log(-jnp.expm1(-x))


def recurrent_scan_v2(
    q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None, chunk_size=128
):
    """tpu-inference v2 `recurrent_scan` (decode and chunked prefill in one Pallas kernel) in the
    harness's gdn convention: q, k [B, T, H, K] L2-normalised; v [B, T, HV, V]; g, beta [B, T, HV].

    What the kernel computes on its mixed qkv x is GDN on (l2norm(silu(x_q)), l2norm(silu(x_k)),
    silu(x_v)) with q scaled by K ** -0.5 (notes above `SILU_FLOOR`). The adapter hands it:
      x_q, x_k  pre-images of 2^n q, 2^n k, each row's largest 2^n <= 1 that keeps its entries
                >= -0.25 (q, k are unit vectors: n >= -2): the kernel's L2 norm takes the 2^n
                out again, up to its eps (relative 1e-6 / 2^(2n+1) <= 8e-6);
      x_v       the pre-image of 2^m v, one 2^m for the tensor; the initial state is scaled by
                2^m too and o and the final state by 2^-m, exactly (both are linear in (v, h0));
      a         softplus^-1(-g), with A_log = 0 and dt_bias = 0; b = logit(beta);
      o         times scale * K ** 0.5 where the case's scale is not K ** -0.5 (o is linear in q);
      chunk_size  the case's, as both its prefill chunk and decode block (BT), as tpu-inference's
                own caller does (reference/ragged_gated_delta_rule_wrapper.py: chunk_size=BT).
    The pre-images come back through SiLU to float32's accuracy (2.5e-7 relative at most), not
    exactly: float32 only (`supports_v2`)."""
    scan = load("kernels.gdn.v2.recurrent_scan_v2")
    p = Packed.of(q, cu_seqlens)
    H, K = q.shape[2], q.shape[3]
    HV, V = v.shape[2], v.shape[3]
    qk_scale = _pow2_scale(jnp.concatenate([q, k], axis=-1), axis=-1)  # [B, T, H, 1], for both
    v_scale = _pow2_scale(v)
    mixed = [_silu_preimage(x * qk_scale).reshape(p.B * p.T, H * K) for x in (q, k)]
    mixed = jnp.concatenate([*mixed, _silu_preimage(v * v_scale).reshape(p.B * p.T, HV * V)], axis=-1)
    has_h0 = initial_state is not None
    new_state, o = scan.recurrent_scan(
        mixed.astype(q.dtype),
        p.pack(_raw_beta(beta)),
        p.pack(_raw_gate(g)),
        p.state(initial_state, v, K) * v_scale,
        jnp.zeros((HV,), jnp.float32),  # A_log: exp(0) = 1
        jnp.zeros((HV,), jnp.float32),  # dt_bias
        jnp.asarray(p.cu_seqlens),
        p.state_indices(),
        jnp.asarray([p.decode_requests(), p.N, p.N], jnp.int32),  # (decode_end, prefill_end, mixed_end)
        n_kq=H,
        n_v=HV,
        d_k=K,
        d_v=V,
        chunk_size=chunk_size,
        BT=chunk_size,
        has_initial_state=jnp.full((p.N,), has_h0, jnp.int32),
    )
    o = p.unpack(o.reshape(p.B * p.T, HV, V)) / v_scale
    if scale is not None and scale != K**-0.5:
        o = o * (scale * K**0.5)
    return o.astype(v.dtype), (new_state / v_scale if output_final_state else None)


def supports_v2(case) -> bool | str:
    """What recurrent_scan runs: GDN (a per-head gate: op gdn) in float32 (the SiLU pre-images,
    recurrent_scan_v2's docstring), HV a multiple of H (it repeats q, k heads: repeat_factor) and
    at most 128 (b and a are padded to 128 lanes), K and V multiples of the lanes (mixed qkv is
    split at lane offsets H * K, 2 * H * K; it validates nothing itself), a chunk size that is a
    multiple of 16 (invert_triangular_matrix's blocks: it would drop the remainder), a log gate
    above -100 (it clamps there)."""
    if case.op != "gdn":
        return f"recurrent_scan takes a per-head gate (op gdn): not {case.op}"
    if case.dtype != "float32":
        return (
            "recurrent_scan applies SiLU to its q, k, v inputs; the adapter passes SiLU pre-images, "
            f"which only float32 carries back to the case's inputs (to 2.5e-7): not {case.dtype}"
        )
    HV = case.value_heads
    if HV % case.H or HV > LANES:
        return f"recurrent_scan needs H_v a multiple of H and at most {LANES}: H={case.H}, H_v={HV}"
    if case.K % LANES or case.V % LANES:
        return (
            f"recurrent_scan splits mixed qkv at multiples of K, V: needs multiples of {LANES}, K={case.K}, V={case.V}"
        )
    if case.chunk_size % 16:
        return f"recurrent_scan inverts its chunk's triangular matrix in blocks of 16: chunk size {case.chunk_size}"
    if case.gate == "g_stress" and 1.5 * case.gate_kwargs["mag"] > -G_FLOOR:
        return f"recurrent_scan clamps its log gate at {G_FLOOR}: g_stress reaches {-1.5 * case.gate_kwargs['mag']}"
    return True


recurrent_scan_v2.forward_only = True
recurrent_scan_v2.supports = supports_v2
