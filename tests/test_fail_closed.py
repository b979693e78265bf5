"""Fail closed: the attacks it guards against (bad CLI input, faulty candidates, interrupted runs,
corrupt files, hostile strings), each replayed and held to the promised behaviour.

Exit codes everywhere: 0 pass, 1 parity failure, 2 refused input (one line naming the
field), 3 internal error (one line pointing at a log with the traceback). Numbers in the
test names are the issue's. Everything runs on tiny cases through the oracle and planted
candidates (numpy only), so that the file stays fast.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from cases import Case, input_hash, make_inputs
from parity.cli import main
from parity.execute.backends.oracle import CONTENT_KEY, KEY_KEY, OracleCacheWarning, cache_path, cached_oracle
from parity.execute.runner import RunConfig, run_cases
from parity.records import read_json, result_path, write_record

from .helpers import perturbed, record_from_tensors, write_records

ROOT = Path(__file__).resolve().parents[1]
TINY = Case("simple_gla", 1, 16, 1, 16, 16, chunk_size=16, direction="fwd")
TINY2 = TINY.replace(seed=1)
PLANTS = {
    "fc_plants": """
        import os, time
        import numpy as np

        def huge(q, k, v, *args, **kwargs):          # finite, the largest float32
            return np.full(q.shape[:3] + v.shape[-1:], 3.4e38, np.float32), None

        def wide(q, k, v, *args, **kwargs):          # float64: wider than the case's output dtype
            return np.zeros(q.shape[:3] + v.shape[-1:]), None

        def dies(q, k, v, *args, **kwargs):          # ends its worker mid-case
            os._exit(7)

        def hangs(q, k, v, *args, **kwargs):
            while True:
                time.sleep(1)
        """,
    "fc_hang_import": "import time\nwhile True:\n    time.sleep(1)\ndef f(*a, **k): pass\n",
    "fc_exit_import": "import os\nos._exit(5)\ndef f(*a, **k): pass\n",
}


@pytest.fixture(scope="module")
def plants(tmp_path_factory):
    d = tmp_path_factory.mktemp("plants")
    for name, src in PLANTS.items():
        (d / f"{name}.py").write_text(textwrap.dedent(src))
    sys.path.insert(0, str(d))  # spawned workers inherit sys.path
    yield d
    sys.path.remove(str(d))


def cli(argv, capsys) -> tuple[int, str, str]:
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as e:  # argparse
        rc = e.code
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def refused(rc, err, *words):
    """Exit 2, no traceback, and one line on stderr naming what was refused."""
    assert rc == 2, err
    assert "Traceback" not in err, err
    assert any(all(w in ln for w in words) for ln in err.splitlines()), err


# ------------------------------------------------------------------ records for gate tests
@pytest.fixture(scope="module")
def records():
    """fla (reference) and pallas (candidate) records for two tiny cases: the candidate has
    half the reference's error, so the gate passes."""
    out = {}
    for c in (TINY, TINY2):
        oracle = cached_oracle(c, make_inputs(c))[0]
        ref = {n: a * (1 + 1e-6 * np.random.default_rng(0).standard_normal(a.shape)) for n, a in oracle.items()}
        out[c.id] = {
            "fla": record_from_tensors(c, "fla", "reference", ref),
            "pallas": record_from_tensors(c, "pallas", "candidate", perturbed(c, ref, 0.5)),
        }
    return out


def gate_dir(path: Path, records, changes: dict | None = None) -> Path:
    """A run directory (records + manifest); changes: {(case_id, backend): record or None}."""
    for cid, recs in records.items():
        for b, rec in recs.items():
            rec = (changes or {}).get((cid, b), rec)
            write_records(path, rec if rec is not None else recs[b])
            if rec is None:
                result_path(path, b, cid).unlink()
    return path


