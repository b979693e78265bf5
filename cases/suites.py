"""Named suites, defined as matrices with constraints rather than hand lists.

Each suite is a function returning a list of `Case`s. A matrix is a product of axes;
`covering` walks the product of the primary axes and rotates secondary axes (state,
varlen, shapes) through it so that every value of every secondary axis meets every op.
"""

from __future__ import annotations

import functools
import itertools
import json
from collections.abc import Callable, Iterable
from pathlib import Path

from cases.case import CHUNK_SIZES, GATES, Case, CaseError
from cases.models import MODEL_LAYERS, PACKED_GLA, model_case, models, models_at_scale
from cases.stages import STAGE_ORDER, stage_of

# the gates and ops the grids cover (other gates and ops join through cases of their own, so that
# a grid's cases stay fixed: gdn and grouped value heads, `delta_rule_cases`; gdn2,
# `gdn2_cases` and the gdn2 cases of smoke, stability, varlen and full)
GRID_GATES = ("g_logsig", "g_stress", "gamma_alibi", "gamma_stress")
GRID_OPS = ("simple_gla", "gla", "kda")


def gates_for(op: str, among=GRID_GATES) -> list[str]:
    return [g for g, (ops, _) in GATES.items() if op in ops and g in among]


STATES = [dict(h0=False, ht=False), dict(h0=True, ht=True), dict(h0=True, ht=False), dict(h0=False, ht=True)]


def covering(primary: Iterable[dict], secondary: dict[str, list[dict]]) -> list[Case]:
    """One case per primary combination; secondary axis j takes value i mod len(axis_j)
    (with a per-axis offset), so secondary values are spread evenly over the primary grid."""
    cases = []
    for i, p in enumerate(primary):
        kw = dict(p)
        for j, (_, values) in enumerate(secondary.items()):
            kw.update(values[(i + 3 * j) % len(values)])
        cases.append(Case(**kw))
    return cases


def _product(**axes) -> list[dict]:
    names = list(axes)
    return [dict(zip(names, vals)) for vals in itertools.product(*axes.values())]


def smoke() -> list[Case]:
    """Every op, forward and backward, fp32 and bf16: the quick end-to-end check (<= 12 cases)."""
    base = dict(B=1, T=96, H=2, K=64, V=64)
    return [
        Case("simple_gla", **base, gate="g_logsig", h0=True, ht=True),
        Case("simple_gla", **base, gate="gamma_alibi", dtype="bfloat16", chunk_size=128),
        Case("simple_gla", **{**base, "T": 100}, gate="g_logsig", seqlens=(37, 1, 62), h0=True, ht=True),
        Case("simple_gla", **base, gate="g_stress", direction="fwd"),
        Case("gla", **base, h0=True, ht=True),
        Case("gla", **base, dtype="bfloat16", direction="fwd"),
        Case("kda", **base, h0=True, ht=True),
        Case("kda", **base, dtype="bfloat16", direction="fwd"),
        Case("gdn", **base, HV=4, h0=True, ht=True),
        Case("gdn2", **{**base, "T": 64}, h0=True, ht=True),  # T = 64: FLA's gdn2 costs ~4 s a chunk interpreted
    ]


def ci() -> list[Case]:
    """op x direction x dtype x chunk x gate, with initial/final state, varlen (boundaries
    not aligned to the chunk) and wide K/V rotated through the grid."""
    primary = [
        p
        for op in GRID_OPS
        for p in _product(
            op=[op],
            direction=["fwd", "fwdbwd"],
            dtype=["float32", "bfloat16"],
            chunk_size=[64, 128],
            gate=gates_for(op),
        )
    ]
    shapes = [
        dict(B=2, T=128, H=2, K=64, V=64),
        dict(B=1, T=100, H=2, K=64, V=64),
        dict(B=1, T=130, H=1, K=64, V=64, seqlens=(45, 1, 84)),
        dict(B=1, T=64, H=1, K=256, V=256),
        dict(B=1, T=200, H=2, K=64, V=64, seqlens=(70, 130)),
    ]
    return covering(primary, {"state": STATES, "shape": shapes}) + head_dims() + delta_rule_cases() + gdn2_cases()


