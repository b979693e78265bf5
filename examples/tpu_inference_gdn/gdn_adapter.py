"""tpu-inference's Pallas TPU kernels for the gated delta rule, as parity candidates.

tpu-inference (the TPU backend of vLLM; setup.sh: pip install --no-deps --target DIR
"tpu-inference==0.32.0", DIR its own directory, `target()`, so that its vLLM requirements never
meet the environment's packages) ships its GDN kernels in `tpu_inference.kernels.gdn`; they import
only jax, but the package's own `__init__` imports vLLM's platform code. `load(module)` imports a
kernel module without running that `__init__` (the top package is registered bare, with its path,
when it is not imported already), so no vLLM is needed.

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

v3 (`v3.wrapper.fused_conv1d_gdn`) is `fused_conv1d_gdn_v3` below: it computes a causal conv1d
of the mixed qkv, then SiLU of the conv's output (v3/wrapper.py:110-111, `qkv_out_compact =
jax.nn.silu(qkv_out_compact)`, unconditional), then GDN as v2 does. The conv is made an exact
identity: weights [dim, 1, width] that select the current token (1 at the last tap, 0 at the
others), conv_bias None and a zero conv state, so no earlier token enters; it runs in float32
(wrapper.py:86-94), where 0 * x + ... + 1 * x is x exactly. The SiLU after it gets the same
pre-images as v2 (`silu_inputs`, shared by both): they come back through SiLU to float32's
accuracy, not exactly, so v3 too is float32 only. Its prefill runs in tiles of one token (the
kernel's recurrent path): its chunked path cannot run in jax's TPU interpret mode (notes above
`PREFILL_TILE`).

    parity run --suite ci --backends oracle,fla --candidate v1=pallas:gdn_adapter:fused_gdn_v1 \
        --candidate v2=pallas:gdn_adapter:recurrent_scan_v2 \
        --candidate v3=pallas:gdn_adapter:fused_conv1d_gdn_v3 ...
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import sys
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

PACKAGE = "tpu_inference"
DIST = "tpu-inference"
VERSION = "0.32.0"  # the version this adapter was written against
TARGET_ENV = "TPU_INFERENCE_TARGET"


def target() -> Path:
    """Where setup.sh installs tpu-inference (pip --target): $TPU_INFERENCE_TARGET, or
    <sys.prefix>/pkgs/tpu-inference-<VERSION>."""
    return Path(os.environ.get(TARGET_ENV) or Path(sys.prefix) / "pkgs" / f"{DIST}-{VERSION}")


def load(module: str):
    """tpu_inference.<module>, imported without running tpu_inference/__init__.py (which imports
    vLLM), from the environment or else from `target()`; ImportError with the set-up command when
    tpu-inference is in neither."""
    if PACKAGE not in sys.modules:
        spec = importlib.util.find_spec(PACKAGE)
        if spec is None and (target() / PACKAGE).is_dir():
            sys.path.append(str(target()))
            spec = importlib.util.find_spec(PACKAGE)
        if spec is None or not spec.submodule_search_locations:
            raise ImportError(
                f'{PACKAGE} is not installed: pip install --no-deps --target "{target()}" '
                f'"{DIST}=={VERSION}" (setup.sh)'
            )
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


@dataclasses.dataclass(frozen=True)
class SiluInputs:
    """The gdn case's inputs as a kernel that applies SiLU to its mixed qkv takes them (v2 and
    v3): `silu_inputs` below. The kernel's o and final state come back through `output`."""

    mixed: jax.Array  # [B * T, 2 * H * K + HV * V] float32: SiLU pre-images of (q, k, v), scaled
    b: jax.Array  # [B * T, HV] logit(beta)
    a: jax.Array  # [B * T, HV] softplus^-1(-g), for A_log = 0 and dt_bias = 0
    state: jax.Array  # [N, HV, K, V] the initial state (or zeros) times v_scale
    v_scale: jax.Array  # the power of two v and the state are scaled by

    def output(self, p: Packed, o, new_state, v, scale, output_final_state):
        """The kernel's o [B * T, HV, V] and final state [N, HV, K, V] scaled back by v_scale,
        exactly, o times scale * K ** 0.5 where the case's scale is not K ** -0.5 (o is linear in
        q; the kernels scale q by K ** -0.5 themselves), in the harness's layout."""
        K = new_state.shape[-2]
        o = p.unpack(o.reshape(p.B * p.T, *v.shape[2:])) / self.v_scale
        if scale is not None and scale != K**-0.5:
            o = o * (scale * K**0.5)
        return o.astype(v.dtype), (new_state / self.v_scale if output_final_state else None)


