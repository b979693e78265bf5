"""Forward-only candidates (`forward_only = True`): judged on the forward of every case, their
backward tensors "not-judged" (never unsupported, never passed), their TPU compile the forward
program (parity.execute.backends.calling.forward_case)."""

from __future__ import annotations

import functools
import json

import pytest

from cases import Case
from parity.execute.backends.calling import NOT_JUDGED, forward_case
from parity.judge.gate import evaluate, load
from tests import example_candidates
from tests.helpers import run

CASE = Case("simple_gla", 1, 64, 1, 32, 32, gate="g_logsig", h0=True, ht=True)  # fwdbwd
BACKWARD = ["dq", "dk", "dv", "dg", "dh0"]


@functools.cache
def _run(tmp):
    specs = [
        "fla",
        "fwd=jax:tests.example_candidates:forward_only_scan",
        "cut=jax:tests.example_candidates:cut_gradients",
    ]
    run([CASE], specs, tmp, numerics="float32")  # recurrent_scan is float32: judged as such
    return evaluate(load([tmp]))


def test_forward_case_is_the_forward_of_a_backward_case_for_forward_only_candidates():
    run_as, not_judged = forward_case(example_candidates.forward_only_scan, CASE)
    assert run_as.id == CASE.id.replace("-fwdbwd-", "-fwd-") and sorted(not_judged) == sorted(BACKWARD)
    assert set(not_judged.values()) == {NOT_JUDGED}
    assert forward_case(example_candidates.cut_gradients, CASE) == (CASE, {})
    fwd = Case("simple_gla", 1, 64, 1, 32, 32, gate="g_logsig", direction="fwd")
    assert forward_case(example_candidates.forward_only_scan, fwd) == (fwd, {})


def test_a_forward_only_candidate_is_judged_on_its_forward_and_says_the_backward_was_not(tmp_path):
    gate = _run(tmp_path)
    rec = json.loads((tmp_path / "fwd" / f"{CASE.id}.json").read_text())
    assert rec["status"] == "ok" and rec["verdict"] == "pass"
    assert {n: t["verdict"] for n, t in rec["tensors"].items()} == {
        "o": "pass",
        "ht": "pass",
        **{n: "not-judged" for n in BACKWARD},
    }
    assert rec["tensors"]["dq"]["reason"] == NOT_JUDGED and "rel_rms" not in rec["tensors"]["dq"]
    entry = {(e["candidate"]): e for e in gate["cases"]}
    assert entry["fwd"]["verdict"] == "not-judged"  # never a pass for the tensors it did not produce
    assert {x["tensor"] for x in gate["not_judged"] if x["candidate"] == "fwd"} == set(BACKWARD)
    assert not [u for u in gate["unsupported"] if u["candidate"] == "fwd"]
    assert not [f for f in gate["failures"] if f["candidate"] == "fwd"]
    # the same function undeclared is run on the backward too, and its zero gradients fail
    assert entry["cut"]["verdict"] not in ("pass", "not-judged", "unsupported")
    assert {f["tensor"] for f in gate["failures"] if f["candidate"] == "cut"} >= {"dq", "dk", "dv"}


def test_forward_only_must_be_a_bool():
    def fn(q, k, v, **kw):
        return None

    fn.forward_only = "yes"
    with pytest.raises(TypeError, match=r"forward_only = 'yes': expected True or False"):
        forward_case(fn, CASE)
