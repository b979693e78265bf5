"""docs/stages.md's table of stage signatures, written from the registry (cases.stages): each
stage's function, the keyword arguments the harness calls it with and what it returns, with
shapes and layouts.

python -m cases.stage_signatures          # rewrite the table in docs/stages.md
python -m cases.stage_signatures --check  # exit 1 when docs/stages.md does not hold it
"""

from __future__ import annotations

import sys
from pathlib import Path

from cases.case import Case
from cases.stages import RCP_LN2, STAGE_ORDER, stage_dtype, stage_of, stage_tensors
from cases.stages.record import FromCase

DOC = Path(__file__).resolve().parents[1] / "docs" / "stages.md"
BEGIN = "<!-- stage signatures: written by python -m cases.stage_signatures -->"
END = "<!-- end of stage signatures -->"
# a case whose sizes are all different, so that each size reads back as its symbol
SIZES = {"B": 2, "T": 320, "H": 3, "K": 48, "V": 80}
SYMBOLS = {2: "B", 320: "T", 3: "H", 6: "HV", 48: "K", 80: "V", 64: "C", 5: "NT"}
CONSTANT_WORDS = {RCP_LN2: "1/ln(2)"}  # constants the table writes in words (a FromCase: its own words)


def _case(op: str, stage: str) -> Case:
    """A bfloat16 stage case with SIZES (grouped value heads, HV = 2H, where the op has them), so
    that what is float32 whatever the case's dtype reads so."""
    hv = 2 * SIZES["H"] if op in ("kda", "gdn") else None
    gate = "g_logsig"
    return Case(
        op, **SIZES, HV=hv, dtype="bfloat16", chunk_size=64, gate=gate, h0=True, ht=True, stage=stage, direction="fwd"
    )


def _shape(shape: tuple[int, ...], layout) -> str:
    dims = [SYMBOLS.get(d, str(d)) for d in shape]
    if layout.value == "state":
        dims[0] = "N"
    return f"[{', '.join(dims)}]"


def _dtype(case: Case, name: str) -> str:
    return "the case dtype" if stage_dtype(case, name) == case.dtype else stage_dtype(case, name)


def _kwarg_words(value) -> str:
    if isinstance(value, FromCase):
        return value.words
    return CONSTANT_WORDS.get(value, repr(value))


def stage_row(op: str, name: str) -> str:
    """One table row: stage | call | returns."""
    stage = stage_of(op, name)
    case = _case(op, name)
    tensors = stage_tensors(case)
    args = [("g or g_gamma" if n == "gate" else n) for n in stage.inputs]
    kwargs = [f"{k}={_kwarg_words(v)}" for k, v in stage.kwargs]
    call = ", ".join([*args, *kwargs, "cu_seqlens", *(["chunk_size"] if stage.takes_chunk_size else [])])
    gate_only = " (g gates only)" if stage.g_only else ""
    returns = "; ".join(
        f"{n} {_shape(tensors[n].shape, tensors[n].layout)} {tensors[n].layout.value}, {_dtype(case, n)}"
        if n in tensors
        else f"{n}: None (no such tensor in {op})"
        for n in stage.outputs
    )
    return f"| `{op}:{name}`{gate_only} | `{stage.function}({call})` | {returns} |"


def markdown() -> str:
    """The table, between its markers."""
    rows = [stage_row(op, name) for op, names in STAGE_ORDER.items() for name in names]
    head = [
        BEGIN,
        "",
        "| stage | FLA's function, called with these keyword arguments | returns, in this order |",
        "| --- | --- | --- |",
    ]
    return "\n".join([*head, *rows, "", END])


def rewritten(text: str) -> str:
    """docs/stages.md's text with the table between its markers replaced by markdown()."""
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[:start] + markdown() + text[end:]


def main(argv: list[str]) -> int:
    text = DOC.read_text()
    if "--check" in argv:
        return 0 if rewritten(text) == text else 1
    DOC.write_text(rewritten(text))
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
