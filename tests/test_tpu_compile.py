"""The TPU compile check (parity.execute.tpu_compile): the real TPU compiler on this CPU machine."""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cases import Case, get_suite
from parity.cli import main
from parity.cli.compile import compile_suite
from parity.execute import compile_log, mosaic_llo, tpu_compile
from parity.model import targets
from tests.helpers import requires_libtpu

BF16 = "simple_gla-fwd-B1-T64-H2-K64-V64-bf16-C64-g_logsig"

LLO_V5E = """module attributes {stable_mosaic.version = 15 : i64} {
  func.func @my_kernel(%arg0: i32 {llo.type = i32}, %arg1: i32 {llo.type = memref<1x64x64xf32, #tpu.tiled<(8,128),[8,1,1]>, #tpu.memory_space<vmem>>}, %arg2: i32 {llo.type = memref<2xi32, #tpu.tiled<(128),[1]>, #tpu.memory_space<smem>>}, %arg3: i32 {llo.type = memref<64x8xbf16, #tpu.tiled<(16,128),[1,1]>, #tpu.memory_space<vmem>>}) attributes {dimension_semantics = []} {
    "llo.vdwg"() <{mxu_id = 0 : i32}> : () -> ()
    %1 = "llo.vmatmul"(%0) <{data_format = #llo.matmul_data_format<f32>, dwg = false, lmr_hint = false, mode = #llo.matmul_mode<round>, mxu_id = 0 : i32}> : (vector<8x128xf32>) -> ()
    %2 = "llo.vmatmul.mubr"(%0) <{data_format = #llo.matmul_data_format<bf16>, dwg = false, lmr_hint = false, mode = #llo.matmul_mode<round>, mxu_id = 0 : i32}> : (vector<8x128xf32>) -> ()
    %3 = "llo.vmatmul"(%0) <{data_format = #llo.matmul_data_format<f32>, dwg = false, lmr_hint = false, mode = #llo.matmul_mode<soft_low_eight>, mxu_id = 0 : i32}> : (vector<8x128xf32>) -> ()
  }
}"""


def test_parse_llo_reads_kernel_vmem_and_matmul_classes():
    name, info = mosaic_llo.parse_llo(LLO_V5E)
    assert name == "my_kernel"
    # f32 [1, 64, 64] padded to (8, 128) tiles: 64 x 128 x 4; bf16 [64, 8] padded to (16, 128): 64 x 128 x 2
    assert info["vmem_bytes"] == 64 * 128 * 4 + 64 * 128 * 2
    assert info["weight_loads"] == 1
    assert info["matmuls"] == {"bf16": 1, "f32x1": 1, "f32x6": 1}


def test_unknown_llo_format_is_an_error_not_a_pass():
    with pytest.raises(mosaic_llo.LloFormatError):
        mosaic_llo.parse_llo(LLO_V5E.replace("matmul_mode<round>", "matmul_mode<warp>"))
    with pytest.raises(mosaic_llo.LloFormatError):
        mosaic_llo.parse_llo(LLO_V5E.replace("data_format", "format"))
    check = mosaic_llo.numerics_check({"k": {"f32x1": 2}}, {"k": {"matmuls": {"f32x6": 12}}})
    assert check["mismatches"] and not check["kernels"]["k"]["agree"]


def test_targets_are_validated():
    with pytest.raises(ValueError, match="'v9' is not a target"):
        targets.parse_targets("v5e,v9")
    assert targets.parse_targets("none") == ()


@requires_libtpu
def test_planted_non_compiling_candidate_fails_with_target_and_mosaic_message(tmp_path, capsys):
    spec = "bad=pallas:tests.tpu_candidates:bf16_fp32_contract"
    assert (
        main(
            [
                "compile",
                "--case",
                BF16,
                "--candidate",
                spec,
                "--backends",
                "pallas",
                "--tpu-targets",
                "v5e,tpu7x",
                "--out",
                str(tmp_path),
            ]
        )
        == 1
    )
    out = capsys.readouterr().out
    assert "[pallas] pass" in out  # the shipped kernel compiles
    assert "v5e (TPU v5 lite): INTERNAL: Mosaic failed to compile TPU kernel: Bad lhs type" in out
    assert "tpu7x (TPU7x)" in out and "tpu.matmul" in out
    rec = json.loads((tmp_path / "bad" / f"{BF16}.compile.json").read_text())
    assert rec["verdict"] == "compile-error" and "contract_precision<fp32>" in rec["targets"]["v5e"]["error_op"]
    assert main(["gate", str(tmp_path)]) == 1
    gate = capsys.readouterr().out
    assert "FAIL" in gate and "[bad] compile-error: v5e (TPU v5 lite)" in gate and "Bad lhs type" in gate


