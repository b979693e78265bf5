"""The reference's environment (parity.model.fla_known, parity.judge.environment): FLA's refusal on
Hopper (fla#640) read from FLA's own installed source, the kernel configurations known to compute
wrong there (fla#984), and the gate over records the harness's own record code writes: a
candidate the reference's environment left unbounded fails as unbounded-reference, naming cause
and fix, in `parity gate`, its summary, gate.json, the page's gate card and the pytest plugin,
unless --allow-unbounded-reference; an ordinary reference error still only says "bound not
enforced"."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest

from cases import Case
from parity.html import write_report
from parity.html.rows import gate_per_case
from parity.judge.case import judge_case
from parity.judge.gate import evaluate, format_summary, run_gate
from parity.model import fla_known
from parity.model.fla_known import known_wrong, possibly_wrong, refusal_of
from parity.mutation import catches
from parity.records import RecordError, check_result

from .helpers import SMALL_BF16, deep, perturbed, record_from_tensors, reference_like, write_records

FLA = Path(importlib.util.find_spec("fla").submodule_search_locations[0])  # located, not imported
H200 = "cuda:NVIDIA H200"
GDN = Case("gdn", 1, 64, 1, 64, 64, dtype="bfloat16")  # outputs o, dq, dk, dv, dg, dbeta; FLA's BT 64
WRONG_IN_GDN = {"dk", "dbeta", "dg"}  # what fla#984's kernel makes wrong in gdn's op


def fla_raise_message(path: Path, function: str) -> str:
    """The message of the one `raise RuntimeError("...")` in `function` of an installed FLA file."""
    tree = ast.parse(path.read_text())
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == function)
    messages = [
        n.exc.args[0].value
        for n in ast.walk(fn)
        if isinstance(n, ast.Raise)
        and isinstance(n.exc, ast.Call)
        and getattr(n.exc.func, "id", None) == "RuntimeError"
        and isinstance(n.exc.args[0], ast.Constant)
    ]
    assert len(messages) == 1, messages
    return messages[0]


FLA_640 = fla_raise_message(FLA / "ops" / "common" / "chunk_o.py", "chunk_bwd_dqkwg")
TRACEBACK = (
    'Traceback (most recent call last):\n  File "fla/ops/common/chunk_o.py", line 728, in chunk_bwd_dqkwg\n'
    f"    raise RuntimeError(\nRuntimeError: {FLA_640}\n"
)


def launch(num_warps=4, BT=64, module="fla.ops.gated_delta_rule.wy_fast", kernel="prepare_wy_repr_bwd_kernel", **kw):
    """A launch as the FLA record carries it (notes.fla_launches)."""
    meta = {"BT": BT, "BK": 64, "BV": 64, "USE_G": True, "IS_VARLEN": False}
    return {
        "kernel": kernel,
        "module": module,
        "meta": meta,
        "num_warps": num_warps,
        "num_stages": 3,
        "chosen_by": "autotune",
        "key": [1, 1, 64, 64, BT],
        **kw,
    }


# ------------------------------------------------------------------------------ fla_known


def test_refusal_of_reads_flas_own_message_with_cause_and_fix():
    r = refusal_of(TRACEBACK)
    assert r is not None and set(r) == {"issue", "cause", "fix", "environment"}
    assert r["issue"] == "fla#640" and r["environment"] is True
    assert "Hopper" in r["cause"] and "chunk_bwd_dqkwg" in r["cause"] and "< 3.7.1" in r["cause"]
    # the fix names the Triton that computes it right, the torch release that pins one, and tilelang
    assert r["fix"].startswith("Triton >= 3.7.1: torch >= 2.12.1 (its CUDA wheels pin Triton 3.7.1; torch 2.12.0")
    assert "pip install 'triton>=3.7.1'" in r["fix"] and "pip install tilelang" in r["fix"]
    assert "\n" not in r["cause"] + r["fix"]


@pytest.mark.parametrize(
    "text",
    [
        None,
        "",
        "RuntimeError: CUDA error: an illegal memory access was encountered",
        "RuntimeError: FLA refused",
        FLA_640.replace("#640", "#641"),
    ],
)
def test_refusal_of_an_unrelated_error_is_none(text):
    assert refusal_of(text) is None


def test_the_table_names_kernels_and_guards_installed_fla_has():
    """What the table says of FLA's sources holds for the installed FLA (a new FLA that renames a
    kernel or changes a guard fails here, not silently in the gate)."""
    for bug in fla_known.BUGS:
        for k in bug.kernels:
            source = (FLA / Path(*k.module.split(".")[1:])).with_suffix(".py").read_text()
            assert f"def {k.kernel}(" in source, (k.module, k.kernel)
    delta = (FLA / "ops" / "delta_rule" / "wy_fast.py").read_text()
    assert "NUM_WARPS = [2] if IS_NVIDIA_HOPPER else" in delta  # guarded: "guarded" in the table
    gdn = (FLA / "ops" / "gated_delta_rule" / "wy_fast.py").read_text()
    assert "PREPARE_WY_REPR_BWD_NUM_WARPS = [2] if IS_NVIDIA_BLACKWELL else [2, 4]" in gdn  # 4 on Hopper


@pytest.mark.parametrize(
    "platform, triton, launches, flagged",
    [
        (H200, "3.6.0", [launch(4)], True),
        ("cuda:NVIDIA H100 80GB HBM3", "3.7.1", [launch(4)], True),  # still wrong at 3.7.1 (FLA's bisection)
        ("cuda:NVIDIA GH200 480GB", "3.6.0", [launch(4)], True),
        (H200, "3.6.0", [launch(4, module="fla.ops.delta_rule.wy_fast", chosen_by="pinned")], True),
        (H200, "3.6.0", [launch(2)], False),
        (H200, "3.3.0", [launch(4)], False),
        (H200, "3.6.0", [launch(4, BT=32)], False),
        ("cpu:triton-interpreter", "3.6.0", [launch(4)], False),
        (H200, "3.6.0", [launch(4, chosen_by="rule")], True),  # the rule on a GPU: wrong as any choice
        ("cuda:NVIDIA A100-SXM4-80GB", "3.6.0", [launch(4)], False),
        (H200, "3.6.0", [launch(4, module="fla.ops.kda.wy_fast", kernel="prepare_wy_repr_bwd_kda_kernel")], False),
    ],
)
def test_known_wrong_flags_num_warps_4_at_bt_64_on_hopper_with_triton_from_3_4(platform, triton, launches, flagged):
    found = known_wrong(platform, {"triton": triton, "torch": "2.11.0"}, launches)
    assert bool(found) == flagged, found
    if flagged:
        (e,) = found
        assert e["issue"] == "fla#984" and e["kernel"] == "prepare_wy_repr_bwd_kernel"
        assert {"dk", "dbeta"} <= set(e["tensors"]) and "dv" not in e["tensors"]
        assert "num_warps=4" in e["why"] and "BT=64" in e["why"] and "\n" not in e["why"]
        assert "num_warps=2" in e["fix"] and "--fla-configs" in e["fix"]


def test_known_wrong_names_gdns_gradients_and_fails_closed_on_what_was_not_recorded():
    (e,) = known_wrong(H200, {"triton": "3.6.0"}, [launch(4)])
    assert WRONG_IN_GDN <= set(e["tensors"]) <= WRONG_IN_GDN | {"dk2", "db", "dg2"}
    assert WRONG_IN_GDN <= set(GDN.output_names())  # the registry's names
    # a launch whose num_warps or BT the record does not hold, or a record without Triton's version
    no_warps = {**launch(4), "num_warps": None}
    no_bt = {**launch(4), "meta": {}}
    for launches, versions in (([no_warps], {"triton": "3.6.0"}), ([no_bt], {"triton": "3.6.0"}), ([launch(4)], {})):
        (e,) = known_wrong(H200, versions, launches)
        assert "not ruled out" in e["why"]
    # without launches at all: gdn's backward at chunk 64 autotunes over [2, 4] there
    assert [e["issue"] for e in possibly_wrong(H200, {"triton": "3.6.0"}, "gdn", None, 64)] == ["fla#984"]
    assert possibly_wrong(H200, {"triton": "3.6.0"}, "gdn", None, 32) == []
    assert possibly_wrong(H200, {"triton": "3.6.0"}, "simple_gla", None, 64) == []
    assert possibly_wrong("cpu:triton-interpreter", {"triton": "3.6.0"}, "gdn", None, 64) == []


# ------------------------------------------------------------------------------ the gate


@pytest.fixture(scope="module")
def fla_like():
    return reference_like(SMALL_BF16)


def refused_reference(fla_like, noted: bool = True) -> dict:
    """FLA's error record on an H200 with Triton 3.6 (fla#640), written by the harness's record code."""
    c = SMALL_BF16
    rec = record_from_tensors(c, "fla", "reference", fla_like, platform=H200)
    notes = {**rec["notes"], "refusal": refusal_of(TRACEBACK)} if noted else rec["notes"]
    rec.update(status="error", verdict="error", tensors={}, error=TRACEBACK, notes=notes)
    rec["versions"] = {"fla-core": "0.6.0", "triton": "3.6.0", "torch": "2.11.0"}
    check_result(rec)
    return rec


def test_a_refused_reference_fails_the_gate_naming_cause_and_fix_unless_allowed(tmp_path, fla_like):
    from parity.cli import main

    c = SMALL_BF16
    good = record_from_tensors(c, "pallas", "candidate", perturbed(c, fla_like, 0.5))
    write_records(tmp_path, refused_reference(fla_like), good)
    result = run_gate([tmp_path])
    assert not result["ok"]
    (f,) = result["failures"]
    assert (f["verdict"], f["tensor"], f["candidate"]) == ("unbounded-reference", None, "pallas")
    assert "fla#640" in f["detail"] and "fix: Triton >= 3.7.1" in f["detail"]
    assert all(name in f["detail"] for name in good["tensors"])
    entry = result["cases"][0]
    assert entry["verdict"] == "unbounded-reference"
    assert {t["verdict"] for t in entry["tensors"].values()} == {"unbounded-reference"}
    (u,) = result["unbounded_by_environment"]
    assert (u["issue"], u["by"], u["allowed"]) == ("fla#640", "refusal", False)
    assert u["tensors"] == u["failing"] == list(good["tensors"])
    assert result["unbounded"] == []  # not among the other causes
    text = format_summary(result)
    line = next(x for x in text.splitlines() if "the reference's environment" in x)
    assert line.startswith("  bound not enforced, the reference's environment: 1 case/candidate pairs, ")
    assert "fla#640 FLA refuses gated chunk_bwd_dqkwg" in line and ": fix: Triton >= 3.7.1" in line
    assert "FAIL" in text and "unbounded-reference" in text and text.endswith("gate: FAIL (1 failures)")
    assert "refused by its environment, fla#640" in text  # the reference finding says it too
    assert main(["gate", str(tmp_path)]) == 1

    allowed = run_gate([tmp_path], allow_unbounded_reference=True)
    assert allowed["ok"] and allowed["failures"] == [] and allowed["allow_unbounded_reference"] is True
    assert [x["verdict"] for x in allowed["unbounded_reference"]] == ["unbounded-reference"]
    assert allowed["unbounded_by_environment"][0]["allowed"] is True
    text = format_summary(allowed)
    assert "passed as allowed (--allow-unbounded-reference)" in text and text.endswith("gate: PASS")
    assert f"UNBOUNDED-REFERENCE (allowed) {c.id} [pallas]" in text
    assert main(["gate", str(tmp_path), "--allow-unbounded-reference"]) == 0


def test_a_refusal_the_record_does_not_note_is_read_from_its_error(fla_like):
    c = SMALL_BF16
    good = record_from_tensors(c, "pallas", "candidate", perturbed(c, fla_like, 0.5))
    result = evaluate({c.id: {"fla": refused_reference(fla_like, noted=False), "pallas": good}})
    assert not result["ok"] and result["failures"][0]["verdict"] == "unbounded-reference"


def test_an_ordinary_reference_error_still_passes_on_tolerance_with_bound_not_enforced(fla_like):
    c = SMALL_BF16
    ref = {**refused_reference(fla_like, noted=False), "error": "RuntimeError: CUDA error: out of memory"}
    good = record_from_tensors(c, "pallas", "candidate", perturbed(c, fla_like, 0.5))
    result = evaluate({c.id: {"fla": ref, "pallas": good}})
    assert result["ok"] and result["unbounded_by_environment"] == [] and result["unbounded"]
    text = format_summary(result)
    assert "bound not enforced (" in text and "the reference's environment" not in text


def test_a_candidate_outside_its_tolerance_still_fails_on_it_under_a_refused_reference(fla_like):
    c = SMALL_BF16
    bad = record_from_tensors(c, "pallas", "candidate", perturbed(c, fla_like, 1e4))
    result = evaluate({c.id: {"fla": refused_reference(fla_like), "pallas": bad}}, allow_unbounded_reference=True)
    assert not result["ok"] and {f["verdict"] for f in result["failures"]} == {"fail-accuracy"}


@pytest.fixture(scope="module")
def gdn_like():
    return reference_like(GDN)


def gdn_reference(gdn_like, launches: list[dict] | None) -> dict:
    """FLA's ok record of GDN on an H200 with Triton 3.6, with its launches (None: not recorded)."""
    rec = record_from_tensors(GDN, "fla", "reference", gdn_like, platform=H200)
    rec["versions"] = {"fla-core": "0.6.0", "triton": "3.6.0", "torch": "2.11.0"}
    if launches is not None:
        rec["notes"] = {
            **rec["notes"],
            "fla_launches": launches,
            "known_wrong": known_wrong(H200, rec["versions"], launches),
        }
    check_result(rec)
    return rec


