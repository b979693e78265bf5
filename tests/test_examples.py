"""examples/: a user's kernel repository. Copied outside this checkout, its own pytest finds the
installed package's plugin through the entry point and runs its candidates (an autodiff
kernel and an explicit forward/backward pair) with the gate; the fwd/bwd adapter really runs
the user's backward."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from examples.my_kernels.explicit_vjp import fla_op_from_fwd_bwd

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
CASE = "simple_gla-fwdbwd-B1-T96-H2-K64-V64-fp32-C64-g_logsig-h0-ht"  # in examples/parity_cases.json


def test_the_plugin_is_installed_as_a_pytest11_entry_point():
    """Fails (not skips) where the package was installed without the entry point: reinstall
    with `pip install -e .` (scripts/env.sh does when pyproject.toml changes)."""
    plugins = [ep.value for ep in metadata.entry_points(group="pytest11")]
    assert "parity.pytest_plugin" in plugins, f"no pytest11 entry point for parity.pytest_plugin: {plugins}"


def test_the_example_repository_runs_its_parity_tests_outside_the_checkout(tmp_path):
    repo = tmp_path / "my-kernels"
    shutil.copytree(EXAMPLES, repo)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PARITY_RUN_ID")}  # its own session
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-m",
        "interpret",
        "-k",
        CASE,
        "--parity-tpu-targets=none",
    ]
    p = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    assert f"rootdir: {repo}" in out and "1 passed" in out
    assert "gate: 2 case/candidate pairs" in out and "gate: PASS" in out
    for backend in ("oracle", "fla", "chunked", "explicit"):
        assert (repo / "reports" / "pytest" / backend / f"{CASE}.json").exists(), backend
    assert not (repo / "reports" / "pytest" / "pallas").exists()  # --parity-backends=oracle,fla in pytest.ini


def test_the_fwd_bwd_adapter_differentiates_through_the_users_backward():
    B, T, H, K, V = 1, 4, 1, 2, 3
    marks = [
        np.full(s, i + 1.0, np.float32)
        for i, s in enumerate([(B, T, H, K), (B, T, H, K), (B, T, H, V), (B, T, H), (B, H, K, V)])
    ]

    def fwd(q, k, v, g, h0, scale):
        return v * scale, h0 + 1.0, None

    def bwd(scale, residuals, do, dht):  # recognisable gradients: input i gets i + 1
        return tuple(jnp.asarray(m) for m in marks)

    fn = fla_op_from_fwd_bwd(fwd, bwd)
    q, k, v = jnp.ones((B, T, H, K)), jnp.ones((B, T, H, K)), jnp.ones((B, T, H, V))
    g, h0 = jnp.zeros((B, T, H)), jnp.zeros((B, H, K, V))
    (o, ht), vjp = jax.vjp(lambda *x: fn(*x[:3], g=x[3], initial_state=x[4], output_final_state=True), q, k, v, g, h0)
    np.testing.assert_allclose(o, v * K**-0.5)  # scale None is K ** -0.5
    for got, want in zip(vjp((jnp.ones_like(o), jnp.ones_like(ht))), marks):
        np.testing.assert_array_equal(np.asarray(got), want)
    # a decay per head: the per-token gradient the backward returns (4 everywhere) summed over B, T
    dg_gamma = jax.grad(lambda gg: fn(q, k, v, g_gamma=gg)[0].sum())(jnp.zeros(H))
    np.testing.assert_array_equal(np.asarray(dg_gamma), np.full(H, 4.0 * B * T))


GDN = EXAMPLES / "tpu_inference_gdn"


def test_tpu_inference_gdn_kernels_run_as_a_forward_only_candidate_as_a_user_would(tmp_path):
    """examples/tpu_inference_gdn: tpu-inference 0.32.0's fused_gdn (v1), recurrent_scan (v2) and
    fused_conv1d_gdn (v3), installed from the registry without vLLM (scripts/env.sh), through their
    adapter, outside this checkout: they compile for v5e with the numerics model agreeing on their
    kernels (v1's decode and recurrent, v2's fused_kernel, v3's batched and per_seq), run in
    interpret mode, are judged on o and the final state (v1's gradients not judged; v2 and v3, op
    gdn only, unsupported on the kda cases), and their float32 o fails the bound against FLA
    (DEFAULT float32 dots, one bf16 MXU pass: v1 ~2.4e-3, v2 ~1.5e-3, v3 ~2.4e-3 on the gdn case,
    vs FLA's ~8e-4)."""
    repo = tmp_path / "gdn"
    shutil.copytree(GDN, repo)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PARITY_RUN_ID")}
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-m", "interpret", "--parity-tpu-targets=v5e"]
    p = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    out = p.stdout + p.stderr
    assert p.returncode == 1 and "3 failed" in out, out[-4000:]
    assert "gate: 9 case/candidate pairs, bound factor 1.0: 5 fail-bound, 4 unsupported" in out, out[-4000:]
    assert "[v1] dq: not-judged" in out  # neither judged, passed nor unsupported
    assert "-lens1_1_22 [v1] o: fail-bound" in out and "-g_logsig-h0-ht [v1] o: fail-bound" in out
    assert "not judged (forward-only candidates, backward not run): 6 tensors of 1 case/candidate pairs" in out
    # v2 and v3 decline the kda cases (their gate is per head) and nothing else
    assert "unsupported: 4 (case, candidate, tensor) entries" in out, out[-4000:]
    gdn = "gdn-fwd-B1-T16-H1-K128-V128-fp32-C16-g_logsig-HV2-h0-ht-lens1_15"  # decode, prefill, HV = 2 H
    assert f"{gdn} [v2] o: fail-bound" in out and f"{gdn} [v2] ht: fail-bound" in out, out[-4000:]
    assert f"{gdn} [v3] o: fail-bound" in out and f"{gdn} [v3] ht: fail-bound" in out, out[-4000:]
    assert f"{gdn} [v1] o: fail-bound" in out
    assert "5 case/candidate pairs, 5 ok, 0 failed; v5e 5 ok/0 failed" in out  # compiles, model agrees
    reports = repo / "reports" / "pytest"
    unsupported = json.loads((reports / "gate.json").read_text())["unsupported"]  # all 4, not 3 e.g.
    assert sorted((u["case_id"][:3], u["candidate"], u["detail"]) for u in unsupported) == [
        ("kda", "v2", "recurrent_scan takes a per-head gate (op gdn): not kda"),
        ("kda", "v2", "recurrent_scan takes a per-head gate (op gdn): not kda"),
        ("kda", "v3", "fused_conv1d_gdn takes a per-head gate (op gdn): not kda"),
        ("kda", "v3", "fused_conv1d_gdn takes a per-head gate (op gdn): not kda"),
    ], unsupported
    rec = json.loads(
        (reports / "v1" / "kda-fwd-B1-T24-H1-K128-V128-fp32-C64-g_logsig-h0-ht-lens1_1_22.compile.json").read_text()
    )
    kernels = rec["targets"]["v5e"]["numerics"]["kernels"]
    assert {k for k in kernels if k.startswith(("decoding_gdn", "recurrent_gdn"))} and all(
        k["agree"] for k in kernels.values()
    ), kernels
    rec = json.loads((reports / "v2" / f"{gdn}.compile.json").read_text())
    kernels = rec["targets"]["v5e"]["numerics"]["kernels"]
    assert set(kernels) == {"fused_kernel"} and kernels["fused_kernel"]["agree"], kernels
    rec = json.loads((reports / "v2" / f"{gdn}.json").read_text())
    assert set(rec["tensors"]) == {"o", "ht"} and all(1e-4 < t["rel_rms"] < 1e-2 for t in rec["tensors"].values())
    rec = json.loads((reports / "v3" / f"{gdn}.compile.json").read_text())
    kernels = rec["targets"]["v5e"]["numerics"]["kernels"]
    assert set(kernels) == {"fused_conv1d_gdn_batched", "fused_conv1d_gdn_per_seq"}, kernels
    assert all(k["agree"] for k in kernels.values()), kernels
    rec = json.loads((reports / "v3" / f"{gdn}.json").read_text())
    assert set(rec["tensors"]) == {"o", "ht"} and all(1e-4 < t["rel_rms"] < 1e-2 for t in rec["tensors"].values())