def test_exit_codes_mean_one_thing(tmp_path, records, capsys, monkeypatch):
    assert cli(["gate", gate_dir(tmp_path / "pass", records)], capsys)[0] == 0
    worse = {
        (TINY.id, "pallas"): {
            **records[TINY.id]["pallas"],
            "verdict": "fail-accuracy",
            "tensors": {"o": {**records[TINY.id]["pallas"]["tensors"]["o"], "verdict": "fail-accuracy"}},
        }
    }
    assert cli(["gate", gate_dir(tmp_path / "fail", records, worse)], capsys)[0] == 1
    rc, _, err = cli(["gate", tmp_path / "nowhere"], capsys)
    refused(rc, err, "nowhere", "no such directory")
    import cases  # parity.model.options.select_cases reads the suite through cases.get_suite

    monkeypatch.setattr(cases, "get_suite", lambda name: 1 / 0)
    rc, _, err = cli(["cases", "--suite", "smoke"], capsys)
    assert rc == 3 and err.count("\n") == 1 and "internal error: ZeroDivisionError" in err
    log = Path(err.split("traceback in ")[1].rstrip(")\n"))
    assert "Traceback" in log.read_text() and "1 / 0" in log.read_text()
    log.unlink()


def test_parity_run_without_a_gate_exits_1_when_a_candidate_fails(tmp_path, plants, capsys):
    rc, out, _ = cli(
        [
            "run",
            "--case",
            TINY.id,
            "--backends",
            "oracle",
            "--candidate",
            "huge=jax:fc_plants:huge",
            "--out",
            tmp_path / "o",
            "--no-progress",
            "--no-html",
        ],
        capsys,
    )
    assert rc == 1 and "fail-accuracy" in out
    rc, _, _ = cli(
        ["run", "--case", TINY.id, "--backends", "oracle", "--out", tmp_path / "p", "--no-progress", "--no-html"],
        capsys,
    )
    assert rc == 0


# ------------------------------------------------------------------ 1. the gate fails closed
def test_1_a_case_with_truncated_or_missing_records_is_refused_not_passed(tmp_path, records, capsys):
    d = gate_dir(tmp_path / "trunc", records)
    for b in ("fla", "pallas"):
        p = result_path(d, b, TINY2.id)
        p.write_bytes(p.read_bytes()[:100])
    rc, _, err = cli(["gate", d], capsys)
    refused(rc, err, TINY2.id, "unreadable")
    d = gate_dir(tmp_path / "missing", records, {(TINY2.id, "fla"): None, (TINY2.id, "pallas"): None})
    rc, _, err = cli(["gate", d], capsys)
    refused(rc, err, "missing", TINY2.id)
    rc, out, _ = cli(["gate", d, "--allow-partial"], capsys)  # what is there, and what is not, said
    assert rc == 0 and "PARTIAL" in out and f"not seen: {TINY2.id} [fla]" in out


def test_1_a_directory_without_a_manifest_is_refused(tmp_path, records, capsys):
    d = gate_dir(tmp_path / "d", records)
    for m in d.glob("manifest-*.json"):
        m.unlink()
    rc, _, err = cli(["gate", d], capsys)
    refused(rc, err, "no manifest")


def test_1_a_record_moved_to_another_case_is_refused(tmp_path, records, capsys):
    d = gate_dir(tmp_path / "d", records)
    shutil.copy(result_path(d, "pallas", TINY.id), result_path(d, "pallas", TINY2.id))
    rc, _, err = cli(["gate", d], capsys)
    refused(rc, err, "holds case", TINY.id)


def test_1_records_whose_inputs_differ_from_the_manifest_are_refused(tmp_path, records, capsys):
    from parity.records.manifest import write_manifest

    d = gate_dir(tmp_path / "d", records)
    write_manifest(
        d,
        "hashed",
        "test",
        list(records),
        ["fla", "pallas"],
        {cid: recs["fla"]["input_hash"] for cid, recs in records.items()},
    )
    assert cli(["gate", d], capsys)[0] == 0
    for b in ("fla", "pallas"):  # both sides agree, so only the manifest can tell
        p = result_path(d, b, TINY.id)
        p.write_text(json.dumps({**read_json(p), "input_hash": "0" * 64}))
    rc, _, err = cli(["gate", d], capsys)
    refused(rc, err, "input_hash 0000000000000000 differs from the one its manifest manifest-hashed.json recorded")


