"""The logic behind the pytest plugin (conftest.py stays thin): select cases, run one case
through the backends of a marker, explain failures, and gate the session's results.

Markers and what they run:
    interpret  oracle, fla (Triton interpreter), pallas, pallas-fused (TPU interpret mode), candidates
    gpu        oracle, fla compiled on CUDA
    tpu        oracle, pallas, pallas-fused compiled on TPU, candidates
"""
from __future__ import annotations

import functools
from pathlib import Path

from cases import OPS, Case, get_suite, load_cases_file

from .compare import describe_localisation
from .gate import GateRefusal, compile_problems, evaluate, format_summary
from .records import iter_results, write_json
from .runner import build_backends, run_case

from .backends.spec import REFERENCE  # noqa: E402 - the reference's name, in one place

MODE_BACKENDS = {
    "interpret": ["oracle", REFERENCE, "pallas", "pallas-fused"],
    "gpu": ["oracle", REFERENCE],
    "tpu": ["oracle", "pallas", "pallas-fused"],
}


def select_cases(suite: str | None, cases_file: str | None, op: str | None) -> list[Case]:
    cases = load_cases_file(cases_file) if cases_file else get_suite(suite or "smoke")
    if op:
        if op not in OPS:
            raise ValueError(f"--op {op!r}: expected one of {list(OPS)}")
        cases = [c for c in cases if c.op == op]
    return cases


@functools.cache
def _backends(specs: tuple[str, ...]) -> dict:
    return build_backends(list(specs))


def _fmt(x) -> str:
    return "nan/inf" if x is None else f"{x:.3g}"


def explain(case: Case, records: dict[str, dict], gate: dict | None) -> list[str]:
    """One paragraph per problem: tensor, both epsilons, tolerance, bound, worst element,
    where each side ran, and the command that reproduces just this case."""
    ref = records.get("fla")
    problems = []
    for name, rec in records.items():
        if rec["side"] == "oracle":
            continue
        where = f"{name} ran on {rec.get('platform') or '?'}"
        if rec["status"] in ("error", "timeout"):
            problems.append(f"[{name}] {rec['status']}: {(rec.get('error') or '').strip()[:1500]}\n  {where}\n  repro: {rec['repro']}")
            continue
        if rec["side"] == "reference":  # its tensors' verdicts are findings, not failures
            continue
        for tname, t in rec.get("tensors", {}).items():
            bound_entry = None
            if gate and rec["side"] == "candidate":
                for c in gate["cases"]:
                    if c["candidate"] == name:
                        bound_entry = c["tensors"].get(tname)
            verdict = (bound_entry or t)["verdict"] if bound_entry else t["verdict"]
            if verdict in ("pass", "unsupported"):
                continue
            rt = (ref or {}).get("tensors", {}).get(tname, {})
            w = (t.get("worst") or [{}])[0]
            b = (bound_entry or {}).get("bound") or {}
            rr = b.get("rel_rms") or {}
            lines = [f"[{name}] {tname}: {verdict}",
                     f"  eps_{name} (rel_rms) = {_fmt(t.get('rel_rms'))}   eps_fla = {_fmt(rt.get('rel_rms'))}   tol = {_fmt(t.get('tol'))}"
                     + (f"   bound limit = {_fmt(rr.get('limit'))} (factor {b.get('factor')})" if rr else ""),
                     f"  max_abs = {_fmt(t.get('max_abs'))}  nan = {t.get('nan')}  inf = {t.get('inf')}",
                     f"  worst index {w.get('index')}: value {w.get('value')} oracle {w.get('oracle')}",
                     f"  localisation: {describe_localisation((bound_entry or {}).get('localisation') or t.get('localisation')) or '-'}",
                     f"  {where}; fla ran on {(ref or {}).get('platform') or 'n/a'}",
                     f"  repro: {rec['repro']}"]
            problems.append("\n".join(lines))
    return problems


