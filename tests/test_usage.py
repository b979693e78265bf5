"""Command usage: docs/usage.md is what `parity <command> --help` prints, for every command."""

from __future__ import annotations

import pytest

from parity.cli import main
from parity.cli.usage import DOC, REGENERATE, command_names, usage_markdown

STALE = f"docs/usage.md is not what the parser prints: run `{REGENERATE}` and commit docs/usage.md"


def _block(text: str) -> str:
    return f"```text\n{text.rstrip()}\n```"


def test_docs_usage_is_generated_from_the_parser():
    assert DOC.read_text() == usage_markdown(), STALE


def test_every_commands_help_is_its_docs_block(capsys):
    doc = DOC.read_text()
    for name in [None, *command_names()]:
        with pytest.raises(SystemExit) as e:
            main([name, "--help"] if name else ["--help"])
        assert e.value.code == 0
        assert _block(capsys.readouterr().out) in doc, f"parity {name or ''} --help: {STALE}"
    assert "--shrink-time" in doc and "--variants" in doc and "--tpu-targets" in doc


def test_help_is_the_same_in_a_narrow_terminal(monkeypatch, capsys):
    """At 40 columns `parity run --help` prints what the docs hold: the width is fixed, not the terminal's."""
    monkeypatch.setenv("COLUMNS", "40")
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    assert _block(capsys.readouterr().out) in DOC.read_text(), STALE
