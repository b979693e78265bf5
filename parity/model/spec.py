"""One typed backend spec, parsed once from the text a user gives (`--backends`, `--candidate`).

    oracle                      the float64 oracle (references/)                  side oracle
    fla                         FLA's Triton kernels, the reference ("GPU" side)  side reference
    pallas, pallas-fused        kernels_jax's Pallas TPU kernels                  side candidate
    mutant:NAME                 a kernels_jax kernel with a known bug (parity.mutants)
    noise:REL                   the exact result + Gaussian noise of relative rms REL before the
                                output's rounding, on its low-precision tensors (a test subject)
    NAME=FRAMEWORK:MODULE:FUNCTION
                                a user's candidate; FRAMEWORK jax (any jax code), pallas (a Pallas
                                TPU kernel: its TPU module must hold a Mosaic kernel) or torch.
                                FUNCTION an op's function (FLA's chunk_simple_gla convention) runs
                                op cases; one of FLA's stage functions (chunk_fwd_h, ...) runs the
                                stage cases of that stage; `*` runs every stage case whose FLA
                                function MODULE has (a stage module, cases.stages)

`parse_backend_spec(text)` is the one parser (SpecError, an OptionError of parity.model.option_error:
the option, the spec and the allowed forms); everything after it (runner, records, repro, manifests, the page) reads the
BackendSpec's fields. How each backend calls its kernel for a case (module, function, the
chunk size passed or not) is its backend's `kernel_call(case)` (KernelCall), used both by
the backend when it runs and by `parity repro`.
"""

from __future__ import annotations

import dataclasses
import re

from parity.model.option_error import OptionError

REFERENCE = "fla"  # the reference backend's name: the GPU side of the gate
BUILTIN = ("oracle", REFERENCE, "pallas", "pallas-fused")
FRAMEWORKS = ("jax", "pallas", "torch")
MUTANT_PREFIX = "mutant:"
NOISE_PREFIX = "noise:"
SIDES = ("oracle", "reference", "candidate")
STATUSES = ("ok", "error", "timeout", "unsupported")  # of a backend's result for a case
KINDS = ("oracle", "fla", "kernels_jax", "candidate-jax", "candidate-pallas", "candidate-torch", "mutant", "noise")
# a backend's name is a folder of the output directory: a safe charset, no path components
# ('.', '..', '/', a leading '-' or '.'), at most 64 characters
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}")
CANDIDATE_RE = re.compile(r"^(?P<name>[^=]*)=(?P<fw>[a-z]+):(?P<module>[A-Za-z0-9_.]+):(?P<func>[A-Za-z0-9_]+|\*)$")
STAGE_MODULE = "*"  # a candidate's FUNCTION that names a stage module: every stage function it has
FORMS = (
    f"one of {list(BUILTIN)}, mutant:NAME, noise:REL, or a candidate NAME=FRAMEWORK:MODULE:FUNCTION "
    f"(FRAMEWORK one of {list(FRAMEWORKS)}, e.g. mine=jax:my_pkg.kernels:chunk_gla)"
)
CANDIDATE_FORM = (
    "NAME=FRAMEWORK:MODULE:FUNCTION, e.g. mine=jax:my_pkg.kernels:chunk_gla "
    "(FUNCTION * for a module of stage functions: mine=jax:my_pkg.stages:*)"
)
RUNS_ON_JAX = "tpu, or TPU interpret mode on a CPU (matmuls under the TPU numerics model)"


class SpecError(OptionError):
    """A backend or candidate spec that cannot be used: field "backends" or "candidate", the spec,
    the allowed forms and what is wrong (OptionError's fields)."""


@dataclasses.dataclass(frozen=True)
class BackendSpec:
    """A parsed backend spec. name: the record's "backend" and its folder; side: one of SIDES;
    kind: one of KINDS; implementation: MODULE:FUNCTION for a candidate, the kernel set or
    mutant name otherwise; runs_on: where it runs, in words; text: the spec as given."""

    text: str
    name: str
    side: str
    kind: str
    implementation: str
    runs_on: str

    @property
    def framework(self) -> str | None:
        """jax, pallas or torch for a user's candidate; None otherwise."""
        return self.kind.split("-", 1)[1] if self.kind.startswith("candidate-") else None

    @property
    def is_candidate_spec(self) -> bool:
        """Given as NAME=FRAMEWORK:MODULE:FUNCTION (`--candidate`), not as a backend name."""
        return self.framework is not None

    def module_function(self) -> tuple[str, str]:
        """(module, function) of a user's candidate (function `*`: a stage module)."""
        module, _, function = self.implementation.partition(":")
        return module, function

    @property
    def is_stage_module(self) -> bool:
        """A candidate MODULE:* whose functions are stages under FLA's names."""
        return self.is_candidate_spec and self.module_function()[1] == STAGE_MODULE

    def cli_args(self) -> list[str]:
        """The `parity run` arguments that run this backend beside the oracle and, unless it is
        the oracle, the reference: the pair the gate judges."""
        beside = ["oracle"] if self.side == "oracle" else ["oracle", REFERENCE]
        if self.is_candidate_spec:
            return ["--backends", ",".join(beside), "--candidate", self.text]
        return ["--backends", ",".join(dict.fromkeys([*beside, self.text]))]


