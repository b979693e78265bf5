"""The mutation suite: every mutant is caught on its witness case, where the unmutated
kernel passes the same gate; the score and the CLI's bad input."""

from __future__ import annotations

import dataclasses
import functools
import json
import shutil
from pathlib import Path

import pytest

from cases import Case
from parity.execute.case import build_backends, run_case
from parity.judge.gate import evaluate, load, load_compiles
from parity.measure import tpu_numerics
from parity.mutants import BUG_CLASSES, BY_NAME, CATALOGUE
from parity.mutants.catalogue import Patch
from parity.mutants.patched import PatchError, mutant_kernel, patched_module, patched_sources
from parity.mutation import MutantSchedule, format_score, run_mutants, score
from tests.helpers import requires_libtpu

KERNELS_JAX = Path(__file__).resolve().parents[1] / "kernels_jax"


@functools.cache
def _backends(spec: str):
    return build_backends([spec])[spec]


def _run(case: Case, specs: list[str], out, tpu_targets=("v5e",)):
    backends = {s: _backends(s) for s in ["oracle"] + specs}
    run_case(case, list(backends), backends, out, "test-mutants", tpu_targets=tpu_targets)
    return evaluate(load([out]), compiles=load_compiles([out]))


def _entry(gate, mutant):
    return next(e for e in gate["cases"] if e["candidate"] == f"mutant-{mutant.name}")


@requires_libtpu
@pytest.mark.parametrize("mutant", [m for m in CATALOGUE if not m.narrow], ids=lambda m: m.name)  # narrow: test_fuzz
def test_mutant_is_caught_on_its_witness_and_the_kernel_is_clean(mutant, tmp_path):
    """Each mutant through the interpreter and the TPU compile check (v5e), with the TPU numerics model."""
    case = Case.from_id(mutant.witness)
    gate = _run(case, ["fla", mutant.impl, f"mutant:{mutant.name}"], tmp_path)
    result = score(gate, [mutant])
    assert result["unmutated_failures"] == [], format_score(result)
    assert result["mutants"][0]["cases_run"] == 1
    assert result["caught"] == 1, format_score(result)
    entry = _entry(gate, mutant)
    if mutant.name in ("bf16-state", "f32-dots-default-precision"):  # accuracy only: the bound against FLA
        assert any(t["bound"] and not t["bound"]["ok"] for t in entry["tensors"].values()), entry
    if mutant.tpu_only:  # right numbers on CPU: only the compile check sees it
        assert entry["verdict"] == "compile-error", entry
        assert all(t["verdict"] == "pass" for t in entry["tensors"].values()), entry
    if mutant.name == "interpret-left-on":  # right numbers, but no TPU kernel as written: never passed
        assert entry["verdict"] == "error" and "TPU interpret mode left on" in entry["error"], entry
        assert all(t["verdict"] == "pass" for t in entry["tensors"].values()), entry


@pytest.mark.parametrize("name", [m.name for m in CATALOGUE if m.tpu_only])
def test_tpu_only_mutants_pass_interpret_mode_without_the_compile_check(name, tmp_path):
    mutant = BY_NAME[name]
    gate = _run(Case.from_id(mutant.witness), ["fla", f"mutant:{name}"], tmp_path, tpu_targets=())
    assert score(gate, [mutant])["caught"] == 0


def test_default_precision_mutant_is_caught_by_the_numerics_model_only(tmp_path):
    """Plain interpret mode computes DEFAULT float32 dots in float32: the mutant then looks
    more accurate than FLA. Under tpu-mxu-v1 (one bf16 pass, as a TPU) it fails the bound."""
    mutant = BY_NAME["f32-dots-default-precision"]
    with tpu_numerics.using("float32"):
        gate = _run(Case.from_id(mutant.witness), ["fla", f"mutant:{mutant.name}"], tmp_path / "f32", tpu_targets=())
    assert score(gate, [mutant])["caught"] == 0
    assert _entry(gate, mutant)["verdict"] == "pass"


def test_parallel_chunk_axis_names_its_hazard(tmp_path):
    mutant = BY_NAME["chunk-axis-parallel"]
    gate = _run(Case.from_id(mutant.witness), ["fla", f"mutant:{mutant.name}"], tmp_path, tpu_targets=())
    o = _entry(gate, mutant)["tensors"]["o"]
    assert o["verdict"] == "nan-inf"
    assert "'parallel'" in o["localisation"].get("hazard", ""), o["localisation"]


