"""What the reference's environment did to its record, for the gate: FLA refused to run there
(`reference_refusal`), FLA ran a kernel known to compute wrong there (`known_wrong_tensors`), or
the reference was recomputed in the Triton interpreter after CUDA refused (`reference_fallback`).

Read from the record's notes (notes.refusal, notes.known_wrong, notes.fla_launches,
notes.fallback: written by the FLA backend) and derived again from its error text, platform,
versions and launches with parity.model.fla_known's table as it is now, so a record written
before an entry was known, or by a backend that did not note it, is judged alike. A candidate's
tensor such a reference leaves unbounded is `unbounded-reference` (parity.judge.case)."""

from __future__ import annotations

from cases import Case
from parity.model.fla_known import is_hopper, known_wrong, possibly_wrong, refusal_of


def reference_refusal(ref: dict) -> dict | None:
    """The known refusal of its environment that left the reference without a result ({"issue",
    "cause", "fix", "environment": True}): notes.refusal where it says environment, else
    fla_known.refusal_of its error; None for a reference that ran, or failed for another reason."""
    if ref.get("status") == "ok":
        return None
    noted = (ref.get("notes") or {}).get("refusal")
    if isinstance(noted, dict) and noted.get("environment") is True:
        return noted
    return refusal_of(ref.get("error"))


def known_wrong_tensors(ref: dict) -> dict[str, dict]:
    """tensor -> the known-wrong entry ({"issue", "kernel", "tensors", "why", "fix"}) that makes
    the reference's tensor wrong: the record's notes.known_wrong, and fla_known.known_wrong over
    its notes.fla_launches (possibly_wrong where it did not record them). Empty for a reference
    that did not run."""
    if ref.get("status") != "ok":
        return {}
    notes = ref.get("notes") or {}
    platform, versions = ref.get("platform") or "", ref.get("versions") or {}
    entries = list(notes.get("known_wrong") or [])
    if notes.get("fla_launches") is not None:
        entries += known_wrong(platform, versions, notes["fla_launches"])
    elif is_hopper(platform, versions) is not False:  # a CPU or another GPU: no bug known there
        case = Case.from_dict(ref["case"])
        entries += possibly_wrong(platform, versions, case.op, case.stage, notes.get("chunk_size", case.chunk_size))
    out: dict[str, dict] = {}
    for e in entries:
        for name in e["tensors"]:
            out.setdefault(name, e)
    return out


def reference_fallback(ref: dict) -> dict | None:
    """notes.fallback of a reference FLA recomputed in the Triton interpreter on the same machine
    after CUDA refused ({"from": "cuda:...", "refusal": {...}}); it bounds as any reference does."""
    fallback = (ref.get("notes") or {}).get("fallback")
    return fallback if ref.get("status") == "ok" and isinstance(fallback, dict) else None


def unbounded_by(refusal: dict | None, wrong: dict | None) -> dict | None:
    """Why the reference bounds nothing for one tensor: {"by": "known-wrong" | "refusal",
    "issue", "cause", "fix"}, or None."""
    if wrong:
        return {"by": "known-wrong", "issue": wrong["issue"], "cause": wrong["why"], "fix": wrong["fix"]}
    if refusal:
        return {"by": "refusal", "issue": refusal["issue"], "cause": refusal["cause"], "fix": refusal["fix"]}
    return None
