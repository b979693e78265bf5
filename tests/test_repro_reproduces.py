"""Repro that reproduces: for a planted bound failure in a user's own directory, the repro command
the page and the pytest plugin print, run as printed, exits 1 with the same verdict; the script
`parity repro` writes runs from another directory without PYTHONPATH and prints both errors, the
tolerance, the bound and the verdict. One `parity run` (FLA in the Triton interpreter) serves all."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cases import Case
from parity.judge.case import judge_case
from parity.records import load_latest
from parity.repro import bundle_seeds, module_root

# a forward case: FLA's forward alone in the interpreter
CASE = "simple_gla-fwd-B1-T64-H2-K32-V32-fp32-C64-g_logsig-ht"
SPEC = "buggy=jax:my_gla:buggy_gla"
GOOD = "good=jax:my_gla:good_gla"
# the user's kernels: Simple GLA by its recurrence; the planted bug, its readout q_t S_t in bfloat16
MY_GLA = """
import functools

import jax
import jax.numpy as jnp


def good_gla(
    q, k, v, g=None, g_gamma=None, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
    readout=jnp.float32,
):
    B, T, H, K = q.shape
    scale = K**-0.5 if scale is None else scale
    S = jnp.zeros((B, H, K, v.shape[-1]), jnp.float32) if initial_state is None else initial_state
    time_first = lambda x: jnp.moveaxis(x.astype(jnp.float32), 1, 0)

    def step(S, x):
        q_t, k_t, v_t, g_t = x
        S = jnp.exp(g_t)[..., None, None] * S + k_t[..., :, None] * v_t[..., None, :]
        o_t = jnp.einsum("bhk,bhkv->bhv", q_t.astype(readout), S.astype(readout), precision="highest")
        return S, scale * o_t.astype(jnp.float32)

    S, o = jax.lax.scan(step, S, (time_first(q), time_first(k), time_first(v), time_first(g)))
    return jnp.moveaxis(o, 0, 1).astype(v.dtype), (S if output_final_state else None)


buggy_gla = functools.partial(good_gla, readout=jnp.bfloat16)
"""


def _env() -> dict:
    """This environment with the harness's console script on PATH and no PYTHONPATH: the user's
    module is found from the working directory (parity run) or by the script itself (repro.py)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PARITY_RUN_ID")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def _sh(command: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(command, shell=True, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """(the user's directory, the original run's directory) of one `parity run` of the planted bug and
    the correct kernel."""
    user = tmp_path_factory.mktemp("user")
    (user / "my_gla.py").write_text(MY_GLA)
    candidates = f"--candidate {SPEC} --candidate {GOOD}"
    p = _sh(f"parity run --case {CASE} --backends oracle,fla {candidates} --out orig --no-progress", user)
    assert p.returncode == 1 and f"{CASE} [buggy] o: fail-bound" in p.stdout, p.stdout[-3000:] + p.stderr[-3000:]
    return user, user / "orig"


def test_the_repro_line_of_the_page_and_of_pytest_run_as_printed_fails_with_the_same_verdict(planted):
    user, orig = planted
    records = load_latest([orig])[CASE]
    # the page's line: in the case's detail file; the plugin's: its explanation of the failure
    page = {
        json.loads(f'"{m}"')
        for f in orig.rglob("*.js")
        for m in re.findall(r'"repro":\s*"((?:[^"\\]|\\.)*)"', f.read_text())
        if json.loads(f'"{m}"').startswith(f"parity run --case {CASE} --backends oracle,fla --candidate {SPEC}")
    }
    from parity.pytest_plugin.checks import explain

    judged = judge_case(CASE, records)
    plugin = {
        line.split("repro: ", 1)[1]
        for p in explain(Case.from_id(CASE), records, judged)
        for line in p.splitlines()
        if "repro: " in line
    }
    assert page == plugin == {records["buggy"]["repro"]}, (page, plugin)
    (command,) = page
    assert "--backends oracle,fla" in command  # the reference reruns: the bound is judged again
    p = _sh(command, user)
    assert p.returncode == 1, p.stdout[-3000:] + p.stderr[-3000:]
    failed = {f.tensor for f in judged.failures if f.verdict == "fail-bound"}
    for tensor in failed:
        assert f"{CASE} [buggy] {tensor}: fail-bound" in p.stdout, p.stdout[-3000:]
    assert "gate: FAIL" in p.stdout


@pytest.mark.parametrize("spec, rc", [(SPEC, 1), (GOOD, 0)], ids=["buggy", "good"])
def test_the_repro_script_finds_the_module_by_itself_and_prints_the_verdict(planted, tmp_path, spec, rc):
    user, orig = planted
    name = spec.split("=")[0]
    bundle = tmp_path / "bundle"
    p = _sh(f"parity repro {CASE} --candidate {spec} -o {bundle} --reference orig", user)
    assert p.returncode == 0, p.stderr[-3000:]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    p = subprocess.run(
        [sys.executable, str(bundle / "repro.py")], cwd=elsewhere, env=_env(), capture_output=True, text=True
    )
    assert p.returncode == rc, p.stdout[-3000:] + p.stderr[-3000:]
    assert "E0000" not in p.stderr and "Failed to find host bounds" not in p.stderr  # libtpu's start-up noise
    records = load_latest([orig])[CASE]
    judged = judge_case(CASE, records).entry(name)
    assert f"verdict: {judged['verdict']}" in p.stdout and judged["verdict"] == ("pass" if rc == 0 else "fail-bound")
    seeds = len(records[name]["seeds"])
    assert f"over {seeds} seed(s)" in p.stdout, p.stdout
    for tensor, t in judged["tensors"].items():
        line = re.search(rf"^  {tensor}\s+(\S+)\s+eps (\S+)  eps_fla (\S+)  tol (\S+)", p.stdout, re.M)
        assert line, (tensor, p.stdout)
        verdict, eps, eps_ref, tol = line.groups()
        assert verdict == t["verdict"]
        assert float(eps) == pytest.approx(t["rel_rms"], rel=5e-3)  # printed to 3 significant digits
        assert float(eps_ref) == pytest.approx(records["fla"]["tensors"][tensor]["rel_rms"], rel=5e-3)
        assert float(tol) == pytest.approx(t["tol"], rel=5e-3)
    assert ("gate: FAIL" if rc else "gate: PASS") in p.stdout


def test_the_bundle_holds_the_seeds_both_records_hold_the_case_own_first():
    case = Case.from_id(CASE)
    ref = {"seeds": [{"seed": s} for s in (case.seed, 11, 12, 13)]}
    cand = {"seeds": [{"seed": s} for s in (case.seed, 11, 12)], "seed_policy": {"min": 2, "max": 8}}
    assert bundle_seeds(case, ref, cand) == {
        "seeds": [case.seed, 11, 12],
        "seed_policy": cand["seed_policy"],
        "bound_factor": 1.0,
    }
    assert bundle_seeds(case, ref, None)["seeds"] == [case.seed, 11, 12, 13]
    assert bundle_seeds(case, None, None)["seeds"] == [case.seed]


def test_module_root_is_the_directory_a_module_is_imported_from():
    assert module_root("tests.example_candidates") == str(Path(__file__).resolve().parents[1])
    assert module_root("no_such_module_anywhere") is None
