"""The TPU identity jax's Pallas TPU queries answer with off a TPU (parity.execute.tpu_identity):
emulated in TPU interpret mode only around the candidate's call, stated in the record, chosen by
--tpu-interpret-as or the first of --tpu-targets. (The compile side: tests/test_tpu_compile.py.)"""

from __future__ import annotations

import json
import os
import threading

import jax
import pytest
from jax._src.pallas.mosaic import tpu_info
from jax.experimental.pallas import tpu as pltpu

from cases import Case, make_inputs
from parity.cli import main
from parity.execute import compile_log, tpu_identity
from parity.execute.backends.jax_backends import JaxCandidate
from parity.model.targets import TARGETS
from parity.pytest_plugin.options import export_interpret_as
from tests import tpu_candidates
from tests.helpers import requires_libtpu

CASE = Case.from_id("simple_gla-fwd-B1-T64-H1-K64-V64-fp32-C64-g_logsig")
INFO = "info=pallas:tests.tpu_candidates:tpu_info_block"


def _cpu_answers():
    """This machine's own answer: the CPU is no TPU."""
    with pytest.raises(ValueError, match="Unsupported TPU device kind: cpu"):
        pltpu.get_tpu_info()
    assert not pltpu.is_tpu_device()


def _candidate(name: str) -> JaxCandidate:
    return JaxCandidate(name, getattr(tpu_candidates, name), f"{name}=pallas:tests.tpu_candidates:{name}", "pallas")


@requires_libtpu
@pytest.mark.parametrize("target", list(TARGETS))
def test_the_emulated_identity_is_the_topology_device_and_jax_builds_the_same_tpu_info(target):
    """Interpret mode's table agrees with libtpu's compile-only device, and the TpuInfo jax
    builds from it is the one jax gives with that device as the default."""
    from parity.execute.tpu_compile import device

    dev = device(target)
    assert tpu_identity.IDENTITIES[target] == (dev.device_kind, dev.num_cores)
    with tpu_identity.tpu_host(target):
        emulated = pltpu.get_tpu_info()
    assert emulated == tpu_identity.tpu_info_for(dev)
    _cpu_answers()


def test_emulated_answers_as_the_target_inside_only_and_restores_on_an_exception():
    _cpu_answers()
    with tpu_identity.tpu_host("v5e"):
        info = pltpu.get_tpu_info()
        assert info.chip_version == pltpu.ChipVersion.TPU_V5E and pltpu.is_tpu_device()
        assert info.vmem_capacity_bytes == pltpu.get_tpu_info_for_chip(pltpu.ChipVersion.TPU_V5E, 1).vmem_capacity_bytes
        with tpu_identity.tpu_host("tpu7x"):  # jax's cache never serves v5e's answer here
            assert pltpu.get_tpu_info().chip_version == pltpu.ChipVersion.TPU_7X
        assert pltpu.get_tpu_info().chip_version == pltpu.ChipVersion.TPU_V5E
    _cpu_answers()  # nor v5e's outside
    with pytest.raises(RuntimeError, match="kernel failed"), tpu_identity.tpu_host("v6e"):
        assert pltpu.get_tpu_info().mxu_column_size == 256
        raise RuntimeError("kernel failed")
    _cpu_answers()
    in_a_thread = []
    with tpu_identity.tpu_host("v6e"):  # per thread: a thread of its own asks this machine
        t = threading.Thread(target=lambda: in_a_thread.append(tpu_info.get_device_kind()))
        t.start()
        t.join()
    assert in_a_thread == ["cpu"]


def test_a_candidate_in_interpret_mode_reads_the_emulated_tpu_and_its_record_says_so(monkeypatch):
    """get_tpu_info() inside the candidate answers as v5e (the default) or as the run's choice;
    the execution notes state it, the platform stays the emulator's; nothing leaks afterwards."""
    monkeypatch.delenv(tpu_identity.ENV, raising=False)
    inputs = make_inputs(CASE)
    for name in ("sign_1d", "tpu_info_block"):
        with compile_log.optimisation(disabled=False):  # XLA's defaults outside, as in `parity run`
            ex = _candidate(name).run(CASE, inputs)
            assert not jax.config.read("jax_disable_most_optimizations")  # left as it was
        assert ex.platform == "cpu:tpu-interpret"
        identity = dict(ex.notes["tpu_identity"])
        assert identity.pop("host")["answers"].startswith("a host with one chip of the target")
        assert identity == {"emulated": "v5e", "device_kind": "TPU v5 lite", "num_cores": 1, "source": "default"}
    assert tpu_candidates.SEEN[-1] == {
        "chip_version": "v5e",
        "num_lanes": 128,
        "block": 128,
        "is_tpu_device": True,
        "optimisations_off": True,  # interpret mode compiles for compile time (compile_log.optimisation)
        "cache_writes": True,  # jax's default: interpret-mode programs may go to a run's cache
    }
    assert ex.notes["interpret_compile"] == compile_log.interpret_effort()
    _cpu_answers()
    with tpu_identity.exported(("v6e", "--tpu-interpret-as")):
        ex = _candidate("tpu_info_block").run(CASE, inputs)
    assert tpu_candidates.SEEN[-1]["chip_version"] == "v6e" and tpu_candidates.SEEN[-1]["block"] == 256
    assert ex.notes["tpu_identity"]["source"] == "--tpu-interpret-as"
    assert tpu_identity.ENV not in os.environ
    _cpu_answers()