def silu_inputs(p: Packed, q, k, v, g, beta, initial_state) -> SiluInputs:
    """What a kernel computing GDN on (l2norm(silu(x_q)), l2norm(silu(x_k)), silu(x_v)) of its
    mixed qkv x, with q scaled by K ** -0.5, gate -exp(A_log) * softplus(a + dt_bias) and beta
    sigmoid(b), is handed (v2 and v3):
      x_q, x_k  pre-images of 2^n q, 2^n k, each row's largest 2^n <= 1 that keeps its entries
                >= -0.25 (q, k are unit vectors: n >= -2): the kernel's L2 norm takes the 2^n
                out again, up to its eps (relative 1e-6 / 2^(2n+1) <= 8e-6);
      x_v       the pre-image of 2^m v, one 2^m for the tensor; the initial state is scaled by
                2^m too and o and the final state by 2^-m, exactly (both are linear in (v, h0));
      a         softplus^-1(-g), with A_log = 0 and dt_bias = 0; b = logit(beta).
    The pre-images come back through SiLU to float32's accuracy (2.5e-7 relative at most), not
    exactly: float32 only (`supports_v2`, `supports_v3`)."""
    H, K = q.shape[2], q.shape[3]
    HV, V = v.shape[2], v.shape[3]
    qk_scale = _pow2_scale(jnp.concatenate([q, k], axis=-1), axis=-1)  # [B, T, H, 1], for both
    v_scale = _pow2_scale(v)
    mixed = [_silu_preimage(x * qk_scale).reshape(p.B * p.T, H * K) for x in (q, k)]
    mixed = jnp.concatenate([*mixed, _silu_preimage(v * v_scale).reshape(p.B * p.T, HV * V)], axis=-1)
    return SiluInputs(
        mixed.astype(q.dtype),
        p.pack(_raw_beta(beta)),
        p.pack(_raw_gate(g)),
        p.state(initial_state, v, K) * v_scale,
        v_scale,
    )


def recurrent_scan_v2(
    q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None, chunk_size=128
):
    """tpu-inference v2 `recurrent_scan` (decode and chunked prefill in one Pallas kernel) in the
    harness's gdn convention: q, k [B, T, H, K] L2-normalised; v [B, T, HV, V]; g, beta [B, T, HV].

    What the kernel computes on its mixed qkv x is GDN on (l2norm(silu(x_q)), l2norm(silu(x_k)),
    silu(x_v)) with q scaled by K ** -0.5 (notes above `SILU_FLOOR`): it gets `silu_inputs`, and
    chunk_size  the case's, as both its prefill chunk and decode block (BT), as tpu-inference's
                own caller does (reference/ragged_gated_delta_rule_wrapper.py: chunk_size=BT)."""
    scan = load("kernels.gdn.v2.recurrent_scan_v2")
    p = Packed.of(q, cu_seqlens)
    x = silu_inputs(p, q, k, v, g, beta, initial_state)
    H, K = q.shape[2], q.shape[3]
    HV, V = v.shape[2], v.shape[3]
    new_state, o = scan.recurrent_scan(
        x.mixed,
        x.b,
        x.a,
        x.state,
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
        has_initial_state=jnp.full((p.N,), initial_state is not None, jnp.int32),
    )
    return x.output(p, o, new_state, v, scale, output_final_state)


def _silu_kernel_unsupported(case, name: str) -> str | None:
    """What a kernel fed `silu_inputs` (v2, v3) cannot run: other ops than gdn (a per-head gate),
    dtypes other than float32 (the SiLU pre-images), HV not a multiple of H (it repeats the q, k
    heads), K or V not multiples of the lanes (mixed qkv is split at lane offsets H * K,
    2 * H * K); None when it can."""
    if case.op != "gdn":
        return f"{name} takes a per-head gate (op gdn): not {case.op}"
    if case.dtype != "float32":
        return (
            f"{name} applies SiLU to its q, k, v inputs; the adapter passes SiLU pre-images, "
            f"which only float32 carries back to the case's inputs (to 2.5e-7): not {case.dtype}"
        )
    if case.value_heads % case.H:
        return f"{name} needs H_v a multiple of H: H={case.H}, H_v={case.value_heads}"
    if case.K % LANES or case.V % LANES:
        return f"{name} splits mixed qkv at multiples of K, V: needs multiples of {LANES}, K={case.K}, V={case.V}"
    return None


def supports_v2(case) -> bool | str:
    """What recurrent_scan runs (`_silu_kernel_unsupported`; it validates nothing itself), and HV
    at most 128 (b and a are padded to 128 lanes), a chunk size that is a multiple of 16
    (invert_triangular_matrix's blocks: it would drop the remainder), a log gate above -100 (it
    clamps there)."""
    why = _silu_kernel_unsupported(case, "recurrent_scan")
    if why:
        return why
    if case.value_heads > LANES:
        return f"recurrent_scan needs H_v at most {LANES}: H_v={case.value_heads}"
    if case.chunk_size % 16:
        return f"recurrent_scan inverts its chunk's triangular matrix in blocks of 16: chunk size {case.chunk_size}"
    if case.gate == "g_stress" and 1.5 * case.gate_kwargs["mag"] > -G_FLOOR:
        return f"recurrent_scan clamps its log gate at {G_FLOOR}: g_stress reaches {-1.5 * case.gate_kwargs['mag']}"
    return True


