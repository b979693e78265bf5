"""OptionError: a value an option cannot take, as fields (option, value, allowed values, problem),
written as a flag by each surface (parity.model.options). Standard library only."""

from __future__ import annotations

import re

_MENTION = re.compile(r"\{([a-z][a-z-]*)\}")  # {option} in an allowed text: another option, as a flag


class OptionError(ValueError):
    """A value an option cannot take. field: the option's name without a prefix; value: as
    given (None: not given); allowed: the values it takes, in words ("" where `problem` says
    it); problem: what is wrong beyond that ("" if nothing). str(): one line naming the field
    without a flag prefix."""

    def __init__(self, field: str, value, allowed: str, problem: str = ""):
        super().__init__(field, value, allowed, problem)
        self.field, self.value, self.allowed, self.problem = field, value, allowed, problem

    def message(self, prefix: str = "") -> str:
        """One line: the option as a flag with `prefix`, its value, the problem, the allowed values."""
        head = prefix + self.field + ("" if self.value is None else f" {self.value!r}")
        return f"{head}: {self._reason(prefix)}"

    def invalid(self, prefix: str = "--") -> str:
        """The line after argparse's own "argument --NAME: ": the value, the problem, the allowed values."""
        return f"{self.value!r} is invalid: {self._reason(prefix)}"

    def _reason(self, prefix: str) -> str:
        """The problem and the allowed values, each {option} these mention written as a flag with `prefix`."""
        allowed = _MENTION.sub(lambda m: prefix + m[1], self.allowed)
        return ": ".join(filter(None, [self.problem, f"expected {allowed}" if allowed else ""]))

    def __str__(self) -> str:
        return self.message()
