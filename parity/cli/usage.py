"""docs/usage.md: every `parity` command's `--help`, as the parser prints it.

python -m parity.cli.usage          # rewrite docs/usage.md
python -m parity.cli.usage --check  # exit 1 when docs/usage.md is not what the parser prints
"""

from __future__ import annotations

import argparse
import contextlib
import io
import platform
import sys
from pathlib import Path

from parity.cli import COMMANDS, build_parser

DOC = Path(__file__).resolve().parents[2] / "docs" / "usage.md"
REGENERATE = "python -m parity.cli.usage"


def command_names() -> list[str]:
    """The commands in `parity --help` order (each is the module parity/cli/<name>.py)."""
    return [m.__name__.rsplit(".", 1)[-1] for m in COMMANDS]


def help_text(command: str | None = None) -> str:
    """What `parity [command] --help` prints on stdout."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        build_parser().parse_args([*([command] if command else []), "--help"])
    return out.getvalue()


def usage_markdown() -> str:
    """docs/usage.md's text: `parity --help`, then each command's `--help`, in fenced blocks."""
    python = ".".join(platform.python_version_tuple()[:2])
    parts = [
        "# Command usage\n\n"
        f"Every `parity` command's `--help`, written by `{REGENERATE}` from the command line's own parser\n"
        f"(argparse under Python {python}); tests/test_usage.py checks that the two agree.\n"
    ]
    for name in [None, *command_names()]:
        title = f"parity {name}" if name else "parity"
        parts.append(f"## {title}\n\n```text\n{help_text(name).rstrip()}\n```\n")
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=REGENERATE, description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 when the file differs; write nothing")
    p.add_argument("-o", "--output", type=Path, default=DOC, help=f"the page to write (default {DOC.name} in docs/)")
    a = p.parse_args(argv)
    text = usage_markdown()
    if a.check:
        same = a.output.is_file() and a.output.read_text() == text
        if not same:
            print(f"{a.output} is not the parser's usage: run `{REGENERATE}`", file=sys.stderr)
        return 0 if same else 1
    a.output.parent.mkdir(parents=True, exist_ok=True)
    a.output.write_text(text)
    print(f"wrote {a.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
