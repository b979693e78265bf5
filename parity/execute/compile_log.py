"""XLA compilations in this process: how many, and how hard the compiler works on them.

Counting, per case: every jitted program's backend compile, from jax's monitoring events
(BACKEND_COMPILE_EVENT), counted once a jax backend has run (`install`, called before a jax kernel
is) and read and reset per case (`take`). A worker reports them with each case, so a search can see
whether a repeated shape class reused its compiled programs.

Effort (`optimisation`): a kernel run in TPU interpret mode is an XLA:CPU program compiled for one
run; at XLA's default optimisation its compile is nearly all of the run (gla fwd+bwd at T=100:
about 50 s of compile for 0.4 s of execution). Interpret mode compiles with most optimisations
off (jax_disable_most_optimizations: XLA's backend optimisation level 0), about half the compile
time for a third more execution time. With most optimisations off, XLA:CPU also emits each fusion
with its elemental IR emitter instead of its MLIR fusion emitters (`xla_cpu_use_fusion_emitters`
false, added to every XLA:CPU compile's options by `install`): those run an MLIR pass pipeline per
fusion, and an interpret-mode kernel is hundreds of small fusions (gla fwd+bwd, T=64, K=V=256:
7.0 s of compile, 3.7 s with the elemental emitter, on this 2-core CPU). The results move by an
ulp or so in elementwise float32 code (no reassociation either way; LLVM's contraction of
multiply-adds and the exp/log approximations differ: 1e-7 relative on gla's dg and kda's outputs,
0 on most tensors), which emulates the TPU's vector unit no more and no less faithfully. The MXU
model is unchanged: its passes' products are exact in float32. TPU compiles always run at the
compiler's defaults (`for_tpu`)."""

from __future__ import annotations

import contextlib

BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"  # jax.monitoring's event name

_state: dict = {"installed": False, "compiles": 0, "seconds": 0.0, "programs": [], "emitter": None}
EMITTER_OPTION = "xla_cpu_use_fusion_emitters"  # XLA:CPU's compile option: False = the elemental IR emitter


def _on_event(event: str, seconds: float, **kw) -> None:
    if event == BACKEND_COMPILE_EVENT:
        _state["compiles"] += 1
        _state["seconds"] += seconds
        _state["programs"].append(str(kw.get("fun_name")))


def install() -> None:
    """Start counting, and compile with the elemental emitter under most optimisations off (once per
    process; jax is imported here, so only where a jax backend runs)."""
    if _state["installed"]:
        return
    from jax import monitoring

    _install_emitter()  # its probe compile is not counted
    monitoring.register_event_duration_secs_listener(_on_event)
    _state["installed"] = True


def _install_emitter() -> None:
    """jax's compile options (jax._src.compiler.get_compile_options, where jax itself applies
    jax_disable_most_optimizations), with EMITTER_OPTION False added for an XLA:CPU compile while
    most optimisations are off (a caller's own value for it wins). Only where this jaxlib's XLA
    knows the option (a trivial program compiles with it); elsewhere XLA:CPU's default emitter, and
    interpret_effort() says so."""
    import jax
    from jax._src import compiler

    try:
        one = jax.device_put(1.0, jax.local_devices(backend="cpu")[0])
        jax.jit(lambda x: x + 1, compiler_options={EMITTER_OPTION: False})(one)
    except Exception:  # noqa: BLE001 - XLA: "No such compile option"
        _state["emitter"] = "fusion emitters (this XLA has no elemental-emitter option)"
        return
    original = compiler.get_compile_options

    def get_compile_options(*args, env_options_overrides=None, backend=None, **kw):
        if backend is not None and backend.platform == "cpu" and read_flag("jax_disable_most_optimizations"):
            env_options_overrides = {EMITTER_OPTION: False, **(env_options_overrides or {})}
        return original(*args, env_options_overrides=env_options_overrides, backend=backend, **kw)

    compiler.get_compile_options = get_compile_options
    _state["emitter"] = "elemental IR emitter"


def take() -> dict:
    """{"xla_compiles": count, "xla_compile_s": seconds, "xla_programs": [jit names]} since the last
    take, then reset; {} before install (no jax backend has run: nothing was counted)."""
    if not _state["installed"]:
        return {}
    out = {"xla_compiles": _state["compiles"], "xla_compile_s": _state["seconds"], "xla_programs": _state["programs"]}
    _state.update(compiles=0, seconds=0.0, programs=[])
    return out


def interpret_effort() -> str:
    """How hard XLA:CPU works on an interpret-mode program, as records state it (after install)."""
    emitter = _state["emitter"] or "default emitter"
    return f"XLA:CPU with most optimisations off (backend optimisation level 0, {emitter})"


@contextlib.contextmanager
def optimisation(disabled: bool):
    """Compiles inside: with most of XLA's optimisations off (`disabled`) or at its defaults;
    the setting before is restored on the way out. Programs stay compiled as they were: a jitted
    function reuses its executable whatever the setting when it is called again."""
    with _jax_flags(jax_disable_most_optimizations=disabled):
        yield


NEVER_CACHED_S = 1e12  # jax writes a compile that took at least this long to its persistent cache


@contextlib.contextmanager
def for_tpu():
    """TPU compiles inside: at the compiler's defaults, and never written to jax's persistent
    compilation cache (scripts/test.sh gives each CI run one, for the XLA:CPU programs of
    interpret mode): a compile-only TPU executable is not read back from it (jax warns and
    compiles again), and one that were would come without the Mosaic dump the compile check
    reads. Not by turning the cache off: jax decides once per process whether it uses the cache
    (at its first compile), so a flag set here would either do nothing or, before the first
    compile, keep every later interpret-mode program out of the cache; a minimum compile time
    no compile reaches keeps TPU executables out of it, and without them a lookup finds none."""
    with _jax_flags(jax_disable_most_optimizations=False, jax_persistent_cache_min_compile_time_secs=NEVER_CACHED_S):
        yield


@contextlib.contextmanager
def _jax_flags(**flags):
    """jax config flags set inside, restored on the way out."""
    import jax

    before = {k: read_flag(k) for k in flags}
    for k, v in flags.items():
        jax.config.update(k, v)
    try:
        yield
    finally:
        for k, v in before.items():
            jax.config.update(k, v)


def read_flag(name: str):
    """A jax config flag's value (a flag with a context manager of its own is an attribute of
    jax.config; a plain one is read)."""
    import jax

    try:
        return getattr(jax.config, name)
    except AttributeError:
        return jax.config.read(name)
