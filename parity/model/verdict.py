"""The one vocabulary of verdicts, worst first: a tensor's, a (case, backend)'s and a compile's.

`parity run`'s table, the gate's summary, the page and the pytest plugin print these words, and
records hold them as plain strings: a `Verdict` is a str (StrEnum), so it compares equal to the
string a record read back holds, hashes like it and is written to JSON as it. A backend's status
(STATUSES of parity.model.spec) is one of them where it did not run. Standard library only.
"""

from __future__ import annotations

from enum import StrEnum


class Verdict(StrEnum):
    """A verdict; the members are declared worst first (`worst_verdict`)."""

    ERROR = "error"
    TIMEOUT = "timeout"
    COMPILE_ERROR = "compile-error"
    NUMERICS_MISMATCH = "numerics-mismatch"
    NAN_INF = "nan-inf"  # NaN/Inf where the oracle is finite
    FAIL_ACCURACY = "fail-accuracy"  # rel_rms over its tolerance (parity.measure.tol)
    FAIL_BOUND = "fail-bound"  # within tolerance, over the bound against the reference (parity.judge.bound)
    INCONCLUSIVE = "inconclusive"  # the bound undecided over the seeds allowed (parity.measure.compute_error)
    # within tolerance, and unbounded because of the reference's environment: FLA refused to run there,
    # or ran a kernel known to compute that tensor wrong there (parity.judge.environment); a failure
    # unless --allow-unbounded-reference
    UNBOUNDED_REFERENCE = "unbounded-reference"
    UNSUPPORTED = "unsupported"  # a tensor (or case) the backend cannot produce
    NOT_JUDGED = "not-judged"  # a backward tensor a forward-only candidate was not asked for
    PASS = "pass"


# tensor verdicts that are no judgement: a tensor the backend cannot produce, or one a
# forward-only candidate was not asked for on a forward-and-backward case
UNJUDGED = (Verdict.UNSUPPORTED, Verdict.NOT_JUDGED)


def worst_verdict(verdicts) -> Verdict:
    """The worst of `verdicts` (strings or Verdicts); pass for none."""
    return min((Verdict(v) for v in verdicts), key=list(Verdict).index, default=Verdict.PASS)
