"""The `parity` command line.

    parity cases     --suite NAME | --cases FILE [--op OP] [--json]
    parity run       --suite NAME | --cases FILE | --case ID ... [--op OP] [--backends oracle,fla,pallas]
                     [--candidate NAME=FRAMEWORK:MODULE:FUNCTION ...] [--out DIR] [-j N] [--shard I/N]
                     [--timeout S] [--bound-factor F] [--seeds MIN:MAX] [--allow-inconclusive] [--no-html]
    parity compile   --suite NAME | --cases FILE | --case ID ... [--op OP] [--backends pallas,pallas-fused]
                     [--candidate SPEC ...] [--tpu-targets v5e,v6e,tpu7x] [--out DIR] [-j N]
    parity gate      DIR [DIR ...] [--bound-factor F] [--out FILE] [--allow-mixed-numerics]
                     [--allow-inconclusive]
    parity power     DIR [DIR ...] [--reps N] [--bound-factor F] [--seeds MIN:MAX] [--out DIR]
    parity calibrate DIR [DIR ...] [--write]
    parity mutants   [--suite ci] [--only NAME] [--out DIR] [-j N] [--list]
    parity report    DIR [DIR ...] -o FILE.html
    parity repro     CASE_ID [--backend pallas | --candidate SPEC] -o DIR
    parity diff      BASE NEW [--max-ratio 1.25] [-o PAGE.html] [-v]
    parity fuzz      [--op OP] [--backends oracle[,fla]] [--candidate SPEC] [--time S] [--seed N] [-j N]
                     [--max-examples N] [--timeout S] [--max-elements N] [--out DIR]

Exit codes, the same for every command: 0 pass, 1 a parity failure (a failing gate; for
`parity run` without a reference and a candidate to gate, an oracle or candidate record
that is not a pass), 2 refused input, 3 an internal error of the harness; 130 / 143 when
SIGINT / SIGTERM ended a run (what finished is kept and summarised).
Refused input (unknown suite, op, backend, bad candidate spec or module, a case field of
the wrong type, a case over the size limit, a bad -j / --timeout / --bound-factor /
--shard / --backends / --out, an unreadable or malformed record) -> one line on stderr
naming the field and the allowed values, exit 2, before any case runs. An internal error
-> its traceback in a log file and one line pointing at it, exit 3.

Each command is one module here (parity/cli/<command>.py: its options, `add_parser`, and its
body); this module assembles the parser and maps what a command raises to its exit code.
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
from parity.cli import calibrate, cases, compile, diff, fuzz, gate, mutants, power, report, repro, run
from parity.cli.common import UsageError
from parity.judge.diff import DiffRefusal
from parity.judge.gate import GateRefusal
from parity.model.options import OptionError
from parity.records import RecordError

COMMANDS = (cases, run, compile, mutants, fuzz, gate, power, calibrate, report, repro, diff)  # in `parity --help` order


class Parser(argparse.ArgumentParser):
    """Bad arguments: one line naming the argument and the allowed values, exit 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="parity",
        allow_abbrev=False,
        description="Parity harness for linear-attention kernels: "
        "FLA Triton (GPU) vs JAX Pallas (TPU) vs a float64 oracle.",
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    add = sub.add_parser
    sub.add_parser = lambda *a, **k: add(*a, allow_abbrev=False, **k)
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
    a = build_parser().parse_args(argv)
    try:
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
    except KeyboardInterrupt:
        print(f"parity {a.cmd}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - exit 3 with a pointer, never a traceback that looks like a result
        path = _internal_error(a)
        print(
            f"parity {a.cmd}: internal error: {type(e).__name__}: {str(e)[:300]} (traceback in {path})", file=sys.stderr
        )
        return 3


if __name__ == "__main__":
    sys.exit(main())
