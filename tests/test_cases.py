"""The case registry: ids, validation, deterministic inputs, suites, case files."""

import collections
import json
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings

from cases import OPS, Case, CaseError, get_suite, input_hash, load_cases_file, make_inputs
from cases.inputs import alibi_g_gamma, alibi_slopes
from cases.strategies import case as case_strategy


@given(case_strategy())
@settings(max_examples=200, deadline=None)
def test_id_and_json_round_trip(c):
    assert Case.from_id(c.id) == c
    assert Case.from_dict(json.loads(json.dumps(c.to_dict()))) == c


def test_id_is_readable():
    c = Case("simple_gla", 2, 256, 4, 128, 128, dtype="bfloat16", chunk_size=128, gate="gamma_alibi", h0=True, ht=True)
    assert c.id == "simple_gla-fwdbwd-B2-T256-H4-K128-V128-bf16-C128-gamma_alibi-h0-ht"


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(op="mamba"), "op"),
        (dict(dtype="int8"), "dtype"),
        (dict(chunk_size=48), "chunk_size"),
        (dict(gate="gamma_alibi", op="gla"), "gate"),
        (dict(gate_params={"bogus": 1}), "gate_params"),
        (dict(T=0), "T"),
        (dict(K=0), "K"),
        (dict(seqlens=(10, 20)), "seqlens"),
        (dict(seqlens=(32, 32), B=2), "B"),
        (dict(direction="bwd"), "direction"),
        (dict(scale=-1.0), "scale"),
    ],
)
def test_invalid_case_names_field_and_allowed_values(kwargs, field):
    base = dict(op="simple_gla", B=1, T=64, H=2, K=64, V=64)
    with pytest.raises(CaseError, match=rf"Case\.{field}=.*expected"):
        Case(**{**base, **kwargs})


def test_value_heads_id_field_and_contract():
    """HV (grouped value heads) appears in the id only when it is not H (ids without it are as
    before), round-trips, is accepted for kda and gdn only and must be a multiple of H."""
    c = Case("gdn", 1, 64, 2, 64, 64, HV=4, h0=True, ht=True)
    assert c.id == "gdn-fwdbwd-B1-T64-H2-K64-V64-fp32-C64-g_logsig-HV4-h0-ht"
    assert Case.from_id(c.id) == c and Case.from_dict(c.to_dict()) == c
    assert (c.value_heads, c.G) == (4, 2)
    same = Case("kda", 1, 64, 2, 64, 64, HV=2)
    assert same == Case("kda", 1, 64, 2, 64, 64) and "HV" not in same.id and "HV" not in same.to_dict()
    assert same.replace(H=4).value_heads == 4  # HV = H follows H
    for kwargs, allowed in [
        (dict(op="gla", HV=4), "None or H=2 for op 'gla'"),
        (dict(op="kda", HV=3), "None or a positive multiple of H=2"),
        (dict(op="gdn", HV=0), "None or a positive multiple of H=2"),
        (dict(op="gdn", HV=True), "None \\(H\\) or an int"),
    ]:
        with pytest.raises(CaseError, match=rf"Case\.HV=.*expected {allowed}"):
            Case(**{**dict(B=1, T=64, H=2, K=64, V=64), **kwargs})


def test_grouped_and_gdn_input_shapes():
    """v, do, beta, g and the states have HV heads, q and k H; gdn's gate is one log-decay per
    value head; q, k L2-normalised for both delta-rule ops."""
    c = Case("gdn", 1, 40, 2, 16, 8, HV=6, h0=True, ht=True, seqlens=(15, 25))
    x = make_inputs(c)
    assert {n: a.shape for n, a in x.items()} == {
        "q": (1, 40, 2, 16),
        "k": (1, 40, 2, 16),
        "v": (1, 40, 6, 8),
        "g": (1, 40, 6),
        "beta": (1, 40, 6),
        "initial_state": (2, 6, 16, 8),
        "do": (1, 40, 6, 8),
        "dht": (2, 6, 16, 8),
        "cu_seqlens": (3,),
    }
    assert np.allclose(np.linalg.norm(x["q"], axis=-1), 1.0, atol=1e-6)
    assert c.output_names() == ["o", "ht", "dq", "dk", "dv", "dg", "dbeta", "dh0"]
    assert make_inputs(c.replace(op="kda"))["g"].shape == (1, 40, 6, 16)


