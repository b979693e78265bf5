"""Compute error apart from output rounding, and the bound on it, judged over seeds.

A kernel's result for a tensor whose exact value is r is its value before the final rounding,
r + d, rounded to the output dtype: x = round(r + d); d is its compute error. Where the place of
r + d inside its rounding cell is spread evenly (any d or r that is not aligned to the grid of the
output dtype), the final rounding error u = x - (r + d) has mean 0, is uncorrelated with d and has
the second moment of the rounding of r itself, f = round(r) - r. So
    E ||x - r||^2 = ||d||^2 + E ||f||^2,   and in rel_rms units   c^2 = eps^2 - floor^2
is an unbiased estimate of the squared compute error (eps the tensor's rel_rms, floor the rel_rms
of the oracle rounded to the output dtype; tests/test_compute_error.py checks it: exact + Gaussian
noise of known rms before bf16 rounding gives back that rms). c can come out slightly negative
for a result at the rounding level; sums are kept signed and only the totals are square-rooted.

Blocks. compare_tensor records, per block of a tensor, e_b = w * sum (x - r)^2 and
f_b = w * sum (round(r) - r)^2 over the block's elements, w the normalisation of rel_rms (so that
sum_b e_b = eps^2; `block_sums`). Blocks are what is independent of what, read from the tensor's
declared layout (cases.layouts): a batch row (or packed state row), a head, and a group of the
last axis. The last axis is independent because all three
ops are linear in v's columns given q, k, g and beta: column j of o, of the state and of dv is
the same computation applied to column j of v (kda's delta rule included: (I - beta k k^T) acts on
every column alike), and the error of a shared intermediate (the q k^T of a chunk, the decay) meets
each column through that column's own values, so it adds uncorrelated terms; dq, dk and gla/kda's
dg ([.., K]) are sums over v's columns with a separate sum per K column. Chunks along T are not
used: the state carries the error of one chunk into the next, and the tokens of a chunk are
computed together; so a stage's tensors along time ([B, T, H, C] A, Aqk, dAqk, ...; u, w, v_new)
and per chunk (h, dh [B, NT, H, K, V]) are blocked by (row, head, column group) as o is, never per
token or per chunk. [B, T, H] tensors (simple_gla's dg, kda's dbeta) are blocked by (row, head)
only, [H] tensors (dg_gamma) by head.

The bound, `judge`: Q = sum_b a_b / sum_b d_b, a_b = e_b - f_b of the candidate and d_b of the
reference, over the blocks of every seed both have (paired: the same inputs, the same f_b), is
the ratio estimator of (c_cand / c_ref)^2; its standard error is the delta method's over blocks,
se^2 = m / (m - 1) * sum_b (a_b - Q d_b)^2 / (sum_b d_b)^2, and the one-sided interval at level
1 - ALPHA takes Student's t with m - 1 degrees of freedom. With R = sqrt(Q) and [lo, hi] the
interval's square roots:
    fail  when lo > factor                       (the candidate is measurably worse than factor x)
    pass  when hi <= factor * (1 + MARGIN)       (it is not measurably worse than the indifference
                                                  zone's edge: a tie passes, 1.25x does not)
    else undecided: more seeds, up to the limit; then `inconclusive`.
Before SEEDS_MIN seeds a verdict is taken only far from the bound (`verdict_after`): pass when
hi <= factor, fail when lo > factor * (1 + MARGIN). MARGIN is the power target that `parity power`
checks (r_95 <= 1.25).

How long a tensor may stay undecided is counted in blocks, not seeds: the interval's width goes
with the number of blocks m, and a tensor with many blocks per seed (8 column groups x rows x
heads) has BLOCKS_ENOUGH by SEEDS_BASE seeds, while a [B, T, H] tensor at B = 1 has one or two
per seed. Undecided at SEEDS_BASE seeds, a tensor goes on while it has fewer than BLOCKS_ENOUGH
blocks, up to the policy's maximum (SEEDS_MAX by default); then it is `inconclusive`. Past
SEEDS_BASE it is looked at only at LOOKS seeds (and at the maximum), so that a tensor is looked
at no more than 14 times (seeds 1 to 8, then 12, 16, 24, 32, 48, 64): ALPHA is per look, and a
true tie fails at most 14 * ALPHA (< 1%) of the time (Bonferroni; the looks share data, so far less).
Where the reference's own compute error is not distinguishable from zero (its sum is not above t
times its standard error: a tensor both sides compute exactly, or too few blocks to tell, e.g.
dg_gamma's one element per head, or simple_gla's dg with one block per row and head after a few
seeds) the ratio means nothing: the method is `rounding`. The reference's compute error is then
at most its upper bound, D = sum_b d_b + t * sd(sum_b d_b) (squared, summed over blocks), and the
candidate is held to factor^2 x that on its own blocks, with the same indifference zone:
    pass  when sum_b a_b <= factor^2 * D        (its compute error within the reference's bound)
          and eps_c <= factor * eps_r + floor   (the limit on epsilons pooled over seeds)
    fail  when sum_b a_b - t * sd(sum_b a_b) > (factor * (1 + MARGIN))^2 * D  (measurably above it)
          or eps_c > (factor * eps_r + floor) * (1 + MARGIN)
    else undecided: more seeds, so that the reference's compute error may be resolved and the
          ratio decide; at the end of the seeds the zone passes.
The limit on epsilons alone would let a candidate with twice FLA's compute error pass where that
error is a few percent of the bf16 rounding (gla's dq under g_stress: the floor doubles the
allowance), so it is one of two conditions; with one block (no sampling error to measure, t
infinite) it is all that decides.
parity power's rows say which method each tensor got.
"""

