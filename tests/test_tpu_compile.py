"""The TPU compile check (parity.execute.tpu_compile): the real TPU compiler on this CPU machine."""

from __future__ import annotations

import json

import pytest

from cases import Case, get_suite
from parity.cli import main
from parity.cli.compile import compile_suite
from parity.execute import mosaic_llo, tpu_compile
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
    # as plain jax (not a Pallas kernel) the same program is fine: XLA code may hold no kernel
    assert tpu_compile.compile_case(interpret_left_on, case, "v5e", expect_mosaic=False)["ok"]


def _suite_parts():
    """(suite, target, case id) parts CI compiles: every suite on v5e, full (realistic shapes) on
    every default target; one test per case and target, so that parallel workers share the load
    evenly (a compile takes 1 to 8 s; one test per op and target took up to 171 s)."""
    parts = [("full", t) for t in targets.DEFAULT_TARGETS] + [(s, "v5e") for s in ("smoke", "stability", "varlen")]
    return [(s, t, c.id) for s, t in parts for c in get_suite(s)]


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
    """The compile tests above check nothing for a case without a kernel: at most two per suite."""
    from parity.execute.backends.jax_backends import PallasBackend

    for suite in ("full", "smoke", "stability", "varlen"):
        cases = get_suite(suite)
        without = [c.id for c in cases if not PallasBackend("pallas").applies_to_any([c])]
        assert len(without) <= 2 and all("-V512-" in c for c in without), (suite, without)


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
