"""The words of a verdict: what gate.json's entries say in a sentence, and how every surface
prints a figure.

    fmt                     a record's figure, 3 significant digits ("nan/inf" for null)
    describe_bound          the rule that decided a bound (parity.judge.bound) with its figures:
                            a tensor entry's "why"
    describe_localisation   where the error is over the tolerance or the bound
                            (parity.measure.localisation), across the heads and along the
                            sequence: a tensor entry's "where"

They live with the judge because the judge writes them into gate.json (parity.judge.case); the
surfaces above it (the command line, the page, the pytest plugin, the repro script) print the same
words from here.
"""

from __future__ import annotations

from parity.measure.compute_error import MAX_ABS_MARGIN, SEEDS_MIN
from parity.measure.compute_error import describe as describe_compute
from parity.measure.localisation import ChunkLocalisation, Localisation, read_localisation


def fmt(x) -> str:
    """A record's figure as every surface prints it: 3 significant digits; None (a NaN/Inf metric,
    written as null in records) as "nan/inf"."""
    return "nan/inf" if x is None else f"{x:.3g}"


# compute_error.verdict_after's answer for a compute-error judgement that did not decide the bound
_COMPUTE_STATE = {"pass": "within the bound", "more": "undecided", "inconclusive": "undecided", "fail": "over"}


def describe_bound(b: dict) -> str:
    """The rule that decided bound `b` (its "rule") with the figures it used, in one line."""
    rule, j, m = b.get("rule"), b.get("compute") or {}, b.get("max_abs") or {}
    factor = b.get("factor")
    if rule == "nan-inf":
        nf = b.get("nonfinite") or {}
        return f"nan-inf: {nf.get('nan', '?')} NaN and {nf.get('inf', '?')} Inf where the oracle is finite"
    if rule == "max-abs":
        return (
            f"max-abs: max_abs {fmt(m.get('candidate'))} {'<=' if b.get('ok') else '>'} limit {fmt(m.get('limit'))} "
            f"(factor {fmt(factor)} x {fmt(1 + MAX_ABS_MARGIN)} x the reference's {fmt(m.get('reference'))} "
            f"+ floor_abs {fmt(m.get('floor'))})"
            + (f"; compute error {_COMPUTE_STATE[j['state']]}: {describe_compute(j)}" if j.get("state") else "")
        )
    if rule == "ratio-interval":
        edge = j["indifference"]
        # under the policy's minimum of seeds only a verdict far from the bound is taken (verdict_after)
        far = j["seeds"] < (j.get("seed_policy") or {}).get("min", SEEDS_MIN)
        decision = (
            f"lo {fmt(j['lo'])} > {fmt(edge)} (factor x (1 + margin), on fewer seeds than the minimum): fail"
            if j["state"] == "fail" and far
            else f"lo {fmt(j['lo'])} > factor {fmt(factor)}: fail"
            if j["state"] == "fail"
            else f"hi {fmt(j['hi'])} <= factor {fmt(factor)} (on fewer seeds than the minimum): pass"
            if j["state"] == "pass" and far
            else f"hi {fmt(j['hi'])} <= {fmt(edge)} (factor x (1 + margin)): pass"
            if j["state"] == "pass"
            else f"undecided ({b.get('note') or 'the interval holds the factor'})"
        )
        return f"ratio-interval: {describe_compute(j)}; {decision}"
    if rule and rule.startswith("rounding"):
        return f"{rule}: {describe_compute(j)}" + (f" ({b['note']})" if b.get("note") else "")
    if rule == "no-common-seed":
        return f"no-common-seed: {b.get('note', '')}"
    if rule == "reference-nonfinite":
        return "reference-nonfinite: the reference has NaN/Inf; the tolerance alone holds the candidate"
    return ""


# what each pattern of a tensor along chunks (ChunkLocalisation) says about the error along the
# sequence, in words
PATTERN_WORDS = {
    "single-chunk": "the sequence is a single chunk",
    "first-chunk": "the first chunk only",
    "drift": "growing along t (drift)",
    "local": "a few chunks (local)",
    "after-first-chunk": "every chunk after the first",
    "uniform": "no trend along t (uniform)",
    "non-finite": "NaN/Inf in every chunk",
}


def _names(what: str, items) -> str:
    items = list(items)
    return f"{what}{'s' if len(items) > 1 else ''} {', '.join(map(str, items))}"


def _heads_words(loc: Localisation) -> str:
    """'heads: only head 1 over tol (head 0 within)', 'heads: all 4 over tol', ..."""
    over, n, against = loc.heads, loc.n_heads, loc.against
    if not over:
        return f"no chunk, state row or head over {against} in rms (the rule that decided says where)"
    if len(over) == n:
        return f"heads: the only head (head {over[0]}) over {against}" if n == 1 else f"heads: all {n} over {against}"
    within = [h for h in range(n) if h not in over]
    return f"heads: only {_names('head', over)} over {against} ({_names('head', within)} within)"


def _along_words(loc: Localisation) -> str:
    """Where along the sequence (tensors along chunks) or over the state rows the error is over
    the limit; '' where the heads' words say it all (nothing over anywhere, or a [H] tensor)."""
    against = loc.against
    if not loc.heads:
        return ""
    if isinstance(loc, ChunkLocalisation):
        if loc.pattern == "one-sequence":
            return f"along the sequence: packed sequence {loc.sequence} only"
        if loc.pattern == "some-sequences":
            return f"along the sequence: packed {_names('sequence', loc.sequences)} (some-sequences)"
        words = PATTERN_WORDS.get(loc.pattern, loc.pattern)
        return f"along the sequence: {loc.chunks_over} of {loc.n_chunks} chunks over {against}, {words}"
    if loc.rows_over is None:
        return ""
    if loc.n_rows == 1:
        return "the one state row (one sequence)"
    return f"sequences: {_names('sequence', loc.rows_over)} of {loc.n_rows} over {against}"


def _first_words(loc: Localisation) -> str:
    """The first place over the limit: a chunk, its first token and head, or a sequence and head."""
    if isinstance(loc, ChunkLocalisation):
        if loc.first_chunk is None:
            return ""
        return f"first over {loc.against}: chunk {loc.first_chunk} (t={loc.first_t}), head {loc.head}"
    if loc.sequence is None:
        return ""
    return f"first over {loc.against}: sequence {loc.sequence}, head {loc.head}"


def describe_localisation(record: dict | None) -> str:
    """One line for terminals and reports from a record's localisation: where the error is over the
    tolerance (or the bound) across the heads and along the sequence, then the first place and the
    grid hazard it points to, e.g. 'heads: only head 1 over tol (head 0 within); along the sequence:
    4 of 4 chunks over tol, no trend (uniform); first over tol: chunk 0 (t=0), head 1'."""
    loc = read_localisation(record)
    if loc is None:
        return ""
    parts = [_heads_words(loc), _along_words(loc), _first_words(loc)]
    if isinstance(loc, ChunkLocalisation) and loc.hazard:
        parts.append("suspect: " + loc.hazard)
    return "; ".join(p for p in parts if p)
