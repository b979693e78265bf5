"""Result records -> the page's data, case by case: the gate per case (`gate_per_case`), one table
row (`case_row`) and one detail payload (`case_detail`) per case, and the index's counts
(`summary`)."""

from __future__ import annotations

import math
import time
from collections import Counter, defaultdict
from pathlib import Path

from cases import Case, CaseError
from cases.suites import stage_cases
from parity.html.compile_view import COMPILE_LABEL, compile_cell, compile_detail, worst_page_verdict
from parity.judge.case import deciding_tensor, judge_case
from parity.judge.localise import localise_stages
from parity.judge.summary import environment_lines, margin_line, margin_of, smallest_margin
from parity.judge.words import describe_localisation
from parity.measure.compute_error import MARGIN
from parity.model.spec import REFERENCE
from parity.model.verdict import Verdict


def _ordered_counts(counter: Counter) -> dict:
    known = [v for v in Verdict if v in counter]
    return {v: counter[v] for v in known + sorted(set(counter) - set(known))}


# where a record says it ran (BackendResult.platform), in words: an emulator is never a GPU or TPU
PLATFORM_WORDS = {
    "cpu:triton-interpreter": "a CPU, in the Triton interpreter",
    "cpu:tpu-interpret": "a CPU, in TPU interpret mode",
    "cpu": "a CPU",
}
FAILING_SHOWN = 12  # failing checks the gate card lists (the case table holds the rest)


def platform_words(platform: str) -> str:
    """'cuda:NVIDIA H100 ...' -> 'a GPU: CUDA on NVIDIA H100 ...', 'tpu:TPU v5 lite' -> 'a TPU (TPU v5
    lite)', the CPU emulators by name (PLATFORM_WORDS); anything else as it is."""
    if platform in PLATFORM_WORDS:
        return PLATFORM_WORDS[platform]
    kind, _, device = platform.partition(":")
    return {"cuda": f"a GPU: CUDA on {device}", "tpu": f"a TPU ({device})"}.get(kind, platform)


def where_sides_ran(by_case: dict) -> dict[str, str]:
    """{"reference": ..., "candidates": ...}: each backend of that side and where its records say it
    ran, in words, e.g. 'fla on a CPU, in the Triton interpreter'."""
    ran: dict[str, dict[str, Counter]] = {"reference": defaultdict(Counter), "candidate": defaultdict(Counter)}
    for recs in by_case.values():
        for name, r in recs.items():
            if r.get("side") in ran and r.get("platform"):
                ran[r["side"]][name][r["platform"]] += 1
    words = {
        side: "; ".join(
            f"{name} on " + " and ".join(platform_words(p) for p, _ in platforms.most_common())
            for name, platforms in sorted(backends.items())
        )
        for side, backends in ran.items()
    }
    return {"reference": words["reference"] or "none", "candidates": words["candidate"] or "none"}


def _failing_line(f: dict) -> dict:
    """A gate failure (Failure.as_dict) for the gate card: case, candidate, tensor, verdict, the rule
    with its figures (or what went wrong), where."""
    return {
        "case_id": f["case_id"],
        "candidate": f["candidate"],
        "tensor": f.get("tensor") or "",
        "verdict": f["verdict"],
        "why": f.get("why") or f.get("detail") or "",
        "where": describe_localisation(f.get("localisation")),
    }


