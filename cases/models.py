"""Attention layers of real models, as cases: true head dims, heads and gate statistics.

Each `ModelLayer` names the layer as a person knows it, says where its numbers come from, and
gives the case fields that do not depend on the run's size. `models()` runs them at a T and
B small enough for the CPU interpreters (suite `models`); `models_at_scale()` at realistic T
and B (part of suite `full`, for GPUs and TPUs).
"""

from __future__ import annotations

import dataclasses

from cases.case import Case


@dataclasses.dataclass(frozen=True)
class ModelLayer:
    label: str  # what a person calls it
    source: str  # where the numbers come from
    case: dict  # Case fields but B, T (and seqlens)


MODEL_LAYERS: tuple[ModelLayer, ...] = (
    # FLA GLAConfig defaults (fla/models/gla/configuration_gla.py): hidden_size 2048, num_heads 4,
    # expand_k 0.5, expand_v 1 -> K = 2048 * 0.5 / 4 = 256, V = 2048 / 4 = 512; FLA's GLA layer
    # gate is logsigmoid(x) / gate_logit_normalizer with normalizer 16 (our g_logsig norm 16).
    ModelLayer(
        "GLA-1.3B layer (expand_k 0.5, expand_v 1)",
        "Yang et al. 2023, arXiv 2312.06635; FLA GLAConfig",
        dict(op="gla", H=4, K=256, V=512, dtype="bfloat16", gate="g_logsig"),
    ),
    # FLA RetNetConfig defaults (fla/models/retnet/configuration_retnet.py): hidden_size 2048,
    # num_heads 8, expand_k 1, expand_v 2 -> K = 256, V = 512; decay of head h
    # gamma_h = 1 - 2^(-5 - h) (fla/ops/retention/chunk.py), as simple_gla with g_gamma.
    ModelLayer(
        "RetNet-1.3B multi-scale retention",
        "Sun et al. 2023, arXiv 2307.08621; FLA RetNetConfig, fla/ops/retention",
        dict(op="simple_gla", H=8, K=256, V=512, dtype="bfloat16", gate="gamma_retnet"),
    ),
    # MiniMax-Text-01: 80 layers, 64 attention heads of dimension 128; lightning attention's
    # per-head decay is the ALiBi slope scaled per layer by (1 - l / (L - 1) + 1e-5).
    # Layer 0 has the steepest decay: with chunk 128, |gamma| * 128 > 88.7 (masked-exp-overflow's
    # regime: the bug classes are in docs/mutants.md).
    ModelLayer(
        "MiniMax-Text-01 lightning attention, layer 0 of 80",
        "MiniMax 2025, arXiv 2501.08313 (MiniMax-01)",
        dict(
            op="simple_gla",
            H=64,
            K=128,
            V=128,
            dtype="bfloat16",
            chunk_size=128,
            gate="gamma_alibi",
            gate_params={"layer": 0, "layers": 80},
        ),
    ),
    ModelLayer(
        "MiniMax-Text-01 lightning attention, layer 79 of 80 (prefill with state)",
        "MiniMax 2025, arXiv 2501.08313 (MiniMax-01)",
        dict(
            op="simple_gla",
            H=64,
            K=128,
            V=128,
            dtype="float32",
            gate="gamma_alibi",
            gate_params={"layer": 79, "layers": 80},
            direction="fwd",
            h0=True,
            ht=True,
        ),
    ),
    # FLA KDAConfig defaults (fla/models/kda/configuration_kda.py): hidden_size 2048, head_dim 128,
    # num_heads 16, expand_v 1 -> K = V = 128 (Kimi Linear's KDA layers use head_dim 128).
    ModelLayer(
        "Kimi Linear KDA layer (head_dim 128)",
        "Kimi Team 2025, arXiv 2510.26692; FLA KDAConfig",
        dict(op="kda", H=16, K=128, V=128, dtype="bfloat16", gate="g_logsig", ht=True),
    ),
    # FLA GatedDeltaNetConfig defaults (fla/models/gated_deltanet/configuration_gated_deltanet.py):
    # head_dim 256, num_heads 6, expand_v 2 -> K = 256, V = 512; the gated delta rule, one
    # log-decay per head (gdn).
    ModelLayer(
        "Gated DeltaNet-1.3B layer",
        "Yang et al. 2024, arXiv 2412.06464; FLA GatedDeltaNetConfig",
        dict(op="gdn", H=6, K=256, V=512, dtype="bfloat16", gate="g_logsig"),
    ),
    # Qwen3-Next's linear-attention layers (Qwen/Qwen3-Next-80B-A3B-Instruct config.json:
    # linear_num_key_heads 16, linear_num_value_heads 32, linear_key_head_dim 128,
    # linear_value_head_dim 128): the gated delta rule with grouped value heads, HV = 2 H, each
    # q, k head read by 2 value heads; q, k L2-normalised (use_qk_l2norm_in_kernel), bf16 inputs,
    # float32 state. Its gate is -exp(A_log) * softplus(a + dt_bias) per head, here g_logsig.
    ModelLayer(
        "Qwen3-Next-80B-A3B gated DeltaNet layer (16 q/k heads, 32 value heads)",
        "Qwen/Qwen3-Next-80B-A3B-Instruct config.json (Qwen team 2025)",
        dict(op="gdn", H=16, HV=32, K=128, V=128, dtype="bfloat16", gate="g_logsig", ht=True),
    ),
    # FLA's GatedDeltaNet2 layer defaults (fla/layers/gdn2.py; FLA has no GDN-2 model config): hidden_size
    # 2048, head_dim 128, num_heads 16, num_v_heads = num_heads, expand_v 1 -> K = V = 128, H = HV = 16;
    # channel-wise erase gate b [K] and write gate w [V]; its gate is KDA's -exp(A_log) * softplus(g + dt_bias)
    # per channel, here g_logsig.
    ModelLayer(
        "Gated DeltaNet-2 layer (FLA GatedDeltaNet2 defaults: 16 heads, head_dim 128)",
        "Gated DeltaNet-2: Decoupling Erase and Write in Linear Attention; FLA fla/layers/gdn2.py",
        dict(op="gdn2", H=16, K=128, V=128, dtype="bfloat16", gate="g_logsig", ht=True),
    ),
)
# a serving batch of packed prompts, one of a single token (varlen with the GLA-1.3B layer)
PACKED_GLA = ModelLayer(
    "GLA-1.3B layer, packed prompts of 1, 63 and 64 tokens",
    "Yang et al. 2023, arXiv 2312.06635; FLA GLAConfig",
    dict(op="gla", H=4, K=256, V=512, dtype="bfloat16", gate="g_logsig", direction="fwd", h0=True, ht=True),
)


def model_case(layer: ModelLayer, **size) -> Case:
    return Case(**{**layer.case, **size})


def models() -> list[Case]:
    """Every model layer at B = 1, T = 128 (CPU interpreters), and one packed batch."""
    return [model_case(m, B=1, T=128) for m in MODEL_LAYERS] + [model_case(PACKED_GLA, B=1, T=128, seqlens=(1, 63, 64))]


def models_at_scale() -> list[Case]:
    """The same layers at training size: B = 4, T = 2048 (part of suite `full`)."""
    return [model_case(m, B=4, T=2048) for m in MODEL_LAYERS]
