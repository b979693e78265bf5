"""The HTML report (parity.html): its data, its escaping, and the page in headless Chromium.

Records are crafted from numpy arrays with the real comparator (no kernels run): a passing
reference and candidate, a candidate whose error sits in one head from chunk 2 on, a NaN
candidate, an erroring one, and a case whose id and error message are hostile HTML.
Browser tests drive Debian's /usr/bin/chromium with Playwright and skip without it; they
save reports/screenshots/index.png and failing-detail.png.

TPU compile records (kind "compile", DIR/<backend>/<case>.compile.json) are hand-written beside
a small run: the passing case's candidate fails on tpu7x with a hostile error message, the
failing case's compiles everywhere, and a case with compile records only has a numerics mismatch.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import quote, unquote

import numpy as np
import pytest

from cases import Case, make_inputs
from parity.execute.backends import BUILTIN
from parity.html import build_report, write_report
from parity.html.compile_view import COMPILE_LABEL
from parity.html.rows import bound_points
from parity.measure.compare import compare_tensor
from parity.model.verdict import worst_verdict
from parity.records import SCHEMA_VERSION, base_record, result_path, write_json

CHROMIUM = Path("/usr/bin/chromium")
SCREENSHOTS = Path(__file__).resolve().parents[1] / "reports" / "screenshots"
HOSTILE_ID = '<img src=x onerror="window.__pwned=1">'
HOSTILE_ERROR = '</script><script>window.__pwned=1</script> and <img src=x onerror="window.__pwned=1">'

FAILING = Case("simple_gla", 1, 256, 2, 64, 64, chunk_size=64, h0=True, ht=True)
PASSING = Case("gla", 1, 128, 2, 64, 64, direction="fwd")
INPUT_FOR = {"o": "v", "dq": "q", "dk": "k", "dv": "v", "dg": "g", "dg_gamma": "g_gamma", "dbeta": "beta"}


def synthetic_oracle(case: Case) -> dict[str, np.ndarray]:
    """float64 'oracle' tensors of the case's output shapes (values need not be real outputs)."""
    inputs = make_inputs(case)
    state = (len(case.seqlens) if case.seqlens else case.B, case.H, case.K, case.V)
    rng = np.random.default_rng(case.seed + case.T)
    return {
        n: rng.standard_normal(state if n in ("ht", "dh0") else np.shape(inputs[INPUT_FOR[n]]))
        for n in case.output_names()
    }


def record(
    case: Case,
    backend: str,
    side: str,
    tensors: dict | None,
    oracle: dict,
    *,
    case_id: str | None = None,
    status: str = "ok",
    error: str | None = None,
    platform: str = "cpu:test",
) -> dict:
    spec = backend if backend in BUILTIN else f"{backend}=jax:tests.example_candidates:recurrent_scan"
    rec = base_record(case, spec, backend, side, "0" * 64, "test-html")
    rec.update(
        case_id=case_id or case.id,
        status=status,
        platform=platform,
        implementation=f"test.{backend}",
        versions={"jax": "0.10.2"},
        kernel_time_s=0.01,
        wall_time_s=0.02,
        error=error,
        notes={},
    )
    if status != "ok":
        rec.update(tensors={}, verdict=status)
    elif side == "oracle":
        rec.update(
            verdict="pass",
            tensors={
                n: {
                    "shape": list(a.shape),
                    "rms": float(np.sqrt(np.mean(a**2))),
                    "max_abs": float(np.abs(a).max()),
                    "nonfinite": 0,
                    "verdict": "pass",
                }
                for n, a in oracle.items()
            },
        )
    else:
        rec["tensors"] = {n: compare_tensor(case, n, tensors[n], oracle[n]) for n in oracle}
        rec["verdict"] = worst_verdict(t["verdict"] for t in rec["tensors"].values())
    return rec


