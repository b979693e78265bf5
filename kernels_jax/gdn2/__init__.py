"""GDN-2 (Gated DeltaNet-2): KDA's Pallas TPU kernels with beta split into a channel-wise erase
gate b on the keys and a channel-wise write gate w on the values."""

import functools

from kernels_jax.common import validation

from .chunk import chunk_gdn2

check_supported = functools.partial(validation.check_supported, op="gdn2")

__all__ = ["chunk_gdn2", "check_supported"]
