"""The option layer: the values both the command line (`--NAME`) and the pytest plugin
(`--parity-NAME`) take, parsed and checked once: the case selection (suite, cases file, case
ids, op, size limits), backends and candidates, the bound factor, TPU targets and the TPU
interpret mode's target; and the switches both declare from here (ALLOW_UNBOUNDED_REFERENCE, FRESH).

Each check returns the parsed value or raises OptionError(field, value, allowed, problem)
(parity.model.option_error):
`field` is the option's name without a prefix ("bound-factor"), `allowed` the values it takes,
in words. A surface adds its flag prefix (`message("--")`, `message("--parity-")`) and prints
the line its way: the command line exits 2, the plugin raises pytest's usage error (exit 4).

Standard library only at import (the plugin imports this module in every pytest session):
the case registry and the TPU target table are imported inside the checks that need them.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from parity.model.host import cuda_devices
from parity.model.option_error import OptionError
from parity.model.spec import BUILTIN, CANDIDATE_FORM, SpecError, parse_backend_spec

DEFAULT_BOUND_FACTOR = 1.0


# ------------------------------------------------------------------------------ numbers


def int_at_least(field: str, text: str, low: int) -> int:
    """An int >= low, from its text."""
    try:
        value = int(text)
    except (TypeError, ValueError):
        value = None
    if value is None or value < low:
        raise OptionError(field, text, f"an int >= {low}")
    return value


def finite_at_least(field: str, text: str, low: float, allowed: str | None = None) -> float:
    """A finite number >= low, from its text."""
    allowed = allowed or f"a finite number >= {low:g}"
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = math.nan
    if not (math.isfinite(value) and value >= low):
        raise OptionError(field, text, allowed)
    return value


def bound_factor(text: str | None) -> float:
    """eps_candidate <= F * eps_reference + floor: F finite, >= 0; None -> 1."""
    return DEFAULT_BOUND_FACTOR if text is None else finite_at_least("bound-factor", text, 0)


@dataclasses.dataclass(frozen=True)
class Switch:
    """An on/off option both surfaces declare from here: `--NAME` / `--parity-NAME`, off unless given."""

    name: str  # without a prefix, e.g. "allow-unbounded-reference"
    help: str

    @property
    def dest(self) -> str:
        """The attribute argparse and pytest store it under (without the plugin's parity_ prefix)."""
        return self.name.replace("-", "_")


ALLOW_UNBOUNDED_REFERENCE = Switch(
    "allow-unbounded-reference",
    "pass a candidate's tensor the reference could not bound because of its environment (FLA refused "
    "there, e.g. fla#640, or ran a kernel known wrong there, e.g. fla#984), held to its tolerance only "
    "(listed apart, with cause and fix); by default it fails as unbounded-reference",
)


FLA_AUTOTUNE = Switch(
    "fla-autotune",
    "tune FLA's autotuned kernels as production FLA does (Triton times every config at each key, with "
    "the GPU to itself) instead of running one config per key from a table or the rule, and write what "
    "it chose as an FLA config table, out/fla-configs/<GPU> (docs/fla-on-gpu.md); a CUDA GPU only",
)


FRESH = Switch(
    "fresh",
    "ignore the harness's caches (the oracle's, FLA's records and TPU compiles, $PARITY_CACHE) and "
    "compute everything again (what is computed is still stored)",
)


def size_limit(field: str, text: str) -> int:
    """max-elements or max-bytes: an int >= 1."""
    return int_at_least(field, text, 1)


# ------------------------------------------------------------------------------ cases


def select_cases(
    suite: str | None,
    cases_file: str | None,
    case_ids: list[str] | None,
    op: str | None,
    max_elements: int,
    max_bytes: int,
) -> list:
    """The cases of exactly one source (suite names, a JSON cases file, or case ids; case_ids
    None where the surface has no such option), of `op` if given, each within the size limits."""
    from cases import Case, CaseError, get_suite, load_cases_file  # late: the case registry (numpy)

    given = [x for x in (suite, cases_file, case_ids) if x]
    if len(given) != 1:
        sources = "{suite} NAME, {cases} FILE" + (", {case} ID" if case_ids is not None else "")
        raise OptionError("suite", suite, f"exactly one of {sources}", f"{len(given)} case sources given")
    if suite:
        cases = list({c.id: c for name in check_suite(suite).split(",") for c in get_suite(name)}.values())
    elif cases_file:
        check_cases_file(cases_file)
        try:
            cases = load_cases_file(cases_file)
        except CaseError as e:
            raise OptionError("cases", cases_file, "", str(e)) from None
    else:
        cases = []
        for case_id in case_ids:
            try:
                cases.append(Case.from_id(case_id))
            except CaseError as e:
                raise OptionError("case", case_id, "", str(e)) from None
    if op:
        cases = [c for c in cases if c.op == check_op(op)]
    for c in cases:
        check_size(c, max_elements, max_bytes)
    return cases


def check_suite(names: str) -> str:
    """A suite name, or several joined by commas ("ci,stages": their cases, each once, in order)."""
    from cases import SUITES  # late: the case registry (numpy)

    for name in names.split(","):
        if name not in SUITES:
            allowed = f"one of {list(SUITES)}, or several joined by commas"
            raise OptionError("suite", names, allowed, f"unknown suite {name!r}")
    return names


def check_op(name: str) -> str:
    from cases import OPS  # late: the case registry (numpy)

    if name not in OPS:
        raise OptionError("op", name, f"one of {list(OPS)}", f"unknown op {name!r}")
    return name


def check_cases_file(path: str) -> str:
    if not Path(path).is_file():
        raise OptionError("cases", path, "a JSON file of case dicts or ids")
    return path


def check_size(case, max_elements: int, max_bytes: int) -> None:
    """Refuse a case whose inputs exceed max_elements elements or max_bytes bytes in float64
    (the field named is the limit it exceeds)."""
    from cases.inputs import input_size  # late: the case registry (numpy)

    n, nbytes = input_size(case)
    if n <= max_elements and nbytes <= max_bytes:
        return
    field, limit = ("max-elements", max_elements) if n > max_elements else ("max-bytes", max_bytes)
    raise OptionError(
        field,
        limit,
        "{max-elements} and {max-bytes} limits this case fits in",
        f"case {case.id}: inputs of {n} elements ({nbytes} bytes in float64) exceed the limit of "
        f"{max_elements} elements and {max_bytes} bytes",
    )


# ------------------------------------------------------------------------------ backends


def backend_list(text: str) -> list[str]:
    """Comma-separated backend names: none empty, at least one."""
    names = [x.strip() for x in text.split(",")]
    if not text.strip() or any(not x for x in names):
        allowed = "a comma-separated list of backend names, none empty, e.g. oracle,fla,pallas"
        raise OptionError("backends", text, allowed)
    return names


def builtin_backends(text: str) -> list[str]:
    """Comma-separated built-in backend names (oracle, fla, pallas, pallas-fused)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names or any(n not in BUILTIN for n in names):
        raise OptionError("backends", text, f"a comma-separated list of {list(BUILTIN)}")
    return names


def candidates(texts: list[str]) -> list[str]:
    """Each a candidate spec NAME=FRAMEWORK:MODULE:FUNCTION, by its form (nothing imported)."""
    for text in texts:
        spec = parse_backend_spec(text) if "=" in text else None
        if spec is None or not spec.is_candidate_spec:
            raise SpecError("candidate", text, CANDIDATE_FORM)
    return list(texts)


# ------------------------------------------------------------------------------ TPU


def tpu_targets(text: str | None) -> tuple[str, ...]:
    """'v5e,v6e' -> ('v5e', 'v6e'); 'none' -> (); None -> this machine's default."""
    from parity.model.targets import parse_targets  # late: the TPU target table and libtpu's presence

    return parse_targets(text)


def interpret_as(text: str) -> str:
    """The TPU target TPU interpret mode answers as: one of the TPU targets."""
    from parity.model.targets import TARGETS  # late: the TPU target table

    if text not in TARGETS:
        raise OptionError("tpu-interpret-as", text, f"one of {list(TARGETS)}")
    return text


# ------------------------------------------------------------------------------ FLA on the GPU side

FLA_FALLBACKS = ("none", "interpreter")


def fla_lanes(text: str | None) -> int | None:
    """--fla-lanes: how many FLA lanes (parity.execute.backends.fla_lane): an int >= 0, or auto (None: one per
    CUDA GPU, none on a host without one)."""
    if text is None or text == "auto":
        return None
    if not text.isdigit():
        raise OptionError("fla-lanes", text, "auto or an int >= 0")
    return int(text)


def fla_fallback(text: str | None) -> bool:
    """--fla-fallback: where a case CUDA refuses for a known reason goes: none, or interpreter (FLA in
    Triton's interpreter on the same machine); True for interpreter."""
    if text is None or text == "none":
        return False
    if text != "interpreter":
        raise OptionError("fla-fallback", text, " or ".join(FLA_FALLBACKS))
    return True


def fla_configs(text: str | None) -> Path | None:
    """--fla-configs: FLA's kernel configs: a JSON file of configs to pin (an FLA record, a list of its
    notes.fla_launches entries, {"launches": [...]}, or {kernel: {"kwargs", "num_warps", "num_stages"}}),
    or a directory of FLA config tables ({kernel}.json, as FLA_CONFIG_DIR holds them)."""
    if text is None:
        return None
    import json

    allowed = (
        'an FLA record, a list of its notes.fla_launches, {KERNEL: {"num_warps": N, ...}}, '
        "or a directory of FLA config tables (KERNEL.json)"
    )
    path = Path(text)
    if path.is_dir():
        tables = sorted(path.glob("*.json"))
        if not tables:
            raise OptionError("fla-configs", text, allowed, "no KERNEL.json in the directory")
        for table in tables:
            try:
                data = json.loads(table.read_text())
            except (OSError, ValueError) as e:
                raise OptionError("fla-configs", text, allowed, f"{table.name}: {e}") from None
            if not (isinstance(data, dict) and ("autotune_entries" in data or "default_config" in data)):
                raise OptionError("fla-configs", text, allowed, f"{table.name}: no autotune_entries or default_config")
        return path.resolve()
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise OptionError("fla-configs", text, allowed, str(e)) from None
    launches = data
    if isinstance(data, dict):
        launches = data.get("launches") or (data.get("notes") or {}).get("fla_launches")
        if launches is None and data and all(isinstance(c, dict) for c in data.values()):
            configs = data.values()
            keys = {"kwargs", "num_warps", "num_stages"}
            if all(set(c) <= keys and isinstance(c.get("kwargs", {}), dict) for c in configs):
                return path.resolve()
    if not (launches and isinstance(launches, list) and all(isinstance(x, dict) and "kernel" in x for x in launches)):
        raise OptionError("fla-configs", text, allowed, "no kernel configs in it")
    return path.resolve()


def fla_autotune(on: bool) -> bool:
    """--fla-autotune: refused on a host without a CUDA GPU (the interpreter has nothing to time)."""
    if on and cuda_devices() == 0:
        raise OptionError(
            FLA_AUTOTUNE.name,
            None,
            "",
            "tunes FLA's kernels on a CUDA GPU and this host has none (FLA runs in Triton's interpreter here, "
            "which times nothing); leave it out",
        )
    return on
