"""The TPU host a kernel library sees off a TPU (parity.execute.tpu_identity.tpu_host) and what
really ran (parity.execute.pallas_paths): libraries that choose their path by asking jax run their
Pallas kernels in TPU interpret mode and compile for TPU targets; a program with no pallas_call or
with the generic interpreter is named as such and never passed. Candidates: tests/platform_candidates.py."""

from __future__ import annotations

import json
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from cases import Case, make_inputs
from parity.cli import main
from parity.execute import pallas_paths, tpu_compile, tpu_identity
from parity.execute.backends import load_candidate_function
from parity.execute.backends.jax_backends import JaxCandidate
from parity.html import build_report
from tests.helpers import requires_libtpu

CASE = Case.from_id("simple_gla-fwd-B1-T64-H1-K64-V64-fp32-C64-g_logsig-ht")
MODULE = "tests.platform_candidates"
CHOOSERS = ("asks_default_backend", "asks_at_import", "falls_back")


def _spec(name: str) -> str:
    return f"{name}=pallas:{MODULE}:{name}"


def _real_host():
    assert jax.default_backend() == "cpu" and jax.device_count() == 1
    assert [d.platform for d in jax.devices()] == ["cpu"]
    with pytest.raises(RuntimeError):
        jax.devices("tpu")


def test_the_host_answers_as_the_target_inside_only():
    _real_host()
    traced_on = jax.jit(lambda x: x + (1.0 if jax.default_backend() == "tpu" else 0.0))
    seen_by_thread = []
    with tpu_identity.tpu_host("v6e") as host:  # (tpu_identity.emulated adds Pallas's TPU queries)
        assert jax.default_backend() == "tpu"
        (dev,) = jax.devices()
        assert jax.devices("tpu") == [dev] == jax.local_devices() and jax.device_count() == 1
        assert (dev.platform, dev.device_kind, dev.num_cores) == ("tpu", "TPU v6 lite", 1)
        assert jax.devices("cpu")[0].platform == "cpu"  # a TPU VM has its CPU too
        x = jax.device_put(np.arange(4.0), dev)  # placed on the CPU, where interpret mode computes
        assert x.devices() == {jax.devices("cpu")[0]} and float(traced_on(jnp.zeros(()))) == 1.0
        t = threading.Thread(target=lambda: seen_by_thread.append(jax.default_backend()))
        t.start()
        t.join()
    assert host.asked == {"default_backend": 2, "devices": 2, "local_devices": 1, "device_count": 1}
    assert seen_by_thread == ["cpu"]  # a thread of its own sees the real host (module docstring)
    _real_host()
    assert float(traced_on(jnp.zeros(()))) == 0.0  # the trace made inside is not served outside


def _ones(interpret):
    def ones(o_ref):
        o_ref[...] = jnp.ones_like(o_ref)

    return pl.pallas_call(ones, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32), interpret=interpret, name="ones")


def test_pallas_paths_reads_each_kernel_and_its_cause():
    x = jnp.ones((8, 128))
    assert pallas_paths.traced(lambda x: x * _ones(False)(), x) == [("ones", "mosaic")]
    assert pallas_paths.cause([("ones", "mosaic")]) is None
    (call,) = pallas_paths.traced(jax.jit(lambda x: x * _ones(True)()), x)  # inside a jit too
    assert call == ("ones", "generic-interpreter") and "interpret=True" in pallas_paths.cause([call])
    (call,) = pallas_paths.traced(lambda x: x * _ones(pltpu.InterpretParams())(), x)
    assert call == ("ones", "tpu-interpret") and "left on, not a Mosaic kernel" in pallas_paths.cause([call])
    assert pallas_paths.traced(lambda x: x * 2, x) == []
    assert "no pallas_call" in pallas_paths.cause([])
    unnamed = pl.pallas_call(lambda o_ref: o_ref.__setitem__(..., jnp.ones_like(o_ref)), out_shape=x)
    (call,) = pallas_paths.traced(lambda x: x * unnamed(), x)  # a lambda kernel is named by where it is
    assert call == (f"<lambda> at test_tpu_host.py:{unnamed_line()}", "mosaic")


