"""The reference side: flash-linear-attention's Triton kernels, on CUDA or in Triton's interpreter.

    simple_gla: fla.ops.simple_gla.chunk_simple_gla (chunk size: the case's)
    gla:        fla.ops.gla.chunk_gla              (chunk size fixed by FLA: 64)
    kda:        fla.ops.kda.chunk_kda              (chunk size 32 or 64; 64 for other cases)
    gdn:        fla.ops.gated_delta_rule.chunk_gated_delta_rule  (chunk size 16, 32 or 64; 64 for 128)
    gdn2:       fla.ops.gdn2.chunk_gdn2            (chunk size fixed by FLA 0.6.0: 64)
kda and gdn take grouped value heads as they are (v, g, beta, states with HV = G * H heads:
FLA's GVA, value head j reads q, k head j // G). chunk_gdn2 takes neither grouped value heads nor
K > 256 (it asserts v [B, T, H, V] and K <= 256): those cases are unsupported (`fla_limits`). Its
backward multiplies w * v in a dot with a tensor of v's dtype, which needs w in v's dtype: the
registry stores w in the case dtype (cases.inputs), the same bytes for every backend.
Backward through torch autograd with cotangents do and dht. With no CUDA device the kernels
run under the Triton interpreter (see triton_interpreter.py), recorded as
'cpu:triton-interpreter'; FLA must then be imported after `triton_interpreter.request()`.
Tensors FLA does not differentiate (it returns no gradient for g_gamma) are reported as
unsupported with the reason, never as zeros.
A stage case (cases.stages) calls FLA's stage function itself (fla.ops.common.chunk_h.chunk_fwd_h,
...) on the stage's inputs, as FLA's op calls it (parity.execute.backends.stage_calling).
"""

from __future__ import annotations

import sys
import warnings
from importlib import metadata

import numpy as np

from cases import Case
from cases.stages import stage_of
from parity.execute.backends import fla_cache, fla_lane_client, fla_launches, triton_interpreter
from parity.execute.backends.base import Execution
from parity.execute.backends.calling import GRAD_NAMES, run_torch
from parity.execute.backends.stage_calling import run_stage_torch
from parity.model import fla_known
from parity.model.spec import REFERENCE, KernelCall, Unsupported

# op -> (module, function)
FLA_KERNELS = {
    "simple_gla": ("fla.ops.simple_gla", "chunk_simple_gla"),
    "gla": ("fla.ops.gla", "chunk_gla"),
    "kda": ("fla.ops.kda", "chunk_kda"),
    "gdn": ("fla.ops.gated_delta_rule", "chunk_gated_delta_rule"),
    "gdn2": ("fla.ops.gdn2", "chunk_gdn2"),
}
# the chunk sizes FLA's kernel takes, where it takes one (chunk_gla: none, its fixed 64)
FLA_CHUNKS = {"simple_gla": (16, 32, 64, 128), "kda": (32, 64), "gdn": (16, 32, 64), "gdn2": (64,)}
GDN2_MAX_K = 256  # chunk_gdn2 asserts K <= 256


def fla_limits(case: Case) -> str | None:
    """Why FLA's kernel cannot run `case` (FLA 0.6.0's asserts), or None."""
    if case.op == "gdn2" and case.HV is not None:
        return (
            f"chunk_gdn2 (FLA 0.6.0) has no grouped value heads: v must have H={case.H} heads, "
            f"the case has HV={case.HV}"
        )
    if case.op == "gdn2" and case.K > GDN2_MAX_K:
        return f"chunk_gdn2 (FLA 0.6.0) supports key head dims K <= {GDN2_MAX_K}, the case has K={case.K}"
    return None


def fla_chunk_size(case: Case) -> int:
    """The chunk size FLA's kernel really uses for this case (gla: its fixed 64; the case's
    where FLA's kernel takes it, else 64)."""
    return case.chunk_size if case.chunk_size in FLA_CHUNKS.get(case.op, ()) else 64


class FlaImportedTooEarly(RuntimeError):
    pass


