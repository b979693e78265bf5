"""The reference side says what ran and runs alike: FLA's records name every kernel launch's config
and each dispatched function's backend; configs can be pinned from an earlier record; FLA's lanes
give the same bits as FLA in the worker; a refusal of FLA's names its cause and fix, and a case CUDA
refuses can go to FLA in the interpreter (parity.execute.backends.fla_launches, fla_lane, fla)."""

from __future__ import annotations

import json
import os
import threading
from multiprocessing.connection import Listener

import numpy as np
import pytest

from cases import Case
from parity.execute.backends import execute, fla_configs, fla_lane, fla_launches, triton_interpreter
from parity.execute.backends.fla import FlaBackend
from parity.execute.backends.fla_lane_client import FALLBACK_ENV, KEY_ENV, LANES_ENV, lane_addresses
from parity.model import environ
from parity.model.inputs import case_inputs
from parity.records import read_json, result_path
from tests.helpers import run

triton_interpreter.request()  # before fla is imported (by the backend, in the tests)

GATED = Case("simple_gla", 1, 64, 2, 64, 64, gate="g_logsig", h0=True, ht=True)
CHOSEN_BY = {*fla_configs.CHOSEN_BY, "launch"}


def _fla_record(out, case=GATED) -> dict:
    return read_json(result_path(out, "fla", case.id))


def test_the_record_names_each_launch_config_and_each_dispatched_backend(tmp_path):
    run([GATED], ["oracle", "fla"], tmp_path, seeds=(1, 1))
    rec = _fla_record(tmp_path)
    assert rec["status"] == "ok", rec.get("error")
    launches = rec["notes"]["fla_launches"]
    kernels = {x["kernel"] for x in launches}
    # simple_gla's chunked forward and backward: the state, output and gradient kernels and the gate's cumsum
    assert {"chunk_fwd_kernel_h", "chunk_fwd_kernel_o", "chunk_bwd_kernel_dh", "chunk_local_cumsum_scalar_kernel"} <= (
        kernels
    )
    for x in launches:
        assert x["chosen_by"] in CHOSEN_BY and x["launches"] >= 1 and isinstance(x["meta"], dict), x
        assert x["num_warps"] is not None and x["num_stages"] is not None, x  # every FLA kernel is autotuned
    out_kernel = next(x for x in launches if x["kernel"] == "chunk_fwd_kernel_o")
    assert out_kernel["chosen_by"] == "rule" and set(out_kernel["config_kwargs"]) == {"BK", "BV"}
    assert out_kernel["meta"]["BT"] == 64 and out_kernel["meta"]["K"] == 64
    # the functions fla.backends dispatches, each computed by FLA's own Triton function on this CPU
    # (chunk_bwd_dqkwg through the registry of the operation "common", #640's function)
    assert rec["notes"]["fla_dispatch"] == {
        f"fla.ops.common.{f}": "triton"
        for f in ("chunk_h.chunk_fwd_h", "chunk_h.chunk_bwd_dh", "chunk_o.chunk_fwd_o", "chunk_o.chunk_bwd_dv")
        + ("chunk_o.chunk_bwd_dqkwg",)
    } | {"fla.ops.utils.cumsum.chunk_local_cumsum": "triton"}


def test_pinned_configs_run_whatever_the_interpreter_would_choose(tmp_path):
    """A config pinned from an earlier record runs (chunk_fwd_kernel_o with BK = BV = 64 where the
    interpreter takes 128), the record says so, and the outputs stay within tolerance."""
    run([GATED], ["oracle", "fla"], tmp_path / "first", seeds=(1, 1))
    launches = _fla_record(tmp_path / "first")["notes"]["fla_launches"]
    pinned = []
    for x in launches:
        if x["kernel"] == "chunk_fwd_kernel_o":
            x = {**x, "meta": {**x["meta"], "BK": 64, "BV": 64}}
            pinned.append(x)
    pins = tmp_path / "pins.json"
    pins.write_text(json.dumps(pinned))
    run([GATED], ["oracle", "fla"], tmp_path / "pinned", seeds=(1, 1), fla_configs=pins)
    rec = _fla_record(tmp_path / "pinned")
    assert rec["status"] == "ok" and rec["verdict"] == "pass", rec.get("error")
    out_kernel = [x for x in rec["notes"]["fla_launches"] if x["kernel"] == "chunk_fwd_kernel_o"]
    assert [(x["chosen_by"], x["meta"]["BK"], x["meta"]["BV"]) for x in out_kernel] == [("pinned", 64, 64)]
    others = {x["kernel"]: x["chosen_by"] for x in rec["notes"]["fla_launches"] if x["kernel"] != "chunk_fwd_kernel_o"}
    assert "pinned" not in others.values()


