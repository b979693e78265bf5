"""Checks of command-line values, shared by every `parity` subcommand.

Each is an argparse `type=`: it returns the parsed value or raises ArgumentTypeError
naming the allowed values; the parser (cli.Parser) prints that as one line and exits 2,
before any case runs. The checks the pytest plugin shares are parity.model.options's
(`_checked` turns their OptionError into argparse's error).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from parity.model import options


def _refuse(value, allowed: str):
    raise argparse.ArgumentTypeError(f"{value!r} is invalid: expected {allowed}")


def _checked(check, *args):
    """check(*args), its OptionError raised as argparse's error (the value and the allowed values)."""
    try:
        return check(*args)
    except options.OptionError as e:
        raise argparse.ArgumentTypeError(e.invalid()) from None


def positive_int(s: str) -> int:
    return _checked(options.int_at_least, "", s, 1)


def size_limit(s: str) -> int:
    """--max-elements, --max-bytes: an int >= 1."""
    return _checked(options.size_limit, "", s)


def seconds(s: str) -> float:
    """A timeout: a finite number of seconds > 0."""
    v = _checked(options.finite_at_least, "", s, 0, "a finite number of seconds > 0")
    if v <= 0:
        _refuse(s, "a finite number of seconds > 0")
    return v


def bound_factor(s: str) -> float:
    return _checked(options.bound_factor, s)


def count(s: str) -> int:
    return _checked(options.int_at_least, "", s, 0)


def max_ratio(s: str) -> float:
    """parity diff's growth factor: a finite number >= 1."""
    return _checked(options.finite_at_least, "", s, 1)


def interpret_as(s: str) -> str:
    """--tpu-interpret-as: one TPU target."""
    return _checked(options.interpret_as, s)


def fla_lanes(s: str) -> int | None:
    return _checked(options.fla_lanes, s)


def fla_fallback(s: str) -> bool:
    return _checked(options.fla_fallback, s)


def fla_configs(s: str) -> Path | None:
    return _checked(options.fla_configs, s)


def shard(s: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in s.split("/"))
    except ValueError:
        _refuse(s, "I/N, e.g. 1/4")
    if not (n >= 1 and 1 <= i <= n):
        _refuse(s, "I/N with 1 <= I <= N")
    return i, n


def seeds(s: str) -> tuple[int, int]:
    """parity run --seeds MIN:MAX (or N for N:N): input seeds per case, 1 <= MIN <= MAX."""
    allowed = "MIN:MAX or N, ints with 1 <= MIN <= MAX, e.g. 3:8"
    try:
        lo, hi = (int(x) for x in (s.split(":") if ":" in s else (s, s)))
    except ValueError:
        _refuse(s, allowed)
    if not 1 <= lo <= hi:
        _refuse(s, allowed)
    return lo, hi


def backend_list(s: str) -> list[str]:
    """Comma-separated backend names: none empty, at least one."""
    return _checked(options.backend_list, s)


def output_dir(s: str) -> Path:
    """A directory that is or can be made writable: not a file, under a writable directory.
    Nothing is created here (a refused command leaves no trace)."""
    if not s:
        _refuse(s, "a directory path")
    p = Path(s)
    if p.exists() and not p.is_dir():
        _refuse(s, "a directory (this path is a file)")
    probe = p
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        _refuse(s, f"a directory path ({probe} is a file)")
    if not os.access(probe, os.W_OK | os.X_OK):
        _refuse(s, f"a writable directory ({probe} is not writable)")
    return p


def output_file(s: str) -> Path:
    """A file to write: not a directory, in a directory output_dir accepts."""
    p = Path(s)
    if not s or p.is_dir():
        _refuse(s, "a file path (not a directory)")
    output_dir(str(p.parent))
    return p
