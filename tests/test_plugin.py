"""The pytest plugin end to end, in a child pytest: a planted failing candidate fails its
parity test with the explanation and the repro command; hardware markers skip with a reason."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASE = "simple_gla-fwd-B1-T96-H2-K64-V64-fp32-C64-g_stress"   # a smoke case, forward only


def _pytest(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", "tests/test_parity.py",
           "--report-dir", str(tmp_path / "reports"), *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)


def test_planted_failing_candidate_fails_with_explanation_and_repro(tmp_path):
    p = _pytest("-m", "interpret", "--suite", "smoke", "-k", CASE,
                "--candidate", "planted=jax:parity.examples:returns_nan", tmp_path=tmp_path)
    assert p.returncode == 1, p.stdout[-3000:]
    out = p.stdout
    assert "[planted] o: nan-inf" in out
    assert f"repro: parity run --case {CASE}" in out and "--candidate planted=jax:parity.examples:returns_nan" in out
    assert "planted ran on cpu:tpu-interpret" in out and "fla ran on cpu:triton-interpreter" in out
    assert "parity gate" in out and "gate: FAIL" in out           # the session gate ran at the end
    assert (tmp_path / "reports" / "planted" / f"{CASE}.json").exists()


def test_gpu_and_tpu_markers_skip_here_with_the_reason(tmp_path):
    for marker, reason in (("gpu", "no CUDA GPU visible to torch"), ("tpu", "no TPU visible to jax")):
        p = _pytest("-m", marker, "--suite", "smoke", tmp_path=tmp_path)
        assert p.returncode == 0, p.stdout[-2000:]
        assert "8 skipped" in p.stdout and reason in p.stdout
