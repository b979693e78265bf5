"""`parity watch` on a user's module in its own directory, three rounds on the same warm workers:
the correct kernel passes; a save of the module it imports with a syntax error is that round's
error and the watch goes on; a save that makes that module scale the output by 1.5 fails with the
deciding rule and the repro line (the candidate's module and the one it imports re-imported);
the page is rewritten each judged round. One watch (FLA in the Triton interpreter) serves all."""

from __future__ import annotations

import os
import queue
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

from parity.cli.watch import watched_files

CASE = "simple_gla-fwd-B1-T64-H2-K32-V32-fp32-C64-g_logsig-ht"  # a forward case: FLA's forward alone
ROOT = Path(__file__).resolve().parents[1]
MY_GLA = """
import jax
import jax.numpy as jnp

from my_helpers import OUTPUT_SCALE


def simple_gla(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None, output_final_state=False):
    B, T, H, K = q.shape
    scale = K**-0.5 if scale is None else scale
    S = jnp.zeros((B, H, K, v.shape[-1]), jnp.float32) if initial_state is None else initial_state
    time_first = lambda x: jnp.moveaxis(x.astype(jnp.float32), 1, 0)

    def step(S, x):
        q_t, k_t, v_t, g_t = x
        S = jnp.exp(g_t)[..., None, None] * S + k_t[..., :, None] * v_t[..., None, :]
        return S, scale * jnp.einsum("bhk,bhkv->bhv", q_t, S, precision="highest")

    S, o = jax.lax.scan(step, S, (time_first(q), time_first(k), time_first(v), time_first(g)))
    return (OUTPUT_SCALE * jnp.moveaxis(o, 0, 1)).astype(v.dtype), (S if output_final_state else None)
"""


