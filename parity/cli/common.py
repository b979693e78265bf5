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
from parity.execute import interrupts
from parity.execute.runner import RunConfig
from parity.measure.compute_error import SEEDS_MAX, SEEDS_MIN
from parity.model import options
from parity.model.options import ALLOW_UNBOUNDED_REFERENCE, FLA_AUTOTUNE, FRESH
from parity.model.spec import FRAMEWORKS
from parity.model.targets import TARGETS

try:
    # optional: without the HTML report module, commands write no page (`parity report` exits 2)
    from parity.html import write_report as html_report
except ImportError:
    html_report = None


DEFAULT_BACKENDS = "oracle,fla,pallas,pallas-fused"


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
        metavar="PATH",
        type=check.fla_configs,
        default=None,
        help="the configs FLA's autotuned kernels run: a FILE pins them (an FLA record of an earlier run, or a "
        "list of its notes.fla_launches), so two runs or machines run FLA alike; a DIR is an FLA config "
        "table (KERNEL.json, FLA_CONFIG_DIR's format; default on CUDA: the table shipped for the GPU); keys "
        "neither names run the rule's config (docs/fla-on-gpu.md)",
    )
    sp.add_argument("--" + FLA_AUTOTUNE.name, action="store_true", help=FLA_AUTOTUNE.help)


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
    return interrupts.exit_status(signal_name)


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


def run_options(sp) -> None:
    """The options of what runs and how it is judged, `parity run`'s and `parity watch`'s: the cases,
    the backends and candidates, the output directory, the workers, the seeds, the gate's, the TPU's
    and FLA's (read by run_config and judge_run)."""
    selection_options(sp, single=True)
    sp.add_argument(
        "--backends",
        metavar="LIST",
        type=check.backend_list,
        default=None,
        help=f"comma-separated (default {DEFAULT_BACKENDS}, less the built-in kernels that have "
        "no kernel for any selected case)",
    )
    sp.add_argument(
        "--candidate",
        metavar="SPEC",
        action="append",
        help=f"NAME=FRAMEWORK:MODULE:FUNCTION, FRAMEWORK one of {', '.join(FRAMEWORKS)} (repeatable)",
    )
    sp.add_argument("--out", metavar="DIR", type=check.output_dir, help="output directory (default reports/<suite>)")
    sp.add_argument("-j", "--jobs", metavar="N", type=check.positive_int, default=1, help="parallel worker processes")
    sp.add_argument(
        "--timeout",
        metavar="S",
        type=check.seconds,
        default=900.0,
        help="seconds a worker may spend on one backend of a case (its import included) before it is killed",
    )
    bound_factor_option(sp)
    sp.add_argument(
        "--seeds",
        metavar="MIN:MAX",
        type=check.seeds,
        default=(SEEDS_MIN, SEEDS_MAX),
        help=f"input seeds per case, MIN:MAX (default {SEEDS_MIN}:{SEEDS_MAX}): the case's own seed, then seeds "
        "derived from it while the bound is undecided (fewer than MIN only when far from the bound)",
    )
    sp.add_argument(
        "--allow-inconclusive",
        action="store_true",
        help="the run's own gate passes a tensor whose bound stays undecided at MAX seeds (listed apart)",
    )
    sp.add_argument(
        "--" + ALLOW_UNBOUNDED_REFERENCE.name,
        action="store_true",
        help="the run's own gate: " + ALLOW_UNBOUNDED_REFERENCE.help,
    )
    sp.add_argument("--" + FRESH.name, action="store_true", help=FRESH.help)
    tpu_options(sp)
    interpret_as_option(sp)
    fla_options(sp)
    sp.add_argument(
        "--tpu-numerics",
        metavar="MODEL",
        default="",
        choices=["", "tpu-mxu-v1", "float32"],
        help="how jax candidates' dots compute off a TPU: tpu-mxu-v1 (default: as the TPU's MXU) "
        "or float32 (interpret mode's own, for comparison)",
    )


def run_config(a, out: Path, specs, targets, run_id: str = "") -> RunConfig:
    """The RunConfig of run_options' values `a`."""
    return RunConfig(
        out_dir=out,
        backends=specs,
        jobs=a.jobs,
        timeout_s=a.timeout,
        run_id=run_id,
        progress=not getattr(a, "no_progress", False),
        tpu_targets=targets,
        numerics=a.tpu_numerics,
        seeds=a.seeds,
        fla_lanes=a.fla_lanes,
        fla_fallback=a.fla_fallback,
        fla_configs=a.fla_configs,
        fla_autotune=getattr(a, FLA_AUTOTUNE.dest),
        fresh=getattr(a, FRESH.dest),
    )