def test_gdn2_inputs_gates_and_outputs():
    """gdn2: g and the erase gate b [B, T, HV, K], the write gate w [B, T, HV, V], all float32 in their
    ranges and from their own streams (not beta's); q, k L2-normalised; gradients db and dw, no beta;
    grouped value heads allowed; the id round-trips."""
    c = Case("gdn2", 1, 40, 2, 16, 8, HV=4, h0=True, ht=True, seqlens=(15, 25), dtype="bfloat16")
    assert Case.from_id(c.id) == c and Case.from_dict(c.to_dict()) == c
    assert c.delta_gates == ("b", "w") and not c.has_beta
    x = make_inputs(c)
    assert {n: a.shape for n, a in x.items()} == {
        "q": (1, 40, 2, 16),
        "k": (1, 40, 2, 16),
        "v": (1, 40, 4, 8),
        "g": (1, 40, 4, 16),
        "b": (1, 40, 4, 16),
        "w": (1, 40, 4, 8),
        "initial_state": (2, 4, 16, 8),
        "do": (1, 40, 4, 8),
        "dht": (2, 4, 16, 8),
        "cu_seqlens": (3,),
    }
    assert x["b"].dtype == np.float32 and x["w"].dtype == x["v"].dtype  # w in v's dtype, as FLA's backward needs
    assert all((x[n] > 0).all() and (x[n].astype(np.float32) <= 1).all() for n in ("b", "w"))
    assert x["g"].dtype == np.float32 and (x["g"] <= 0).all()
    assert np.allclose(np.linalg.norm(x["q"].astype(np.float64), axis=-1), 1.0, atol=1e-2)
    kda = make_inputs(c.replace(op="kda"))
    assert not np.array_equal(x["b"][..., 0], kda["beta"]) and np.array_equal(x["g"], kda["g"])
    assert c.output_names() == ["o", "ht", "dq", "dk", "dv", "dg", "db", "dw", "dh0"]
    assert Case("kda", 1, 8, 1, 8, 8).delta_gates == ("beta",) and Case("gla", 1, 8, 1, 8, 8).delta_gates == ()


def test_bad_ids_get_clear_errors():
    for bad in [
        "simple_gla-fwd",
        "simple_gla-fwd-B1-T64-H2-K64-V64-fp8-C64-g_logsig",
        "simple_gla-fwd-B1-T64-H2-K64-V64-fp32-C64-g_logsig-zz",
    ]:
        with pytest.raises(CaseError, match="case id"):
            Case.from_id(bad)


def test_inputs_are_deterministic_and_named_streams_are_independent():
    c = Case("kda", 1, 100, 2, 64, 64, seqlens=(37, 1, 62), h0=True, ht=True, dtype="bfloat16")
    a, b = make_inputs(c), make_inputs(c)
    assert input_hash(a) == input_hash(b)
    # changing a field that does not touch q leaves q's bits alone (streams keyed by name)
    c2 = c.replace(h0=False)
    assert np.array_equal(make_inputs(c2)["q"].view(np.uint16), a["q"].view(np.uint16))
    assert input_hash(make_inputs(c2)) != input_hash(a)
    assert input_hash(make_inputs(c.replace(seed=1))) != input_hash(a)


def test_input_dtypes_and_value_ranges():
    c = Case("kda", 1, 64, 2, 64, 64, h0=True, ht=True, dtype="bfloat16")
    x = make_inputs(c)
    assert x["q"].dtype == ml_dtypes.bfloat16 and x["do"].dtype == ml_dtypes.bfloat16
    assert x["g"].dtype == np.float32 and x["beta"].dtype == np.float32 and x["dht"].dtype == np.float32
    norms = np.linalg.norm(x["k"].astype(np.float64), axis=-1)
    assert np.allclose(norms, 1.0, atol=1e-2)  # L2-normalised before rounding to bf16
    assert (x["beta"] > 0).all() and (x["beta"] < 1).all() and (x["g"] <= 0).all()