@requires_libtpu
def test_pallas_candidate_without_mosaic_kernel_is_reported(tmp_path):
    case = Case.from_id("simple_gla-fwd-B1-T64-H1-K64-V64-fp32-C64-g_logsig")
    from tests.tpu_candidates import interpret_left_on

    r = tpu_compile.compile_case(interpret_left_on, case, "v5e")
    assert not r["ok"] and "no Mosaic kernel" in r["error"] and r["kernels"] == []
    assert "TPU interpret mode left on, not a Mosaic kernel" in r["error"] and "simple_gla_chunk_fwd_h" in r["error"]
    assert {p["as_written"] for p in r["pallas"]["kernels"]} == {"tpu-interpret"}
    # as plain jax (not a Pallas kernel) the same program is fine: XLA code may hold no kernel
    assert tpu_compile.compile_case(interpret_left_on, case, "v5e", expect_mosaic=False)["ok"]


CACHE_PROBE = """
import json, os, pathlib, sys
import jax, jax.numpy as jnp
from cases import Case
from parity.execute import tpu_compile
from tests import tpu_candidates

entries = lambda: len(list(pathlib.Path(os.environ["JAX_COMPILATION_CACHE_DIR"]).glob("*")))
jax.jit(lambda x: x + 1)(jnp.ones(3))  # an XLA:CPU program first: jax decides it uses the cache
counts = [entries()]
case = Case.from_id("simple_gla-fwd-B1-T64-H1-K64-V64-fp32-C64-g_logsig")
ok = tpu_compile.compile_case(tpu_candidates.sign_1d, case, "v5e")["ok"]
counts.append(entries())
jax.jit(lambda x: x * 3)(jnp.ones(3))
counts.append(entries())
print(json.dumps({"ok": ok, "entries": counts}))
"""


