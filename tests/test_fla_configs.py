"""FLA's configs without autotuning: one config per (kernel, key) from a table in FLA's own format
or the rule, nothing timed, and the GPU side's kernels compiled once each, in parallel, before the
cases run (parity.execute.backends.fla_configs, fla_launches, fla_compile).

The compile tests compile FLA's real kernels for an H100 (sm_90) on this CPU (Triton's wheel
carries ptxas), the way a GPU machine's pre-compile does, with Triton's driver and FLA's probes
answering as an H100 (parity.execute.backends.gpu_target)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cases import Case, get_suite
from parity.execute.backends import fla_configs, triton_interpreter
from parity.execute.backends.fla import FlaBackend
from parity.model import environ
from parity.model.inputs import case_inputs
from tests.helpers import assert_matches_oracle, triton_dir

triton_interpreter.request()  # before fla is imported (by the backend, in the tests)

FORWARD = Case("simple_gla", 1, 96, 2, 64, 64, gate="g_stress", direction="fwd")  # the smoke suite's; fp32
# chunk_fwd_kernel_o's autotune key for FORWARD (H, HV, K, V, BT, STATE_V_FIRST; then the dtypes of
# q, k, v, h, g, o)
FORWARD_O_KEY = [2, 2, 64, 64, 64, False, *["torch.float32"] * 6]
# a config FLA's own list never has (num_stages 1): a launch with it can only come from the table
TABLE_CONFIG = fla_configs.config_dict({"BK": 64, "BV": 64}, num_warps=4, num_stages=1)


def _table(tmp_path, kernel: str, key: list, config: dict):
    entries = {kernel: {fla_configs.key_hash(key): {"autotune_key": key, "config": config}}}
    fla_configs.write_table(tmp_path / "table", entries, "3.9.0", "a test's table")
    return tmp_path / "table"


# ------------------------------------------------------------------ the table's format
def test_a_table_is_flas_own_format_and_flas_loader_finds_its_entries(tmp_path, monkeypatch):
    from fla.ops.utils import cache

    table = _table(tmp_path, "chunk_fwd_kernel_o", FORWARD_O_KEY, TABLE_CONFIG)
    key = cache.AutotuneKey(tuple(FORWARD_O_KEY))
    assert fla_configs.key_hash(FORWARD_O_KEY) == cache.AutotuneKey.key_hash(key.autotune_key)
    monkeypatch.setenv("FLA_CONFIG_DIR", str(table))
    monkeypatch.setattr(cache, "FLA_CACHE_MODE", cache.FlaCacheMode.STRICT)
    assert cache.load_cached_config("chunk_fwd_kernel_o", key) == TABLE_CONFIG
    assert cache.load_cached_config("chunk_fwd_kernel_o", cache.AutotuneKey((3, *FORWARD_O_KEY[1:]))) is None
    assert fla_configs.table_lookup(table, "chunk_fwd_kernel_o", FORWARD_O_KEY) == (TABLE_CONFIG, "table")


def test_the_shipped_h200_table_is_flas_format_with_every_entry_under_its_keys_hash():
    from fla.ops.utils import cache

    table = fla_configs.shipped_table("NVIDIA H200")
    assert table is not None and fla_configs.shipped_table("NVIDIA A100-SXM4-80GB") is None
    files = sorted(table.glob("*.json"))
    assert {f.stem for f in files} == {"chunk_fwd_kernel_h", "chunk_fwd_kernel_o", "chunk_local_cumsum_scalar_kernel"}
    for f in files:
        parsed = cache.KernelConfigFile.from_file(f)
        assert parsed is not None and parsed.kernel_name == f.stem and parsed.autotune_entries, f
        for h, entry in parsed.autotune_entries.items():
            assert h == cache.AutotuneKey.key_hash(entry["autotune_key"]), (f, h)
            assert {"kwargs", "num_warps", "num_stages", "num_ctas"} <= set(entry["config"]), (f, h)


def test_a_records_key_text_reads_back_as_the_keys_values():
    text = ["128", "False", "True", "None", "64", "torch.bfloat16", "0.5"]
    assert fla_configs.key_from_text(text) == [128, False, True, None, 64, "torch.bfloat16", 0.5]


def test_an_autotuned_runs_choices_become_a_table_and_tables_merge(tmp_path):
    launch = {
        "kernel": "chunk_fwd_kernel_o",
        "meta": {"BK": 64, "BV": 128, "BT": 64},
        "config_kwargs": ["BK", "BV"],
        "num_warps": 8,
        "num_stages": 2,
        "chosen_by": "autotune",
        "key": [str(k) for k in FORWARD_O_KEY],
    }
    ruled = {**launch, "chosen_by": "rule", "key": [str(k) for k in [1, *FORWARD_O_KEY[1:]]]}
    table = tmp_path / "table"
    fla_configs.write_table(table, fla_configs.entries_from_launches([launch, ruled]), "3.6.0", "first")
    other = {**launch, "key": [str(k) for k in [4, *FORWARD_O_KEY[1:]]], "chosen_by": "triton-cache"}
    fla_configs.write_table(table, fla_configs.entries_from_launches([other]), "3.6.0", "second")
    data = json.loads((table / "chunk_fwd_kernel_o.json").read_text())
    assert data["source"] == "second" and len(data["autotune_entries"]) == 2  # the rule's choice is no tuning
    assert fla_configs.table_lookup(table, "chunk_fwd_kernel_o", FORWARD_O_KEY)[0] == fla_configs.config_dict(
        {"BK": 64, "BV": 128}, 8, 2
    )


# ------------------------------------------------------------------ the options
def test_fla_configs_takes_a_table_directory_and_refuses_one_without_tables(tmp_path):
    from parity.model.options import OptionError
    from parity.model.options import fla_configs as option

    table = _table(tmp_path, "chunk_fwd_kernel_o", FORWARD_O_KEY, TABLE_CONFIG)
    assert option(str(table)) == table.resolve()
    (tmp_path / "empty").mkdir()
    with pytest.raises(OptionError, match="no KERNEL.json in the directory"):
        option(str(tmp_path / "empty"))
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "k.json").write_text('{"x": 1}')
    with pytest.raises(OptionError, match="k.json: no autotune_entries or default_config"):
        option(str(tmp_path / "bad"))


def test_fla_autotune_is_refused_on_a_host_without_a_gpu(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "parity", "run", "--case", FORWARD.id, "--backends", "oracle,fla", "--fla-autotune",
         "--out", str(tmp_path / "out")],
        capture_output=True, text=True, env={**environ_without_gpus()},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "parity run: --fla-autotune: tunes FLA's kernels on a CUDA GPU and this host has none (FLA runs in "
        "Triton's interpreter here, which times nothing); leave it out"
    ]
    assert not (tmp_path / "out").exists()


def environ_without_gpus() -> dict:
    import os

    return {**os.environ, "CUDA_VISIBLE_DEVICES": ""}


# ------------------------------------------------------------------ the interpreter
def test_the_interpreter_runs_the_tables_config_and_its_record_says_so(tmp_path, monkeypatch):
    """A table's entry (named by --fla-configs DIR) decides its key's config in the interpreter too;
    every other autotuned launch runs the rule's; nothing is timed."""
    from triton.runtime.autotuner import Autotuner

    def timed(*args, **kwargs):
        raise AssertionError("a config was timed")

    monkeypatch.setattr(Autotuner, "_bench", timed)
    monkeypatch.setenv(environ.FLA_CONFIGS, str(_table(tmp_path, "chunk_fwd_kernel_o", FORWARD_O_KEY, TABLE_CONFIG)))
    ex = FlaBackend().run_here(FORWARD, case_inputs(FORWARD))
    assert_matches_oracle(FORWARD, ex.tensors)
    chosen = {x["kernel"]: (x["chosen_by"], x["meta"].get("BK"), x["num_stages"]) for x in ex.notes["fla_launches"]}
    assert chosen.pop("chunk_fwd_kernel_o") == ("table", 64, 1)
    assert chosen and {how for how, *_ in chosen.values()} <= {"rule", "only-config"}, chosen
    monkeypatch.delenv(environ.FLA_CONFIGS)  # the table gone, the rule's again
    again = FlaBackend().run_here(FORWARD, case_inputs(FORWARD))
    out_kernel = next(x for x in again.notes["fla_launches"] if x["kernel"] == "chunk_fwd_kernel_o")
    assert out_kernel["chosen_by"] == "rule" and out_kernel["num_stages"] != 1


