"""`parity localise CASE --candidate SPEC`: run an op case and each of its stages (cases.stages)
through the oracle, FLA and the candidate, and name the first stage that fails (over its bound, or
not compiling for a TPU target).

The candidate's stages: kernels_jax's stage modules for `pallas` (kernels_jax.<op>.stages), the
mutant's copy of them for `mutant:NAME`, and for a user's candidate the module given with
`--stages MODULE` (FLA's stage functions by name, in the candidate's framework; judged as the
backend NAME.stages). With --tpu-targets, the op and each stage are compiled for those TPUs too,
and a stage that does not compile has failed. Writes the records, localise.json and the page to
--out.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from cases import Case, CaseError
from cases.suites import stage_cases
from parity.cli import args as check
from parity.cli.common import (
    UsageError,
    bound_factor_option,
    interpret_as_option,
    interrupted_status,
    prepare_out,
    tpu_options,
    tpu_targets,
    write_report,
)
from parity.execute.backends import check_specs_isolated, parse_backend_spec
from parity.execute.runner import RunConfig, run_cases
from parity.execute.tpu_identity import choose, exported
from parity.judge.localise import describe, failed, localise_stages
from parity.model.host import tpu_attached
from parity.model.options import OptionError
from parity.model.spec import REFERENCE, STAGE_MODULE
from parity.records import load_latest


def add_parser(sub) -> None:
    sp = sub.add_parser("localise", help="run an op case and each of its stages, and name the first stage that fails")
    sp.add_argument("case", metavar="CASE", help="an op case id (parity cases lists them)")
    sp.add_argument(
        "--candidate",
        metavar="SPEC",
        required=True,
        help="pallas, mutant:NAME, or NAME=FRAMEWORK:MODULE:FUNCTION (the op's function)",
    )
    sp.add_argument(
        "--stages",
        metavar="MODULE",
        help="a user's candidate's stage module: FLA's stage functions under their names (chunk_fwd_h, ...)",
    )
    sp.add_argument("--out", metavar="DIR", type=check.output_dir, help="output directory (default localise/<CASE>)")
    sp.add_argument("-j", "--jobs", metavar="N", type=check.positive_int, default=1, help="parallel worker processes")
    sp.add_argument(
        "--timeout", metavar="S", type=check.seconds, default=900.0, help="seconds per backend call before it is killed"
    )
    bound_factor_option(sp)
    tpu_options(sp)
    interpret_as_option(sp)
    sp.add_argument("--no-html", action="store_true", help="do not write index.html")
    sp.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    sp.set_defaults(fn=cmd_localise)


def _op_case(text: str) -> Case:
    try:
        case = Case.from_id(text)
    except CaseError as e:
        raise OptionError("case", text, "an op case id", str(e)) from None
    if case.stage is not None:
        raise OptionError("case", text, "an op case id (no :stage)", "it is a stage case: run it with parity run")
    if not stage_cases(case):
        raise OptionError("case", text, "a case of an op with stage cases (cases.stages)", f"{case.op} has none")
    return case


def stage_spec(candidate: str, stages: str | None) -> str:
    """The spec of the candidate's stages: the built-in and mutant kernels give their own; a
    user's candidate gives them through --stages MODULE (NAME.stages=FRAMEWORK:MODULE:*)."""
    spec = parse_backend_spec(candidate)
    if spec.side != "candidate":
        raise OptionError("candidate", candidate, "pallas, mutant:NAME or NAME=FRAMEWORK:MODULE:FUNCTION")
    if not spec.is_candidate_spec:
        if stages:
            raise OptionError("stages", stages, f"nothing: {candidate} gives its own stages")
        return candidate
    if not stages:
        raise OptionError("stages", None, "the module of the candidate's stage functions", "no --stages given")
    return f"{spec.name}.stages={spec.framework}:{stages}:{STAGE_MODULE}"


def cmd_localise(a) -> int:
    case = _op_case(a.case)
    stages_text = stage_spec(a.candidate, a.stages)
    texts = list(dict.fromkeys(["oracle", REFERENCE, a.candidate, stages_text]))
    specs = check_specs_isolated(texts, a.timeout)
    cases = [case, *stage_cases(case)]
    out = prepare_out(a.out or Path("localise") / case.id)
    targets = tpu_targets(a)
    identity = None if tpu_attached() else choose(a.tpu_interpret_as, targets)
    print(f"parity localise: {case.id} and its {len(cases) - 1} stages -> {out}", file=sys.stderr)
    with exported(identity):  # the workers read it (parity.execute.tpu_identity)
        config = RunConfig(
            out_dir=out,
            backends=specs,
            jobs=a.jobs,
            timeout_s=a.timeout,
            progress=not a.no_progress,
            tpu_targets=targets,
        )
        summary = run_cases(cases, config)
    if summary["interrupted"]:
        print(f"parity localise: interrupted by {summary['interrupted']}", file=sys.stderr)
        return interrupted_status(summary["interrupted"])
    names = {s.text: s.name for s in specs}
    result = localise_stages(
        case,
        load_latest([out]),
        names[a.candidate],
        names[stages_text],
        a.bound_factor,
        load_latest([out], kind="compile"),
    )
    (out / "localise.json").write_text(json.dumps(result, indent=1))
    print(describe(result))
    if not a.no_html:
        page = write_report([out], out / "index.html")
        if page:
            print(f"report: {page.resolve()}")
    if result["op"]["verdict"] in ("missing", "refused"):
        raise UsageError(f"the op case was not judged: {result['op'].get('detail', '')}")
    return 1 if failed(result["op"]["verdict"]) or result["first"] else 0