def test_a_lane_gives_the_configs_and_bits_of_fla_in_this_process():
    """FLA through a lane (its own process, started fresh) launches the same configs and computes the
    same bits as FLA here; the record says where it ran."""
    inputs = case_inputs(GATED)
    here = FlaBackend().run_here(GATED, inputs)
    with fla_lane.started(True, 1, False) as lanes:
        assert lanes.devices == ["cpu"] and lanes.precompile is None  # the interpreter compiles nothing
        lane = FlaBackend().run(GATED, inputs)
    assert "FLA lane for cpu" in lane.notes["fla_lane"]
    assert lane.platform == here.platform == "cpu:triton-interpreter"
    assert lane.notes["fla_launches"] == here.notes["fla_launches"]
    for name, t in here.tensors.items():
        assert t.tobytes() == lane.tensors[name].tobytes(), name


def _force_hopper(monkeypatch) -> None:
    """FLA's own guard of #640 as on an H100 with Triton < 3.7.1 (its flags, read at the call)."""
    from fla.ops.common import chunk_o

    monkeypatch.setattr(chunk_o, "IS_NVIDIA_HOPPER", True)
    monkeypatch.setattr(chunk_o, "TRITON_ABOVE_3_4_0", True)
    monkeypatch.setattr(chunk_o, "TRITON_ABOVE_3_7_1", False)


def test_a_refusal_of_flas_names_its_cause_and_fix(monkeypatch):
    """FLA 0.6.0 refuses a gated backward on Hopper with Triton < 3.7.1 (#640): the error record
    says so in one line with the fix, and keeps where it refused and the versions."""
    execute(FlaBackend(), GATED, case_inputs(GATED))  # fla imported for the interpreter first
    _force_hopper(monkeypatch)
    result = execute(FlaBackend(), GATED, case_inputs(GATED))
    assert result.status == "error"
    refusal = result.notes["refusal"]
    assert refusal["issue"] == "fla#640" and refusal["environment"] is True
    assert "Triton" in refusal["fix"] and "FLA refused (fla#640)" in result.error
    assert result.platform == "cpu:triton-interpreter" and result.versions["triton"]


def _refusing_lane(address: str, key: bytes, refusal: dict) -> None:
    """A lane that refuses every case as FLA on an H200 does (#640)."""
    with Listener(address, family="AF_UNIX", authkey=key) as listener, listener.accept() as conn:
        while True:
            try:
                conn.recv()
            except EOFError:
                return
            fields = {"platform": "cuda:NVIDIA H200", "versions": {"triton": "3.6.0"}, "notes": {"refusal": refusal}}
            conn.send(("raised", "error", "RuntimeError: ... (see #640) ...", fields))


def test_a_case_cuda_refuses_goes_to_the_interpreter_lane_when_asked(tmp_path):
    """--fla-fallback interpreter: the case a CUDA lane refuses for its environment is computed by FLA in
    the interpreter lane, with the record saying where it was refused and why; without the fallback
    the refusal stands."""
    from parity.model.fla_known import refusal_of

    refusal = refusal_of(
        "Triton >= 3.4.0 and < 3.7.1 on Hopper GPUs produces incorrect results for gated chunk_bwd_dqkwg (see #640)."
    )
    inputs = case_inputs(GATED)
    with fla_lane.started(True, 1, False) as lanes:  # an interpreter lane, as the fallback
        assert lanes.devices == ["cpu"]
        interpreter_lane, key = lane_addresses()[0], bytes.fromhex(os.environ[KEY_ENV])
        address = str(tmp_path / "cuda-lane")
        threading.Thread(target=_refusing_lane, args=(address, key, refusal), daemon=True).start()
        with environ.exported({LANES_ENV: address, FALLBACK_ENV: ""}):
            refused = execute(FlaBackend(), GATED, inputs)
        with environ.exported({LANES_ENV: address, FALLBACK_ENV: interpreter_lane}):
            ex = FlaBackend().run(GATED, inputs)
    assert refused.status == "error" and refused.platform == "cuda:NVIDIA H200"
    assert refused.notes["refusal"]["issue"] == "fla#640"
    assert ex.platform == "cpu:triton-interpreter"
    assert ex.notes["fallback"]["from"] == "cuda:NVIDIA H200" and ex.notes["fallback"]["refusal"] == refusal
    reference = FlaBackend().run_here(GATED, inputs)
    for name, t in reference.tensors.items():
        assert np.array_equal(t, ex.tensors[name], equal_nan=True), name


