"""Token usage as an endpoint reports it, and what it cost.

The split follows opencode's session usage columns: `input` is the
prompt tokens that were neither read from nor written to the prompt cache,
`output` the completion tokens that were not reasoning, so the five parts
add up to the reported total. Endpoints name the cache counts differently
(OpenAI's `prompt_tokens_details.cached_tokens`, Anthropic-style proxies'
`cache_read_input_tokens` / `cache_creation_input_tokens`); all are read.
Cost comes from `REM_MODEL_PRICES` (dollars per million tokens, by model:
the exact name, else the longest name it starts with, else `*`); a model
with no price costs 0 and is reported as unpriced, never guessed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from backend.core.settings import settings

FIELDS = ("input", "output", "reasoning", "cache_read", "cache_write")
# a part with no price of its own is billed like this one
FALLBACK = {"reasoning": "output", "cache_read": "input", "cache_write": "input"}


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _detail(usage: Mapping[str, Any], group: str, *names: str) -> int:
    details = usage.get(group)
    if not isinstance(details, Mapping):
        return 0
    return max((_int(details.get(n)) for n in names), default=0)


@dataclass(frozen=True)
class Usage:
    """One reply's tokens, split as the session's usage columns are."""

    input: int = 0
    output: int = 0
    reasoning: int = 0
    cache_read: int = 0
    cache_write: int = 0

    @classmethod
    def from_openai(cls, usage: Mapping[str, Any]) -> Usage:
        """From a Chat Completions `usage` object (any compatible endpoint's spelling)."""
        prompt, completion = _int(usage.get("prompt_tokens")), _int(usage.get("completion_tokens"))
        cache_read = max(
            _detail(usage, "prompt_tokens_details", "cached_tokens"),
            _int(usage.get("cache_read_input_tokens")),
        )
        cache_write = max(
            _detail(usage, "prompt_tokens_details", "cache_write_tokens", "cache_creation_tokens"),
            _int(usage.get("cache_creation_input_tokens")),
        )
        reasoning = _detail(usage, "completion_tokens_details", "reasoning_tokens")
        return cls(
            input=max(0, prompt - cache_read - cache_write),
            output=max(0, completion - reasoning),
            reasoning=reasoning,
            cache_read=cache_read,
            cache_write=cache_write,
        )

    @property
    def total(self) -> int:
        return self.input + self.output + self.reasoning + self.cache_read + self.cache_write

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def price_of(
    model: str, table: Mapping[str, Mapping[str, float]] | None = None
) -> Mapping[str, float] | None:
    """The price row for `model`: exact, else the longest prefix, else `*`, else None."""
    prices = settings.model_prices if table is None else table
    if not prices:
        return None
    if model in prices:
        return prices[model]
    prefixes = [name for name in prices if name != "*" and model.startswith(name)]
    if prefixes:
        return prices[max(prefixes, key=len)]
    return prices.get("*")


def cost_of(model: str, usage: Usage, table: Mapping[str, Mapping[str, float]] | None = None) -> float | None:
    """Dollars for `usage` of `model`, or None when the model has no price."""
    row = price_of(model, table)
    if row is None:
        return None
    total = 0.0
    for name in FIELDS:
        rate = row.get(name, row.get(FALLBACK.get(name, name), 0.0))
        total += getattr(usage, name) * rate
    return total / 1_000_000