class FlaRefused(RuntimeError):
    """FLA refused the case for a known reason (parity.model.fla_known.refusal_of): its message, then
    the cause and the fix; record_fields: where it refused, the versions, and notes.refusal."""

    def __init__(self, error: Exception, refusal: dict, platform: str, versions: dict):
        super().__init__(f"{error}\nFLA refused ({refusal['issue']}): {refusal['cause']}; fix: {refusal['fix']}")
        self.record_fields = {"platform": platform, "versions": versions, "notes": {"refusal": refusal}}


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _kernel(case: Case, cuda: bool):
    """FLA's function for the case (the op's, or its stage's), imported for the interpreter when
    there is no CUDA device."""
    import importlib

    if not cuda:
        warnings.filterwarnings("ignore", message="Triton is not supported on current platform")
        compiled_already = "fla" in sys.modules and not triton_interpreter.interpreting_fla()  # the fla package
        triton_interpreter.enable()
        if compiled_already:
            raise FlaImportedTooEarly(
                "fla was imported before TRITON_INTERPRET=1 was set, so its kernels were built for a GPU; "
                "import parity.execute.backends.fla (or call "
                "parity.execute.backends.triton_interpreter.request()) first"
            )
    module, name = fla_function(case)
    kernel = getattr(importlib.import_module(module), name)
    if not cuda and not triton_interpreter.fla_tiles_are_an_h100s():
        raise FlaImportedTooEarly(
            "fla was imported before parity.execute.backends.triton_interpreter.request(), so it sized "
            "its tiles for a GPU without shared memory, not an H100; import parity.execute.backends.fla "
            "(or call request()) first"
        )
    return kernel


def fla_function(case: Case) -> tuple[str, str]:
    """(module, function) of FLA's kernel for the case: the op's, or its stage's."""
    if case.stage is None:
        return FLA_KERNELS[case.op]
    module, _, function = stage_of(case.op, case.stage).fla.partition(":")
    return module, function


def _versions() -> dict[str, str]:
    import torch
    import triton

    return {"fla-core": metadata.version("fla-core"), "triton": triton.__version__, "torch": torch.__version__}


class FlaBackend:
    """FLA's chunked Triton kernels: the GPU side of the gate."""

    name = REFERENCE
    side = "reference"

    @staticmethod
    def kernel_call(case: Case) -> KernelCall:
        """FLA's kernel for the case and the chunk_size passed to it (chunk_gla takes none);
        Unsupported where FLA has no kernel for the case's shapes (`fla_limits`)."""
        reason = fla_limits(case)
        if reason:
            raise Unsupported(reason)
        if case.stage is not None:
            return KernelCall("torch", *fla_function(case), case.chunk_size, cu_seqlens_int64=True)
        module, function = FLA_KERNELS[case.op]
        return KernelCall(
            "torch", module, function, None if case.op == "gla" else fla_chunk_size(case), cu_seqlens_int64=True
        )

    def run(self, case: Case, inputs: dict[str, np.ndarray]) -> Execution:
        """FLA's outputs for the case: from this run's FLA lane where it has lanes (parity.execute.backends.fla_lane;
        from its interpreter lane when CUDA refused the case for a known reason of its environment and
        the run asked for that fallback), else computed here."""
        self.kernel_call(case)  # Unsupported first: nothing sent for a case FLA cannot run
        here = fla_cache.platform_without_torch()  # no CUDA here: the interpreter's record, if stored
        kept = fla_cache.reused(case, inputs, here) if here else None
        if kept is not None:
            return kept
        if not fla_lane_client.lane_addresses():
            return self.run_here(case, inputs)
        try:
            return fla_lane_client.call(fla_lane_client.pick_lane(case.id), case, inputs)
        except fla_lane_client.LaneError as e:
            refusal = e.record_fields.get("notes", {}).get("refusal") or {}
            fallback = fla_lane_client.fallback_address()
            if not (refusal.get("environment") and fallback):
                raise
            ex = fla_lane_client.call(fallback, case, inputs)
            where = e.record_fields.get("platform", "cuda")
            ex.notes["fallback"] = {
                "from": where,
                "refusal": refusal,
                "what": f"FLA on {where} refused this case ({refusal.get('issue')}): this reference is FLA's "
                "same kernels in the Triton interpreter on this machine's CPU (--fla-fallback interpreter)",
            }
            return ex

    def run_here(self, case: Case, inputs: dict[str, np.ndarray]) -> Execution:
        """FLA's outputs for the case, computed in this process (on CUDA when it has a GPU, else in
        Triton's interpreter); a known refusal of FLA's (parity.model.fla_known) raised as FlaRefused.
        FLA's stored record of the same case, inputs, versions, platform and pins is reused instead
        (parity.execute.backends.fla_cache), and what FLA computes here is stored."""
        how = self.kernel_call(case)
        here = fla_cache.platform_without_torch()
        if here is None:  # a CUDA host: torch names the device
            import torch

            cuda = _cuda()
            here = f"cuda:{torch.cuda.get_device_name()}" if cuda else fla_cache.INTERPRETER
        kept = fla_cache.reused(case, inputs, here)
        if kept is not None:
            return kept
        ran_at = fla_cache.now()
        ex = self._compute(case, inputs, how)
        fla_cache.store(case, inputs, ex, ran_at)
        return ex

    def _compute(self, case: Case, inputs: dict[str, np.ndarray], how: KernelCall) -> Execution:
        """FLA's outputs for the case, computed in this process (run_here's)."""
        import torch

        cuda = _cuda()
        call, run = fla_call(case, _kernel(case, cuda))
        fla_launches.install(interpreted=not cuda, device_name=torch.cuda.get_device_name() if cuda else None)
        platform = f"cuda:{torch.cuda.get_device_name()}" if cuda else "cpu:triton-interpreter"
        compiled_before = fla_launches.compiles()
        try:
            if cuda:
                fla_launches.count_compiles()
                run(call, case, inputs, "cuda", torch.cuda.synchronize)  # load (or compile) and autotune first
                with fla_launches.recording() as ran:
                    tensors, seconds = run(call, case, inputs, "cuda", torch.cuda.synchronize)
            else:
                with np.errstate(all="ignore"), fla_launches.recording() as ran:  # masked-off exp overflows
                    tensors, seconds = run(call, case, inputs, "cpu")
        except RuntimeError as e:
            refusal = fla_known.refusal_of(str(e))
            if refusal is None:
                raise
            raise FlaRefused(e, refusal, platform, _versions()) from e
        numerics = "cuda" if cuda else triton_interpreter.numerics()
        return Execution(
            tensors=tensors,
            platform=platform,
            implementation=".".join(fla_function(case)),
            versions=_versions() if cuda else {**_versions(), "numpy": np.__version__},
            kernel_time_s=seconds,
            numerics=numerics,
            notes=_notes(case, tensors, cuda, ran, platform, fla_launches.compiles() - compiled_before),
        )