def gate_per_case(
    by_case: dict,
    factor: float,
    compiles: dict | None = None,
    allow_inconclusive: bool = False,
    allow_unbounded_reference: bool = False,
) -> tuple[dict[str, dict], dict]:
    """The gate's judgement (parity.judge.case.judge_case) of each case, so that one refused case
    does not hide the others: case_id -> {candidate: entry} or {'refused': reason}; and the overall
    outcome, with one line per cause of the reference's environment that left candidates unbounded
    (`environment`, as `parity gate` prints them) and the references from the interpreter fallback.
    TPU compile records join as they do in `parity gate` (compile-error, numerics-mismatch); without
    both sides' results only the compile records are judged. The allow_* switches: `parity gate`'s."""
    compiles = compiles or {}
    per_case: dict[str, dict] = {}
    has_ref = any(r["side"] == "reference" for recs in by_case.values() for r in recs.values())
    has_cand = any(r["side"] == "candidate" for recs in by_case.values() for r in recs.values())
    note = None
    if not (has_ref and has_cand):
        missing = f"reference ({REFERENCE})" if not has_ref else "candidate"
        if not compiles:
            return per_case, {"status": "not evaluated", "reason": f"no {missing} results in these directories"}
        note = f"TPU compile records only: no {missing} results in these directories, so no accuracy or bound checks"
    failures, refused, counts, failing, environment, fallbacks = 0, [], Counter(), [], [], 0
    for cid in sorted(set(by_case) | set(compiles)):
        recs = None if note else (by_case.get(cid) or None)  # None: its compile records only
        j = judge_case(cid, recs, compiles.get(cid), factor, REFERENCE, allow_inconclusive, allow_unbounded_reference)
        if j.refused:
            per_case[cid] = {"refused": j.refused}
            refused.append(j.refused)
            continue
        per_case[cid] = {e["candidate"]: e for e in j.entries}
        failures += len(j.failures) + len(j.compile_failures)
        failing += [_failing_line(f.as_dict()) for f in (*j.failures, *j.compile_failures)]
        counts.update(e["verdict"] for e in j.entries)
        environment += j.unbounded_by_environment
        fallbacks += j.reference_fallback is not None
    status = "refused" if refused else ("pass" if failures == 0 else "fail")
    margin = smallest_margin([e for g in per_case.values() for k, e in g.items() if k != "refused"])
    return per_case, {
        "status": status,
        "factor": factor,
        "failures": failures,
        "refused": len(refused),
        "refusal_examples": refused[:3],
        "counts": _ordered_counts(counts),
        "note": note,
        "smallest_margin": margin_line(margin) if margin else None,
        "failing": failing[:FAILING_SHOWN],
        "ran": where_sides_ran(by_case),
        "environment": [line.strip() for line in environment_lines(environment)],
        "fallbacks": fallbacks,
        "allowed": [
            f"--{name}"
            for name, on in (
                ("allow-inconclusive", allow_inconclusive),
                ("allow-unbounded-reference", allow_unbounded_reference),
            )
            if on
        ],
    }


def bound_points(gate_cases: dict[str, dict], rows: list[dict], factor: float) -> dict:
    """The bound scatter's data: one point per (case, candidate, tensor) with a compute-error
    judgement: x the reference's compute error, y the candidate's, [y_lo, y_hi] the interval
    (lo, hi times x; ratio method only). A compute error of 0 (at the rounding level) is drawn at
    `floor` (a tenth of the smallest positive one on the plot) and marked `clamped`; dtype is the
    tensor's (the case's where the record has none). Tensors with a
    bound but no judgement (NaN/Inf candidate, no common seed) are counted in `undrawn`."""
    by_id = {r["id"]: r for r in rows}
    points, undrawn = [], 0
    for cid, cands in sorted(gate_cases.items()):
        for cname, entry in sorted(cands.items()):
            if cname == "refused":
                continue
            for name, t in (entry.get("tensors") or {}).items():
                b = t.get("bound")
                if not b:
                    continue
                j = b.get("compute")
                if not j:
                    undrawn += 1
                    continue
                x, y = j["c_reference"], j["c_candidate"]
                ratio = j["method"] == "ratio"
                m = margin_of(j)
                points.append(
                    {
                        "n": by_id[cid]["n"],
                        "case": cid,
                        "candidate": cname,
                        "tensor": name,
                        "dtype": t.get("dtype") or by_id[cid]["dtype"],
                        "verdict": t["verdict"],
                        "method": j["method"],
                        "x": x,
                        "y": y,
                        "y_lo": j["lo"] * x if ratio else None,
                        "y_hi": j["hi"] * x if ratio else None,
                        "ratio": j["ratio"],
                        "lo": j["lo"],
                        "hi": j["hi"],
                        "seeds": j["seeds"],
                        "margin": m and f"{m[0]} = {m[1]:.3g}",
                    }
                )
    positive = [v for p in points for v in (p["x"], p["y"], p["y_lo"]) if v]
    floor = min(positive) / 10 if positive else 1e-12
    for p in points:
        p["clamped"] = [k for k in ("x", "y") if not p[k] > floor]
        for k in ("x", "y", "y_lo", "y_hi"):
            if p[k] is not None:
                p[k] = max(p[k], floor)
    return {"points": points, "floor": floor, "undrawn": undrawn, "factor": factor, "edge": factor * (1 + MARGIN)}


