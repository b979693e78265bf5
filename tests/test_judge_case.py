"""The judge as pure functions: judge_case on hand-made records (a pass, an accuracy failure, NaN,
an error, a Pallas kernel that did not run as one, a refusal, compile records), evaluate as the
collection of judge_case, and one compile median for the terminal and the page."""

import re

import numpy as np
import pytest

from parity.html import write_report
from parity.html.build import write_diff_page
from parity.judge.case import Failure, judge_case
from parity.judge.diff import format_diff, ratio_summary
from parity.judge.gate import compile_summary, evaluate, format_compile_summary, load_compiles
from parity.model.spec import STATUSES
from parity.model.verdict import Verdict
from parity.records import SCHEMA_VERSION, write_json

from .helpers import SMALL_BF16, perturbed, record_from_tensors, reference_like

C = SMALL_BF16


@pytest.fixture(scope="module")
def fla_like():
    return reference_like(C)


@pytest.fixture(scope="module")
def ref(fla_like):
    return record_from_tensors(C, "fla", "reference", fla_like)


def cand(tensors) -> dict:
    return record_from_tensors(C, "pallas", "candidate", tensors)


def test_a_close_candidate_passes(ref, fla_like):
    j = judge_case(C.id, {"fla": ref, "pallas": cand(perturbed(C, fla_like, 0.5))})
    assert j.ok and j.verdict == "pass" and not j.failures and j.refused is None
    entry = j.entry("pallas")
    assert entry["verdict"] == "pass" and set(entry["tensors"]) == set(C.output_names())
    assert all(t["bound"]["ok"] for t in entry["tensors"].values())


def test_an_inaccurate_candidate_fails_with_its_figures(ref, fla_like):
    far = cand(perturbed(C, fla_like, 1e4))
    j = judge_case(C.id, {"fla": ref, "pallas": far})
    assert not j.ok and j.verdict == "fail-accuracy"
    f = j.failures[0]
    assert isinstance(f, Failure) and (f.case_id, f.candidate, f.verdict) == (C.id, "pallas", "fail-accuracy")
    assert f.tensor in C.output_names() and f.figures["eps_candidate"] > f.figures["tol"]
    assert f.repro == far["repro"] and f.detail == ""
    d = f.as_dict()
    assert list(d)[:4] == ["case_id", "candidate", "tensor", "verdict"] and list(d)[-1] == "repro"
    assert {"eps_candidate", "eps_reference", "ratio", "interval", "seeds", "tol", "localisation"} <= set(d)


def test_nan_where_the_oracle_is_finite_fails(ref, fla_like):
    bad = {n: np.array(a, np.float64) for n, a in fla_like.items()}
    bad["o"].flat[3] = np.nan
    j = judge_case(C.id, {"fla": ref, "pallas": cand(bad)})
    assert j.verdict == "nan-inf" and j.entry("pallas")["tensors"]["o"]["verdict"] == "nan-inf"
    assert [(f.tensor, f.verdict) for f in j.failures] == [("o", "nan-inf")]


def test_a_candidate_that_errored_fails_as_a_whole(ref, fla_like):
    crashed = {
        **cand(fla_like),
        "status": "error",
        "verdict": "error",
        "tensors": {},
        "error": "RuntimeError: boom\n  traceback",
    }
    j = judge_case(C.id, {"fla": ref, "pallas": crashed})
    assert j.verdict == "error" and j.entry("pallas")["error"].startswith("RuntimeError: boom")
    assert j.failures == (Failure(C.id, "pallas", None, "error", "RuntimeError: boom"),)
    assert j.failures[0].as_dict() == {
        "case_id": C.id,
        "candidate": "pallas",
        "tensor": None,
        "verdict": "error",
        "detail": "RuntimeError: boom",
    }


def test_a_pallas_kernel_that_did_not_run_as_one_never_passes(ref, fla_like):
    rec = cand(perturbed(C, fla_like, 0.5))
    rec["notes"] = {**(rec.get("notes") or {}), "pallas": {"required": True, "cause": "no pallas_call"}}
    j = judge_case(C.id, {"fla": ref, "pallas": rec})
    assert j.verdict == "error" and all(t["verdict"] == "pass" for t in j.entry("pallas")["tensors"].values())
    assert [(f.tensor, f.verdict, f.detail) for f in j.failures] == [
        (None, "error", "not run as a TPU kernel: no pallas_call")
    ]


