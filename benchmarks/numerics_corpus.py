"""The TPU numerics model against the compiled module, on Pallas TPU kernels no one here wrote.

Every Pallas TPU kernel that ships in jax (`jax.experimental.pallas.ops.tpu`: flash_attention,
splash_attention, paged_attention, ragged_paged_attention, megablox gmm, matmul) and
tpu-inference's GDN kernels (v1 fused_gdn through examples/tpu_inference_gdn's adapter, v2
recurrent_scan and v3 fused_conv1d_gdn in their own conventions; skipped, and said so, when
tpu-inference is not installed), at small realistic shapes, in bfloat16 and float32 where the
kernel takes them, compiled by the real TPU compiler (libtpu, on this CPU: nothing executes)
for each target through parity.execute.tpu_compile.compile_program, whose numerics check compares
each Pallas kernel's dots under the model (parity.measure.tpu_numerics) with the MXU matmuls
Mosaic emitted for it (parity.execute.mosaic_llo.numerics_check). One line per program, target
and Pallas kernel:

    program  dtype  target  compile  kernel  model  compiled  vector unit  agree

    python benchmarks/numerics_corpus.py [--targets v5e,v6e,tpu7x] [--only NAME,...] [--json FILE]

Exit 0 when every program compiled and every kernel agrees, 1 otherwise (the table says why).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _structs(sharding, *specs):
    import jax

    return tuple(jax.ShapeDtypeStruct(shape, dtype, sharding=sharding) for shape, dtype in specs)


# ------------------------------------------------------------------ jax's own kernels
def flash_attention(dtype, backward=False):
    """B 1, H 2, T 512, D 128, causal; with backward: the gradient of sum(o) w.r.t. q, k, v."""
    import jax
    from jax.experimental.pallas.ops.tpu import flash_attention as fa

    def fwd(q, k, v):
        return fa.flash_attention(q, k, v, causal=True, sm_scale=128**-0.5)

    program = jax.grad(lambda q, k, v: fwd(q, k, v).astype("float32").sum(), argnums=(0, 1, 2)) if backward else fwd
    return program, [((1, 2, 512, 128), dtype)] * 3


def splash_attention(dtype, backward=False):
    """H 2, T 512, D 128, causal mask (make_splash_mha); with backward: gradients of sum(o)."""
    import jax
    import numpy as np
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    mask = sm.MultiHeadMask([sm.CausalMask((512, 512)) for _ in range(2)])
    kernel = sk.make_splash_mha(mask, head_shards=1, q_seq_shards=1)

    def fwd(q, k, v):
        return kernel(q * np.asarray(128**-0.5, q.dtype), k, v)

    program = jax.grad(lambda q, k, v: fwd(q, k, v).astype("float32").sum(), argnums=(0, 1, 2)) if backward else fwd
    return program, [((2, 512, 128), dtype)] * 3


def paged_attention(dtype):
    """Decode: batch 4, 8 query heads over 2 KV heads, head dim 128, pages of 16, 64 pages each."""
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention as pa

    def program(q, k_pages, v_pages):
        lengths = jnp.full((4,), 1000, jnp.int32)
        indices = jnp.arange(4 * 64, dtype=jnp.int32).reshape(4, 64)
        return pa(q, k_pages, v_pages, lengths, indices, pages_per_compute_block=8)

    return program, [((4, 8, 128), dtype), ((2, 256, 16, 128), dtype), ((2, 256, 16, 128), dtype)]


def ragged_paged_attention(dtype):
    """Mixed prefill and decode: 3 sequences (2 decode tokens, 126 prefill), 8 query heads over
    2 KV heads, head dim 128, pages of 16; block sizes given (16 KV pages, 32 queries): its tuned
    table is looked up by jax.devices()[0].device_kind, the CPU on this machine ("TPU version
    must be 4 or higher"; parity.execute.tpu_identity does not emulate jax.devices())."""
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import ragged_paged_attention as rpa

    def program(q, kv_pages):
        kv_lens = jnp.asarray([200, 300, 126, 0], jnp.int32)
        pages = jnp.arange(4 * 32, dtype=jnp.int32).reshape(4, 32)
        cu_q = jnp.asarray([0, 1, 2, 128, 128], jnp.int32)
        num_seqs = jnp.asarray([3], jnp.int32)
        blocks = dict(num_kv_pages_per_block=16, num_queries_per_block=32)
        return rpa(q, kv_pages, kv_lens, pages, cu_q, num_seqs, sm_scale=128**-0.5, **blocks)

    return program, [((128, 8, 128), dtype), ((128, 16, 4, 128), dtype)]


def megablox_gmm(dtype):
    """Grouped matmul: 512 x 256 tokens in 4 groups, times [4, 256, 512]."""
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu.megablox import gmm

    def program(lhs, rhs):
        return gmm(lhs, rhs, jnp.asarray([128, 64, 192, 128], jnp.int32), preferred_element_type=jnp.float32)

    return program, [((512, 256), dtype), ((4, 256, 512), dtype)]


def matmul(dtype):
    """[512, 512] x [512, 512], blocks (128, 128), block_k 256."""
    from jax.experimental.pallas.ops.tpu.matmul import matmul as mm

    return functools.partial(mm, block_shape=(128, 128), block_k=256), [((512, 512), dtype)] * 2


# ------------------------------------------------------------------ tpu-inference's GDN kernels
def gdn_v1(dtype, T=256, H=2, K=128, V=128, N=2):
    """fused_gdn (v1) through the example's adapter, op kda: N sequences of T / N tokens, per-channel gate."""
    from examples.tpu_inference_gdn.gdn_adapter import fused_gdn_v1

    cu = [i * T // N for i in range(N + 1)]

    def program(q, k, v, g, beta, h0):
        return fused_gdn_v1(q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu)

    f32 = "float32"
    specs = [((1, T, H, K), dtype), ((1, T, H, K), dtype), ((1, T, H, V), dtype), ((1, T, H, K), f32)]
    return program, [*specs, ((1, T, H), dtype), ((N, H, K, V), f32)]


def gdn_v1_decode(dtype):
    """fused_gdn (v1): 8 decode requests of one token (the decode kernel) and one prefill of 56."""
    from examples.tpu_inference_gdn.gdn_adapter import fused_gdn_v1

    cu = list(range(9)) + [64]
    H, K, V = 2, 128, 128

    def program(q, k, v, g, beta, h0):
        return fused_gdn_v1(q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu)

    f32 = "float32"
    specs = [((1, 64, H, K), dtype), ((1, 64, H, K), dtype), ((1, 64, H, V), dtype), ((1, 64, H, K), f32)]
    return program, [*specs, ((1, 64, H), dtype), ((9, H, K, V), f32)]


def gdn_v2(dtype, T=256, n_kq=2, n_v=4, d=128):
    """recurrent_scan (v2) in its own convention: mixed qkv [T, 2 n_kq d + n_v d], 2 requests."""
    import jax.numpy as jnp

    from examples.tpu_inference_gdn.gdn_adapter import load

    v2 = load("kernels.gdn.v2.recurrent_scan_v2")

    def program(qkv, b, a, state, a_log, dt_bias):
        loc = jnp.asarray([0, T // 2, T], jnp.int32)
        idx = jnp.arange(2, dtype=jnp.int32)
        dist = jnp.asarray([0, 2, 2], jnp.int32)  # (decode_end, prefill_end, mixed_end): request counts
        return v2.recurrent_scan(qkv, b, a, state, a_log, dt_bias, loc, idx, dist, n_kq=n_kq, n_v=n_v, d_k=d, d_v=d)

    f32 = "float32"
    return program, [
        ((T, 2 * n_kq * d + n_v * d), dtype),
        ((T, n_v), dtype),
        ((T, n_v), dtype),
        ((2, n_v, d, d), f32),
        ((n_v,), f32),
        ((n_v,), f32),
    ]


def gdn_v3(dtype, T=256, n_kq=2, n_v=4, d=128, width=4):
    """fused_conv1d_gdn (v3) in its own convention: conv1d and GDN, 2 prefill requests."""
    import jax.numpy as jnp

    from examples.tpu_inference_gdn.gdn_adapter import load

    v3 = load("kernels.gdn.v3.wrapper")
    dim = 2 * n_kq * d + n_v * d

    def program(qkv, b, a, conv_state, state, weight, a_log, dt_bias):
        loc = jnp.asarray([0, T // 2, T], jnp.int32)
        idx = jnp.asarray([1, 2], jnp.int32)
        dist = jnp.asarray([0, 2, 2], jnp.int32)
        lens = jnp.asarray([T // 2, T // 2], jnp.int32)
        return v3.fused_conv1d_gdn(
            qkv,
            b,
            a,
            conv_state,
            state,
            weight,
            None,
            a_log,
            dt_bias,
            loc,
            idx,
            dist,
            lens,
            idx,
            n_kq=n_kq,
            n_v=n_v,
            d_k=d,
            d_v=d,
            kernel_size=width,
        )

    f32 = "float32"
    return program, [
        ((T, dim), dtype),
        ((T, n_v), dtype),
        ((T, n_v), dtype),
        ((3, width - 1, dim), dtype),
        ((3, n_v, d, d), f32),
        ((dim, 1, width), dtype),  # [dim, 1, kernel_size], as it asserts (its docstring says otherwise)
        ((n_v,), f32),
        ((n_v,), f32),
    ]


PROGRAMS = {
    "flash_attention": (flash_attention, ("bfloat16", "float32")),
    "flash_attention-bwd": (functools.partial(flash_attention, backward=True), ("bfloat16", "float32")),
    "splash_attention": (splash_attention, ("bfloat16", "float32")),
    "splash_attention-bwd": (functools.partial(splash_attention, backward=True), ("bfloat16", "float32")),
    "paged_attention": (paged_attention, ("bfloat16", "float32")),
    "ragged_paged_attention": (ragged_paged_attention, ("bfloat16", "float32")),
    "megablox_gmm": (megablox_gmm, ("bfloat16", "float32")),
    "matmul": (matmul, ("bfloat16", "float32")),
    "tpu_inference-gdn_v1": (gdn_v1, ("bfloat16", "float32")),
    "tpu_inference-gdn_v1-decode": (gdn_v1_decode, ("bfloat16", "float32")),
    "tpu_inference-gdn_v2": (gdn_v2, ("bfloat16", "float32")),
    "tpu_inference-gdn_v3": (gdn_v3, ("bfloat16", "float32")),
}


def compile_one(name: str, dtype: str, target: str) -> dict:
    """compile_program's result for one program, dtype and target (`skipped` when the program
    cannot be built here: tpu-inference not installed)."""
    from parity.execute.tpu_compile import compile_program

    build = PROGRAMS[name][0]
    try:
        program, specs = build(dtype)
    except ImportError as e:
        return {"skipped": str(e)}
    return compile_program(lambda sharding: (program, _structs(sharding, *specs)), target)


def rows(name: str, dtype: str, target: str, r: dict) -> list[dict]:
    """The table's lines of one compile: one per Pallas kernel (one for the program when it
    did not compile)."""
    head = {"program": name, "dtype": dtype, "target": target}
    if "skipped" in r:
        return [{**head, "compile": "skipped", "why": r["skipped"]}]
    if not r["ok"]:
        return [{**head, "compile": "error", "why": (r.get("vmem") or {}).get("summary") or r.get("error_line")}]
    check = r.get("numerics") or {}
    if "error" in check:
        return [{**head, "compile": "ok", "why": check["error"], "agree": False}]
    out = []
    for kernel, k in sorted(check["kernels"].items()):
        why = next((m for m in check["mismatches"] if m.startswith(f"{kernel}:")), "")
        out.append(
            {
                **head,
                "compile": "ok",
                "kernel": kernel,
                "model": k["model"],
                "compiled": k["compiled"],
                "vector_unit": k["vector_unit"],
                "agree": k["agree"],
                "why": why,
            }
        )
    return out or [{**head, "compile": "ok", "kernel": "(no Mosaic kernel)", "agree": False}]


def _classes(d) -> str:
    return ",".join(f"{c}" for c in sorted(d)) or "-"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", default="v5e,v6e,tpu7x")
    ap.add_argument("--only", default="", help=f"comma-separated of {list(PROGRAMS)}")
    ap.add_argument("--json", default="", help="write the rows to this file")
    a = ap.parse_args(argv)
    from parity.model.targets import parse_targets

    try:
        targets = parse_targets(a.targets)
    except ValueError as e:
        print(f"--targets: {e}", file=sys.stderr)
        return 2
    names = [n for n in a.only.split(",") if n] or list(PROGRAMS)
    unknown = [n for n in names if n not in PROGRAMS]
    if unknown:
        print(f"--only {unknown}: expected names from {list(PROGRAMS)}", file=sys.stderr)
        return 2
    table = []
    print("program | dtype | target | compile | kernel | model | compiled MXU | vector unit | agree | why")
    for name in names:
        for dtype in PROGRAMS[name][1]:
            for target in targets:
                for row in rows(name, dtype, target, compile_one(name, dtype, target)):
                    table.append(row)
                    print(
                        " | ".join(
                            [
                                row["program"],
                                row["dtype"],
                                row["target"],
                                row["compile"],
                                row.get("kernel", ""),
                                _classes(row.get("model", {})),
                                _classes(row.get("compiled", {})),
                                _classes(row.get("vector_unit", [])),
                                {True: "yes", False: "NO", None: ""}[row.get("agree")],
                                (row.get("why") or "")[:160],
                            ]
                        ),
                        flush=True,
                    )
    if a.json:
        Path(a.json).write_text(json.dumps(table, indent=1))
    bad = [r for r in table if r["compile"] == "error" or r.get("agree") is False]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
