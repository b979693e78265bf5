"""Layer 5, execution: running cases through backends and compilers, writing their records.

    backends/           one per kind (oracle, fla, pallas, candidates, mutants) behind `make_backend`
    proc.py             child processes that die with their parent
    case.py             one case through its backends: oracle first, compare, a record per backend
    worker.py           what a worker process of `parity run` / `parity fuzz` runs, the events it sends, Reload
    pool.py             the parent's side: `WorkerPool`, workers handed cases, their events read, timeouts
    runner.py           `run_cases`: cases over workers, timeouts, signals, manifests (`parity run`);
                        `WarmWorkers`: workers kept across runs (`parity watch`)
    interrupts.py       SIGTERM raised as an interrupt, as SIGINT is (standard library only: the
                        pytest plugin installs it in every session)
    tpu_compile.py      the real TPU compiler on this machine: compile a case for TPU targets
    mosaic_llo.py       Mosaic's lowered (LLO) module read, and checked against the TPU numerics model
    stack_room.py       calls with room on CPython's frame stack: as fast at any depth of the caller

Imports: model, measure, records, mutants; the foundations (cases, references, kernels_jax).
"""
