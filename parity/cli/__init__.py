"""The `parity` command line.

Each command is one module here (parity/cli/<command>.py: its options, `add_parser`, and its
body); this module assembles the parser and maps what a command raises to its exit code
(EXIT_CODES, printed by `parity --help`). Every command's usage is its `--help`, at a fixed
width (HelpFormatter); docs/usage.md holds the same text, written by `python -m parity.cli.usage`.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

from cases import CaseError
from parity.cli import calibrate, cases, compile, diff, fuzz, gate, localise, mutants, power, report, repro, run, watch
from parity.cli.common import UsageError
from parity.execute import interrupts
from parity.judge.diff import DiffRefusal
from parity.judge.gate import GateRefusal
from parity.model import options
from parity.model.host import keep_jax_on_the_cpu
from parity.model.options import FLA_AUTOTUNE, OptionError
from parity.records import RecordError

COMMANDS = (
    cases,
    run,
    watch,
    compile,
    localise,
    mutants,
    fuzz,
    gate,
    power,
    calibrate,
    report,
    repro,
    diff,
)  # in `parity --help` order


EXIT_CODES = """\
exit codes, the same for every command:
  0        pass
  1        a parity failure: a failing gate; for `parity run` without a reference and a
           candidate to gate, an oracle or candidate record that is not a pass
  2        refused input (unknown suite, op, backend, bad candidate spec or module, a case
           field of the wrong type, a case over the size limit, a bad option value, an
           unreadable or malformed record): one line on stderr naming the field and the
           allowed values, before any case runs
  3        an internal error of the harness: its traceback in a log file, one line pointing at it
  130/143  SIGINT / SIGTERM ended a run (what finished is kept and summarised)

usage of every command: parity COMMAND --help"""

HELP_WIDTH = 100  # columns of every --help, whatever the terminal: docs/usage.md holds the same text


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """argparse's help at HELP_WIDTH columns; descriptions and epilogs printed as written."""

    def __init__(self, prog):
        super().__init__(prog, max_help_position=30, width=HELP_WIDTH)


class Parser(argparse.ArgumentParser):
    """Bad arguments: one line naming the argument and the allowed values, exit 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="parity",
        allow_abbrev=False,
        formatter_class=HelpFormatter,
        description="Parity harness for linear-attention kernels: "
        "FLA Triton (GPU) vs JAX Pallas (TPU) vs a float64 oracle.",
        epilog=EXIT_CODES,
    )
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    add = sub.add_parser

    def add_command(name, *, help, **k):
        """A command's parser: its one-line `help` (in `parity --help`) is also its description."""
        return add(name, help=help, description=help, allow_abbrev=False, formatter_class=HelpFormatter, **k)

    sub.add_parser = add_command
    for command in COMMANDS:
        command.add_parser(sub)
    return p


def _internal_error(a) -> str:
    """Write the current exception's traceback to a log file (in the output directory when
    there is one, else the temp directory); returns its path."""
    text = f"parity {a.cmd} {' '.join(sys.argv[1:])}\n{traceback.format_exc()}"
    name = f"parity-error-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    for d in (getattr(a, "out", None), tempfile.gettempdir()):
        if d and Path(d).is_dir():
            try:
                path = Path(d) / name
                path.write_text(text)
                return str(path)
            except OSError:
                continue
    return "(could not be written)"


def main(argv: list[str] | None = None) -> int:
    keep_jax_on_the_cpu()  # before anything imports jax; the workers and FLA's lanes inherit it
    a = build_parser().parse_args(argv)
    a.kept = None  # what a command has kept so far, said if a signal ends it (set as it goes)
    try:
        with interrupts.terminated_as_interrupt():
            options.fla_autotune(getattr(a, FLA_AUTOTUNE.dest, False))  # refused before anything runs
            return a.fn(a)
    except OptionError as e:  # a value parity.model.options refused: named with this surface's flag
        print(f"parity {a.cmd}: {e.message('--')}", file=sys.stderr)
        return 2
    except (UsageError, CaseError, RecordError) as e:
        print(f"parity {a.cmd}: {e}", file=sys.stderr)
        return 2
    except (GateRefusal, DiffRefusal) as e:  # records that cannot be compared
        print(f"parity {a.cmd}: refused: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `parity cases | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt as e:  # SIGINT, or SIGTERM (interrupts.Terminated), whenever it came
        name = interrupts.signal_name(e)
        print(f"parity {a.cmd}: interrupted by {name}" + (f"; kept: {a.kept}" if a.kept else ""), file=sys.stderr)
        return interrupts.exit_status(name)
    except Exception as e:  # noqa: BLE001 - exit 3 with a pointer, never a traceback that looks like a result
        path = _internal_error(a)
        print(
            f"parity {a.cmd}: internal error: {type(e).__name__}: {str(e)[:300]} (traceback in {path})", file=sys.stderr
        )
        return 3


if __name__ == "__main__":
    sys.exit(main())