def test_records_that_cannot_be_compared_are_refused_not_raised(ref, fla_like):
    j = judge_case(C.id, {"fla": ref, "pallas": {**cand(fla_like), "input_hash": "0" * 64}})
    assert j.verdict == "refused" and not j.ok and "input_hash differs" in j.refused and j.entries == ()
    assert "no 'fla' (reference)" in judge_case(C.id, {"pallas": cand(fla_like)}).refused


def test_evaluate_collects_judge_case(ref, fla_like):
    recs = {"fla": ref, "pallas": cand(perturbed(C, fla_like, 1e4)), "other": cand(perturbed(C, fla_like, 0.5))}
    recs["other"] = {**recs["other"], "backend": "other"}
    gate = evaluate({C.id: recs})
    j = judge_case(C.id, recs)
    assert gate["cases"] == list(j.entries) and gate["failures"] == [f.as_dict() for f in j.failures]
    assert gate["ok"] is j.ok is False and gate["counts"] == {"fail-accuracy": 1, "pass": 1}


def test_one_run_says_one_verdict_and_its_rule_on_the_terminal_the_page_and_in_pytest(tmp_path, capsys, ref, fla_like):
    """A planted bug that only the bound sees: one element of o 6x as far off as the reference's worst
    (its rel_rms within tolerance, so the record's own check passes). The run's table and the gate's
    summary, the page's data and the plugin's failure text all give the pair the gate's verdict and
    name the rule that decided it, with the same figures; none calls it a pass."""
    from cases import make_inputs
    from parity.cli.run import print_table
    from parity.execute.backends.oracle import cached_oracle
    from parity.execute.case import summary_line
    from parity.html.build import build_report
    from parity.judge.gate import format_summary, run_gate
    from parity.pytest_plugin.checks import explain

    from .helpers import write_records

    oracle = cached_oracle(C, make_inputs(C))[0]
    planted = {n: np.array(a, np.float64) for n, a in fla_like.items()}
    worst = np.abs(planted["o"] - oracle["o"]).max()
    planted["o"][0, 10, 0, 5] = oracle["o"][0, 10, 0, 5] + 6 * worst
    bad = cand(planted)
    assert bad["verdict"] == "pass"  # the tolerance alone passes it
    write_records(tmp_path, ref, bad)
    gate = run_gate([tmp_path])
    j = judge_case(C.id, {"fla": ref, "pallas": bad})
    o = j.entry("pallas")["tensors"]["o"]
    assert (j.verdict, o["verdict"], o["rule"]) == ("fail-bound", "fail-bound", "max-abs")
    assert o["why"].startswith("max-abs: max_abs ") and " > limit " in o["why"]
    word, why = o["verdict"], o["why"]
    assert word in list(Verdict) and set(STATUSES) - {"ok"} <= set(Verdict)  # one vocabulary

    # the terminal: the run's table (the gate's verdict for the pair, the tensor and rule) and the gate's lines
    timing = {"per_backend_s": {}, "harness_overhead_share": None, "harness_overhead_s": 0.0}
    summary = {"results": [summary_line(r) for r in (ref, bad)], "timing": timing, "cases": 1, "wall_time_s": 0.0}
    print_table({**summary, "jobs": 1}, gate)
    table = capsys.readouterr().out
    row = next(line for line in table.splitlines() if line.startswith(C.id))
    assert f"{word} o=" in row and "(max-abs)" in row and row.count("pass") == 1  # fla's tolerance check only
    assert "fla (tolerance only)" in table
    assert f"o: {word}, decided by {why}" in format_summary(gate) and "gate: FAIL" in format_summary(gate)

    # the page: the case table's cell, the "where each backend ran" counts and the detail's tensor entry
    page = build_report([tmp_path])
    cell = page["rows"][0]["b"]["pallas"]
    assert (cell["v"], cell["d"], cell["w"]) == (word, "o: max-abs", why)
    assert {w["backend"]: w["verdicts"] for w in page["summary"]["where"]}["pallas"] == {word: 1}
    detail = next(b for b in page["details"][0]["backends"] if b["name"] == "pallas")
    assert detail["gate"]["tensors"]["o"]["why"] == why and detail["row_verdict"] == word

    # pytest: the plugin's failure text
    text = "\n".join(explain(C, {"fla": ref, "pallas": bad}, j))
    assert f"[pallas] o: {word}\n  decided by {why}" in text


