"""The mutant catalogue: kernels_jax kernels with known bugs, which the harness must catch.

Each mutant is a real variant of a kernels_jax kernel: either edits of its source (`Patch`:
exact text replaced, planted in the mutant's own copy of the package by parity.mutants.patched;
kernels_jax itself holds no trace of any mutant) or a patched call around the unmodified
kernel (`wrap`). Mutants run as candidates (`mutant:NAME` backends) next to the unmutated
`pallas`/`pallas-fused` kernels and the `fla` reference, through the same comparator and gate
as any kernel. A mutant is caught when any case of its op has a gate verdict other than pass
(accuracy, bound, NaN/Inf, error); the score is caught / total, and the unmutated kernels must
pass every case. The backend that runs a mutant is parity.execute.backends.mutant; the scored
run is `parity mutants` (parity.mutation).

The bugs of the seed documents (five pull requests of a JAX/Pallas linear-attention library tested
against FLA: what this harness exists to catch) are named once here, as bug classes (`BugClass`,
`BUG_CLASSES`; docs/mutants.md has them in one table), and a mutant that plants one says which
(`Mutant.bug`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

SIMPLE_GLA = "kernels_jax.simple_gla.chunk"
KERNEL_MATH = "kernels_jax.common.kernel_math"


@dataclasses.dataclass(frozen=True)
class Patch:
    """One edit of a kernels_jax module's source: `old`, which must occur in it exactly once,
    replaced by `new`."""

    module: str  # e.g. "kernels_jax.simple_gla.chunk"
    old: str
    new: str


@dataclasses.dataclass(frozen=True)
class BugClass:
    """A bug of a seed document, named by what it is."""

    name: str  # e.g. "masked-exp-overflow"
    what: str  # the bug, in words
    seed: str  # the seed document's number, "000" ... "004" (a mutant's "seed" in its records)
    document: str  # the seed document's title
    pull_request: str  # its pull request's number, "#131"; "" where its page shows none


_FUSED_G_GAMMA = "feat(gla): fused forward+backward kernels for g_gamma mode"  # two bug classes' document

MASKED_EXP_OVERFLOW = BugClass(
    name="masked-exp-overflow",
    what="the intra-chunk decay exp(g_i - g_j) taken before the causal mask: the masked upper triangle "
    "overflows float32 once |g| * chunk > 88.7 (chunk 128, ALiBi g_gamma), and 0 * inf = NaN",
    seed="000",
    document="Fix/chunk nan overflow safe exp",
    pull_request="#131",
)
SPLIT_DECAY_OVERFLOW = BugClass(
    name="split-decay-overflow",
    what="the backward's decay exp(g_i - g_j) split into two exponentials (exp(g_i) * exp(-g_j), or around "
    "the chunk's midpoint), one of which overflows once |g| * chunk > 88.7",
    seed="001",
    document="fix: stabilize simple_gla backward Pallas kernels for chunk_size=128",
    pull_request="#129",
)
WIDE_TILE_OVERWRITE = BugClass(
    name="wide-tile-overwrite",
    what="with K or V wider than one 128-wide tile, each tile overwrites the output instead of "
    "accumulating into it (the tile's grid index dropped from the output's map)",
    seed="002",
    document=_FUSED_G_GAMMA,
    pull_request="#122",
)
ZERO_GATE_GRADIENT = BugClass(
    name="zero-gate-gradient",
    what="a learnable g_gamma given an all-zero gradient",
    seed="002",
    document=_FUSED_G_GAMMA,
    pull_request="#122",
)
INTERPRET_MODE_LEFT_ON = BugClass(
    name="interpret-mode-left-on",
    what="interpret mode left on in a kernel meant to compile: right numbers on a CPU, and no Mosaic kernel on a TPU",
    seed="003",
    document="KDA chunk-parallel forward/backward",
    pull_request="",
)
PACKED_STATE_LEAK = BugClass(
    name="packed-state-leak",
    what="packed sequences (cu_seqlens): the state not reset at a sequence's start leaks into the next one",
    seed="004",
    document="Feat/varlen",
    pull_request="#153",
)
BUG_CLASSES: tuple[BugClass, ...] = (
    MASKED_EXP_OVERFLOW,
    SPLIT_DECAY_OVERFLOW,
    WIDE_TILE_OVERWRITE,
    ZERO_GATE_GRADIENT,
    INTERPRET_MODE_LEFT_ON,
    PACKED_STATE_LEAK,
)


@dataclasses.dataclass(frozen=True)
class Mutant:
    name: str
    op: str  # the op whose kernel is mutated
    impl: str  # 'pallas' or 'pallas-fused'
    what: str  # the bug, in words
    bug: BugClass | None = None  # the seed documents' bug class it plants, if any
    patches: tuple[Patch, ...] = ()  # the bug, as edits of kernels_jax's source (applied in order)
    wrap: Callable | None = None  # or: fn -> patched fn around the unmodified kernel
    witness: str = ""  # a small case that must catch it (tests/test_mutants.py)
    tpu_only: bool = False  # invisible in interpret mode: caught by the TPU compile check only
    narrow: bool = False  # wrong only outside every named suite: for `parity fuzz` to find
    # the first stage of its op (cases.stages) whose kernel holds the bug, as `parity localise` must name
    # it; "" where the bug is in no stage's kernel (a wrap around the op's call, the op's entry point)
    stage: str = ""

    @property
    def seed(self) -> str:
        """The number of the seed document its bug class is from ("" if none): its records' "seed"."""
        return self.bug.seed if self.bug else ""


