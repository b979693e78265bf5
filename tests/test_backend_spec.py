"""The typed backend spec: one parser, its refusals, what it carries into records and repro;
the mutants' import order; run_cases leaves its config alone."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from cases import Case
from parity.cli import main
from parity.execute.backends import BackendSpec, SpecError, parse_backend_spec, parse_specs
from parity.execute.runner import RunConfig, run_cases
from parity.model.spec import REFERENCE
from parity.records import repro_command

from .helpers import SMALL


@pytest.mark.parametrize(
    "text, name, side, kind, implementation",
    [
        ("oracle", "oracle", "oracle", "oracle", "references (float64, chunked; the recurrence defines it)"),
        ("fla", "fla", "reference", "fla", "fla.ops chunk kernels (Triton)"),
        ("pallas-fused", "pallas-fused", "candidate", "kernels_jax", "kernels_jax fused kernels"),
        ("mutant:zero-dg-gamma", "mutant-zero-dg-gamma", "candidate", "mutant", "zero-dg-gamma"),
        ("mine=pallas:my_pkg.ops:chunk_gla", "mine", "candidate", "candidate-pallas", "my_pkg.ops:chunk_gla"),
        ("t=torch:m:f", "t", "candidate", "candidate-torch", "m:f"),
    ],
)
def test_each_form_parses_to_its_fields(text, name, side, kind, implementation):
    spec = parse_backend_spec(text)
    assert (spec.text, spec.name, spec.side, spec.kind, spec.implementation) == (text, name, side, kind, implementation)
    assert spec.runs_on and ("interpret" in spec.runs_on or kind in ("oracle", "fla", "candidate-torch"))
    assert dataclasses.is_dataclass(spec) and spec == parse_backend_spec(text)  # frozen, comparable
    assert REFERENCE == "fla"


def test_the_repro_command_reruns_the_same_spec_beside_the_reference():
    """With the reference (fla) the command's own gate judges the bound again; each repro its own directory."""
    assert repro_command("X", parse_backend_spec("mine=jax:m:f")).endswith(
        "--case X --backends oracle,fla --candidate mine=jax:m:f --out repro/mine/X"
    )
    assert "--backends oracle,fla,mutant:zero-dg-gamma " in repro_command("X", "mutant:zero-dg-gamma")
    assert "--backends oracle,fla --out" in repro_command("X", "fla")
    assert "--backends oracle --out" in repro_command("X", "oracle")
    assert "--seeds" not in repro_command("X", "pallas", (3, 64))  # the default policy
    assert "--backends oracle,fla,pallas --seeds 2:8 --out" in repro_command("X", "pallas", (2, 8))


@pytest.mark.parametrize(
    "text, says",
    [
        ("flax", "expected one of ['oracle', 'fla', 'pallas', 'pallas-fused'], mutant:NAME, noise:REL, or a candidate"),
        ("mutant:nope", "expected mutant:NAME with NAME one of"),
        ("mine=cuda:m:f", "FRAMEWORK 'cuda' is not one of ['jax', 'pallas', 'torch']"),
        ("../x=jax:m:f", "NAME '../x' is not allowed"),
        ("fla=jax:m:f", "taken by a built-in backend"),
        ("mutant-x=jax:m:f", "taken by a built-in backend"),
        ("mine=jax:m", "expected NAME=FRAMEWORK:MODULE:FUNCTION"),
    ],
)
def test_bad_specs_are_refused_naming_the_spec(text, says, capsys, tmp_path):
    """parse_specs refuses: the spec's form is parse_backend_spec's (the model), whether a mutant
    exists is the catalogue's (parity.mutants, a layer above the model)."""
    with pytest.raises(SpecError) as e:
        parse_specs([text])
    assert says in str(e.value) and "\n" not in str(e.value)
    flag = ["--candidate", text] if "=" in text else ["--backends", f"oracle,{text}"]
    assert main(["run", "--case", SMALL.id, *flag, "--out", str(tmp_path / "out")]) == 2
    assert says in capsys.readouterr().err


def test_repro_runs_kda_at_the_chunk_size_the_harness_ran_on_every_backend(tmp_path):
    """The bug: repro passed chunk_size to FLA for simple_gla only, so a kda C32 case reran FLA at 64."""
    from parity.repro import write_repro

    case = Case("kda", 1, 64, 1, 64, 64, chunk_size=32, direction="fwd")
    for spec in ("fla", "pallas", "mine=jax:tests.spec_candidates:kda_with_chunk"):
        script = write_repro(case, spec, tmp_path / spec.split("=")[0]).read_text()
        assert ", chunk_size=32),\n" in script, spec
    gla = Case("gla", 1, 64, 1, 64, 64, chunk_size=32, direction="fwd")  # chunk_gla takes no chunk size
    assert "chunk_size=" not in write_repro(gla, "fla", tmp_path / "gla").read_text()
    with pytest.raises(ValueError, match="not a standalone kernel"):
        write_repro(case, "mutant:kda-beta-keys-only", tmp_path / "m")


def test_run_cases_does_not_change_its_config(tmp_path):
    cfg = RunConfig(
        out_dir=str(tmp_path), backends=["scan=jax:tests.example_candidates:recurrent_scan"], progress=False
    )
    before = dataclasses.replace(cfg)
    summary = run_cases([SMALL], cfg)
    assert cfg == before and cfg.run_id == "" and isinstance(cfg.out_dir, str)
    assert summary["backends"] == ["oracle", "scan=jax:tests.example_candidates:recurrent_scan"]
    assert {r["backend"] for r in summary["results"]} == {"oracle", "scan"}


def test_the_mutant_catalogue_and_backend_import_no_runner():
    """The old circle backends -> mutants -> runner -> backends is gone: the catalogue imports
    nothing of the harness but the model, the mutant backend no runner."""
    code = (
        "import sys; import parity.mutants; a = sorted(m for m in sys.modules if m.startswith('parity.'));"
        "import parity.execute.backends.mutant; b = 'parity.execute.runner' in sys.modules; print(a, b)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    model = "'parity.model', 'parity.model.host', 'parity.model.kernels', 'parity.model.option_error', "
    model += "'parity.model.spec'"
    assert out.strip() == f"[{model}, 'parity.mutants', 'parity.mutants.catalogue', 'parity.mutants.narrow'] False", out


def test_a_spec_is_a_value_the_runner_accepts_as_given(tmp_path):
    spec = BackendSpec(
        "scan=jax:tests.example_candidates:recurrent_scan",
        "scan",
        "candidate",
        "candidate-jax",
        "tests.example_candidates:recurrent_scan",
        "test",
    )
    summary = run_cases([SMALL], RunConfig(out_dir=tmp_path, backends=[spec], progress=False))
    assert [r["verdict"] for r in summary["results"] if r["backend"] == "scan"] == ["pass"]
    # the records have the typed shapes records.py declares (no field outside them)
    from parity.records import ResultRecord, TensorMetrics, load_latest

    for rec in load_latest([tmp_path])[SMALL.id].values():
        assert set(rec) <= set(ResultRecord.__annotations__), set(rec) - set(ResultRecord.__annotations__)
        for t in rec["tensors"].values():
            assert set(t) <= set(TensorMetrics.__annotations__), set(t) - set(TensorMetrics.__annotations__)
