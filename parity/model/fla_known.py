"""What is known to go wrong with FLA (the reference) on some GPUs, as data, and the pure
functions that read a record's facts against it (standard library only):

    refusal_of(error_text)        FLA refused to run: a known refusal of its environment
                                  (REFUSALS: FLA's own guard message), with cause and fix
    known_wrong(platform, versions, launches)
                                  FLA ran, but launched a kernel in a configuration known to
                                  compute wrong there (BUGS): the tensors it makes wrong
    possibly_wrong(platform, versions, op, stage, chunk_size)
                                  the same for a record that does not say what FLA launched: the
                                  kernels the case's op launches under a configuration FLA's
                                  autotuner may choose, where one of its choices is wrong

A bound against such a reference bounds nothing: the gate (parity.judge.environment) lists
these apart and fails them unless --allow-unbounded-reference. Checked against fla-core 0.6.0's
sources (fla/ops/common/chunk_o.py, fla/ops/delta_rule/wy_fast.py,
fla/ops/gated_delta_rule/wy_fast.py, fla/ops/kda/wy_fast.py) and FLA's issues #640, #984.
"""

from __future__ import annotations

import dataclasses
import re

# The Triton release the CUDA wheels of a torch release pin (torch == X requires triton == Y), in
# order. 2.11.0: 3.6.0 (the stock stack measured on an H200 with FLA 0.6.0). 2.12.0: 3.7.0 and
# 2.12.1: 3.7.1 (pytorch/pytorch#186814, "Update triton to 3.7.1 release": .ci/docker/
# triton_version.txt 3.7.0 -> 3.7.1 for the 2.12.1 patch release). Later releases pin no older one.
TORCH_TRITON_PINS = (("2.11.0", "3.6.0"), ("2.12.0", "3.7.0"), ("2.12.1", "3.7.1"))

HOPPER_NAMES = re.compile(r"\b(GH200|H100|H200|H800|H20)\b")  # sm_90 parts by name


@dataclasses.dataclass(frozen=True)
class KnownRefusal:
    """An error FLA raises on purpose where it knows its kernel computes wrong."""

    issue: str  # "fla#640"
    what: str
    function: str  # where FLA raises it
    conditions: str
    message: re.Pattern  # FLA's message; groups: low, fixed (the Triton versions), function


@dataclasses.dataclass(frozen=True)
class AffectedKernel:
    """One kernel a known bug makes wrong, and what it makes wrong."""

    module: str
    kernel: str
    tensors: tuple[str, ...]  # the op's gradients it makes wrong, as the registry names them
    guard: str  # what FLA does about it in this module
    stage_tensors: tuple[str, ...] = ()  # the same, as the stage case that runs it names them
    # the registry's ops (and "op:stage" stage cases) whose backward launches it under a configuration
    # FLA's autotuner chooses at run time (possibly_wrong: a record that does not say which)
    autotuned_in: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class KnownBug:
    """A kernel configuration Triton is known to compile wrong on some GPUs."""

    issue: str
    what: str
    conditions: str
    triton_from: str  # affected from this Triton release
    triton_fixed: str | None  # first release known to compute it right; None: none known
    meta: tuple[tuple[str, object], ...]  # the constexpr arguments it needs, e.g. (("BT", 64),)
    num_warps: int | None  # the num_warps it needs; None: any
    kernels: tuple[AffectedKernel, ...]
    fix: str | None  # None: chunk_bwd_dqkwg_fix(triton_fixed)


REFUSALS = (
    KnownRefusal(
        issue="fla#640",
        what="Triton miscompiles FLA's gated chunk_bwd_dqkwg on Hopper (tl.trans of a wgmma result): "
        "wrong gradients; FLA refuses to run it",
        function="fla.ops.common.chunk_o.chunk_bwd_dqkwg",
        conditions="a gated backward (g given: simple_gla with g, gdn) on Hopper (sm_90) with Triton >= 3.4.0 "
        "and < 3.7.1, where FLA's TileLang backend does not take the call (tilelang not installed, or its "
        "verifier refuses: g_gamma, h in float32 as simple_gla keeps it)",
        message=re.compile(
            r"Triton >= (?P<low>\d+(?:\.\d+)*) and < (?P<fixed>\d+(?:\.\d+)*) on Hopper GPUs produces incorrect "
            r"results for gated (?P<function>\w+) \(see #640\)"
        ),
    ),
)

