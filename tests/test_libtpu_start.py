"""libtpu loaded for compile-only use: no start-up errors about a TPU slice this host is not in,
and a real compile error still printed."""

from __future__ import annotations

import os
import subprocess
import sys

from parity.model import host
from tests.helpers import requires_libtpu

START_UP_NOISE = ("E0000", "Failed to find host bounds", "could not determine TPU", "Source Location Trace")


def test_the_slice_is_described_only_where_no_one_did(monkeypatch):
    monkeypatch.setattr(host, "tpu_attached", lambda: False)
    env: dict[str, str] = {}
    assert host.compile_only_slice(env) == host.COMPILE_ONLY_SLICE == env
    users = {"TPU_ACCELERATOR_TYPE": "v5litepod-4"}
    assert host.compile_only_slice(users) == {} and users == {"TPU_ACCELERATOR_TYPE": "v5litepod-4"}
    monkeypatch.setattr(host, "tpu_attached", lambda: True)
    assert host.compile_only_slice(on_tpu := {}) == {} and on_tpu == {}


@requires_libtpu
def test_a_compile_prints_no_libtpu_start_up_errors_and_still_prints_a_real_one(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in host.TPU_SLICE_ENV}
    case = "simple_gla-fwd-B1-T64-H2-K64-V64-bf16-C64-g_logsig"
    argv = ["compile", "--case", case, "--backends", "mutant:bf16-dot-fp32-contract"]
    argv += ["--tpu-targets", "v5e", "--out", str(tmp_path)]
    p = subprocess.run([sys.executable, "-m", "parity", *argv], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "v5e (TPU v5 lite): INTERNAL: Mosaic failed to compile TPU kernel: Bad lhs type" in p.stdout
    for line in (p.stdout + p.stderr).splitlines():
        assert not any(n in line for n in START_UP_NOISE), line