def test_the_interpreter_runs_the_h200s_table_by_default_as_the_h200_runs_it():
    """Without --fla-configs the interpreter reads the table shipped for INTERPRETER_GPU: a case of
    the H200 run the table was made from runs the configs Triton's autotuner chose there."""
    case = Case.from_id("simple_gla-fwd-B1-T100-H2-K64-V64-bf16-C64-g_logsig")
    ex = FlaBackend().run_here(case, case_inputs(case))
    assert_matches_oracle(case, ex.tensors)
    chosen = {x["kernel"]: (x["chosen_by"], x["meta"].get("BK"), x["meta"].get("BV"), x["num_warps"], x["num_stages"])
              for x in ex.notes["fla_launches"]}  # fmt: skip
    assert chosen == {  # the H200's choices (shared/gpu-records/h200-2026-11-28/records/A)
        "chunk_local_cumsum_scalar_kernel": ("table", None, None, 1, 3),
        "chunk_fwd_kernel_h": ("table", 32, 32, 2, 3),
        "chunk_fwd_kernel_o": ("table", 64, 64, 4, 3),
    }


# ------------------------------------------------------------------ the pre-compile, for sm_90 on this CPU
TORCH_DTYPES = {"*fp32": "torch.float32", "*bf16": "torch.bfloat16", "*fp16": "torch.float16", "*i64": "torch.int64",
                "*i32": "torch.int32"}  # fmt: skip


