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


def _run_example(name: str, tmp_path) -> tuple[subprocess.CompletedProcess, str, Path]:
    """examples/<name>, copied outside the checkout, through its own pytest (-m interpret, compiled
    for v5e): (process, output, its reports directory)."""
    repo = tmp_path / name
    shutil.copytree(EXAMPLES / name, repo)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PARITY_RUN_ID")}
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-m", "interpret", "--parity-tpu-targets=v5e"]
    p = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    return p, p.stdout + p.stderr, repo / "reports" / "pytest"


NO_KERNEL = "not run as a TPU kernel: no Pallas kernel in the traced program"


def test_ejkernel_gated_delta_rule_runs_its_pallas_kernel_only_for_decode(tmp_path):
    """examples/ejkernel_gdn: ejkernel 0.0.80.3's Pallas TPU gated_delta_rule (from the registry,
    its package __init__s skipped). For T > 1 it routes to its XLA recurrence (no pallas_call: the
    harness fails it as not a TPU kernel, though its values are float32-exact); T = 1 with a state
    runs its Pallas decode kernels, forward and backward, in TPU interpret mode, and passes."""
    p, out, reports = _run_example("ejkernel_gdn", tmp_path)
    assert p.returncode == 1 and "1 failed, 1 passed" in out, out[-4000:]
    assert "gate: 2 case/candidate pairs, bound factor 1.0: 1 error, 1 pass" in out, out[-4000:]
    prefill, decode = (
        "gdn-fwdbwd-B1-T64-H2-K64-V64-fp32-C64-g_logsig-h0-ht",
        "gdn-fwdbwd-B2-T1-H2-K64-V64-fp32-C16-g_logsig-h0-ht",
    )
    assert f"{prefill} [ej] error: {NO_KERNEL}" in out and f"{prefill} [ej] compile-error" in out, out[-4000:]
    rec = json.loads((reports / "ej" / f"{prefill}.json").read_text())
    assert all(t["rel_rms"] < 1e-6 for t in rec["tensors"].values()), rec["tensors"]  # HIGHEST XLA: exact
    rec = json.loads((reports / "ej" / f"{decode}.json").read_text())
    assert rec["verdict"] == "pass" and rec["platform"] == "cpu:tpu-interpret", rec["verdict"]
    assert rec["notes"]["pallas"]["ran"] == "tpu-interpret", rec["notes"]["pallas"]
    assert len(rec["tensors"]) == 8 and all(t["rel_rms"] < 1e-6 for t in rec["tensors"].values())
    rec = json.loads((reports / "ej" / f"{decode}.compile.json").read_text())
    kernels = rec["targets"]["v5e"]["numerics"]["kernels"]
    assert set(kernels) == {"_gdr_single_step_fwd_dma_kernel", "_gdr_single_step_bwd_dma_kernel"}, kernels
    assert all(k["agree"] for k in kernels.values()), kernels


def test_gdn2_pallas_takes_its_pallas_path_only_at_k128(tmp_path):
    """examples/gdn2_pallas: gdn2-pallas 0.1.1 (its own --target directory: atomic-ops ships a
    different `atomic_ops`). Asked jax.devices("tpu") inside the call, it sees the TPU the harness
    answers as and runs its Pallas kernels at K = V = 128 (TPU interpret mode, compiled for v5e,
    within FLA's error); at K = 64 it takes its pure-JAX reference on any platform (no pallas_call:
    not a TPU kernel)."""
    p, out, reports = _run_example("gdn2_pallas", tmp_path)
    assert p.returncode == 1 and "2 failed" in out, out[-4000:]
    assert "gate: 4 case/candidate pairs, bound factor 1.0: 2 error, 1 not-judged, 1 pass" in out, out[-4000:]
    k64, k128 = (
        "gdn2-fwd-B1-T64-H2-K64-V64-fp32-C64-g_logsig-h0-ht",
        "gdn2-fwdbwd-B1-T64-H1-K128-V128-fp32-C64-g_logsig-h0-ht",
    )
    for cand in ("trainable", "forward"):
        assert f"{k64} [{cand}] error: {NO_KERNEL}" in out, out[-4000:]
    rec = json.loads((reports / "trainable" / f"{k128}.json").read_text())
    assert rec["verdict"] == "pass" and rec["notes"]["pallas"]["ran"] == "tpu-interpret", rec["notes"]
    asked = rec["notes"]["tpu_identity"]["host"]["asked"]
    assert asked.get("devices"), asked  # utils.is_tpu_available: jax.devices("tpu")
    names = [k["name"] for k in rec["notes"]["pallas"]["kernels"]]  # lambdas, named by where they are
    assert names == [f"<lambda> at gdn2_fwd.py:{n}" for n in (107, 213, 273)] + [
        f"<lambda> at gdn2_bwd.py:{n}" for n in (85, 195, 370)
    ], names
    fla = json.loads((reports / "fla" / f"{k128}.json").read_text())["tensors"]
    assert len(rec["tensors"]) == 9 and all(t["rel_rms"] < fla[n]["rel_rms"] for n, t in rec["tensors"].items())
    rec = json.loads((reports / "trainable" / f"{k128}.compile.json").read_text())
    assert rec["verdict"] == "pass", rec["targets"]