def _worst_tensor(tensors: dict) -> tuple[str | None, dict]:
    """The tensor with NaN/Inf, else the highest rel_rms / tol (as parity.execute.runner's summary line)."""
    worst, score = None, -1.0
    for name, t in tensors.items():
        if t.get("nan") or t.get("inf"):
            return name, t
        eps, tolerance = t.get("rel_rms"), t.get("tol")
        if eps is None or not tolerance:
            continue
        if eps / tolerance > score:
            worst, score = name, eps / tolerance
    return worst, tensors.get(worst, {}) if worst else {}


def _bound_use(gate_entry: dict | None) -> float | None:
    """max over tensors and metrics of eps_candidate / (factor * eps_reference + floor): > 1 fails."""
    if not gate_entry:
        return None
    uses = []
    for t in gate_entry.get("tensors", {}).values():
        for metric in ("rel_rms", "max_abs"):
            m = (t.get("bound") or {}).get(metric) or {}
            c, limit = m.get("candidate"), m.get("limit")
            if c is None or limit is None:
                continue
            uses.append(c / limit if limit > 0 else (0.0 if c == 0 else math.inf))
    finite = [u for u in uses if math.isfinite(u)]
    return max(finite) if finite else None


def _gating(case: dict) -> str:
    params = case.get("gate_params") or {}
    return str(case.get("gate", "")) + (
        "(" + ",".join(f"{k}={v}" for k, v in sorted(params.items())) + ")" if params else ""
    )


def backend_order(by_case: dict) -> list[str]:
    """oracle, the reference, then candidates by name."""
    sides = {}
    for recs in by_case.values():
        for name, r in recs.items():
            sides.setdefault(name, r.get("side", "candidate"))
    rank = {"oracle": 0, "reference": 1, "candidate": 2}
    return sorted(sides, key=lambda b: (rank.get(sides[b], 3), b))


def _where(gate_entry: dict | None, worst: str | None) -> str | None:
    """Localisation of a failing candidate: of its worst tensor if that fails, else of the first failing one."""
    tensors = (gate_entry or {}).get("tensors", {})
    failing = [n for n, t in tensors.items() if t.get("localisation")]
    if not failing:
        return None
    name = worst if worst in failing else failing[0]
    return f"{name}: {tensors[name].get('where') or describe_localisation(tensors[name]['localisation'])}"


def _decided(entry: dict | None) -> dict:
    """{"d": 'TENSOR: RULE', "w": that rule with its figures} of the tensor that decided a gate entry
    that did not pass (as `parity run`'s table and the gate's summary name it); {} otherwise."""
    name = deciding_tensor(entry) if entry and entry.get("verdict") != Verdict.PASS else None
    if not name:
        return {}
    t = entry["tensors"][name]
    return {"d": f"{name}: {t.get('rule')}", "w": t.get("why")}


def _output_order(case: dict) -> list[str]:
    """The case's outputs in the registry's report order (Case.output_names); [] for a record whose
    case does not parse (its tensors are then listed by name)."""
    try:
        return Case.from_dict(case).output_names()
    except (CaseError, KeyError, TypeError, ValueError):
        return []


def _case_dict(recs: dict, compile_recs: dict | None) -> dict:
    any_rec = next(iter(recs.values()), None) or next(iter((compile_recs or {}).values()), None) or {}
    return any_rec.get("case") or {}


def headline_verdict(cells: dict[str, dict], recs: dict[str, dict], cc: dict | None) -> str:
    """A case's verdict: the worst of the candidates that apply to it (and its TPU compiles);
    a candidate with no kernel for it (unsupported) is not applicable and never outranks a pass;
    "unsupported" when none applies. A case without candidate records: the worst of the oracle's
    and the reference's."""
    candidates = [b for b in cells if recs[b].get("side") == "candidate"]
    judged = [cells[b]["v"] for b in (candidates or cells)]
    applicable = [v for v in judged if v != Verdict.UNSUPPORTED] + ([cc["v"]] if cc else [])
    return worst_page_verdict(applicable) if applicable else Verdict.UNSUPPORTED


