"""`parity repro`: write one case's inputs, its oracle outputs and a standalone script that
reruns it against a backend (parity.repro)."""

from __future__ import annotations

from pathlib import Path

from cases import Case, CaseError
from parity.cli import args as check
from parity.cli.common import UsageError, limit_options
from parity.execute.backends import SpecError, check_specs
from parity.model import options
from parity.repro import write_repro


def add_parser(sub) -> None:
    sp = sub.add_parser("repro", help="write one case's inputs, oracle and a standalone script that reruns it")
    sp.add_argument("case_id")
    sp.add_argument("--backend", default="pallas", help="pallas, pallas-fused or fla (default pallas)")
    sp.add_argument("--candidate", help="NAME=FRAMEWORK:MODULE:FUNCTION instead of a built-in kernel")
    sp.add_argument("-o", "--output", type=check.output_dir, required=True)
    limit_options(sp)
    sp.set_defaults(fn=cmd_repro)


def cmd_repro(a) -> int:
    try:
        case = Case.from_id(a.case_id)
        options.check_size(case, a.max_elements, a.max_bytes)
        spec = a.candidate or a.backend
        check_specs([spec])
        path = write_repro(case, spec, Path(a.output))
    except SpecError as e:
        if e.field == "backends":  # repro takes its one backend as --backend
            e.field = "backend"
        raise
    except options.OptionError:
        raise  # parity.cli.main writes it with its flag
    except (CaseError, ValueError) as e:
        raise UsageError(str(e)) from None
    print(
        f"wrote {path.parent}/ (inputs.npz, oracle.npz, case.json, repro.py); run: cd {path.parent} && python repro.py"
    )
    return 0