def test_1_a_manifest_of_pairs_asks_for_exactly_its_pairs(tmp_path, records, capsys):
    """A run that is not every case through every backend (parity mutants) lists its pairs: a
    listed pair without a record is refused, a pair it never planned is not asked for, and a
    pair naming a backend or case the manifest does not list is a malformed manifest."""
    from parity.records.manifest import write_manifest

    d = gate_dir(tmp_path / "d", records)
    for m in d.glob("manifest-*.json"):
        m.unlink()
    pairs = [(TINY.id, "fla"), (TINY.id, "pallas"), (TINY2.id, "fla"), (TINY2.id, "pallas")]
    write_manifest(d, "pairs", "test", list(records), ["fla", "pallas", "other"], pairs=pairs)
    assert cli(["gate", d], capsys)[0] == 0  # nothing of backend "other" was planned: not missing
    result_path(d, "pallas", TINY2.id).unlink()
    rc, _, err = cli(["gate", d], capsys)
    refused(rc, err, "missing", f"{TINY2.id} [pallas]")
    write_manifest(d, "pairs", "test", list(records), ["fla", "pallas"], pairs=[*pairs[:3], (TINY2.id, "nope")])
    rc, _, err = cli(["gate", d], capsys)
    refused(rc, err, "pairs")


def test_1_a_candidate_ok_with_no_tensors_fails(tmp_path, records, capsys):
    empty = {**records[TINY.id]["pallas"], "tensors": {}}
    rc, out, _ = cli(["gate", gate_dir(tmp_path / "d", records, {(TINY.id, "pallas"): empty})], capsys)
    assert rc == 1 and "record has no entry for o" in out and "gate: FAIL" in out
    unsup = {**records[TINY.id]["pallas"], "tensors": {"o": {"verdict": "unsupported", "reason": "x"}}}
    rc, out, _ = cli(["gate", gate_dir(tmp_path / "e", records, {(TINY.id, "pallas"): unsup})], capsys)
    assert rc == 1 and "status ok but no tensor compared" in out


def test_1_a_candidate_unsupported_everywhere_is_not_a_pass(tmp_path, records, capsys):
    changes = {
        (cid, "pallas"): {
            **recs["pallas"],
            "status": "unsupported",
            "verdict": "unsupported",
            "tensors": {},
            "error": "no kernel",
        }
        for cid, recs in records.items()
    }
    rc, out, _ = cli(["gate", gate_dir(tmp_path / "d", records, changes)], capsys)
    assert (
        rc == 1
        and "unsupported everywhere: compared no tensor on any of its 2 cases" in out
        and "gate: PASS" not in out
    )


# ------------------------------------------------------------------ 2. one bad case never costs the run
@pytest.mark.parametrize(
    "entry, words",
    [
        (
            '{"op": "simple_gla", "B": 1, "T": 16, "H": 1, "K": 16, "V": 16, "scale": 1e999}',
            ["Case.scale=inf", "finite"],
        ),
        ('"simple_gla-fwd-B1-T1000000000-H1-K16-V16-fp32-C16-g_logsig"', ["exceed the limit", "--max-elements"]),
    ],
)
def test_2_a_case_too_large_or_with_inf_scale_is_refused_before_any_worker(tmp_path, entry, words, capsys):
    f = tmp_path / "cases.json"
    f.write_text(f"[{entry}]")
    rc, _, err = cli(["run", "--cases", f, "--backends", "oracle", "--out", tmp_path / "o"], capsys)
    refused(rc, err, *words)
    assert not (tmp_path / "o").exists()


def test_2_the_size_limit_is_a_flag(tmp_path, capsys):
    rc, _, err = cli(
        ["run", "--case", TINY.id, "--backends", "oracle", "--max-elements", "100", "--out", tmp_path / "o"], capsys
    )
    refused(rc, err, "784 elements", "limit of 100")


@pytest.fixture(scope="module")
def faulty_run(tmp_path_factory, plants):
    """Two cases through a candidate with the largest float32 output, one that kills its worker and
    one that returns float64."""
    out = tmp_path_factory.mktemp("run")
    specs = ["oracle", "huge=jax:fc_plants:huge", "dies=jax:fc_plants:dies", "wide=jax:fc_plants:wide"]
    summary = run_cases([TINY, TINY2], RunConfig(out_dir=out, backends=specs, timeout_s=60, progress=False))
    return out, summary