def test_same_bits_in_numpy_torch_and_jax():
    import jax.numpy as jnp
    import torch

    from parity.execute.backends.calling import from_torch, to_torch

    c = Case("simple_gla", 1, 64, 2, 64, 64, dtype="bfloat16", h0=True, ht=True)
    for name, a in make_inputs(c).items():
        t = to_torch(a)
        j = jnp.asarray(a)
        assert np.asarray(j).tobytes() == a.tobytes(), name
        assert from_torch(t).tobytes() == a.tobytes(), name
        if a.dtype == ml_dtypes.bfloat16:
            assert t.dtype == torch.bfloat16 and j.dtype == jnp.bfloat16
            assert np.array_equal(t.float().numpy(), a.astype(np.float32))


def test_same_bits_in_a_separate_process():
    c = Case("gla", 2, 80, 2, 64, 64, dtype="bfloat16", h0=True, ht=True, seed=7)
    code = f"from cases import Case, make_inputs, input_hash; print(input_hash(make_inputs(Case.from_id({c.id!r}))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == input_hash(make_inputs(c))


def test_alibi_slopes_match_the_paper_and_spread_over_layers():
    assert np.allclose(alibi_slopes(8), [2.0 ** -(i + 1) for i in range(8)])
    s12 = alibi_slopes(12)  # not a power of two: 8 slopes then every other of the 16-head set
    assert len(s12) == 12 and np.allclose(s12[:8], alibi_slopes(8)) and np.allclose(s12[8:], alibi_slopes(16)[0::2][:4])
    g0, g19 = alibi_g_gamma(16, 0, 20), alibi_g_gamma(16, 19, 20)
    assert abs(g0[0]) * 128 > 88.72  # the seed-000 overflow: |gamma| * chunk 128 = 90.5
    assert np.all(np.abs(g19) < 1e-4) and np.all(g0 < 0)


def test_suites_cover_the_matrix():
    ci = get_suite("ci")
    assert len(ci) >= 60 and len({c.id for c in ci}) == len(ci)
    combos = collections.Counter((c.op, c.direction, c.dtype, c.chunk_size, c.gate) for c in ci)
    from cases.suites import gates_for

    for op in ("simple_gla", "gla", "kda"):
        for d in ("fwd", "fwdbwd"):
            for dt in ("float32", "bfloat16"):
                for ch in (64, 128):
                    for g in gates_for(op):
                        assert combos[(op, d, dt, ch, g)] >= 1, (op, d, dt, ch, g)
    for op in ("simple_gla", "gla", "kda"):
        mine = [c for c in ci if c.op == op]
        assert {(c.h0, c.ht) for c in mine} == {(False, False), (True, True), (True, False), (False, True)}
        assert any(c.seqlens and any(n % c.chunk_size for n in c.seqlens) for c in mine)
        assert any(max(c.K, c.V) > 128 for c in mine)
    smoke = get_suite("smoke")
    assert len(smoke) <= 12 and {c.op for c in smoke} == set(OPS)
    # the delta-rule cases of ci: gdn forward and backward, grouped value heads on kda and gdn, small
    delta = [c for c in ci if c.op == "gdn" or c.value_heads > c.H]
    assert {c.op for c in delta} == {"kda", "gdn"} and {c.op for c in delta if c.value_heads > c.H} == {"kda", "gdn"}
    assert all(c.backward and c.T <= 128 and c.K <= 32 for c in delta) and len(delta) <= 4
    # gdn2 in ci: at most 2 cases, one chunk of B1 H2 K = V = 64, forward and backward, fp32 with h0 / ht and bf16
    gdn2 = [c for c in ci if c.op == "gdn2"]
    assert len(gdn2) == 2 and all(c.backward and (c.B, c.T, c.H, c.K, c.V) == (1, 64, 2, 64, 64) for c in gdn2)
    assert {(c.dtype, c.h0, c.ht) for c in gdn2} == {("float32", True, True), ("bfloat16", False, False)}
    for suite in ("stability", "varlen", "full", "models", "fla-tests"):
        assert any(c.op == "gdn2" for c in get_suite(suite)), suite
    assert {c.direction for c in smoke} == {"fwd", "fwdbwd"}
    assert any(1 in c.seqlens for c in get_suite("varlen"))
    assert any(c.gate == "gamma_alibi" and c.chunk_size == 128 for c in get_suite("stability"))
    full = get_suite("full")
    assert max(c.T for c in full) == 8192 and max(c.H for c in full) == 64 and max(c.B for c in full) == 8