def delta_rule_cases() -> list[Case]:
    """gdn and grouped value heads (HV = G * H, value head j reads q, k head j // G) for the
    delta-rule ops (part of ci): gdn forward and backward with h0 / ht and T off the chunk grid;
    kda with HV = 2 H; gdn with HV = 2 H, packed sequences and bf16. Small heads (K = V = 32):
    each costs 20 to 60 s of the interpreters on 2 cores."""
    return [
        Case("gdn", B=1, T=100, H=2, K=32, V=32, h0=True, ht=True),
        Case("kda", B=1, T=64, H=1, K=32, V=32, HV=2, h0=True, ht=True),
        Case("gdn", B=1, T=96, H=1, K=32, V=32, HV=2, dtype="bfloat16", seqlens=(40, 56), h0=True, ht=True),
    ]


def gdn2_cases() -> list[Case]:
    """GDN-2 (channel-wise erase gate b [K] and write gate w [V]) in ci: forward and backward, fp32
    with h0 / ht and bf16, at one chunk (B 1, T 64, H 2, K = V = 64): FLA's chunk_gdn2 takes about
    4 s per case under the Triton interpreter (forward 2.9 s, backward 1.1 s)."""
    base = dict(B=1, T=64, H=2, K=64, V=64)
    return [Case("gdn2", **base, h0=True, ht=True), Case("gdn2", **base, dtype="bfloat16")]


def head_dims() -> list[Case]:
    """The head dims of real models, on every op, forward and backward (part of ci): K < V
    (GLA's expand_k 0.5), K > V, dims off the 64 grid (FLA's tests use 60 and 100), and V = 512
    (GLA-1.3B, RetNet, Gated DeltaNet). A kernel that takes its scale, a BlockSpec or its state
    layout from V instead of K passes every K == V case."""
    dims = [
        dict(K=64, V=128, h0=True, ht=True),
        dict(K=128, V=64, dtype="bfloat16"),
        dict(K=60, V=100, ht=True),
        dict(K=256, V=512, dtype="bfloat16", h0=True),
    ]
    gates = {
        "simple_gla": ["g_logsig", "gamma_alibi", "g_logsig", "gamma_retnet"],
        "gla": ["g_logsig", "g_stress", "g_logsig", "g_logsig"],
        "kda": ["g_logsig", "g_stress", "g_logsig", "g_logsig"],
    }
    return [
        Case(op, B=1, T=80, H=1 if d["V"] > 256 else 2, gate=gate, **d)
        for op in GRID_OPS
        for d, gate in zip(dims, gates[op])
    ]


def stability() -> list[Case]:
    """The NaN/Inf class: ALiBi g_gamma at chunk 128 with many heads (|gamma| * 128 > 88.7
    for the first heads of the first layers), long-ish T, stress gates for every op."""
    cases = [
        Case(
            "simple_gla",
            B=1,
            T=256,
            H=16,
            K=64,
            V=64,
            chunk_size=128,
            gate="gamma_alibi",
            gate_params={"layer": layer, "layers": 20},
            dtype=dtype,
            h0=True,
            ht=True,
        )
        for layer, dtype in [(0, "float32"), (0, "bfloat16"), (1, "bfloat16")]
    ]
    cases += [
        Case(op, B=1, T=256, H=2, K=64, V=64, chunk_size=chunk, gate=gate, dtype=dtype)
        for op in GRID_OPS
        for gate in gates_for(op)
        if gate.endswith("stress")
        for chunk, dtype in [(64, "float32"), (128, "bfloat16")]
    ]
    cases += [  # gdn2 as kda (its own cases: the grid's stay as they are)
        Case("gdn2", B=1, T=256, H=2, K=64, V=64, chunk_size=chunk, gate="g_stress", dtype=dtype)
        for chunk, dtype in [(64, "float32"), (128, "bfloat16")]
    ]
    cases.append(
        Case(
            "simple_gla",
            B=1,
            T=1024,
            H=4,
            K=64,
            V=64,
            chunk_size=128,
            gate="gamma_alibi",
            dtype="bfloat16",
            direction="fwd",
        )
    )
    return cases


