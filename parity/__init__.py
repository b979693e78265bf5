"""Cross-framework parity harness for linear-attention kernels."""
SCHEMA_VERSION = 1