def _o_key_and_config(launch) -> tuple[list, tuple]:
    """A planned chunk_fwd_kernel_o launch's autotune key, as its autotuner forms it (its constexprs
    H, HV, K, V, BT, STATE_V_FIRST, then its tensors' dtypes), and its config (BK, BV, num_warps, num_stages)."""
    spec = json.loads(launch.spec)
    names = list(spec["signature"])
    constants = {names[k[0]]: v for k, v in zip(spec["constant_keys"], spec["constant_vals"])}
    key = [constants[n] for n in ("H", "HV", "K", "V", "BT", "STATE_V_FIRST")]
    key += [TORCH_DTYPES[t] for t in spec["signature"].values() if t in TORCH_DTYPES]
    return key, (constants["BK"], constants["BV"], spec["options"]["num_warps"], spec["options"]["num_stages"])


def test_the_smoke_suites_fla_kernels_compile_for_sm90_once_each_in_parallel_and_a_warm_run_compiles_none(
    tmp_path, monkeypatch
):
    """The pre-compile of the smoke suite for an H100, on this CPU, through its pool of two processes,
    under the H200 image's Triton 3.6.0: every case planned, FLA's gated backwards to their #640
    refusal, as on a Hopper GPU (nothing timed: the stand-in driver refuses to time); one compile per
    (kernel, specialisation, config), none twice (each compiled kernel's Triton hash once), each within
    an H100's shared memory; the fp32 key the table names compiles its one config and no other. Then
    the same again: every kernel loaded from Triton's cache, none compiled."""
    from parity.execute.backends import fla_compile, gpu_target

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setenv(environ.FLA_CONFIGS, str(_table(tmp_path, "chunk_fwd_kernel_o", FORWARD_O_KEY, TABLE_CONFIG)))
    cases, triton36 = get_suite("smoke"), str(triton_dir("3.6.0"))
    assert FORWARD.id in {c.id for c in cases}
    cold = fla_compile.precompile(cases, jobs=2, on_gpu=False, path_first=triton36)
    assert (cold.target, cold.triton, cold.jobs, cold.cases) == (fla_compile.H100_VIEW, "3.6.0", 2, len(cases))
    gated_backward = {c.id for c in cases if c.backward and c.gate_name == "g"}  # where FLA may refuse (#640)
    assert cold.stopped and set(cold.stopped) <= gated_backward, cold.stopped
    assert all("#640" in why for why in cold.stopped.values()), cold.stopped
    assert cold.failed == [], cold.failed
    kernels = {launch.ident for launch in cold.planned}
    assert len(kernels) == len(cold.planned) == len(cold.results) < cold.launches  # launches shared by cases
    hashes = [r.triton_hash for r in cold.results]
    assert all(r.compiled for r in cold.results) and len(set(hashes)) == len(hashes)
    assert all(0 <= r.shared_bytes <= gpu_target.H100_PROPERTIES["max_shared_mem"] for r in cold.results)
    assert {launch.kernel for launch in cold.planned} >= {"chunk_fwd_kernel_o", "chunk_fwd_kernel_h"}
    o_launches = [_o_key_and_config(x) for x in cold.planned if x.kernel == "chunk_fwd_kernel_o"]
    assert [config for key, config in o_launches if key == FORWARD_O_KEY] == [(64, 64, 4, 1)], o_launches
    assert len(o_launches) > 1 and all(config[3] != 1 for key, config in o_launches if key != FORWARD_O_KEY)

    warm = fla_compile.precompile(cases, jobs=2, on_gpu=False, path_first=triton36)
    assert [x.ident for x in warm.planned] == [x.ident for x in cold.planned]
    assert warm.compiled == [] and [r.triton_hash for r in warm.results] == hashes
