"""The plugin's `--parity-*` options: declared (add_options), refused at configure when they
cannot be used (refuse_bad_options: pytest's usage error, exit 4), and read by the hooks
(selected_cases, report_dir, bound_factor, allow_unbounded_reference, session_specs,
session_targets; the TPU identity
interpret mode emulates is exported at configure, export_interpret_as). The values' checks are
parity.model.options's, shared with the command line; this module adds the `--parity-` prefix
and pytest's usage error. Only the standard library, pytest and parity.model at import: the case
registry and the TPU target table are imported when an option that needs them is given."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest

from parity.model import options  # standard library only (the option layer, shared with the command line)
from parity.model.spec import REFERENCE  # standard library only (the backend spec's parser)

PREFIX = "--parity-"  # this surface's flag prefix: option NAME is --parity-NAME
SELECTION = ("suite", "cases", "op", "max_elements", "max_bytes")  # the options selected_cases reads

# marker -> the built-in backend specs it runs (candidates are added on interpret and tpu)
MODE_BACKENDS = {
    "interpret": ["oracle", REFERENCE, "pallas", "pallas-fused"],
    "gpu": ["oracle", REFERENCE],
    "tpu": ["oracle", "pallas", "pallas-fused"],
}
DEFAULT_REPORT_DIR = "reports/pytest"


def add_options(parser) -> None:
    g = parser.getgroup("parity", "linear-attention parity tests (linattn-parity)")
    g.addoption(
        "--parity-suite",
        default=None,
        help="case suite for the parity tests (default smoke); several joined by commas (ci,stages)",
    )
    g.addoption(
        "--parity-cases", default=None, metavar="FILE", help="JSON file of case dicts or ids (instead of a suite)"
    )
    g.addoption("--parity-op", default=None, help="only cases of this op")
    g.addoption(
        "--parity-max-elements",
        default=None,
        metavar="N",
        help="refuse a case whose inputs exceed this many elements (default parity run's, 2^30)",
    )
    g.addoption(
        "--parity-max-bytes",
        default=None,
        metavar="N",
        help="refuse a case whose inputs exceed this many bytes in float64 (default parity run's, 8 GiB)",
    )
    g.addoption(
        "--parity-report-dir",
        default=DEFAULT_REPORT_DIR,
        metavar="DIR",
        help=f"where parity tests write their records (default {DEFAULT_REPORT_DIR})",
    )
    g.addoption(
        "--parity-candidate",
        action="append",
        default=[],
        metavar="NAME=FRAMEWORK:MODULE:FUNCTION",
        help="a kernel to test (FRAMEWORK jax, pallas or torch; MODULE importable from the current "
        "directory); repeatable",
    )
    g.addoption(
        "--parity-backends",
        default=None,
        metavar="LIST",
        help="keep only these built-in backends in each marker's set (e.g. oracle,fla); default all of them",
    )
    g.addoption(
        "--parity-bound-factor",
        default=None,
        metavar="F",
        help="eps_candidate <= F * eps_reference + floor (default 1)",
    )
    g.addoption(
        "--parity-fuzz",
        type=float,
        default=None,
        metavar="SECONDS",
        help="run tests/test_fuzz.py::test_fuzz_search: parity fuzz of each op for SECONDS against pallas "
        "(or the first --parity-candidate)",
    )
    g.addoption(
        "--parity-tpu-targets",
        default=None,
        metavar="LIST",
        help="compile the jax candidates of interpret and tpu tests for these TPU targets (v4, v5e, v5p, v6e, "
        "tpu7x) or 'none'; default v5e,v6e,tpu7x where libtpu is installed and no TPU is attached",
    )
    g.addoption(
        "--parity-fla-lanes",
        default=None,
        metavar="N",
        help="long-lived processes that run FLA for every test worker (docs/fla-on-gpu.md): auto (default: "
        "one per CUDA GPU, none without one) or N (on a CPU: N interpreter lanes)",
    )
    g.addoption(
        "--parity-fla-fallback",
        default=None,
        metavar="WHERE",
        help="where a case goes that FLA on CUDA refuses for a known reason of its environment: none (default) "
        "or interpreter (FLA in Triton's interpreter on this machine; the record says so)",
    )
    g.addoption(
        "--parity-fla-configs",
        default=None,
        metavar="PATH",
        help="the configs FLA's autotuned kernels run: a FILE pins them (an FLA record, or a list of its "
        "notes.fla_launches); a DIR is an FLA config table (KERNEL.json; default on CUDA: the table shipped "
        "for the GPU); keys neither names run the rule's config",
    )
    g.addoption(PREFIX + options.FLA_AUTOTUNE.name, action="store_true", default=False, help=options.FLA_AUTOTUNE.help)
    g.addoption(
        "--parity-tpu-interpret-as",
        default=None,
        metavar="TARGET",
        help="in TPU interpret mode pltpu.get_tpu_info() answers as this TPU target (v4, v5e, v5p, v6e, tpu7x); "
        "default the first of --parity-tpu-targets, else v5e",
    )
    g.addoption(
        PREFIX + options.ALLOW_UNBOUNDED_REFERENCE.name,
        action="store_true",
        default=False,
        help=options.ALLOW_UNBOUNDED_REFERENCE.help,
    )
    g.addoption(PREFIX + options.FRESH.name, action="store_true", default=False, help=options.FRESH.help)


def usage_error(e) -> pytest.UsageError:
    """parity.model.options's refusal as pytest's usage error (exit 4), naming the option with this
    surface's flag prefix."""
    return pytest.UsageError(e.message(PREFIX))


