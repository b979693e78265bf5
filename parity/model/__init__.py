"""Layer 1, the model: what the harness speaks of, with no behaviour of its own.

    spec.py             backend specs (oracle, fla, pallas, mutant:NAME, NAME=FRAMEWORK:MODULE:FUNCTION),
                        sides, statuses, Unsupported, KernelCall (standard library only: the
                        pytest plugin reads names from it in every session)
    verdict.py          Verdict, the one vocabulary of verdicts (a str enum, worst first),
                        UNJUDGED, worst_verdict (standard library only)
    kernels.py          which kernels_jax function each built-in candidate calls for an op
    targets.py          the TPU targets (v4, v5e, v5p, v6e, tpu7x) and their topologies
    options.py          the option values the command line and the pytest plugin share, parsed and
                        checked once (OptionError, option_error.py: field, value, allowed values;
                        standard library only at import, like spec.py)
    host.py             what this host has: a TPU attached, libtpu installed, CUDA GPUs
    fla_known.py        FLA's known refusals and known GPU bugs as data (fla#640, fla#984), and the
                        pure functions that read a record's error, platform, versions and kernel
                        launches against them (standard library only)
    gpu.py              the GPU FLA stands for on a host without one (an H100): what its probes
                        answer, in the interpreter and compiled for sm_90 (standard library only)

Imports: the standard library, `cases` (kernels.py) and, when a kernel is asked for, `kernels_jax`;
nothing else of `parity`.
"""
