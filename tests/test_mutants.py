"""The mutation suite: every mutant is caught on its witness case, where the unmutated
kernel passes the same gate; the score and the CLI's bad input."""
from __future__ import annotations

import functools

import pytest

from cases import Case
from parity.gate import evaluate, load
from parity.mutants import CATALOGUE, format_score, score
from parity.runner import build_backends, run_case


@functools.cache
def _backends(spec: str):
    return build_backends([spec])[spec]


def _run(case: Case, specs: list[str], out):
    backends = {s: _backends(s) for s in ["oracle"] + specs}
    run_case(case, list(backends), backends, out, "test-mutants")
    return evaluate(load([out]))


@pytest.mark.parametrize("mutant", CATALOGUE, ids=lambda m: m.name)
def test_mutant_is_caught_on_its_witness_and_the_kernel_is_clean(mutant, tmp_path):
    case = Case.from_id(mutant.witness)
    gate = _run(case, ["fla", mutant.impl, f"mutant:{mutant.name}"], tmp_path)
    result = score(gate, [mutant])
    assert result["unmutated_failures"] == [], format_score(result)
    assert result["mutants"][0]["cases_run"] == 1
    assert result["caught"] == 1, format_score(result)
    if mutant.name == "bf16-state":  # accuracy only: the bound against FLA must catch it
        entry = next(e for e in gate["cases"] if e["candidate"] == f"mutant-{mutant.name}")
        assert any(t["bound"] and not t["bound"]["ok"] for t in entry["tensors"].values()), entry


def test_mutants_cli_rejects_unknown_mutant(capsys):
    from parity.cli import main
    assert main(["mutants", "--suite", "smoke", "--only", "no-such-mutant"]) == 2
    assert "no-such-mutant" in capsys.readouterr().err