def varlen() -> list[Case]:
    """Packed sequences of uneven lengths: length 1, shorter than a chunk, straddling chunk
    boundaries, exactly one chunk."""
    lens = [(1, 63, 64, 2), (100, 1, 27), (64, 65), (5, 1, 1, 120)]
    gdn2 = [  # the first two of kda's, on gdn2 (its own cases: the grid's stay as they are)
        Case("gdn2", B=1, T=sum(ls), H=2, K=64, V=64, seqlens=ls, chunk_size=chunk, dtype=dtype, h0=h0, ht=True)
        for ls, (chunk, dtype, h0) in zip(lens[:2], [(64, "float32", True), (128, "bfloat16", False)])
    ]
    return gdn2 + [
        Case(op, B=1, T=sum(ls), H=2, K=64, V=64, seqlens=ls, chunk_size=chunk, dtype=dtype, h0=h0, ht=True)
        for op in GRID_OPS
        for ls, (chunk, dtype, h0) in zip(
            lens, itertools.cycle([(64, "float32", True), (128, "bfloat16", False), (64, "bfloat16", True)])
        )
    ]


def stage_cases(case: Case) -> list[Case]:
    """The stage cases of an op case, in the order its stages run (cases.stages.STAGE_ORDER): its
    forward's stages, and its backward's for a forward-and-backward case; only the stages that
    exist for the case (none where FLA's stage functions refuse its chunk size, e.g. kda at 128,
    which FLA's kda op runs at 64); none for an op without stage cases."""
    out = []
    for name in STAGE_ORDER.get(case.op, ()):
        stage = stage_of(case.op, name)
        if (stage.direction == "bwd" and not case.backward) or (stage.g_only and case.uses_g_gamma):
            continue
        try:
            out.append(case.replace(stage=name, direction="fwd"))
        except CaseError:  # the registry's stage refuses the case (cases.stages.check_stage)
            continue
    return out


def _largest_stage_chunk(op: str) -> int:
    """128, or the largest chunk size below it that every stage of `op` takes."""
    for chunk in sorted(CHUNK_SIZES, reverse=True):
        try:
            for name in STAGE_ORDER[op]:
                Case(op, B=1, T=64, H=1, K=64, V=64, chunk_size=chunk, stage=name, direction="fwd")
            return chunk
        except CaseError:
            continue
    raise CaseError(f"no chunk size that every stage of {op} takes")


def stages() -> list[Case]:
    """Every stage of every op with stage cases (cases.stages), at ci sizes: stage x dtype (fp32,
    bf16) x gate (g_logsig; simple_gla also gamma_alibi), with the states and shapes (rows, varlen
    with a length-1 sequence, chunk 32, K < V) rotated through; and each stage at chunk 128 (the
    largest its op's stages take) under
    gamma_stress (g_stress where the op has no g_gamma): |g| * chunk far past the float32 exp
    range (split-decay-overflow lived in chunk_bwd_dh; docs/mutants.md)."""
    primary = [
        dict(op=op, stage=name, direction="fwd", dtype=dtype, gate=gate)
        for op, names in STAGE_ORDER.items()
        for name in names
        for dtype in ("float32", "bfloat16")
        for gate in gates_for(op, ("g_logsig", "gamma_alibi"))
        if not (stage_of(op, name).g_only and gate.startswith("gamma_"))
    ]
    shapes = [
        dict(B=2, T=128, H=2, K=64, V=64),
        dict(B=1, T=168, H=2, K=64, V=64, seqlens=(37, 1, 130)),  # the last over several chunks
        dict(B=1, T=96, H=2, K=64, V=64, chunk_size=32),
        dict(B=1, T=160, H=2, K=64, V=128),
    ]
    stress = [
        Case(op, B=1, T=256, H=2, K=64, V=64, chunk_size=_largest_stage_chunk(op), h0=True, ht=True).replace(
            gate=(gates_for(op, ("gamma_stress",)) or ["g_stress"])[0]
        )
        for op in STAGE_ORDER
    ]
    return covering(primary, {"state": STATES, "shape": shapes}) + [
        c for op_case in stress for c in stage_cases(op_case.replace(direction="fwdbwd"))
    ]


