"""The mutant catalogue: kernels_jax kernels with known bugs, which the harness must catch.

Each mutant is a real variant of a kernels_jax kernel: either a switch the kernel reads
at trace time (kernels_jax/common/mutation.py; the shipped kernels run with every switch
off) or a patched call around the unmodified kernel. Mutants run as candidates
(`mutant:NAME` backends) next to the unmutated `pallas`/`pallas-fused` kernels and the
`fla` reference, through the same comparator and gate as any kernel. A mutant is caught
when any case of its op has a gate verdict other than pass (accuracy, bound, NaN/Inf,
error); the score is caught / total, and the unmutated kernels must pass every case.
The backend that runs a mutant is parity.execute.backends.mutant; the scored run is `parity mutants`
(parity.cli.mutants).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class Mutant:
    name: str
    op: str  # the op whose kernel is mutated
    impl: str  # 'pallas' or 'pallas-fused'
    what: str  # the bug, in words
    seed: str = ""  # the seed pull request it reproduces, if any
    switch: str | None = None  # kernels_jax.common.mutation switch the kernel reads
    wrap: Callable | None = None  # or: fn -> patched fn around the unmodified kernel
    witness: str = ""  # a small case that must catch it (tests/test_mutants.py)
    tpu_only: bool = False  # invisible in interpret mode: caught by the TPU compile check only
    narrow: bool = False  # wrong only outside every named suite: for `parity fuzz` to find


def _initial_state_ignored(fn):
    def call(q, k, v, *args, initial_state=None, **kw):
        return fn(q, k, v, *args, initial_state=None if initial_state is None else initial_state * 0, **kw)

    return call


def _zero_dg_gamma(fn):
    import jax

    def call(q, k, v, *args, g_gamma=None, **kw):
        return fn(q, k, v, *args, g_gamma=None if g_gamma is None else jax.lax.stop_gradient(g_gamma), **kw)

    return call


SUITE_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "unmasked-exp-c128",
        "simple_gla",
        "pallas",
        seed="000",
        switch="unmasked_decay_exp",
        what="intra-chunk decay exp(g_i - g_j) taken over the whole chunk before the causal mask "
        "(the upper triangle overflows at chunk 128 with ALiBi g_gamma: inf * 0 = NaN)",
        witness="simple_gla-fwd-B1-T128-H2-K64-V64-fp32-C128-gamma_stress",
    ),
    Mutant(
        "factorised-gate-bwd",
        "simple_gla",
        "pallas",
        seed="001",
        switch="factorised_decay_bwd",
        what="backward through a per-channel gate built from g_gamma, factorised as exp(G_i) * exp(-G_j) "
        "(exp(-G) overflows when |g| * chunk > 88.7)",
        witness="simple_gla-fwdbwd-B1-T128-H2-K64-V64-fp32-C64-gamma_stress",
    ),
    Mutant(
        "tile-overwrite-k256",
        "simple_gla",
        "pallas",
        seed="002",
        switch="tile_overwrite",
        what="a K or V tile wider than 128 overwrites the output instead of accumulating",
        witness="simple_gla-fwd-B1-T64-H1-K256-V256-fp32-C64-g_logsig",
    ),
    Mutant(
        "zero-dg-gamma",
        "simple_gla",
        "pallas-fused",
        seed="002",
        wrap=_zero_dg_gamma,
        what="the fused path returns a zero gradient for g_gamma",
        witness="simple_gla-fwdbwd-B1-T64-H2-K64-V64-fp32-C64-gamma_alibi",
    ),
    Mutant(
        "varlen-state-leak",
        "simple_gla",
        "pallas",
        seed="004",
        switch="varlen_no_reset",
        what="the state is not reset at a packed sequence's start, so it leaks into the next one",
        witness="simple_gla-fwd-B1-T100-H2-K64-V64-fp32-C64-g_logsig-lens37_1_62",
    ),
    Mutant(
        "initial-state-ignored",
        "simple_gla",
        "pallas",
        wrap=_initial_state_ignored,
        what="initial_state is ignored (the kernel starts from zeros)",
        witness="simple_gla-fwd-B1-T64-H2-K64-V64-fp32-C64-g_logsig-h0",
    ),
    Mutant(
        "final-state-one-chunk-early",
        "simple_gla",
        "pallas",
        switch="ht_one_chunk_early",
        what="the final state is the state before the last chunk",
        witness="simple_gla-fwd-B1-T128-H2-K64-V64-fp32-C64-g_logsig-ht",
    ),
    Mutant(
        "scale-twice-intra",
        "simple_gla",
        "pallas",
        switch="intra_scale_twice",
        what="scale applied twice to the intra-chunk term",
        witness="simple_gla-fwd-B1-T64-H2-K64-V64-fp32-C64-g_logsig",
    ),
    Mutant(
        "mask-without-diagonal",
        "simple_gla",
        "pallas",
        switch="strict_causal_mask",
        what="the causal mask drops its diagonal (token t does not see itself)",
        witness="simple_gla-fwd-B1-T64-H2-K64-V64-fp32-C64-g_logsig",
    ),
    Mutant(
        "bf16-state",
        "simple_gla",
        "pallas",
        switch="state_bf16",
        what="the recurrent state carried between chunks in bfloat16 instead of float32 "
        "(accuracy only: the bound against FLA must catch it)",
        witness="simple_gla-fwd-B1-T256-H2-K64-V64-fp32-C64-g_logsig-ht",
    ),
    Mutant(
        "gla-decay-last-row-only",
        "gla",
        "pallas",
        switch="gla_decay_last_row_only",
        what="gla: the state carried to the next chunk decays by the last row's gate only, "
        "not by the whole chunk's cumulative gate",
        witness="gla-fwd-B1-T128-H2-K64-V64-fp32-C64-g_logsig-h0",
    ),
    Mutant(
        "bf16-dot-fp32-contract",
        "simple_gla",
        "pallas",
        switch="bf16_dot_fp32_contract",
        tpu_only=True,
        what="bf16 x bf16 matmuls asking for float32 contract precision: exact in TPU interpret mode, "
        "rejected by Mosaic on every TPU generation ('Bad lhs type'); only the TPU compile check sees it",
        witness="simple_gla-fwd-B1-T64-H2-K64-V64-bf16-C64-g_logsig",
    ),
    Mutant(
        "interpret-left-on",
        "simple_gla",
        "pallas",
        seed="003",
        switch="interpret_left_on",
        what="interpret mode hard-coded on: right numbers on CPU, but the kernels' pallas_calls ask for TPU "
        "interpret mode themselves (what ran, parity.execute.pallas_paths) and the TPU module holds no Mosaic "
        "kernel (host callbacks instead)",
        witness="simple_gla-fwd-B1-T64-H2-K64-V64-fp32-C64-g_logsig",
    ),
    Mutant(
        "chunk-axis-parallel",
        "simple_gla",
        "pallas",
        switch="sequential_axis_parallel",
        what="every grid axis marked 'parallel', the sequential chunk axis of the state-carrying kernels "
        "included (Triton's independent programs; on a two-TensorCore TPU the state is split)",
        witness="simple_gla-fwd-B1-T320-H2-K64-V64-fp32-C64-g_logsig-ht",
    ),
    Mutant(
        "f32-dots-default-precision",
        "simple_gla",
        "pallas",
        switch="f32_dot_default_precision",
        what="float32 dots at DEFAULT precision: one bf16 MXU pass on a TPU (~2e-3), float32 in plain "
        "interpret mode; the TPU numerics model and the bound against FLA's TF32 must catch it",
        witness="simple_gla-fwd-B1-T256-H2-K64-V64-fp32-C64-gamma_alibi-ht",
    ),
    Mutant(
        "kv-swapped-scale",
        "simple_gla",
        "pallas",
        switch="scale_from_v",
        what="the default scale taken from V's head dim instead of K's (V ** -0.5): invisible "
        "on every case with K == V",
        witness="simple_gla-fwd-B1-T80-H2-K64-V128-fp32-C64-g_logsig",
    ),
    Mutant(
        "kda-beta-keys-only",
        "kda",
        "pallas",
        switch="beta_keys_only",
        what="kda: beta applied to the keys but not to the values in the WY solve",
        witness="kda-fwd-B1-T64-H2-K64-V64-fp32-C64-g_logsig",
    ),
)