def case_row(
    index: int, case_id: str, recs: dict, gate_case: dict, backends: list[str], compile_recs: dict | None = None
) -> dict:
    """One table row: the case's fields and, per backend, verdict, worst tensor, rel_rms, max_abs, bound use;
    with compile records, the compile column ("cc"), whose verdict counts in the row's."""
    case = _case_dict(recs, compile_recs)
    cells = {}
    for b in backends:
        r = recs.get(b)
        if r is None:
            continue
        entry = gate_case.get(b) if isinstance(gate_case, dict) else None
        verdict = (
            entry["verdict"] if entry and "verdict" in entry else r.get("verdict") or r.get("status") or Verdict.ERROR
        )
        name, t = _worst_tensor(r.get("tensors", {})) if r.get("side") != "oracle" else (None, {})
        nonfinite = any(x.get("nan") or x.get("inf") for x in r.get("tensors", {}).values())
        cell = {
            "v": verdict,
            "g": entry is not None and "verdict" in entry,  # v is the gate's (tolerance and bound), not the record's
            "t": name,
            "e": t.get("rel_rms"),
            "m": t.get("max_abs"),
            "r": None if nonfinite else _bound_use(entry),  # finite-only epsilons bound nothing
            "nan": bool(t.get("nan") or t.get("inf")),
            "err": (r.get("error") or "").strip().splitlines()[0][:300] if (r.get("error") or "").strip() else None,
            "l": _where(entry, name),
            **_decided(entry),
        }
        cells[b] = {k: v for k, v in cell.items() if v is not None and v is not False}  # page size: drop empties
    cc = compile_cell(compile_recs)
    row = {
        "n": index,
        "id": case_id,
        "op": case.get("op"),
        "dtype": case.get("dtype"),
        "C": case.get("chunk_size"),
        "gating": _gating(case),
        "verdict": headline_verdict(cells, recs, cc),
        "b": cells,
    }
    if cc:
        row["cc"] = cc
    if isinstance(gate_case, dict) and gate_case.get("refused"):
        row["refused"] = gate_case["refused"]
    return row


def summary(
    rows: list[dict], by_case: dict, backends: list[str], gate: dict, dirs: list[Path], skipped: list[str]
) -> dict:
    """Counts by verdict and by op, dtype, chunk size, gating; where each backend ran and with what."""
    verdicts = _ordered_counts(Counter(r["verdict"] for r in rows))
    columns = list(verdicts)
    breakdown = {}
    for label, key in (("op", "op"), ("dtype", "dtype"), ("chunk size", "C"), ("gating", "gating")):
        table = defaultdict(Counter)
        for r in rows:
            table[str(r[key])][r["verdict"]] += 1
        breakdown[label] = [
            {"value": v, "total": sum(c.values()), "counts": [c.get(col, 0) for col in columns]}
            for v, c in sorted(table.items())
        ]
    where = []
    for b in backends:
        recs = [recs[b] for recs in by_case.values() if b in recs]
        platforms = Counter(r.get("platform") or "(none)" for r in recs)
        versions = Counter(
            ", ".join(f"{k} {v}" for k, v in sorted((r.get("versions") or {}).items())) or "(none)" for r in recs
        )
        cells = [row["b"][b] for row in rows if b in row["b"]]
        where.append(
            {
                "backend": b,
                "side": recs[0].get("side", ""),
                "records": len(recs),
                # the case table's verdicts: the gate's for a judged candidate, the records' own otherwise
                "verdicts": _ordered_counts(Counter(c["v"] for c in cells)),
                "judged_by": "gate" if cells and all(c.get("g") for c in cells) else "tolerance only",
                "platforms": platforms.most_common(),
                "versions": versions.most_common(3),
                "hosts": sorted({r.get("host", "") for r in recs}),
                "implementations": sorted({r.get("implementation") or "" for r in recs} - {""}),
                "pallas": Counter(filter(None, map(what_ran, recs))).most_common(),
            }
        )
    created = sorted(r.get("created", "") for recs in by_case.values() for r in recs.values())
    return {
        "cases": len(rows),
        "records": sum(len(v) for v in by_case.values()),
        "verdicts": verdicts,
        "columns": columns,
        "breakdown": breakdown,
        "where": where,
        "gate": gate,
        "dirs": [str(d) for d in dirs],
        "skipped": skipped[:20],
        "n_skipped": len(skipped),
        "created": (created[0], created[-1]) if created else None,
        "generated": time.strftime("%Y-%m-%d %H:%M:%S%z"),
    }


