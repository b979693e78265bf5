"""Which config each autotuned FLA kernel runs: pinned configs, FLA config tables, or the rule.

Left alone, Triton compiles and times every config of an autotuned kernel at each new key (36-81
configs for FLA's state kernels). The harness gives each (kernel, key) one config instead, and
times none unless asked; parity.execute.backends.fla_launches applies the choice, in this order,
and each launch in FLA's record says which one chose (`chosen_by`):

    pinned         PARITY_FLA_CONFIGS names a JSON file (`--fla-configs FILE`): an FLA record, a
                   list of its notes.fla_launches, or {kernel: config} for every key of a kernel
    autotune       PARITY_FLA_AUTOTUNE=1 (`--fla-autotune`, CUDA only): Triton's autotuner times
                   every config as production FLA does ("triton-cache": its stored result); the run
                   writes what it chose as a table (`entries_from_launches`, `write_table`)
    table          the key's entry in the config table: the directory PARITY_FLA_CONFIGS names
                   (`--fla-configs DIR`), else the table shipped for the GPU (`shipped_table`; in
                   the interpreter, INTERPRETER_GPU's)
    table-default  that table file's default_config for the kernel (FLA's own fallback)
    rule           RULE: the first config FLA lists for the key after its own pruning, with the
                   block sizes that change no bit raised (choose_config); the
                   interpreter on a CPU runs the same rule, so a GPU and the interpreter run the
                   same config at every key no table names

A table is FLA 0.6.0's own format (fla/ops/utils/cache.py): a directory of `{kernel}.json`,
    {"kernel_name": K, "triton_version": V, "default_config": CONFIG (optional),
     "autotune_entries": {key_hash(key): {"autotune_key": key, "config": CONFIG}}}
    CONFIG = {"kwargs": {...}, "num_warps": n, "num_stages": n, "num_ctas": 1, "maxnreg": null}
where key is the autotuner's key (its key arguments' values, then its tensors' dtypes), so
`FLA_CONFIG_DIR=<table> FLA_CACHE_MODE=strict` makes FLA itself run the same configs. The harness
reads only exact keys and default_config (not FLA's fuzzy match: a config tuned for one head
dimension is not taken for another). Tables shipped with the harness: TABLES/<GPU>, the GPU named
as FLA names its config directories (`sanitize_gpu_name` of torch's device name).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import re
from pathlib import Path

from parity.model import environ

TABLES = Path(__file__).parent / "fla_config_tables"
# the GPU whose shipped table FLA in the interpreter runs: the one the project's CUDA records come from
# (an sm_90, as the H100 whose tiles the interpreter takes), so that the interpreter and that GPU run
# the same config at every key. Measured on the ci and stages suites (575 tensors): its configs change
# no bit of the interpreter's outputs against the rule's, and no time.
INTERPRETER_GPU = "NVIDIA H200"
RULE = (
    "the first config FLA lists for the key after its own pruning, with the block sizes that change no bit "
    "raised to their largest (choose_config)"
)
CHOSEN_BY = ("pinned", "autotune", "triton-cache", "table", "table-default", "rule", "only-config", "fla-cache")


class TableError(ValueError):
    """A config table file that FLA's format does not allow (named, with what is wrong)."""


def sanitize_gpu_name(name: str) -> str:
    """A GPU's name as FLA names its config directory ('NVIDIA H200' -> 'NVIDIA_H200')."""
    return re.sub(r"[^0-9A-Za-z]+", "_", name).strip("_") or "unknown_gpu"


def shipped_table(device_name: str) -> Path | None:
    """The table shipped for the GPU named `device_name` (torch's name), or None."""
    path = TABLES / sanitize_gpu_name(device_name)
    return path if path.is_dir() else None


def key_hash(key) -> str:
    """The entry's name in a table file: FLA's AutotuneKey.key_hash (md5 of the key as compact, sorted JSON)."""
    text = json.dumps(_plain_key(key), separators=(",", ":"), sort_keys=True)
    return hashlib.md5(text.encode()).hexdigest()


