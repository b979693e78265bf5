"""`parity watch`: `parity run` again on every save of a candidate's source, on workers kept warm.

The first round is a plain run. Then every ~0.2 s it reads the modification times of the watched
files: each candidate's module file and the .py files under the working directory it imports
(found by reading their import statements; the harness's own packages are not watched). On a
change it checks the files compile (a syntax error is that round's error: nothing runs), tells the
workers to forget the user's modules and candidates (parity.execute.worker.Reload; jax, torch,
triton and FLA stay imported), runs the cases again on the same workers
(parity.execute.runner.WarmWorkers), prints the table, the gate with each failure's rule and
repro line, rewrites the page and the time from the save to the verdict. A worker that hangs past
--timeout or dies is killed and replaced, as in `parity run`; Ctrl-C kills the workers, exit 130.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import sys
import time
import uuid
from pathlib import Path

from parity.cli import args as check
from parity.cli.common import (
    UsageError,
    interrupted_status,
    prepare_out,
    run_config,
    run_options,
    select_cases,
    tpu_targets,
    write_report,
)
from parity.cli.run import default_backends, judge_run, print_table
from parity.execute.backends import parse_specs
from parity.execute.runner import WarmWorkers, run_cases
from parity.execute.tpu_identity import choose, exported
from parity.model.host import tpu_attached
from parity.records import RecordError

POLL_S = 0.2  # seconds between two looks at the watched files
HARNESS_PACKAGES = ("parity", "cases", "references", "kernels_jax")  # imported by the workers for good


def add_parser(sub) -> None:
    sp = sub.add_parser(
        "watch", help="run cases again on every save of a candidate's source, on warm workers (an edit loop)"
    )
    run_options(sp)
    sp.add_argument(
        "--rounds",
        metavar="N",
        type=check.positive_int,
        default=None,
        help="stop after N rounds (the first run counts; default: until Ctrl-C); exit status: the last round's",
    )
    sp.set_defaults(fn=cmd_watch)


# ------------------------------------------------------------------ what is watched
def module_file(module: str, root: Path) -> Path | None:
    """The source file of `module` under `root` (root/a/b.py or root/a/b/__init__.py), or None."""
    base = root.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path.resolve()
    return None


def _imported_names(path: Path, module: str) -> list[str]:
    """The modules `path` (the source of `module`) imports, relative imports resolved; [] when it
    does not parse (the round reports the syntax error)."""
    try:
        tree = ast.parse(path.read_bytes(), str(path))
    except (SyntaxError, ValueError, OSError):
        return []
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".") if package else []
                parts = parts[: len(parts) - (node.level - 1)] if node.level > 1 else parts
                base = ".".join([*parts, base] if base else parts)
            names.append(base)
            names += [f"{base}.{a.name}" for a in node.names]  # `from pkg import submodule`
    return [n for n in names if n]


def watched_files(modules: list[str], root: Path) -> dict[str, Path]:
    """module -> file of the candidates' `modules` and of every module under `root` they import,
    directly or not (the harness's own packages left out)."""
    found: dict[str, Path] = {}
    todo = list(modules)
    while todo:
        name = todo.pop()
        if name in found or name.split(".")[0] in HARNESS_PACKAGES:
            continue
        path = module_file(name, root)
        if path is None:
            continue
        found[name] = path
        parents = [".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)]  # imported with it
        todo += parents + _imported_names(path, name)
    return found


def stamps(files) -> dict[Path, tuple[int, int] | None]:
    """(mtime in ns, size) of each file; None for one that is gone."""
    out = {}
    for f in files:
        try:
            st = os.stat(f)
            out[f] = (st.st_mtime_ns, st.st_size)
        except OSError:
            out[f] = None
    return out


def syntax_errors(files) -> list[str]:
    """'file:line: SyntaxError: message' of each watched file that does not compile (or cannot be read)."""
    out = []
    for f in files:
        try:
            compile(Path(f).read_bytes(), str(f), "exec", dont_inherit=True)
        except SyntaxError as e:
            out.append(f"{f}:{e.lineno}: {type(e).__name__}: {e.msg}")
        except (OSError, ValueError) as e:
            out.append(f"{f}: cannot be read: {e}")
    return out


# ------------------------------------------------------------------ the loop
def cmd_watch(a) -> int:
    started = time.time()
    cases = select_cases(a)
    if not cases:
        raise UsageError("no cases selected")
    texts = list(a.backends or default_backends(cases)) + list(a.candidate or [])
    specs = parse_specs(texts)  # SpecError: parity.cli.main writes it; the modules load in the workers
    modules = [s.module_function()[0] for s in specs if s.side == "candidate" and s.is_candidate_spec]
    root = Path.cwd()
    if not watched_files(modules, root):
        raise UsageError(
            f"nothing to watch: no candidate module of {texts} has its source under {root} "
            "(--candidate NAME=jax:MODULE:FUNCTION, run from the module's directory)"
        )
    targets = tpu_targets(a)
    out = prepare_out(a.out or Path(f"reports/{a.suite or 'watch'}"))
    # one run id for every round (the warm workers write it); no progress bar between the rounds' verdicts
    cfg = run_config(a, out, specs, targets, run_id="watch-" + uuid.uuid4().hex[:8])
    cfg = dataclasses.replace(cfg, progress=False)
    identity = None if tpu_attached() else choose(a.tpu_interpret_as, targets)
    rc = 0
    try:
        with exported(identity), WarmWorkers(cfg, max(1, min(a.jobs, len(cases))), cases) as warm:
            rounds, files, since = 0, watched_files(modules, root), started
            while True:
                rounds += 1
                before = stamps(files.values())  # a save while the round runs starts the next one
                rc = _round(rounds, cases, cfg, warm, files, since, out, specs, a)
                if rc >= 128:
                    return rc
                if a.rounds is not None and rounds >= a.rounds:
                    return rc
                names = ", ".join(sorted(os.path.relpath(f, root) for f in files.values()))
                print(f"watch: waiting for a save of {names} (Ctrl-C ends)", file=sys.stderr, flush=True)
                new, since = _wait_for_change(modules, root, files, before)
                gone = {**files, **new}  # the modules imported before the save and after it
                warm.reload(list(gone), [str(f) for f in gone.values()])
                files = new
    except KeyboardInterrupt:
        print("parity watch: interrupted; workers ended", file=sys.stderr)
        return interrupted_status("SIGINT")


def _wait_for_change(
    modules: list[str], root: Path, files: dict[str, Path], before: dict
) -> tuple[dict[str, Path], float]:
    """Poll the watched files until one differs from `before` (their stamps) or the set of them
    changes; (the watched files now, the time of the save: the newest changed file's mtime)."""
    while True:
        now_files = watched_files(modules, root) or files
        now = stamps(set(files.values()) | set(now_files.values()))
        changed = [f for f in now if now[f] != before.get(f)]
        if changed:
            saved = max((now[f][0] / 1e9 for f in changed if now[f]), default=time.time())
            return now_files, min(saved, time.time())
        time.sleep(POLL_S)


def _round(n: int, cases, cfg, warm: WarmWorkers, files: dict[str, Path], since: float, out: Path, specs, a) -> int:
    """One round: the files' syntax checked, the cases run and judged, the page written, the time
    from `since` (the save; the start for round 1) to the verdict printed. Its exit status."""
    what = "start" if n == 1 else "save"
    errors = syntax_errors(files.values())
    if errors:
        for e in errors:
            print(f"watch: round {n}: error: {e}", flush=True)
        print(f"watch: round {n}: ERROR (nothing run) {time.time() - since:.1f} s from {what} to verdict", flush=True)
        return 2
    print(f"watch: round {n}: running {len(cases)} cases", file=sys.stderr, flush=True)
    summary = run_cases(cases, cfg, warm=warm)
    if summary["interrupted"]:
        print(f"parity watch: interrupted by {summary['interrupted']}; workers ended", file=sys.stderr)
        return interrupted_status(summary["interrupted"])
    gate, rc, gate_text = judge_run(out, specs, summary, a)
    print_table(summary, gate)
    if gate_text:
        print(gate_text)
    try:
        page = write_report([out], out / "index.html")
        if page:
            print(f"report: {page.resolve()}")
    except RecordError as e:
        print(f"report: not written: {e}", file=sys.stderr)
        rc = rc or 2
    verdict = {0: "PASS", 1: "FAIL"}.get(rc, "ERROR")
    print(f"watch: round {n}: {verdict} {time.time() - since:.1f} s from {what} to verdict", flush=True)
    return rc
