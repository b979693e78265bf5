"""Narrow mutants: Simple GLA kernels that are wrong only in a small region of the case space
that no named suite visits, for proving that `parity fuzz` finds what the suites cannot.

Each is a patched call around the unmodified kernels_jax kernel (`Mutant(wrap=...)`, as in
parity.mutants) and fails exactly where its trigger says, a predicate of the case's shapes
(`TRIGGERS[name](case)`), which the wrap evaluates on the arrays it is given:
    tail-one-token      the output of a last chunk holding exactly one token is never stored
                        (unpacked T > C with T % C == 1)
    dh0-last-single     the initial-state gradient of the last packed sequence is dropped
                        when that sequence is a single token (varlen, h0, backward)
    heads-wrap          small heads (K <= 32) packed per tile, whose head index map wraps after
                        two heads: head h reads head h % 2's q, k, v (H > 2)
    k-tiles-from-v      the number of 128-wide K tiles taken from V: the columns of q and k
                        past 128 * ceil(V / 128) are dropped (only when K > V, and K > 128)
tests/test_fuzz.py checks that no case of any named suite triggers one and that `parity fuzz`
finds and shrinks each. They are in the catalogue (`mutant:NAME`, marked `narrow`: `parity mutants`
runs them only when named with --only, since no suite is meant to catch them) and run as
candidate functions too: `--candidate NAME=jax:parity.mutants.narrow:FUNCTION` (CANDIDATES).
"""

from __future__ import annotations

import importlib
import math

from cases import Case
from parity.model.kernels import PALLAS_KERNELS, pallas_kernel
from parity.model.spec import Unsupported
from parity.mutants.catalogue import Mutant

LANES = 128  # the width of a TPU vector tile


# ------------------------------------------------------------------ triggers, on shapes
def one_token_tail(T: int, C: int, packed: bool) -> bool:
    """An unpacked sequence of more than one chunk whose last chunk holds exactly one token."""
    return not packed and T > C and T % C == 1


def last_sequence_single(seqlens, h0: bool, backward: bool) -> bool:
    """Two or more packed sequences, the last one a single token, with an initial state and its gradient."""
    return h0 and backward and seqlens is not None and len(seqlens) >= 2 and seqlens[-1] == 1


def heads_wrap_after_two(H: int, K: int) -> bool:
    """More than two heads of head dim <= 32."""
    return H > 2 and K <= 32


def k_beyond_v_tiles(K: int, V: int) -> bool:
    """K needs more 128-wide tiles than V has (K > V and K > 128)."""
    return K > LANES * math.ceil(V / LANES)


TRIGGERS = {
    "tail-one-token": lambda c: one_token_tail(c.T, c.chunk_size, c.seqlens is not None),
    "dh0-last-single": lambda c: last_sequence_single(c.seqlens, c.h0, c.backward),
    "heads-wrap": lambda c: heads_wrap_after_two(c.H, c.K),
    "k-tiles-from-v": lambda c: k_beyond_v_tiles(c.K, c.V),
}


def triggers(name: str, case: Case) -> bool:
    """Whether the narrow mutant `name` is wrong on `case` (its op, and its trigger)."""
    return case.op == _BY_NAME[name].op and TRIGGERS[name](case)


# ------------------------------------------------------------------ the patched calls
def _tail_one_token(fn):
    def call(q, k, v, *args, chunk_size=64, cu_seqlens=None, **kw):
        o, ht = fn(q, k, v, *args, chunk_size=chunk_size, cu_seqlens=cu_seqlens, **kw)
        if one_token_tail(q.shape[1], chunk_size, cu_seqlens is not None):
            o = o.at[:, -1].set(0)
        return o, ht

    return call


def _dh0_last_single(fn):
    import jax
    import jax.numpy as jnp
    import numpy as np

    def call(q, k, v, *args, initial_state=None, cu_seqlens=None, **kw):
        lens = None if cu_seqlens is None else tuple(np.diff(np.asarray(cu_seqlens)).tolist())
        # the gradient decides: stop_gradient keeps the forward exact (backward=True here)
        if last_sequence_single(lens, initial_state is not None, True):
            initial_state = jnp.concatenate([initial_state[:-1], jax.lax.stop_gradient(initial_state[-1:])])
        return fn(q, k, v, *args, initial_state=initial_state, cu_seqlens=cu_seqlens, **kw)

    return call


