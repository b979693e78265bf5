"""ORACLE_VERSION changes whenever the oracle's numerics change; results computed by different
oracle versions are never compared. Its own module (no jax): records and manifests stamp it."""

ORACLE_VERSION = "2"
