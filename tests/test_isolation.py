"""Each candidate judged as if it ran alone (parity.execute.isolation): what a candidate's import or
call changes in the worker's process stays with that candidate, and no backend can change another's
inputs. The candidates are tests/state_candidates.py's, run in one worker (-j 1)."""

from __future__ import annotations

import json
import os

import jax
import pytest

from parity.cli import main
from parity.execute import isolation

ALIBI = "simple_gla-fwd-B1-T128-H2-K64-V64-fp32-C64-gamma_alibi"
LOGSIG = "simple_gla-fwd-B1-T64-H2-K64-V64-fp32-C64-g_logsig"
DEFAULT = "default=jax:tests.state_candidates:simple_gla"  # alone: fail-bound, 1.63x FLA's compute error
HIGHEST = "high=jax:tests.state_highest:simple_gla"  # sets jax_default_matmul_precision=highest at import
X64 = "x64=jax:tests.state_x64:simple_gla"  # sets jax_enable_x64 at import


def _run(out, cases, candidates) -> dict:
    """parity run of `cases` through oracle and FLA and `candidates` in one worker; the gate's
    entries by (case, candidate)."""
    argv = ["run", *[a for c in cases for a in ("--case", c)], "--backends", "oracle,fla", "-j", "1"]
    argv += [a for c in candidates for a in ("--candidate", c)]
    main([*argv, "--tpu-targets", "none", "--out", str(out), "--no-html", "--no-progress"])
    gate = json.loads((out / "gate.json").read_text())
    return {(e["case_id"], e["candidate"]): e for e in gate["cases"]}


def _record(out, backend: str, case: str) -> dict:
    return json.loads((out / backend / f"{case}.json").read_text())


@pytest.mark.parametrize("order", [(X64, HIGHEST, DEFAULT), (DEFAULT, HIGHEST, X64)], ids=["after", "before"])
def test_a_librarys_precision_set_at_import_stays_with_that_library(tmp_path, order):
    """The DEFAULT-precision candidate fails the bound whether it runs after or before a module that
    sets the default matmul precision to highest (or x64) at import; that module's own candidate
    passes, and its record names the setting and what its numbers followed."""
    entries = _run(tmp_path, [ALIBI], order)
    default = entries[(ALIBI, "default")]
    assert default["verdict"] == "fail-bound", default
    ratio = default["tensors"]["o"]["bound"]["compute"]["ratio"]
    assert 1.5 < ratio < 1.8, ratio  # 1.63x alone
    assert entries[(ALIBI, "high")]["verdict"] == "pass"
    state = _record(tmp_path, "high", ALIBI)["notes"]["global_state"]
    assert "jax_default_matmul_precision=highest" in state["at_import"]
    used = (
        "jax_default_matmul_precision=highest, set at import: its float32 dots at default precision computed as HIGHEST"
    )
    assert any(n.startswith(used) for n in state["numerics"]), state
    assert "jax_enable_x64=True" in _record(tmp_path, "x64", ALIBI)["notes"]["global_state"]["at_import"]
    default_state = _record(tmp_path, "default", ALIBI)["notes"].get("global_state", {})
    assert not {"at_import", "by_call", "numerics"} & set(default_state), default_state


def test_a_torch_default_dtype_and_an_in_place_write_stay_with_their_candidates(tmp_path):
    """writes_inputs zeroes q, k, v in place, sets_float64 leaves torch's default dtype float64:
    the next candidate computes on the case's inputs (default: fail-bound at 1.63x, as alone), and
    FLA's next case runs under torch's own default dtype (pass, as alone)."""
    writes = "writes=torch:tests.state_candidates:writes_inputs"
    f64 = "f64=torch:tests.state_candidates:sets_float64"
    entries = _run(tmp_path, [ALIBI, LOGSIG], [writes, f64, DEFAULT])
    assert entries[(ALIBI, "writes")]["verdict"] == "pass" and entries[(ALIBI, "f64")]["verdict"] == "pass"
    assert 1.5 < entries[(ALIBI, "default")]["tensors"]["o"]["bound"]["compute"]["ratio"] < 1.8
    assert "torch.default_dtype=torch.float64" in _record(tmp_path, "f64", ALIBI)["notes"]["global_state"]["by_call"]
    fla = _record(tmp_path, "fla", LOGSIG)
    assert fla["status"] == "ok" and fla["verdict"] == "pass", fla.get("error")
    hashes = {_record(tmp_path, b, ALIBI)["input_hash"] for b in ("oracle", "fla", "writes", "f64", "default")}
    assert len(hashes) == 1


def test_changes_are_seen_and_put_back(monkeypatch):
    """capture / changes / put over jax's config, the environment and a patched attribute."""
    before = isolation.capture()
    monkeypatch.setenv("PARITY_ISOLATION_PROBE", "1")
    jax.config.update("jax_default_matmul_precision", "highest")
    real = jax.numpy.einsum
    jax.numpy.einsum = lambda *a, **k: real(*a, **k)
    try:
        made = isolation.changes(before, isolation.capture())
        assert {c.describe() for c in made} == {
            "jax_default_matmul_precision=highest",
            "environ PARITY_ISOLATION_PROBE=1",
            "jax.numpy.einsum patched",
        }
        assert isolation.put(list(reversed(made)), "before") == []
        assert jax.config.values["jax_default_matmul_precision"] is None and jax.numpy.einsum is real
        assert "PARITY_ISOLATION_PROBE" not in os.environ and isolation.changes(before, isolation.capture()) == []
    finally:
        jax.config.update("jax_default_matmul_precision", None)
        jax.numpy.einsum = real
