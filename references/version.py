"""ORACLE_VERSION changes whenever the oracle's numerics change; results computed by different
oracle versions are never compared. Its own module (no jax): records and manifests stamp it."""

ORACLE_VERSION = "3"  # 3: the chunked float64 form (references/chunked.py) by default
