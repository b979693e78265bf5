"""A user's kernels, in FLA's calling convention (what the parity harness calls)."""