@dataclasses.dataclass(frozen=True)
class KernelCall:
    """How a backend calls its kernel for one case, in FLA's calling convention (parity.execute.backends.
    calling): framework 'jax' or 'torch', the function's module and name, chunk_size, the
    value passed as `chunk_size=` (None: not passed; the kernel uses its own), and whether
    cu_seqlens is passed as int64 (FLA's kernels want torch.long) rather than int32."""

    framework: str
    module: str
    function: str
    chunk_size: int | None
    cu_seqlens_int64: bool = False


def parse_backend_spec(text: str) -> BackendSpec:
    """The one parser of backend specs; SpecError naming the spec and the allowed forms. A
    candidate's module is not imported here (check_specs does that)."""
    if not isinstance(text, str) or not text:
        raise SpecError("backends", text, FORMS)
    if text == "oracle":
        return BackendSpec(
            text,
            "oracle",
            "oracle",
            "oracle",
            "references (float64, chunked; the recurrence defines it)",
            "cpu (float64)",
        )
    if text == REFERENCE:
        return BackendSpec(
            text,
            REFERENCE,
            "reference",
            "fla",
            "fla.ops chunk kernels (Triton)",
            "cuda, or the Triton interpreter on a CPU",
        )
    if text in ("pallas", "pallas-fused"):
        return BackendSpec(
            text,
            text,
            "candidate",
            "kernels_jax",
            "kernels_jax " + ("fused" if text == "pallas-fused" else "chunk") + " kernels",
            RUNS_ON_JAX,
        )
    if text.startswith(MUTANT_PREFIX):
        # the name's form only: whether the catalogue has it is parity.execute.backends.parse_specs's check
        mutant = text[len(MUTANT_PREFIX) :]
        if not NAME_RE.fullmatch(f"mutant-{mutant}"):
            raise SpecError("backends", text, "mutant:NAME, NAME a mutant of parity.mutants", "unknown mutant")
        return BackendSpec(text, f"mutant-{mutant}", "candidate", "mutant", mutant, RUNS_ON_JAX)
    if text.startswith(NOISE_PREFIX):
        rel = text[len(NOISE_PREFIX) :]
        try:
            ok = 0 <= float(rel) < 1 and NAME_RE.fullmatch(f"noise-{rel}")
        except ValueError:
            ok = False
        if not ok:
            raise SpecError("backends", text, "noise:REL, REL a relative rms in [0, 1), e.g. noise:2e-3")
        return BackendSpec(text, f"noise-{rel}", "candidate", "noise", rel, "cpu: the float64 oracle + noise")
    if "=" not in text:
        raise SpecError("backends", text, FORMS, f"unknown backend {text!r}")
    m = CANDIDATE_RE.match(text)
    if not m:
        raise SpecError("candidate", text, CANDIDATE_FORM)
    if not NAME_RE.fullmatch(m["name"]):
        raise SpecError(
            "candidate",
            text,
            "a NAME of 1 to 64 of A-Z a-z 0-9 _ . + -, starting with a letter or digit",
            f"NAME {m['name']!r} is not allowed",
        )
    if m["fw"] not in FRAMEWORKS:
        problem = f"FRAMEWORK {m['fw']!r} is not one of {list(FRAMEWORKS)}"
        raise SpecError("candidate", text, f"a FRAMEWORK of {list(FRAMEWORKS)}", problem)
    if m["name"] in BUILTIN or m["name"].startswith(("mutant-", "noise-")):
        raise SpecError(
            "candidate",
            text,
            "a NAME of its own",
            f"NAME {m['name']!r} is taken by a built-in backend {list(BUILTIN)} or a mutant (mutant-*)",
        )
    runs_on = "cuda, or torch on a CPU" if m["fw"] == "torch" else RUNS_ON_JAX
    return BackendSpec(text, m["name"], "candidate", f"candidate-{m['fw']}", f"{m['module']}:{m['func']}", runs_on)


def as_spec(spec: BackendSpec | str) -> BackendSpec:
    """A BackendSpec as given, or parsed from its text."""
    return spec if isinstance(spec, BackendSpec) else parse_backend_spec(spec)


class Unsupported(Exception):
    """Raised by a backend for a case it has no kernel for; the message says why."""