def _heads_wrap(fn):
    import jax.numpy as jnp

    def call(q, k, v, *args, **kw):
        H, K = q.shape[2], q.shape[3]
        if heads_wrap_after_two(H, K):
            head = jnp.arange(H) % 2
            q, k, v = q[:, :, head], k[:, :, head], v[:, :, head]
        return fn(q, k, v, *args, **kw)

    return call


def _k_tiles_from_v(fn):
    import jax.numpy as jnp

    def call(q, k, v, *args, **kw):
        K, V = q.shape[3], v.shape[3]
        if k_beyond_v_tiles(K, V):
            kept = (jnp.arange(K) < LANES * math.ceil(V / LANES)).astype(q.dtype)
            q, k = q * kept, k * kept
        return fn(q, k, v, *args, **kw)

    return call


NARROW_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "tail-one-token",
        "simple_gla",
        "pallas",
        wrap=_tail_one_token,
        what="the output of a last chunk holding exactly one token is never stored (T > C, T % C == 1, "
        "unpacked): every suite's T is off that line",
        witness="simple_gla-fwd-B1-T65-H1-K64-V64-fp32-C64-g_logsig",
        narrow=True,
    ),
    Mutant(
        "dh0-last-single",
        "simple_gla",
        "pallas",
        wrap=_dh0_last_single,
        what="the initial-state gradient of the last packed sequence is dropped when that sequence is a "
        "single token (no suite packs a length-1 sequence last)",
        witness="simple_gla-fwdbwd-B1-T65-H1-K64-V64-fp32-C64-g_logsig-h0-lens64_1",
        narrow=True,
    ),
    Mutant(
        "heads-wrap",
        "simple_gla",
        "pallas",
        wrap=_heads_wrap,
        what="heads of dim <= 32 packed per tile with a head index map that wraps after two heads "
        "(no suite has H > 2 with K <= 32)",
        witness="simple_gla-fwd-B1-T64-H3-K32-V32-fp32-C64-g_logsig",
        narrow=True,
    ),
    Mutant(
        "k-tiles-from-v",
        "simple_gla",
        "pallas",
        wrap=_k_tiles_from_v,
        what="the K tile count taken from V: q, k columns past 128 * ceil(V / 128) dropped "
        "(only when K > V and K > 128; the suites' one K > V pair is 128 > 64)",
        witness="simple_gla-fwd-B1-T64-H1-K256-V64-fp32-C64-g_logsig",
        narrow=True,
    ),
)


# ------------------------------------------------------------------ as --candidate functions
def _candidate(mutant: Mutant):
    """The mutant as a jax candidate function in FLA's convention (so `parity repro` can write a
    standalone script of it); `supports(case)` / `applies(case)` say where the kernel it wraps has a
    kernel (the runner records other cases `unsupported`; parity fuzz draws only there)."""

    def run(q, k, v, *args, **kw):
        module, function = PALLAS_KERNELS[mutant.impl][mutant.op]
        return mutant.wrap(getattr(importlib.import_module(module), function))(q, k, v, *args, **kw)

    def applies(case: Case) -> bool:
        if case.op != mutant.op:
            return False
        try:
            pallas_kernel(mutant.impl, case)
        except Unsupported:
            return False
        return True

    run.__name__ = mutant.name.replace("-", "_")
    run.__doc__ = f"Narrow mutant {mutant.name}: {mutant.what}"
    run.applies = run.supports = applies
    return run


_BY_NAME = {m.name: m for m in NARROW_MUTANTS}
tail_one_token = _candidate(_BY_NAME["tail-one-token"])
dh0_last_single = _candidate(_BY_NAME["dh0-last-single"])
heads_wrap = _candidate(_BY_NAME["heads-wrap"])
k_tiles_from_v = _candidate(_BY_NAME["k-tiles-from-v"])
CANDIDATES = {m.name: m.name.replace("-", "_") for m in NARROW_MUTANTS}  # NAME -> function here


def candidate_spec(name: str) -> str:
    """`--candidate` spec of narrow mutant `name` as a standalone function (`mutant:NAME` runs the
    same wrap through the mutant backend)."""
    return f"{name}=jax:parity.mutants.narrow:{CANDIDATES[name]}"
