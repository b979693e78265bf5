"""ORACLE_VERSION changes whenever the oracle's numerics change; results computed by different
oracle versions are never compared. Its own module (no jax): records and manifests stamp it."""

# 3: the chunked float64 form (references/chunked.py) by default
# 4: kda and gdn computed as gdn2 with b = w = beta (chunked.kda_chunked): the prediction's sums
#    group beta with k (sum_k (beta_i k_ik) k_jk E_ijk), rounding differently; gdn2 added
ORACLE_VERSION = "4"
