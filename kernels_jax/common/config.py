"""The static description of one kernel call, shared by every kernels_jax kernel family.

A `KernelConfig` is frozen and hashable (a jit / custom_vjp static argument) and checks its own
consistency on construction. Head dims are the padded ones the kernels tile (see
layout.padded_dim); the caller's real K and V only decide the scale and what is cut off the
results.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from .layout import ChunkLayout, padded_dim, plan
from .validation import CHUNK_SIZES, validate

LANE = 128  # TPU vector lane width: the largest K / V tile


def tile(d: int) -> int:
    """The tile of a padded head dim: 128 when it divides d, else all of d (d <= 128)."""
    return LANE if d % LANE == 0 else d


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """H heads of q, k; K, V padded head dims (K_in, V_in the caller's); C chunk size; NT chunks;
    N sequences (state rows); bk, bv the K and V tiles; scale; has_h0 whether an initial state
    is given; HV value heads (of v, o and the state; None: H), G = HV // H of them per q, k
    head (kda, gdn: value head j reads q, k head j // G)."""

    H: int
    K: int
    V: int
    C: int
    NT: int
    N: int
    scale: float
    has_h0: bool
    bk: int
    bv: int
    K_in: int
    V_in: int
    HV: int | None = None

    def __post_init__(self):
        if self.HV is None:
            object.__setattr__(self, "HV", self.H)
        if self.HV < 1 or self.HV % self.H:
            raise ValueError(f"KernelConfig: HV = {self.HV} value heads is not a multiple of H = {self.H}")
        if self.C not in CHUNK_SIZES:
            raise ValueError(f"KernelConfig: C = {self.C} not in {CHUNK_SIZES}")
        for name, d, t in (("K", self.K, self.bk), ("V", self.V, self.bv)):
            if t < 1 or d % t or t > LANE and t != d:
                raise ValueError(f"KernelConfig: tile {t} does not divide {name} = {d}")
        if self.K_in > self.K or self.V_in > self.V:
            raise ValueError(f"KernelConfig: padded dims {self.K}, {self.V} below the real {self.K_in}, {self.V_in}")

    @property
    def G(self) -> int:
        """Value heads per q, k head."""
        return self.HV // self.H

    def qk_head(self, h):
        """The q, k head that value head h (a grid index) reads: h // G, as lax.div (h >= 0): Python's
        // on a traced int is a floor division, lowered through sign, whose Mosaic rule asks
        get_tpu_info() for the default device."""
        return h if self.G == 1 else jax.lax.div(h, self.G)

    def sum_groups(self, x):
        """x [HV, ...] per value head -> [H, ...]: the sum over each q, k head's G value heads."""
        return x.reshape((self.H, self.G) + x.shape[1:]).sum(1)

    @property
    def nk(self) -> int:
        return self.K // self.bk

    @property
    def nv(self) -> int:
        return self.V // self.bv

    @property
    def slots(self) -> int:
        return self.NT * self.C

    def pad_state(self, h):
        """h [N, HV, K_in, V_in] -> [N, HV, K, V] float32 (zero padding)."""
        h = h.astype(jnp.float32)
        return jnp.pad(h, ((0, 0), (0, 0), (0, self.K - self.K_in), (0, self.V - self.V_in)))

    def cut_state(self, h):
        """h [N, HV, K, V] -> [N, HV, K_in, V_in]."""
        return h[..., : self.K_in, : self.V_in]


def prepare(op: str, q, k, v, *, align: int, **arguments) -> tuple[ChunkLayout, KernelConfig]:
    """An op's entry: validate its arguments (validation.validate: the one input contract), plan
    the layout and build the config; align: the op's head-dim multiple."""
    problem = validate(op, q, k, v, **arguments)
    has_h0 = arguments.get("initial_state") is not None
    layout = plan(problem.B, problem.T, problem.chunk_size, arguments.get("cu_seqlens"))
    K, V = padded_dim(problem.K, align), padded_dim(problem.V, align)
    cfg = KernelConfig(
        H=problem.H,
        K=K,
        V=V,
        C=layout.C,
        NT=layout.NT,
        N=layout.N,
        scale=problem.scale,
        has_h0=has_h0,
        bk=tile(K),
        bv=tile(V),
        K_in=problem.K,
        V_in=problem.V,
        HV=problem.HV,
    )
    return layout, cfg
