"""The `Case`: one fully specified parity test, immutable and JSON-serialisable.

A case fixes everything that decides the inputs and the computation: the op, the
shapes (FLA layout: q, k [B, T, H, K]; v [B, T, HV, V]; state [N, HV, K, V], with HV = H
value heads except for the delta-rule ops kda, gdn and gdn2, where HV = G * H and value head j
reads q, k head j // G: FLA's grouped value attention, "GVA"), the
dtype of q/k/v/do, the chunk size, the gating kind and its parameters, the scale,
whether an initial state is given and a final state returned, varlen sequence
lengths (packed, B == 1), the seed, and the direction (fwd or fwdbwd).

A stage case (`stage` set, cases.stages) is one of FLA's chunk stages of the op at the case's
parameters; its direction is "fwd" (the stage function itself, forward or backward stage alike).

Its id is readable and round-trips:
    simple_gla-fwdbwd-B2-T256-H4-K128-V128-bf16-C128-gamma_alibi-h0-ht
    gdn-fwdbwd-B1-T64-H2-K64-V64-fp32-C64-g_logsig-HV4      (HV shown only when it is not H)
    simple_gla:fwd_h-fwd-B1-T128-H2-K64-V64-fp32-C64-g_logsig-ht    (a stage: op:stage)
"""

from __future__ import annotations

import dataclasses
import math
import re
from numbers import Real
from typing import Any

from cases.stages import STAGES, check_stage, stage_of, stage_outputs

OPS = ("simple_gla", "gla", "kda", "gdn", "gdn2")
# the delta-rule ops -> their delta-rule gate inputs (grouped value heads, HV = G * H, allowed):
#   beta [B, T, HV] (kda, gdn: one learning rate per token and head);
#   b [B, T, HV, K] and w [B, T, HV, V] (gdn2: a channel-wise erase gate on the key axis and write
#   gate on the value axis; b = w = beta is kda)
DELTA_GATES: dict[str, tuple[str, ...]] = {"kda": ("beta",), "gdn": ("beta",), "gdn2": ("b", "w")}
DELTA_OPS = tuple(DELTA_GATES)
DIRECTIONS = ("fwd", "fwdbwd")
DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
DTYPE_FROM_SHORT = {v: k for k, v in DTYPES.items()}
CHUNK_SIZES = (16, 32, 64, 128)

# Gating kinds: name -> (ops that accept it, parameter defaults in id order).
#   g_logsig     g = logsigmoid(x) / norm, x ~ N(0, 1)      (per token and head: simple_gla, gdn;
#                                                           per channel too: gla, kda, gdn2)
#   g_stress     g = -mag * U(0.5, 1.5) per token: |g| * chunk far beyond 88.7 (fp32 exp range)
#   gamma_alibi  g_gamma = -ALiBi slope of head h, spread over layers like MiniMax/lightning
#                attention: slope * (1 - layer / (layers - 1) + 1e-5)
#   gamma_stress g_gamma = -mag * U(0.5, 1.5) per head
#   gamma_retnet g_gamma = log(1 - 2^(-5 - h)): RetNet's multi-scale retention decay of head h
#                (Sun et al. 2023; FLA's fla/ops/retention computes the same)
GATES: dict[str, tuple[tuple[str, ...], dict[str, int]]] = {
    "g_logsig": (("simple_gla", "gla", "kda", "gdn", "gdn2"), {"norm": 16}),
    "g_stress": (("simple_gla", "gla", "kda", "gdn", "gdn2"), {"mag": 2}),
    "gamma_alibi": (("simple_gla",), {"layer": 0, "layers": 1}),
    "gamma_stress": (("simple_gla",), {"mag": 1}),
    "gamma_retnet": (("simple_gla",), {}),
}


class CaseError(ValueError):
    """A case field is invalid; the message names the field and the allowed values."""


def _bad(field: str, value, allowed: str):
    raise CaseError(f"Case.{field}={value!r} is invalid: expected {allowed}")


