"""The pure retry policy: when a failed attempt runs again, and when a job is dead."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from outboxq.settings import Settings


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential backoff with jitter, capped at backoff_max; max_attempts 0 means retry forever."""

    max_attempts: int = 25
    backoff_base: float = 5.0
    backoff_max: float = 3600.0
    jitter: float = 0.25  # fraction of the delay drawn at random, so failed jobs do not retry in lockstep

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: float | int | None) -> RetryPolicy:
        """The settings' default policy, with the overrides that are not None."""
        values: dict[str, Any] = {"max_attempts": settings.max_attempts, "backoff_base": settings.backoff_base,
                  "backoff_max": settings.backoff_max, "jitter": settings.backoff_jitter}
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def is_exhausted(self, attempts: int, max_attempts: int | None = None) -> bool:
        """True when a job that has made `attempts` attempts may not run again."""
        limit = self.max_attempts if max_attempts is None else max_attempts
        return limit != 0 and attempts >= limit

    def decide(self, attempts: int, max_attempts: int | None = None,
               rng: random.Random | None = None) -> tuple[str, float]:
        """The fate of a job whose attempt number `attempts` failed: ("dead", 0.0) or ("retrying", delay)."""
        if self.is_exhausted(attempts, max_attempts):
            return "dead", 0.0
        return "retrying", self.delay(attempts, rng)

    def delay(self, attempts: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before the next attempt, after `attempts` attempts (1-based)."""
        exponent = max(attempts - 1, 0)
        raw = self.backoff_base * (2.0 ** min(exponent, 62))
        capped = min(raw, self.backoff_max)
        if self.jitter <= 0:
            return capped
        spread = capped * self.jitter
        return min(self.backoff_max, max(0.0, capped - spread + (rng or random).random() * 2 * spread))
