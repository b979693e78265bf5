"""Stage cases (cases.stages): ids, inputs, the calling convention of stage candidates, the
shapes and dtypes a stage's outputs are held to, and `parity localise` naming the stage of a
planted bug."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import types

import numpy as np
import pytest

from cases import Case, CaseError, get_suite, make_inputs
from cases.stages import STAGE_OP, STAGES, resolve, stage_dtype, stage_input_names, stage_shapes
from cases.suites import stage_cases
from parity.cli import main
from parity.execute.backends import parse_backend_spec
from parity.execute.backends.base import check_tensors
from parity.execute.backends.calling import candidate_function
from parity.html.rows import what_ran
from parity.model.inputs import case_inputs
from parity.model.spec import Unsupported
from tests.helpers import requires_libtpu

FWD_H = Case.from_id("simple_gla:fwd_h-fwd-B1-T100-H2-K64-V64-bf16-C32-g_logsig-h0-ht-lens37_1_62")


def test_every_stage_case_of_the_registry_round_trips_through_its_id_and_dict():
    cases = get_suite("stages") + [c for c in get_suite("full") if c.stage]
    for op, stages in STAGES.items():  # every stage of every op with stages is in the stages suite
        assert {c.stage for c in get_suite("stages") if c.op == op} == set(stages), op
    for c in cases:
        assert Case.from_id(c.id) == c and Case.from_dict(json.loads(json.dumps(c.to_dict()))) == c
        assert c.id.startswith(f"{c.op}:{c.stage}-fwd-")
    assert "stage" not in Case.from_id("simple_gla-fwd-B1-T64-H1-K64-V64-fp32-C64-g_logsig").to_dict()


def test_every_stage_record_names_its_oracle_and_kernels_jax_function_by_a_resolvable_path():
    """Each record's oracle and kernels_jax "module:function" (and its op's input builder) resolve
    to a callable of that name; kernels_jax's function has FLA's name (a stage candidate's)."""
    for op, stage_op in STAGE_OP.items():
        assert stage_op.stages and all(s.op == op for s in stage_op.stages)
        for where in [stage_op.inputs, *(w for s in stage_op.stages for w in (s.oracle, s.kernels_jax))]:
            fn = resolve(where)
            assert callable(fn) and fn.__name__ == where.rpartition(":")[2], where
        for s in stage_op.stages:
            assert s.kernels_jax.rpartition(":")[2] == s.function, s.kind
            assert s.kernels_jax.startswith(f"kernels_jax.{op}."), s.kind


@pytest.mark.parametrize(
    "case_id,field",
    [
        ("simple_gla:fwd_x-fwd-B1-T64-H1-K64-V64-fp32-C64-g_logsig", "Case.stage='fwd_x'"),
        ("simple_gla:fwd_h-fwdbwd-B1-T64-H1-K64-V64-fp32-C64-g_logsig", "Case.direction='fwdbwd'"),
        ("simple_gla:local_cumsum-fwd-B1-T64-H1-K64-V64-fp32-C64-gamma_alibi", "Case.gate='gamma_alibi'"),
        ("gdn2:fwd_h-fwd-B1-T64-H1-K64-V64-fp32-C64-g_logsig", "Case.stage='fwd_h'"),
    ],
)
def test_a_bad_stage_case_is_refused_naming_its_field(case_id, field):
    with pytest.raises(CaseError, match=field.replace("(", r"\(")):
        Case.from_id(case_id)


def test_stage_cases_of_an_op_case_follow_its_direction_and_gate():
    fwd = Case.from_id("simple_gla-fwd-B1-T64-H1-K64-V64-fp32-C64-g_logsig")
    assert [c.stage for c in stage_cases(fwd)] == ["local_cumsum", "fwd_h", "fwd_o"]
    both = fwd.replace(direction="fwdbwd", gate="gamma_alibi")
    assert [c.stage for c in stage_cases(both)] == ["fwd_h", "fwd_o", "bwd_dh", "bwd_dv", "bwd_dqkwg"]
    assert all(c.op_case == both.replace(direction=c.op_case.direction) for c in stage_cases(both))


def test_a_run_of_a_kda_chunk_128_case_writes_its_page_and_exits_with_its_gate(tmp_path, capsys):
    """The page looked for stage cases of every op case, and kda has none at chunk 128: `parity
    run` printed gate: PASS, then exited 2 without a page."""
    out = tmp_path / "run"
    argv = ["run", "--case", "kda-fwd-B1-T64-H1-K32-V32-fp32-C128-g_logsig", "--backends", "oracle,fla,pallas"]
    rc = main([*argv, "--tpu-targets", "none", "--out", str(out), "--no-progress"])
    text = capsys.readouterr().out
    assert rc == 0 and "gate: PASS" in text and (out / "index.html").is_file(), text


def test_docs_stage_signatures_are_written_from_the_registry():
    """docs/stages.md's table of every stage's call and outputs is what the registry says
    (python -m cases.stage_signatures rewrites it), e.g. chunk_bwd_dqkwg's four outputs."""
    from cases import stage_signatures as signatures

    text = signatures.DOC.read_text()
    assert signatures.rewritten(text) == text, "run `python -m cases.stage_signatures` and commit docs/stages.md"
    rows = [line for line in signatures.markdown().splitlines() if line.startswith("| `")]
    assert len(rows) == sum(len(s) for s in STAGES.values())
    row = signatures.stage_row("simple_gla", "bwd_dqkwg")
    assert "dk [B, T, H, K] time, the case dtype; dw: None (no such tensor in simple_gla); dg [B, T, H] time" in row


def test_stage_cases_are_made_only_for_the_stages_that_exist_for_the_case():
    """FLA's kda stages take chunk 32 or 64 (its op runs a 128 case at 64): a C128 kda op case has
    no stage cases, so its page and `parity localise` look for none (they exited 2 on it); gdn's
    stages take up to 64 likewise, simple_gla's take 128."""
    assert stage_cases(Case.from_id("kda-fwdbwd-B1-T100-H2-K64-V64-fp32-C128-g_logsig-h0")) == []
    assert len(stage_cases(Case.from_id("kda-fwdbwd-B1-T100-H2-K64-V64-fp32-C64-g_logsig-h0"))) == 8
    assert stage_cases(Case.from_id("gdn-fwd-B1-T100-H2-K64-V64-fp32-C128-g_logsig")) == []
    assert len(stage_cases(Case.from_id("simple_gla-fwd-B1-T100-H2-K64-V64-fp32-C128-g_logsig"))) == 3


def test_stage_inputs_are_the_registry_shapes_and_dtypes_the_same_bytes_every_time():
    with pytest.raises(CaseError, match="stage case"):
        make_inputs(FWD_H)
    a, b = case_inputs(FWD_H), case_inputs(FWD_H)
    assert sorted(a) == sorted([*stage_input_names(FWD_H), "cu_seqlens"]) == sorted(b)
    for name in stage_input_names(FWD_H):
        assert a[name].shape == stage_shapes(FWD_H)[name] and a[name].dtype.name == stage_dtype(FWD_H, name)
        assert a[name].tobytes() == b[name].tobytes()
    op = make_inputs(FWD_H.op_case)
    assert a["k"].tobytes() == op["k"].tobytes() and a["h0"].tobytes() == op["initial_state"].tobytes()


def test_a_stage_output_is_held_to_the_dtype_flas_stage_returns_it_in():
    shapes = stage_shapes(FWD_H)
    ht = np.zeros(shapes["ht"], np.float32)
    assert stage_dtype(FWD_H, "h") == "bfloat16"  # FLA's forward keeps the states in k's dtype
    with pytest.raises(ValueError, match="'h' has dtype float32, expected bfloat16"):
        check_tensors(FWD_H, {"h": np.zeros(shapes["h"], np.float32), "ht": ht})
    with pytest.raises(ValueError, match="'ht' has shape"):
        check_tensors(FWD_H, {"h": np.zeros(shapes["h"], np.float32), "ht": ht[:, :1]}, {}, False)


def _module(**functions):
    return types.SimpleNamespace(**functions)


def test_a_candidate_runs_the_stages_it_gives_and_declines_the_rest():
    def chunk_fwd_h(**kw):
        return kw

    def chunk_simple_gla(*a, **kw):
        return a

    fwd_o = FWD_H.replace(stage="fwd_o")
    op = FWD_H.op_case
    module = parse_backend_spec("port=jax:my_stages:*")
    assert candidate_function(_module(chunk_fwd_h=chunk_fwd_h), module, FWD_H) is chunk_fwd_h
    for case, spec, loaded, why in [
        (fwd_o, module, _module(chunk_fwd_h=chunk_fwd_h), "my_stages has no chunk_fwd_o"),
        (op, module, _module(chunk_fwd_h=chunk_fwd_h), "gives stages"),
        (fwd_o, parse_backend_spec("port=jax:my_stages:chunk_fwd_h"), chunk_fwd_h, "not chunk_fwd_o"),
        (FWD_H, parse_backend_spec("mine=jax:mine:chunk_simple_gla"), chunk_simple_gla, "not chunk_fwd_h"),
    ]:
        with pytest.raises(Unsupported, match=why):
            candidate_function(loaded, spec, case)
    assert candidate_function(chunk_simple_gla, parse_backend_spec("mine=jax:mine:chunk_simple_gla"), op)


@requires_libtpu
def test_localise_names_the_stage_a_planted_bug_lives_in(tmp_path, capsys):
    """scale-twice-intra scales fwd_o's intra-chunk scores twice: the op fails, local_cumsum and
    fwd_h pass, fwd_o is named with a repro of it alone."""
    case = "simple_gla-fwd-B1-T64-H2-K64-V64-fp32-C64-g_logsig"
    out = tmp_path / "loc"
    rc = main(["localise", case, "--candidate", "mutant:scale-twice-intra", "--out", str(out), "--no-progress"])
    text = capsys.readouterr().out
    assert rc == 1, text
    result = json.loads((out / "localise.json").read_text())
    assert [s["stage"] for s in result["stages"]] == ["local_cumsum", "fwd_h", "fwd_o"]
    assert result["op"]["verdict"] != "pass" and result["first"] == "fwd_o", text
    assert [s["verdict"] for s in result["stages"][:2]] == ["pass", "pass"]
    assert (
        "first stage that fails: fwd_o, fail-accuracy: over its bound" in text
        or "first stage that fails: fwd_o, fail-bound" in text
    )
    assert "parity run --case simple_gla:fwd_o-fwd-B1-T64-H2-K64-V64-fp32-C64-g_logsig" in text
    # the op case's page names the stage too
    page = [f.read_text() for f in (out / "index_files" / "cases").glob("*.js") if f'"id":"{case}"' in f.read_text()]
    assert len(page) == 1 and '"first":"fwd_o"' in page[0]


@requires_libtpu
def test_a_mixed_pallas_and_plain_jax_stage_module_is_judged_per_stage_and_the_compile_failure_named(tmp_path, capsys):
    """tests/mixed_stages.py under pallas:: its plain-JAX chunk_local_cumsum (framework "jax") is
    judged on its numbers and labelled XLA; its Pallas chunk_fwd_h passes; its chunk_fwd_o computes
    right but Mosaic rejects it: localise names fwd_o for the compile failure, and the compile's
    repro compiles that candidate alone into the run's directory."""
    case = "simple_gla-fwd-B1-T64-H1-K64-V64-bf16-C64-g_logsig"
    out = tmp_path / "loc"
    argv = ["localise", case, "--candidate", "mixed=pallas:tests.mixed_stages:chunk_simple_gla"]
    argv += ["--stages", "tests.mixed_stages", "--tpu-targets", "v5e", "--out", str(out), "--no-progress"]
    rc = main(argv)
    text = capsys.readouterr().out
    assert rc == 1, text
    result = json.loads((out / "localise.json").read_text())
    verdicts = {s["stage"]: s["verdict"] for s in result["stages"]}
    assert verdicts == {"local_cumsum": "pass", "fwd_h": "pass", "fwd_o": "compile-error"}, text
    assert result["first"] == "fwd_o" and result["not_judged"] == [], result
    assert "first stage that fails: fwd_o, compile-error: does not compile" in text
    fwd_o = next(s for s in result["stages"] if s["stage"] == "fwd_o")
    assert fwd_o["repro"].startswith("parity compile --case simple_gla:fwd_o-") and f"--out {out}" in fwd_o["repro"]
    assert "--backends" not in fwd_o["repro"]
    cumsum = json.loads(
        (out / "mixed.stages" / f"simple_gla:local_cumsum-{case[len('simple_gla-') :]}.json").read_text()
    )
    assert cumsum["notes"]["pallas"]["required"] is False and cumsum["verdict"] == "pass"
    assert what_ran(cumsum).startswith("plain JAX, compiled by XLA")


def test_the_repro_script_of_a_stage_case_calls_the_stage_and_judges_it(tmp_path, capsys):
    """parity repro on a stage case writes a script that runs kernels_jax's chunk_fwd_o through the
    harness's stage calling code (FLA's stage arguments) on the bundled inputs and prints the
    harness's verdict."""
    case = "simple_gla:fwd_o-fwd-B1-T100-H2-K64-V64-bf16-C64-g_logsig-lens37_63"
    assert main(["repro", case, "-o", str(tmp_path / "r"), "--no-reference"]) == 0
    p = subprocess.run([sys.executable, "repro.py"], cwd=tmp_path / "r", capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert re.search(r"^Kernel: +kernels_jax\.\S+\.chunk_fwd_o \(jax", (tmp_path / "r" / "repro.py").read_text(), re.M)
    assert re.search(r"  o +rel_rms \d", p.stdout) and "verdict: pass" in p.stdout, p.stdout


def test_localise_takes_a_users_stages_from_their_module_and_the_builtins_own():
    from parity.cli.localise import stage_spec
    from parity.model.options import OptionError

    assert stage_spec("pallas", None) == "pallas" and stage_spec("mutant:bf16-state", None) == "mutant:bf16-state"
    assert stage_spec("mine=jax:my.kernels:chunk_simple_gla", "my.stages") == "mine.stages=jax:my.stages:*"
    with pytest.raises(OptionError, match="stages"):
        stage_spec("mine=jax:my.kernels:chunk_simple_gla", None)
    with pytest.raises(OptionError, match="gives its own stages"):
        stage_spec("pallas", "my.stages")
    with pytest.raises(OptionError, match="candidate"):
        stage_spec("fla", None)