_WY_FIX = (
    "pin num_warps=2 for prepare_wy_repr_bwd_kernel: parity run --fla-configs FILE, FILE holding "
    '{"prepare_wy_repr_bwd_kernel": {"num_warps": 2}} (FLA itself guards only fla.ops.delta_rule.wy_fast: '
    "NUM_WARPS = [2] on Hopper)"
)

BUGS = (
    KnownBug(
        issue="fla#984",
        what="Triton miscompiles prepare_wy_repr_bwd_kernel with num_warps=4 at BT=64 on Hopper: wrong dk and "
        "dbeta (and, with a gate, dg), or an illegal memory access; num_warps=2 is right",
        conditions="Hopper (sm_90), Triton >= 3.4 (still wrong at 3.7.1: FLA's bisection in PR #988), "
        "BT (chunk size) 64, num_warps 4",
        triton_from="3.4.0",
        triton_fixed=None,
        meta=(("BT", 64),),
        num_warps=4,
        kernels=(
            AffectedKernel(
                "fla.ops.delta_rule.wy_fast",
                "prepare_wy_repr_bwd_kernel",
                ("dk", "dbeta"),
                "guarded: FLA autotunes num_warps over [2] on Hopper",
            ),
            # the same kernel with the gate: FLA's fix (#988) left it autotuning over [2, 4] on Hopper
            AffectedKernel(
                "fla.ops.gated_delta_rule.wy_fast",
                "prepare_wy_repr_bwd_kernel",
                ("dk", "dbeta", "dg"),
                "not guarded: FLA autotunes num_warps over [2, 4] on Hopper",
                stage_tensors=("dk2", "db", "dg2"),  # gdn's bwd_wy stage
                autotuned_in=("gdn", "gdn:bwd_wy"),
            ),
            # fla.ops.kda.wy_fast's prepare_wy_repr_bwd_kda_kernel also autotunes num_warps over [2, 4], but it
            # is another kernel: no report of it miscompiling, so it is not listed
        ),
        fix=_WY_FIX,
    ),
    KnownBug(
        issue="fla#640",
        what="Triton miscompiles FLA's gated chunk_bwd_kernel_dqkwg on Hopper: wrong gradients (FLA 0.6.0 "
        "refuses to launch it there, see REFUSALS; a launch is seen only from an FLA without that guard)",
        conditions="Hopper (sm_90), Triton >= 3.4.0 and < 3.7.1, USE_G",
        triton_from="3.4.0",
        triton_fixed="3.7.1",
        meta=(("USE_G", True),),
        num_warps=None,
        kernels=(
            AffectedKernel(
                "fla.ops.common.chunk_o",
                "chunk_bwd_kernel_dqkwg",
                ("dq", "dk", "dg", "dbeta"),  # its outputs and what gdn computes from them
                "refused: chunk_bwd_dqkwg raises on Hopper with Triton >= 3.4.0 and < 3.7.1",
                stage_tensors=("dq", "dk", "dw", "dg"),  # the bwd_dqkwg stages
            ),
        ),
        fix=None,  # chunk_bwd_dqkwg_fix(triton_fixed)
    ),
)


# ------------------------------------------------------------------------------ versions and GPUs


def version_tuple(text: str | None) -> tuple[int, ...] | None:
    """'3.6.0' -> (3, 6, 0); '3.7.1+git5d6048aa' -> (3, 7, 1); None where no version can be read."""
    m = re.match(r"\s*(\d+(?:\.\d+)*)", text or "")
    return tuple(int(x) for x in m.group(1).split(".")) if m else None


