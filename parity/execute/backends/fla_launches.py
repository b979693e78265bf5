"""What FLA ran, as its record says it, and configs pinned from an earlier record.

`recording()` collects, while FLA computes a case:
- every Triton kernel launch (compiled or interpreted), as
  {"kernel", "module", "meta": the constexpr arguments (block sizes, flags, shapes FLA makes
  constexpr), "num_warps", "num_stages", "chosen_by", "key", "config_kwargs", "launches": how many},
  launches alike counted once;
  num_warps and num_stages are the compiled kernel's own (its metadata) on a GPU, the launch's
  arguments in the interpreter (which ignores them; None: not given, Triton's default);
  "chosen_by" says where an autotuned kernel's config came from (parity.execute.backends.fla_configs:
  "pinned", "table", "table-default", "rule", "fla-cache", "only-config"; with --fla-autotune on a
  GPU "autotune", timed in this process, or "triton-cache", Triton's persisted result), or "launch"
  for a kernel launched without an autotuner; "key" is the autotuner's tuning key (its key arguments
  and the tensors' dtypes, as text) and "config_kwargs" the meta-parameters its config set (None for
  both without an autotuner).
- which fla.backends backend computed each FLA function dispatched through it ("triton": FLA's
  own function, the default; else the backend type, e.g. "tilelang", "flash_kda").
Each is a list or dict in the FLA record's notes (fla_launches, fla_dispatch).

Which config an autotuned kernel runs is fla_configs's choice (pins, tables, the rule), put in its
autotuner's cache before Triton's run looks, so Triton compiles that one config and times nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import inspect
import json
import os
import threading

from parity.execute.backends import fla_configs
from parity.model import environ

DEFAULT_BACKEND = "triton"  # fla.backends' fallback: FLA's own (Triton) function

# .recording: the Recording collecting now (None: none); .tuning: (chosen_by, key, config_kwargs) of the
# launches an autotuner's run makes (None: not inside one)
_state = threading.local()
_installed: set[str] = set()
_provenance: dict[tuple[str, tuple], str] = {}  # (kernel, key) -> chosen_by, for every key tuned in this process


@dataclasses.dataclass
class Recording:
    """What one FLA call launched (launches, in order of first launch) and dispatched (function -> backend)."""

    launches: dict = dataclasses.field(default_factory=dict)
    dispatch: dict = dataclasses.field(default_factory=dict)

    def notes(self) -> dict:
        return {"fla_launches": list(self.launches.values()), "fla_dispatch": dict(sorted(self.dispatch.items()))}


class recording:
    """Within: FLA's launches and dispatches are collected into the Recording it gives (install() first)."""

    def __enter__(self) -> Recording:
        self.previous = getattr(_state, "recording", None)
        _state.recording = Recording()
        return _state.recording

    def __exit__(self, *exc):
        _state.recording = self.previous


def install(interpreted: bool, device_name: str | None = None) -> None:
    """Patch triton's launch path and autotuner, and fla.backends' dispatched functions (idempotent;
    after FLA is imported, and after triton_interpreter.enable() when `interpreted`). device_name:
    the CUDA GPU FLA compiles for (its shipped config table applies; fla_configs.source), None in
    the interpreter."""
    from triton.runtime.autotuner import Autotuner

    _device["name"] = None if interpreted else device_name
    if "autotuner" not in _installed:
        _patch_autotuner(Autotuner)
        _installed.add("autotuner")
    if interpreted and "interpreter" not in _installed:
        from triton.runtime.interpreter import InterpretedFunction

        _patch_launch(InterpretedFunction, compiled=False)
        _installed.add("interpreter")
    if not interpreted and "jit" not in _installed:
        from triton.runtime.jit import JITFunction

        _patch_launch(JITFunction, compiled=True)
        _installed.add("jit")
    _patch_dispatch()


# ------------------------------------------------------------------ the autotuner
def tuning_key(tuner, args: tuple, kwargs: dict) -> tuple:
    """The autotuner's key for a launch, as triton's Autotuner.run forms it: the values of its key
    arguments, then the dtypes of its tensor arguments."""
    all_args = {**dict(zip(tuner.arg_names, args)), **kwargs}
    named = {k: v for k, v in all_args.items() if k in tuner.arg_names}
    key = [named[k] for k in tuner.keys if k in named]
    key += [str(v.dtype) for v in named.values() if hasattr(v, "dtype")]
    return tuple(key)