def _initial_state_ignored(fn):
    def call(q, k, v, *args, initial_state=None, **kw):
        return fn(q, k, v, *args, initial_state=None if initial_state is None else initial_state * 0, **kw)

    return call


def _zero_dg_gamma(fn):
    import jax

    def call(q, k, v, *args, g_gamma=None, **kw):
        return fn(q, k, v, *args, g_gamma=None if g_gamma is None else jax.lax.stop_gradient(g_gamma), **kw)

    return call


def _after_imports(function: str) -> Patch:
    """A function added to Simple GLA's chunk module, after its imports."""
    imports_end = "from kernels_jax.common.platform import interpret_mode\n"
    return Patch(SIMPLE_GLA, imports_end, imports_end + "\n\n" + function)


# exp(b_i - b_j) over the whole chunk, masked after exp (the upper triangle overflows)
_UNMASKED_DECAY = """
def _unmasked_decay(b_col, b_row):
    C = b_col.shape[0]
    row = jax.lax.broadcasted_iota(jnp.int32, (C, C), 0)
    col = jax.lax.broadcasted_iota(jnp.int32, (C, C), 1)
    # a 0/1 float mask from integer arithmetic, as a kernel would load it: multiplying by a boolean
    # mask's astype(F32) would let XLA (interpret mode) rewrite the product as a select and hide
    # the NaN that Mosaic on a TPU produces
    return jnp.exp(b_col - b_row) * jnp.clip(row - col + 1, 0, 1).astype(F32)
"""

# exp(b_i) * exp(-b_j) * mask: exp(-b_j) overflows
_FACTORISED_DECAY = """
def _factorised_decay(b_col, b_row, *, transpose=False):
    C = b_col.shape[0]
    row = jax.lax.broadcasted_iota(jnp.int32, (C, C), 0)
    col = jax.lax.broadcasted_iota(jnp.int32, (C, C), 1)
    if transpose:
        return jnp.exp(b_row) * jnp.exp(-b_col) * (col >= row).astype(F32)
    return jnp.exp(b_col) * jnp.exp(-b_row) * (row >= col).astype(F32)
"""

_FORWARD_SCORES = "        scores = acc_qk[...] * causal_decay(b_col, b_row) * scale\n"
_STATE_UPDATE = "    new = advance_state(state[...], k_ref[...], v_ref[...], decay_all, decay_to_end)\n"

