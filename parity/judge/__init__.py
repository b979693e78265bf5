"""Layer 6, judgement: verdicts over records that any machine wrote.

    gate.py             merge runs, the TPU <= GPU bound per case and tensor, compile verdicts
    load.py             read runs against their manifests: what the gate sees, or GateRefusal
    summary.py          the gate's verdict as text
    diff.py             eps_new / eps_base between two runs of the same cases

Imports: model, measure, records (never execution: the gate reads records, it runs nothing).
"""
