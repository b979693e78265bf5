"""Checks of command-line values, shared by every `parity` subcommand.

Each is an argparse `type=`: it returns the parsed value or raises ArgumentTypeError
naming the allowed values; the parser (cli.Parser) prints that as one line and exits 2,
before any case runs.
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path


def _refuse(value, allowed: str):
    raise argparse.ArgumentTypeError(f"{value!r} is invalid: expected {allowed}")


def _int_at_least(s: str, low: int) -> int:
    try:
        v = int(s)
    except ValueError:
        _refuse(s, f"an int >= {low}")
    if v < low:
        _refuse(s, f"an int >= {low}")
    return v


def positive_int(s: str) -> int:
    return _int_at_least(s, 1)


def _finite(s: str, allowed: str) -> float:
    try:
        v = float(s)
    except ValueError:
        _refuse(s, allowed)
    if not math.isfinite(v):
        _refuse(s, allowed)
    return v


def seconds(s: str) -> float:
    """A timeout: a finite number of seconds > 0."""
    v = _finite(s, "a finite number of seconds > 0")
    if v <= 0:
        _refuse(s, "a finite number of seconds > 0")
    return v


def bound_factor(s: str) -> float:
    v = _finite(s, "a finite number >= 0")
    if v < 0:
        _refuse(s, "a finite number >= 0")
    return v


def count(s: str) -> int:
    return _int_at_least(s, 0)


def max_ratio(s: str) -> float:
    """parity diff's growth factor: a finite number >= 1."""
    v = _finite(s, "a finite number >= 1")
    if v < 1:
        _refuse(s, "a finite number >= 1")
    return v


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
    items = [x.strip() for x in s.split(",")]
    if not s.strip() or any(not x for x in items):
        _refuse(s, "a comma-separated list of backend names, none empty, e.g. oracle,fla,pallas")
    return items


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
