"""Result records: one JSON file per case and backend, written atomically.

    DIR/<backend>/<case_id>.json   kind "result": case, input hash, versions, platform,
                                   numerics, status, verdict, per-tensor metrics (parity.measure.compare)
    DIR/<backend>/<case_id>.compile.json
                                   kind "compile": the candidate compiled for TPU targets
                                   (parity.execute.tpu_compile), per target ok or Mosaic's error
    DIR/summary.json               kind "run": what ran, where, how long, one line per result
    DIR/gate.json                  kind "gate": the merged TPU <= GPU verdicts (parity.judge.gate)
    DIR/manifest-<run_id>.json     kind "manifest": what a run was meant to write (parity.records.manifest)
Every record carries SCHEMA_VERSION; readers refuse other versions. A reader refuses
(RecordError) a file it cannot parse and a result record whose fields do not have the
types in schema.py, rather than skipping it: what the gate did not see is never a pass.
Non-finite floats are written as null and their paths listed in "encoded_nonfinite"; a
record that cannot be serialised at all is written as an error record saying why.

    schema.py     SCHEMA_VERSION, the record types, compile_verdict, RecordError
    checks.py     check_result, check_compile: a record's fields checked before it is trusted
    store.py      writing and reading records, their paths and repro commands, the newest one
    manifest.py   run manifests
Everything but the manifests is importable from here.
"""

from parity.records.checks import check_compile, check_result, field_error
from parity.records.schema import (
    SCHEMA_VERSION,
    ByCase,
    CompileRecord,
    RecordError,
    ResultRecord,
    TensorMetrics,
    compile_verdict,
    tpu_kernel_problem,
)
from parity.records.store import (
    base_record,
    check_dirs,
    compile_repro_command,
    encode_nonfinite,
    iter_results,
    load_latest,
    newest,
    read_checked,
    read_json,
    repro_command,
    result_path,
    write_json,
    write_record,
)

__all__ = [
    "SCHEMA_VERSION",
    "ByCase",
    "CompileRecord",
    "RecordError",
    "ResultRecord",
    "TensorMetrics",
    "base_record",
    "check_compile",
    "check_dirs",
    "check_result",
    "compile_repro_command",
    "compile_verdict",
    "encode_nonfinite",
    "field_error",
    "iter_results",
    "load_latest",
    "newest",
    "read_checked",
    "read_json",
    "repro_command",
    "result_path",
    "tpu_kernel_problem",
    "write_json",
    "write_record",
]
