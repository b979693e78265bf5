"""FLA compiled for an H100 on a host without one: Triton's driver and FLA's probes answer as an H100.

Triton compiles for a GPU target on any machine (its wheel carries ptxas); what a compile without a
GPU lacks is the driver Triton asks for the current device, stream and target, and FLA's probes of
the GPU at import. `view_as_an_h100()`, before FLA is imported, in a process that runs no kernel:

- Triton's active driver is `TargetDriver`: target GPUTarget("cuda", 90, 32), device 0, stream 0,
  an H100's properties (shared memory, SMs); it launches nothing and times nothing (asked for a
  benchmarker it raises);
- FLA's probes answer as an H100 (parity.model.gpu.compile_as_an_h100): its Hopper config lists,
  specialisations and guards are the ones an H100 or H200 gets.

The run's compile plan on such a host then finds the kernels an H100 compiles and Triton compiles
them for sm_90 (parity.execute.backends.fla_compile: how CI checks the GPU side's compile, and how
benchmarks/gpu_cost.py measures it). On a host with a CUDA GPU none of this is used: Triton and
FLA ask the GPU.
"""

from __future__ import annotations

from parity.model import gpu

H100_PROPERTIES = {  # what Triton's CUDA driver reports for an H100 SXM (utils.get_device_properties)
    "max_shared_mem": gpu.SHARED_MEMORY,
    "multiprocessor_count": 132,
    "max_num_regs": 65536,
    "warpSize": 32,
    "sm_clock_rate": 1980000,
    "mem_clock_rate": 2619000,
    "mem_bus_width": 5120,
}
H100_TARGET = ("cuda", 90, 32)  # GPUTarget(backend, arch, warp size)
DEVICE_NAME = gpu.H100_NAME


class NoGpu(RuntimeError):
    """Something asked the stand-in driver to run or time a kernel."""


class _Utils:
    @staticmethod
    def get_device_properties(device: int) -> dict:
        return dict(H100_PROPERTIES)


class TargetDriver:
    """Triton's driver, as far as compiling asks it, for an H100 this host does not have."""

    utils = _Utils()

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget(*H100_TARGET)

    def get_current_device(self) -> int:
        return 0

    def set_current_device(self, device: int) -> None:
        pass

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_active_torch_device(self):
        import torch

        return torch.device("cpu")

    def get_device_interface(self):
        import torch

        return torch.cuda

    def map_python_to_cpp_type(self, ty: str) -> str:
        raise NoGpu("no kernel is launched on this host: it compiles for an H100 it does not have")

    def get_benchmarker(self):
        raise NoGpu("no config is timed on this host: it compiles for an H100 it does not have")

    def get_empty_cache_for_benchmark(self):
        raise NoGpu("no config is timed on this host: it compiles for an H100 it does not have")

    def clear_cache(self, cache) -> None:
        pass


def view_as_an_h100() -> None:
    """Triton's driver and FLA's probes answer as an H100 (before fla is imported; no interpreter)."""
    import os

    from triton.runtime import driver

    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("TRITON_INTERPRET=1: Triton would interpret FLA's kernels, not compile them")
    driver.set_active(TargetDriver())
    gpu.compile_as_an_h100()