def _plain_key(key):
    return [_plain_key(v) for v in key] if isinstance(key, (list, tuple)) else key


def key_from_text(texts) -> list:
    """A key as a record writes it (each value as text) back to its values: ints, floats, True,
    False, None, and the dtype names as they are."""
    out = []
    for t in texts:
        if t in ("True", "False", "None"):
            out.append({"True": True, "False": False, "None": None}[t])
        elif re.fullmatch(r"-?\d+", t):
            out.append(int(t))
        elif re.fullmatch(r"-?\d+\.\d*(e-?\d+)?", t):
            out.append(float(t))
        else:
            out.append(t)
    return out


def config_dict(kwargs: dict, num_warps: int, num_stages: int) -> dict:
    """A CONFIG as FLA's table holds it."""
    return {"kwargs": dict(kwargs), "num_warps": num_warps, "num_stages": num_stages, "num_ctas": 1, "maxnreg": None}


# ------------------------------------------------------------------ the rule
# kernel name -> meta-parameters that only batch independent work into one program instance:
# - chunk_kda_fwd_kernel_intra_token_parallel's BH, the heads of one token per instance (each
#   head's arithmetic is the same masked lanes whatever BH is; grid (B*T, cdiv(H, BH)));
# - the state kernels' BK and BV, the block of the [K, V] state one instance owns: every dot in
#   them sums over the chunk's tokens (h += k^T v, dh += q^T do), every gate is per element,
#   so no state entry depends on the block it sits in (grid (cdiv(K, BK) * cdiv(V, BV), N * H)).
# Larger values mean fewer instances to interpret.
NEUTRAL_PARAMS = {
    "chunk_kda_fwd_kernel_intra_token_parallel": ("BH",),
    "chunk_fwd_kernel_h": ("BK", "BV"),
    "chunk_bwd_kernel_dh": ("BK", "BV"),
}


def choose_config(kernel: str, configs: list):
    """The rule's config among the configs FLA's pruning left for a key (triton.Config, in FLA's
    order): the first, with its NEUTRAL_PARAMS parameters raised to the largest values among the
    configs that differ from the first only there (and in num_warps / num_stages)."""
    first = configs[0]
    params = [p for p in NEUTRAL_PARAMS.get(kernel, ()) if p in first.kwargs]
    if not params:
        return first
    rest = {k: v for k, v in first.kwargs.items() if k not in params}
    same = [c for c in configs if {k: v for k, v in c.kwargs.items() if k not in params} == rest]
    return max(same, key=lambda c: tuple(c.kwargs[p] for p in params))


def _patch_autotuner(Autotuner) -> None:
    original = Autotuner.prune_configs

    @functools.wraps(original)
    def one_config(self, kwargs):
        return [choose_config(self.base_fn.__name__, original(self, kwargs))]

    Autotuner.prune_configs = one_config


def _patch_benchmarker(Autotuner) -> None:
    """No timing in the interpreter. Triton 3.9 takes a key's config without benchmarking when
    prune_configs leaves one; Triton 3.6 and 3.7 time the configs left even then, through
    `do_bench`, which asks `driver.active` for the GPU's benchmarker (on a CPU: "RuntimeError:
    0 active drivers"). Here `do_bench` runs nothing and times every config alike, so the
    benchmark's min() takes the one config prune_configs left, as 3.9 does; what 3.6 and 3.7
    do around the timing stays theirs (the key's cache, the pre-hook's reset of reset_to_zero
    arguments, which FLA's ops here have none of). Under 3.9 it is not reached."""

    def untimed(kernel_call, quantiles=None):
        return [0.0] * len(quantiles) if quantiles else 0.0

    Autotuner.do_bench = property(lambda self: untimed)