def reference_findings(case: Case, records: dict[str, dict]) -> list[str]:
    """The reference's own tensors outside tolerance or non-finite: reported, never a test
    failure (the gate then bounds nothing with a non-finite reference tensor)."""
    out = []
    for name, rec in records.items():
        if rec["side"] != "reference":
            continue
        for tname, t in rec.get("tensors", {}).items():
            if t.get("verdict") in ("fail-accuracy", "nan-inf"):
                w = (t.get("worst") or [{}])[0]
                out.append(f"{case.id}: reference {name} {tname} {t['verdict']} (rel_rms {_fmt(t.get('rel_rms'))}, "
                           f"tol {_fmt(t.get('tol'))}, nan {t.get('nan')}, inf {t.get('inf')}, worst index "
                           f"{w.get('index')}) on {rec.get('platform')}")
    return out


def check_case(case: Case, mode: str, candidates: list[str], report_dir: Path, run_id: str,
               factor: float, tpu_targets: tuple[str, ...] = ()) -> tuple[list[str], str | None, list[str]]:
    """Run `case` for a marker, compiling its jax candidates for `tpu_targets`; returns
    (problems, why no candidate could run it or None, findings about the reference)."""
    specs = MODE_BACKENDS[mode] + ([] if mode == "gpu" else list(candidates))
    backends = _backends(tuple(specs))
    recs, _, compiles = run_case(case, specs, backends, report_dir, run_id,
                                 tpu_targets=() if mode == "gpu" else tpu_targets)
    by_backend = {r["backend"]: r for r in recs}
    gate = None
    if "fla" in by_backend and any(r["side"] == "candidate" for r in recs):
        try:
            gate = evaluate({case.id: by_backend}, factor)
        except GateRefusal:
            gate = None
    cands = [r for r in recs if r["side"] == "candidate"]
    problems = explain(case, by_backend, gate) + [f"[{c['backend']}] {c['verdict']}: {line}\n  repro: {c['repro']}"
                                                  for c in compiles for line in compile_problems(c)]
    no_kernel = None
    if cands and all(r["status"] == "unsupported" for r in cands):
        no_kernel = "; ".join(f"{r['backend']}: {r.get('error')}" for r in cands)
    return problems, no_kernel, reference_findings(case, by_backend)


def write_session_manifests(items, candidates: list[str], report_dir: Path, run_id: str,
                            tpu_targets: tuple[str, ...] = ()) -> list[Path]:
    """One manifest per marker (parity.manifest) listing the cases and backends the selected
    parity tests are meant to write under report_dir, so that `parity gate` refuses the
    directory when a test was skipped or never ran. Written at collection (each xdist worker
    writes the same file)."""
    from .backends import backend_name
    from .manifest import write_manifest
    by_mode: dict[str, list[str]] = {}
    for item in items:
        callspec = getattr(item, "callspec", None)
        case = callspec.params.get("parity_case") if callspec else None
        mode = next((m for m in MODE_BACKENDS if item.get_closest_marker(m)), None)
        if isinstance(case, Case) and mode:
            by_mode.setdefault(mode, []).append(case.id)
    paths = []
    for mode, ids in by_mode.items():
        specs = MODE_BACKENDS[mode] + ([] if mode == "gpu" else list(candidates))
        paths.append(write_manifest(report_dir, f"{run_id}-{mode}", "pytest", list(dict.fromkeys(ids)),
                                    [backend_name(s) for s in specs], tpu_targets=() if mode == "gpu" else tpu_targets))
    return paths


def session_gate(report_dir: Path, run_id: str, factor: float) -> tuple[str, bool | None]:
    """Gate over this session's records: (text, ok) with ok None when there is nothing to gate."""
    from collections import defaultdict
    by_case: dict = defaultdict(dict)
    compiles: dict = defaultdict(dict)
    for _, rec in iter_results([report_dir]):
        if rec.get("run_id") == run_id:
            by_case[rec["case_id"]][rec["backend"]] = rec
    for _, rec in iter_results([report_dir], kind="compile"):
        if rec.get("run_id") == run_id:
            compiles[rec["case_id"]][rec["backend"]] = rec
    if not by_case:
        return "parity gate: no results in this session", None
    try:
        result = evaluate(dict(by_case), factor, compiles=dict(compiles))
    except GateRefusal as e:  # what the gate cannot compare is never a pass
        return f"parity gate: refused: {e}", False
    write_json(Path(report_dir) / "gate.json", result)
    return format_summary(result), result["ok"]