def test_2_a_dying_worker_a_huge_output_or_a_wrong_dtype_loses_no_case(faulty_run):
    out, summary = faulty_run
    assert len(summary["results"]) == 8 and summary["interrupted"] is None
    for c in (TINY, TINY2):
        oracle = read_json(result_path(out, "oracle", c.id))
        died = read_json(result_path(out, "dies", c.id))
        assert died["status"] == "error" and "worker process died (exit code 7)" in died["error"]
        assert died["input_hash"] == oracle["input_hash"] == input_hash(make_inputs(c))
        huge = read_json(result_path(out, "huge", c.id))  # strict JSON
        assert huge["verdict"] == "fail-accuracy" and huge["tensors"]["o"]["max_ulp"] > 1e40
        wide = read_json(result_path(out, "wide", c.id))  # the output contract: o in the case dtype
        assert wide["status"] == "error" and "'o' has dtype float64, expected float32" in wide["error"]
    assert not list(out.rglob(".tmp-*"))
    manifest = read_json(next(out.glob("manifest-*.json")))
    assert manifest["finished"] and len(manifest["completed"]) == 8


def test_2_non_finite_metrics_are_written_as_null_and_listed(tmp_path, records):
    rec = json.loads(json.dumps(records[TINY.id]["pallas"]))
    rec["tensors"]["o"]["max_ulp"] = float("inf")
    written = write_record(tmp_path / "r.json", rec)
    back = read_json(tmp_path / "r.json")  # strict JSON
    assert back["tensors"]["o"]["max_ulp"] is None and written["encoded_nonfinite"] == ["tensors.o.max_ulp"]


def test_2_a_harness_error_in_a_worker_costs_only_that_record_and_the_parent_does_not_raise(tmp_path, plants):
    (tmp_path / "huge").write_text("a file where the candidate's record folder goes")
    summary = run_cases(
        [TINY],
        RunConfig(out_dir=tmp_path, backends=["oracle", "huge=jax:fc_plants:huge"], timeout_s=60, progress=False),
    )
    lines = {ln["backend"]: ln for ln in summary["results"]}
    assert lines["oracle"]["status"] == "ok" and lines["huge"]["status"] == "error"
    assert "harness error in the worker: FileExistsError" in lines["huge"]["error"]
    assert lines["huge"]["error"].startswith("the record could not be written ([Errno 17] File exists")
    manifest = read_json(next(tmp_path.glob("manifest-*.json")))
    assert manifest["completed"] == [[TINY.id, "oracle"]] and manifest["finished"]
    assert not list(tmp_path.rglob(".tmp-*"))


def test_2_a_record_that_cannot_be_serialised_becomes_an_error_record(tmp_path, records):
    rec = {**records[TINY.id]["pallas"], "notes": {"handle": object()}}
    written = write_record(tmp_path / "r.json", rec)
    assert read_json(tmp_path / "r.json") == written
    assert written["status"] == "error" and "could not be serialised: TypeError" in written["error"]
    assert not list(tmp_path.glob(".tmp-*"))


