"""The TPU targets the real TPU compiler compiles for (parity.execute.tpu_compile), by short name."""

from __future__ import annotations

from parity.model.host import libtpu_version
from parity.model.option_error import OptionError

# short name -> (topology of its compile-only devices, their device kind, cores per device);
# tests/test_tpu_identity.py holds the kinds and cores to libtpu's devices
_TABLE = {
    "v4": ("v4:2x2x1", "TPU v4", 1),
    "v5e": ("v5e:2x2", "TPU v5 lite", 1),
    "v5p": ("v5p:2x2x1", "TPU v5", 2),
    "v6e": ("v6e:2x2", "TPU v6 lite", 1),
    "tpu7x": ("tpu7x:2x2x1", "TPU7x", 1),
}
TARGETS = {name: topology for name, (topology, _, _) in _TABLE.items()}  # short name -> topology
IDENTITIES = {name: (kind, cores) for name, (_, kind, cores) in _TABLE.items()}  # -> (device kind, cores)
DEFAULT_TARGETS = ("v5e", "v6e", "tpu7x")


def parse_targets(text: str | None) -> tuple[str, ...]:
    """'v5e,v6e' -> ('v5e', 'v6e'); 'none' or '' -> (); None -> the default for this machine.
    OptionError (field tpu-targets) for a name that is not a target, or any target without libtpu."""
    if text is None:
        return default_targets()
    names = [t.strip() for t in text.split(",") if t.strip()]
    if names in ([], ["none"]):
        return ()
    bad = [t for t in names if t not in TARGETS]
    if bad:
        raise OptionError(
            "tpu-targets",
            text,
            f"'none' or a comma-separated list of {list(TARGETS)}",
            f"{bad[0]!r} is not a target",
        )
    if libtpu_version() is None:
        raise OptionError(
            "tpu-targets",
            text,
            "'none'",
            "libtpu is not installed (pip install 'jax[tpu]', the version jax pins), "
            "so nothing can compile for TPU here",
        )
    return tuple(dict.fromkeys(names))


def default_targets() -> tuple[str, ...]:
    """v5e, v6e and TPU7x where libtpu is installed and no TPU is attached; none otherwise (on a
    TPU the kernels compile for the TPU they run on)."""
    if libtpu_version() is None:
        return ()
    # late: asking jax for its devices initialises jax (heavy), only when targets are defaulted
    from kernels_jax.common.platform import on_tpu

    return () if on_tpu() else DEFAULT_TARGETS
