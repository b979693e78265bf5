"""Benchmark the float64 oracle (not a test): forward+backward wall time per op.

    .venv/bin/python benchmarks/bench_oracle.py [--B 1] [--T 4096] [--H 16] [--K 128] [--V 128]
        [--ops simple_gla,gla,kda] [--method chunked|recurrence]

Prints one line per op: first call (includes any compilation) and a second, warm call.
Target: simple_gla fwd+bwd at B=1, T=4096, H=16, K=V=128 in at most 1 s warm
on 2 cores, by the default chunked form (references/chunked.py; the recurrence, its
definition, takes about 6-8 s there).
"""

import argparse
import time

from cases import Case, make_inputs
from references import oracle_run


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--B", type=int, default=1)
    ap.add_argument("--T", type=int, default=4096)
    ap.add_argument("--H", type=int, default=16)
    ap.add_argument("--K", type=int, default=128)
    ap.add_argument("--V", type=int, default=128)
    ap.add_argument("--ops", default="simple_gla,gla,kda")
    ap.add_argument("--method", default="chunked", choices=("chunked", "recurrence"))
    a = ap.parse_args()
    for op in a.ops.split(","):
        case = Case(op, a.B, a.T, a.H, a.K, a.V, h0=True, ht=True)
        inputs = make_inputs(case)
        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            oracle_run(case, inputs, method=a.method)
            times.append(time.perf_counter() - t0)
        print(f"{case.id} ({a.method}): fwd+bwd first call {times[0]:.2f} s, warm {times[1]:.2f} s", flush=True)


if __name__ == "__main__":
    main()
