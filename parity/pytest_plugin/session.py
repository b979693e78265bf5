"""What a pytest session of parity tests leaves behind: a manifest per marker of the records it
is meant to write (write_session_manifests, at collection), and the gate over the records it
wrote (session_gate, at session end). The harness is imported only when parity tests ran."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from parity.model.spec import REFERENCE  # standard library only (the backend spec's parser)
from parity.pytest_plugin.options import MODE_BACKENDS, session_specs, session_targets
from parity.pytest_plugin.options import report_dir as configured_report_dir


def write_session_manifests(items, config, run_id: str) -> list[Path]:
    """One manifest per marker (parity.records.manifest) listing the cases and backends the selected
    parity tests are meant to write under the report dir, so that `parity gate` refuses the
    directory when a test was skipped or never ran. Written at collection (each xdist worker
    writes the same file); nothing when no parity test is selected."""
    by_mode: dict[str, list[str]] = {}
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is None or "parity_case" not in callspec.params:
            continue
        mode = next((m for m in MODE_BACKENDS if item.get_closest_marker(m)), None)
        if mode:
            by_mode.setdefault(mode, []).append(callspec.params["parity_case"].id)
    if not by_mode:
        return []
    # late: the harness, only when parity tests are selected
    from parity.execute.backends import backend_name
    from parity.records.manifest import write_manifest

    paths = []
    for mode, ids in by_mode.items():
        specs = session_specs(config, mode)
        paths.append(
            write_manifest(
                configured_report_dir(config),
                f"{run_id}-{mode}",
                "pytest",
                list(dict.fromkeys(ids)),
                [backend_name(s) for s in specs],
                tpu_targets=session_targets(config, mode),
            )
        )
    return paths


def session_gate(
    report_dir: Path, run_id: str, factor: float, allow_unbounded_reference: bool = False
) -> tuple[str, bool | None]:
    """Gate over this session's records: (text, ok). The cases with both the reference and a
    candidate are gated (a tensor the reference's environment left unbounded fails unless
    allow_unbounded_reference, as in `parity gate`); a session with one side only (gpu: the
    reference; tpu: the candidates, each already held to its tolerance by its test) leaves the
    bound to `parity gate` over both machines' directories: ok None, as when the session wrote
    nothing (text '')."""
    # late: the harness, only when the session wrote under the report dir
    from parity.judge.gate import GateRefusal, evaluate, format_summary
    from parity.records import RecordError, iter_results, write_json

    by_case: dict = defaultdict(dict)
    compiles: dict = defaultdict(dict)
    try:
        for _, rec in iter_results([report_dir], run_id=run_id):  # earlier sessions' records are not read
            by_case[rec["case_id"]][rec["backend"]] = rec
        for _, rec in iter_results([report_dir], kind="compile", run_id=run_id):
            compiles[rec["case_id"]][rec["backend"]] = rec
    except RecordError as e:  # what the gate cannot read is never a pass
        return f"parity gate: refused: {e}", False
    if not by_case:
        return "", None
    sides = {rec["side"] for recs in by_case.values() for rec in recs.values()}
    by_case = {c: recs for c, recs in by_case.items() if REFERENCE in recs and _has_candidate(recs)}
    if not by_case:
        wrote = "the reference" if "reference" in sides else "candidates" if "candidate" in sides else "the oracle"
        return (
            f"parity gate: not run: this session wrote {wrote} only; the bound needs both sides: "
            f"parity gate {report_dir} <the other side's report dir>"
        ), None
    try:
        result = evaluate(
            by_case,
            factor,
            compiles={c: v for c, v in compiles.items() if c in by_case},
            allow_unbounded_reference=allow_unbounded_reference,
        )
    except GateRefusal as e:  # what the gate cannot compare is never a pass
        return f"parity gate: refused: {e}", False
    write_json(Path(report_dir) / "gate.json", result)
    return format_summary(result), result["ok"]


def _has_candidate(recs: dict[str, dict]) -> bool:
    return any(r["side"] == "candidate" for r in recs.values())
