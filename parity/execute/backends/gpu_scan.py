"""A Triton scan (`tl.cumsum`, `tl.cumprod`) combined in the order an NVIDIA GPU combines it.

Triton lowers `tt.scan` to a fixed tree of combines that follows the layout of its operand
(lib/Conversion/TritonGPUToLLVM/ScanOpToLLVM.cpp); numpy's cumsum combines sequentially. Along
the scan axis a blocked layout gives each thread S contiguous elements (sizePerThread), a warp L
threads (threadsPerWarp) and the CTA W warps (warpsPerCTA), counted over distinct data only: a
layout wider than the tensor repeats elements on more lanes or warps, which compute the same
values. The axis is then R = n / (S L W) repetitions of S L W elements, held in registers. Every
thread's elements at [r, w, l, 0:S] are combined:

1. in the thread, sequentially: p_e = (((x_0 + x_1) + x_2) ... + x_e);
2. across the L lanes of a warp, its total p_{S-1} by a Hillis-Steele (Kogge-Stone) scan: for
   d = 1, 2, 4, ... < L, lane l >= d adds lane (l - d)'s value of the previous round;
3. across the R W warp-local chunks [r, w] in logical order (r, then w): the chunk totals (the
   last lane's value) summed sequentially, through shared memory between warps and by shuffles
   between repetitions; chunk c's carry is (((T_0 + T_1) + ...) + T_{c-1}), none for c = 0;
4. a lane's last element is carry + its step-2 value; its elements e < S - 1 are p_e plus the
   previous lane's last element (lane 0: plus the carry; the axis's very first thread: p_e).

`reverse=True` is the same scan of the axis read backwards (Triton reverses the registers, the
lanes by a shuffle xor and the warps, scans forward and reverses back; sum and product commute).
Every combine is one operation of the input's dtype (float32: rounded to float32), as on the GPU.

Checked bit for bit against Triton's own lowering: tests/test_gpu_scan.py compiles kernels for
sm_90 on the CPU (Triton's front end and LLVM; no GPU), executes their LLVM IR one CTA thread by
thread (tests/nvptx_ir.py) and gets gpu_scan's bits for the layout in their ttgir: 1-D and 2-D
scans, forward and reverse, one to eight warps, layouts wider than the tensor, FLA's cumsum
kernels; with Triton 3.6.0, 3.8.0 and 3.9.0 (3.7 was not at hand).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

WARP_SIZE = 32


@dataclass(frozen=True)
class Blocked:
    """A Triton blocked layout (#ttg.blocked): per dimension of the tensor, its elements per
    thread, threads per warp and warps per CTA; `order` lists dimensions fastest first."""

    size_per_thread: tuple[int, ...]
    threads_per_warp: tuple[int, ...]
    warps_per_cta: tuple[int, ...]
    order: tuple[int, ...]


def blocked_layout(shape: tuple[int, ...], num_warps: int, size_per_thread: tuple[int, ...] | None = None) -> Blocked:
    """The blocked layout Triton builds for a tensor of `shape` with `size_per_thread` (default all
    1: what convert-to-ttgpuir gives every tensor; the coalesce pass gives a load or store its
    vector width along the fastest dimension) and the order fastest = last dimension first:
    BlockedEncodingAttr::get of triton's lib/Dialect/TritonGPU/IR/Dialect.cpp. Threads go to the
    fastest dimensions first, each taking at most shape / size_per_thread; the slowest dimension
    takes the lanes and warps left over (so a layout can be wider than the tensor)."""
    rank = len(shape)
    spt = tuple(size_per_thread) if size_per_thread is not None else (1,) * rank
    order = tuple(range(rank - 1, -1, -1))
    threads_per_warp, warps_per_cta = [1] * rank, [1] * rank
    lanes_left, threads_left, warps_left = WARP_SIZE, num_warps * WARP_SIZE, num_warps
    lanes_used = warps_used = 1
    for dim in order[:-1]:
        threads = min(max(threads_left, 1), max(1, shape[dim] // spt[dim]))
        threads_per_warp[dim] = min(max(threads, 1), lanes_left)
        warps_per_cta[dim] = min(max(threads // threads_per_warp[dim], 1), warps_left)
        warps_left //= warps_per_cta[dim]
        lanes_left //= threads_per_warp[dim]
        threads_left //= threads
        lanes_used *= threads_per_warp[dim]
        warps_used *= warps_per_cta[dim]
    threads_per_warp[order[-1]] = WARP_SIZE // lanes_used
    warps_per_cta[order[-1]] = num_warps // warps_used
    return Blocked(spt, tuple(threads_per_warp), tuple(warps_per_cta), order)


@dataclass(frozen=True)
class ScanAxis:
    """The scan axis of n elements as the lowering sees it: S elements per thread, L lanes and W
    warps, each counting distinct data only (n = R S L W for R repetitions)."""

    elements_per_thread: int
    lanes: int
    warps: int


def scan_axis(layout: Blocked, shape: tuple[int, ...], axis: int) -> ScanAxis:
    """The distinct S, L, W of `layout` along `axis` of a tensor of `shape` (lanes and warps past
    the tensor's extent repeat data: ScanLoweringHelper's ...WithUniqueData counts)."""
    n = shape[axis]
    spt = min(layout.size_per_thread[axis], n)
    lanes = min(layout.threads_per_warp[axis], max(n // spt, 1))
    warps = min(layout.warps_per_cta[axis], max(n // (spt * lanes), 1))
    return ScanAxis(spt, lanes, warps)


def gpu_scan(x: np.ndarray, axis: int, along: ScanAxis, combine=np.add, reverse: bool = False) -> np.ndarray:
    """The inclusive scan of x (any shape, any float dtype) along `axis` with `combine` (np.add:
    cumsum, np.multiply: cumprod), in x's dtype, each combine rounded to it, in the order of
    Triton's GPU lowering for the layout `along` (module docstring, steps 1-4)."""
    x = np.asarray(x)
    if reverse:
        return np.flip(gpu_scan(np.flip(x, axis), axis, along, combine), axis)
    S, L, W = along.elements_per_thread, along.lanes, along.warps
    n = x.shape[axis]
    if n % (S * L * W):
        raise ValueError(f"axis of {n} elements is not a whole number of S L W = {S} x {L} x {W}")
    moved = np.moveaxis(x, axis, -1)
    chunks = n // (S * L)  # warp-local chunks (R W of them) in logical order
    v = moved.reshape(*moved.shape[:-1], chunks, L, S)  # [..., chunk, lane, element]

    # 1. in each thread: sequential prefixes of its S elements
    prefix = v.copy()
    for e in range(1, S):
        prefix[..., e] = combine(prefix[..., e - 1], v[..., e])
    # 2. across each warp-local chunk's lanes: Hillis-Steele scan of the threads' totals
    lanes = prefix[..., S - 1].copy()  # [..., chunk, lane]
    d = 1
    while d < L:
        shifted = lanes.copy()
        shifted[..., d:] = combine(lanes[..., :-d], lanes[..., d:])
        lanes = shifted
        d *= 2
    # 3. sequential carries over the chunks' totals, in logical order
    last = lanes.copy()  # [..., chunk, lane]: the thread's last element after its carry
    carry = None
    carries = []
    for c in range(chunks):
        carries.append(carry)
        if carry is not None:
            last[..., c, :] = combine(carry[..., None], lanes[..., c, :])
        total = lanes[..., c, L - 1]
        carry = total if carry is None else combine(carry, total)
    # 4. the other elements: the previous lane's last element (lane 0: the carry) + prefix
    out = prefix.copy()
    out[..., S - 1] = last
    if S > 1:
        before = np.zeros_like(last)  # chunk 0, lane 0 has nothing before it (overwritten below)
        before[..., 1:] = last[..., :-1]
        for c in range(chunks):
            if carries[c] is not None:
                before[..., c, 0] = carries[c]
        head = combine(before[..., None], prefix[..., : S - 1])
        out[..., : S - 1] = head
        out[..., 0, 0, : S - 1] = prefix[..., 0, 0, : S - 1]  # the axis's first thread: nothing before it
    return np.moveaxis(out.reshape(moved.shape), -1, axis)
