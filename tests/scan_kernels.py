"""Two small Triton scan kernels for tests/test_gpu_scan.py: interpreted there (imported after
TRITON_INTERPRET=1), compiled for sm_90 by tests/sm90_scans.py (imported without it)."""

import triton
import triton.language as tl


@triton.jit
def scan_1d(x_ptr, y_ptr, n, BT: tl.constexpr, REVERSE: tl.constexpr, PROD: tl.constexpr):
    """y[:BT] = the cumsum (PROD: cumprod) of x[:BT], reversed: suffix sums; from n on x reads 0."""
    o = tl.arange(0, BT)
    x = tl.load(x_ptr + o, mask=o < n, other=0.0)
    y = tl.cumprod(x, axis=0, reverse=REVERSE) if PROD else tl.cumsum(x, axis=0, reverse=REVERSE)
    tl.store(y_ptr + o, y, mask=o < n)


@triton.jit
def scan_2d(x_ptr, y_ptr, n, BT: tl.constexpr, BS: tl.constexpr, REVERSE: tl.constexpr):
    """y = the cumsum of the row-major [BT, BS] x along axis 0; rows from n on read as 0."""
    o_t = tl.arange(0, BT)
    offsets = o_t[:, None] * BS + tl.arange(0, BS)[None, :]
    mask = (o_t < n)[:, None]
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    tl.store(y_ptr + offsets, tl.cumsum(x, axis=0, reverse=REVERSE), mask=mask)