# ------------------------------------------------------------------ reading
@functools.cache
def _table_file(path: str) -> dict | None:
    """A table file's contents, checked as FLA checks them (TableError), or None where it is absent."""
    p = Path(path)
    if not p.is_file():
        return None
    try:
        data = json.loads(p.read_text())
    except ValueError as e:
        raise TableError(f"{p}: not JSON ({e})") from None
    if not isinstance(data, dict):
        raise TableError(f"{p}: expected an object with autotune_entries and/or default_config")
    entries = data.get("autotune_entries") or {}
    default = data.get("default_config")
    if not isinstance(entries, dict) or not all(
        isinstance(e, dict) and isinstance(e.get("config"), dict) for e in entries.values()
    ):
        raise TableError(f"{p}: autotune_entries must map each key's hash to {{'autotune_key', 'config'}}")
    for config in [default] * (default is not None) + [e["config"] for e in entries.values()]:
        if not (isinstance(config, dict) and isinstance(config.get("kwargs", {}), dict) and "num_warps" in config):
            raise TableError(f"{p}: a config must have kwargs, num_warps and num_stages, got {config!r}")
    return data


def table_lookup(table: Path, kernel: str, key) -> tuple[dict, str] | None:
    """(CONFIG, 'table' or 'table-default') for (kernel, key) from the table directory, or None."""
    data = _table_file(str(table / f"{kernel}.json"))
    if data is None:
        return None
    entry = (data.get("autotune_entries") or {}).get(key_hash(key))
    if entry is not None:
        return entry["config"], "table"
    if data.get("default_config") is not None:
        return data["default_config"], "table-default"
    return None


@functools.cache
def read_pins(path: str) -> dict:
    """(kernel, key as text; None: every key) -> CONFIG, from a pins file: an FLA record, a list of
    its notes.fla_launches or {"launches": [...]} (each autotuned launch pins its config at its key),
    or {kernel: {"kwargs", "num_warps", "num_stages"}} (that config at every key of the kernel)."""
    data = json.loads(Path(path).read_text())
    launches = data
    if isinstance(data, dict):
        launches = data.get("launches") or (data.get("notes") or {}).get("fla_launches")
    if launches is None:
        return {
            (kernel, None): config_dict(c.get("kwargs", {}), c.get("num_warps", 4), c.get("num_stages", 3))
            for kernel, c in data.items()
        }
    pinned = {}
    for launch in launches:
        if launch.get("key") is None or launch.get("chosen_by") == "launch":
            continue  # no autotuner chose it: nothing to pin
        kwargs = {k: launch["meta"][k] for k in launch.get("config_kwargs") or () if k in launch["meta"]}
        pinned[(launch["kernel"], tuple(launch["key"]))] = config_dict(
            kwargs, launch.get("num_warps") or 4, launch.get("num_stages") or 3
        )
    return pinned


@dataclasses.dataclass(frozen=True)
class Source:
    """Where this process's FLA kernels take their configs (the module docstring's order)."""

    pins: Path | None = None  # a pins file
    table: Path | None = None  # a table directory
    autotune: bool = False

    def choose(self, kernel: str, key) -> tuple[dict, str] | None:
        """(CONFIG, chosen_by) for (kernel, key) from the pins or the table; None: autotune or the rule."""
        if self.pins is not None:
            pins = read_pins(str(self.pins))
            config = pins.get((kernel, tuple(map(str, key)))) or pins.get((kernel, None))
            if config is not None:
                return config, "pinned"
        if self.autotune or self.table is None:
            return None
        return table_lookup(self.table, kernel, key)

    def fingerprint(self) -> dict:
        """What FLA's bits depend on here: the pins file's and the table's sha256, and autotuning."""
        return {
            "pins_sha256": _sha256([self.pins]) if self.pins else None,
            "table_sha256": _sha256(sorted(self.table.glob("*.json"))) if self.table else None,
            "autotune": self.autotune,
        }

    def describe(self) -> str:
        """One line: where the configs come from."""
        parts = [f"pinned from {self.pins}"] if self.pins else []
        if self.autotune:
            parts.append("tuned by Triton's autotuner (--fla-autotune)")
        elif self.table:
            parts.append(f"the table {self.table}")
        return ", then ".join(parts + ["the rule"])


