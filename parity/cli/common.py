"""What several `parity` commands share: the refused-input error, the case selection and its
options, the TPU target options, the output directory check and the HTML report. The values'
checks are parity.model.options's, shared with the pytest plugin; an OptionError they raise
is printed by parity.cli.main with this surface's flag prefix (`--`)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from cases import OPS, Case
from cases.inputs import MAX_INPUT_BYTES, MAX_INPUT_ELEMENTS
from parity.cli import args as check
from parity.model import options
from parity.model.targets import TARGETS

try:
    # optional: without the HTML report module, commands write no page (`parity report` exits 2)
    from parity.html import write_report as html_report
except ImportError:
    html_report = None


class UsageError(Exception):
    """One line for stderr, exit 2."""


def limit_options(sp) -> None:
    sp.add_argument(
        "--max-elements",
        metavar="N",
        type=check.size_limit,
        default=MAX_INPUT_ELEMENTS,
        help=f"refuse a case whose inputs exceed this many elements (default {MAX_INPUT_ELEMENTS})",
    )
    sp.add_argument(
        "--max-bytes",
        metavar="N",
        type=check.size_limit,
        default=MAX_INPUT_BYTES,
        help=f"refuse a case whose inputs exceed this many bytes in float64 (default {MAX_INPUT_BYTES})",
    )


def selection_options(sp, single: bool = False) -> None:
    """--suite, --cases, (with single) --case, --op and the size limits: read by select_cases."""
    sp.add_argument(
        "--suite",
        metavar="NAME",
        help="smoke, ci, stability, varlen, full, stages, models, fla-tests; several joined by commas (ci,stages)",
    )
    sp.add_argument("--cases", metavar="FILE", help="JSON file: a list of case dicts or ids")
    if single:
        sp.add_argument("--case", metavar="ID", action="append", help="a case id (repeatable)")
    sp.add_argument("--op", metavar="OP", help="only this op: " + ", ".join(OPS))
    limit_options(sp)


def tpu_options(sp) -> None:
    sp.add_argument(
        "--tpu-targets",
        metavar="LIST",
        default=None,
        help=f"compile jax candidates for these TPU targets ({', '.join(TARGETS)}) or 'none'; "
        "default v5e,v6e,tpu7x where libtpu is installed and no TPU is attached",
    )


def fla_options(sp) -> None:
    """How FLA runs on the reference side: its lanes, the fallback for cases CUDA refuses, pinned configs."""
    sp.add_argument(
        "--fla-lanes",
        metavar="N",
        type=check.fla_lanes,
        default=None,
        help="long-lived processes that run FLA for every worker (see docs/fla-on-gpu.md): auto (default: one "
        "per CUDA GPU, none without one: FLA then runs in the workers) or N (on a CPU: N interpreter lanes)",
    )
    sp.add_argument(
        "--fla-fallback",
        metavar="WHERE",
        type=check.fla_fallback,
        default=False,
        help="where a case goes that FLA on CUDA refuses for a known reason of its environment "
        "(parity.model.fla_known): none (default: the record says why, the gate fails the pair) or "
        "interpreter (FLA in Triton's interpreter on this machine, the record says so)",
    )
    sp.add_argument(
        "--fla-configs",
        metavar="FILE",
        type=check.fla_configs,
        default=None,
        help="pin FLA's autotuned kernels to the configs in FILE (an FLA record of an earlier run, or a list "
        "of its notes.fla_launches), so two runs or machines run FLA alike",
    )


def bound_factor_option(sp) -> None:
    sp.add_argument(
        "--bound-factor",
        metavar="F",
        type=check.bound_factor,
        default=options.DEFAULT_BOUND_FACTOR,
        help="compute error of the candidate <= F x the reference's (default 1; parity.measure.compute_error)",
    )


def interpret_as_option(sp) -> None:
    sp.add_argument(
        "--tpu-interpret-as",
        type=check.interpret_as,
        default=None,
        metavar="TARGET",
        help=f"off a TPU, jax candidates run in TPU interpret mode and pltpu.get_tpu_info() answers as this "
        f"TPU ({', '.join(TARGETS)}); default the first of --tpu-targets, else v5e (parity.execute.tpu_identity)",
    )


def select_cases(a) -> list[Case]:
    """The cases selection_options chose (parity.model.options.select_cases)."""
    case_ids = (a.case or []) if hasattr(a, "case") else None  # None: the command has no --case
    return options.select_cases(a.suite, a.cases, case_ids, a.op, a.max_elements, a.max_bytes)


def tpu_targets(a) -> tuple[str, ...]:
    """The TPU targets of --tpu-targets (parity.model.options.tpu_targets)."""
    return options.tpu_targets(a.tpu_targets)


def interrupted_status(signal_name: str) -> int:
    """The exit status of a run a signal ended ("SIGINT" or "SIGTERM"): 128 + its number."""
    return 130 if signal_name == "SIGINT" else 143


def prepare_out(out: Path) -> Path:
    """Create the output directory and prove it writable, before any worker starts."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=out).close()
    except OSError as e:
        raise UsageError(f"--out {str(out)!r}: cannot write there: {e.strerror or e}") from None
    return out


def write_report(dirs: list[Path], out: Path) -> Path | None:
    """The HTML report of the run directories at `out`; None without the HTML report module."""
    if html_report is None:
        return None
    return html_report(dirs, out)
