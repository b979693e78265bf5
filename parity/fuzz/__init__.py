"""`parity fuzz`: a hypothesis search over the case space for the failing case no suite names,
shrunk to the smallest one.

Each example is a Case drawn by `cases.strategies.boundary_case` (lengths at the chunk grid,
one-token tails, length-1 packed sequences, tile-edge head dims, H > 2, K != V, gates into
the overflow regime), in a space narrowed to where the candidate has a kernel and bounded by
`max_elements`, then (while searching, not while shrinking) up to `variants` value variants of it
(`cases.strategies.value_variant`: the same shape class, so the same compiled programs, with another
gate of the same kind, gate strength and seed), while their time stays under `variant_share` times
the drawn case's own: a new shape class costs its XLA compiles (seconds in TPU interpret mode), a
variant only the program's run. Every case of the space can still be drawn (the drawn case is any
boundary_case). Each runs exactly as `parity run` runs a case: in a runner worker process
(`parity.execute.case.run_case`: oracle first, one record per backend, the comparator and `_tol`),
with the per-backend timeout; a worker that hangs or dies costs that backend's record, which
says so. The property is the gate's own verdict for the subject:
    a candidate, with the reference (fla) among the backends   parity.judge.case.judge_case: tolerance,
                                                              the TPU <= GPU bound, NaN/Inf, error, timeout
    a candidate, without a reference                          its record's verdict (as `parity run`)
    no candidate, backends oracle,fla                         FLA's record: findings about the reference
Anything but pass fails the example (a crash, a timeout, an unserialisable result included);
`unsupported` (no kernel) and a case the oracle could not compute are not evaluated
(hypothesis rejects them; the summary counts them). A failure is shrunk by hypothesis to
the smallest failing case, then one field at a time (Search.simplify: B = 1, fewer sequences and
heads, smaller dims and T, ... each a single run, where hypothesis's generic shrinker spends many
runs on one field). While nothing fails, `hypothesis.target` steers towards the
largest eps/tol and eps/bound ratios per tensor (ratios of the numbers the gate computed),
and the worst margin per op, dtype and tensor is reported.

Time: the search stops drawing at `time_s`; shrinking a failure has `shrink_time_s` more
(HYPOTHESIS_SHRINK_SHARE of it for hypothesis's shrinker, the rest for Search.simplify).
Outputs under OUT:
    found.json            every minimal failing case found (a JSON list of case dicts, appended;
                          `parity run --cases OUT/found.json` replays it)
    found/<case_id>/      its records and manifest (`parity gate` reads it) and repro/ (`parity repro`)
    fuzz.json             the summary: searches, examples, failures, time to find, worst margins
    fuzz.html             the page of found cases and worst margins (parity.fuzz.page)
    .hypothesis/          hypothesis's example database (a rerun also tries found.json's cases first)
A candidate function may carry `applies(case) -> bool` (parity.mutants.narrow' do) to say
where it has a kernel; built-in kernels and mutants are asked through their backend.

Modules: config (FuzzConfig, the narrowed Space), judgement (the property: judge), search
(CaseRunner, Search), found (OUT/found/ and found.json), page (fuzz.html); here the searches of
every op (run_searches, run_fuzz) and the terminal report (format_summary).
"""

from __future__ import annotations

import math
import multiprocessing as mp
import shutil
import sys
import time
from pathlib import Path

from parity.execute.proc import die_with_parent, start
from parity.fuzz.config import (
    DEFAULT_MAX_ELEMENTS,
    DEFAULT_VARIANT_SHARE,
    DEFAULT_VARIANTS,
    FuzzConfig,
    applies_predicate,
    space_for,
)
from parity.fuzz.found import FOUND_FILE, append_found, read_found, save_found
from parity.fuzz.judgement import NOT_EVALUATED, Judgement, judge
from parity.fuzz.page import write_page
from parity.fuzz.search import CaseRunner, FuzzFailure, Search
from parity.measure import tpu_numerics
from parity.records import write_json


def _search_in_child(cfg: FuzzConfig, op: str, index: int, conn) -> None:
    die_with_parent()
    try:
        conn.send(("ok", Search(cfg, op, index).run()))
    except BaseException as e:  # noqa: BLE001 - reported by the parent
        import traceback

        conn.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=-4)}"))


def run_searches(cfg: FuzzConfig, op: str) -> list[dict]:
    """cfg.jobs independent searches of `op` (seeds seed, seed + 1, ...), in worker processes
    when jobs > 1."""
    if cfg.jobs == 1:
        return [Search(cfg, op, 0).run()]
    procs = []
    for i in range(cfg.jobs):
        parent, child = mp.Pipe()
        p = start(_search_in_child, (cfg, op, i, child), daemon=False)
        child.close()
        procs.append((p, parent))
    results = []
    try:
        for i, (p, conn) in enumerate(procs):
            try:
                status, value = conn.recv()
            except EOFError:
                status, value = "error", f"search process died (exit code {p.exitcode})"
            p.join()
            if status != "ok":
                raise RuntimeError(f"search {op} #{i} failed: {value}")
            results.append(value)
    finally:
        for p, _ in procs:
            if p.is_alive():
                p.kill()
    return results


