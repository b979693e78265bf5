"""Layer 6, judgement: verdicts over records that any machine wrote.

    case.py             judge_case: one case's verdict per candidate and tensor (the TPU <= GPU
                        bound, compile verdicts), its Failures; a pure function of its records
    bound.py            bound: a candidate's tensor against the reference's, and the rule that
                        decided it (BOUND_RULES)
    words.py            a verdict's words, as gate.json holds them and every surface prints them:
                        fmt (a figure), describe_bound (why), describe_localisation (where)
    gate.py             evaluate: judge_case over merged runs, collected into gate.json
    environment.py      what the reference's environment did to its record: FLA refused there, or
                        ran a kernel known wrong there (model.fla_known); the interpreter fallback
    compiles.py         TPU compile records: what fails one, the figures of a run's compiles
    load.py             read runs against their manifests: what the gate sees, or GateRefusal
    summary.py          the gate's verdict as text
    diff.py             eps_new / eps_base between two runs of the same cases
    power.py            how often the bound catches an error of a known size

Imports: model, measure, records; execution in power.py alone (it runs the oracle and the
backends on the seeds it measures). The gate reads records and runs nothing.
"""