# ------------------------------------------------------------------ 3. the oracle cache verifies what it reads
def _truncate(p):
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _flip(p):
    b = bytearray(p.read_bytes())
    b[len(b) // 2] ^= 0x40
    p.write_bytes(bytes(b))


def _wrong_values(p):
    with np.load(p) as z:
        d = {n: z[n] for n in z.files}
    d["o"] = d["o"] * 2  # a valid file, its stored hash now stale
    np.savez(p, **d)


def _no_hash(p):
    with np.load(p) as z:
        d = {n: z[n] for n in z.files if n not in (CONTENT_KEY, KEY_KEY)}
    np.savez(p, **d)


@pytest.mark.parametrize("damage", [_truncate, _flip, _wrong_values, _no_hash])
def test_3_a_damaged_cache_entry_is_recomputed_and_replaced(tmp_path, monkeypatch, damage):
    monkeypatch.setenv("PARITY_CACHE", str(tmp_path))
    x = make_inputs(TINY)
    good, hit, _ = cached_oracle(TINY, x)
    assert not hit
    damage(cache_path(TINY, x))
    with pytest.warns(OracleCacheWarning, match="damaged"):
        again, hit, _ = cached_oracle(TINY, x)
    assert not hit and all(np.array_equal(again[n], good[n]) for n in good)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cached_oracle(TINY, x)[1]  # replaced: a verified hit now


def test_3_concurrent_writers_leave_one_valid_entry(tmp_path, monkeypatch):
    monkeypatch.setenv("PARITY_CACHE", str(tmp_path))
    x = make_inputs(TINY2)
    with ThreadPoolExecutor(4) as ex:
        results = list(ex.map(lambda _: cached_oracle(TINY2, x)[0], range(4)))
    assert all(np.array_equal(r["o"], results[0]["o"]) for r in results)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cached_oracle(TINY2, x)[1]
    assert [p.name for p in (tmp_path / "oracle").iterdir()] == [cache_path(TINY2, x).name]


# ------------------------------------------------------------------ 4. nothing escapes the output folder
@pytest.mark.parametrize("name", ["..", ".", "a/b", "-x", ""])
def test_4_a_candidate_name_with_path_components_is_refused(tmp_path, name, capsys):
    rc, _, err = cli(
        [
            "run",
            "--case",
            TINY.id,
            "--backends",
            "oracle",
            f"--candidate={name}=jax:tests.example_candidates:raises",
            "--out",
            tmp_path / "o",
        ],
        capsys,
    )
    refused(rc, err, "NAME", "A-Z a-z 0-9")
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ 5. timeouts and killed parents
def test_5_a_module_that_hangs_at_import_in_the_worker_is_timed_out(tmp_path, plants):
    summary = run_cases(
        [TINY], RunConfig(out_dir=tmp_path, backends=["oracle", "h=jax:fc_hang_import:f"], timeout_s=4, progress=False)
    )
    rec = read_json(result_path(tmp_path, "h", TINY.id))
    assert rec["status"] == "timeout" and "no result after 4 s" in rec["error"]
    assert read_json(result_path(tmp_path, "oracle", TINY.id))["status"] == "ok" and summary["interrupted"] is None


@pytest.mark.parametrize(
    "module, words",
    [("fc_hang_import", ["did not finish within 2 s"]), ("fc_exit_import", ["ended the process", "exit code 5"])],
)
def test_5_a_module_that_hangs_or_exits_at_import_in_the_parent_is_refused(tmp_path, plants, module, words, capsys):
    rc, _, err = cli(
        [
            "run",
            "--case",
            TINY.id,
            "--backends",
            "oracle",
            "--candidate",
            f"x=jax:{module}:f",
            "--timeout",
            "2",
            "--out",
            tmp_path / "o",
        ],
        capsys,
    )
    refused(rc, err, *words)


def _descendants(pid: int) -> list[int]:
    """Every process below pid: its workers are children of the fork server it started."""
    try:
        children = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []
    return children + [d for c in children for d in _descendants(c)]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("sig, code", [(signal.SIGKILL, -9), (signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_5_a_killed_parent_takes_its_workers_and_leaves_a_summary(tmp_path, plants, sig, code, request):
    out = tmp_path / "o"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(plants)])}
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "parity",
            "run",
            "--case",
            TINY.id,
            "--backends",
            "oracle",
            "--candidate",
            "hang=jax:fc_plants:hangs",
            "--out",
            str(out),
            "--no-html",
            "--no-progress",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # SIGINT deliverable as from a terminal: a test session started in the background (`cmd &`
        # in a script) ignores SIGINT, and Python keeps an inherited SIG_IGN
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    request.addfinalizer(lambda: p.poll() is None and p.kill())
    deadline = time.time() + 60
    while not result_path(out, "oracle", TINY.id).exists() and time.time() < deadline and p.poll() is None:
        time.sleep(0.1)
    time.sleep(0.5)  # the worker is inside the hanging candidate now
    workers = _descendants(p.pid)
    assert workers and p.poll() is None
    p.send_signal(sig)
    stdout, stderr = p.communicate(timeout=30)
    assert p.returncode == code, stderr
    deadline = time.time() + 10
    while any(map(_alive, workers)) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(map(_alive, workers))
    assert not list(out.rglob(".tmp-*"))
    if sig != signal.SIGKILL:
        summary = read_json(out / "summary.json")
        assert summary["interrupted"] == sig.name and f"interrupted by {sig.name}" in stderr
        assert TINY.id in stdout  # the table of what finished
        assert not read_json(next(out.glob("manifest-*.json")))["finished"]


# ------------------------------------------------------------------ 6. harness errors never look like results
def test_6_a_stray_binary_json_is_refused_by_name(tmp_path, records, capsys):
    d = gate_dir(tmp_path / "d", records)
    (d / "fla" / "stray.json").write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff")
    for argv in (["gate", d], ["report", d, "-o", tmp_path / "r.html"], ["calibrate", d]):
        rc, _, err = cli(argv, capsys)
        refused(rc, err, "stray.json", "unreadable")


def test_6_parity_run_with_a_stray_json_in_out_exits_2_not_1(tmp_path, capsys):
    (tmp_path / "o" / "x").mkdir(parents=True)
    (tmp_path / "o" / "x" / "stray.json").write_bytes(b"\xff\xfe\x00")
    rc, _, err = cli(
        ["run", "--case", TINY.id, "--backends", "oracle", "--out", tmp_path / "o", "--no-progress"], capsys
    )
    assert rc == 2 and "report: not written" in err and "stray.json" in err


@pytest.mark.parametrize(
    "corrupt, field",
    [
        (lambda r: r["tensors"]["o"].update(rel_rms="1e-3"), "tensors.o.rel_rms"),
        (lambda r: r["tensors"]["o"].update(rel_rms=float("nan")), "tensors.o.rel_rms"),
        (lambda r: r.pop("verdict"), "verdict"),
        (lambda r: r.update(verdict="great"), "verdict"),
    ],
)
@pytest.mark.parametrize("command", ["gate", "report", "calibrate"])
def test_6_malformed_records_are_refused_naming_the_field(tmp_path, records, corrupt, field, command, capsys):
    bad = json.loads(json.dumps(records[TINY.id]["fla"]))
    corrupt(bad)
    d = gate_dir(tmp_path / "d", records)
    result_path(d, "fla", TINY.id).write_text(json.dumps(bad))  # NaN written as the literal NaN
    argv = {"gate": ["gate", d], "report": ["report", d, "-o", tmp_path / "r.html"], "calibrate": ["calibrate", d]}[
        command
    ]
    rc, _, err = cli(argv, capsys)
    refused(rc, err, f"field {field}=", "expected")


# ------------------------------------------------------------------ 7. validation at the edge
@pytest.mark.parametrize(
    "argv, words",
    [
        (["run", "-j", "0"], ["--jobs", "'0'", "int >= 1"]),
        (["run", "-j", "-1"], ["--jobs", "int >= 1"]),
        (["run", "--timeout", "0"], ["--timeout", "> 0"]),
        (["run", "--timeout", "-5"], ["--timeout", "> 0"]),
        (["run", "--timeout", "nan"], ["--timeout", "'nan'", "finite"]),
        (["run", "--bound-factor", "-1"], ["--bound-factor", ">= 0"]),
        (["run", "--bound-factor", "nan"], ["--bound-factor", "finite"]),
        (["run", "--backends", ","], ["--backends", "none empty"]),
        (["run", "--shard", "0/2"], ["--shard", "1 <= I <= N"]),
        (["run", "--seeds", "0:3"], ["--seeds", "1 <= MIN <= MAX"]),
        (["run", "--seeds", "5:2"], ["--seeds", "'5:2'", "1 <= MIN <= MAX"]),
        (["run", "--seeds", "x"], ["--seeds", "MIN:MAX"]),
        (["run", "--backends", "noise:abc"], ["noise:abc", "noise:REL"]),
        (["gate", ".", "--bound-factor", "nan"], ["--bound-factor", "finite"]),
        (["mutants", "-j", "0"], ["--jobs", "int >= 1"]),
    ],
)
def test_7_bad_arguments_are_one_line_and_exit_2(tmp_path, argv, words, capsys):
    if argv[0] in ("run", "mutants"):
        argv = [argv[0], "--case", TINY.id, *argv[1:], "--out", tmp_path / "o"]
    rc, _, err = cli(argv, capsys)
    assert err.count("\n") == 1
    refused(rc, err, *words)
    assert not (tmp_path / "o").exists()


def test_7_an_output_that_is_a_file_is_refused_before_any_worker(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    for out, words in ((f, ["--out", "this path is a file"]), (f / "sub", ["--out", "is a file"])):
        rc, _, err = cli(["run", "--case", TINY.id, "--backends", "oracle", "--out", out], capsys)
        refused(rc, err, *words)
    for argv in (
        ["gate", tmp_path, "--out", f / "gate.json"],
        ["report", tmp_path, "-o", f / "r.html"],
        ["report", tmp_path, "-o", tmp_path],
        ["repro", TINY.id, "-o", f],
    ):
        rc, _, err = cli(argv, capsys)
        refused(rc, err, "argument", "expected")


@pytest.mark.parametrize("token", ["seedx", "lensx_y", "s1.2.3"])
def test_7_malformed_id_tokens_are_refused(tmp_path, token, capsys):
    rc, _, err = cli(["run", "--case", f"{TINY.id}-{token}", "--backends", "oracle", "--out", tmp_path / "o"], capsys)
    refused(rc, err, f"unknown token {token!r}")


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("h0", '"false"', ["Case.h0='false'", "a bool"]),
        ("scale", '"0.5"', ["Case.scale='0.5'", "finite positive number"]),
        ("gate_params", '"x"', ["Case.gate_params='x'", "mapping"]),
        ("chunk_size", "16.0", ["Case.chunk_size=16.0", "an int"]),
    ],
)
def test_7_case_fields_of_the_wrong_type_are_refused(tmp_path, field, value, words, capsys):
    f = tmp_path / "cases.json"
    f.write_text(f'[{{"op": "simple_gla", "B": 1, "T": 16, "H": 1, "K": 16, "V": 16, "{field}": {value}}}]')
    rc, _, err = cli(["cases", "--cases", f], capsys)
    refused(rc, err, *words)