def _at_least(v: tuple[int, ...], w: str) -> bool:
    n = max(len(v), len(version_tuple(w)))
    return v + (0,) * (n - len(v)) >= version_tuple(w) + (0,) * (n - len(version_tuple(w)))


def triton_fix(fixed: str) -> str:
    """The fix line of a Triton bug fixed in `fixed`: the first torch release that pins such a
    Triton (TORCH_TRITON_PINS), or Triton installed over torch; one line."""
    pins = [(t, p) for t, p in TORCH_TRITON_PINS if _at_least(version_tuple(p), fixed)]
    before = [(t, p) for t, p in TORCH_TRITON_PINS if not _at_least(version_tuple(p), fixed)]
    torch = (
        f"torch >= {pins[0][0]} (its CUDA wheels pin Triton {pins[0][1]}"
        + (f"; torch {before[-1][0]} pins {before[-1][1]}" if before else "")
        + ")"
        if pins
        else "no torch release known here pins one"
    )
    return f"Triton >= {fixed}: {torch}, or pip install 'triton>={fixed}' over this torch"


def chunk_bwd_dqkwg_fix(fixed: str) -> str:
    """fla#640's fix line: a Triton that compiles it right, or FLA's TileLang backend."""
    return (
        f"{triton_fix(fixed)}; or pip install tilelang (FLA then runs the gated calls its TileLang backend "
        "takes: g, not g_gamma, h in the inputs' dtype, so not simple_gla's float32 h)"
    )