RAN_IN_WORDS = {"tpu-interpret": "TPU interpret mode", "as written": "Mosaic on the TPU"}  # notes.pallas.ran


def what_ran(rec: dict) -> str | None:
    """One line on a jax backend's Pallas kernels (notes.pallas, parity.execute.pallas_paths): how
    they ran and where on the emulated host, or why they are no TPU kernels; None for others."""
    paths = (rec.get("notes") or {}).get("pallas")
    if not paths:
        return None
    host = ((rec.get("notes") or {}).get("tpu_identity") or {}).get("emulated")
    where = f" on an emulated {host} host" if host else ""
    if paths.get("cause") and paths.get("required"):
        return f"not a TPU kernel: {paths['cause']}"
    if paths.get("cause"):  # a plain jax candidate: XLA is what it is, not a kernel it lacks
        return f"plain JAX, compiled by XLA ({paths['cause']})"
    ran = RAN_IN_WORDS.get(paths.get("ran"), paths.get("ran"))
    return f"Mosaic kernels as written, run in {ran}{where}"


def _with_where(t: dict) -> dict:
    """A record's tensor with "where": its localisation in words (as the gate's entries carry it)."""
    return {**t, "where": describe_localisation(t["localisation"])} if t.get("localisation") else t


def stage_localisations(case_id: str, by_case: dict, factor: float) -> list[dict]:
    """For an op case whose stage cases are in the records: per candidate that ran its stages
    (under its own name, or NAME.stages: parity localise), parity.judge.localise's result."""
    try:
        case = Case.from_id(case_id)
    except CaseError:  # a record's id the registry does not parse: no stages to look for
        return []
    stage_ids = [s.id for s in stage_cases(case) if s.id in by_case] if case.stage is None else []
    out = []
    for backend, rec in sorted(by_case.get(case_id, {}).items()):
        if rec["side"] != "candidate" or not stage_ids:
            continue
        for stage_backend in (backend, f"{backend}.stages"):
            if any(by_case[s].get(stage_backend, {}).get("status", "unsupported") != "unsupported" for s in stage_ids):
                out.append(localise_stages(case, by_case, backend, stage_backend, factor))
                break
    return out


def case_detail(
    row: dict,
    recs: dict,
    gate_case: dict,
    backends: list[str],
    compile_recs: dict | None = None,
    compile_targets: list[str] = (),
) -> dict:
    """Everything the detail view shows for one case (the per-case file's payload)."""
    out_backends = []
    for b in backends:
        r = recs.get(b)
        if r is None:
            continue
        keep = {
            k: r.get(k)
            for k in (
                "side",
                "status",
                "verdict",
                "platform",
                "implementation",
                "versions",
                "kernel_time_s",
                "wall_time_s",
                "error",
                "notes",
                "repro",
                "run_id",
                "host",
                "created",
                "input_hash",
                "oracle_version",
                "tol_version",
            )
        }
        out_backends.append(
            {
                "name": b,
                "row_verdict": row["b"][b]["v"],
                **keep,
                "tensors": {n: _with_where(t) for n, t in r.get("tensors", {}).items()},
                "gate": gate_case.get(b) if isinstance(gate_case, dict) else None,
            }
        )
    names = {n for r in recs.values() for n in r.get("tensors", {})}
    declared = _output_order(_case_dict(recs, compile_recs))
    order = [n for n in declared if n in names] + sorted(names - set(declared))
    compiled = [compile_detail(r, list(compile_targets)) for _, r in sorted((compile_recs or {}).items())]
    return {
        "n": row["n"],
        "id": row["id"],
        "verdict": row["verdict"],
        "case": _case_dict(recs, compile_recs),
        "refused": row.get("refused"),
        "tensor_order": order,
        "backends": out_backends,
        "compile": compiled,
        "compile_label": COMPILE_LABEL if compiled else None,
    }