def _patch_autotuner(Autotuner) -> None:
    """Autotuner.run gives each (kernel, key) the config fla_configs chooses, in its cache before
    Triton's run looks, so that Triton compiles that one config and times nothing; with
    PARITY_FLA_AUTOTUNE (on a GPU) Triton tunes the keys no pin names, as production FLA does."""
    original_run = Autotuner.run

    @functools.wraps(original_run)
    def run(self, *args, **kwargs):
        kernel = self.base_fn.__name__
        if len(self.configs) == 1:
            return _run_as(self, ("only-config", (), self.configs[0]), original_run, args, kwargs)
        key = tuning_key(self, args, kwargs)
        source = fla_configs.source(_device["name"])
        chosen = _chosen.get((id(self), key))
        if chosen is None or chosen.source != source or self.cache.get(key) is not chosen.config:
            chosen = _choose(self, kernel, key, source, args, kwargs)
            if chosen is None:  # Triton's autotuner, timing every config
                return _autotune(self, kernel, key, original_run, args, kwargs)
            _chosen[(id(self), key)] = chosen
            self.cache[key] = chosen.config
        return _run_as(self, (chosen.how, key, chosen.config), original_run, args, kwargs)

    Autotuner.run = run


@dataclasses.dataclass(frozen=True)
class _Choice:
    config: object  # the triton.Config in the autotuner's cache for the key
    how: str  # chosen_by
    source: fla_configs.Source


_chosen: dict[tuple[int, tuple], _Choice] = {}  # (id of the autotuner, key) -> how its config was chosen
_device = {"name": None}  # the GPU whose shipped table applies (install's device_name)


def _choose(tuner, kernel: str, key: tuple, source, args: tuple, kwargs: dict) -> _Choice | None:
    """The config for (kernel, key): pinned, FLA's own config cache's (FLA_CACHE_MODE put it in the
    autotuner's cache), the table's, or the rule's; None where Triton's autotuner tunes it (on a GPU,
    with PARITY_FLA_AUTOTUNE)."""
    from triton import Config

    picked = source.choose(kernel, key)
    if picked is None or picked[1] != "pinned":
        if (kernel, key) in _provenance or (source.autotune and _device["name"]):
            return None
        if key in tuner.cache and not any(c.config is tuner.cache[key] for c in _chosen.values()):
            return _Choice(tuner.cache[key], "fla-cache", source)
    if picked is None:
        return _Choice(fla_configs.choose_config(kernel, _pruned(tuner, args, kwargs)), "rule", source)
    c, how = picked
    config = Config(c["kwargs"], num_warps=c["num_warps"], num_stages=c["num_stages"],
                    num_ctas=c.get("num_ctas", 1), maxnreg=c.get("maxnreg"))  # fmt: skip
    return _Choice(config, how, source)


def _pruned(tuner, args: tuple, kwargs: dict) -> list:
    """The configs the autotuner would time for this launch (its own pruning)."""
    tuner.nargs = dict(zip(tuner.arg_names, args))  # what Triton's pruning reads
    try:
        return tuner.prune_configs(kwargs)
    finally:
        tuner.nargs = None


def _run_as(tuner, tuning: tuple, original_run, args: tuple, kwargs: dict):
    """Triton's run of the autotuner, its launches recorded as chosen by tuning[0] at key tuning[1]."""
    how, key, config = tuning
    _state.tuning = (how, key, sorted(config.kwargs))
    try:
        return original_run(tuner, *args, **kwargs)
    finally:
        _state.tuning = None


def _autotune(tuner, kernel: str, key: tuple, original_run, args: tuple, kwargs: dict):
    """Triton's autotuner on a GPU: every config compiled first (the run's pre-compile compiled
    them: loads), then timed with the GPU to this lane alone (gpu_to_itself); or its stored result
    (TRITON_CACHE_AUTOTUNING: "triton-cache")."""
    if key in tuner.cache:
        return _run_as(tuner, (_provenance.get((kernel, key), "triton-cache"), key, tuner.cache[key]),
                       original_run, args, kwargs)  # fmt: skip
    if getattr(_state, "planning", False):  # a compile plan (fla_compile): every config planned, none timed
        _compile_configs(tuner, args, kwargs)
        tuner.cache[key] = fla_configs.choose_config(kernel, _pruned(tuner, args, kwargs))
        _provenance[(kernel, key)] = "autotune"
        return _run_as(tuner, ("autotune", key, tuner.cache[key]), original_run, args, kwargs)
    bench_time = getattr(tuner, "bench_time", None)
    _state.tuning = ("pending", key, None)
    try:
        _compile_configs(tuner, args, kwargs)
        with gpu_to_itself():
            out = original_run(tuner, *args, **kwargs)
    finally:
        _state.tuning = None
    how = "autotune" if getattr(tuner, "bench_time", None) != bench_time else "triton-cache"
    _provenance[(kernel, key)] = how
    _note_tuned(kernel, key, how, tuner.best_config)
    return out


