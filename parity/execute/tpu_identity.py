"""Which TPU a jax program is told it is on, on a machine without one.

Kernel libraries ask jax where they are before they choose what to run: atomic-ops passes
`interpret = jax.default_backend() != "tpu"` to every pallas_call, gdn2-pallas returns a pure-JAX
reference when `jax.devices("tpu")` raises, jax's ragged_paged_attention picks its blocks from
`jax.devices()[0].device_kind`, tpu-inference reads `pltpu.get_tpu_info()`, and Mosaic's own
lowering asks get_tpu_info() too (jnp.sign, 1-D blocks). On this host jax answers "cpu" to all of
them, and the harness would judge a fallback, or Pallas's generic interpreter, instead of the
library's TPU kernels. So while a candidate's module is imported, while it runs in TPU interpret
mode and while it is traced and lowered for a TPU target, every such question answers as the
target TPU would (`tpu_host`):

- jax's public platform questions (`jax.default_backend()`, `jax.devices()`,
  `jax.devices("tpu")`, `jax.local_devices()`, `jax.device_count()`, `jax.local_device_count()`)
  answer as a host with one chip of the target: backend "tpu", one device whose platform,
  device_kind and num_cores are the target's. In TPU interpret mode that device is an
  `EmulatedTpuDevice` (arrays given to it by `jax.device_put` are placed on the CPU, where
  interpret mode computes); while compiling for a target it is the target's compile-only device.
  `jax.devices("cpu")` still lists the CPU, as on a TPU VM. jax's internals ask through
  jax._src.xla_bridge, which is left alone: arrays are still placed and computed on the CPU.
- jax's Pallas TPU queries (`pltpu.get_tpu_info()`, `pltpu.is_tpu_device()`, Mosaic's lowering)
  ask the *default device* (jax._src.pallas.mosaic.tpu_info.get_device_kind and
  get_num_device_cores): those two answer with the emulated device's kind and cores, and jax
  builds the TpuInfo from them as on that TPU. Compiling for a target, its compile-only device is
  also the default device (parity.execute.tpu_compile), so jax's internals agree.
  `tpu_info_for(device)` is get_tpu_info() asked with `device` the default.

Nothing leaks: the answers are installed once as wrappers of jax's functions that answer as the
real host unless this thread is inside `tpu_host` (a context variable), so the
harness's own calls and other candidates see the real host. Inside, the target's name is a jax
user context, so that jax's caches keyed on the trace context (get_tpu_info's, jit's traces) never
serve one identity's answer under another, or outside. The record states the emulation
(`describe`: the identity, and which questions the candidate asked, `asked`) and its platform
stays `cpu:tpu-interpret`: the identity is emulated, never the TPU. Not answered: a library's own
caches of an answer it got inside (its business), questions asked from threads it starts, and
`jax.extend.backend.get_backend()`, which returns jax's CPU client.

Which target interpret mode emulates: `--tpu-interpret-as`, else the first of the run's
`--tpu-targets`, else the first default target (v5e); the command line hands it to its
workers through the environment (ENV, SOURCE_ENV: `exported`).
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import dataclasses
import functools
import os

from parity.model import environ
from parity.model.targets import DEFAULT_TARGETS, IDENTITIES  # IDENTITIES: target -> (device kind, cores)

ENV = "PARITY_TPU_INTERPRET_AS"  # the target TPU interpret mode emulates in this process
SOURCE_ENV = "PARITY_TPU_INTERPRET_AS_SOURCE"  # the option it came from


def interpret_target() -> tuple[str, str]:
    """(target, source) that TPU interpret mode emulates in this process: $PARITY_TPU_INTERPRET_AS
    (set by `parity run` and the pytest plugin), else the first default target."""
    target = os.environ.get(ENV)
    if not target:
        return DEFAULT_TARGETS[0], "default"
    if target not in IDENTITIES:
        raise ValueError(f"${ENV}={target!r}: expected one of {list(IDENTITIES)}")
    return target, os.environ.get(SOURCE_ENV) or f"${ENV}"


def choose(interpret_as: str | None, targets, prefix: str = "--"):
    """A run's (target, source): interpret_as, else the first of its TPU targets, else None (the
    default applies); the source is the option's flag, with the surface's `prefix`."""
    if interpret_as:
        return interpret_as, f"{prefix}tpu-interpret-as"
    if targets:
        return targets[0], f"{prefix}tpu-targets"
    return None


def exported(choice: tuple[str, str] | None):
    """The run's choice in the environment (its workers start with it), restored on leaving."""
    return environ.exported({} if choice is None else dict(zip((ENV, SOURCE_ENV), choice)))


def describe(target: str, source: str, asked: dict[str, int] | None = None, module: str | None = None) -> dict:
    """The record's statement of the identity TPU interpret mode answered with; `asked`: how
    often the candidate asked each of jax's platform questions meanwhile (`Host.asked`; a jit
    whose trace is cached asks nothing); `module`: the candidate's module, whose import's answers
    are stated too (`import_note`)."""
    kind, cores = IDENTITIES[target]
    out = {"emulated": target, "device_kind": kind, "num_cores": cores, "source": source}
    out["host"] = {
        "answers": "a host with one chip of the target: jax.default_backend() 'tpu', one TPU device",
        "asked": dict(sorted((asked or {}).items())),
    }
    if module and import_note(module):
        out["host"]["import"] = import_note(module)
    return out


@functools.cache
def _user_context():
    import jax  # late: jax is heavy (the command line imports this module)

    return jax.make_user_context(None)  # created once: jax adds user contexts non-thread-safely