class Watch:
    """A `parity watch` process and its output (stdout and stderr together), read line by line."""

    def __init__(self, args: list[str], cwd: Path):
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PARITY_CACHE": str(cwd / "cache")}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "parity", "watch", *args],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.text = ""
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def until(self, pattern: str, timeout_s: float = 120) -> str:
        """The output from now until a line matching `pattern` (regex), inclusive."""
        got, end = "", time.monotonic() + timeout_s
        while time.monotonic() < end:
            try:
                line = self.lines.get(timeout=max(0.1, end - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break
            got += line
            self.text += line
            if re.search(pattern, line):
                return got
        raise AssertionError(f"no line matching {pattern!r}; output:\n{self.text[-4000:]}")


def test_watched_files_follow_the_user_imports_under_the_directory_not_the_harness(tmp_path):
    (tmp_path / "my_gla.py").write_text("import jax\nimport kernels_jax\nfrom my_helpers import X\nfrom . import y\n")
    (tmp_path / "my_helpers.py").write_text("from pkg.sub import Z\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "sub.py").write_text("Z = 1\n")
    found = watched_files(["my_gla"], tmp_path)
    assert set(found) == {"my_gla", "my_helpers", "pkg", "pkg.sub"}, found
    assert found["pkg.sub"] == (tmp_path / "pkg" / "sub.py").resolve()


def test_watch_reruns_on_each_save_reports_a_syntax_error_and_a_failure_with_its_rule_and_repro(tmp_path):
    (tmp_path / "my_gla.py").write_text(MY_GLA)
    helpers = tmp_path / "my_helpers.py"  # imported by the candidate: watched, and re-imported
    helpers.write_text("OUTPUT_SCALE = 1.0\n")
    w = Watch(
        [
            "--case",
            CASE,
            "--backends",
            "oracle,fla",
            "--candidate",
            "mine=jax:my_gla:simple_gla",
            "--tpu-targets",
            "none",
            "--out",
            "out",
            "--rounds",
            "3",
        ],
        tmp_path,
    )
    try:
        first = w.until(r"^watch: round 1: (PASS|FAIL|ERROR) ")
        assert re.search(r"^watch: round 1: PASS [\d.]+ s from start to verdict", first, re.M), first
        assert "gate: PASS" in first
        page = tmp_path / "out" / "index.html"
        assert page.is_file()
        page_after_round_1 = page.read_text()
        w.until(r"^watch: waiting for a save of my_gla.py, my_helpers.py")

        helpers.write_text("OUTPUT_SCALE = = 1.0\n")
        second = w.until(r"^watch: round 2: (PASS|FAIL|ERROR) ")
        assert re.search(r"^watch: round 2: error: .*my_helpers.py:1: SyntaxError", second, re.M), second
        assert re.search(r"^watch: round 2: ERROR \(nothing run\) [\d.]+ s from save to verdict", second, re.M)
        assert w.proc.poll() is None  # the watch goes on
        w.until(r"^watch: waiting for a save")

        # the syntax error fixed, to a wrong output scale: the candidate's module re-imports the helper's
        helpers.write_text("OUTPUT_SCALE = 1.5\n")
        third = w.until(r"^watch: round 3: (PASS|FAIL|ERROR) ")
        assert re.search(rf"FAIL {re.escape(CASE)} \[mine\] o: fail-\w+, decided by \S+", third), third
        assert re.search(r"repro: parity run --case " + re.escape(CASE), third), third
        assert "gate: FAIL" in third
        assert re.search(r"^watch: round 3: FAIL [\d.]+ s from save to verdict", third, re.M), third
        assert w.proc.wait(timeout=60) == 1  # the last round's status
        assert page.read_text() != page_after_round_1  # rewritten in place
    finally:
        if w.proc.poll() is None:
            w.proc.kill()
            w.proc.wait()


def test_a_reload_forgets_the_user_modules_and_the_candidates_but_not_the_rest(tmp_path, monkeypatch):
    from parity.execute.worker import Reload, forget_user_modules

    (tmp_path / "user_kernel_for_reload.py").write_text("import user_helper_for_reload\nVALUE = 1\n")
    (tmp_path / "user_helper_for_reload.py").write_text("HELP = 1\n")
    (tmp_path / "user_other_for_reload.py").write_text("OTHER = 1\n")  # not named: stays
    monkeypatch.syspath_prepend(str(tmp_path))
    import user_kernel_for_reload  # noqa: F401
    import user_other_for_reload  # noqa: F401

    assert "user_helper_for_reload" in sys.modules
    backends = {"mine=jax:user_kernel_for_reload:f": object(), "oracle": object(), "fla": object()}
    dropped = forget_user_modules(
        Reload(("user_kernel_for_reload",), (str(tmp_path / "user_helper_for_reload.py"),)), backends
    )
    assert sorted(dropped) == ["user_helper_for_reload", "user_kernel_for_reload"]
    assert "user_kernel_for_reload" not in sys.modules and "user_helper_for_reload" not in sys.modules
    assert set(backends) == {"oracle", "fla"}  # the reference's and the oracle's stay built
    assert "user_other_for_reload" in sys.modules
    del sys.modules["user_other_for_reload"]


def test_a_candidate_that_hangs_is_killed_its_worker_replaced_and_the_next_save_runs(tmp_path):
    (tmp_path / "my_helpers.py").write_text("OUTPUT_SCALE = 1.0\n")
    shape = "    B, T, H, K = q.shape\n"
    hanging = MY_GLA.replace(shape, "    import time\n\n    time.sleep(600)\n" + shape)
    (tmp_path / "my_gla.py").write_text(hanging)
    w = Watch(
        ["--case", CASE, "--backends", "oracle,fla", "--candidate", "mine=jax:my_gla:simple_gla"]
        + ["--tpu-targets", "none", "--out", "out", "--rounds", "2", "--timeout", "15"],
        tmp_path,
    )
    try:
        first = w.until(r"^watch: round 1: (PASS|FAIL|ERROR) ")
        assert re.search(rf"FAIL {re.escape(CASE)} \[mine\] timeout", first), first
        assert re.search(r"^watch: round 1: FAIL ", first, re.M), first
        w.until(r"^watch: waiting for a save")
        (tmp_path / "my_gla.py").write_text(MY_GLA)
        second = w.until(r"^watch: round 2: (PASS|FAIL|ERROR) ")
        assert re.search(r"^watch: round 2: PASS ", second, re.M), second
        assert w.proc.wait(timeout=60) == 0
    finally:
        if w.proc.poll() is None:
            w.proc.kill()
            w.proc.wait()
