"""What a rerun reuses (parity.execute.verified_cache): FLA's record of a case (fla_cache) and a TPU
compile of the same lowered module (tpu_compile), each saying it was reused; never across a change
of what it depends on, never under --fresh, never from a damaged entry.

The harness's tests run with PARITY_FRESH=fla,tpu_compile (conftest.py); these tests clear it and
use a cache of their own.
"""

from __future__ import annotations

import dataclasses
import json
import os
import warnings

import ml_dtypes
import numpy as np
import pytest

from cases import Case
from parity.execute import verified_cache
from parity.execute.backends import Execution, execute, fla_cache
from parity.model import environ
from parity.model.inputs import case_inputs
from parity.records import read_json, result_path
from tests.helpers import requires_libtpu, run

torch = pytest.importorskip("torch")
if torch.cuda.is_available():
    pytest.skip("these tests run FLA in the CPU interpreter; a CUDA device is visible", allow_module_level=True)

from parity.execute.backends import triton_interpreter  # noqa: E402

triton_interpreter.enable()  # before fla is imported

from parity.execute.backends.fla import FlaBackend  # noqa: E402

CASE = Case("simple_gla", 1, 32, 1, 32, 32, h0=True, ht=True, chunk_size=16)  # FLA: about 3 s here
HERE = fla_cache.INTERPRETER


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache of this test's own, nothing ignored, no pinned configs."""
    monkeypatch.setenv("PARITY_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("PARITY_FRESH", raising=False)
    monkeypatch.delenv(environ.FLA_CONFIGS, raising=False)
    return tmp_path / "cache"


def _fields(result) -> dict:
    """A BackendResult's fields but its tensors and wall time, notes.reused aside."""
    d = dataclasses.asdict(result)
    d.pop("tensors"), d.pop("wall_time_s")
    d["notes"] = {k: v for k, v in d["notes"].items() if k != "reused"}
    return json.loads(json.dumps(d))  # tuples as lists, as the cache's JSON keeps them


@pytest.fixture
def stored(cache):
    """FLA's first result for CASE (stored by it) and CASE's inputs."""
    x = case_inputs(CASE)
    first = execute(FlaBackend(), CASE, x)
    assert first.status == "ok", first.error
    assert "reused" not in first.notes
    return first, x


def test_a_second_call_reuses_flas_record_tensors_and_fields_alike(stored, cache):
    first, x = stored
    again = execute(FlaBackend(), CASE, x)
    assert again.status == "ok"
    reused = again.notes["reused"]
    assert reused["cache"].startswith(str(cache / "fla")) and reused["from"].endswith("Z")
    assert sorted(again.tensors) == sorted(first.tensors)
    for name, t in first.tensors.items():
        assert again.tensors[name].dtype == t.dtype and np.array_equal(again.tensors[name], t, equal_nan=True)
    assert _fields(again) == _fields(first)  # platform, implementation, versions, kernel time, numerics, notes


@pytest.mark.parametrize("package", ["fla-core", "triton", "torch", "numpy"])
def test_another_version_of_fla_triton_torch_or_numpy_is_never_reused(stored, monkeypatch, package):
    _, x = stored
    assert fla_cache.reused(CASE, x, HERE) is not None  # the same versions: reused
    real = fla_cache.installed_versions()
    monkeypatch.setattr(fla_cache, "installed_versions", lambda: {**real, package: real[package] + ".post1"})
    assert fla_cache.reused(CASE, x, HERE) is None


def test_fla_runs_again_under_another_fla_version(stored, monkeypatch):
    _, x = stored
    real = fla_cache.installed_versions()
    monkeypatch.setattr(fla_cache, "installed_versions", lambda: {**real, "fla-core": "0.0.1"})
    again = execute(FlaBackend(), CASE, x)
    assert again.status == "ok" and "reused" not in again.notes


def test_another_case_seed_or_inputs_are_never_reused(stored):
    _, x = stored
    seeded = dataclasses.replace(CASE, seed=1)
    assert fla_cache.reused(seeded, case_inputs(seeded), HERE) is None
    assert fla_cache.reused(seeded, x, HERE) is None  # the case's dict holds its seed
    assert fla_cache.reused(dataclasses.replace(CASE, ht=False), x, HERE) is None
    other = {**x, "q": x["q"] * 2}
    assert fla_cache.reused(CASE, other, HERE) is None
    assert fla_cache.reused(CASE, x, "cuda:NVIDIA H100 80GB HBM3") is None


def test_a_change_of_the_pinned_configs_file_is_never_reused(stored, tmp_path, monkeypatch):
    first, x = stored
    pins = tmp_path / "pins.json"
    pins.write_text(json.dumps({"no_such_kernel": {"num_warps": 2}}))
    assert fla_cache.reused(CASE, x, HERE) is not None
    monkeypatch.setenv(environ.FLA_CONFIGS, str(pins))
    assert fla_cache.reused(CASE, x, HERE) is None  # pins where there were none
    fields = {f.name: getattr(first, f.name) for f in dataclasses.fields(Execution)}
    fla_cache.store(CASE, x, Execution(**fields), fla_cache.now())
    assert fla_cache.reused(CASE, x, HERE) is not None  # stored under these pins
    pins.write_text(json.dumps({"no_such_kernel": {"num_warps": 4}}))
    assert fla_cache.reused(CASE, x, HERE) is None  # the same file, other configs


@pytest.mark.parametrize("fresh", ["1", "fla"])
def test_fresh_never_reuses_but_stores(stored, monkeypatch, fresh):
    _, x = stored
    stored_at = fla_cache.reused(CASE, x, HERE).notes["reused"]["from"]
    monkeypatch.setenv("PARITY_FRESH", fresh)
    assert fla_cache.reused(CASE, x, HERE) is None
    again = execute(FlaBackend(), CASE, x)
    assert again.status == "ok" and "reused" not in again.notes
    monkeypatch.delenv("PARITY_FRESH")
    assert fla_cache.reused(CASE, x, HERE).notes["reused"]["from"] >= stored_at  # stored again


@pytest.mark.parametrize("before", ["", "oracle", "tpu_compile,fla", "1"])
def test_a_repro_reruns_fla_whatever_the_session_already_ignores(stored, monkeypatch, before):
    """parity.repro.replay runs its backend under environ.fresh_also("fla"): FLA is never read
    from the cache, and what was already ignored stays ignored."""
    _, x = stored
    monkeypatch.setenv("PARITY_FRESH", before)
    with environ.exported(environ.fresh_also("fla")):
        assert fla_cache.reused(CASE, x, HERE) is None
        assert all(environ.fresh(k) for k in ("fla", *filter(None, before.split(","))))
        assert environ.fresh("oracle") == (before in ("oracle", "1"))
    assert os.environ["PARITY_FRESH"] == before


def test_a_damaged_entry_is_recomputed_with_a_warning_and_replaced(stored):
    _, x = stored
    path = verified_cache.cache_dir("fla") / next(p.name for p in verified_cache.cache_dir("fla").glob("*.npz"))
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.warns(fla_cache.FlaCacheWarning, match="damaged"):
        again = execute(FlaBackend(), CASE, x)
    assert again.status == "ok" and "reused" not in again.notes
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert "reused" in execute(FlaBackend(), CASE, x).notes  # replaced: a verified hit now


def test_an_error_is_never_stored(cache, monkeypatch):
    def fails(*args, **kwargs):
        raise RuntimeError("FLA failed")

    monkeypatch.setattr(FlaBackend, "_compute", fails)
    result = execute(FlaBackend(), CASE, case_inputs(CASE))
    assert result.status == "error" and "FLA failed" in result.error
    assert not list(cache.rglob("*.npz"))


def test_an_entry_keeps_bfloat16_and_its_meta_and_refuses_another_key(cache):
    arrays = {"o": np.arange(6, dtype=np.float32).astype(ml_dtypes.bfloat16).reshape(2, 3), "s": np.ones(2)}
    path = verified_cache.cache_dir("fla") / "k.npz"
    verified_cache.write(path, "key-a", arrays, {"x": [1, 2.5]})
    entry = verified_cache.read(path, "key-a")
    assert entry.meta == {"x": [1, 2.5]} and entry.arrays["o"].dtype == ml_dtypes.bfloat16
    assert all(np.array_equal(entry.arrays[n], arrays[n]) for n in arrays)
    with pytest.raises(ValueError, match="written under key"):
        verified_cache.read(path, "key-b")


SPEC = "scan=jax:tests.example_candidates:recurrent_scan"


def _records(out, backend, kind="result"):
    return read_json(result_path(out, backend, CASE.id, kind=kind))


def _figures(rec) -> dict:
    return {k: v for k, v in rec.items() if k not in ("created", "run_id", "wall_time_s", "notes")}


@requires_libtpu
def test_a_second_run_reuses_flas_record_and_the_compile_and_fresh_reuses_neither(cache, tmp_path):
    runs = {}
    for name, fresh in (("first", False), ("second", False), ("fresh", True)):
        out = tmp_path / name
        summary = run([CASE], ["fla", SPEC], out, tpu_targets=("v5e",), fresh=fresh)
        assert {r["status"] for r in summary["results"]} == {"ok"}, summary["results"]
        assert summary["timing"]["reused"] == ({"fla": 1} if name == "second" else {})  # the run line's
        runs[name] = (_records(out, "fla"), _records(out, "scan", "compile"))
    (fla1, comp1), (fla2, comp2), (fla3, comp3) = runs["first"], runs["second"], runs["fresh"]
    assert "reused" not in fla1["notes"] and "reused" not in comp1["targets"]["v5e"]
    assert fla2["notes"]["reused"]["cache"].startswith(str(cache / "fla"))
    assert _figures(fla2) == _figures(fla1)  # the same tensors' figures against the oracle
    reused = comp2["targets"]["v5e"]["reused"]
    assert reused["cache"].startswith(str(cache / "tpu_compile")) and comp2["targets"]["v5e"]["ok"]
    assert comp2["targets"]["v5e"]["kernels"] == comp1["targets"]["v5e"]["kernels"]
    assert comp2["verdict"] == comp1["verdict"]
    assert "reused" not in fla3["notes"] and "reused" not in comp3["targets"]["v5e"]


@requires_libtpu
def test_a_compile_is_reused_for_the_same_module_libtpu_and_target_only(cache, monkeypatch):
    from parity.execute import tpu_compile
    from tests import tpu_candidates

    fwd = Case("simple_gla", 1, 64, 1, 64, 64, direction="fwd")
    first = tpu_compile.compile_case(tpu_candidates.sign_1d, fwd, "v5e")
    assert first["ok"] and first["kernels"] and "reused" not in first
    again = tpu_compile.compile_case(tpu_candidates.sign_1d, fwd, "v5e")
    assert again["reused"]["cache"].startswith(str(cache / "tpu_compile")) and again["ok"]
    assert {k: again[k] for k in ("kernels", "memory", "mosaic", "numerics", "module_sha256")} == {
        k: first[k] for k in ("kernels", "memory", "mosaic", "numerics", "module_sha256")
    }
    assert "reused" not in tpu_compile.compile_case(tpu_candidates.sign_1d, fwd, "v6e")  # another target
    with monkeypatch.context() as m:
        m.setattr(tpu_compile, "libtpu_version", lambda: "0.0.0-another")
        assert "reused" not in tpu_compile.compile_case(tpu_candidates.sign_1d, fwd, "v5e")
    with monkeypatch.context() as m:
        m.setenv("PARITY_FRESH", "1")
        assert "reused" not in tpu_compile.compile_case(tpu_candidates.sign_1d, fwd, "v5e")
    path, _ = tpu_compile._compile_cache_entry("v5e", first["module_sha256"])
    path.write_bytes(path.read_bytes()[:-40])  # truncated
    with pytest.warns(verified_cache.CacheWarning, match="damaged"):
        damaged = tpu_compile.compile_case(tpu_candidates.sign_1d, fwd, "v5e")
    assert damaged["ok"] and "reused" not in damaged
    assert "reused" in tpu_compile.compile_case(tpu_candidates.sign_1d, fwd, "v5e")  # replaced


def test_parity_fresh_reaches_the_session_and_is_put_back(pytester, monkeypatch):
    monkeypatch.delenv("PARITY_FRESH", raising=False)
    pytester.makepyfile("import os\n\ndef test_env():\n    assert os.environ.get('PARITY_FRESH') == '1'\n")
    pytester.runpytest_inprocess("-p", "parity.pytest_plugin", "--parity-fresh").assert_outcomes(passed=1)
    assert "PARITY_FRESH" not in os.environ  # the session put it back
    pytester.runpytest_inprocess("-p", "parity.pytest_plugin").assert_outcomes(failed=1)  # without it: unset