def test_parity_run_tpu_interpret_as_is_recorded_and_not_left_in_the_environment(tmp_path, capsys):
    argv = ["run", "--case", CASE.id, "--backends", "oracle", "--candidate", INFO, "--no-html", "--no-progress"]
    before = {name: os.environ.get(name) for name in (tpu_identity.ENV, tpu_identity.SOURCE_ENV)}
    rc = main([*argv, "--tpu-targets", "none", "--tpu-interpret-as", "v6e", "--out", str(tmp_path)])
    assert rc == 0, capsys.readouterr()
    assert "TPU interpret mode answers as v6e (TPU v6 lite)" in capsys.readouterr().err
    rec = json.loads((tmp_path / "info" / f"{CASE.id}.json").read_text())
    assert rec["verdict"] == "pass" and rec["platform"] == "cpu:tpu-interpret"
    identity = dict(rec["notes"]["tpu_identity"])
    assert identity.pop("host")["asked"]["devices"] >= 1  # kernels_jax asks whether it is on a TPU
    assert identity == {"emulated": "v6e", "device_kind": "TPU v6 lite", "num_cores": 1, "source": "--tpu-interpret-as"}
    # put back as it was (unset, or what a pytest session's --parity-tpu-targets exported)
    assert {name: os.environ.get(name) for name in before} == before


@requires_libtpu
def test_parity_run_emulates_the_first_of_its_tpu_targets(tmp_path):
    argv = ["run", "--case", CASE.id, "--backends", "oracle", "--candidate", INFO, "--no-html", "--no-progress"]
    assert main([*argv, "--tpu-targets", "tpu7x", "--out", str(tmp_path)]) == 0
    rec = json.loads((tmp_path / "info" / f"{CASE.id}.json").read_text())
    assert rec["notes"]["tpu_identity"]["emulated"] == "tpu7x"
    assert rec["notes"]["tpu_identity"]["source"] == "--tpu-targets"
    compiled = json.loads((tmp_path / "info" / f"{CASE.id}.compile.json").read_text())
    assert compiled["targets"]["tpu7x"]["default_device"] == "tpu:TPU7x (compile-only)"


@pytest.mark.parametrize("command", ["run", "mutants", "fuzz"])
@pytest.mark.parametrize("value", ["v9", "TPU v5 lite", ""])
def test_a_bad_tpu_interpret_as_is_one_line_naming_the_option_and_the_targets(command, value, tmp_path, capsys):
    selection = ["--case", CASE.id] if command != "fuzz" else ["--time", "1"]
    with pytest.raises(SystemExit) as e:
        main([command, *selection, "--tpu-interpret-as", value, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1, err
    assert "--tpu-interpret-as" in err and f"{value!r} is invalid: expected one of {list(TARGETS)}" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "command,runner,extra",
    [
        ("mutants", "parity.cli.mutants.run_mutants", ["--case", CASE.id]),
        ("fuzz", "parity.cli.fuzz.run_fuzz", ["--backends", "oracle,fla"]),
    ],
)
def test_mutants_and_fuzz_export_the_tpu_interpret_as_to_their_workers(command, runner, extra, monkeypatch, tmp_path):
    """Their workers read the identity from the environment, set for the run and restored after."""
    monkeypatch.delenv(tpu_identity.ENV, raising=False)
    seen = []

    def stand_in(*a, **kw):  # the run itself: what its workers would read, then stop (an internal error)
        seen.append((os.environ.get(tpu_identity.ENV), os.environ.get(tpu_identity.SOURCE_ENV)))
        raise RuntimeError("stand-in")

    monkeypatch.setattr(runner, stand_in)
    main([command, *extra, "--tpu-interpret-as", "tpu7x", "--out", str(tmp_path / "o"), "--no-progress"])
    assert seen == [("tpu7x", "--tpu-interpret-as")]
    assert tpu_identity.ENV not in os.environ


class _Config:
    def __init__(self, **options):
        self.options = options

    def getoption(self, name):
        return self.options.get(name)


def test_the_pytest_option_is_exported_for_the_session_or_refused(monkeypatch):
    for name in (tpu_identity.ENV, tpu_identity.SOURCE_ENV):
        monkeypatch.setenv(name, "")  # recorded as unset before, so the export below is undone after the test
        monkeypatch.delenv(name)
    export_interpret_as(_Config(parity_tpu_interpret_as="v6e", parity_tpu_targets="none"))
    assert tpu_identity.interpret_target() == ("v6e", "--parity-tpu-interpret-as")
    with pytest.raises(pytest.UsageError, match=r"--parity-tpu-interpret-as 'v9': expected one of \['v4'"):
        export_interpret_as(_Config(parity_tpu_interpret_as="v9"))