SUITE_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "unmasked-exp-c128",
        "simple_gla",
        "pallas",
        bug=MASKED_EXP_OVERFLOW,
        patches=(
            Patch(SIMPLE_GLA, _FORWARD_SCORES, _FORWARD_SCORES.replace("causal_decay", "_unmasked_decay")),
            _after_imports(_UNMASKED_DECAY),
        ),
        what="intra-chunk decay exp(g_i - g_j) taken over the whole chunk before the causal mask "
        "(the upper triangle overflows at chunk 128 with ALiBi g_gamma: inf * 0 = NaN)",
        witness="simple_gla-fwd-B1-T128-H2-K64-V64-fp32-C128-gamma_stress",
        stage="fwd_o",
    ),
    Mutant(
        "factorised-gate-bwd",
        "simple_gla",
        "pallas",
        bug=SPLIT_DECAY_OVERFLOW,
        patches=(
            Patch(SIMPLE_GLA, "acc_kq[...] * causal_decay(", "acc_kq[...] * _factorised_decay("),
            Patch(SIMPLE_GLA, "acc_dov[...] * causal_decay(", "acc_dov[...] * _factorised_decay("),
            _after_imports(_FACTORISED_DECAY),
        ),
        what="backward through a per-channel gate built from g_gamma, factorised as exp(G_i) * exp(-G_j) "
        "(exp(-G) overflows when |g| * chunk > 88.7)",
        witness="simple_gla-fwdbwd-B1-T128-H2-K64-V64-fp32-C64-gamma_stress",
        stage="bwd_dv",
    ),
    Mutant(
        "tile-overwrite-k256",
        "simple_gla",
        "pallas",
        bug=WIDE_TILE_OVERWRITE,
        patches=(
            Patch(
                SIMPLE_GLA,
                "        acc_qk[...] += qk\n        acc_qh[...] += qh\n",
                "        acc_qk[...], acc_qh[...] = qk, qh\n",
            ),
        ),
        what="a K or V tile wider than 128 overwrites the output instead of accumulating",
        witness="simple_gla-fwd-B1-T64-H1-K256-V256-fp32-C64-g_logsig",
        stage="fwd_o",
    ),
    Mutant(
        "zero-dg-gamma",
        "simple_gla",
        "pallas-fused",
        bug=ZERO_GATE_GRADIENT,
        wrap=_zero_dg_gamma,
        what="the fused path returns a zero gradient for g_gamma",
        witness="simple_gla-fwdbwd-B1-T64-H2-K64-V64-fp32-C64-gamma_alibi",
    ),
    Mutant(
        "varlen-state-leak",
        "simple_gla",
        "pallas",
        bug=PACKED_STATE_LEAK,
        patches=(
            Patch(
                SIMPLE_GLA,
                "@pl.when(first_ref[c] == 1)\n    def load_initial_state():",
                "@pl.when(c == 0)\n    def load_initial_state():",
            ),
        ),
        what="the state is not reset at a packed sequence's start, so it leaks into the next one",
        witness="simple_gla-fwd-B1-T100-H2-K64-V64-fp32-C64-g_logsig-lens37_1_62",
        stage="fwd_h",
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
        patches=(
            Patch(
                SIMPLE_GLA,
                "    h_ref[...] = state[...].astype(h_ref.dtype)\n",
                "    h_ref[...] = state[...].astype(h_ref.dtype)\n\n"
                "    @pl.when(last_ref[c] == 1)\n"
                "    def emit_state_before_last_chunk():\n"
                "        ht_ref[...] = state[...]\n\n",
            ),
            Patch(
                SIMPLE_GLA,
                "\n    @pl.when(last_ref[c] == 1)\n    def emit_final_state():\n        ht_ref[...] = new\n",
                "",
            ),
        ),
        what="the final state is the state before the last chunk",
        witness="simple_gla-fwd-B1-T128-H2-K64-V64-fp32-C64-g_logsig-ht",
        stage="fwd_h",
    ),
    Mutant(
        "scale-twice-intra",
        "simple_gla",
        "pallas",
        patches=(Patch(SIMPLE_GLA, _FORWARD_SCORES, _FORWARD_SCORES + "        scores = scores * scale\n"),),
        what="scale applied twice to the intra-chunk term",
        witness="simple_gla-fwd-B1-T64-H2-K64-V64-fp32-C64-g_logsig",
        stage="fwd_o",
    ),
    Mutant(
        "mask-without-diagonal",
        "simple_gla",
        "pallas",
        patches=(
            Patch(KERNEL_MATH, "keep = col >= row", "keep = col > row"),
            Patch(KERNEL_MATH, "keep = row >= col", "keep = row > col"),
        ),
        what="the causal mask drops its diagonal (token t does not see itself)",
        witness="simple_gla-fwd-B1-T64-H2-K64-V64-fp32-C64-g_logsig",
        stage="fwd_o",
    ),
    Mutant(
        "bf16-state",
        "simple_gla",
        "pallas",
        patches=(
            Patch(SIMPLE_GLA, _STATE_UPDATE, _STATE_UPDATE + "    new = new.astype(jnp.bfloat16).astype(F32)\n"),
            Patch(
                SIMPLE_GLA,
                "jax.ShapeDtypeStruct((cfg.H, cfg.NT, cfg.K, cfg.V), F32),",
                "jax.ShapeDtypeStruct((cfg.H, cfg.NT, cfg.K, cfg.V), jnp.bfloat16),",
            ),
        ),
        what="the recurrent state carried between chunks in bfloat16 instead of float32 "
        "(accuracy only: the bound against FLA must catch it)",
        witness="simple_gla-fwd-B1-T256-H2-K64-V64-fp32-C64-g_logsig-ht",
        stage="fwd_h",
    ),
    Mutant(
        "gla-decay-last-row-only",
        "gla",
        "pallas",
        patches=(
            Patch(
                "kernels_jax.gla.kernels",
                "    g_row, g_col = _last(g)\n    S = advance_state(",
                "    g_row, g_col = _last(g)\n"
                "    g_col = g_col - dot_tn(g[g.shape[0] - 2 : g.shape[0] - 1, :], jnp.ones((1, 1), F32))\n"
                "    S = advance_state(",
            ),
        ),
        what="gla: the state carried to the next chunk decays by the last row's gate only, "
        "not by the whole chunk's cumulative gate",
        witness="gla-fwd-B1-T128-H2-K64-V64-fp32-C64-g_logsig-h0",
        stage="fwd_h",
    ),
    Mutant(
        "bf16-dot-fp32-contract",
        "simple_gla",
        "pallas",
        patches=(
            Patch(
                KERNEL_MATH,
                "if a.dtype == b.dtype == jnp.bfloat16:\n        precision = None\n",
                "if a.dtype == b.dtype == jnp.bfloat16:\n        precision = lax.Precision.HIGHEST\n",
            ),
        ),
        tpu_only=True,
        what="bf16 x bf16 matmuls asking for float32 contract precision: exact in TPU interpret mode, "
        "rejected by Mosaic on every TPU generation ('Bad lhs type'); only the TPU compile check sees it",
        witness="simple_gla-fwd-B1-T64-H2-K64-V64-bf16-C64-g_logsig",
        stage="fwd_o",
    ),
    Mutant(
        "interpret-left-on",
        "simple_gla",
        "pallas",
        bug=INTERPRET_MODE_LEFT_ON,
        patches=(
            Patch(
                "kernels_jax.common.platform",
                "return False if (on_tpu() or _compile_for_tpu) else pltpu.InterpretParams()",
                "return pltpu.InterpretParams()",
            ),
        ),
        what="interpret mode hard-coded on: right numbers on CPU, but the kernels' pallas_calls ask for TPU "
        "interpret mode themselves (what ran, parity.execute.pallas_paths) and the TPU module holds no Mosaic "
        "kernel (host callbacks instead)",
        witness="simple_gla-fwd-B1-T64-H2-K64-V64-fp32-C64-g_logsig",
        stage="fwd_h",
    ),
    Mutant(
        "chunk-axis-parallel",
        "simple_gla",
        "pallas",
        patches=(
            Patch(
                KERNEL_MATH,
                "CompilerParams(dimension_semantics=semantics)",
                'CompilerParams(dimension_semantics=("parallel",) * len(semantics))',
            ),
        ),
        what="every grid axis marked 'parallel', the sequential chunk axis of the state-carrying kernels "
        "included (Triton's independent programs; on a two-TensorCore TPU the state is split)",
        witness="simple_gla-fwd-B1-T320-H2-K64-V64-fp32-C64-g_logsig-ht",
        stage="fwd_h",
    ),
    Mutant(
        "f32-dots-default-precision",
        "simple_gla",
        "pallas",
        patches=(
            Patch(
                KERNEL_MATH,
                "a, b = a.astype(F32), b.astype(F32)\n        precision = lax.Precision.HIGHEST\n",
                "a, b = a.astype(F32), b.astype(F32)\n        precision = None\n",
            ),
        ),
        what="float32 dots at DEFAULT precision: one bf16 MXU pass on a TPU (~2e-3), float32 in plain "
        "interpret mode; the TPU numerics model and the bound against FLA's TF32 must catch it",
        witness="simple_gla-fwd-B1-T256-H2-K64-V64-fp32-C64-gamma_alibi-ht",
        stage="fwd_h",
    ),
    Mutant(
        "kv-swapped-scale",
        "simple_gla",
        "pallas",
        patches=(Patch("kernels_jax.common.validation", "scale = K**-0.5", "scale = V**-0.5"),),
        what="the default scale taken from V's head dim instead of K's (V ** -0.5): invisible "
        "on every case with K == V",
        witness="simple_gla-fwd-B1-T80-H2-K64-V128-fp32-C64-g_logsig",
    ),
    Mutant(
        "kda-beta-keys-only",
        "kda",
        "pallas",
        patches=(Patch("kernels_jax.kda.kernels", "dot(inv, v * beta)", "dot(inv, v)"),),
        what="kda: beta applied to the keys but not to the values in the WY solve",
        witness="kda-fwd-B1-T64-H2-K64-V64-fp32-C64-g_logsig",
        stage="fwd_intra",
    ),
)
