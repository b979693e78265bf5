"""Layer 2, measurement: how far a tensor is from the oracle, and how far it may be.

    tol.py              `tol(case, tensor)`, the tolerance model (tolerances.json, TOL_VERSION),
                        and `tolerance_verdict`, a tensor's verdict against it
    compare.py          `compare_tensor`: rel_rms, max_abs, ULPs, NaN/Inf, worst elements, error
                        profiles, per-block figures; per-seed figures and `compute_judgement`, the
                        compute error over the seeds two records share
    localisation.py     `localise`: where a tensor's error is over the tolerance or the bound, typed
    compute_error.py    the compute error apart from the output's rounding, judged over seeds
    tpu_numerics.py     the TPU numerics model: jax dots computed as the TPU's MXU computes them

Imports: the model layer, numpy, ml_dtypes and (tpu_numerics) jax.
"""