class planning:
    """Within: autotuned keys (PARITY_FLA_AUTOTUNE) compile-plan every config, time none (fla_compile)."""

    def __enter__(self):
        _state.planning = True

    def __exit__(self, *exc):
        _state.planning = False


def _compile_configs(tuner, args: tuple, kwargs: dict) -> None:
    """Compile every config the autotuner will time (triton's Autotuner.warmup), before it takes the
    GPU to itself (gpu_to_itself): no lane holds the lock while compiling. Best effort: what fails
    here is compiled (or fails) in the autotuner's own run, as without it."""
    try:
        tuner.warmup(*args, **{k: v for k, v in kwargs.items() if k != "warmup"})
    except Exception:  # noqa: BLE001 - the autotuner's run compiles it, or reports why not
        pass


def _note_tuned(kernel: str, key: tuple, how: str, config) -> None:
    """The launches of an autotuned kernel's first (tuning) call get how its config was chosen and
    which of their meta-parameters the config set."""
    rec = getattr(_state, "recording", None)
    if rec is None:
        return
    for ident, launch in list(rec.launches.items()):
        if launch["kernel"] == kernel and launch["chosen_by"] == "pending" and launch["key"] == [str(k) for k in key]:
            del rec.launches[ident]
            launch.update(chosen_by=how, config_kwargs=sorted(config.kwargs))
            _add(rec, launch, launch.pop("launches"))


# ------------------------------------------------------------------ compiles
_compiles = [0]


def count_compiles() -> None:
    """Count Triton's compiles in this process (a cache hit loads and is not counted): ASTSource.make_ir
    runs once per compile that missed Triton's cache."""
    from triton.compiler import compiler

    if getattr(compiler.ASTSource.make_ir, "_parity_counted", False):
        return
    original = compiler.ASTSource.make_ir

    def make_ir(self, *args, **kwargs):
        _compiles[0] += 1
        return original(self, *args, **kwargs)

    make_ir._parity_counted = True
    compiler.ASTSource.make_ir = make_ir


def compiles() -> int:
    """Triton's compiles in this process so far (count_compiles)."""
    return _compiles[0]


# ------------------------------------------------------------------ the GPU to itself while timing
GPU_LOCK_ENV = "PARITY_FLA_GPU_LOCK"  # a lane's lock file, one per GPU (parity.execute.backends.fla_lane)
_lock: list = []  # the lock file's descriptor, once opened