def test_7_report_on_a_missing_directory_is_refused(tmp_path, capsys):
    rc, _, err = cli(["report", tmp_path / "nope", "-o", tmp_path / "r.html"], capsys)
    refused(rc, err, "no such directory")
    assert list(tmp_path.iterdir()) == []


def test_7_result_files_are_readable_by_others(faulty_run):
    out, _ = faulty_run
    umask = os.umask(0)
    os.umask(umask)
    for p in [out / "summary.json", result_path(out, "huge", TINY.id), *out.glob("manifest-*.json")]:
        assert p.stat().st_mode & 0o777 == 0o666 & ~umask


# ------------------------------------------------------------------ held before: hostile strings, offline page
def test_hostile_strings_render_as_text_and_the_page_needs_no_network(tmp_path, records, capsys):
    hostile = '</script><img src=x onerror="window.__pwned=1">'
    d = gate_dir(
        tmp_path / "d",
        records,
        {
            (TINY.id, "pallas"): {
                **records[TINY.id]["pallas"],
                "platform": hostile,
                "status": "error",
                "verdict": "error",
                "tensors": {},
                "error": hostile,
            }
        },
    )
    rc, _, _ = cli(["report", d, "-o", tmp_path / "r.html"], capsys)
    assert rc == 0
    html = (tmp_path / "r.html").read_text()
    assert "<img" not in html and "</script><img" not in html
    for f in (tmp_path / "r_files" / "cases").glob("*.js"):
        assert "<" not in f.read_text()
    assert "http://" not in html and "https://" not in html  # offline: every asset beside the page
    assert sorted({u for u in re.findall(r'(?:src|href)="([^"#][^"]*)"', html)}) == [
        "r_files/report.css",
        "r_files/report.js",
    ]
    assert (tmp_path / "r_files" / "plotly.min.js").stat().st_size > 1_000_000
