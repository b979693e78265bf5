"""Which path each Pallas kernel of a jax program takes, read from the program's jaxpr.

A pallas_call's `interpret` parameter, as the program's own code passes it on a TPU host (traced
inside parity.execute.tpu_identity's emulation, before the harness forces TPU interpret mode):
    False                        "mosaic": compiled by Mosaic on a TPU; here it runs in TPU
                                 interpret mode (pltpu.force_tpu_interpret_mode)
    pltpu.InterpretParams(...)   "tpu-interpret": the code asks for TPU interpret mode itself, on
                                 a TPU too (interpret mode left on: interpret-mode-left-on)
    True, or anything else       "generic-interpreter": Pallas's generic interpreter (a jit of a
                                 scan over the grid), on a TPU too
and a program with no pallas_call at all runs plain XLA: no Pallas kernel, or a fallback the
library chose. Only "mosaic" is a TPU kernel: a `pallas:` candidate (or kernels_jax) whose program
has anything else is never passed (`cause`, parity.records.tpu_kernel_problem), and the compile
check names the same cause when the compiled TPU module holds no Mosaic kernel.
"""

from __future__ import annotations

from collections.abc import Callable

MOSAIC, TPU_INTERPRET, GENERIC = "mosaic", "tpu-interpret", "generic-interpreter"

WHY = {
    None: "no Pallas kernel in the traced program (no pallas_call: plain XLA, or a fallback the library chose)",
    GENERIC: "its pallas_calls pass interpret=True: Pallas's generic interpreter, on a TPU too, not a Mosaic kernel",
    TPU_INTERPRET: "its pallas_calls pass interpret=pltpu.InterpretParams(...): TPU interpret mode left on, "
    "not a Mosaic kernel",
}


def path_of(interpret) -> str:
    """The path of one pallas_call from its `interpret` parameter (module docstring)."""
    if not interpret:
        return MOSAIC
    if type(interpret).__name__ == "InterpretParams":
        return TPU_INTERPRET
    return GENERIC


def _sub_jaxprs(value):
    """The jaxprs inside an equation's parameter (a jit's, a custom rule's, a cond's branches)."""
    for v in value if isinstance(value, (list, tuple)) else (value,):
        inner = getattr(v, "jaxpr", v)  # ClosedJaxpr -> Jaxpr
        if hasattr(inner, "eqns"):
            yield inner


def _kernel_name(eqn) -> str:
    """The pallas_call's name, else its kernel function's; a lambda's with where it is written
    ("<lambda> at fwd.py:95"), so that a library's lambda kernels stay apart."""
    if eqn.params.get("name"):
        return str(eqn.params["name"])
    debug = getattr(eqn.params.get("jaxpr"), "debug_info", None)
    name = str(getattr(debug, "func_name", None) or "<unnamed>")
    where = str(getattr(debug, "func_src_info", None) or "")
    if name.startswith("<") and " at " in where:
        return f"{name} at {where.split(' at ', 1)[1].rsplit('/', 1)[-1]}"
    return name


def pallas_calls(jaxpr) -> list[tuple[str, str]]:
    """(kernel name, path) of every pallas_call in a (closed) jaxpr and the jaxprs inside it, in
    order, once per (name, path)."""
    found: dict[tuple[str, str], None] = {}

    def walk(j):
        for eqn in j.eqns:
            if eqn.primitive.name == "pallas_call":
                found[(_kernel_name(eqn), path_of(eqn.params.get("interpret")))] = None
                continue
            for value in eqn.params.values():
                for sub in _sub_jaxprs(value):
                    walk(sub)

    walk(getattr(jaxpr, "jaxpr", jaxpr))
    return list(found)


def cause(calls: list[tuple[str, str]]) -> str | None:
    """Why a program is not a TPU kernel program (WHY), worst first; None when every pallas_call
    is a Mosaic kernel."""
    paths = {p for _, p in calls}
    if not calls:
        return WHY[None]
    for p in (GENERIC, TPU_INTERPRET):
        if p in paths:
            names = [n for n, q in calls if q == p]
            return f"{WHY[p]} ({', '.join(names)})"
    return None


def describe(calls: list[tuple[str, str]], forced: bool) -> dict:
    """The record's statement of what ran: each kernel's path as written and how it ran here
    (`forced`: under pltpu.force_tpu_interpret_mode every pallas_call runs in TPU interpret mode)."""
    return {
        "kernels": [{"name": n, "as_written": p, "ran": TPU_INTERPRET if forced else p} for n, p in calls],
        "ran": ("tpu-interpret" if forced else "as written") if calls else "no pallas_call (plain XLA)",
        "cause": cause(calls),
    }


def traced(program: Callable, *args) -> list[tuple[str, str]]:
    """pallas_calls of program(*args) traced now (args: arrays or ShapeDtypeStructs), in the
    caller's context (inside the emulation, without forced interpret mode)."""
    import jax  # late: jax is heavy

    return pallas_calls(jax.make_jaxpr(program)(*args))
