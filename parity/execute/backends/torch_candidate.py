"""A user's torch function in FLA's convention, on CUDA when present, else CPU."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from cases import Case
from parity.execute.backends.base import Execution
from parity.execute.backends.calling import (
    candidate_declines,
    candidate_function,
    candidate_kernel_call,
    check_candidate_supports,
    forward_case,
    run_torch,
)
from parity.execute.backends.stage_calling import run_stage_torch
from parity.model.spec import KernelCall, parse_backend_spec


class TorchCandidate:
    side = "candidate"

    def __init__(self, name: str, fn: Callable, spec: str):
        self.name, self.fn, self.spec = name, fn, spec

    @property
    def module(self) -> str:
        """The candidate's module (parity.execute.isolation keeps what its import changed to its calls)."""
        return parse_backend_spec(self.spec).module_function()[0]

    def function(self, case: Case) -> Callable:
        """The function the candidate runs for `case` (calling.candidate_function)."""
        return candidate_function(self.fn, parse_backend_spec(self.spec), case)

    def kernel_call(self, case: Case) -> KernelCall:
        """The candidate's function; chunk_size passed when it accepts one (calling.static_kwargs)."""
        return candidate_kernel_call("torch", parse_backend_spec(self.spec), self.function(case), case)

    def run(self, case: Case, inputs: dict[str, np.ndarray]) -> Execution:
        import torch

        cuda = torch.cuda.is_available()
        device = "cuda" if cuda else "cpu"
        fn = self.function(case)
        check_candidate_supports(fn, case)
        run_as, not_judged = forward_case(fn, case)
        run = run_torch if case.stage is None else run_stage_torch
        with candidate_declines():
            tensors, seconds = run(fn, run_as, inputs, device, torch.cuda.synchronize if cuda else lambda: None)
        where = f"cuda:{torch.cuda.get_device_name()}" if cuda else "cpu:torch"
        return Execution(
            tensors=tensors,
            platform=where,
            implementation=self.spec,
            versions={"torch": torch.__version__},
            kernel_time_s=seconds,
            numerics="cuda" if cuda else "cpu-torch",
            notes={"not_judged": not_judged} if not_judged else {},
        )