def test_the_mosaic_dump_directory_made_for_a_process_goes_with_it():
    """Each process that compiles for TPU gets a temporary --xla_mosaic_dump_to; it is removed at
    exit (otherwise they pile up in /tmp), and a child that inherits it leaves it alone."""
    import subprocess
    import sys

    code = (
        "import os, subprocess, sys\n"
        "from parity.execute import tpu_compile\n"
        "d = tpu_compile._dump_dir(); print(d, flush=True)\n"
        "subprocess.run([sys.executable, '-c', 'from parity.execute import tpu_compile; tpu_compile._dump_dir()'],"
        " check=True)\n"
        "assert d.is_dir()\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "LIBTPU_INIT_ARGS"}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    made = p.stdout.split()[0]
    assert "parity-mosaic-" in made and not os.path.exists(made)


@requires_libtpu
def test_tpu_compiles_stay_out_of_the_persistent_cache_and_cpu_programs_go_in(tmp_path):
    """With a run's persistent cache on (scripts/test.sh), a TPU compile writes nothing to it (a
    compile-only executable cannot be read back: jax warns and compiles again) and XLA:CPU
    programs before and after it are cached. In a fresh process: jax decides once per process
    whether it uses the cache."""
    import subprocess
    import sys

    env = {
        **os.environ,
        "JAX_COMPILATION_CACHE_DIR": str(tmp_path),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PLATFORMS": "cpu",
    }
    out = subprocess.run([sys.executable, "-c", CACHE_PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    probe = json.loads(out.stdout.strip().splitlines()[-1])
    before, after_tpu, after_cpu = probe["entries"]
    assert probe["ok"] and before >= 1, probe
    assert after_tpu == before, probe  # the TPU compile wrote no entry
    assert after_cpu > after_tpu, probe  # the cache still takes XLA:CPU programs
    assert "Error reading persistent compilation cache" not in out.stderr


@requires_libtpu
def test_interpret_compiles_use_the_elemental_emitter_and_tpu_compiles_do_not():
    """With most optimisations off (interpret mode, a test session), an XLA:CPU compile gets
    `xla_cpu_use_fusion_emitters` false (compile_log.install: the MLIR fusion emitters run a pass
    pipeline per fusion, and an interpret-mode kernel is hundreds of them); a caller's own value wins;
    at XLA's defaults, and for a TPU target always, the options are jax's own."""
    from jax._src import compiler

    compile_log.install()
    assert compile_log.interpret_effort().endswith("elemental IR emitter)")  # this XLA has the option
    cpu, tpu = jax.devices("cpu")[0].client, tpu_compile.device("v5e").client
    overrides = lambda backend, **kw: dict(
        compiler.get_compile_options(1, 1, backend=backend, **kw).env_option_overrides
    )
    with compile_log.optimisation(disabled=True):
        assert overrides(cpu) == {compile_log.EMITTER_OPTION: False}
        assert overrides(cpu, env_options_overrides={compile_log.EMITTER_OPTION: True}) == {
            compile_log.EMITTER_OPTION: True
        }
        assert overrides(tpu) == {}
        assert float(jax.jit(lambda x: jnp.exp(x) * 2)(jnp.float32(1.0))) == pytest.approx(2 * np.e, rel=1e-6)
    with compile_log.optimisation(disabled=False):
        assert overrides(cpu) == {}


def _suite_parts():
    """(suite, target, case id) parts CI compiles: every suite on v5e, full (realistic shapes) on
    every default target, its stage cases on v5e (the stages suite is compiled on v5e by the
    interpret pass); one test per case and target, so that parallel workers share the load
    evenly (a compile takes 1 to 8 s; one test per op and target took up to 171 s)."""
    parts = [("full", t) for t in targets.DEFAULT_TARGETS] + [(s, "v5e") for s in ("smoke", "stability", "varlen")]
    return [(s, t, c.id) for s, t in parts for c in get_suite(s) if c.stage is None or t == "v5e"]


@requires_libtpu
@pytest.mark.parametrize("suite,target,case_id", _suite_parts(), ids=lambda x: str(x))
def test_kernels_compile_for_tpu(suite, target, case_id, tmp_path):
    """Every kernels_jax kernel (pallas, pallas-fused) compiles with the real TPU compiler for the
    target at every case of the suite, forward and backward, and its matmuls agree with the
    TPU numerics model. (The ci suite is compiled on v5e by the interpret pass, per case.)"""
    from parity.execute.backends.jax_backends import PallasBackend
    from parity.judge.gate import compile_problems

    case = Case.from_id(case_id)
    records = compile_suite([case], ["pallas", "pallas-fused"], (target,), tmp_path)
    bad = {r["backend"]: compile_problems(r) for r in records if r["verdict"] != "pass"}
    assert not bad, bad
    # one record for every candidate with a kernel for the case (V = 512 has none: unsupported, not compiled)
    expected = [s for s in ("pallas", "pallas-fused") if PallasBackend(s).applies_to_any([case])]
    assert sorted(r["backend"] for r in records) == sorted(expected)


def test_every_suite_case_has_a_pallas_kernel_to_compile_but_the_v512_ones():
    """The compile tests above check nothing for a case without a kernel: at most two op cases per
    suite (an op the pallas backend has no kernel for yet, gdn2 until kernels_jax/gdn2 is
    registered, aside), and the stage cases of those layers."""
    from parity.execute.backends.jax_backends import PallasBackend
    from parity.model.kernels import PALLAS_KERNELS

    for suite in ("full", "smoke", "stability", "varlen"):
        cases = [c for c in get_suite(suite) if c.op in PALLAS_KERNELS["pallas"]]
        without = [c for c in cases if not PallasBackend("pallas").applies_to_any([c])]
        assert all("-V512-" in c.id for c in without), (suite, [c.id for c in without])
        assert len([c for c in without if c.stage is None]) <= 2, (suite, [c.id for c in without])


# ------------------------------------------------------------------ kernels that ask the TPU who it is
FWD = Case.from_id("simple_gla-fwd-B1-T64-H1-K64-V64-fp32-C64-g_logsig")
KINDS = {"v5e": "TPU v5 lite", "v6e": "TPU v6 lite", "tpu7x": "TPU7x"}


@requires_libtpu
@pytest.mark.parametrize("target", list(targets.DEFAULT_TARGETS))
def test_kernels_that_ask_the_tpu_who_it_is_compile_for_the_target(target):
    """jnp.sign and 1-D blocks (Mosaic's lowering asks get_tpu_info()) and a kernel choosing its
    block from pltpu.get_tpu_info() compile: the target's device is the default while compiling
    (with the CPU the default, the first fails: 'Unsupported TPU device kind: cpu')."""
    from jax.experimental.pallas import tpu as pltpu

    from tests import tpu_candidates

    r = tpu_compile.compile_case(tpu_candidates.sign_1d, FWD, target)
    assert r["ok"], r.get("error")
    assert "sign_1d" in r["kernels"] and r["default_device"] == f"tpu:{KINDS[target]} (compile-only)"
    with compile_log.optimisation(disabled=True):  # as in a test session or after an interpret-mode run
        r = tpu_compile.compile_case(tpu_candidates.tpu_info_block, FWD, target)
    assert r["ok"] and "tpu_info_block" in r["kernels"], r.get("error")
    seen = tpu_candidates.SEEN[-1]
    assert not seen["optimisations_off"]  # a TPU compile runs at the compiler's defaults, whatever is set outside
    assert not seen["cache_writes"]  # nor into jax's persistent cache (compile_log.for_tpu)
    assert seen["chip_version"] == {"v5e": "v5e", "v6e": "v6e", "tpu7x": "7x"}[target]
    assert seen["block"] == (128 if target == "v5e" else 256) and seen["is_tpu_device"]
    with pytest.raises(ValueError, match="Unsupported TPU device kind: cpu"):
        pltpu.get_tpu_info()  # the CPU is the default again


VMEM_MESSAGES = {
    "capacity": """RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space vmem. Used 96.00M of 64.00M vmem. Exceeded vmem capacity by 32.00M.

  Largest program allocations in vmem:

  1. Size: 48.00M
     Operator: op_name="jit(program)/jit(f)/my_kernel/pallas_call"
     Shape: u8[50331648]{0}
     Unpadded size: 48.00M
     Tag: input window allocation for operator input 0. The window shape is f32[12288,1024], while the full shape is f32[24576,1024]. The u8 shape/size shown above represents the raw byte size of this window in VMEM. This allocation has 2 buffering levels.
     XLA label: my_kernel.1 = custom-call(x.1), custom_call_target="tpu_custom_call"
     ==========================
""",
    "scoped": """RESOURCE_EXHAUSTED: E1001: CompileTimeScopedVmemOom:
Ran out of memory in memory space vmem while allocating on stack for %my_kernel.1 = f32[8192,1024]{1,0:T(8,128)} custom-call(%x.1), custom_call_target="tpu_custom_call", metadata={op_name="jit(f)/my_kernel/pallas_call" stack_frame_id=2}. Scoped allocation with size 64.00M and limit 16.00M exceeded scoped vmem limit by 48.00M.""",
    "allocation": """RESOURCE_EXHAUSTED: Allocation (size=209715200) would exceed memory (size=134217728) :: #allocation2 [shape = 'f32[102400,512]{1,0:T(8,128)}', space=vmem, size = 0xc800000, scoped, tag = 'scratch operand'] :: my_kernel.1""",
}


def test_vmem_failure_reads_the_compilers_three_messages():
    mib = 1 << 20
    mosaic = {"my_kernel": {"vmem_bytes": 48 * mib}}
    r = mosaic_llo.vmem_failure(VMEM_MESSAGES["capacity"], mosaic, 64 * mib, "TPU7x")
    assert (r["kernel"], r["needed_bytes"], r["limit_bytes"], r["limit"], r["fits"]) == (
        "my_kernel",
        96 * mib,
        64 * mib,
        "capacity",
        False,
    )
    assert r["buffers"] == [
        {
            "kernel": "my_kernel",
            "bytes": 48 * mib,
            "what": "input window allocation for operator input 0",
            "shape": "f32[12288,1024]",
            "buffering": 2,
        }
    ]
    assert r["mosaic_vmem_bytes"] == 48 * mib and "TPU7x has 64.00 MiB (get_tpu_info): does not fit" in r["summary"]
    r = mosaic_llo.vmem_failure(VMEM_MESSAGES["scoped"], {}, 128 * mib, "TPU v5 lite")
    assert (r["kernel"], r["needed_bytes"], r["limit_bytes"], r["limit"], r["fits"]) == (
        "my_kernel",
        64 * mib,
        16 * mib,
        "scoped limit",
        True,
    )
    assert r["mosaic_vmem_bytes"] is None and "fits: raise vmem_limit_bytes" in r["summary"]
    r = mosaic_llo.vmem_failure(VMEM_MESSAGES["allocation"], {}, 128 * mib)
    assert r["buffers"] == [
        {"kernel": "my_kernel", "bytes": 200 * mib, "what": "scratch operand", "shape": "f32[102400,512]"}
    ]
    assert r["needed_bytes"] == 200 * mib and r["fits"] is False
    unknown = mosaic_llo.vmem_failure("RESOURCE_EXHAUSTED: out of vmem, somehow", {"k": {"vmem_bytes": 1}}, 1)
    assert unknown["fits"] is None and unknown["kernel"] == "k" and "does not know" in unknown["summary"]
    assert all(mosaic_llo.is_vmem_error(m) for m in VMEM_MESSAGES.values())


@requires_libtpu
def test_a_kernel_asking_for_more_vmem_than_v5e_has_is_named_with_its_buffers(tmp_path, capsys):
    spec = "hog=pallas:tests.tpu_candidates:vmem_hog"
    argv = ["compile", "--case", FWD.id, "--candidate", spec, "--tpu-targets", "v5e"]
    assert main([*argv, "--out", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "[VMEM: kernel vmem_hog needs 200.00 MiB of VMEM" in out and "does not fit" in out
    rec = json.loads((tmp_path / "hog" / f"{FWD.id}.compile.json").read_text())
    # a --candidate compiles alone (no built-in kernels), and its repro does the same into this directory
    assert not (tmp_path / "pallas").exists() and "--backends" not in rec["repro"]
    assert rec["repro"].endswith(f"--candidate {spec} --tpu-targets v5e --out {tmp_path}")
    v5e = rec["targets"]["v5e"]
    assert not v5e["ok"] and v5e["default_device"] == "tpu:TPU v5 lite (compile-only)"
    vmem = v5e["vmem"]
    assert vmem["kernel"] == "vmem_hog" and vmem["fits"] is False and vmem["limit"] == "capacity"
    assert vmem["capacity_bytes"] == 128 << 20 and vmem["needed_bytes"] == 200 << 20
    assert vmem["buffers"][0]["what"] == "scratch operand" and vmem["buffers"][0]["shape"] == "f32[102400,512]"
    assert vmem["mosaic_vmem_bytes"] >= 200 << 20  # Mosaic's dump: the scratch and the (8, 512) blocks


@requires_libtpu
def test_a_kernel_over_the_scoped_vmem_limit_fits_v6e_but_not_tpu7x():
    from tests import tpu_candidates

    v6e = tpu_compile.compile_case(tpu_candidates.vmem_scoped, FWD, "v6e")["vmem"]
    assert (v6e["kernel"], v6e["limit"], v6e["fits"], v6e["capacity_bytes"]) == (
        "vmem_scoped",
        "scoped limit",
        True,
        128 << 20,
    )
    tpu7x = tpu_compile.compile_case(tpu_candidates.vmem_scoped, FWD, "tpu7x")["vmem"]
    assert (tpu7x["limit"], tpu7x["fits"], tpu7x["capacity_bytes"]) == ("capacity", False, 64 << 20)
    assert {b["what"] for b in tpu7x["buffers"]} == {
        "input window allocation for operator input 0",
        "output window allocation for operator output 0",
    }


@requires_libtpu
def test_gate_refuses_a_missing_compile_record(tmp_path, capsys):
    case = "simple_gla-fwd-B1-T64-H1-K64-V64-fp32-C64-gamma_alibi"
    assert main(["compile", "--case", case, "--tpu-targets", "v5e", "--out", str(tmp_path)]) == 0
    assert main(["gate", str(tmp_path)]) == 0  # pallas and pallas-fused compiled
    assert "TPU compile (on this host, nothing executed): 2 case/candidate pairs, 2 ok" in capsys.readouterr().out
    (tmp_path / "pallas-fused" / f"{case}.compile.json").unlink()
    assert main(["gate", str(tmp_path)]) == 2
    assert f"{case} [pallas-fused] TPU compile" in capsys.readouterr().err


@requires_libtpu
def test_a_compile_record_whose_verdict_its_targets_contradict_is_refused(tmp_path, capsys):
    """The gate and the page trust a compile record's verdict; the reader holds it to its targets."""
    spec = "bad=pallas:tests.tpu_candidates:bf16_fp32_contract"
    assert (
        main(
            [
                "compile",
                "--case",
                BF16,
                "--candidate",
                spec,
                "--backends",
                "pallas",
                "--tpu-targets",
                "v5e",
                "--out",
                str(tmp_path),
            ]
        )
        == 1
    )
    path = tmp_path / "bad" / f"{BF16}.compile.json"
    rec = json.loads(path.read_text())
    path.write_text(json.dumps({**rec, "verdict": "pass"}))  # claims a pass over a failed target
    capsys.readouterr()
    assert main(["gate", str(tmp_path)]) == 2
    assert "field verdict='pass' is invalid: expected 'compile-error'" in capsys.readouterr().err


# ------------------------------------------------------------------ dots the compiler keeps off the MXU
def _rows_dots(target):
    """compile_case's result for a program of two Pallas kernels: rows_dot(1) and rows_dot(8)."""
    import jax.numpy as jnp

    from tests.tpu_candidates import rows_dot

    def fn(q, k, v, **kw):
        x = jnp.ones((8, 128), jnp.float32) * q[0, 0, 0, 0].astype(jnp.float32)  # keeps q in the program
        total = rows_dot(1)(x, jnp.ones((1, 128))).sum() + rows_dot(8)(x, jnp.ones((8, 128))).sum()
        return total * jnp.ones_like(v), None

    return tpu_compile.compile_case(fn, FWD, target)


@requires_libtpu
@pytest.mark.parametrize("target", list(targets.DEFAULT_TARGETS))
def test_a_dot_the_compiler_keeps_on_the_vector_unit_is_decided_from_the_compile(target):
    """x [8, 128] against one row y [1, 128] (x @ y.T, float32 DEFAULT) compiles to no MXU matmul
    (the vector unit, float32); against 8 rows, to float32 MXU passes. The check decides the
    first kernel's f32x1 dots are on the vector unit and agrees on both; a kernel whose
    compiled MXU class the model has no dot of still disagrees."""
    r = _rows_dots(target)
    assert r["ok"], r.get("error")
    assert r["mosaic"]["rows_dot_1"]["matmuls"] == {}, r["mosaic"]
    assert set(r["mosaic"]["rows_dot_8"]["matmuls"]) == {"f32x1"}, r["mosaic"]
    check = r["numerics"]
    assert check["vector_unit"] == {"rows_dot_1": ["f32x1"]} and not check["mismatches"], check
    assert check["kernels"]["rows_dot_1"]["vector_unit"] == ["f32x1"] and check["kernels"]["rows_dot_8"]["agree"]
    model = {"rows_dot_1": {"f32x1": 1}, "rows_dot_8": {"bf16": 1}}  # the model computing it in bf16: wrong
    wrong = mosaic_llo.numerics_check(model, r["mosaic"])
    assert wrong["mismatches"] == [
        "rows_dot_8: model ['bf16'], compiled ['f32x1'] (compiled ['f32x1'] that the model has no dot of)"
    ]


def test_kernels_are_named_as_mosaic_names_them_not_by_their_index_maps():
    """Mosaic quotes a kernel name that is not an MLIR identifier; the kernel is the module's first
    function, its index maps (transform_0, ...) follow: the matmuls are the kernel's."""
    text = LLO_V5E.replace("func.func @my_kernel(", 'func.func @"decoding_gdn-bt_8"(') + (
        "\n  func.func @transform_0(%arg0: i32) -> (i32, i32) {\n  }"
    )
    name, info = mosaic_llo.parse_llo(text)
    assert name == "decoding_gdn-bt_8" and info["matmuls"] == {"bf16": 1, "f32x1": 1, "f32x6": 1}
    check = mosaic_llo.numerics_check({"decoding_gdn-bt_8": {"f32x1": 4}}, {name: info})
    assert check["mismatches"] == [
        "decoding_gdn-bt_8: model ['f32x1'], compiled ['bf16', 'f32x1', 'f32x6'] "
        "(compiled ['bf16', 'f32x6'] that the model has no dot of)"
    ]
    one_side = mosaic_llo.numerics_check({"k": {"f32x1": 1}}, {"transform_0": {"matmuls": {"f32x1": 1}}})
    assert sorted(one_side["mismatches"]) == [
        "k: model ['f32x1'], compiled no MXU matmul (no compiled Mosaic kernel of this name)",
        "transform_0: model no dots, compiled ['f32x1'] (no Pallas kernel of this name in the program)",
    ]


@requires_libtpu
def test_a_candidate_runs_with_the_decision_of_its_compile_and_its_record_says_so(tmp_path, monkeypatch):
    """parity run compiles a jax candidate before running it: rows_dot_1 (the vector unit on v5e)
    is computed in float32 in interpret mode, and the record names the kernel and the compile;
    without TPU targets, every dot on the MXU, said as such."""
    from parity.execute import tpu_identity
    from tests.helpers import run

    monkeypatch.setenv(tpu_identity.ENV, "v5e")  # interpret mode emulates v5e, whatever ran before
    monkeypatch.setenv(tpu_identity.SOURCE_ENV, "--tpu-interpret-as")

    spec = "vpu=pallas:tests.tpu_candidates:vpu_dot"
    run([FWD], ["oracle", spec], tmp_path / "v5e", tpu_targets=("v5e",))
    rec = json.loads((tmp_path / "v5e" / "vpu" / f"{FWD.id}.json").read_text())
    decided = rec["notes"]["tpu_numerics"]
    assert decided["vector_unit"] == {"rows_dot_1": ["f32x1"]}, (decided, rec["notes"])
    assert decided["source"].startswith("compile for v5e (TPU v5 lite, libtpu ")
    assert rec["status"] == "ok" and rec["notes"]["tpu_identity"]["emulated"] == "v5e"
    crec = json.loads((tmp_path / "v5e" / "vpu" / f"{FWD.id}.compile.json").read_text())
    assert crec["targets"]["v5e"]["numerics"]["vector_unit"] == {"rows_dot_1": ["f32x1"]}
    run([FWD], ["oracle", spec], tmp_path / "none", tpu_targets=())
    rec = json.loads((tmp_path / "none" / "vpu" / f"{FWD.id}.json").read_text())
    assert rec["notes"]["tpu_numerics"]["vector_unit"] == {} and rec["notes"]["tpu_numerics"]["source"].startswith(
        "none: no compile"
    )


@requires_libtpu
@pytest.mark.parametrize(
    "program,dtype",
    [
        ("flash_attention-bwd", "float32"),
        ("splash_attention", "bfloat16"),
        ("megablox_gmm", "bfloat16"),
        ("tpu_inference-gdn_v1-decode", "float32"),
        ("tpu_inference-gdn_v2", "float32"),
    ],
)
def test_the_model_agrees_with_the_compiled_module_on_kernels_no_one_here_wrote(program, dtype):
    """A few of benchmarks/numerics_corpus.py's programs (jax's own Pallas TPU kernels and
    tpu-inference's GDN kernels, whose names Mosaic quotes) compiled for v5e: every Pallas kernel
    in the program is found in the compiled module under its name and the model agrees with it."""
    from benchmarks.numerics_corpus import compile_one

    r = compile_one(program, dtype, "v5e")
    assert "skipped" not in r, r  # tpu-inference is installed by scripts/env.sh
    assert r["ok"], r.get("error_line")
    check = r["numerics"]
    assert check["kernels"] and not check["mismatches"], check
    assert all(k["compiled"] for n, k in check["kernels"].items() if k["model"]), check  # dots on the MXU
