"""`pytest --parity-fuzz SECONDS`: the search tests/test_fuzz.py::test_fuzz_search runs for
each op (parity.fuzz, imported when it runs)."""

from __future__ import annotations

import os

from parity.pytest_plugin.options import bound_factor, report_dir


def fuzz_for_pytest(config, op: str) -> tuple[bool, str]:
    """The search `pytest --parity-fuzz SECONDS` runs for one op against the built-in kernel
    (pallas) or the first --candidate: (passed, report)."""
    from parity.fuzz import FuzzConfig, format_summary, run_fuzz  # late: heavy (hypothesis, the harness)

    opt = config.getoption
    candidate = (opt("parity_candidate") or ["pallas"])[0]
    out = report_dir(config) / "fuzz" / f"{op}-{os.getpid()}"
    cfg = FuzzConfig(
        out=out,
        ops=(op,),
        candidate=candidate,
        time_s=float(opt("parity_fuzz")),
        factor=bound_factor(config),
        progress=False,
    )
    summary = run_fuzz(cfg)
    return not summary["found"], format_summary(summary)
