"""What a model's tokens cost: one run's price, frozen into its spec at spawn.

Pure module: standard library only, no imports from the runtime (`values` imports it). USD per
million tokens, as providers publish them: prompt tokens the engine read, prompt tokens served
from its prefix cache (`cached_input`), and completion tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

PER = 1_000_000


@dataclass(frozen=True, slots=True, kw_only=True)
class Price:
    """USD per million input, cached input and output tokens."""

    input: float
    cached_input: float
    output: float

    def __post_init__(self) -> None:
        for name, value in self.to_json().items():
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")

    def cost(self, *, prompt: float, cached: float, completion: float) -> float:
        """USD of `prompt` tokens (of which `cached` came from the cache) and `completion`."""
        cached = min(max(cached, 0.0), prompt)
        return (
            (prompt - cached) * self.input + cached * self.cached_input + completion * self.output
        ) / PER

    def to_json(self) -> dict[str, Any]:
        return {"input": self.input, "cachedInput": self.cached_input, "output": self.output}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Price:
        return cls(
            input=float(data["input"]),
            cached_input=float(data["cachedInput"]),
            output=float(data["output"]),
        )


def usd(x: float) -> float:
    """A dollar amount as status shows it: 6 significant digits (a turn can cost a few
    millionths of a dollar, a subtree thousands)."""
    return float(f"{x:.6g}")
