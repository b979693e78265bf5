"""What FLA ran, as its record says it, and configs pinned from an earlier record.

`recording()` collects, while FLA computes a case:
- every Triton kernel launch (compiled or interpreted), as
  {"kernel", "module", "meta": the constexpr arguments (block sizes, flags, shapes FLA makes
  constexpr), "num_warps", "num_stages", "chosen_by", "key", "config_kwargs", "launches": how many},
  launches alike counted once;
  num_warps and num_stages are the compiled kernel's own (its metadata) on a GPU, the launch's
  arguments in the interpreter (which ignores them; None: not given, Triton's default);
  "chosen_by" says where an autotuned kernel's config came from: "autotune" (benchmarked in this
  process), "triton-cache" (Triton's persisted autotune result, TRITON_CACHE_AUTOTUNING), "fla-cache"
  (FLA's config files, FLA_CACHE_MODE), "only-config" (one config left after pruning),
  "interpreter" (the interpreter's choice, triton_interpreter.choose_config), "pinned"
  (PARITY_FLA_CONFIGS), or "launch" for a kernel launched without an autotuner; "key" is the
  autotuner's tuning key (its key arguments and the tensors' dtypes, as text) and "config_kwargs"
  the meta-parameters its config set (None for both without an autotuner).
- which fla.backends backend computed each FLA function dispatched through it ("triton": FLA's
  own function, the default; else the backend type, e.g. "tilelang", "flash_kda").
Each is a list or dict in the FLA record's notes (fla_launches, fla_dispatch).

Pins: PARITY_FLA_CONFIGS names a JSON file (`parity run --fla-configs`): an FLA record, a list of
launches as above, or {"launches": [...]}: every autotuned kernel launch whose (kernel, key) it
lists runs that config, whatever the autotuner or the interpreter would choose, so two machines
(or two runs) run FLA's kernels alike; or {kernel: {"kwargs": {...}, "num_warps": n, "num_stages": n}}:
that config for every key of the kernel (e.g. FLA #984's fix, {"prepare_wy_repr_bwd_kernel":
{"num_warps": 2}}). Launches it does not name are chosen as usual.
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
from pathlib import Path

from parity.model import environ

PINS_ENV = environ.FLA_CONFIGS
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


def install(interpreted: bool) -> None:
    """Patch triton's launch path and autotuner, and fla.backends' dispatched functions (idempotent;
    after FLA is imported, and after triton_interpreter.enable() when `interpreted`)."""
    from triton.runtime.autotuner import Autotuner

    if "autotuner" not in _installed:
        _patch_autotuner(Autotuner, interpreted)
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


def _patch_autotuner(Autotuner, interpreted: bool) -> None:
    original_run = Autotuner.run
    original_prune = Autotuner.prune_configs

    @functools.wraps(original_prune)
    def prune_configs(self, kwargs):
        pruned = original_prune(self, kwargs)
        self._parity_pruned = len(pruned)
        return pruned

    @functools.wraps(original_run)
    def run(self, *args, **kwargs):
        kernel = self.base_fn.__name__
        key = tuning_key(self, args, kwargs) if len(self.configs) > 1 else ()
        table = pins()
        pinned = table.get((kernel, tuple(map(str, key)))) or table.get((kernel, None))
        if pinned is not None:
            self.cache[key] = pinned
            _provenance[(kernel, key)] = "pinned"
        elif key not in self.cache or (kernel, key) not in _provenance:
            new = key not in self.cache
            bench_time, self._parity_pruned = getattr(self, "bench_time", None), None
            _state.tuning = ("pending", key, None)
            try:
                if new and not interpreted and len(self.configs) > 1:
                    _compile_configs(self, args, kwargs)
                with gpu_to_itself() if new and not interpreted else contextlib.nullcontext():
                    out = original_run(self, *args, **kwargs)
            finally:
                _state.tuning = None
            how = _how_chosen(self, new, bench_time, interpreted)
            _provenance[(kernel, key)] = how
            _note_tuned(kernel, key, how, self.best_config)
            return out
        config = self.cache.get(key, self.configs[0])
        _state.tuning = (_provenance[(kernel, key)], key, sorted(config.kwargs))
        try:
            return original_run(self, *args, **kwargs)
        finally:
            _state.tuning = None

    Autotuner.prune_configs = prune_configs
    Autotuner.run = run


def _compile_configs(tuner, args: tuple, kwargs: dict) -> None:
    """Compile every config the autotuner will time (triton's Autotuner.warmup), before it takes the
    GPU to itself (gpu_to_itself): lanes compile side by side and time alone. Best effort: what fails
    here is compiled (or fails) in the autotuner's own run, as without it."""
    try:
        tuner.warmup(*args, **{k: v for k, v in kwargs.items() if k != "warmup"})
    except Exception:  # noqa: BLE001 - the autotuner's run compiles it, or reports why not
        pass


def _how_chosen(tuner, new: bool, bench_time, interpreted: bool) -> str:
    if len(tuner.configs) == 1:
        return "only-config"
    if not new:
        return "fla-cache"  # in the cache before triton's run: FLA's CachedAutotuner put it there
    if interpreted:
        return "interpreter"
    if tuner._parity_pruned == 1:
        return "only-config"
    return "autotune" if getattr(tuner, "bench_time", None) != bench_time else "triton-cache"


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


# ------------------------------------------------------------------ pins
@functools.cache
def _read_pins(path: str) -> dict:
    """(kernel, key as text, or None for every key) -> triton.Config, from a pins file (pins())."""
    from triton import Config

    data = json.loads(Path(path).read_text())
    launches = data
    if isinstance(data, dict):
        launches = data.get("launches") or (data.get("notes") or {}).get("fla_launches")
    if launches is None:  # {kernel: {"kwargs": {...}, "num_warps": n, "num_stages": n}}: every key of the kernel
        return {
            (kernel, None): Config(
                c.get("kwargs", {}), num_warps=c.get("num_warps", 4), num_stages=c.get("num_stages", 3)
            )
            for kernel, c in data.items()
        }
    pinned = {}
    for launch in launches:
        if launch.get("key") is None or launch.get("chosen_by") == "launch":
            continue  # no autotuner chose it: nothing to pin
        config = Config(
            {k: launch["meta"][k] for k in launch.get("config_kwargs") or () if k in launch["meta"]},
            num_warps=launch.get("num_warps") or 4,
            num_stages=launch.get("num_stages") or 3,
        )
        pinned[(launch["kernel"], tuple(launch["key"]))] = config
    return pinned


def pinned(path):
    """Within: PARITY_FLA_CONFIGS names `path` (nothing changes for None), for the processes started
    within; put back after."""
    return environ.exported({} if path is None else {PINS_ENV: str(path)})


def pins() -> dict:
    """(kernel, key as text; None: every key) -> triton.Config from the file PARITY_FLA_CONFIGS names
    ({} without one)."""
    path = os.environ.get(PINS_ENV)
    return _read_pins(path) if path else {}