# ------------------------------------------------------------------ the patched copies of kernels_jax
@pytest.mark.parametrize("mutant", [m for m in CATALOGUE if m.patches], ids=lambda m: m.name)
def test_every_patch_applies_to_the_kernels_as_they_are(mutant):
    """A kernel edit that removes or repeats a planted spot fails here, naming the mutant."""
    sources = patched_sources(mutant)
    assert sorted(sources) == sorted({p.module for p in mutant.patches})
    for module, source in sources.items():
        assert source != (KERNELS_JAX.parent / (module.replace(".", "/") + ".py")).read_text()


def test_a_patch_whose_text_is_not_there_once_refuses_the_mutant():
    real = BY_NAME["kv-swapped-scale"]
    gone = dataclasses.replace(real, name="gone", patches=(Patch(real.patches[0].module, "K ** -0.75", "0"),))
    with pytest.raises(
        PatchError, match=r"mutant gone: the text it patches occurs 0 times in kernels_jax.common.valid"
    ):
        patched_sources(gone)
    twice = dataclasses.replace(real, name="twice", patches=(Patch("kernels_jax.common.validation", "scale", "s"),))
    with pytest.raises(PatchError, match="mutant twice: .* occurs [0-9]+ times"):
        patched_sources(twice)
    nowhere = dataclasses.replace(real, name="nowhere", patches=(Patch("kernels_jax.nowhere", "a", "b"),))
    with pytest.raises(PatchError, match="mutant nowhere: kernels_jax has no module kernels_jax.nowhere"):
        patched_sources(nowhere)


def test_the_copy_plants_the_bug_and_leaves_kernels_jax_alone():
    """kv-swapped-scale's copy takes the default scale from V; kernels_jax still takes it from K, and
    the modules the patch does not reach are the real ones."""
    import jax.numpy as jnp

    from kernels_jax.common import platform, validation

    mutant = BY_NAME["kv-swapped-scale"]
    q, v = jnp.zeros((1, 8, 1, 64)), jnp.zeros((1, 8, 1, 16))
    mutated = patched_module(mutant, "kernels_jax.common.validation")
    assert mutated is not validation and mutated.__name__ == "kernels_jax_mutant_kv_swapped_scale.common.validation"
    assert mutated.validate("simple_gla", q, q, v).scale == 16**-0.5
    assert validation.validate("simple_gla", q, q, v).scale == 64**-0.5
    assert patched_module(mutant, "kernels_jax.common.platform") is platform  # one compile_for_tpu flag
    fn = mutant_kernel(mutant, Case.from_id(mutant.witness))
    assert fn.__module__ == "kernels_jax_mutant_kv_swapped_scale.simple_gla.chunk"
    assert patched_module(BY_NAME["zero-dg-gamma"], "kernels_jax.common.validation") is validation  # wrap only


def test_kernels_jax_holds_no_mutant():
    for path in KERNELS_JAX.rglob("*.py"):
        text = path.read_text()
        assert "mutation" not in text and "mutant" not in text, path


def test_the_docs_table_of_bug_classes_is_the_catalogues():
    """docs/mutants.md has one row per bug class, as the catalogue defines it, with the mutants that plant it."""
    table = (KERNELS_JAX.parent / "docs" / "mutants.md").read_text()
    for bug in BUG_CLASSES:
        document = f'{bug.seed}: "{bug.document}" ({bug.pull_request or "no number on its page"})'
        mutants = ", ".join(f"`{m.name}`" for m in CATALOGUE if m.bug is bug)
        what = bug.what.replace("|", "\\|")  # a table cell's pipes escaped
        row = f"| `{bug.name}` | {what} | {document} | {mutants} |"
        assert mutants and row in table.splitlines(), row
    assert {m.seed for m in CATALOGUE if m.seed} == {bug.seed for bug in BUG_CLASSES}


def test_mutants_cli_rejects_unknown_mutant(capsys):
    from parity.cli import main

    assert main(["mutants", "--suite", "smoke", "--only", "no-such-mutant"]) == 2
    assert "no-such-mutant" in capsys.readouterr().err


def test_kv_swapped_scale_is_invisible_where_k_equals_v(tmp_path):
    """Why ci needs K != V: with K == V the swapped scale is the right one."""
    mutant = BY_NAME["kv-swapped-scale"]
    gate = _run(
        Case.from_id("simple_gla-fwd-B1-T80-H2-K64-V64-fp32-C64-g_logsig"),
        ["fla", f"mutant:{mutant.name}"],
        tmp_path,
        tpu_targets=(),
    )
    assert score(gate, [mutant])["caught"] == 0


