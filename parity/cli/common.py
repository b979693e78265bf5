"""What several `parity` commands share: the refused-input error, the case selection and its
options, the TPU target options, the output directory check and the HTML report."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from cases import OPS, Case, CaseError, check_size, get_suite, load_cases_file
from cases.inputs import MAX_INPUT_BYTES, MAX_INPUT_ELEMENTS
from parity.cli import args as check
from parity.model.targets import TARGETS, parse_targets

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
        type=check.positive_int,
        default=MAX_INPUT_ELEMENTS,
        help=f"refuse a case whose inputs exceed this many elements (default {MAX_INPUT_ELEMENTS})",
    )
    sp.add_argument(
        "--max-bytes",
        type=check.positive_int,
        default=MAX_INPUT_BYTES,
        help=f"refuse a case whose inputs exceed this many bytes in float64 (default {MAX_INPUT_BYTES})",
    )


def selection_options(sp, single: bool = False) -> None:
    """--suite, --cases, (with single) --case, --op and the size limits: read by select_cases."""
    sp.add_argument("--suite", help="smoke, ci, stability, varlen, full, models, fla-tests")
    sp.add_argument("--cases", help="JSON file: a list of case dicts or ids")
    if single:
        sp.add_argument("--case", action="append", help="a case id (repeatable)")
    sp.add_argument("--op", help="only this op: " + ", ".join(OPS))
    limit_options(sp)


def tpu_options(sp) -> None:
    sp.add_argument(
        "--tpu-targets",
        default=None,
        help=f"compile jax candidates for these TPU targets ({', '.join(TARGETS)}) or 'none'; "
        "default v5e,v6e,tpu7x where libtpu is installed and no TPU is attached",
    )


def interpret_as_option(sp) -> None:
    sp.add_argument(
        "--tpu-interpret-as",
        type=interpret_target,
        default=None,
        metavar="TARGET",
        help=f"off a TPU, jax candidates run in TPU interpret mode and pltpu.get_tpu_info() answers as this "
        f"TPU ({', '.join(TARGETS)}); default the first of --tpu-targets, else v5e (parity.execute.tpu_identity)",
    )


def interpret_target(s: str) -> str:
    """--tpu-interpret-as: one TPU target (argparse type: the parser prints one line, exit 2)."""
    if s not in TARGETS:
        raise argparse.ArgumentTypeError(f"{s!r} is invalid: expected one of {list(TARGETS)}")
    return s


def select_cases(a) -> list[Case]:
    sources = sum(bool(x) for x in (a.suite, getattr(a, "cases", None), getattr(a, "case", None)))
    if sources != 1:
        raise UsageError(
            "give exactly one of --suite NAME, --cases FILE" + (", --case ID" if hasattr(a, "case") else "")
        )
    try:
        if a.suite:
            cases = get_suite(a.suite)
        elif a.cases:
            cases = load_cases_file(a.cases)
        else:
            cases = [Case.from_id(i) for i in a.case]
    except CaseError as e:
        raise UsageError(str(e)) from None
    if a.op:
        if a.op not in OPS:
            raise UsageError(f"unknown op {a.op!r}: expected one of {list(OPS)}")
        cases = [c for c in cases if c.op == a.op]
    for c in cases:
        check_size(c, a.max_elements, a.max_bytes)
    return cases


def tpu_targets(a) -> tuple[str, ...]:
    try:
        return parse_targets(a.tpu_targets)
    except ValueError as e:
        raise UsageError(str(e)) from None


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
