"""The option layer (parity.model.options) behind both surfaces: each refusal docs/gate.md ("Failing closed") promises
for an option, through the command line (`--NAME`, one line, exit 2) and through the pytest
plugin (`--parity-NAME`, pytest's usage error, exit 4), naming the same option, value and
allowed values; and the layer's own checks, with no flag in their messages."""

from __future__ import annotations

import pytest

import cases  # noqa: F401 - imported before pytester's in-process runs, which unload what they import
import parity.execute.tpu_identity  # noqa: F401
import parity.pytest_plugin  # noqa: F401
from cases import OPS
from parity.cli import main
from parity.model import options
from parity.model.option_error import OptionError
from parity.model.targets import TARGETS

TINY = "simple_gla-fwd-B1-T96-H2-K64-V64-fp32-C64-g_stress"  # a smoke case: 37056 input elements

# (name, command-line arguments, plugin arguments, what both name after the flag: the value and
# the allowed values or the problem)
REFUSALS = [
    ("suite", ["--suite", "nope"], ["--parity-suite", "nope"], ["'nope'", "unknown suite", "'smoke'"]),
    ("op", ["--suite", "smoke", "--op", "mamba"], ["--parity-op", "mamba"], ["'mamba'", str(list(OPS))]),
    ("cases", ["--cases", "missing.json"], ["--parity-cases=missing.json"], ["'missing.json'", "a JSON file"]),
    (
        "max-elements",
        ["--case", TINY, "--max-elements", "100"],
        ["--parity-op", "simple_gla", "--parity-max-elements", "100"],
        ["100:", "exceed the limit of 100 elements", "max-elements and "],
    ),
    ("max-bytes", ["--suite", "smoke", "--max-bytes", "0"], ["--parity-max-bytes", "0"], ["'0'", "an int >= 1"]),
    ("bound-factor", ["--suite", "smoke", "--bound-factor", "nan"], ["--parity-bound-factor", "nan"], ["finite"]),
    ("bound-factor", ["--suite", "smoke", "--bound-factor", "-1"], ["--parity-bound-factor", "-1"], ["'-1'", ">= 0"]),
    (
        "candidate",
        ["--suite", "smoke", "--candidate", "x=cuda:m:f"],
        ["--parity-candidate", "x=cuda:m:f"],
        ["'x=cuda:m:f'", "FRAMEWORK 'cuda' is not one of"],
    ),
    (
        "candidate",
        ["--suite", "smoke", "--candidate", "fla=jax:m:f"],
        ["--parity-candidate", "fla=jax:m:f"],
        ["'fla=jax:m:f'", "taken by a built-in backend"],
    ),
    (
        "tpu-targets",
        ["--suite", "smoke", "--tpu-targets", "v9"],
        ["--parity-tpu-targets", "v9"],
        ["'v9'", "is not a target", str(list(TARGETS))],
    ),
    (
        "tpu-interpret-as",
        ["--suite", "smoke", "--tpu-interpret-as", "v9"],
        ["--parity-tpu-interpret-as", "v9"],
        ["'v9'", f"expected one of {list(TARGETS)}"],
    ),
]


def cli(argv: list[str]) -> int:
    """parity's exit code for argv, in this process (argparse's refusals exit through SystemExit)."""
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


@pytest.fixture
def plugged(pytester, monkeypatch):
    """pytester in-process with the plugin loaded by -p (as tests/test_plugin.py's)."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    return lambda *args: pytester.runpytest_inprocess("-p", "parity.pytest_plugin", "-p", "no:cacheprovider", *args)


@pytest.mark.parametrize("name, cli_args, plugin_args, words", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_each_refusal_names_the_same_option_value_and_allowed_values_on_both_surfaces(
    name, cli_args, plugin_args, words, plugged, capsys, tmp_path
):
    rc = cli(["run", *cli_args, "--backends", "oracle", "--out", str(tmp_path / "o")])
    cli_err = capsys.readouterr().err
    assert rc == 2 and cli_err.count("\n") == 1 and f"--{name}" in cli_err, cli_err
    assert not (tmp_path / "o").exists()
    result = plugged("--co", *plugin_args)
    plugin_err = result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, plugin_err
    assert f"--parity-{name}" in plugin_err and "Traceback" not in plugin_err, plugin_err
    cli_line = next(ln for ln in cli_err.splitlines() if f"--{name}" in ln)
    plugin_line = next(ln for ln in plugin_err.splitlines() if f"--parity-{name}" in ln)
    for w in words:
        assert w in cli_line and w in plugin_line, (w, cli_line, plugin_line)


def test_the_plugin_refuses_an_oversized_case_as_the_command_line_does(plugged, pytester, capsys, tmp_path):
    """A cases file holding a case over the default limit of 2^30 elements."""
    big = "simple_gla-fwd-B1-T1000000000-H1-K16-V16-fp32-C16-g_logsig"
    (pytester.path / "big.json").write_text(f'["{big}"]')
    result = plugged("--co", "--parity-cases=big.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert f"--parity-max-elements {2**30}: case {big}: inputs of" in result.stderr.str()
    assert cli(["run", "--cases", str(pytester.path / "big.json"), "--out", str(tmp_path / "o")]) == 2
    assert f"--max-elements {2**30}: case {big}: inputs of" in capsys.readouterr().err


@pytest.mark.parametrize(
    "check, args, field",
    [
        (options.bound_factor, ["inf"], "bound-factor"),
        (options.size_limit, ["max-bytes", "1.5"], "max-bytes"),
        (options.backend_list, ["oracle,"], "backends"),
        (options.builtin_backends, ["oracle,mine"], "backends"),
        (options.candidates, [["pallas"]], "candidate"),
        (options.check_op, ["mamba"], "op"),
        (options.check_suite, ["nope"], "suite"),
        (options.interpret_as, ["v3"], "tpu-interpret-as"),
        (options.tpu_targets, ["v5e,v9"], "tpu-targets"),
    ],
)
def test_the_layer_raises_the_field_value_and_allowed_values_without_a_flag(check, args, field):
    with pytest.raises(OptionError) as e:
        check(*args)
    assert e.value.field == field and e.value.allowed and "--" not in str(e.value)
    assert e.value.message("--parity-").startswith(f"--parity-{field} ")


def test_the_layer_parses_what_both_surfaces_accept():
    assert options.bound_factor(None) == 1.0 and options.bound_factor("2.5") == 2.5
    assert options.builtin_backends("oracle, fla") == ["oracle", "fla"]
    assert options.candidates(["mine=jax:m:f"]) == ["mine=jax:m:f"]
    assert options.tpu_targets("none") == () and options.interpret_as("v6e") == "v6e"
    picked = options.select_cases("smoke", None, None, "kda", 2**30, 8 * 2**30)
    assert picked and {c.op for c in picked} == {"kda"}
    with pytest.raises(OptionError, match=r"expected exactly one of suite NAME, cases FILE$"):
        options.select_cases(None, None, None, None, 1, 1)  # no --case option on this surface