def _lock_fd() -> int | None:
    path = os.environ.get(GPU_LOCK_ENV)
    if path and not _lock:
        _lock.append(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    return _lock[0] if _lock else None


def sharing_the_gpu():
    """Within (a lane's FLA call): the GPU shared with the other lanes' calls, never with another
    lane's autotuning (a shared lock on the GPU's lock file; nothing outside a lane)."""
    return _locked(fcntl.LOCK_SH, fcntl.LOCK_UN)


def gpu_to_itself():
    """Within (an autotuner timing its configs, inside sharing_the_gpu): no other lane's call runs on
    the GPU (the lock made exclusive, then shared again)."""
    return _locked(fcntl.LOCK_EX, fcntl.LOCK_SH)


@contextlib.contextmanager
def _locked(within: int, after: int):
    """The GPU's lock file locked `within` while inside and `after` on leaving; nothing outside a lane."""
    fd = _lock_fd()
    if fd is None:
        yield
        return
    fcntl.flock(fd, within)
    try:
        yield
    finally:
        fcntl.flock(fd, after)


# ------------------------------------------------------------------ launches
def _constexpr_names(fn) -> list[str]:
    params = getattr(fn, "params", None)
    if params and hasattr(params[0], "is_constexpr"):  # a compiled JITFunction's KernelParams
        return [p.name for p in params if p.is_constexpr]
    return [
        name
        for name, p in inspect.signature(getattr(fn, "fn", fn)).parameters.items()
        if "constexpr" in str(p.annotation)
    ]


def _plain(v):
    return v if isinstance(v, (bool, int, float, str)) or v is None else str(v)


def _patch_launch(cls, compiled: bool) -> None:
    original = cls.run

    @functools.wraps(original)
    def run(self, *args, grid, warmup, **kwargs):
        out = original(self, *args, grid=grid, warmup=warmup, **kwargs)
        rec = getattr(_state, "recording", None)
        if rec is not None and not warmup:
            _add(rec, _launch(self, args, kwargs, out if compiled else None))
        return out

    cls.run = run


def _launch(fn, args: tuple, kwargs: dict, kernel) -> dict:
    """One launch of `fn` as the record lists it."""
    names = _constexpr_names(fn)
    arg_names = getattr(fn, "arg_names", None) or list(inspect.signature(getattr(fn, "fn", fn)).parameters)
    bound = {**dict(zip(arg_names, args)), **kwargs}
    meta = {n: _plain(bound[n]) for n in names if n in bound}
    metadata = getattr(kernel, "metadata", None)
    how, key, config_kwargs = getattr(_state, "tuning", None) or ("launch", None, None)
    return {
        "kernel": getattr(fn, "__name__", None) or fn.fn.__name__,
        "module": getattr(getattr(fn, "fn", fn), "__module__", ""),
        "meta": meta,
        "num_warps": getattr(metadata, "num_warps", kwargs.get("num_warps")),
        "num_stages": getattr(metadata, "num_stages", kwargs.get("num_stages")),
        "chosen_by": how,  # "pending": the autotuner's run says how once it returns (_note_tuned)
        "key": None if key is None else [str(k) for k in key],
        "config_kwargs": config_kwargs,  # the meta-parameters its autotuner's config set (None: no autotuner)
    }


def _add(rec: Recording, launch: dict, count: int = 1) -> None:
    ident = json.dumps(launch, sort_keys=True, default=str)
    if ident in rec.launches:
        rec.launches[ident]["launches"] += count
    else:
        rec.launches[ident] = {**launch, "launches": count}


# ------------------------------------------------------------------ fla.backends
def _patch_dispatch() -> None:
    """Make the functions fla.backends dispatches note which backend computed each call. A
    dispatched function is fla.backends' wrapper (under torch.compiler.disable) whose closure holds
    its registry and FLA's own function, called when no other backend takes the call: that cell is
    replaced by a function that notes "triton" and calls FLA's; each registered backend's
    implementations note their backend type."""
    import sys

    try:
        from fla.backends import BackendRegistry
    except ImportError:
        return
    for name, module in list(sys.modules.items()):
        if not name.startswith("fla.") or module is None or name in _scanned:
            continue
        _scanned.add(name)
        for obj in list(vars(module).values()):
            registry_cell = _dispatch_closure(obj, BackendRegistry)
            if registry_cell is not None:
                _note_default_calls(*registry_cell)
    for registry in _registries:
        for backend in registry._backends.values():
            if not getattr(backend, "_parity_noted", False):
                _note_backend_calls(backend, registry.operation_name)


_scanned: set[str] = set()  # fla modules whose dispatched functions are patched
_registries: list = []


def _dispatch_closure(obj, BackendRegistry):
    """(closure, registry) of fla.backends' wrapper inside `obj`, or None when obj is no dispatched function."""
    seen = 0
    while callable(obj) and seen < 4:
        cells = getattr(obj, "__closure__", None) or ()
        contents = [_content(c) for c in cells]
        registry = next((c for c in contents if isinstance(c, BackendRegistry)), None)
        if registry is not None:
            return cells, registry
        obj, seen = getattr(obj, "__wrapped__", None), seen + 1
    return None


def _content(cell):
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None


def _note_default_calls(cells, registry) -> None:
    """Replace FLA's own function in the wrapper's closure by one that notes "triton" and calls it."""
    for cell in cells:
        default = _content(cell)
        if not inspect.isfunction(default) or getattr(default, "_parity_noted", False):
            continue
        name = f"{default.__module__}.{default.__qualname__}"

        def noted(*args, _default=default, _name=name, **kwargs):
            rec = getattr(_state, "recording", None)
            if rec is not None:
                rec.dispatch[_name] = DEFAULT_BACKEND
            return _default(*args, **kwargs)

        functools.update_wrapper(noted, default)
        noted._parity_noted = True
        cell.cell_contents = noted
    if registry not in _registries:
        _registries.append(registry)


def _note_backend_calls(backend, operation: str) -> None:
    """The backend's implementations note, when called, that this backend computed the function
    (named "<operation>:<function>": the registry's operation, a module or a name like "common")."""
    original = backend.get_implementation

    def get_implementation(function_name):
        impl = original(function_name)
        if impl is None:
            return None

        @functools.wraps(impl)
        def noted(*args, **kwargs):
            rec = getattr(_state, "recording", None)
            if rec is not None:
                rec.dispatch[f"{operation}:{function_name}"] = backend.backend_type
            return impl(*args, **kwargs)

        return noted

    backend.get_implementation = get_implementation
    backend._parity_noted = True


# ------------------------------------------------------------------ configs for the lanes and workers
def configured(path, autotune: bool = False):
    """Within: PARITY_FLA_CONFIGS names `path` (a pins file or a table directory; nothing changes for
    None) and PARITY_FLA_AUTOTUNE says `autotune`, for the processes started within; put back after."""
    values = {} if path is None else {environ.FLA_CONFIGS: str(path)}
    if autotune:
        values[environ.FLA_AUTOTUNE] = "1"
    return environ.exported(values)
