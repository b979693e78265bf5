"""The code blocks of README.md and docs/*.md run as written (docs/ci.md, "The documentation's
code blocks"): each document's blocks in order, in one fresh directory, with this environment's
`python`, `parity` and `pytest` first on PATH. `python` blocks run with `python -c`, `sh` and
`bash` blocks with `bash -e`; HTML comment lines right before a block steer it:

    <!-- file: NAME -->       the block is written to NAME instead (later blocks use it)
    <!-- exit: N -->          the block must exit with N (default 0)
    <!-- prints: TEXT -->     its output (stdout and stderr) must contain TEXT (repeatable)
    <!-- not run: REASON -->  skipped, with the reason

The README's quick start is one of them: a kernel of the reader's own passes, the same kernel
with a planted bug fails the bound (`test_readme_quick_start_...`).
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
RUN = ("python", "sh", "bash")  # languages that run
SHOWN = ("text", "json", "ini", "toml", "yaml")  # languages shown only (or written with `file:`)
MARKER = re.compile(r"<!--\s*(file|exit|prints|not run):\s*(.*?)\s*-->")
FENCE = re.compile(r"^```(\S*)\s*$")
LINK = re.compile(r"\]\(([^)\s]+)\)")
BLOCK_TIMEOUT_S = 300


@dataclasses.dataclass
class Block:
    """One fenced code block: where it is, its language and text, and its markers."""

    doc: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    file: str | None = None
    exit: int = 0
    prints: list[str] = dataclasses.field(default_factory=list)
    not_run: str | None = None

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.not_run is None and (self.file is not None or self.lang in RUN)


def parse(doc: Path) -> tuple[list[Block], list[str]]:
    """(the document's code blocks, what is wrong with its blocks and markers)."""
    lines = doc.read_text().split("\n")
    blocks, problems, markers = [], [], []
    i = 0
    while i < len(lines):
        line, at = lines[i], f"{doc.relative_to(ROOT)}:{i + 1}"
        m = MARKER.fullmatch(line.strip())
        fence = FENCE.match(line)
        if m:
            markers.append(m.groups())
        elif fence:
            end = next((j for j in range(i + 1, len(lines)) if lines[j].rstrip() == "```"), None)
            if end is None:
                problems.append(f"{at}: a code block that is never closed")
                break
            block = Block(doc, i + 1, fence.group(1), "\n".join(lines[i + 1 : end]) + "\n")
            problems += _apply(block, markers, at)
            blocks.append(block)
            markers, i = [], end
        else:
            if markers:
                problems.append(f"{at}: markers {markers} are not right before a code block")
                markers = []
            if line.startswith("    ") and i and not lines[i - 1].strip():
                problems.append(f"{at}: an indented code block (fence it, with a language, so that it runs)")
        i += 1
    return blocks, problems


def _apply(block: Block, markers: list[tuple[str, str]], at: str) -> list[str]:
    """Set the block's markers; what is wrong with them and with its language."""
    problems = []
    for key, value in markers:
        if key == "file":
            block.file = value
        elif key == "exit":
            block.exit = int(value)
        elif key == "prints":
            block.prints.append(value)
        else:
            block.not_run = value
            if not value:
                problems.append(f"{at}: `not run` without a reason")
    if block.lang not in RUN + SHOWN:
        problems.append(f"{at}: code block language {block.lang!r}: expected one of {list(RUN + SHOWN)}")
    if block.not_run is not None and (block.file or block.prints or block.exit):
        problems.append(f"{at}: a block that is not run has expectations")
    if block.file and (block.prints or block.exit):
        problems.append(f"{at}: a written file has no exit status or output")
    return problems


def run_document(doc: Path, workdir: Path) -> list[Block]:
    """Run the document's blocks in order in workdir; the blocks run. Fails naming the block."""
    blocks, problems = parse(doc)
    assert not problems, problems
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PARITY_RUN_ID")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    ran = [b for b in blocks if b.runs]
    for block in ran:
        if block.file:
            (workdir / block.file).parent.mkdir(parents=True, exist_ok=True)
            (workdir / block.file).write_text(block.text)
            continue
        cmd = [sys.executable, "-c", block.text] if block.lang == "python" else ["bash", "-e", "-c", block.text]
        out = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True}
        t0 = time.perf_counter()
        p = subprocess.run(cmd, cwd=workdir, env=env, timeout=BLOCK_TIMEOUT_S, **out)
        print(f"{block.where}: exit {p.returncode} in {time.perf_counter() - t0:.1f} s")
        said = f"{block.where}: exit {p.returncode}\n{block.text}\n--- output ---\n{p.stdout[-6000:]}"
        assert p.returncode == block.exit, f"expected exit {block.exit}; {said}"
        for text in block.prints:
            assert text in p.stdout, f"expected {text!r} in the output; {said}"
    return ran


def test_every_code_block_runs_or_says_why_not():
    """Every block of every document is well formed, in a known language, and runs unless a
    `not run` marker gives the reason; the skipped ones are printed and counted."""
    problems, skipped, runs = [], [], 0
    for doc in DOCS:
        blocks, found = parse(doc)
        problems += found
        skipped += [b for b in blocks if b.not_run is not None]
        runs += sum(b.runs for b in blocks)
    assert not problems, "\n".join(problems)
    print(f"{runs} blocks run, {len(skipped)} not run:")
    for b in skipped:
        print(f"  {b.where}: {b.not_run}")
    assert runs and skipped


def _anchors(doc: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings: lower case, punctuation dropped, spaces to -."""
    headings = [ln.lstrip("#").strip() for ln in doc.read_text().split("\n") if re.match(r"#+ ", ln)]
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def test_every_link_names_a_file_and_heading_the_repository_holds():
    """Relative links of the README and docs/ point at files, and headings, that exist."""
    missing = []
    for doc in DOCS:
        for target in LINK.findall(doc.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            file = (doc.parent / path).resolve() if path else doc
            if not file.exists() or (anchor and file.suffix == ".md" and anchor not in _anchors(file)):
                missing.append(f"{doc.relative_to(ROOT)}: {target}")
    assert not missing, missing


def test_ci_runs_the_readmes_test_command():
    """The README's test command is the one .ci/run runs."""
    blocks, _ = parse(README)
    commands = [b.text.strip() for b in blocks if b.lang == "sh"]
    assert "bash scripts/test.sh" in commands and "bash scripts/smoke.sh" in commands
    assert "bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text().split("\n")


def test_readme_quick_start_passes_the_kernel_and_fails_the_planted_bug(tmp_path):
    """The README's blocks in a fresh directory, as a reader follows them: the kernel they write
    passes against the oracle and FLA (exit 0, the gate's PASS), the same kernel with its readout
    at jax's default precision fails the bound (exit 1, `fail-bound`), and their pytest session
    passes."""
    ran = run_document(README, tmp_path)
    runs = [b for b in ran if "parity run" in b.text and "--candidate" in b.text]
    assert [(b.exit, b.prints) for b in runs] == [(0, ["gate: PASS"]), (1, ["fail-bound"])]
    assert (tmp_path / "reports" / "mine" / "index.html").exists()
    assert any("pytest" in b.text and b.prints == ["1 passed"] for b in ran)


@pytest.mark.parametrize("doc", [d for d in DOCS[1:] if any(b.runs for b in parse(d)[0])], ids=lambda d: d.stem)
def test_docs_page_blocks_run_as_written(doc, tmp_path):
    assert run_document(doc, tmp_path)
