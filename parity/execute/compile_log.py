"""XLA compilations in this process, per case: every jitted program's backend compile, from jax's
monitoring events (BACKEND_COMPILE_EVENT), counted once a jax backend has run (`install`, called
before a jax kernel is) and read and reset per case (`take`). A worker reports them with each case,
so a search can see whether a repeated shape class reused its compiled programs."""

from __future__ import annotations

BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"  # jax.monitoring's event name

_state: dict = {"installed": False, "compiles": 0, "seconds": 0.0, "programs": []}


def _on_event(event: str, seconds: float, **kw) -> None:
    if event == BACKEND_COMPILE_EVENT:
        _state["compiles"] += 1
        _state["seconds"] += seconds
        _state["programs"].append(str(kw.get("fun_name")))


def install() -> None:
    """Start counting (once per process; jax is imported here, so only where a jax backend runs)."""
    if _state["installed"]:
        return
    from jax import monitoring

    monitoring.register_event_duration_secs_listener(_on_event)
    _state["installed"] = True


def take() -> dict:
    """{"xla_compiles": count, "xla_compile_s": seconds, "xla_programs": [jit names]} since the last
    take, then reset; {} before install (no jax backend has run: nothing was counted)."""
    if not _state["installed"]:
        return {}
    out = {"xla_compiles": _state["compiles"], "xla_compile_s": _state["seconds"], "xla_programs": _state["programs"]}
    _state.update(compiles=0, seconds=0.0, programs=[])
    return out