def test_unknown_suite():
    with pytest.raises(CaseError, match="unknown suite 'nope'.*smoke"):
        get_suite("nope")


def test_cases_file_accepts_dicts_and_ids_and_validates(tmp_path):
    c = get_suite("smoke")[0]
    good = tmp_path / "good.json"
    good.write_text(
        json.dumps([c.id, {"id": c.id, **c.to_dict()}, {"op": "gla", "B": 1, "T": 64, "H": 1, "K": 64, "V": 64}])
    )
    assert [x.op for x in load_cases_file(good)] == ["simple_gla", "simple_gla", "gla"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"op": "gla", "B": 1, "T": 64, "H": 1, "K": 64, "V": 64, "dtype": "fp8"}]))
    with pytest.raises(CaseError, match=r"entry 0: Case\.dtype='fp8'"):
        load_cases_file(bad)


def test_real_model_head_dims_are_cases_on_every_op():
    """ci covers K < V, K > V, a head dim off the 64 grid and V = 512 on every op, with
    gradients; the models suite names real layers; the other grids' ci cases stay as they are."""
    ci = get_suite("ci")
    for op in ("simple_gla", "gla", "kda"):
        mine = [c for c in ci if c.op == op and c.backward]
        assert any(c.K < c.V for c in mine) and any(c.K > c.V for c in mine)
        assert any(c.K % 64 or c.V % 64 for c in mine) and any(c.V == 512 for c in mine)
    from cases.suites import label

    models = get_suite("models")
    assert all(label(c) for c in models) and len({label(c) for c in models}) == len(models)
    assert label(Case("gla", 1, 128, 4, 256, 512, dtype="bfloat16")).startswith("GLA-1.3B")
    assert label(ci[0]) is None
    qwen = Case("gdn", 1, 128, 16, 128, 128, HV=32, dtype="bfloat16", ht=True)  # Qwen3-Next's config.json
    assert qwen in models and label(qwen).startswith("Qwen3-Next")
    fla = get_suite("fla-tests")  # FLA's own tests of every op, the grouped-value-head ones of kda and gdn too
    assert {c.op for c in fla} == set(OPS) and {c.op for c in fla if c.value_heads > c.H} == {"kda", "gdn"}
    assert all(label(c).startswith("FLA tests/ops/test_") for c in fla)


def test_any_head_dim_is_a_case_and_retnet_decay_is_fla_s():
    c = Case("simple_gla", 1, 16, 3, 60, 512, gate="gamma_retnet")
    assert Case.from_id(c.id) == c
    g = make_inputs(c)["g_gamma"]
    # FLA's retention: g_gamma = log(1 - 2^(-5 - h)), in float32
    assert np.array_equal(g, np.log(1 - 2.0 ** (-5.0 - np.arange(3, dtype=np.float32))).astype(np.float32))


# ------------------------------------------------------------------ the strategies of parity fuzz
def _boundary(**space):
    from cases.strategies import Space, boundary_case

    return boundary_case(Space(**{"op": "simple_gla", **space}))


