"""What an exchange cost: its usage, in any of the APIs' shapes, times a model's price.

Usage shapes (``tests/core/test_prices.py``):

- OpenAI chat and text completions: ``prompt_tokens`` (cached ones included),
  ``completion_tokens``, ``prompt_tokens_details.cached_tokens``;
- OpenAI Responses: ``input_tokens`` (cached included), ``output_tokens``,
  ``input_tokens_details.cached_tokens``;
- Anthropic Messages: ``input_tokens`` (cached *not* included), ``output_tokens``,
  ``cache_read_input_tokens`` and ``cache_creation_input_tokens``. Cache writes are
  charged at the input price (Reef does not guess the upstream's surcharge).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

MILLION = 1_000_000


@dataclass(frozen=True)
class Price:
    """A model's price per million tokens; cached input at the input price unless set."""

    model: str
    input_per_mtok: float
    output_per_mtok: float
    cached_input_per_mtok: float | None = None

    def cost(self, tokens: Tokens) -> float:
        """The money ``tokens`` cost at this price."""
        input_tokens, cached, output = tokens
        cached_price = self.cached_input_per_mtok
        if cached_price is None:
            cached_price = self.input_per_mtok
        return (
            (input_tokens - cached) * self.input_per_mtok
            + cached * cached_price
            + output * self.output_per_mtok
        ) / MILLION

    def as_dict(self) -> dict[str, Any]:
        """The price as a record keeps it."""
        return {
            "model": self.model,
            "input_per_mtok": self.input_per_mtok,
            "output_per_mtok": self.output_per_mtok,
            "cached_input_per_mtok": self.cached_input_per_mtok,
        }


class Tokens(NamedTuple):
    """Tokens of one exchange: ``input`` counts cached input too. (A named tuple: made
    twice per request, and a frozen dataclass costs several times as much to make.)"""

    input: int = 0
    cached_input: int = 0
    output: int = 0

    @property
    def total(self) -> int:
        """Input and output together."""
        return self.input + self.output


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def usage_tokens(usage: Any) -> Tokens | None:
    """The tokens a usage object reports, in any supported shape; None when ``usage`` is
    not one (no usage: the exchange is not counted)."""
    if not isinstance(usage, dict):
        return None
    if "prompt_tokens" in usage or "completion_tokens" in usage:
        details = usage.get("prompt_tokens_details")
        cached = _count(details.get("cached_tokens")) if isinstance(details, dict) else 0
        prompt = _count(usage.get("prompt_tokens"))
        return Tokens(prompt, min(cached, prompt), _count(usage.get("completion_tokens")))
    if "input_tokens" not in usage and "output_tokens" not in usage:
        return None
    output = _count(usage.get("output_tokens"))
    if "cache_read_input_tokens" in usage or "cache_creation_input_tokens" in usage:
        read = _count(usage.get("cache_read_input_tokens"))
        written = _count(usage.get("cache_creation_input_tokens"))
        return Tokens(_count(usage.get("input_tokens")) + read + written, read, output)
    details = usage.get("input_tokens_details")
    cached = _count(details.get("cached_tokens")) if isinstance(details, dict) else 0
    given = _count(usage.get("input_tokens"))
    return Tokens(given, min(cached, given), output)


def cost_of(usage: Any, price: Price | None) -> float | None:
    """What ``usage`` cost at ``price``; None when unpriced or no usage was reported."""
    if price is None:
        return None
    tokens = usage_tokens(usage)
    return None if tokens is None else price.cost(tokens)