def test_atomic_ops_blr_kernels_run_as_tpu_kernels_where_their_config_is_made_inside_the_call(tmp_path):
    """examples/atomic_ops: atomic-ops 0.2.0's atomic_gdn2 (its own --target directory). A BLRConfig
    asks jax.default_backend() when it is constructed: made inside the call (blr, blr_exact) it
    gets interpret False, and its four pallas_calls (three forward, one backward) run in TPU
    interpret mode and compile for v5e; under make_cfg's settings (wy_eps 1e-3, bf16x3 dots) o is
    ~1e-4 from the float64 oracle and passes against FLA, with wy_eps 0 and HIGHEST dots ~1e-7.
    Made when the adapter was imported (blr_import: here at collection, by tests/test_atomic_ops_adapter.py,
    before any emulation) it holds interpret True: Pallas's generic interpreter, not a TPU kernel;
    its record says the import was answered by this machine. The kernels are lambdas: the records
    name each by where it is written."""
    p, out, reports = _run_example("atomic_ops", tmp_path)
    assert p.returncode == 1 and "1 failed" in out, out[-4000:]
    assert "gate: 3 case/candidate pairs, bound factor 1.0: 1 error, 2 pass" in out, out[-4000:]
    case = "gdn2-fwdbwd-B1-T64-H1-K64-V64-fp32-C64-g_logsig-h0-ht"
    generic = "its pallas_calls pass interpret=True: Pallas's generic interpreter, on a TPU too, not a Mosaic kernel"
    assert f"{case} [blr_import] error: not run as a TPU kernel: {generic}" in out, out[-4000:]
    imported = json.loads((reports / "blr_import" / f"{case}.json").read_text())["notes"]["tpu_identity"]["host"]
    assert imported["import"] == {"answered_by": "this machine (imported before the harness imported it)"}, imported
    blr, exact = (json.loads((reports / c / f"{case}.json").read_text()) for c in ("blr", "blr_exact"))
    for rec in (blr, exact):
        assert rec["verdict"] == "pass" and rec["notes"]["pallas"]["ran"] == "tpu-interpret", rec["notes"]["pallas"]
        assert rec["notes"]["tpu_identity"]["host"]["asked"].get("default_backend"), rec["notes"]["tpu_identity"]
        assert len(rec["tensors"]) == 9
    assert [k["name"] for k in blr["notes"]["pallas"]["kernels"]] == [
        "<lambda> at scores.py:94",
        "<lambda> at solve.py:56",
        "<lambda> at cd_slim.py:43",
        "<lambda> at mega.py:71",
    ], blr["notes"]["pallas"]
    assert 1e-5 < blr["tensors"]["o"]["rel_rms"] < 1e-3, blr["tensors"]["o"]
    assert all(t["rel_rms"] < 1e-6 for t in exact["tensors"].values()), exact["tensors"]


def test_a_port_written_stage_by_stage_runs_its_stage_tests_outside_the_checkout(tmp_path):
    """examples/stage_port: a plain-jax port of Simple GLA's first two forward stages, judged from its
    own pytest through the plugin (`port=jax:my_stages:*`): the stages it has pass against FLA's
    own stage functions; the stage it has not written and the packed sequences it declines are
    unsupported (xfail), never passed or failed."""
    repo = tmp_path / "stage-port"
    shutil.copytree(EXAMPLES / "stage_port", repo)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PARITY_RUN_ID")}  # its own session
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-m", "interpret", "--parity-tpu-targets=none"]
    p = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    assert f"rootdir: {repo}" in out and "4 passed, 2 xfailed" in out, out[-4000:]
    assert "gate: 6 case/candidate pairs, bound factor 1.0: 4 pass, 2 unsupported" in out
    assert "my_stages has no chunk_bwd_dh" in out and "packed sequences (cu_seqlens) are not ported yet" in out
    for stage in ("fwd_h", "fwd_o"):
        case = f"simple_gla:{stage}-fwd-B2-T100-H2-K64-V64-fp32-C64-g_logsig-h0-ht"
        rec = json.loads((repo / "reports" / "pytest" / "port" / f"{case}.json").read_text())
        assert rec["status"] == "ok" and rec["implementation"] == "port=jax:my_stages:*", rec["status"]