# ------------------------------------------------------------------ stopping at the first catch
# scale-twice-intra is caught on its witness (A, first in its order); kv-swapped-scale is invisible
# where K == V, so it must run every simple_gla case and no gla case.
A = Case.from_id(BY_NAME["scale-twice-intra"].witness)
B = Case("simple_gla", 1, 64, 1, 64, 64, gate="g_stress", direction="fwd")
G = Case("gla", 1, 64, 1, 64, 64, direction="fwd")
PAIR = ["scale-twice-intra", "kv-swapped-scale"]


@pytest.fixture(scope="module")
def early(tmp_path_factory):
    out = tmp_path_factory.mktemp("early")
    result = run_mutants([B, G, A], out, jobs=2, names=PAIR, progress=False)
    return out, result


def _row(result, name):
    return next(r for r in result["mutants"] if r["mutant"] == name)


def _manifest_pairs(out):
    (path,) = out.glob("manifest-*.json")
    return {tuple(p) for p in json.loads(path.read_text())["pairs"]}


def test_a_mutant_caught_on_its_first_case_runs_no_other(early):
    out, result = early
    row = _row(result, "scale-twice-intra")
    assert row["caught"] and row["stops_at_first_catch"]
    assert row["cases_tried"] == [A.id] and row["cases_run"] == 1 and row["cases_of_op"] == 2
    assert [cb["case_id"] for cb in row["caught_by"]] == [A.id]
    assert (out / "mutant-scale-twice-intra" / f"{A.id}.json").exists()
    assert not (out / "mutant-scale-twice-intra" / f"{B.id}.json").exists()  # stopped: never ran B
    pairs = _manifest_pairs(out)
    assert (A.id, "mutant-scale-twice-intra") in pairs and (B.id, "mutant-scale-twice-intra") not in pairs


def test_an_uncaught_mutant_runs_every_case_of_its_op_and_the_kernels_run_everywhere(early):
    out, result = early
    row = _row(result, "kv-swapped-scale")
    assert not row["caught"] and row["cases_run"] == 2 and sorted(row["cases_tried"]) == sorted([A.id, B.id])
    assert not list(out.glob(f"mutant-*/{G.id}.json"))  # a simple_gla mutant never runs a gla case
    for backend in ("oracle", "fla", "pallas", "pallas-fused"):  # the unmutated side: every case
        assert all((out / backend / f"{c.id}.json").exists() for c in (A, B, G)), backend
    assert result["unmutated_failures"] == [], format_score(result)
    saved = json.loads((out / "mutants.json").read_text())
    assert saved["stops_at_first_catch"] and saved["caught"] == 1 and saved["total"] == 2
    assert "stopped at the first case that caught it" in format_score(result)


def test_the_gate_holds_the_run_to_the_pairs_it_planned(early, tmp_path, capsys):
    """The cases a mutant never ran (it was caught) are not missing; a planned record is."""
    from parity.cli import main

    out, _ = early
    assert main(["gate", str(out)]) == 1  # gated (the mutants fail it), not refused
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    (copy / "mutant-kv-swapped-scale" / f"{B.id}.json").unlink()
    capsys.readouterr()
    assert main(["gate", str(copy)]) == 2
    err = capsys.readouterr().err
    assert "missing" in err and f"{B.id} [mutant-kv-swapped-scale]" in err, err


def test_all_cases_reproduces_the_full_matrix(tmp_path):
    """--all-cases: every mutant on every case of its op, with the verdicts each case's own
    run of every backend gives (the pre-schedule `parity mutants`, in-process)."""
    result = run_mutants([A, B], tmp_path / "all", jobs=2, names=PAIR, progress=False, all_cases=True)
    for name in PAIR:
        row = _row(result, name)
        assert (
            not row["stops_at_first_catch"]
            and row["cases_run"] == 2
            and sorted(row["cases_tried"]) == sorted([A.id, B.id])
        )
    gate = json.loads((tmp_path / "all" / "gate.json").read_text())
    got = {(e["case_id"], e["candidate"]): e["verdict"] for e in gate["cases"] if e["candidate"].startswith("mutant-")}
    want = {}
    for case in (A, B):
        ref = _run(case, ["fla", *(f"mutant:{n}" for n in PAIR)], tmp_path / case.id, tpu_targets=())
        want.update({(e["case_id"], e["candidate"]): e["verdict"] for e in ref["cases"]})
    assert got == want and len(got) == 4


