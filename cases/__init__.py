"""The case registry: `Case`, deterministic inputs, named suites and hypothesis strategies."""

from cases.case import DTYPES, GATES, OPS, Case, CaseError
from cases.inputs import (
    check_size,
    input_hash,
    input_shapes,
    input_size,
    input_tensors,
    layout_of,
    make_inputs,
    make_inputs_f64,
    output_tensors,
    seed_at,
    storage_dtype,
)
from cases.layouts import Layout, Tensor

__all__ = [
    "Case",
    "CaseError",
    "Layout",
    "Tensor",
    "DTYPES",
    "GATES",
    "OPS",
    "check_size",
    "input_hash",
    "input_shapes",
    "input_size",
    "input_tensors",
    "layout_of",
    "make_inputs",
    "make_inputs_f64",
    "output_tensors",
    "seed_at",
    "storage_dtype",
]
from cases.suites import SUITES, get_suite, load_cases_file

__all__ += ["SUITES", "get_suite", "load_cases_file"]