recurrent_scan_v2.forward_only = True
recurrent_scan_v2.supports = supports_v2


# v3: v3.wrapper.fused_conv1d_gdn, the causal conv1d of Qwen3-Next's layer fused with GDN. Per
# token it computes out = sum_j qkv[t - width + 1 + j] * w[:, 0, j] (+ bias) over the conv state
# (the sequence's previous width - 1 tokens, read only when seq_lens exceeds the query's length)
# followed by its tokens, in float32 (compute_conv1d.py:36-45, wrapper.py:86-94), then SiLU of
# the whole conv output (wrapper.py:110-111, unconditional), then GDN as v2: L2 norm of q and k
# (eps 1e-6 under the root), q times d_k ** -0.5, gate -exp(A_log) * softplus(a + dt_bias) (no
# clamp), beta = sigmoid(b) (compute_gdn.py:295-303, :447-455). The adapter gives it the identity
# conv: w[:, 0, -1] = 1 and 0 elsewhere, no bias, a zero conv state, so out = 0 + 0 + ... + x
# = x exactly, and v2's SiLU pre-images.
#
# Its prefill tile (mixed_tile_size, the chunk of its per-sequence kernel) is 1 here: a tile of
# one token takes the kernel's recurrent GDN path (config.py:87-93, use_recurrent when the chunk
# is 1), as its decode kernel does; a longer tile takes the chunked path, whose loads reshape a
# VMEM ref (vmem_ldst.py:47, :129, `qkv_vmem_ref.reshape(-1, num_lanes)`), which jax 0.10.2's TPU
# interpret mode cannot read through (interpret/utils.py to_range: "'ReshapeTransform' object
# has no attribute 'indices'"), so without a TPU it cannot run. The chunked path (the one
# tpu-inference runs for prefill, mixed_tile_size 64) is therefore neither run nor compiled here.
PREFILL_TILE = 1
CONV_WIDTH = 4  # Qwen3-Next's conv width, as tpu-inference runs it; any width >= 2 is as exact


def fused_conv1d_gdn_v3(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
    """tpu-inference v3 `fused_conv1d_gdn` (a batched decode kernel, then a per-sequence prefill
    kernel; conv1d, SiLU and GDN fused) in the harness's gdn convention, shapes as
    `recurrent_scan_v2`. It gets the identity conv and a prefill tile of 1 (notes above
    `PREFILL_TILE`) and `silu_inputs`; its state caches have a null slot 0, so request i uses
    slot i + 1; seq_lens is the query's length, plus one where there is an initial state (it
    reads the recurrent and conv states only where seq_lens exceeds the query's length,
    metadata.py:48, :130)."""
    v3 = load("kernels.gdn.v3.wrapper")
    p = Packed.of(q, cu_seqlens)
    x = silu_inputs(p, q, k, v, g, beta, initial_state)
    H, K = q.shape[2], q.shape[3]
    HV, V = v.shape[2], v.shape[3]
    dim = x.mixed.shape[-1]
    weight = jnp.zeros((dim, 1, CONV_WIDTH), jnp.float32).at[:, 0, -1].set(1.0)
    lens = np.diff(p.cu_seqlens)
    slots = p.state_indices() + 1
    (_, new_state), o = v3.fused_conv1d_gdn(
        x.mixed,
        x.b,
        x.a,
        jnp.zeros((p.N + 1, CONV_WIDTH - 1, dim), jnp.float32),
        jnp.concatenate([jnp.zeros_like(x.state[:1]), x.state]),
        weight,
        None,
        jnp.zeros((HV,), jnp.float32),  # A_log: exp(0) = 1
        jnp.zeros((HV,), jnp.float32),  # dt_bias
        jnp.asarray(p.cu_seqlens),
        slots,
        jnp.asarray([p.decode_requests(), p.N, p.N], jnp.int32),  # (decode_end, prefill_end, mixed_end)
        jnp.asarray(lens + (initial_state is not None), jnp.int32),
        slots,  # read_state_indices: no prefix caching
        n_kq=H,
        n_v=HV,
        d_k=K,
        d_v=V,
        kernel_size=CONV_WIDTH,
        mixed_tile_size=PREFILL_TILE,
    )
    return x.output(p, o, new_state[1:], v, scale, output_final_state)


def supports_v3(case) -> bool | str:
    """What fused_conv1d_gdn runs (`_silu_kernel_unsupported`; it validates only shapes itself).
    Nothing more: it pads b and a to the lanes (any H_v), does not clamp its gate, and its tiles of
    one token have no chunk-size constraint (the chunked path's blocks of 16 are not taken)."""
    return _silu_kernel_unsupported(case, "fused_conv1d_gdn") or True


fused_conv1d_gdn_v3.forward_only = True
fused_conv1d_gdn_v3.supports = supports_v3