@dataclasses.dataclass(frozen=True)
class Case:
    op: str
    B: int
    T: int
    H: int
    K: int
    V: int
    dtype: str = "float32"
    chunk_size: int = 64
    gate: str = "g_logsig"
    gate_params: tuple[tuple[str, int], ...] = ()
    scale: float | None = None
    h0: bool = False
    ht: bool = False
    seqlens: tuple[int, ...] | None = None
    seed: int = 0
    direction: str = "fwdbwd"
    HV: int | None = None  # value heads (see `value_heads`); None, or H, means H: stored as None
    stage: str | None = None  # one of FLA's chunk stages of the op (cases.stages), or the whole op

    def __post_init__(self):
        self._check_types()
        # normalise containers so that equal cases compare and hash equal
        # (parameters equal to their default are dropped: one case, one id)
        params = dict(self.gate_params)
        defaults = GATES.get(self.gate, (None, {}))[1]
        object.__setattr__(
            self, "gate_params", tuple(sorted((str(k), v) for k, v in params.items() if defaults.get(k, object()) != v))
        )
        if self.seqlens is not None:
            object.__setattr__(self, "seqlens", tuple(self.seqlens))
        if self.scale is not None:
            object.__setattr__(self, "scale", float(self.scale))
        if self.HV == self.H:
            object.__setattr__(self, "HV", None)  # so that replace(H=...) keeps HV = H
        self.validate()

    # ---------------------------------------------------------------- validation
    def _check_types(self) -> None:
        """Types before normalisation: bools are bools, numbers finite numbers, strings strings
        (JSON's "false" or "0.5" is refused, never coerced)."""
        for f in ("op", "dtype", "gate", "direction"):
            if not isinstance(getattr(self, f), str):
                _bad(f, getattr(self, f), "a string")
        if self.stage is not None and not isinstance(self.stage, str):
            _bad("stage", self.stage, "null (the whole op) or a stage name")
        for f in ("B", "T", "H", "K", "V", "chunk_size", "seed"):
            val = getattr(self, f)
            if not isinstance(val, int) or isinstance(val, bool):
                _bad(f, val, "an int")
        if self.HV is not None and (not isinstance(self.HV, int) or isinstance(self.HV, bool)):
            _bad("HV", self.HV, "None (H) or an int")
        for f in ("h0", "ht"):
            if not isinstance(getattr(self, f), bool):
                _bad(f, getattr(self, f), "true or false (a bool)")
        if self.scale is not None and (
            not isinstance(self.scale, Real) or isinstance(self.scale, bool) or not math.isfinite(self.scale)
        ):
            _bad("scale", self.scale, "None (K**-0.5) or a finite positive number")
        gp = self.gate_params
        pairs = gp.items() if isinstance(gp, dict) else gp if isinstance(gp, (tuple, list)) else None
        if pairs is None or not all(
            isinstance(p, (tuple, list)) and len(p) == 2 and isinstance(p[0], str) for p in pairs
        ):
            _bad("gate_params", gp, "a mapping of parameter name to int")
        if self.seqlens is not None and not isinstance(self.seqlens, (tuple, list)):
            _bad("seqlens", self.seqlens, "null or a list of positive ints")

    def validate(self) -> None:
        if self.op not in OPS:
            _bad("op", self.op, f"one of {list(OPS)}")
        for f in ("B", "T", "H", "K", "V"):
            val = getattr(self, f)
            if not isinstance(val, int) or isinstance(val, bool) or val < 1:
                _bad(f, val, "a positive int")
        if self.HV is not None:
            if self.op not in DELTA_OPS:
                _bad("HV", self.HV, f"None or H={self.H} for op {self.op!r} (grouped value heads: {list(DELTA_OPS)})")
            if self.HV < 1 or self.HV % self.H:
                _bad("HV", self.HV, f"None or a positive multiple of H={self.H} (HV = G * H value heads)")
        if self.dtype not in DTYPES:
            _bad("dtype", self.dtype, f"one of {list(DTYPES)}")
        if self.chunk_size not in CHUNK_SIZES:
            _bad("chunk_size", self.chunk_size, f"one of {list(CHUNK_SIZES)}")
        if self.gate not in GATES:
            _bad("gate", self.gate, f"one of {list(GATES)}")
        ops, defaults = GATES[self.gate]
        if self.op not in ops:
            _bad(
                "gate",
                self.gate,
                f"a gate for op {self.op!r}: one of {[g for g, (o, _) in GATES.items() if self.op in o]}",
            )
        for k, v in self.gate_params:
            if k not in defaults:
                _bad("gate_params", k, f"parameters of {self.gate!r}: {list(defaults)}")
            if not isinstance(v, int) or isinstance(v, bool):
                _bad("gate_params", {k: v}, "int values")
        p = self.gate_kwargs
        if self.gate == "gamma_alibi" and not (p["layers"] >= 1 and 0 <= p["layer"] < p["layers"]):
            _bad("gate_params", p, "0 <= layer < layers")
        if self.gate == "g_logsig" and p["norm"] < 1:
            _bad("gate_params", p, "norm >= 1")
        if self.gate.endswith("stress") and p["mag"] <= 0:
            _bad("gate_params", p, "mag > 0")
        if self.scale is not None and not self.scale > 0:
            _bad("scale", self.scale, "None (K**-0.5) or a positive float")
        if self.seqlens is not None:
            if self.B != 1:
                _bad("B", self.B, "1 when seqlens (varlen) is given")
            if not self.seqlens or any(not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in self.seqlens):
                _bad("seqlens", self.seqlens, "a non-empty tuple of positive ints")
            if sum(self.seqlens) != self.T:
                _bad("seqlens", self.seqlens, f"lengths summing to T={self.T}")
        if self.direction not in DIRECTIONS:
            _bad("direction", self.direction, f"one of {list(DIRECTIONS)}")
        if not isinstance(self.seed, int) or self.seed < 0:
            _bad("seed", self.seed, "a non-negative int")
        if self.stage is not None:
            self._validate_stage()

    def _validate_stage(self) -> None:
        stages = STAGES.get(self.op, {})
        if self.stage not in stages:
            allowed = f"one of {list(stages)}" if stages else f"null: op {self.op!r} has no stage cases yet"
            _bad("stage", self.stage, allowed)
        if self.direction != "fwd":
            _bad("direction", self.direction, "'fwd' for a stage case (the stage function itself)")
        if stages[self.stage].g_only and self.uses_g_gamma:
            _bad("gate", self.gate, f"a g gate for stage {self.stage!r} (g_gamma has no cumsum)")
        try:
            check_stage(self)
        except ValueError as e:
            raise CaseError(f"case {self.id}: {e}") from None

    # ---------------------------------------------------------------- derived
    @property
    def gate_kwargs(self) -> dict[str, int]:
        """Gate parameters with defaults filled in."""
        return {**GATES[self.gate][1], **dict(self.gate_params)}

    @property
    def kind(self) -> str:
        """What the case runs: the op ("simple_gla") or the op's stage ("simple_gla:fwd_h")."""
        return self.op if self.stage is None else f"{self.op}:{self.stage}"

    @property
    def op_case(self) -> Case:
        """The whole-op case a stage case belongs to (its inputs are drawn from it: direction fwdbwd
        for a backward stage, whose inputs include do); the case itself when it is one."""
        if self.stage is None:
            return self
        return self.replace(
            stage=None, direction="fwdbwd" if stage_of(self.op, self.stage).direction == "bwd" else "fwd"
        )

    @property
    def uses_g_gamma(self) -> bool:
        return self.gate.startswith("gamma_")

    @property
    def value_heads(self) -> int:
        """HV: the heads of v, o, g, beta (b, w) and the state (H unless the case groups value heads)."""
        return self.H if self.HV is None else self.HV

    @property
    def G(self) -> int:
        """Value heads per q, k head (HV = G * H): value head j reads q, k head j // G."""
        return self.value_heads // self.H

    @property
    def delta_gates(self) -> tuple[str, ...]:
        """The delta-rule gate inputs of the op (DELTA_GATES): ("beta",) for kda and gdn,
        ("b", "w") for gdn2, () for the others; each has a gradient "d" + name."""
        return DELTA_GATES.get(self.op, ())

    @property
    def has_beta(self) -> bool:
        """beta [B, T, HV] is an input (kda, gdn; gdn2's gates are b and w: `delta_gates`)."""
        return "beta" in self.delta_gates

    @property
    def N(self) -> int:
        """Number of sequences (rows of the state)."""
        return len(self.seqlens) if self.seqlens is not None else self.B

    @property
    def cu_seqlens(self) -> tuple[int, ...] | None:
        if self.seqlens is None:
            return None
        out = [0]
        for n in self.seqlens:
            out.append(out[-1] + n)
        return tuple(out)

    @property
    def scale_value(self) -> float:
        return self.scale if self.scale is not None else self.K**-0.5

    @property
    def backward(self) -> bool:
        return self.direction == "fwdbwd"

    @property
    def gate_name(self) -> str:
        """Name of the gate input: 'g' or 'g_gamma'."""
        return "g_gamma" if self.uses_g_gamma else "g"

    def output_names(self) -> list[str]:
        """Names of the tensors every backend returns for this case, in report order."""
        if self.stage is not None:
            return stage_outputs(self)
        names = ["o"] + (["ht"] if self.ht else [])
        if self.backward:
            names += ["dq", "dk", "dv", "d" + self.gate_name]
            names += ["d" + n for n in self.delta_gates]
            if self.h0:
                names.append("dh0")
        return names

    # ---------------------------------------------------------------- id / json
    @property
    def id(self) -> str:
        parts = [
            self.kind,
            self.direction,
            f"B{self.B}",
            f"T{self.T}",
            f"H{self.H}",
            f"K{self.K}",
            f"V{self.V}",
            DTYPES[self.dtype],
            f"C{self.chunk_size}",
        ]
        gate = self.gate + "".join(f".{k}{v}" for k, v in self.gate_params)
        parts.append(gate)
        if self.HV is not None:
            parts.append(f"HV{self.HV}")
        if self.scale is not None:
            parts.append(f"s{self.scale!r}")
        if self.h0:
            parts.append("h0")
        if self.ht:
            parts.append("ht")
        if self.seqlens is not None:
            parts.append("lens" + "_".join(map(str, self.seqlens)))
        if self.seed:
            parts.append(f"seed{self.seed}")
        return "-".join(parts)

    def __str__(self) -> str:
        return self.id

    @classmethod
    def from_id(cls, case_id: str) -> Case:
        toks = case_id.strip().split("-")
        if len(toks) < 10:
            raise CaseError(
                f"case id {case_id!r} is malformed: expected "
                "op[:stage]-direction-B#-T#-H#-K#-V#-dtype-C#-gate[-HV#][-s#][-h0][-ht][-lens#_#][-seed#]"
            )
        op, direction = toks[0], toks[1]
        op, _, stage = op.partition(":")
        dims = {}
        for tok, name in zip(toks[2:7], "BTHKV"):
            m = re.fullmatch(name + r"(\d+)", tok)
            if not m:
                raise CaseError(f"case id {case_id!r}: field {name} token {tok!r} should look like {name}64")
            dims[name] = int(m.group(1))
        if toks[7] not in DTYPE_FROM_SHORT:
            raise CaseError(f"case id {case_id!r}: dtype token {toks[7]!r} not in {list(DTYPE_FROM_SHORT)}")
        m = re.fullmatch(r"C(\d+)", toks[8])
        if not m:
            raise CaseError(f"case id {case_id!r}: chunk token {toks[8]!r} should look like C64")
        gate, *gparts = toks[9].split(".")
        gate_params = {}
        for gp in gparts:
            gm = re.fullmatch(r"([a-z]+)(-?\d+)", gp)
            if not gm:
                raise CaseError(f"case id {case_id!r}: gate parameter {gp!r} should look like name123")
            gate_params[gm.group(1)] = int(gm.group(2))
        kw: dict[str, Any] = {}
        for tok in toks[10:]:
            if tok == "h0":
                kw["h0"] = True
            elif tok == "ht":
                kw["ht"] = True
            elif re.fullmatch(r"lens\d+(_\d+)*", tok):
                kw["seqlens"] = tuple(int(x) for x in tok[4:].split("_"))
            elif re.fullmatch(r"HV\d+", tok):
                kw["HV"] = int(tok[2:])
            elif re.fullmatch(r"seed\d+", tok):
                kw["seed"] = int(tok[4:])
            elif re.fullmatch(r"s(\d+\.?\d*|\.\d+)(e[+-]?\d+)?", tok):
                kw["scale"] = float(tok[1:])
            else:
                raise CaseError(f"case id {case_id!r}: unknown token {tok!r}")
        return cls(
            op=op,
            stage=stage or None,
            direction=direction,
            dtype=DTYPE_FROM_SHORT[toks[7]],
            chunk_size=int(m.group(1)),
            gate=gate,
            gate_params=gate_params,
            **dims,
            **kw,
        )

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["gate_params"] = dict(self.gate_params)
        d["seqlens"] = list(self.seqlens) if self.seqlens is not None else None
        if self.HV is None:
            del d["HV"]  # no grouped value heads: the dict (and id) carry no HV key
        if self.stage is None:
            del d["stage"]  # the whole op: the dict carries no stage key
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Case:
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - fields - {"id"}
        if unknown:
            raise CaseError(f"case dict has unknown field(s) {sorted(unknown)}: allowed {sorted(fields)}")
        missing = {"op", "B", "T", "H", "K", "V"} - set(d)
        if missing:
            raise CaseError(f"case dict lacks required field(s) {sorted(missing)}")
        kw = {k: v for k, v in d.items() if k in fields}
        case = cls(**kw)
        if "id" in d and d["id"] != case.id:
            raise CaseError(f"case dict id {d['id']!r} does not match its fields (which give {case.id!r})")
        return case

    def replace(self, **changes) -> Case:
        return dataclasses.replace(self, **changes)