def test_a_known_wrong_reference_fails_the_named_tensors_only(tmp_path, gdn_like):
    good = record_from_tensors(GDN, "pallas", "candidate", perturbed(GDN, gdn_like, 0.5))
    write_records(tmp_path, gdn_reference(gdn_like, [launch(4)]), good)
    result = run_gate([tmp_path])
    assert not result["ok"]
    tensors = result["cases"][0]["tensors"]
    assert {n for n, t in tensors.items() if t["verdict"] == "unbounded-reference"} == WRONG_IN_GDN
    assert all(
        t["bound"] is None and t["unbounded_by"]["issue"] == "fla#984" for n, t in tensors.items() if n in WRONG_IN_GDN
    )
    assert all(t["bound"] and t["verdict"] == "pass" for n, t in tensors.items() if n not in WRONG_IN_GDN)
    (f,) = result["failures"]
    assert f["verdict"] == "unbounded-reference" and "fla#984" in f["detail"] and "num_warps=2" in f["detail"]
    (u,) = result["unbounded_by_environment"]
    assert set(u["tensors"]) == WRONG_IN_GDN and u["by"] == "known-wrong"
    assert "the reference's environment: 1 case/candidate pairs, 3 tensors" in format_summary(result)
    assert run_gate([tmp_path], allow_unbounded_reference=True)["ok"]