def full() -> list[Case]:
    """Realistic shapes for GPU and TPU runs (not for CPU interpreters); with the stage cases of
    its model layers at training size."""
    shapes = _product(T=[2048, 8192], H=[16, 32], KV=[64, 128, 256], B=[1, 8])
    shapes = [s for s in shapes if s["B"] * s["T"] * s["H"] <= 8 * 2048 * 32]
    primary = [
        p
        for op in GRID_OPS
        for p in _product(op=[op], dtype=["float32", "bfloat16"], chunk_size=[64, 128], gate=gates_for(op))
    ]
    shape_axis = [dict(B=s["B"], T=s["T"], H=s["H"], K=s["KV"], V=s["KV"]) for s in shapes]
    gdn2 = [
        Case("gdn2", B=1, T=8192, H=16, K=128, V=128, h0=True, ht=True),
        Case("gdn2", B=8, T=2048, H=16, K=64, V=64, dtype="bfloat16", h0=True, ht=True),
        Case("gdn2", B=1, T=2048, H=32, K=256, V=256, dtype="bfloat16", gate="g_stress"),
    ]
    at_scale = models_at_scale()
    return (
        covering(primary, {"state": STATES[:2], "shape": shape_axis})
        + gdn2
        + at_scale
        + [s for c in at_scale for s in stage_cases(c)]
    )


FLA_FIELDS = ("op", "B", "T", "H", "K", "V", "dtype", "chunk_size", "gate", "scale", "h0", "ht", "seqlens", "direction")


@functools.cache
def fla_tests_sources() -> dict[str, list[str]]:
    """case id -> the FLA tests (file::function[id]) that use its parameters
    (cases/fla_tests_data.py: FLA's tests/ops/test_{simple_gla,gla,kda,gdn,gdn2}.py as data)."""
    # late: a 3,200-line data table, parsed only when the fla-tests suite or a case's label is asked for
    from cases.fla_tests_data import FLA_TESTS

    out: dict[str, list[str]] = {}
    for e in FLA_TESTS:
        c = Case(**{k: e[k] for k in FLA_FIELDS}, HV=e.get("HV"), gate_params={"norm": e["norm"]})
        out.setdefault(c.id, []).append(e["source"])
    return out


def fla_tests() -> list[Case]:
    """The shapes, dtypes, chunk sizes, gate strengths and varlen offsets of FLA's own tests for
    simple_gla, gla, kda, gdn and gdn2, one case per distinct parameter set (several FLA tests share one)."""
    return [Case.from_id(i) for i in fla_tests_sources()]


def label(case: Case) -> str | None:
    """What a case comes from, if anything: a model layer, or the FLA tests it copies."""
    for m in MODEL_LAYERS + (PACKED_GLA,):
        if model_case(m, B=case.B, T=case.T, seqlens=case.seqlens, seed=case.seed) == case:
            return m.label
    sources = fla_tests_sources().get(case.id)
    return (
        "FLA " + ", ".join(sources[:2]) + (f" (+{len(sources) - 2})" if len(sources) > 2 else "") if sources else None
    )


SUITES: dict[str, Callable[[], list[Case]]] = {
    "smoke": smoke,
    "ci": ci,
    "stability": stability,
    "varlen": varlen,
    "full": full,
    "stages": stages,
    "models": models,
    "fla-tests": fla_tests,
}


def get_suite(name: str) -> list[Case]:
    if name not in SUITES:
        raise CaseError(f"unknown suite {name!r}: expected one of {sorted(SUITES)}")
    return SUITES[name]()


def load_cases_file(path: str | Path) -> list[Case]:
    """A JSON list of case dicts (as `parity cases --json` prints) or case ids."""
    try:
        entries = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CaseError(f"cases file {path}: {e}") from None
    if not isinstance(entries, list):
        raise CaseError(f"cases file {path}: expected a JSON list of case dicts or ids")
    out = []
    for i, e in enumerate(entries):
        try:
            out.append(Case.from_id(e) if isinstance(e, str) else Case.from_dict(e))
        except (CaseError, TypeError) as err:
            raise CaseError(f"cases file {path}, entry {i}: {err}") from None
    return out