from __future__ import annotations

import math

import numpy as np

from cases import Layout

SEEDS_MIN = 3  # seeds a verdict needs unless far from the bound
SEEDS_BASE = 8  # seeds after which an undecided tensor with BLOCKS_ENOUGH blocks is inconclusive
SEEDS_MAX = 64  # the default policy's most seeds: what a tensor with one block per seed may need
# blocks an undecided tensor may wait for (parity power, docs/bound.md: with 32, a true tie on kda's dbeta under
# g_stress, whose blocks' errors spread 100x, stays inconclusive on 25% of draws)
BLOCKS_ENOUGH = 64
LOOKS = (12, 16, 24, 32, 48, 64)  # seeds past SEEDS_BASE at which a tensor is looked at
MARGIN = 0.25  # indifference zone above the factor: pass needs hi <= factor * (1 + MARGIN)
ALPHA = 0.0007  # one-sided, per look: 14 looks at most
# max_abs, one extreme element, is held to factor x (1 + MAX_ABS_MARGIN) x the reference's (+ floor_abs):
# at equal compute error (rms) the largest error of two kernels differs by the shape of their error
# distributions, not by accuracy (measured with parity power: Gaussian noise with FLA's rms has up to
# 1.5x FLA's max_abs on kda's dbeta and simple_gla's dg, [B, T, H] tensors where FLA's error is
# smooth); the bound 2x (FlashAttention's factor) still catches a localised error.
MAX_ABS_MARGIN = 1.0
COLUMN_GROUPS = 8  # groups of the last axis per (row, head)


def _t_quantile(p: float, dof: int) -> float:
    """Student's t quantile: scipy.stats.t.ppf(p, dof)."""
    # late: scipy.stats takes a second to import; processes that only measure never call this
    from scipy import stats

    return float(stats.t.ppf(p, dof))


def block_sums(a: np.ndarray, layout: Layout) -> list[float]:
    """a: elementwise figures of a tensor of `layout` -> their sums per independent block (module
    docstring), in a fixed order [rows x heads x groups]: rows are the batch rows of time and
    per-chunk tensors ([B, T | NT, H, ...]: tokens and chunks are summed, the state carries error
    from one chunk into the next) and the sequences of states ([N, H, K, V]); [B, T, H] tensors have
    no column groups, [H] tensors one block per head."""
    a = np.asarray(a, np.float64)
    if layout is Layout.PER_HEAD:
        return [float(v) for v in np.ravel(a)]
    head = layout.head_axis
    if a.ndim == 3:  # [B, T, H]: no feature axis
        return [float(v) for v in np.ravel(a.sum(1))]
    rest = tuple(i for i in range(1, a.ndim - 1) if i != head)
    last = a.shape[-1]
    g = min(COLUMN_GROUPS, last)
    groups = (np.arange(last) * g) // last
    s = a.sum(rest) if rest else a  # [rows, heads, last]
    out = np.stack([s[..., groups == j].sum(-1) for j in range(g)], -1)  # [rows, heads, g]
    return [float(v) for v in np.ravel(out)]