def test_a_reference_that_launched_the_right_config_bounds_everything_and_one_that_did_not_say_does_not(gdn_like):
    good = record_from_tensors(GDN, "pallas", "candidate", perturbed(GDN, gdn_like, 0.5))
    right = evaluate({GDN.id: {"fla": gdn_reference(gdn_like, [launch(2)]), "pallas": good}})
    assert right["ok"] and all(t["bound"] for t in right["cases"][0]["tensors"].values())
    unsaid = evaluate({GDN.id: {"fla": gdn_reference(gdn_like, None), "pallas": good}})
    assert not unsaid["ok"] and set(unsaid["unbounded_by_environment"][0]["tensors"]) == WRONG_IN_GDN
    assert "notes.fla_launches" in unsaid["unbounded_by_environment"][0]["cause"]


def test_a_reference_from_the_interpreter_fallback_bounds_and_is_counted(fla_like):
    c = SMALL_BF16
    ref = record_from_tensors(c, "fla", "reference", fla_like, platform="cpu:triton-interpreter")
    ref["notes"] = {**ref["notes"], "fallback": {"from": H200, "refusal": refusal_of(TRACEBACK)}}
    check_result(ref)
    good = record_from_tensors(c, "pallas", "candidate", perturbed(c, fla_like, 0.5))
    result = evaluate({c.id: {"fla": ref, "pallas": good}})
    assert result["ok"] and all(t["bound"] for t in result["cases"][0]["tensors"].values())
    assert result["reference_fallbacks"] == [{"case_id": c.id, "from": H200, "issue": "fla#640"}]
    assert "references from the interpreter fallback" in format_summary(result)
    twice = record_from_tensors(c, "pallas", "candidate", perturbed(c, fla_like, 2.0))
    assert not evaluate({c.id: {"fla": ref, "pallas": twice}})["ok"]  # the bound holds it