@pytest.mark.parametrize("text", ["x", "-1"])
def test_bad_fla_lanes_are_refused(text):
    from parity.model.options import OptionError, fla_lanes

    with pytest.raises(OptionError, match="auto or an int >= 0"):
        fla_lanes(text)


def test_unknown_pins_leave_the_choice_to_the_table_or_the_rule(tmp_path, monkeypatch):
    pins = tmp_path / "pins.json"
    pins.write_text(json.dumps([{"kernel": "no_such_kernel", "meta": {}, "key": ["1"], "chosen_by": "autotune"}]))
    monkeypatch.setenv(environ.FLA_CONFIGS, str(pins))
    source = fla_configs.source(None)
    assert source.pins == pins and source.table == fla_configs.shipped_table(fla_configs.INTERPRETER_GPU)
    assert set(fla_configs.read_pins(str(pins))) == {("no_such_kernel", ("1",))}
    assert source.choose("no_such_kernel", (1,))[1] == "pinned" and source.choose("chunk_fwd_kernel_o", (1,)) is None


def _hold_the_gpu_shared(lock: str, holding: str, released: str) -> None:
    """A lane's FLA call: the GPU shared for a while; it writes `released` just before letting go."""
    import time
    from pathlib import Path

    os.environ[fla_launches.GPU_LOCK_ENV] = lock
    with fla_launches.sharing_the_gpu():
        Path(holding).touch()
        time.sleep(0.5)
        Path(released).touch()


def test_autotuning_times_its_configs_with_no_other_lanes_call_on_the_gpu(tmp_path, monkeypatch):
    """Another lane's call holds the GPU shared: an autotuner's timing (exclusive) starts only after
    that call has let go, and other calls share it freely."""
    import multiprocessing as mp

    lock, holding, released = (str(tmp_path / n) for n in ("gpu0.lock", "holding", "released"))
    other = mp.get_context("spawn").Process(target=_hold_the_gpu_shared, args=(lock, holding, released))
    other.start()
    try:
        while not os.path.exists(holding):
            assert other.is_alive() or os.path.exists(holding), "the other lane never took the GPU"
        monkeypatch.setenv(fla_launches.GPU_LOCK_ENV, lock)
        monkeypatch.setattr(fla_launches, "_lock", [])
        with fla_launches.sharing_the_gpu():
            assert not os.path.exists(released)  # shared with the other lane's call
            with fla_launches.gpu_to_itself():
                assert os.path.exists(released)  # the other call had ended
    finally:
        other.join(10)


def test_a_kernel_pinned_for_every_key_runs_that_config(tmp_path, monkeypatch):
    """{kernel: config} (FLA #984's fix: {"prepare_wy_repr_bwd_kernel": {"num_warps": 2}}) pins every
    launch of the kernel, whatever its key."""
    pins = tmp_path / "pins.json"
    pins.write_text(json.dumps({"chunk_fwd_kernel_o": {"kwargs": {"BK": 64, "BV": 64}, "num_warps": 2}}))
    run([GATED], ["oracle", "fla"], tmp_path / "pinned", seeds=(1, 1), fla_configs=pins)
    rec = _fla_record(tmp_path / "pinned")
    assert rec["status"] == "ok" and rec["verdict"] == "pass", rec.get("error")
    out_kernel = [x for x in rec["notes"]["fla_launches"] if x["kernel"] == "chunk_fwd_kernel_o"]
    assert [(x["chosen_by"], x["meta"]["BK"], x["num_warps"]) for x in out_kernel] == [("pinned", 64, 2)]