def merge_worst(searches: list[dict]) -> dict:
    """op -> "dtype/tensor/kind" -> the worst margin over the searches, and where."""
    out: dict[str, dict] = {}
    for s in searches:
        for key, w in s["worst"].items():
            cur = out.setdefault(s["op"], {}).get(key)
            if cur is None or w["margin"] > cur["margin"]:
                out[s["op"]][key] = w
    return out


def run_fuzz(cfg: FuzzConfig) -> dict:
    """Every op's searches; writes found/, found.json, fuzz.json and fuzz.html; returns the summary."""

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    read_found(out / FOUND_FILE)  # refuse a malformed found.json before searching
    t0 = time.perf_counter()
    searches = []
    with tpu_numerics.exported(cfg.numerics):  # the workers inherit it, for this search only, as in run_cases
        for op in cfg.ops:
            searches += run_searches(cfg, op)
    found, seen = [], set()
    for s in searches:
        if s["minimal"] and s["minimal"] not in seen:
            seen.add(s["minimal"])
            found.append(save_found(cfg, s))
    for s in searches:
        shutil.rmtree(s["work"], ignore_errors=True)
    shutil.rmtree(out / ".work", ignore_errors=True)
    summary = {
        "kind": "fuzz",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "argv": sys.argv,
        "subject": cfg.subject,
        "candidate": cfg.candidate,
        "backends": list(cfg.specs),
        "reference_searched": cfg.candidate is None,
        "ops": list(cfg.ops),
        "jobs": cfg.jobs,
        "time_s": cfg.time_s,
        "shrink_time_s": cfg.shrink_time_s,
        "max_elements": cfg.max_elements,
        "seed": cfg.seed,
        "variants": cfg.variants,
        "variant_share": cfg.variant_share,
        "wall_s": time.perf_counter() - t0,
        "platforms": sorted({p for s in searches for p in s["platforms"]}),
        "found": found,
        "worst": merge_worst(searches),
        "searches": [{k: v for k, v in s.items() if k not in ("worst", "work")} for s in searches],
    }
    write_json(out / "fuzz.json", _finite(summary))
    try:
        summary["page"] = str(write_page(summary, out / "fuzz.html"))
    except ImportError:
        summary["page"] = None
    return summary


def _finite(obj):
    """inf margins (NaN/Inf outputs) as the string 'inf' for JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return "inf" if obj > 0 else str(obj)
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


def format_summary(summary: dict) -> str:
    """The terminal report; a failure's minimal case id is the last line."""
    lines = []
    who = (
        f"the reference ({summary['subject']}) against the oracle"
        if summary["reference_searched"]
        else f"candidate {summary['subject']}"
    )
    for s in summary["searches"]:
        lines.append(
            f"fuzz {s['op']} #{s['index']} (seed {s['seed']}): {who}: {s['examples']} examples in "
            f"{s['wall_s']:.0f} s ({s['unsupported']} unsupported, {s['oracle-failed']} oracle failures not "
            f"evaluated; {s['shape_classes']} shape classes, {s['xla_compiles']} XLA compiles in "
            f"{s['xla_compile_s']:.0f} s); stopped by {s['stopped']}"
            + (
                f"; failure found after {s['time_to_find_s']:.0f} s ({s['examples_to_find']} examples), "
                f"shrunk in {s['shrink_s']:.0f} s "
                f"over {len(s['failing'])} failing cases"
                if s["minimal"]
                else ""
            )
        )
    for op, worst in summary["worst"].items():
        lines.append(f"worst margins, {op} (eps / limit; > 1 fails):")
        for key in sorted(worst):
            w = worst[key]
            lines.append(f"  {key:28s} {w['margin']:.3g}  {w['case_id']}")
    for f in summary["found"]:
        kind = "FINDING about the reference" if summary["reference_searched"] else "FAIL"
        lines.append(
            f"{kind} [{f['subject']}] {f['verdict']}: {f['detail']}\n  records: {f['records']}\n  repro: {f['repro']}"
        )
    if summary["found"]:
        lines.append(
            f"found.json: {Path(summary['found'][0]['records']).parents[1] / FOUND_FILE} "
            f"(parity run --cases replays it)"
        )
        lines.append(summary["found"][-1]["case_id"])
    else:
        lines.append(f"fuzz: no failure in {sum(s['examples'] for s in summary['searches'])} examples")
    return "\n".join(lines)


__all__ = [
    "FuzzConfig",
    "run_fuzz",
    "run_searches",
    "format_summary",
    "judge",
    "Judgement",
    "space_for",
    "applies_predicate",
    "CaseRunner",
    "Search",
    "FuzzFailure",
    "save_found",
    "read_found",
    "append_found",
    "DEFAULT_MAX_ELEMENTS",
    "DEFAULT_VARIANTS",
    "DEFAULT_VARIANT_SHARE",
    "NOT_EVALUATED",
    "FOUND_FILE",
]