def _checked(check, *args):
    """check(*args), its OptionError raised as pytest's usage error."""
    try:
        return check(*args)
    except options.OptionError as e:
        raise usage_error(e) from None


def refuse_bad_options(config) -> None:
    """One line naming the option and the allowed values for anything given that cannot be used
    (pytest then exits 4, its usage-error code); nothing heavy is imported unless it is given."""
    opt = config.getoption
    _refuse_path_as_rootdir(config)
    bound_factor(config)
    if any(opt(f"parity_{name}") is not None for name in SELECTION):
        selected_cases(config)
    kept_builtins(config)
    _checked(options.candidates, opt("parity_candidate"))
    fla_settings(config)
    if opt("parity_tpu_targets") is not None:
        tpu_targets(opt("parity_tpu_targets"))
    if opt("parity_tpu_interpret_as") is not None or opt("parity_tpu_targets") is not None:
        export_interpret_as(config)


def selected_cases(config) -> list:
    """The cases of --parity-suite (smoke when neither it nor --parity-cases is given) or
    --parity-cases, of --parity-op, each within --parity-max-elements and --parity-max-bytes."""
    # late: the selection is read only when parity tests run or a selection option is given
    from parity.pytest_plugin.checks import select_cases

    return _checked(select_cases, *(config.getoption(f"parity_{name}") for name in SELECTION))


def export_interpret_as(config) -> None:
    """The TPU identity interpret mode emulates in this session (parity.execute.tpu_identity), in
    the environment the backends read it from: --parity-tpu-interpret-as, else the first of
    --parity-tpu-targets; without either the backends' default (v5e) stands."""
    # late: the harness's TPU identity table, only when one of the two options is given
    from parity.execute.tpu_identity import ENV, SOURCE_ENV, choose

    target = config.getoption("parity_tpu_interpret_as")
    target = None if target is None else _checked(options.interpret_as, target)
    targets = tpu_targets(config.getoption("parity_tpu_targets")) if target is None else ()
    choice = choose(target, targets, PREFIX)
    if choice is not None:
        os.environ[ENV], os.environ[SOURCE_ENV] = choice


def _refuse_path_as_rootdir(config) -> None:
    """pytest picks its rootdir and ini file from the free arguments before any plugin's options
    are known, so `--parity-report-dir DIR` (two words, DIR existing) made DIR a test path there:
    without an ini file above the current directory, the rootdir comes from DIR and conftest.py
    files above it are not loaded. Refused with the spelling that works (`--parity-report-dir=DIR`)."""
    args = list(config.invocation_params.args)
    here = config.invocation_params.dir
    if config.inipath is not None and config.inipath.parent in (here, *here.parents):
        return
    for name in ("--parity-report-dir", "--parity-cases"):
        for i, a in enumerate(args[:-1]):
            value = args[i + 1]
            if a == name and Path(value).exists():
                raise pytest.UsageError(
                    f"{name} {value}: pytest took {value!r} for a test path when it chose its rootdir "
                    f"({config.rootpath}); write {name}={value}"
                )


def fla_settings(config) -> tuple[int | None, bool, Path | None, bool]:
    """(--parity-fla-lanes, --parity-fla-fallback, --parity-fla-configs, --parity-fla-autotune), checked:
    FLA's lanes (None: one per CUDA GPU), whether cases CUDA refuses go to the interpreter, the configs
    file or table, whether Triton tunes FLA's kernels."""
    opt = config.getoption
    return (
        _checked(options.fla_lanes, opt("parity_fla_lanes")),
        _checked(options.fla_fallback, opt("parity_fla_fallback")),
        _checked(options.fla_configs, opt("parity_fla_configs")),
        _checked(options.fla_autotune, opt("parity_" + options.FLA_AUTOTUNE.dest)),
    )


def bound_factor(config) -> float:
    return _checked(options.bound_factor, config.getoption("parity_bound_factor"))


def allow_unbounded_reference(config) -> bool:
    """--parity-allow-unbounded-reference (parity.model.options.ALLOW_UNBOUNDED_REFERENCE)."""
    return bool(config.getoption("parity_" + options.ALLOW_UNBOUNDED_REFERENCE.dest))


def fresh(config) -> bool:
    """--parity-fresh (parity.model.options.FRESH)."""
    return bool(config.getoption("parity_" + options.FRESH.dest))


def kept_builtins(config) -> set[str] | None:
    """The built-in backends --parity-backends keeps, or None for all of them."""
    text = config.getoption("parity_backends")
    return None if text is None else set(_checked(options.builtin_backends, text))


def report_dir(config) -> Path:
    return Path(config.getoption("parity_report_dir"))


def session_specs(config, mode: str) -> list[str]:
    """The backend specs a marker's tests run: its built-ins kept by --parity-backends, then
    the candidates (none on gpu, which runs the reference only)."""
    kept = kept_builtins(config)
    builtins = [s for s in MODE_BACKENDS[mode] if kept is None or s in kept]
    return builtins + ([] if mode == "gpu" else list(config.getoption("parity_candidate")))


def session_targets(config, mode: str) -> tuple[str, ...]:
    return () if mode == "gpu" else tpu_targets(config.getoption("parity_tpu_targets"))


@functools.cache
def tpu_targets(text: str | None) -> tuple[str, ...]:
    return _checked(options.tpu_targets, text)