def test_the_schedule_joins_holds_and_stops(tmp_path):
    """MutantSchedule alone (no workers), with a judge that passes everything: the mutant's next
    case joins that case's queued unit and runs next, waits while that case's first unit runs, and
    every case of its op is tried once; a judge that catches stops it."""
    from parity.execute.backends import parse_specs

    mutant = BY_NAME["kv-swapped-scale"]
    cases = [B, G, A, A.replace(seed=1)]
    specs = parse_specs(["fla", "pallas", f"mutant:{mutant.name}"])
    judged = []
    plan = MutantSchedule(cases, specs, [mutant], lambda c, b: (judged.append(c.id), False)[1])
    order = [c.id for c in plan.order[mutant.name]]
    assert len(order) == 3 and G.id not in order
    first = plan.take()  # the unit of the mutant's first case goes first
    assert first[0].id == order[0] and [s.name for s in first[1]][-1] == f"mutant-{mutant.name}"
    plan.finished(*first)
    second = plan.take()  # its next case's queued unit, moved to the front, with the mutant in it
    assert second[0].id == order[1] and f"mutant-{mutant.name}" in [s.name for s in second[1]]
    third = plan.take()  # another case's first unit starts meanwhile: the mutant's last case
    while third[0].id != order[2]:
        plan.finished(*third)
        third = plan.take()
    plan.finished(*second)  # its last case's first unit is running: the mutant waits for it
    assert plan.pending() and plan.held[order[2]] and not plan.queued(third[0])
    plan.finished(*third)
    rest = []
    while (u := plan.take()) is not None:
        rest.append(u)
        plan.finished(*u)
    assert rest[0][0].id == order[2] and [s.name for s in rest[0][1]] == [f"mutant-{mutant.name}"]
    assert judged == order and not plan.pending()
    assert {(c, b) for c, b in plan.pairs if b.startswith("mutant-")} == {(c, f"mutant-{mutant.name}") for c in order}

    caught = MutantSchedule(cases, specs, [mutant], lambda c, b: True)
    unit = caught.take()
    caught.finished(*unit)
    while (u := caught.take()) is not None:
        assert all(s.kind != "mutant" for s in u[1])
        caught.finished(*u)
    assert caught.caught_at == {mutant.name: order[0]} and caught.tried[mutant.name] == order[:1]


@requires_libtpu
def test_a_mutant_whose_lowered_module_is_the_kernels_is_not_compiled_again(tmp_path):
    """kv-swapped-scale where K == V takes V ** -0.5 == K ** -0.5: its lowered TPU module is
    pallas's, byte for byte, so its compile record reuses pallas's compile (same_program_as);
    where K != V, and for scale-twice-intra anywhere, the module differs and is compiled."""
    from parity.execute import tpu_compile

    k_ne_v = Case.from_id(BY_NAME["kv-swapped-scale"].witness)
    shas = {}
    for case, same in ((A, True), (k_ne_v, False)):
        out = tmp_path / case.id
        backends = {
            s: _backends(s) for s in ["oracle", "pallas", "mutant:kv-swapped-scale", "mutant:scale-twice-intra"]
        }
        run_case(case, list(backends), backends, out, "test-reuse", tpu_targets=("v5e",))
        t = {
            b: json.loads((out / b / f"{case.id}.compile.json").read_text())["targets"]["v5e"]
            for b in ("pallas", "mutant-kv-swapped-scale", "mutant-scale-twice-intra")
        }
        pallas, kv, twice = t["pallas"], t["mutant-kv-swapped-scale"], t["mutant-scale-twice-intra"]
        shas[case.id] = pallas["module_sha256"]
        assert "same_program_as" not in pallas and "same_program_as" not in twice
        assert twice["module_sha256"] != pallas["module_sha256"]
        if same:
            assert kv["same_program_as"] == "pallas" and kv["module_sha256"] == pallas["module_sha256"]
            assert kv["ok"] and kv["kernels"] == pallas["kernels"] and kv["mosaic"] == pallas["mosaic"]
        else:
            assert "same_program_as" not in kv and kv["module_sha256"] != pallas["module_sha256"]
    # compiled afresh, the mutant's program where K == V is the same module and compiles the same
    fresh = tpu_compile.compile_case(mutant_kernel(BY_NAME["kv-swapped-scale"], A), A, "v5e")
    assert fresh["module_sha256"] == shas[A.id] and fresh["ok"] and "same_program_as" not in fresh
