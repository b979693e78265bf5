"""Tensor layouts: what a tensor's leading axes run along, declared beside its shape.

Every input and output of every op (cases.inputs.output_tensors) and stage (cases/stages/<op>.py,
`tensors`) is declared as a `Tensor`: its shape and its `Layout`. The comparator, the bound's
blocks, localisation and the page read the declaration; no code decides what a tensor is from its
name.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import NamedTuple


class Layout(enum.Enum):
    """TIME [B, T, H, ...]: one entry per token (o, the gradients of q, k, v and the gates, a
    stage's u, w, v_new, A, dAqk, ...); PER_CHUNK [B, NT, H, ...]: one per chunk along T (a stage's
    states h, dh); STATE [N, H, K, V]: one per sequence (ht, dh0, initial and final states);
    PER_HEAD [H]: one per head (g_gamma and its gradient)."""

    TIME = "time"
    PER_CHUNK = "per-chunk"
    STATE = "state"
    PER_HEAD = "per-head"

    @property
    def along_chunks(self) -> bool:
        """Profiled per chunk along T, with a (chunk, head) heatmap: TIME and PER_CHUNK."""
        return self in (Layout.TIME, Layout.PER_CHUNK)

    @property
    def head_axis(self) -> int:
        """The axis of heads: 2 for [B, T | NT, H, ...], 1 for [N, H, K, V], 0 for [H]."""
        return {Layout.STATE: 1, Layout.PER_HEAD: 0}.get(self, 2)


class Tensor(NamedTuple):
    """A declared tensor: its shape and its layout."""

    shape: tuple[int, ...]
    layout: Layout


def declare(names: Iterable[str], shape: tuple[int, ...], layout: Layout) -> dict[str, Tensor]:
    """{name: Tensor(shape, layout)} for each of `names`."""
    return dict.fromkeys(names, Tensor(tuple(shape), layout))


TIME, PER_CHUNK, STATE, PER_HEAD = Layout.TIME, Layout.PER_CHUNK, Layout.STATE, Layout.PER_HEAD
