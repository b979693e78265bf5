"""`parity fuzz`: a hypothesis search over the case space for a case where the candidate (or,
with --backends oracle,fla and no candidate, FLA itself) fails; shrinks what it finds
(parity.fuzz)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cases import OPS
from cases.strategies import Space
from parity.cli import args as check
from parity.cli.common import UsageError, bound_factor_option, interpret_as_option, prepare_out
from parity.execute.backends import BUILTIN, check_specs_isolated
from parity.execute.tpu_identity import choose, exported
from parity.fuzz import (
    DEFAULT_VARIANT_SHARE,
    DEFAULT_VARIANTS,
    FuzzConfig,
    applies_predicate,
    format_summary,
    read_found,
    run_fuzz,
    space_for,
)


def _seed(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        v = -1
    if v < 0:
        raise argparse.ArgumentTypeError(f"{s!r} is invalid: expected an int >= 0")
    return v


def add_parser(sub) -> None:
    sp = sub.add_parser("fuzz", help="hypothesis search over the case space for a failing case; shrinks it")
    sp.add_argument(
        "--op",
        metavar="OP",
        help="op(s) to search, comma-separated: " + ", ".join(OPS) + " (default: every op the "
        "candidate has a kernel for)",
    )
    sp.add_argument(
        "--backends",
        metavar="LIST",
        type=check.backend_list,
        default=check.backend_list("oracle"),
        help="oracle, or oracle,fla to enforce the bound against FLA (default oracle)",
    )
    sp.add_argument(
        "--candidate",
        metavar="SPEC",
        help="the kernel searched: pallas, pallas-fused, mutant:NAME or "
        "NAME=FRAMEWORK:MODULE:FUNCTION (none with --backends oracle,fla: FLA itself)",
    )
    search_budget_options(sp)
    bound_factor_option(sp)
    sp.add_argument(
        "--out",
        metavar="DIR",
        type=check.output_dir,
        default="reports/fuzz",
        help="output directory (default reports/fuzz)",
    )
    sp.add_argument(
        "--tpu-numerics",
        metavar="MODEL",
        default="",
        choices=["", "tpu-mxu-v1", "float32"],
        help="how jax candidates' dots compute off a TPU, as for parity run (default tpu-mxu-v1)",
    )
    interpret_as_option(sp)
    sp.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    sp.set_defaults(fn=cmd_fuzz)


def search_budget_options(sp) -> None:
    """How long each search draws and shrinks, how many run, and how large a drawn case may be."""
    sp.add_argument(
        "--time",
        metavar="S",
        type=check.seconds,
        default=60.0,
        help="seconds per op and search to draw examples (default 60)",
    )
    sp.add_argument(
        "--shrink-time",
        metavar="S",
        type=check.seconds,
        default=300.0,
        help="seconds more to shrink a failure once found (default 300)",
    )
    sp.add_argument(
        "--max-examples", metavar="N", type=check.positive_int, default=10**6, help="examples per search at most"
    )
    sp.add_argument(
        "--seed", metavar="N", type=_seed, default=0, help="seed of the search (search i of -j uses seed + i)"
    )
    sp.add_argument(
        "-j", "--jobs", metavar="N", type=check.positive_int, default=1, help="independent searches per op, in parallel"
    )
    sp.add_argument(
        "--timeout",
        metavar="S",
        type=check.seconds,
        default=300.0,
        help="seconds a backend may spend on one case before it is killed (a finding)",
    )
    sp.add_argument(
        "--max-elements",
        metavar="N",
        type=check.positive_int,
        default=2**18,
        help="input elements of a drawn case at most (default 2^18: seconds per example on a CPU)",
    )
    sp.add_argument(
        "--max-t",
        metavar="T",
        type=check.positive_int,
        default=None,
        help="sequence length T of a drawn case at most (default: the space's, "
        f"{Space.__dataclass_fields__['max_T'].default})",
    )
    sp.add_argument(
        "--variants",
        metavar="N",
        type=check.count,
        default=DEFAULT_VARIANTS,
        help="examples run after each drawn case with the same shapes and new gate, gate parameters and seed, "
        f"on the programs compiled for it, at most (default {DEFAULT_VARIANTS}; 0: none)",
    )
    sp.add_argument(
        "--variant-share",
        metavar="R",
        type=check.bound_factor,
        default=DEFAULT_VARIANT_SHARE,
        help="time the variants of a drawn case may take, as a multiple of that case's own time (its compiles "
        f"included; default {DEFAULT_VARIANT_SHARE:g}): more is more examples per second, fewer new shapes",
    )


def cmd_fuzz(a) -> int:
    backends = list(a.backends)
    extra = [s for s in backends if s not in ("oracle", "fla")]
    if extra:
        raise UsageError(
            f"--backends {extra[0]!r}: parity fuzz takes oracle and fla here; give the kernel to "
            "search with --candidate (pallas, pallas-fused, mutant:NAME or NAME=FRAMEWORK:MODULE:FUNCTION)"
        )
    if a.candidate in ("oracle", "fla"):
        raise UsageError(
            f"--candidate {a.candidate!r}: expected pallas, pallas-fused, mutant:NAME or "
            "NAME=FRAMEWORK:MODULE:FUNCTION (FLA itself is searched with no --candidate and --backends oracle,fla)"
        )
    if not a.candidate and "fla" not in backends:
        raise UsageError(
            "--candidate: nothing to search: give --candidate SPEC, or --backends oracle,fla to search FLA itself"
        )
    if a.candidate and a.candidate not in BUILTIN and "=" not in a.candidate and not a.candidate.startswith("mutant:"):
        raise UsageError(
            f"--candidate {a.candidate!r}: expected pallas, pallas-fused, mutant:NAME or NAME=FRAMEWORK:MODULE:FUNCTION"
        )
    specs = ["oracle"] + [s for s in backends if s != "oracle"] + ([a.candidate] if a.candidate else [])
    check_specs_isolated(specs, a.timeout)  # SpecError: parity.cli.main writes it with its flag
    ops = [o.strip() for o in a.op.split(",")] if a.op else list(OPS)
    for op in ops:
        if op not in OPS:
            raise UsageError(f"--op {op!r}: expected one of {list(OPS)} (comma-separated)")
    applies = applies_predicate(a.candidate) if a.candidate else None
    fixed = {} if a.max_t is None else {"max_T": a.max_t}
    usable = []
    for op in ops:
        try:
            space_for(op, applies, a.max_elements, **fixed)
            usable.append(op)
        except ValueError as e:
            if a.op:
                raise UsageError(f"--op {op!r}: {e}") from None
    out = prepare_out(a.out)
    try:
        read_found(out / "found.json")
    except ValueError as e:
        raise UsageError(f"--out: {e}") from None
    cfg = FuzzConfig(
        out=out,
        ops=tuple(usable),
        backends=tuple(backends),
        candidate=a.candidate,
        time_s=a.time,
        shrink_time_s=a.shrink_time,
        max_examples=a.max_examples,
        seed=a.seed,
        jobs=a.jobs,
        timeout_s=a.timeout,
        max_elements=a.max_elements,
        factor=a.bound_factor,
        progress=not a.no_progress,
        numerics=a.tpu_numerics,
        space=fixed,
        variants=a.variants,
        variant_share=a.variant_share,
    )
    print(
        f"parity fuzz: {', '.join(usable)} x {a.jobs} search(es) of {a.time:g} s, searching "
        + (f"candidate {a.candidate}" if a.candidate else "fla (the reference) against the oracle")
        + f" with backends {','.join(specs)} -> {out}",
        file=sys.stderr,
    )
    with exported(choose(a.tpu_interpret_as, ())):  # the search's workers read it (default v5e)
        summary = run_fuzz(cfg)
    if summary.get("page"):
        print(f"report: {Path(summary['page']).resolve()}", file=sys.stderr)
    print(format_summary(summary))
    return 1 if summary["found"] else 0
