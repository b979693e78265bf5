"""The mutation suite: every mutant is caught on its witness case, where the unmutated
kernel passes the same gate; the score and the CLI's bad input."""

from __future__ import annotations

import functools

import pytest

from cases import Case
from parity.cli.mutants import format_score, score
from parity.execute.case import build_backends, run_case
from parity.judge.gate import evaluate, load, load_compiles
from parity.measure import tpu_numerics
from parity.mutants import BY_NAME, CATALOGUE
from tests.helpers import requires_libtpu


@functools.cache
def _backends(spec: str):
    return build_backends([spec])[spec]


def _run(case: Case, specs: list[str], out, tpu_targets=("v5e",)):
    backends = {s: _backends(s) for s in ["oracle"] + specs}
    run_case(case, list(backends), backends, out, "test-mutants", tpu_targets=tpu_targets)
    return evaluate(load([out]), compiles=load_compiles([out]))


def _entry(gate, mutant):
    return next(e for e in gate["cases"] if e["candidate"] == f"mutant-{mutant.name}")


@requires_libtpu
@pytest.mark.parametrize("mutant", [m for m in CATALOGUE if not m.narrow], ids=lambda m: m.name)  # narrow: test_fuzz
def test_mutant_is_caught_on_its_witness_and_the_kernel_is_clean(mutant, tmp_path):
    """Each mutant through the interpreter and the TPU compile check (v5e), with the TPU numerics model."""
    case = Case.from_id(mutant.witness)
    gate = _run(case, ["fla", mutant.impl, f"mutant:{mutant.name}"], tmp_path)
    result = score(gate, [mutant])
    assert result["unmutated_failures"] == [], format_score(result)
    assert result["mutants"][0]["cases_run"] == 1
    assert result["caught"] == 1, format_score(result)
    entry = _entry(gate, mutant)
    if mutant.name in ("bf16-state", "f32-dots-default-precision"):  # accuracy only: the bound against FLA
        assert any(t["bound"] and not t["bound"]["ok"] for t in entry["tensors"].values()), entry
    if mutant.tpu_only:  # right numbers on CPU: only the compile check sees it
        assert entry["verdict"] == "compile-error", entry
        assert all(t["verdict"] == "pass" for t in entry["tensors"].values()), entry


@pytest.mark.parametrize("name", [m.name for m in CATALOGUE if m.tpu_only])
def test_tpu_only_mutants_pass_interpret_mode_without_the_compile_check(name, tmp_path):
    mutant = BY_NAME[name]
    gate = _run(Case.from_id(mutant.witness), ["fla", f"mutant:{name}"], tmp_path, tpu_targets=())
    assert score(gate, [mutant])["caught"] == 0


def test_default_precision_mutant_is_caught_by_the_numerics_model_only(tmp_path):
    """Plain interpret mode computes DEFAULT float32 dots in float32: the mutant then looks
    more accurate than FLA. Under tpu-mxu-v1 (one bf16 pass, as a TPU) it fails the bound."""
    mutant = BY_NAME["f32-dots-default-precision"]
    with tpu_numerics.using("float32"):
        gate = _run(Case.from_id(mutant.witness), ["fla", f"mutant:{mutant.name}"], tmp_path / "f32", tpu_targets=())
    assert score(gate, [mutant])["caught"] == 0
    assert _entry(gate, mutant)["verdict"] == "pass"


def test_parallel_chunk_axis_names_its_hazard(tmp_path):
    mutant = BY_NAME["chunk-axis-parallel"]
    gate = _run(Case.from_id(mutant.witness), ["fla", f"mutant:{mutant.name}"], tmp_path, tpu_targets=())
    o = _entry(gate, mutant)["tensors"]["o"]
    assert o["verdict"] == "nan-inf"
    assert "'parallel'" in o["localisation"].get("hazard", ""), o["localisation"]


def test_mutants_cli_rejects_unknown_mutant(capsys):
    from parity.cli import main

    assert main(["mutants", "--suite", "smoke", "--only", "no-such-mutant"]) == 2
    assert "no-such-mutant" in capsys.readouterr().err


def test_kv_swapped_scale_is_invisible_where_k_equals_v(tmp_path):
    """Why ci needs K != V: with K == V the swapped scale is the right one."""
    mutant = BY_NAME["kv-swapped-scale"]
    gate = _run(
        Case.from_id("simple_gla-fwd-B1-T80-H2-K64-V64-fp32-C64-g_logsig"),
        ["fla", f"mutant:{mutant.name}"],
        tmp_path,
        tpu_targets=(),
    )
    assert score(gate, [mutant])["caught"] == 0