def _sums(seeds: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """Per-seed figures [{"err2": [...], "floor2": [...]}] -> (e_b, f_b) over all their blocks."""
    e = np.concatenate([np.asarray(s["err2"], np.float64) for s in seeds]) if seeds else np.zeros(0)
    f = np.concatenate([np.asarray(s["floor2"], np.float64) for s in seeds]) if seeds else np.zeros(0)
    return e, f


def compute_error(seeds: list[dict]) -> float | None:
    """c = sqrt(max(0, mean over seeds of (eps^2 - floor^2))): the compute error, rel_rms units."""
    if not seeds:
        return None
    e, f = _sums(seeds)
    return math.sqrt(max(0.0, float(e.sum() - f.sum()) / len(seeds)))


def judge(cand: list[dict], ref: list[dict], factor: float = 1.0, margin: float = MARGIN, alpha: float = ALPHA) -> dict:
    """The bound on compute error over the seeds both have (lists aligned by seed, each item
    {"err2": [blocks], "floor2": [blocks]}): the record the gate keeps, with
    decision pass | fail | undecided (the rule at >= SEEDS_MIN seeds) and far pass | fail | None
    (the rule under SEEDS_MIN seeds). Module docstring for the statistics."""
    k = len(cand)
    ec, fc = _sums(cand)
    er, fr = _sums(ref)
    if ec.shape != er.shape:
        raise ValueError(f"candidate has {ec.size} blocks over {k} seeds, the reference {er.size}")
    a, d = ec - fc, er - fr
    m = a.size
    out = {
        "seeds": k,
        "blocks": m,
        "factor": factor,
        "indifference": factor * (1 + margin),
        "alpha": alpha,
        "c_candidate": compute_error(cand),
        "c_reference": compute_error(ref),
    }
    t = _t_quantile(1 - alpha, m - 1) if m >= 2 else math.inf
    sd_a, sd_d = (math.sqrt(m * float(np.var(x, ddof=1))) if m >= 2 else math.inf for x in (a, d))
    if not d.sum() > t * sd_d:  # the reference's compute error is not resolved: the rounding bound
        eps_c, eps_r, floor = (math.sqrt(max(0.0, float(x.sum()) / max(1, k))) for x in (ec, er, fr))
        limit = factor * eps_r + floor
        d_hi = float(d.sum()) + t * sd_d  # the reference's squared compute error at most (upper bound)
        within = eps_c <= limit and float(a.sum()) <= factor**2 * d_hi
        over = eps_c > limit * (1 + margin) or float(a.sum()) - t * sd_a > (factor * (1 + margin)) ** 2 * d_hi
        decision = "pass" if within else "fail" if over else "undecided"
        out.update(
            method="rounding",
            eps_candidate=eps_c,
            eps_reference=eps_r,
            floor=floor,
            limit=limit,
            # the candidate's compute error at most (rel_rms units); None with too few blocks to bound it
            compute_limit=factor * math.sqrt(max(0.0, d_hi) / max(1, k)) if math.isfinite(d_hi) else None,
            ratio=None,
            lo=None,
            hi=None,
            decision=decision,
            far=None if decision == "undecided" else decision,  # the same rule under SEEDS_MIN seeds
        )
        return out
    q = float(a.sum() / d.sum())
    se = math.sqrt(m / (m - 1) * float(np.sum((a - q * d) ** 2))) / float(d.sum())
    lo, hi = (math.sqrt(max(0.0, v)) for v in (q - t * se, q + t * se))
    edge = factor * (1 + margin)
    out.update(
        method="ratio",
        ratio=math.sqrt(max(0.0, q)),
        se_ratio2=se,
        t=t,
        lo=lo,
        hi=hi,
        decision="fail" if lo > factor else "pass" if hi <= edge else "undecided",
        far="fail" if lo > edge else "pass" if hi <= factor else None,
    )
    return out


def verdict_after(j: dict, seeds_min: int = SEEDS_MIN, seeds_max: int = SEEDS_MAX) -> str:
    """pass | fail | more (run another seed) | inconclusive, for a judgement `j` on j["seeds"] seeds
    and j["blocks"] blocks (module docstring: far rule, looks, the end of the seeds)."""
    k = j["seeds"]
    if k < seeds_min:
        return j["far"] or "more"
    end = k >= seeds_max or (k >= SEEDS_BASE and j["blocks"] >= BLOCKS_ENOUGH)
    if not end and k > SEEDS_BASE and k not in LOOKS:
        return "more"
    if j["decision"] != "undecided":
        return j["decision"]
    if not end:
        return "more"
    return "pass" if j["method"] == "rounding" else "inconclusive"


def describe(j: dict | None) -> str:
    """One line, e.g. 'compute error 1.31x the reference's [1.22, 1.40] over 3 seeds, 48 blocks'."""
    if not j:
        return ""
    if j["method"] == "rounding":
        compute = j.get("compute_limit")
        return (
            f"reference at rounding level: eps {j['eps_candidate']:.3g} vs limit {j['limit']:.3g}"
            + (f", compute error {j['c_candidate']:.3g} vs {compute:.3g}" if compute is not None else "")
            + f" over {j['seeds']} seed(s)"
        )
    return (
        f"compute error {j['ratio']:.3g}x the reference's [{j['lo']:.3g}, {j['hi']:.3g}] "
        f"over {j['seeds']} seed(s), {j['blocks']} blocks"
    )


def noisy(r: np.ndarray, rel: float, dtype, rng: np.random.Generator, scale=None) -> np.ndarray:
    """r (the exact result, float64) + Gaussian noise of rms rel in rel_rms units (rel x rms(r), or
    rel x the tensor's error scale, references.error_scales), rounded once to `dtype`: a result
    whose compute error is rel (the power ladder's candidates, and the noise:REL test backend)."""
    r = np.asarray(r, np.float64)
    if scale is not None:
        sd = rel * np.broadcast_to(np.asarray(scale, np.float64), r.shape)
    else:
        sd = rel * math.sqrt(float(np.mean(np.square(r)))) if r.size else 0.0
    return (r + sd * rng.standard_normal(r.shape)).astype(dtype)