def is_hopper(platform: str | None, versions: dict | None = None) -> bool | None:
    """Whether a record's platform is a Hopper GPU (sm_90): True, False, or None where it cannot
    tell (a cuda platform with no device name it knows and no capability). A CPU (the Triton
    interpreter included) never is. The capability comes from versions["cuda_capability"] ("9.0")
    or the platform ("cuda:sm_90"); else FLA's own test: 'NVIDIA H' in the name, or a Hopper part."""
    kind, _, device = (platform or "").partition(":")
    if kind != "cuda":
        return False
    cap = (versions or {}).get("cuda_capability")
    m = re.search(r"sm_?(\d+)", device)
    major = version_tuple(str(cap))[0] if cap and version_tuple(str(cap)) else (int(m.group(1)) // 10 if m else None)
    if major is not None:
        return major == 9
    if "NVIDIA H" in device or HOPPER_NAMES.search(device):
        return True
    return False if device.strip() else None


# ------------------------------------------------------------------------------ refusals


def refusal_of(error_text: str | None) -> dict | None:
    """For an error FLA raised: {"issue", "cause", "fix", "environment": True} when it is a known
    refusal of its environment (REFUSALS), else None."""
    for r in REFUSALS:
        m = r.message.search(error_text or "")
        if m:
            low, fixed, function = m.group("low", "fixed", "function")
            return {
                "issue": r.issue,
                "cause": f"FLA refuses gated {function} on Hopper with Triton >= {low} and < {fixed} "
                f"(Triton compiles it wrong there: {r.issue}), so the reference has no result",
                "fix": chunk_bwd_dqkwg_fix(fixed),
                "environment": True,
            }
    return None


# ------------------------------------------------------------------------------ known wrong


def _conditions_hold(bug: KnownBug, platform: str, versions: dict) -> tuple[bool, list[str]]:
    """(whether the bug's platform and Triton conditions may hold, what could not be read)."""
    unknown = []
    hopper = is_hopper(platform, versions)
    if hopper is False:
        return False, []
    if hopper is None:
        unknown.append(f"the GPU ({platform!r})")
    triton = version_tuple((versions or {}).get("triton"))
    if triton is None:
        unknown.append("the Triton version")
    elif not _at_least(triton, bug.triton_from) or (bug.triton_fixed and _at_least(triton, bug.triton_fixed)):
        return False, []
    return True, unknown


def _entry(bug: KnownBug, k: AffectedKernel, why: str) -> dict:
    return {
        "issue": bug.issue,
        "kernel": k.kernel,
        "module": k.module,
        "tensors": list(dict.fromkeys(k.tensors + k.stage_tensors)),
        "why": why,
        "fix": bug.fix or chunk_bwd_dqkwg_fix(bug.triton_fixed),
    }


def _wrong(k: AffectedKernel) -> str:
    """'dk, dbeta, dg (its stage case: dk2, db, dg2)'."""
    return ", ".join(k.tensors) + (f" (its stage case: {', '.join(k.stage_tensors)})" if k.stage_tensors else "")


def _where(platform: str, versions: dict) -> str:
    return f"Triton {(versions or {}).get('triton') or '(not recorded)'} on {platform}"


def known_wrong(platform: str, versions: dict, launches: list[dict]) -> list[dict]:
    """The known-wrong results of a record that ran: one {"issue", "kernel", "module", "tensors",
    "why", "fix"} per launch of a kernel in a configuration a known bug (BUGS) makes wrong on this
    platform and Triton. Only cuda platforms can be (a launch the interpreter ran never is). A field
    the bug depends on that the record does not hold (the GPU, the Triton version, a constexpr,
    num_warps) counts as matching: what cannot be read is not shown right."""
    out, seen = [], set()
    for bug in BUGS:
        holds, unknown = _conditions_hold(bug, platform, versions)
        if not holds:
            continue
        for launch in launches:
            k = next(
                (k for k in bug.kernels if k.kernel == launch.get("kernel") and k.module == launch.get("module")),
                None,
            )
            if k is None:
                continue
            meta, missing = launch.get("meta") or {}, list(unknown)
            if any(name in meta and meta[name] != value for name, value in bug.meta):
                continue
            missing += [name for name, _ in bug.meta if name not in meta]
            if bug.num_warps is not None and launch.get("num_warps") not in (None, bug.num_warps):
                continue
            if bug.num_warps is not None and launch.get("num_warps") is None:
                missing.append("num_warps")
            config = ", ".join(
                [f"num_warps={launch.get('num_warps')}"] + [f"{n}={meta[n]}" for n, _ in bug.meta if n in meta]
            )
            why = (
                f"{_where(platform, versions)} compiles {k.kernel} ({k.module}) wrong at {config}, "
                f"chosen by {launch.get('chosen_by') or 'an unrecorded choice'}: wrong {_wrong(k)}"
                + (f" (not recorded, so not ruled out: {', '.join(missing)})" if missing else "")
                + f" ({bug.issue})"
            )
            if (bug.issue, k.module, k.kernel) not in seen:
                seen.add((bug.issue, k.module, k.kernel))
                out.append(_entry(bug, k, why))
    return out


def possibly_wrong(platform: str, versions: dict, op: str, stage: str | None, chunk_size: int | None) -> list[dict]:
    """known_wrong's entries for a record that does not say what FLA launched: each kernel the
    case's op (or stage) launches under a configuration FLA's autotuner chooses, where a known bug
    holds on this platform and Triton and one of those choices is wrong (AffectedKernel.autotuned_in;
    a chunk size other than the bug's BT rules it out)."""
    where = op if stage is None else f"{op}:{stage}"
    out = []
    for bug in BUGS:
        holds, unknown = _conditions_hold(bug, platform, versions)
        bt = dict(bug.meta).get("BT")
        if not holds or (bt is not None and chunk_size is not None and chunk_size != bt):
            continue
        for k in bug.kernels:
            if where in k.autotuned_in:
                why = (
                    f"{_where(platform, versions)}: FLA autotunes {k.kernel} ({k.module}) and the record does not "
                    f"say what it launched (notes.fla_launches), so num_warps={bug.num_warps} is not ruled out: "
                    f"wrong {_wrong(k)} there"
                    + (f" (not recorded either: {', '.join(unknown)})" if unknown else "")
                    + f" ({bug.issue})"
                )
                out.append(_entry(bug, k, why))
    return out