@pytest.mark.parametrize(
    "notes, field",
    [
        ({"refusal": {"issue": "fla#640"}}, "notes.refusal"),
        ({"known_wrong": [{"issue": "fla#984", "kernel": "k", "why": "w", "fix": "f"}]}, "notes.known_wrong[0]"),
        ({"fla_launches": [{"kernel": "prepare_wy_repr_bwd_kernel", "num_warps": 4}]}, "notes.fla_launches[0]"),
        ({"fla_launches": [{"kernel": "k", "module": "m", "num_warps": "4"}]}, "notes.fla_launches[0].num_warps"),
        ({"fallback": {"refusal": {}}}, "notes.fallback"),
    ],
)
def test_a_malformed_environment_note_is_refused_not_read_as_nothing(fla_like, notes, field):
    rec = record_from_tensors(SMALL_BF16, "fla", "reference", fla_like)
    with pytest.raises(RecordError, match=re.escape(f"field {field}=")):
        check_result({**rec, "notes": {**rec["notes"], **notes}})


# ------------------------------------------------------------------------------ the page and the plugin


def test_the_page_gate_card_and_the_plugin_follow_the_same_rule(tmp_path, fla_like):
    from parity.pytest_plugin import explain, reference_findings, session_gate

    c = SMALL_BF16
    ref = refused_reference(fla_like)
    good = record_from_tensors(c, "pallas", "candidate", perturbed(c, fla_like, 0.5))
    by_case = {c.id: {"fla": ref, "pallas": good}}
    _, card = gate_per_case(deep(by_case), 1.0)
    assert card["status"] == "fail" and card["failing"][0]["verdict"] == "unbounded-reference"
    assert card["environment"][0].startswith("bound not enforced, the reference's environment: 1 case/candidate")
    assert "fix: Triton >= 3.7.1" in card["environment"][0]
    _, allowed = gate_per_case(deep(by_case), 1.0, allow_unbounded_reference=True)
    assert allowed["status"] == "pass" and allowed["allowed"] == ["--allow-unbounded-reference"]

    write_records(tmp_path, ref, good)
    page = write_report([tmp_path], tmp_path / "index.html").read_text()
    card = page[
        page.index('id="gate-outcome"') : page.index('id="compile-outcome"') if 'id="compile-outcome"' in page else None
    ]
    assert "FAIL" in card and "bound not enforced, the reference&#39;s environment" in card and "fla#640" in card
    run_gate([tmp_path], allow_unbounded_reference=True)  # its gate.json says allowed: the page follows it
    page = write_report([tmp_path], tmp_path / "index.html").read_text()
    card = page[page.index('id="gate-outcome"') :]
    assert '<p class="big">PASS</p>' in card and "Allowed as gate.json says: --allow-unbounded-reference" in card
    (tmp_path / "gate.json").unlink()
    text, ok = session_gate(tmp_path, "test", 1.0)
    assert ok is False and "unbounded-reference" in text
    assert session_gate(tmp_path, "test", 1.0, allow_unbounded_reference=True)[1] is True
    # the parity test's own explanation: the refusal and each unbounded tensor are problems naming cause and
    # fix, unless allowed (then a finding)
    recs = by_case[c.id]
    problems = explain(c, recs, judge_case(c.id, recs))
    assert any("refused by its environment, fla#640" in p and "fix: Triton >= 3.7.1" in p for p in problems)
    assert any(p.startswith("[pallas] dq: unbounded-reference") and "fla#640" in p for p in problems)
    allowed_judged = judge_case(c.id, recs, allow_unbounded_reference=True)
    assert explain(c, recs, allowed_judged, allow_unbounded_reference=True) == []
    (finding,) = reference_findings(c, recs, allow_unbounded_reference=True)
    assert "fla#640" in finding and H200 in finding


def test_a_mutant_is_not_caught_by_the_references_environment():
    assert not catches({"verdict": "unbounded-reference"}) and catches({"verdict": "fail-bound"})
