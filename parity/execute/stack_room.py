"""Run a call with room on CPython's frame stack, so that its speed does not depend on how
deep the caller sits.

CPython (3.11 and later) keeps Python frames in chunks of a per-thread data stack: 16 KiB,
each one mmap'd when a call does not fit in the current chunk and munmap'd as soon as that
call returns. When a hot call site sits exactly at a chunk boundary, every call through it
maps, faults in and unmaps a fresh chunk (and in a process with other threads, as jax's, each
unmap is a TLB shootdown on the other core). Whether that happens depends only on the caller's
depth: the same FLA kda case through the Triton interpreter took 1.3-1.5 s at most depths and
up to 5.3 s (2.8 s of it system time) at a few, and pytest-xdist's workers sat at such a depth
(the interpret pass's FLA kda cases, 8 forward ones: 96 s in two workers against 25 s in one
plain process).

`call_with_stack_room` calls through a frame that is too large for any 16 KiB chunk (70,000
local slots that are never bound, about 560 KiB), so CPython gives it a 1 MiB chunk of its
own; every frame of the call nests in the rest of that chunk (about 460 KiB), at the same
offsets whatever the caller's depth. It costs one 1 MiB map and about 0.2 ms per call.
"""

from __future__ import annotations

import functools

ROOM_SLOTS = 70_000  # local slots of the big frame: 8 bytes each


def call_with_stack_room(fn, /, *args, **kwargs):
    """fn(*args, **kwargs), its frames in a fresh 1 MiB data-stack chunk (module docstring): as
    fast at any depth of the caller."""
    return _frame_with_room()(fn, *args, **kwargs)


@functools.cache
def _frame_with_room():
    """The function the call goes through: ROOM_SLOTS locals, bound never (they sit in an
    `if False:` block, so they count as locals and cost nothing to run). Built on first use:
    compiling it takes about 0.1 s."""
    names = " = ".join(f"_{i}" for i in range(ROOM_SLOTS))
    source = (
        "def through_room(fn, /, *args, **kwargs):\n"
        "    if False:\n"
        f"        {names} = None\n"
        "    return fn(*args, **kwargs)\n"
    )
    namespace: dict = {}
    exec(compile(source, __file__, "exec"), namespace)  # noqa: S102 - generated above, no input
    return namespace["through_room"]