# ------------------------------------------------------------------ TPU compile records
def compile_rec(case_id: str, backend: str, seconds: dict[str, float], failing: str | None = None) -> dict:
    """A compile record of `backend` for `case_id`: each target compiled in `seconds`; `failing` did not."""
    targets = {
        t: (
            {"ok": False, "seconds": s, "error": "Mosaic failed", "error_line": "Mosaic failed"}
            if t == failing
            else {"ok": True, "seconds": s, "numerics": {"mismatches": []}, "mosaic": {"k": {"vmem_bytes": 1 << 20}}}
        )
        for t, s in seconds.items()
    }
    return {
        "schema": SCHEMA_VERSION,
        "kind": "compile",
        "case_id": case_id,
        "case": C.to_dict(),
        "backend": backend,
        "side": "candidate",
        "created": "2026-11-26T12:00:00+0000",
        "run_id": "test",
        "repro": f"parity compile --case {case_id} --backends {backend}",
        "verdict": "compile-error" if failing else "pass",
        "targets": targets,
    }


def test_compile_records_alone_are_judged_with_their_failures():
    rec = compile_rec(C.id, "pallas", {"v5e": 1.0, "tpu7x": 2.0}, failing="tpu7x")
    j = judge_case(C.id, None, {"pallas": rec})
    assert j.verdict == "compile-error" and j.entry("pallas")["reference"] is None and not j.failures
    assert j.entry("pallas")["compile"] == {"v5e": "ok", "tpu7x": "Mosaic failed"}
    f = j.compile_failures[0]
    assert (f.tensor, f.verdict, f.repro) == (None, "compile-error", rec["repro"]) and "tpu7x" in f.detail


def test_the_page_and_the_terminal_print_the_same_compile_median(tmp_path):
    """Four compiles of 1, 2, 4 and 8 s: the median is 3 s (statistics.median), not the upper middle 4 s."""
    for case_id, seconds in (("a", {"v5e": 1.0, "v6e": 8.0}), ("b", {"v5e": 2.0, "v6e": 4.0})):
        write_json(tmp_path / "pallas" / f"{case_id}.compile.json", compile_rec(case_id, "pallas", seconds))
    terminal = format_compile_summary(compile_summary(load_compiles([tmp_path])))
    html = " ".join(write_report([tmp_path], tmp_path / "index.html").read_text().split())
    on_terminal = re.search(r"median ([\d.]+) s", terminal)[1]
    on_page = re.search(r"compile time per \(case, candidate, target\): median ([\d.]+) s", html)[1]
    assert on_terminal == on_page == "3.00"


def test_the_page_and_the_terminal_print_the_same_diff_median(tmp_path):
    """Finite ratios 1, 2, 4 and 8: the median is 3 (statistics.median) on both."""
    rows = [
        {
            "case_id": f"c{i}",
            "backend": "pallas",
            "tensor": "o",
            "verdict_base": "pass",
            "verdict_new": "pass",
            "eps_base": 1e-3,
            "eps_new": None if r is None else r * 1e-3,
            "ratio": r,
            "flagged": False,
            "why": "",
        }
        for i, r in enumerate((1.0, 2.0, 4.0, 8.0, None, float("inf")))
    ]
    assert ratio_summary(rows) == {"n": 4, "median": 3.0, "min": 1.0, "max": 8.0} and ratio_summary([]) is None
    result = {"base": ["B"], "new": ["N"], "rows": rows, "flagged": [], "only_new": [], "ok": True, "max_ratio": 1.25}
    on_terminal = re.search(r"median (\S+),", format_diff(result))[1]
    on_page = re.search(r"ratio median (\S+),", write_diff_page(result, tmp_path / "diff.html").read_text())[1]
    assert on_terminal == on_page == "3"