def unnamed_line() -> int:
    import inspect

    src, start = inspect.getsourcelines(test_pallas_paths_reads_each_kernel_and_its_cause)
    return start + next(i for i, line in enumerate(src) if "unnamed = pl.pallas_call" in line)


def test_a_module_imported_before_the_harness_is_said_to_be_answered_by_this_machine(tmp_path, monkeypatch):
    (tmp_path / "early_import_lib.py").write_text(
        "import jax\nAT_IMPORT = jax.default_backend()\n\n\n"
        "def xla_only(q, k, v, g=None, **kw):  # o = v, as plain XLA\n    return v, None\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import early_import_lib  # by a test file, before the harness asks for it: this machine answers

    spec = "early=jax:early_import_lib:xla_only"
    assert load_candidate_function(spec) is early_import_lib.xla_only and early_import_lib.AT_IMPORT == "cpu"
    ex = JaxCandidate("early", early_import_lib.xla_only, spec, "jax").run(CASE, make_inputs(CASE))
    assert ex.notes["tpu_identity"]["host"]["import"]["answered_by"].startswith("this machine")


def test_a_library_that_asks_jax_runs_its_pallas_kernels_in_tpu_interpret_mode():
    """Called by hand on this host, each chooser takes its CPU path; run by the harness, the TPU's:
    every pallas_call is a Mosaic kernel as written and ran in TPU interpret mode, the record says
    which questions it asked, and the result is the same Simple GLA."""
    inputs = make_inputs(CASE)
    for name in CHOOSERS:
        fn = load_candidate_function(_spec(name))
        ex = JaxCandidate(name, fn, _spec(name), "pallas").run(CASE, inputs)
        paths = ex.notes["pallas"]
        assert paths["cause"] is None and paths["required"], (name, paths)
        assert ("ones", "mosaic") in {(k["name"], k["as_written"]) for k in paths["kernels"]}, paths
        assert {k["ran"] for k in paths["kernels"]} == {"tpu-interpret"} and ex.platform == "cpu:tpu-interpret"
        asked = ex.notes["tpu_identity"]["host"]["asked"]
        if name == "asks_at_import":  # asked while its module was imported on the emulated host
            assert fn.__globals__["INTERPRET_AT_IMPORT"] is False
            imported = ex.notes["tpu_identity"]["host"]["import"]
            assert imported == {"answered_by": "the emulated v5e host", "asked": {"default_backend": 1}}
        else:  # asked during the call
            assert asked.get("default_backend" if name == "asks_default_backend" else "devices"), asked
        if name == "falls_back":  # by hand, here: its plain-XLA fallback
            assert pallas_paths.traced(lambda q, k, v, g, fn=fn: fn(q, k, v, g=g)[0], *_qkvg(inputs)) == []
    _real_host()


def _qkvg(inputs):
    return [jnp.asarray(inputs[n]) for n in ("q", "k", "v", "g")]


def test_a_library_reads_the_targets_device_kind_in_interpret_mode():
    fn = load_candidate_function(_spec("asks_device_kind"))  # first: its module is imported by the harness
    JaxCandidate("dk", fn, _spec("asks_device_kind"), "pallas").run(CASE, make_inputs(CASE))
    assert fn.__globals__["SEEN"][-1] == {"platform": "tpu", "device_kind": "TPU v5 lite", "num_cores": 1}


@requires_libtpu
def test_the_device_a_library_reads_while_compiling_is_the_targets():
    fn = load_candidate_function(_spec("asks_device_kind"))
    r = tpu_compile.compile_case(fn, CASE, "tpu7x")
    assert r["ok"] and "ones" in r["kernels"], r.get("error")
    assert fn.__globals__["SEEN"][-1] == {"platform": "tpu", "device_kind": "TPU7x", "num_cores": 1}
    assert r["asked"] == {"devices": r["asked"]["devices"]} and r["asked"]["devices"] >= 1


@requires_libtpu
def test_parity_run_compiles_the_choosers_and_names_why_the_others_are_no_tpu_kernels(tmp_path):
    """One run, five libraries, v5e: the three that ask jax pass and compile with their `ones`
    kernel; interpret=True and plain XLA fail in execution and in the compile check, each with
    its own cause; the run exits 1."""
    names = (*CHOOSERS, "interpret_true", "xla_only")
    argv = ["run", "--case", CASE.id, "--backends", "oracle,fla", "--no-html", "--no-progress", "--out", str(tmp_path)]
    for name in names:
        argv += ["--candidate", _spec(name)]
    assert main([*argv, "--tpu-targets", "v5e"]) == 1
    rec = {n: json.loads((tmp_path / n / f"{CASE.id}.json").read_text()) for n in names}
    comp = {n: json.loads((tmp_path / n / f"{CASE.id}.compile.json").read_text())["targets"]["v5e"] for n in names}
    for name in CHOOSERS:
        assert rec[name]["verdict"] == "pass" and comp[name]["ok"] and "ones" in comp[name]["kernels"], name
    assert rec["interpret_true"]["verdict"] == "error" and "generic interpreter" in rec["interpret_true"]["error"]
    assert "interpret=True" in comp["interpret_true"]["error"] and "(ones)" in comp["interpret_true"]["error"]
    assert rec["xla_only"]["verdict"] == "error" and "no pallas_call" in rec["xla_only"]["error"]
    assert not comp["xla_only"]["ok"] and "no pallas_call" in comp["xla_only"]["error"]
    failing = {f["candidate"] for f in json.loads((tmp_path / "gate.json").read_text())["failures"]}
    assert failing == {"interpret_true", "xla_only"}
    # the page's "Where each backend ran" says the same, per backend
    where = {w["backend"]: dict(w["pallas"]) for w in build_report([tmp_path])["summary"]["where"]}
    assert where["falls_back"] == {"Mosaic kernels as written, run in TPU interpret mode on an emulated v5e host": 1}
    assert list(where["xla_only"]) == ["not a TPU kernel: " + pallas_paths.WHY[None]] and where["fla"] == {}


def test_without_tpu_targets_a_pallas_candidate_that_ran_no_tpu_kernel_is_not_passed(tmp_path):
    """The same two with no compile check: failed in execution; the plain-XLA program given as
    plain jax (`jax:`, not a Pallas kernel) is judged on its numbers instead."""
    argv = ["run", "--case", CASE.id, "--backends", "oracle,fla", "--no-html", "--no-progress", "--out", str(tmp_path)]
    for name in ("interpret_true", "xla_only"):
        argv += ["--candidate", _spec(name)]
    assert main([*argv, "--candidate", f"as_jax=jax:{MODULE}:xla_only", "--tpu-targets", "none"]) == 1
    for name in ("interpret_true", "xla_only"):
        rec = json.loads((tmp_path / name / f"{CASE.id}.json").read_text())
        assert rec["verdict"] == "error" and rec["error"].startswith("not run as a TPU kernel: "), rec["error"]
    as_jax = json.loads((tmp_path / "as_jax" / f"{CASE.id}.json").read_text())
    assert as_jax["verdict"] != "error" and not as_jax["notes"]["pallas"]["required"]
    assert as_jax["notes"]["pallas"]["ran"] == "no pallas_call (plain XLA)"


def test_jaxs_ragged_paged_attention_chooses_its_blocks_as_on_the_target():
    """jax's own kernel reads jax.devices()[0].device_kind for its tuned block table: on this host it
    refuses (no TPU), on the emulated v5e and v6e hosts it takes each one's row (they differ here)."""
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import tuned_block_sizes

    shape = ("bfloat16", "bfloat16", 32, 8, 128, 16, 1024, 8)  # q, kv dtype, heads per block, head dim, pages
    with pytest.raises(NotImplementedError, match="TPU version"):
        tuned_block_sizes.get_tuned_block_sizes(*shape)
    chosen = {}
    for target in ("v5e", "v6e"):
        with tpu_identity.tpu_host(target):
            chosen[target] = tuned_block_sizes.get_tuned_block_sizes(*shape)
    assert chosen == {"v5e": (8, 32), "v6e": (4, 32)}
