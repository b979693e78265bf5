"""The import structure (README "Architecture"): one direction, no circle, no hidden late import.

The layer contracts themselves are import-linter's (pyproject.toml, `lint-imports` in the test
command); these tests hold what its contracts do not: no circle between any two modules (its
acyclic contract looks at packages), and a function-level import of the project's own code only
with a comment saying why (a heavy dependency loaded on use), never to dodge a circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("parity", "cases", "references", "kernels_jax")


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph(*PACKAGES)


def import_circles(imports: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, on_stack, stack, circles = {}, {}, set(), [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(imports.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(imports):
        if v not in index:
            visit(v)
    return circles


def test_the_circle_finder_finds_a_circle_through_three_modules():
    imports = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_circles(imports) == [["a", "b", "c"]]
    assert import_circles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_back_through_others(graph):
    """Function-level imports included (grimp reads every import statement)."""
    imports = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    assert import_circles(imports) == []


def _late_imports_without_reason(path: Path, root: Path = ROOT) -> list[str]:
    """Function-level imports of the project's packages not preceded by a comment (above the block
    of imports they stand in) nor carrying one on their line."""
    lines = path.read_text().splitlines()
    tree = ast.parse("\n".join(lines))
    top = {id(n) for n in tree.body}
    bad = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)) or id(node) in top:
            continue
        name = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
        relative = isinstance(node, ast.ImportFrom) and node.level > 0
        if not (relative or (name or "").split(".")[0] in PACKAGES) or "#" in lines[node.lineno - 1]:
            continue
        i = node.lineno - 2
        while i >= 0 and (not lines[i].strip() or lines[i].strip().startswith(("import ", "from "))):
            i -= 1
        if i < 0 or not lines[i].strip().startswith("#"):
            bad.append(f"{path.relative_to(root)}:{node.lineno}: {name}")
    return bad


def test_a_late_import_of_the_project_says_why():
    bad = [b for p in PACKAGES for f in sorted((ROOT / p).rglob("*.py")) for b in _late_imports_without_reason(f)]
    assert bad == []


def test_the_late_import_check_sees_a_bare_one(tmp_path):
    (tmp_path / "m.py").write_text(
        "def f():\n    from parity.model import spec\n\n\ndef g():\n    # late: jax (heavy)\n"
        "    import os\n\n    from parity.model import host\n\n\ndef h():\n    from .x import y\n"
    )
    assert _late_imports_without_reason(tmp_path / "m.py", root=tmp_path) == ["m.py:2: parity.model", "m.py:13: x"]


def test_a_worker_and_the_command_start_without_the_heavy_libraries():
    """A worker process starts for each case batch and the command for each run: importing them
    loads none of scipy.stats (a second: the bound's t quantile loads it when it judges), jax,
    torch or triton (a worker imports those on its first case that needs them)."""
    import subprocess
    import sys

    heavy = ("scipy.stats", "jax", "torch", "triton")
    probe = f"import sys, parity.execute.worker, parity.cli; print([m for m in {heavy!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", out.stdout