def noisy(oracle: dict, rel: float, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {n: a + rel * rng.standard_normal(a.shape) * np.std(a) for n, a in oracle.items()}


def write_records(out: Path, n_bulk: int = 0) -> None:
    """The fixture run: see the module docstring; `n_bulk` extra passing fwd cases for paging."""

    def put(rec):
        write_json(result_path(out, rec["backend"], rec["case_id"]), rec)

    oracle = synthetic_oracle(FAILING)
    bad = noisy(oracle, 1e-7, 2)
    for name in ("o", "dq", "dk", "dv"):  # head 1 goes wrong from chunk 2 on: a localised bug
        bad[name][:, 2 * FAILING.chunk_size :, 1] += 5e-2 * np.std(oracle[name])
    put(record(FAILING, "oracle", "oracle", None, oracle))
    put(record(FAILING, "fla", "reference", noisy(oracle, 1e-7, 1), oracle, platform="cuda:NVIDIA H100"))
    put(record(FAILING, "pallas", "candidate", bad, oracle, platform="tpu:TPU v5e"))
    nan = noisy(oracle, 1e-7, 3)
    nan["o"][0, 100:] = np.nan
    put(record(FAILING, "nan", "candidate", nan, oracle))

    oracle = synthetic_oracle(PASSING)
    put(record(PASSING, "oracle", "oracle", None, oracle))
    put(record(PASSING, "fla", "reference", noisy(oracle, 1e-7, 1), oracle))
    put(record(PASSING, "pallas", "candidate", noisy(oracle, 5e-8, 2), oracle))
    put(record(PASSING, "nan", "candidate", noisy(oracle, 5e-8, 3), oracle))

    hostile = Case("simple_gla", 1, 64, 1, 64, 64, direction="fwd", seed=7)
    oracle = synthetic_oracle(hostile)
    put(record(hostile, "oracle", "oracle", None, oracle, case_id=HOSTILE_ID))
    put(record(hostile, "fla", "reference", noisy(oracle, 1e-7, 1), oracle, case_id=HOSTILE_ID, platform=HOSTILE_ERROR))
    put(record(hostile, "pallas", "candidate", None, oracle, case_id=HOSTILE_ID, status="error", error=HOSTILE_ERROR))
    put(record(hostile, "nan", "candidate", noisy(oracle, 1e-7, 2), oracle, case_id=HOSTILE_ID))

    for i in range(n_bulk):
        case = Case("simple_gla", 1, 64, 1, 64, 64, direction="fwd", seed=100 + i)
        oracle = synthetic_oracle(case)
        put(record(case, "oracle", "oracle", None, oracle))
        put(record(case, "fla", "reference", noisy(oracle, 1e-7, i), oracle))
        put(record(case, "pallas", "candidate", noisy(oracle, 2e-8 * (1 + i % 3), i + 1), oracle))


COMPILE_ONLY = Case("simple_gla", 1, 128, 2, 64, 64, chunk_size=64, seed=11)
HOSTILE_OP = (
    '%379 = "tpu.matmul"(%374, %376) <{precision = #tpu.contract_precision<fp32>}> : (vector<64x128xbf16>) <b>op</b>'
)
HOSTILE_LINE = 'INTERNAL: Mosaic failed to compile TPU kernel: Bad lhs type <script>alert(1)</script><img src=x onerror="window.__pwned=1">'
HOSTILE_COMPILE_ERROR = (
    f"XlaRuntimeError: {HOSTILE_LINE}\n\nThe MLIR operation involved:\n  {HOSTILE_OP}\n\nPlease report a bug."
)


def compile_ok(target: str, seconds: float, vmem: int, model: str = "f32x6", compiled: str = "f32x6") -> dict:
    kernel = "simple_gla_chunk_fwd_h"
    agree = model == compiled
    return {
        "target": target,
        "topology": f"{target}:2x2",
        "device_kind": f"TPU {target}",
        "ok": True,
        "seconds": seconds,
        "kernels": [kernel],
        "memory": {
            "argument_size_in_bytes": 263168,
            "output_size_in_bytes": 131072,
            "temp_size_in_bytes": 0,
            "generated_code_size_in_bytes": 40960,
        },
        "mosaic": {kernel: {"vmem_bytes": vmem, "weight_loads": 6, "matmuls": {compiled: 48}}},
        "numerics": {
            "model": "tpu-mxu-v1",
            "kernels": {kernel: {"model": {model: 1}, "compiled": {compiled: 48}, "agree": agree}},
            "mismatches": [] if agree else [f"{kernel}: model ['{model}'], compiled ['{compiled}']"],
        },
    }


def compile_record(case: Case, backend: str, targets: list[dict], created: str = "2026-11-23T18:00:00+0000") -> dict:
    fails = any(not t["ok"] for t in targets)
    mism = any(t.get("numerics", {}).get("mismatches") for t in targets)
    return {
        "schema": SCHEMA_VERSION,
        "kind": "compile",
        "run_id": "test-html",
        "case_id": case.id,
        "case": case.to_dict(),
        "backend": backend,
        "side": "candidate",
        "implementation": f"test.{backend}",
        "program": "fwd" if case.direction == "fwd" else "fwd+bwd",
        "libtpu": "0.0.42.1",
        "jax": "0.10.2",
        "numerics": "tpu-mxu-v1",
        "created": created,
        "host": "cpu-host",
        "repro": f"parity compile --case {case.id} --backends {backend} --tpu-targets v5e,v6e,tpu7x",
        "verdict": "compile-error" if fails else ("numerics-mismatch" if mism else "pass"),
        "targets": {t["target"]: t for t in targets},
    }


def write_compile_records(out: Path, old: Path | None = None) -> None:
    """Compile records beside write_records(out): see the module docstring. `old`: an older, passing
    record for the same (case, candidate) as the tpu7x failure, which must not win."""

    def put(d, rec):
        path = d / rec["backend"] / f"{rec['case_id']}.compile.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(rec))

    failing_target = {
        "target": "tpu7x",
        "topology": "tpu7x:2x2x1",
        "device_kind": "TPU7x",
        "ok": False,
        "seconds": 0.3,
        "error": HOSTILE_COMPILE_ERROR,
        "error_line": HOSTILE_LINE,
        "error_op": HOSTILE_OP,
    }
    put(
        out,
        compile_record(
            PASSING, "pallas", [compile_ok("v5e", 0.5, 197120), compile_ok("v6e", 0.7, 197120), failing_target]
        ),
    )
    put(
        out,
        compile_record(
            FAILING,
            "pallas",
            [compile_ok("v5e", 1.5, 3 << 20), compile_ok("v6e", 2.5, 1 << 20), compile_ok("tpu7x", 1.0, 1 << 20)],
        ),
    )
    unparsed = {**compile_ok("tpu7x", 0.45, 4096), "numerics": {"error": "no post-lower-to-llo module was written"}}
    put(
        out,
        compile_record(
            COMPILE_ONLY,
            "pallas",
            [compile_ok("v5e", 0.4, 4096), compile_ok("v6e", 0.6, 4096, compiled="f32x1"), unparsed],
        ),
    )
    (out / "gate.json").write_text(
        json.dumps(
            {
                "kind": "gate",
                "bound_factor": 1.0,
                "compile": {
                    "targets": ["v5e", "v6e", "tpu7x"],
                    "pairs": 3,
                    "ok": 2,
                    "failed": 1,
                    "by_target": {},
                    "max_vmem_bytes": 3 << 20,
                },
            }
        )
    )
    if old is not None:
        put(
            old,
            compile_record(
                PASSING,
                "pallas",
                [compile_ok(t, 0.1, 1024) for t in ("v5e", "v6e", "tpu7x")],
                created="2026-11-22T09:00:00+0000",
            ),
        )


@pytest.fixture(scope="module")
def compile_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("html-compile") / "run"
    write_records(out)
    write_compile_records(out, old=out.parent / "older")
    return out


@pytest.fixture(scope="module")
def compile_page(compile_dir) -> Path:
    return write_report([compile_dir.parent / "older", compile_dir], compile_dir / "index.html")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("html") / "run"
    write_records(out, n_bulk=120)
    return out


@pytest.fixture(scope="module")
def page(run_dir) -> Path:
    return write_report([run_dir], run_dir / "index.html")


# ------------------------------------------------------------------ data and files, no browser
def test_rows_verdicts_and_failures_first(run_dir):
    rep = build_report([run_dir])
    rows = {r["id"]: r for r in rep["rows"]}
    assert len(rows) == 123 and rep["backends"] == ["oracle", "fla", "nan", "pallas"]
    bad = rows[FAILING.id]
    assert bad["b"]["pallas"]["v"] == "fail-accuracy" and bad["b"]["pallas"]["t"] in ("o", "dq", "dk", "dv")
    assert bad["b"]["nan"]["v"] == "nan-inf" and bad["b"]["nan"]["t"] == "o" and bad["b"]["nan"]["nan"]
    assert bad["verdict"] == "nan-inf"
    assert rows[PASSING.id]["verdict"] == "pass" and rows[PASSING.id]["b"]["pallas"]["r"] is not None
    assert rows[HOSTILE_ID]["b"]["pallas"]["v"] == "error" and rows[HOSTILE_ID]["b"]["pallas"]["err"].startswith(
        "</script>"
    )
    s = rep["summary"]
    assert s["gate"]["status"] == "fail" and s["gate"]["failures"] >= 3
    assert s["verdicts"]["pass"] == 121 and list(s["verdicts"])[0] == "error"
    assert ("tpu:TPU v5e", 1) in {w["backend"]: w["platforms"] for w in s["where"]}["pallas"]
    # the detail of the localised failure: error over tolerance from chunk 2, in head 1
    det = next(d for d in rep["details"] if d["id"] == FAILING.id)
    o = next(b for b in det["backends"] if b["name"] == "pallas")["tensors"]["o"]
    assert o["localisation"]["first_chunk"] == 2 and o["localisation"]["head"] == 1
    assert len(o["heatmap"]) == 4 and len(o["heatmap"][0]) == 2
    # and in the table's "where" column of the failing candidate
    assert "first over tol: chunk 2 (t=128), head 1" in bad["b"]["pallas"]["l"]


def test_bound_points_one_per_judged_tensor(run_dir):
    """The scatter's data: a point per (case, candidate, tensor) with a compute-error judgement
    (FAILING: pallas 7, nan 6 of 7 (its o is NaN: counted as undrawn); PASSING 2; the hostile case's
    nan 1; the bulk cases' pallas 120), its interval around it, the smallest margin on the summary."""
    rep = build_report([run_dir])
    b = rep["bound"]
    assert len(b["points"]) == 136 and b["undrawn"] == 1 and (b["factor"], b["edge"]) == (1.0, 1.25)
    keyed = {(p["case"], p["candidate"], p["tensor"]): p for p in b["points"]}
    assert len(keyed) == 136 and (FAILING.id, "nan", "o") not in keyed
    o = keyed[(FAILING.id, "pallas", "o")]
    assert o["verdict"] == "fail-accuracy" and o["method"] == "ratio" and o["dtype"] == "float32"
    assert o["y_lo"] <= o["y"] <= o["y_hi"] and o["n"] == {r["id"]: r["n"] for r in rep["rows"]}[FAILING.id]
    assert rep["summary"]["gate"]["smallest_margin"].startswith("smallest margin: hi/factor = 3.")
    assert f"at {FAILING.id} [pallas] " in rep["summary"]["gate"]["smallest_margin"]


def test_bound_points_clamp_zero_compute_error():
    """A compute error of 0 (rounding level) is drawn at the stated floor and marked, not dropped."""
    ratio = {"method": "ratio", "c_candidate": 2e-3, "c_reference": 1e-3, "ratio": 2.0, "lo": 1.5, "hi": 2.5}
    zero = {"method": "rounding", "c_candidate": 0.0, "c_reference": 4e-8, "ratio": None, "lo": None, "hi": None}
    tensors = {
        n: {"verdict": v, "bound": {"compute": dict(c, seeds=3, factor=1.0)}}
        for n, v, c in (("o", "fail-bound", ratio), ("dg", "pass", zero))
    }
    tensors["dg"]["dtype"] = "float32"  # the tensor's own dtype; o has none: the case's
    gate_cases = {"X": {"pallas": {"tensors": tensors}}, "Y": {"refused": "no reference"}}
    b = bound_points(gate_cases, [{"id": "X", "n": 0, "dtype": "bfloat16"}, {"id": "Y", "n": 1, "dtype": "x"}], 1.0)
    pts = {p["tensor"]: p for p in b["points"]}
    assert b["floor"] == pytest.approx(4e-9) and b["undrawn"] == 0
    assert pts["dg"]["y"] == b["floor"] and pts["dg"]["clamped"] == ["y"] and pts["dg"]["x"] == 4e-8
    assert (pts["o"]["y_lo"], pts["o"]["y_hi"]) == pytest.approx((1.5e-3, 2.5e-3)) and pts["o"]["clamped"] == []
    assert pts["o"]["margin"] == "hi/factor = 2.5"
    assert (pts["o"]["dtype"], pts["dg"]["dtype"]) == ("bfloat16", "float32")


def test_page_files_escape_hostile_strings(page):
    html = page.read_text()
    assert "<img" not in html and "</script><script>" not in html and 'onerror="' not in html
    assert "&lt;/script&gt;&lt;script&gt;" in html  # the hostile platform, rendered by jinja2 as text
    assets = page.parent / "index_files"
    assert (assets / "plotly.min.js").stat().st_size > 1_000_000
    case_files = sorted((assets / "cases").glob("*.js"))
    assert len(case_files) == 123
    for f in case_files:
        text = f.read_text()
        assert "<" not in text and re.fullmatch(r"parityCaseLoaded\(\d+,\{.*\}\);\n", text, re.S)
    data = json.loads(re.search(r'<script type="application/json" id="report-data">(.*?)</script>', html, re.S)[1])
    assert HOSTILE_ID in [r["id"] for r in data["rows"]]


def test_rewrite_removes_stale_case_files(tmp_path):
    write_records(tmp_path / "a", n_bulk=3)
    write_records(tmp_path / "b", n_bulk=0)
    out = tmp_path / "r.html"
    write_report([tmp_path / "a"], out)
    assert len(list((tmp_path / "r_files" / "cases").glob("*.js"))) == 6
    write_report([tmp_path / "b"], out)
    assert len(list((tmp_path / "r_files" / "cases").glob("*.js"))) == 3


def test_parity_report_command(run_dir, tmp_path, capsys):
    from parity.cli import main

    assert main(["report", str(run_dir), "-o", str(tmp_path / "rep.html")]) == 0
    assert (tmp_path / "rep.html").is_file() and "report:" in capsys.readouterr().out


def test_compile_matrix_data(compile_dir):
    for dirs in (
        [compile_dir],
        [compile_dir, compile_dir.parent / "older"],
        [compile_dir.parent / "older", compile_dir],
    ):
        rep = build_report(dirs)  # the newer (failing) record wins whichever directory comes first
        rows = {r["id"]: r for r in rep["rows"]}
        assert rows[PASSING.id]["cc"]["v"] == "compile-error"
    assert rep["compile_targets"] == ["v5e", "v6e", "tpu7x"]
    # a case whose results all pass but whose candidate does not compile for tpu7x is not a pass
    # (the candidate's cell takes the gate's verdict, as in `parity gate`; its accuracy and bound pass)
    assert {b: c["v"] for b, c in rows[PASSING.id]["b"].items()} == {
        "oracle": "pass",
        "fla": "pass",
        "nan": "pass",
        "pallas": "compile-error",
    }
    assert 0 < rows[PASSING.id]["b"]["pallas"]["r"] <= 1
    g = rep["summary"]["gate"]
    assert g["status"] == "fail" and g["counts"]["compile-error"] == 1 and g["counts"]["numerics-mismatch"] == 1
    assert rows[PASSING.id]["verdict"] == "compile-error" and rows[PASSING.id]["cc"]["f"] == "pallas: tpu7x"
    assert rows[PASSING.id]["cc"]["err"] == f"pallas on tpu7x: {HOSTILE_LINE}"
    assert rows[FAILING.id]["cc"] == {"v": "pass", "ok": 3, "n": 3}
    assert rows[COMPILE_ONLY.id]["verdict"] == "numerics-mismatch" and rows[COMPILE_ONLY.id]["b"] == {}
    c = rep["summary"]["compile"]
    assert c["label"] == COMPILE_LABEL and c["pairs"] == 3 and c["failed_pairs"] == 1 and c["status"] == "fail"
    assert c["failures"] == ["1 of 3 (case, candidate) pairs fail on tpu7x"]
    assert c["mismatches"] and "v6e" in c["mismatches"][0]
    assert {t["target"]: (t["ok"], t["failed"]) for t in c["by_target"]} == {
        "v5e": (3, 0),
        "v6e": (3, 0),
        "tpu7x": (2, 1),
    }
    assert (
        c["seconds"]["max"] == 2.5
        and c["seconds"]["median"] == 0.6
        and c["seconds"]["max_at"] == f"{FAILING.id} / pallas / v6e"
    )
    assert c["vmem"]["text"] == "3.00 MiB" and c["vmem"]["case"] == FAILING.id and c["vmem"]["target"] == "v5e"
    cells = {(m["id"], t): x for m in c["rows"] for t, x in m["cells"].items()}
    assert cells[(PASSING.id, "tpu7x")] == {"ok": False, "s": "0.30", "err": HOSTILE_LINE, "mm": 0}
    assert cells[(PASSING.id, "v5e")]["ok"] and cells[(COMPILE_ONLY.id, "v6e")]["mm"] == 1
    assert c["rows"][0]["id"] == PASSING.id  # failures first
    det = next(d for d in rep["details"] if d["id"] == PASSING.id)
    assert [t["target"] for t in det["compile"][0]["targets"]] == ["v5e", "v6e", "tpu7x"]
    assert det["compile"][0]["targets"][2]["error"] == HOSTILE_COMPILE_ERROR
    assert rep["summary"]["n_skipped"] == 0  # the unreadable file is skipped silently, as results are
    assert c["numerics_errors"] == 1 and c["gate"]["failed"] == 1


def test_compile_page_matrix_and_escaping(compile_page):
    html = compile_page.read_text()
    assert "<script>alert(1)" not in html and "<img" not in html and "<b>op" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html  # the error line, as text in the cell's title
    assert 'id="compile-matrix"' in html and COMPILE_LABEL in html
    alert = re.search(r'<p class="alert" id="compile-alert">(.*?)</p>', html, re.S)[1]
    assert "TPU compile: 1 of 3 (case, candidate) pairs fail on tpu7x" in " ".join(alert.split())
    matrix = re.search(r'<table id="compile-matrix".*?</table>', html, re.S)[0]
    cells = re.findall(r'<tr data-case="([^"]*)" data-backend="pallas">(.*?)</tr>', matrix, re.S)
    got = {
        cid: {t: cls for cls, t in re.findall(r'<td class="cc (cc-\w+)[^"]*" data-target="(\w+)"', body)}
        for cid, body in cells
    }
    assert got[PASSING.id] == {"v5e": "cc-ok", "v6e": "cc-ok", "tpu7x": "cc-error"}
    assert got[FAILING.id] == {"v5e": "cc-ok", "v6e": "cc-ok", "tpu7x": "cc-ok"}
    flat = " ".join(html.split())
    assert "3.00 MiB" in html and "median 0.60 s, max 2.50 s" in flat
    assert "gate.json compile section: 3 pairs, 2 ok, 1 failed" in flat
    links = re.findall(r'<td class="id"><a href="#case=([^"]*)">', matrix)  # by case id, percent-encoded
    assert sorted(unquote(x) for x in links) == sorted(got) and all("<" not in x and '"' not in x for x in links)
    for f in (compile_page.parent / "index_files" / "cases").glob("*.js"):
        assert "<" not in f.read_text()


# ------------------------------------------------------------------ the page in Chromium
@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (Debian: apt-get install chromium; scripts/browser.sh)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright (Python) is not installed")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=str(CHROMIUM),
            args=[
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        yield b
        b.close()


def open_tab(browser, page: Path):
    """A fresh page on a report; collects console errors and uncaught exceptions."""
    ctx = browser.new_context(viewport={"width": 1400, "height": 900})
    pg = ctx.new_page()
    pg.errors = []
    pg.on("console", lambda m: pg.errors.append(m.text) if m.type == "error" else None)
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    pg.goto(page.as_uri())
    pg.wait_for_selector("body[data-ready='1']")
    yield pg
    ctx.close()


@pytest.fixture
def tab(browser, page):
    yield from open_tab(browser, page)


@pytest.fixture
def compile_tab(browser, compile_page):
    yield from open_tab(browser, compile_page)


def visible_ids(pg) -> list[str]:
    return pg.locator("#case-table tbody td.id a").all_text_contents()


def test_index_loads_without_errors(tab):
    assert tab.locator("#gate-outcome .big").text_content().strip() == "FAIL"
    assert tab.locator("#count").text_content().startswith("123 of 123 cases")
    ids = visible_ids(tab)
    assert len(ids) == 100  # first page
    assert ids[0] == HOSTILE_ID and ids[1] == FAILING.id  # failures first: error, then nan-inf
    # a candidate's cell: the gate's verdict, then the tensor and rule that decided it
    cell = tab.locator("#case-table tbody tr").nth(1).locator("td[data-key='pallas.v']").text_content()
    assert re.fullmatch(r"fail-accuracy (o|dq|dk|dv): tolerance", cell), cell
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    tab.screenshot(path=str(SCREENSHOTS / "index.png"), full_page=False)
    assert tab.errors == []


def test_sorting_changes_rows(tab):
    before = visible_ids(tab)
    tab.click("#sort-row th[data-key='id'] button")
    asc = visible_ids(tab)
    assert asc != before and asc == sorted(asc)
    assert tab.get_attribute("#sort-row th[data-key='id']", "aria-sort") == "ascending"
    tab.click("#sort-row th[data-key='id'] button")
    desc = visible_ids(tab)
    assert desc == sorted(desc, reverse=True) and desc[0] != asc[0]
    tab.click("#sort-row th[data-key='pallas.e'] button")  # numeric: largest error first
    assert visible_ids(tab)[0] == FAILING.id
    assert tab.errors == []


def test_filtering_and_paging_change_rows(tab):
    tab.fill("#f-text", "gla-fwd-B1-T128")
    assert visible_ids(tab) == [PASSING.id]
    tab.fill("#f-text", "")
    tab.select_option("#f-verdict", "!pass")
    assert sorted(visible_ids(tab)) == sorted([HOSTILE_ID, FAILING.id])
    tab.select_option("#f-verdict", "")
    tab.select_option("#f-op", "gla")
    assert visible_ids(tab) == [PASSING.id]
    tab.select_option("#f-op", "")
    n_columns = tab.locator("#sort-row th").count()
    tab.uncheck("#f-backends input[data-backend='nan']")  # hide a backend's columns
    assert tab.locator("#sort-row th").count() == n_columns - 6
    assert "nan" not in tab.locator("#case-table tr.groups").all_text_contents()[0]
    assert tab.locator("#case-table tbody tr").first.locator("td").count() == n_columns - 6
    first_page = visible_ids(tab)
    tab.click("#next")
    second = visible_ids(tab)
    assert len(second) == 23 and not set(second) & set(first_page)
    assert tab.errors == []


def test_failing_detail_shows_plots(tab):
    tab.locator("#case-table a", has_text=FAILING.id).click()
    tab.wait_for_selector("#detail[data-state='ready']", timeout=60_000)
    assert tab.locator("#cases").is_hidden() and tab.locator("#detail-title").text_content().endswith(FAILING.id)
    assert int(tab.get_attribute("#detail", "data-plots")) >= 10
    o = tab.locator("section.tensor[data-tensor='o']")
    assert o.locator(".plot.profile .scatterlayer .trace").count() >= 3  # fla, nan, pallas (+ tol lines)
    assert o.locator(".plot.heatmap .heatmaplayer .hm").count() == 3  # one time x head map per backend
    assert o.locator("table.worst tbody tr").count() == 15
    assert "first over tol: chunk 2 (t=128), head 1" in o.locator("table.metrics").text_content()
    # the rule that decided each verdict, as the terminal prints it: the candidate's tolerance check here
    assert re.search(r"decided by.*tolerance: rel_rms \S+ > tol ", o.locator("table.metrics").text_content())
    assert "NaN" in o.text_content()
    assert tab.locator(".repro code", has_text="--backends oracle,fla,pallas").count() == 1
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    o.scroll_into_view_if_needed()
    tab.screenshot(path=str(SCREENSHOTS / "failing-detail.png"), full_page=False)
    tab.click("#back")
    tab.wait_for_selector("#cases", state="visible")
    assert tab.errors == []


def test_bound_scatter_hover_and_click(tab):
    """The bound scatter: one drawn point per judged tensor, the failing case's points in the failing
    colour, hovering one names its case and tensor, clicking it opens the case."""
    tab.wait_for_selector("#bound-scatter[data-state='ready']", timeout=60_000)
    assert tab.locator("#bound-scatter .scatterlayer .point").count() == 136
    assert tab.locator("#smallest-margin").text_content().startswith("smallest margin: hi/factor = ")
    traces = tab.evaluate(
        "document.getElementById('bound-scatter').data.map(t => [t.name, t.marker && t.marker.color, t.x.length])"
    )
    failing = [i for i, (name, _, _) in enumerate(traces) if name == "fail-accuracy float32"]
    assert len(failing) == 1 and traces[failing[0]][1:] == ["#cf222e", 4]  # o, dq, dk, dv of FAILING
    assert {t[1] for t in traces if t[0].startswith("pass ")} == {"#1a7f37"}
    point = tab.locator("#bound-scatter .scatterlayer .trace").nth(failing[0]).locator(".point").first
    assert point.evaluate("e => getComputedStyle(e).fill") == "rgb(207, 34, 46)"  # drawn red
    point.scroll_into_view_if_needed()  # below the gate card's list of failures
    box = point.bounding_box()
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    tab.mouse.move(x, y)
    hover = tab.locator("#bound-scatter .hoverlayer .hovertext")
    hover.wait_for()
    text = hover.text_content()
    assert FAILING.id in text and re.search(r"\[pallas\] (o|dq|dk|dv)verdict fail-accuracy", text), text
    tab.mouse.click(x, y)
    tab.wait_for_selector("#detail[data-state='ready']", timeout=60_000)
    assert tab.locator("#detail-title").text_content().endswith(FAILING.id)
    assert tab.evaluate("window.__pwned") is None and tab.evaluate("document.querySelectorAll('img').length") == 0
    assert tab.errors == []


def test_hostile_strings_render_as_text(tab):
    assert tab.locator("#case-table td.id a").first.text_content() == HOSTILE_ID
    assert HOSTILE_ERROR in tab.locator("table.where").text_content()
    tab.locator("#case-table td.id a").first.click()
    tab.wait_for_selector("#detail[data-state='ready']", timeout=60_000)
    assert tab.locator("#detail-title").text_content().endswith(HOSTILE_ID)
    assert tab.locator("details.error pre").first.text_content() == HOSTILE_ERROR
    assert tab.evaluate("window.__pwned") is None
    assert tab.evaluate("document.querySelectorAll('img').length") == 0
    assert tab.evaluate(
        "[...document.scripts].every(s => !s.textContent.includes('__pwned=1') || s.type === 'application/json')"
    )
    assert tab.errors == []


def test_case_links_are_case_ids(tab, page):
    """index.html#case=<id> opens that case (percent-encoded or as typed); the table's links are ids;
    a row number still opens its case; an id the report lacks says so over the table."""
    href = tab.locator("#case-table td.id a").first.get_attribute("href")
    assert href.startswith("#case=") and unquote(href[len("#case=") :]) == HOSTILE_ID
    row_number = tab.locator("#case-table tr.row", has=tab.get_by_text(FAILING.id, exact=True)).get_attribute("data-n")
    for hash_, case_id in (
        (quote(FAILING.id, safe=""), FAILING.id),
        (PASSING.id, PASSING.id),
        (quote(HOSTILE_ID, safe=""), HOSTILE_ID),
        (row_number, FAILING.id),
    ):
        tab.goto(f"{page.as_uri()}#case={hash_}")
        tab.wait_for_selector("#detail[data-state='ready']", timeout=60_000)
        assert tab.locator("#detail-title").text_content().endswith(case_id), hash_
    tab.goto(f"{page.as_uri()}#case=no-such-case")
    tab.wait_for_selector("#cases", state="visible")
    assert tab.locator("#route-warn").text_content() == 'no case "no-such-case" in this report'
    assert tab.evaluate("window.__pwned") is None and tab.errors == []


# every visible table against its nearest sideways-scrolling ancestor (or the page): scrolled fully
# right, its last column ends inside that ancestor, which is within the page and, where it scrolls,
# no taller than the window (its scrollbar on screen with the rows); every plot's toolbar clear of
# its legend, colour bar and title. Returns the problems found and what was measured.
LAYOUT_JS = """() => {
  const problems = [], seen = { tables: 0, scrolling: [], plots: 0, legends: 0 };
  const W = document.documentElement.clientWidth, shown = e => e.getClientRects().length > 0;
  if (document.documentElement.scrollWidth > W) problems.push(`page scrolls sideways: ${document.documentElement.scrollWidth} > ${W}`);
  for (const t of [...document.querySelectorAll("table")].filter(shown)) {
    seen.tables++;
    let c = t.parentElement;
    while (c !== document.body && !["auto", "scroll"].includes(getComputedStyle(c).overflowX)) c = c.parentElement;
    const name = t.id || t.className;
    const row = t.rows[t.rows.length - 1], last = row.cells[row.cells.length - 1];
    if (c === document.body) {
      if (last.getBoundingClientRect().right > W + 1) problems.push(`${name}: last column past the page`);
      continue;
    }
    if (c.scrollWidth > c.clientWidth) {
      seen.scrolling.push(name);
      if (c.getBoundingClientRect().height > window.innerHeight) problems.push(`${name}: scrolls sideways but is taller than the window`);
    }
    if (c.getBoundingClientRect().right > W + 1) problems.push(`${name}: its scroll container is past the page`);
    c.scrollLeft = c.scrollWidth;
    if (last.getBoundingClientRect().right > c.getBoundingClientRect().right + 1) problems.push(`${name}: last column out of reach`);
    c.scrollLeft = 0;
  }
  const box = e => e.getBoundingClientRect();
  const meet = (a, b) => a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
  for (const p of [...document.querySelectorAll(".js-plotly-plot")].filter(shown)) {
    seen.plots++;
    const bar = p.querySelector(".modebar");
    if (!bar) { problems.push(`${p.id || p.className}: no toolbar`); continue; }
    for (const sel of [".legend", ".colorbar", ".gtitle"]) {
      for (const e of p.querySelectorAll(sel)) {
        if (sel === ".legend") seen.legends++;
        if (meet(box(bar), box(e))) problems.push(`${p.id || p.className}: toolbar covers ${sel}`);
      }
    }
  }
  return { problems, seen };
}"""


def test_page_fits_1280_and_plots_clear_of_the_toolbar(browser, page):
    """At 1280x800 the index (its case table wider than the window) and the failing case's detail:
    every table's last column reachable, no legend, colour bar or title under plotly's toolbar."""
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        pg = ctx.new_page()
        pg.goto(page.as_uri())
        pg.wait_for_selector("#bound-scatter[data-state='ready']", timeout=60_000)
        index = pg.evaluate(LAYOUT_JS)
        assert index["problems"] == [] and "case-table" in index["seen"]["scrolling"], index
        assert index["seen"]["plots"] == 1 and index["seen"]["legends"] == 1, index
        pg.goto(f"{page.as_uri()}#case={quote(FAILING.id, safe='')}")
        pg.wait_for_selector("#detail[data-state='ready']", timeout=60_000)
        detail = pg.evaluate(LAYOUT_JS)
        assert detail["problems"] == [] and detail["seen"]["plots"] >= 10 and detail["seen"]["legends"] >= 5, detail
    finally:
        ctx.close()


def test_gate_card_names_each_failure_and_the_table_its_verdict_at_1280(browser, page):
    """At 1280 x 800, without scrolling: the gate card lists each failing (case, candidate) with its
    tensor, verdict word and the rule that decided it, linked to the case, and says where each side
    ran; the case table's candidate verdicts (and the first candidate's 'where') are in view without
    scrolling it sideways."""
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        pg = ctx.new_page()
        pg.goto(page.as_uri())
        pg.wait_for_selector("body[data-ready='1']")
        first = pg.locator("#gate-failing li").first
        box = first.bounding_box()
        assert box["y"] + box["height"] <= 800 and box["x"] + box["width"] <= 1280, box
        items = pg.locator("#gate-failing li").all_text_contents()
        failing = [t for t in items if FAILING.id in t and "[pallas]" in t]
        assert failing and "fail-accuracy" in failing[0] and "tolerance" in failing[0], items
        assert pg.locator("#gate-failing li a").first.get_attribute("href").startswith("#case=")
        ran = pg.locator("#gate-ran").text_content()
        assert (
            ran.startswith("Reference: fla on cpu:test") and "CUDA on NVIDIA H100" in ran and "a TPU (TPU v5e)" in ran
        )
        pg.locator("#case-table").scroll_into_view_if_needed()
        for key in ("nan.v", "nan.l", "pallas.v"):  # each candidate's verdict, the first one's 'where' too
            th = pg.locator(f"#case-table th[data-key='{key}']").bounding_box()
            assert th["x"] + th["width"] <= 1280, (key, th)
    finally:
        ctx.close()


def test_compile_matrix_and_detail_in_browser(compile_tab):
    tab = compile_tab
    assert "fail on tpu7x" in tab.locator("#compile-alert").text_content()
    assert tab.locator("#compile-outcome .big").text_content().strip() == "FAIL"
    cell = tab.locator(f"#compile-matrix tr[data-case='{PASSING.id}'] td[data-target='tpu7x']")
    assert cell.text_content().strip() == "error" and cell.get_attribute("title") == HOSTILE_LINE
    # the case table: the compile column, and "not pass" finds the case whose only problem is the compile
    tab.select_option("#f-verdict", "!pass")
    assert PASSING.id in visible_ids(tab) and COMPILE_ONLY.id in visible_ids(tab)
    row = tab.locator("#case-table tbody tr", has=tab.locator("a", has_text=PASSING.id))
    assert (
        "compile-error" in row.locator("td.compile").text_content()
        and "pallas: tpu7x" in row.locator("td.compile").text_content()
    )
    tab.select_option("#f-verdict", "")
    cell.locator("xpath=..").locator("td.id a").click()  # from the matrix to the case
    tab.wait_for_selector("#detail[data-state='ready']", timeout=60_000)
    assert tab.locator("#detail-title").text_content().endswith(PASSING.id)
    sec = tab.locator("section.compile[data-backend='pallas']")
    assert COMPILE_LABEL in tab.locator("#detail-body").text_content()
    failed = sec.locator(".compile-target[data-target='tpu7x']")
    assert failed.locator("pre.compile-error").text_content() == HOSTILE_COMPILE_ERROR
    assert failed.locator("pre.compile-error mark").text_content() == HOSTILE_OP
    assert sec.locator(".repro code").text_content().startswith("parity compile --case")
    ok = sec.locator(".compile-target[data-target='v5e'] table.compile-kernels")
    assert "192.5 KiB" in ok.text_content() and "f32x6 48" in ok.text_content()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    failed.scroll_into_view_if_needed()
    tab.screenshot(path=str(SCREENSHOTS / "compile-detail.png"), full_page=False)
    # a compile-only case: its detail shows the numerics mismatch in red
    tab.click("#back")
    tab.wait_for_selector("#compile-matrix", state="visible")
    tab.locator("#tpu-compile").scroll_into_view_if_needed()
    tab.screenshot(path=str(SCREENSHOTS / "compile-index.png"), full_page=False)
    tab.locator(f"#compile-matrix tr[data-case='{COMPILE_ONLY.id}'] td.id a").click()
    tab.wait_for_selector("#detail[data-state='ready']", timeout=60_000)
    assert (
        "numerics mismatch"
        in tab.locator("section.compile .compile-target[data-target='v6e'] p.mismatch").text_content()
    )
    assert (
        "numerics check not made" in tab.locator("section.compile .compile-target[data-target='tpu7x']").text_content()
    )
    assert tab.evaluate("window.__pwned") is None
    assert tab.evaluate("document.querySelectorAll('img, b').length") == 0
    assert tab.errors == []


def test_unreadable_compile_record_is_refused_not_skipped(tmp_path):
    """As for result records: what the report cannot read is an error, never silently left out."""
    from parity.records import RecordError

    write_records(tmp_path)
    write_compile_records(tmp_path)
    (tmp_path / "pallas" / "broken.compile.json").write_text("{not json")
    with pytest.raises(RecordError, match="broken.compile.json: unreadable"):
        build_report([tmp_path])


def test_unsupported_is_not_applicable_and_never_outranks_a_pass(tmp_path):
    """The smoke page's bug: pallas passes every case, pallas-fused has no kernel for most; each
    case's headline is its applicable candidates' verdict (pass), a case no candidate applies to
    is 'unsupported' (the word the terminal and the gate print), and a failing candidate still shows."""

    def put(rec):
        write_json(result_path(tmp_path, rec["backend"], rec["case_id"]), rec)

    both = Case("gla", 1, 64, 1, 64, 64, direction="fwd", seed=21)
    fused_only_fails = Case("gla", 1, 64, 1, 64, 64, direction="fwd", seed=22)
    none = Case("gla", 1, 64, 1, 64, 64, direction="fwd", seed=23)
    for case, pallas, fused in (
        (both, "ok", "unsupported"),
        (fused_only_fails, "ok", "ok"),
        (none, "unsupported", "unsupported"),
    ):
        oracle = synthetic_oracle(case)
        put(record(case, "oracle", "oracle", None, oracle))
        put(record(case, "fla", "reference", noisy(oracle, 1e-7, 1), oracle))
        for name, status in (("pallas", pallas), ("pallas-fused", fused)):
            bad = name == "pallas-fused" and case is fused_only_fails
            tensors = noisy(oracle, 1e-2 if bad else 5e-8, 2) if status == "ok" else None
            put(
                record(
                    case,
                    name,
                    "candidate",
                    tensors,
                    oracle,
                    status=status,
                    error="no kernel for op 'gla'" if status != "ok" else None,
                )
            )
    rep = build_report([tmp_path])
    rows = {r["id"]: r for r in rep["rows"]}
    assert rows[both.id]["b"]["pallas-fused"]["v"] == "unsupported" and rows[both.id]["verdict"] == "pass"
    assert rows[fused_only_fails.id]["verdict"] == "fail-accuracy"
    assert rows[none.id]["verdict"] == "unsupported"
    assert rep["summary"]["verdicts"] == {"fail-accuracy": 1, "unsupported": 1, "pass": 1}
    write_report([tmp_path], tmp_path / "index.html")
    html = (tmp_path / "index.html").read_text()
    assert "unsupported 1" in html and "not applicable" not in html
