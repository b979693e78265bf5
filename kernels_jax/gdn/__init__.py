"""GDN, the gated delta rule (Gated DeltaNet; Qwen3-Next's linear attention): KDA's Pallas TPU
kernels with the per-head log-decay broadcast over K."""

import functools

from kernels_jax.common import validation

from .chunk import chunk_gdn

check_supported = functools.partial(validation.check_supported, op="gdn")

__all__ = ["chunk_gdn", "check_supported"]