class EmulatedTpuDevice:
    """The TPU device `jax.devices()` lists in TPU interpret mode: platform, device_kind and
    num_cores of the target; anything else is the CPU device's, where its arrays live
    (`jax.device_put` to it places on `cpu`)."""

    platform = "tpu"

    def __init__(self, target: str, cpu):
        self.target, self.cpu = target, cpu
        self.device_kind, self.num_cores = IDENTITIES[target]
        self.id, self.process_index, self.host_id, self.task_id, self.slice_index = 0, 0, 0, 0, 0
        self.coords, self.core_on_chip = (0, 0, 0), 0

    def __getattr__(self, name):
        return getattr(self.cpu, name)

    def __repr__(self):
        return (
            f"TpuDevice(id=0, process_index=0, coords=(0,0,0), core_on_chip=0) [emulated {self.target} on {self.cpu}]"
        )


@dataclasses.dataclass
class Host:
    """What jax's platform questions answer inside `tpu_host`: backend "tpu" and `devices`;
    `asked` counts the questions asked."""

    target: str
    devices: list
    asked: collections.Counter = dataclasses.field(default_factory=collections.Counter)

    def answers(self, backend) -> bool:
        """Whether a question about `backend` is about the emulated TPU (None or "tpu"); "cpu"
        is answered by the real host, as on a TPU VM."""
        return backend is None or backend == "tpu"


_HOST: contextvars.ContextVar[Host | None] = contextvars.ContextVar("parity_tpu_host", default=None)
PLATFORM_QUESTIONS = ("default_backend", "devices", "local_devices", "device_count", "local_device_count")


def _answer(name: str, real):
    """jax.<name> as the emulated host answers it inside `tpu_host`, as `real` outside."""

    @functools.wraps(real)
    def answer(*args, **kwargs):
        host = _HOST.get()
        if host is None:
            return real(*args, **kwargs)
        backend = kwargs.get("backend", args[0] if args and name != "local_devices" else None)
        if name == "default_backend":
            host.asked[name] += 1
            return "tpu"
        if not host.answers(backend):
            return real(*args, **kwargs)
        host.asked[name] += 1
        return list(host.devices) if name.endswith("devices") else len(host.devices)

    answer.parity_real = real
    return answer


def _device_put(real):
    @functools.wraps(real)
    def device_put(x, device=None, *args, **kwargs):
        if isinstance(device, EmulatedTpuDevice):
            device = device.cpu
        return real(x, device, *args, **kwargs)

    device_put.parity_real = real
    return device_put


def _device_answer(attribute: str, real):
    """jax's tpu_info.get_device_kind / get_num_device_cores (what pltpu.get_tpu_info(),
    is_tpu_device() and Mosaic's lowering ask): the emulated device's inside `tpu_host`."""

    @functools.wraps(real)
    def answer():
        host = _HOST.get()
        return real() if host is None else getattr(host.devices[0], attribute)

    answer.parity_real = real
    return answer


@functools.cache
def install() -> None:
    """Wrap jax's public platform questions, jax.device_put and Pallas's two TPU queries once per
    process (`_answer`, `_device_answer`); outside `tpu_host` they answer as jax does."""
    import jax  # late: jax is heavy (the command line imports this module)
    from jax._src.pallas.mosaic import tpu_info  # the module Pallas's TPU queries ask through

    for name in PLATFORM_QUESTIONS:
        setattr(jax, name, _answer(name, getattr(jax, name)))
    jax.device_put = _device_put(jax.device_put)
    tpu_info.get_device_kind = _device_answer("device_kind", tpu_info.get_device_kind)
    tpu_info.get_num_device_cores = _device_answer("num_cores", tpu_info.get_num_device_cores)


@contextlib.contextmanager
def tpu_host(target: str, devices=None):
    """Inside (this thread, until it is left, exception or not): jax's platform questions and
    Pallas's TPU queries answer as a host with one chip of `target` (module docstring); `devices`:
    what jax.devices() lists (default: an EmulatedTpuDevice, the host TPU interpret mode runs a
    candidate and imports its module on; compiling, the target's compile-only device).
    Yields the Host, whose `asked` counts the questions asked. The host is a jax user context
    meanwhile: a jit traced inside is never served outside, nor under another host."""
    import jax  # late: jax is heavy (the command line imports this module)

    install()
    if devices is None:
        devices = [EmulatedTpuDevice(target, jax.devices.parity_real("cpu")[0])]
    host = Host(target, list(devices))
    token = _HOST.set(host)
    try:
        with _user_context()(f"parity-tpu-host:{target}:{devices[0]!r}"):
            yield host
    finally:
        _HOST.reset(token)


_IMPORTS: dict[str, dict] = {}  # a candidate's module -> how the questions of its import were answered


def imported(module: str, host: Host | None) -> None:
    """Note how `module`'s import was answered: by `host` (the emulated host the harness imported it
    on), or, with host None, by this machine (it was imported before the harness asked for it, by
    a test file say); the first note of a module stands."""
    if host is None:
        _IMPORTS.setdefault(module, {"answered_by": "this machine (imported before the harness imported it)"})
    else:
        _IMPORTS.setdefault(module, {"answered_by": f"the emulated {host.target} host", "asked": dict(host.asked)})


def import_note(module: str) -> dict | None:
    """How the questions asked while `module` was imported were answered (`imported`), if noted."""
    return _IMPORTS.get(module)


def tpu_info_for(device):
    """get_tpu_info() as jax answers it with `device` (a compile-only TPU device) the default."""
    import jax  # late: jax is heavy (the command line imports this module)
    from jax.experimental.pallas import tpu as pltpu

    with jax.default_device(device):
        return pltpu.get_tpu_info()
