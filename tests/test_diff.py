"""`parity diff BASE NEW`: an error that triples inside tolerance is flagged; mismatched or
missing records are refused; two equal runs pass."""

from __future__ import annotations

import json

import pytest

from cases import Case
from parity.cli import main
from parity.records import result_path

from .helpers import run

CASE = Case("simple_gla", 1, 40, 2, 32, 32, gate="gamma_alibi", direction="fwd", h0=True, ht=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same candidate name over one case: 1x a small perturbation of o in BASE, 3x in NEW."""
    root = tmp_path_factory.mktemp("diff")
    for name, fn in (("base", "perturbed_1x"), ("new", "perturbed_3x")):
        run([CASE], ["oracle", f"mine=jax:tests.spec_candidates:{fn}"], root / name, timeout_s=120)
    return root


def test_a_threefold_error_growth_inside_tolerance_is_flagged(runs, capsys):
    base, new = (json.loads(result_path(runs / d, "mine", CASE.id).read_text()) for d in ("base", "new"))
    assert base["verdict"] == new["verdict"] == "pass"  # the gate sees nothing
    ratio = new["tensors"]["o"]["rel_rms"] / base["tensors"]["o"]["rel_rms"]
    assert 2.9 < ratio < 3.1
    page = runs / "diff.html"
    assert main(["diff", str(runs / "base"), str(runs / "new"), "-o", str(page)]) == 1
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith(CASE.id))
    assert " o " in line and "FLAGGED" in line and "diff: FAIL (1 tensors" in out  # ht did not move
    html = page.read_text()
    assert 'class="flagged"' in html and "FAIL" in html and CASE.id in html
    assert main(["diff", str(runs / "base"), str(runs / "new"), "--max-ratio", "3.5"]) == 0
    assert main(["diff", str(runs / "new"), str(runs / "base")]) == 0  # the error shrank
    assert main(["diff", str(runs / "base"), str(runs / "base")]) == 0


def test_diff_refuses_what_it_cannot_compare(runs, tmp_path, capsys):
    import shutil

    other = tmp_path / "other"
    shutil.copytree(runs / "new", other)
    path = result_path(other, "mine", CASE.id)
    rec = json.loads(path.read_text())
    path.write_text(json.dumps({**rec, "input_hash": "f" * 64}))
    assert main(["diff", str(runs / "base"), str(other)]) == 2
    assert "input_hash differs" in capsys.readouterr().err
    path.unlink()
    assert main(["diff", str(runs / "base"), str(other)]) == 2
    assert "not in NEW" in capsys.readouterr().err
    assert main(["diff", str(runs / "base"), str(tmp_path / "absent")]) == 2
    with pytest.raises(SystemExit) as e:
        main(["diff", str(runs / "base"), str(runs / "new"), "--max-ratio", "0.5"])
    assert e.value.code == 2 and "--max-ratio" in capsys.readouterr().err


def test_a_worse_verdict_is_flagged_whatever_the_ratio(runs, tmp_path):
    import shutil

    other = tmp_path / "worse"
    shutil.copytree(runs / "base", other)
    path = result_path(other, "mine", CASE.id)
    rec = json.loads(path.read_text())
    rec["tensors"]["ht"]["verdict"] = "fail-accuracy"  # same epsilon, worse verdict
    path.write_text(json.dumps(rec))
    assert main(["diff", str(runs / "base"), str(other)]) == 1
