"""Layer 2, measurement: how far a tensor is from the oracle, and how far it may be.

    tol.py              `tol(case, tensor)`, the tolerance model (tolerances.json, TOL_VERSION)
    compare.py          `compare_tensor`: rel_rms, max_abs, ULPs, NaN/Inf, worst elements, error
                        profiles; `bound`: eps_candidate <= factor * eps_reference + floor
    tpu_numerics.py     the TPU numerics model: jax dots computed as the TPU's MXU computes them

Imports: the model layer, numpy, ml_dtypes and (tpu_numerics) jax.
"""
