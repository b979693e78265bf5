"""`parity repro`: write one case's inputs, its oracle outputs, the reference's record and a
script that reruns it against a backend and prints the harness's verdict (parity.repro)."""

from __future__ import annotations

from pathlib import Path

from cases import Case, CaseError
from parity.cli import args as check
from parity.cli.common import UsageError, limit_options
from parity.execute.backends import SpecError, check_specs
from parity.model import options
from parity.repro import write_repro


def add_parser(sub) -> None:
    sp = sub.add_parser(
        "repro", help="write one case's inputs, oracle and reference record, and a script that reruns and judges it"
    )
    sp.add_argument("case_id", help="the case, by id (as `parity cases` lists them)")
    sp.add_argument("--backend", metavar="NAME", default="pallas", help="pallas, pallas-fused or fla (default pallas)")
    sp.add_argument("--candidate", metavar="SPEC", help="NAME=FRAMEWORK:MODULE:FUNCTION instead of a built-in kernel")
    sp.add_argument("-o", "--output", metavar="DIR", type=check.output_dir, required=True, help="directory to write")
    ref = sp.add_mutually_exclusive_group()
    ref.add_argument(
        "--reference",
        metavar="RUN_DIR",
        help="a run directory holding the reference's (fla's) record of the case, e.g. the original run's "
        "--out or a GPU machine's report directory: the script's bound uses it (default: run fla here)",
    )
    ref.add_argument("--no-reference", action="store_true", help="no reference: the script judges the tolerance alone")
    limit_options(sp)
    sp.set_defaults(fn=cmd_repro)


def cmd_repro(a) -> int:
    try:
        case = Case.from_id(a.case_id)
        options.check_size(case, a.max_elements, a.max_bytes)
        spec = a.candidate or a.backend
        check_specs([spec])
        reference = Path(a.reference) if a.reference else None
        path = write_repro(case, spec, Path(a.output), reference, run_reference=not a.no_reference)
    except SpecError as e:
        if e.field == "backends":  # repro takes its one backend as --backend
            e.field = "backend"
        raise
    except options.OptionError:
        raise  # parity.cli.main writes it with its flag
    except (CaseError, ValueError) as e:
        raise UsageError(str(e)) from None
    print(f"wrote {path.parent}/ (inputs, oracle.npz, case.json, judge.json, repro.py); run: python {path}")
    return 0