def _sha256(paths) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def source(device_name: str | None) -> Source:
    """This process's Source: PARITY_FLA_CONFIGS (a file: pins; a directory: the table) and
    PARITY_FLA_AUTOTUNE; without a table named, the one shipped for `device_name` (a CUDA GPU's
    name; None in the interpreter: INTERPRETER_GPU's). Asked at every autotuned launch."""
    return _source(os.environ.get(environ.FLA_CONFIGS), os.environ.get(environ.FLA_AUTOTUNE), device_name)


@functools.lru_cache(maxsize=64)
def _source(named: str | None, autotune: str | None, device_name: str | None) -> Source:
    path = Path(named) if named else None
    table = path if path is not None and path.is_dir() else None
    if table is None:
        table = shipped_table(device_name or INTERPRETER_GPU)
    return Source(
        pins=path if path is not None and not path.is_dir() else None,
        table=table,
        autotune=autotune == "1",
    )


# ------------------------------------------------------------------ writing
def entries_from_launches(launches: list[dict], chosen_by=("autotune", "triton-cache")) -> dict:
    """{kernel: {key_hash: {"autotune_key", "config"}}} of the launches whose config `chosen_by`
    names (by default those Triton's autotuner chose), from FLA records' notes.fla_launches."""
    out: dict[str, dict] = {}
    for launch in launches:
        if launch.get("chosen_by") not in chosen_by or launch.get("key") is None:
            continue
        key = key_from_text(launch["key"])
        kwargs = {k: launch["meta"][k] for k in launch.get("config_kwargs") or () if k in launch["meta"]}
        config = config_dict(kwargs, launch.get("num_warps") or 4, launch.get("num_stages") or 3)
        out.setdefault(launch["kernel"], {})[key_hash(key)] = {"autotune_key": key, "config": config}
    return out


def write_table(table: Path, entries: dict, triton_version: str, source_note: str) -> list[Path]:
    """Merge `entries` ({kernel: {hash: entry}}, entries_from_launches's) into the table directory's
    files (an entry of the same key is replaced); returns the files written. `source_note` says
    where the configs were chosen (kept in each file as "source"; FLA ignores it)."""
    table.mkdir(parents=True, exist_ok=True)
    written = []
    for kernel, new in sorted(entries.items()):
        path = table / f"{kernel}.json"
        old = _table_file.__wrapped__(str(path)) or {}
        merged = {**(old.get("autotune_entries") or {}), **new}
        head = {"kernel_name": kernel, "triton_version": triton_version, "source": source_note}
        if old.get("default_config"):
            head["default_config"] = old["default_config"]
        lines = [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
        entries_text = ",\n".join(f"  {json.dumps(h)}: {json.dumps(e)}" for h, e in sorted(merged.items()))
        path.write_text("{\n" + "\n".join(lines) + '\n "autotune_entries": {\n' + entries_text + "\n }\n}\n")
        written.append(path)
    _table_file.cache_clear()
    return written


def write_tuned_table(out_dir: Path, label: str) -> dict | None:
    """With --fla-autotune: the configs Triton's autotuner chose on the GPU (the launches of the FLA
    records in out_dir/fla), written as a table out_dir/fla-configs/<GPU> (write_table):
    {"table": its directory, "kernels": n, "keys": n}; None where no record tuned anything. label:
    the run, for the table's note of where its configs came from."""
    entries, gpu, triton = {}, None, None
    for path in sorted((Path(out_dir) / "fla").glob("*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        platform = record.get("platform") or ""
        if not platform.startswith("cuda:"):
            continue
        gpu, triton = platform.removeprefix("cuda:"), (record.get("versions") or {}).get("triton") or ""
        for kernel, new in entries_from_launches((record.get("notes") or {}).get("fla_launches") or []).items():
            entries.setdefault(kernel, {}).update(new)
    if not entries:
        return None
    table = Path(out_dir) / "fla-configs" / sanitize_gpu_name(gpu)
    write_table(table, entries, triton, f"Triton {triton}'s autotuner on one {gpu}, --fla-autotune ({label})")
    return {"table": str(table), "kernels": len(entries), "keys": sum(len(e) for e in entries.values())}
