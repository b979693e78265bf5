"""parity.execute.stack_room: a call's speed does not depend on its caller's depth.

The probe: a loop calling one function with a 100-slot frame, started at every depth over
more than one 16 KiB data-stack chunk. Where the callee's frame crosses a chunk boundary,
CPython maps and faults in a fresh chunk on each call (one minor page fault per call, counted
for this thread by getrusage); through call_with_stack_room no depth does.
"""

import resource
import sys
import threading

import pytest

from parity.execute.stack_room import call_with_stack_room

CALLS = 5000
_ns: dict = {}
exec("def callee(x):\n    " + "; ".join(f"v{i} = x" for i in range(100)) + "\n    return x", _ns)  # noqa: S102
callee = _ns["callee"]


def hot_loop():
    for i in range(CALLS):
        callee(i)


def at_depth(n, fn):
    return fn() if n == 0 else at_depth(n - 1, fn)


def page_faults(fn) -> int:
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    fn()
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before


def worst_depth(run) -> int:
    """The most page faults of `run` started at any of 250 depths (over 16 KiB of frames), in a
    fresh thread (its own frame stack: this test itself runs with room, conftest.py)."""
    faults = []
    thread = threading.Thread(
        target=lambda: faults.extend(page_faults(lambda n=n: at_depth(n, run)) for n in range(250))
    )
    thread.start()
    thread.join()
    return max(faults)


@pytest.mark.skipif(sys.implementation.name != "cpython", reason="CPython's frame stack")
def test_no_depth_faults_a_fresh_frame_chunk_per_call():
    assert worst_depth(lambda: call_with_stack_room(hot_loop)) < CALLS // 10


@pytest.mark.skipif(
    sys.implementation.name != "cpython" or not (3, 11) <= sys.version_info[:2] <= (3, 13),
    reason="the chunked frame stack as CPython 3.11-3.13 have it",
)
def test_the_probe_sees_the_thrash_without_the_room():
    # the control: without the room some depth pays a page fault per call
    assert worst_depth(hot_loop) >= CALLS


def test_arguments_results_and_errors_pass_through():
    assert call_with_stack_room(lambda a, fn=0: (a, fn), 1, fn=2) == (1, 2)
    with pytest.raises(ZeroDivisionError):
        call_with_stack_room(lambda: 1 / 0)
