"""parity fuzz: the narrow mutants lie outside every named suite; the property is the gate's own
verdict; a planted narrow mutant is found and shrunk to its minimal case, which found.json
replays through `parity run --cases`; short searches of the built-in kernels find nothing;
bad input is refused with one line. The searches are the CI's (about 2 min of CPU: 20 s per op)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cases import SUITES, Case, get_suite
from cases.strategies import Space
from parity.fuzz import FuzzConfig, format_summary, judge, run_fuzz, space_for
from parity.mutants.narrow import NARROW_MUTANTS, candidate_spec, triggers
from tests.helpers import SMALL, perturbed, record_from_tensors

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ narrow mutants, without kernels
def test_no_case_of_any_named_suite_triggers_a_narrow_mutant():
    """So `parity mutants --suite NAME` cannot see them: only a search can."""
    cases = [c for name in SUITES for c in get_suite(name)]
    assert len(cases) > 200
    for m in NARROW_MUTANTS:
        hits = [c.id for c in cases if triggers(m.name, c)]
        assert hits == [], (m.name, hits[:3])
        assert triggers(m.name, Case.from_id(m.witness)), m.name


@pytest.mark.parametrize("mutant", NARROW_MUTANTS, ids=lambda m: m.name)
def test_narrow_mutant_wrap_changes_results_exactly_where_its_trigger_says(mutant):
    """The wrap around a stand-in kernel (o = q.k-weighted v, ht = state of the last token):
    outputs or gradients differ from the unwrapped call on the witness, and on a case one step
    outside the trigger they are equal."""
    import jax
    import jax.numpy as jnp

    from cases import make_inputs
    from parity.execute.backends.calling import cotangent_names, differentiable_inputs, jax_program

    def kernel(
        q,
        k,
        v,
        g=None,
        g_gamma=None,
        scale=None,
        initial_state=None,
        output_final_state=False,
        cu_seqlens=None,
        chunk_size=64,
    ):
        att = jnp.einsum("bthk,bshk->bhts", q.astype(jnp.float32), k.astype(jnp.float32))
        o = jnp.einsum("bhts,bshv->bthv", att, v.astype(jnp.float32))
        if initial_state is not None:
            o = o + jnp.einsum("bthk,nhkv->bthv", q.astype(jnp.float32), initial_state).sum(0, keepdims=True)[:1]
        return o, None

    def results(fn, case):
        x = make_inputs(case)
        diff = {n: jnp.asarray(x[n]) for n in differentiable_inputs(case, x)}
        cot = tuple(jnp.asarray(x[n]) for n in cotangent_names(case))
        outs, grads = jax_program(fn, case)(diff, cot)
        return [np.asarray(a) for a in jax.tree_util.tree_leaves((outs, grads))]

    witness = Case.from_id(mutant.witness).replace(direction="fwdbwd", ht=False)
    outside = {
        "tail-one-token": dict(T=witness.T - 1),
        "dh0-last-single": dict(seqlens=(63, 2)),
        "heads-wrap": dict(H=2),
        "k-tiles-from-v": dict(V=witness.K),
    }[mutant.name]
    near = witness.replace(**outside)
    assert triggers(mutant.name, witness) and not triggers(mutant.name, near)
    same = lambda a, b: all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not same(results(mutant.wrap(kernel), witness), results(kernel, witness))
    assert same(results(mutant.wrap(kernel), near), results(kernel, near))


MINIMAL = {  # the smallest case of the default space on which each narrow mutant is wrong
    "tail-one-token": "simple_gla-fwd-B1-T17-H1-K8-V8-fp32-C16-g_logsig",
    "dh0-last-single": "simple_gla-fwdbwd-B1-T2-H1-K8-V8-fp32-C16-g_logsig-h0-lens1_1",
    "heads-wrap": "simple_gla-fwd-B1-T1-H3-K8-V8-fp32-C16-g_logsig",
    "k-tiles-from-v": "simple_gla-fwd-B1-T1-H1-K129-V8-fp32-C16-g_logsig",
}


@pytest.mark.parametrize("mutant", NARROW_MUTANTS, ids=lambda m: m.name)
def test_greedy_shrinking_reaches_the_minimal_case_from_anywhere_in_the_trigger(mutant):
    """With the trigger as the property, field-by-field shrinking (cases.strategies.shrink_greedily,
    what parity fuzz runs after hypothesis's shrinker) reaches the minimal case from large triggering
    cases: it never stops at a case some single step still reduces, and every step is a valid case
    of the space that is no larger."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from cases.strategies import boundary_case, shrink_greedily, simpler

    space = Space(op="simple_gla", max_elements=2**18)
    fails = lambda c: triggers(mutant.name, c)
    for c in simpler(Case.from_id(mutant.witness), space):
        assert space.fits(c) and c.T <= Case.from_id(mutant.witness).T and c.id != mutant.witness

    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(boundary_case(space).filter(fails), st.just(None))
    def check(case, _):
        assert shrink_greedily(case, space, fails).id == MINIMAL[mutant.name], case.id

    check()
    assert shrink_greedily(Case.from_id(mutant.witness), space, fails).id == MINIMAL[mutant.name]


# ------------------------------------------------------------------ the property is the gate's verdict
def test_judge_is_the_gates_verdict_with_and_without_the_reference():
    oracle = record_from_tensors(SMALL, "oracle", "oracle", {})
    oracle.update(status="ok", side="oracle")
    from cases import make_inputs
    from parity.execute.backends.oracle import cached_oracle

    exact = cached_oracle(SMALL, make_inputs(SMALL))[0]
    good = record_from_tensors(SMALL, "cand", "candidate", exact)
    ref = record_from_tensors(SMALL, "fla", "reference", perturbed(SMALL, {n: exact[n] * (1 + 1e-6) for n in exact}, 1))
    # 3x the reference's error: within tolerance, outside the bound
    worse = record_from_tensors(
        SMALL, "cand", "candidate", perturbed(SMALL, {n: exact[n] * (1 + 1e-6) for n in exact}, 3)
    )
    j = judge(SMALL, {"oracle": oracle, "cand": good}, "cand")
    assert j.verdict == "pass" and not j.failed and set(j.margins) == set(SMALL.output_names())
    assert judge(SMALL, {"oracle": oracle, "cand": worse}, "cand").verdict == "pass"
    j = judge(SMALL, {"oracle": oracle, "fla": ref, "cand": worse}, "cand")
    assert j.verdict == "fail-bound" and j.failed
    assert all(2.5 < m["eps/bound"] < 3.5 for m in j.margins.values() if m["eps/bound"]), j.margins
    nan = record_from_tensors(SMALL, "cand", "candidate", {n: a * np.nan for n, a in exact.items()})
    assert judge(SMALL, {"oracle": oracle, "cand": nan}, "cand").verdict == "nan-inf"
    crashed = {**good, "status": "timeout", "verdict": "timeout", "tensors": {}, "error": "no result after 5 s"}
    assert judge(SMALL, {"oracle": oracle, "cand": crashed}, "cand").failed
    unsupported = {**good, "status": "unsupported", "verdict": "unsupported", "tensors": {}}
    j = judge(SMALL, {"oracle": oracle, "cand": unsupported}, "cand")
    assert j.verdict == "unsupported" and not j.failed
    assert judge(SMALL, {"oracle": {**oracle, "status": "error"}, "cand": good}, "cand").verdict == "oracle-failed"


def test_space_follows_where_the_kernel_applies():
    from parity.fuzz import applies_predicate

    fused = space_for("simple_gla", applies_predicate("pallas-fused"), 2**18)
    assert set(fused.gates) == {g for g in fused.gates if g.startswith("gamma_")} and fused.gates
    gla = space_for("gla", applies_predicate("pallas"), 2**18)  # every K <= 256, V <= 512 (padded to tiles)
    base = Space(op="gla", max_elements=2**18)
    assert set(gla.k_dims) == {d for d in base.k_dims if d <= 256} and set(gla.v_dims) == set(base.v_dims)
    assert max(base.k_dims) > 256  # the space itself goes past what the kernels take
    f16 = space_for("gla", lambda c: c.dtype != "float16" and c.K <= 128, 2**18)
    assert max(f16.k_dims) <= 128 and "float16" not in f16.dtypes
    with pytest.raises(ValueError, match="no kernel for op 'gla'"):
        space_for("gla", applies_predicate("pallas-fused"), 2**18)


# ------------------------------------------------------------------ searches (the CI's short ones)
def _fuzz(tmp_path, candidate, op="simple_gla", time_s=30.0, **kw):
    cfg = FuzzConfig(out=tmp_path / "fuzz", ops=(op,), candidate=candidate, time_s=time_s, progress=False, **kw)
    return run_fuzz(cfg)


def test_planted_one_token_tail_is_found_shrunk_and_replayed(tmp_path):
    """Budget: found within 90 s (typically 10-40 s in this narrowed space) and shrunk in 120 s
    more to B = 1, H = 1 and the smallest T that has a one-token tail: C + 1 at C = 16."""
    spec = candidate_spec("tail-one-token")
    s = _fuzz(
        tmp_path,
        spec,
        time_s=90.0,
        shrink_time_s=120.0,
        seed=0,
        space=dict(directions=("fwd",), dtypes=("float32",), gates=("g_logsig",)),
    )
    assert len(s["found"]) == 1, format_summary(s)
    case = Case.from_id(s["found"][0]["case_id"])
    assert (case.B, case.H, case.T, case.chunk_size, case.seqlens) == (1, 1, 17, 16, None), case.id
    assert format_summary(s).splitlines()[-1] == case.id
    out = tmp_path / "fuzz"
    assert json.loads((out / "found.json").read_text()) == [case.to_dict()]
    assert (out / "found" / case.id / "repro" / "repro.py").exists()
    assert json.loads((out / "fuzz.json").read_text())["found"][0]["case_id"] == case.id
    assert case.id in (out / "fuzz.html").read_text()
    # found.json is a regression suite: parity run replays it and the mutant fails it again
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "parity",
            "run",
            "--cases",
            str(out / "found.json"),
            "--backends",
            "oracle",
            "--candidate",
            spec,
            "--out",
            str(tmp_path / "replay"),
            "--no-html",
            "--no-progress",
            "--tpu-targets",
            "none",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 1, p.stdout + p.stderr
    rec = json.loads((tmp_path / "replay" / "tail-one-token" / f"{case.id}.json").read_text())
    assert rec["verdict"] == "fail-accuracy" and rec["tensors"]["o"]["verdict"] == "fail-accuracy"
    # a rerun tries the failure in hypothesis's database (under OUT) first
    again = _fuzz(
        tmp_path,
        spec,
        time_s=90.0,
        shrink_time_s=120.0,
        seed=5,
        space=dict(directions=("fwd",), dtypes=("float32",), gates=("g_logsig",)),
    )
    assert [f["case_id"] for f in again["found"]] == [case.id] and again["searches"][0]["examples_to_find"] == 1
    assert json.loads((out / "found.json").read_text()) == [case.to_dict()]  # appended once


def test_a_crash_or_a_timeout_is_a_finding_shrunk_to_the_smallest_case(tmp_path):
    """A candidate that raises fails every case: the search goes on to shrink it to the smallest case of
    the space; one that hangs is killed after --timeout and its timeout is the finding."""
    s = _fuzz(
        tmp_path / "raises",
        "crash=jax:tests.example_candidates:raises",
        time_s=30.0,
        shrink_time_s=40.0,
        space=dict(dtypes=("float32",), gates=("g_logsig",), directions=("fwd",)),
    )
    (found,) = s["found"]
    assert found["verdict"] == "error" and "deliberate failure" in found["detail"]
    assert found["case_id"] == "simple_gla-fwd-B1-T1-H1-K8-V8-fp32-C16-g_logsig", found["case_id"]
    s = _fuzz(
        tmp_path / "hangs",
        "hang=jax:tests.example_candidates:never_returns",
        time_s=5.0,
        shrink_time_s=1.0,
        timeout_s=4.0,
        space=dict(dtypes=("float32",), gates=("g_logsig",), directions=("fwd",)),
    )
    (found,) = s["found"]
    assert found["verdict"] == "timeout" and "no result after 4 s" in found["detail"]


@pytest.mark.parametrize(
    "candidate, op, seconds",
    [("pallas", "simple_gla", 20), ("pallas", "gla", 20), ("pallas", "kda", 20), ("pallas-fused", "simple_gla", 15)],
)
def test_short_search_of_the_built_in_kernels_finds_nothing(tmp_path, candidate, op, seconds):
    s = _fuzz(tmp_path, candidate, op=op, time_s=seconds)
    assert s["found"] == [], format_summary(s)
    (search,) = s["searches"]
    assert search["stopped"] == "time" and search["examples"] >= 1, search
    assert all(p.endswith("tpu-interpret") for p in s["platforms"]), s["platforms"]  # never called a TPU
    assert s["worst"][op] and all(w["margin"] <= 1 for w in s["worst"][op].values())
    assert not (tmp_path / "fuzz" / "found.json").exists()


# ------------------------------------------------------------------ refused input
@pytest.mark.parametrize(
    "argv, field",
    [
        (["--candidate", "pallas", "--backends", "oracle,pallas"], "--backends"),
        (["--candidate", "pallas", "--op", "mamba"], "--op"),
        ([], "--candidate"),
        (["--candidate", "pallas", "--time", "0"], "--time"),
        (["--candidate", "pallas-fused", "--op", "gla"], "--op"),
        (["--candidate", "pallas", "--seed", "-1"], "--seed"),
        (["--candidate", "pallas", "--variants", "-1"], "--variants"),
        (["--candidate", "pallas", "--variant-share", "nan"], "--variant-share"),
        (["--candidate", "pallas", "--max-t", "0"], "--max-t"),
        (["--candidate", "nope=jax:no_such_module:f"], "--candidate"),
    ],
)
def test_fuzz_refuses_bad_input_with_one_line(argv, field, tmp_path, capsys):
    from parity.cli import main

    try:
        rc = main(["fuzz", *argv, "--out", str(tmp_path / "o")])
    except SystemExit as e:  # argparse's refusal of an argument's type
        rc = e.code
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and field in err, err
    assert not (tmp_path / "o").exists()


def test_fuzz_refuses_a_malformed_found_json(tmp_path, capsys):
    from parity.cli import main

    (tmp_path / "found.json").write_text('{"not": "a list"}')
    assert main(["fuzz", "--candidate", "pallas", "--op", "simple_gla", "--out", str(tmp_path)]) == 2
    assert "found.json" in capsys.readouterr().err


# ------------------------------------------------------------------ pytest entry: pytest -m interpret --parity-fuzz 60
@pytest.mark.interpret
@pytest.mark.parametrize("op", ["simple_gla", "gla", "kda"])
def test_fuzz_search(op, request):
    seconds = request.config.getoption("parity_fuzz")
    if not seconds:
        pytest.skip("give --parity-fuzz SECONDS to search each op")
    from parity.pytest_plugin.fuzz import fuzz_for_pytest

    ok, report = fuzz_for_pytest(request.config, op)
    if not ok:
        pytest.fail(report, pytrace=False)


def test_an_identically_zero_oracle_tensor_is_judged_on_absolute_error():
    """At T = 1 without an initial state the oracle's dg is exactly 0: a correct kernel's rounding
    noise (2.6e-8) is judged on absolute error, not as an infinite relative one."""
    from parity.measure.compare import compare_tensor

    case = Case.from_id("simple_gla-fwdbwd-B1-T1-H1-K8-V8-fp32-C16-g_logsig")
    zero = np.zeros((1, 1, 1))
    assert compare_tensor(case, "dg", zero + 2.6e-8, zero)["verdict"] == "pass"
    assert compare_tensor(case, "dg", zero + 0.5, zero)["verdict"] == "fail-accuracy"
    assert compare_tensor(case, "dg", zero, zero)["rel_rms"] == 0.0


# ------------------------------------------------------------------ compiled programs reused across a shape class
def test_a_repeated_shape_class_is_not_recompiled_in_the_warm_worker(tmp_path):
    """Two examples of one shape class (cases.strategies.shape_class), the second with another gate of
    the same kind, gate strength and seed (value_variant's fields), through one CaseRunner worker as a
    search runs them: the kernel's program (kernels_jax.simple_gla.chunk._chunked, forward and
    backward) is compiled for the first and not again for the second. The counts are jax's own
    compile events, reported by the worker (parity.execute.compile_log)."""
    from cases.strategies import shape_class
    from parity.fuzz.search import CaseRunner

    first = Case.from_id("simple_gla-fwdbwd-B1-T33-H2-K16-V32-fp32-C16-g_logsig-h0-ht")
    second = first.replace(gate="g_stress", gate_params={"mag": 3}, seed=2)
    other = first.replace(T=34)  # another shape class: compiled anew
    assert shape_class(first) == shape_class(second) != shape_class(other) and first.id != second.id
    runner = CaseRunner(tmp_path, ["oracle", "pallas"], 300.0, "compiles")
    try:
        compiled = []
        for case in (first, second, other):
            lines = runner.run(case)
            assert [ln["verdict"] for ln in lines] == ["pass", "pass"], lines
            compiled.append(runner.timing)
    finally:
        runner.close()
    kernel = "jit(_chunked)"
    assert compiled[0]["xla_programs"].count(kernel) == 2, compiled[0]  # forward, and its vjp
    assert kernel not in compiled[1]["xla_programs"], compiled[1]
    assert compiled[1]["xla_compile_s"] < 0.2 * compiled[0]["xla_compile_s"], (compiled[0], compiled[1])
    assert compiled[2]["xla_programs"].count(kernel) == 2, compiled[2]  # the counter sees a new class compile


@pytest.mark.parametrize(
    "case_id",
    [
        "simple_gla-fwd-B2-T65-H3-K60-V100-bf16-C32-g_logsig-s0.125-h0",
        "simple_gla-fwdbwd-B1-T5-H1-K8-V8-fp32-C16-gamma_alibi-ht-lens4_1",
    ],
)
def test_variants_share_the_drawn_cases_shape_class_and_reach_every_value(case_id):
    """value_variant keeps every field of the shape class and draws gates of the same kind (g or
    g_gamma), their parameters and seeds: each seed and each gate of the kind appears."""
    from hypothesis import HealthCheck, given, settings

    from cases.strategies import SEEDS, shape_class, value_variant

    space = Space(op="simple_gla", max_elements=2**18)
    case, seen = Case.from_id(case_id), set()

    @settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(value_variant(space, case))
    def check(v):
        assert shape_class(v) == shape_class(case), (v.id, case.id)
        seen.add((v.gate, v.seed, v.gate_params != ()))

    check()
    kinds = {g for g in space.gates if g.startswith("gamma_") == case.uses_g_gamma}
    assert {g for g, _, _ in seen} == kinds and {s for _, s, _ in seen} == set(range(SEEDS))
    assert {p for _, _, p in seen} == {True, False}  # default and drawn gate parameters