@pytest.mark.parametrize(
    "what, predicate, smallest",
    [
        (
            "a one-token tail",
            lambda c: c.seqlens is None and c.T > c.chunk_size and c.T % c.chunk_size == 1,
            dict(T=17, chunk_size=16, B=1, H=1),
        ),
        (
            "a tail one token short",
            lambda c: c.seqlens is None and c.T > c.chunk_size and c.T % c.chunk_size == c.chunk_size - 1,
            dict(T=31, chunk_size=16),
        ),
        ("a length-1 sequence last", lambda c: c.seqlens is not None and c.seqlens[-1] == 1, dict(seqlens=(1, 1), T=2)),
        (
            "a length-1 sequence in the middle",
            lambda c: (
                c.seqlens is not None
                and len(c.seqlens) >= 3
                and c.seqlens[1] == 1
                and c.seqlens[0] > 1
                and c.seqlens[2] > 1
            ),
            dict(H=1),
        ),
        ("more than two heads", lambda c: c.H > 2, dict(H=3, B=1)),
        ("K > V", lambda c: c.K > c.V, dict(K=16, V=8)),
        ("K < V", lambda c: c.K < c.V, dict(K=8, V=16)),
        (
            "a gate past the fp32 exp range",
            lambda c: c.gate == "gamma_stress" and c.gate_kwargs["mag"] * c.chunk_size > 88.7,
            dict(gate="gamma_stress"),
        ),
    ],
)
def test_boundary_strategy_reaches_each_bias_and_shrinks_it(what, predicate, smallest):
    """hypothesis finds each bias (the search space reaches it) and shrinks to the smallest case with it."""
    from hypothesis import HealthCheck, find, settings

    c = find(
        _boundary(),
        predicate,
        settings=settings(max_examples=2000, database=None, derandomize=True, suppress_health_check=list(HealthCheck)),
    )
    assert all(getattr(c, k) == v for k, v in smallest.items()), (what, c.id)


@given(_boundary(max_elements=2**14, dtypes=("bfloat16",), k_dims=(16, 64), v_dims=(128,)))
@settings(max_examples=150, deadline=None)
def test_boundary_cases_are_valid_bounded_and_in_their_space(c):
    from cases.inputs import input_size

    assert Case.from_id(c.id) == c
    assert input_size(c)[0] <= 2**14
    assert c.dtype == "bfloat16" and c.K in (16, 64) and c.V == 128


def test_boundary_strategy_draws_only_where_applies_says():
    from hypothesis import HealthCheck
    from hypothesis import given as given_
    from hypothesis import settings as settings_

    from cases.strategies import Space, boundary_case

    seen = []

    @given_(boundary_case(Space(op="gla"), applies=lambda c: c.K == c.V and c.h0))
    @settings_(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    def draw(c):
        seen.append(c)

    draw()
    assert seen and all(c.K == c.V and c.h0 for c in seen)


def _layout_fits(case, name, tensor) -> bool:
    """The declared shape has the axes its layout names: B, T or NT, heads; N sequences; H."""
    from cases.layouts import Layout
    from cases.stages import num_chunks

    shape, heads = tensor.shape, (case.H, case.value_heads)
    return {
        Layout.TIME: shape[:2] == (case.B, case.T) and len(shape) >= 3 and shape[2] in heads,
        Layout.PER_CHUNK: shape[:2] == (case.B, num_chunks(case)) and len(shape) == 5 and shape[2] in heads,
        Layout.STATE: len(shape) == 4 and shape[0] == case.N and shape[1] in heads,
        Layout.PER_HEAD: shape == (case.H,),
    }[tensor.layout]


def test_every_output_of_every_op_and_stage_declares_its_layout():
    """cases.layouts: the comparator, the bound's blocks and localisation read each output's
    declared layout; an output without one (or one that does not fit its shape) fails here."""
    from cases import SUITES, layout_of, output_tensors

    seen = collections.Counter()
    for suite in SUITES:
        for case in get_suite(suite):
            tensors = output_tensors(case)
            for name in case.output_names():
                layout = layout_of(case, name)
                assert _layout_fits(case, name, tensors[name]), (case.id, name, tensors[name])
                seen[(case.kind, name, layout.value)] += 1
    kinds = {kind for kind, _, _ in seen}
    assert set(OPS) <= kinds and len(kinds) > 31, sorted(kinds)  # every op, every stage
    assert seen.keys() >= {("kda:bwd_dAv", "dAqk", "time"), ("gla:fwd_h", "h", "per-chunk"), ("gdn", "dh0", "state")}
    with pytest.raises(KeyError, match="kda declares no layout for 'dAqk'"):
        layout_of(Case.from_id("kda-fwdbwd-B2-T128-H2-K64-V64-bf16-C64-g_logsig-h0-ht"), "dAqk")