def fla_call(case: Case, kernel) -> tuple:
    """(call, run) for FLA's function `kernel` (the case's op or stage function): run(call, case,
    inputs, device[, sync]) -> (tensors, seconds) calls it as the harness does (calling.run_torch,
    stage_calling.run_stage_torch)."""
    if case.stage is not None:
        return kernel, run_stage_torch
    return _fla_call(case, FlaBackend.kernel_call(case), kernel), run_torch


def _fla_call(case: Case, how: KernelCall, fla_fn):
    """The FLA kernel called with the keyword arguments of calling.run_torch: the case's gates
    under FLA's names (simple_gla's g or g_gamma; beta; gdn2's b and w), int64 cu_seqlens and
    the chunk size where FLA's kernel takes one."""
    extra = {} if how.chunk_size is None else {"chunk_size": how.chunk_size}

    def call(
        q,
        k,
        v,
        g=None,
        g_gamma=None,
        beta=None,
        b=None,
        w=None,
        scale=None,
        initial_state=None,
        output_final_state=False,
        cu_seqlens=None,
    ):
        gates = {"g": g} if case.op != "simple_gla" or g is not None else {"g_gamma": g_gamma}
        if beta is not None:
            gates["beta"] = beta
        if b is not None:
            gates["b"], gates["w"] = b, w
        if cu_seqlens is not None and how.cu_seqlens_int64:
            cu_seqlens = cu_seqlens.long()
        return fla_fn(
            q,
            k,
            v,
            **gates,
            scale=scale,
            initial_state=initial_state,
            output_final_state=output_final_state,
            cu_seqlens=cu_seqlens,
            **extra,
        )

    return call


def _notes(case: Case, tensors: dict, cuda: bool, ran: fla_launches.Recording, platform: str, compiled: int) -> dict:
    """The record's notes: the chunk size FLA used, what the interpreter emulates and what its
    bits depend on, the gradients FLA returns none of (unsupported_tensors, with the reason), the
    kernels it launched with their configs and the backend of each dispatched function
    (fla_launches), FLA's results known to be wrong on this GPU and Triton (known_wrong), and on a
    GPU how many kernels this call compiled instead of loading them from Triton's cache
    (fla_compiled_here: the run's pre-compile had not compiled them: parity.execute.backends.fla_compile)."""
    notes: dict = {"chunk_size": fla_chunk_size(case) if case.stage is None else case.chunk_size}
    if not cuda:
        notes["emulation"] = (
            "bf16 ops widened to fp32 and rounded back; fp32 dots in TF32, as on the GPU; "
            "cumsums combined in the order of Triton's sm_90 scan; tiles sized for an H100's shared memory"
        )
        notes["cpu_bits"] = triton_interpreter.what_the_bits_depend_on()
    notes.update(ran.notes())
    if cuda:
        notes["fla_compiled_here"] = compiled
    wrong = fla_known.known_wrong(platform, _versions(), notes["fla_launches"])
    if wrong:
        notes["known_wrong"] = wrong
    missing = {
        n: "FLA's autograd returns no gradient for it"
        for n in case.output_names()
        if n not in tensors and n in GRAD_NAMES.values()
    }
    if missing:
        notes["unsupported_tensors"] = missing
    return notes
