"""Per-key turns (outboxq.queue.limits): where each per-key queue's round robin resumes, and how many keys its
next claim scans, from how deep its keys showed themselves in the last full claim."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from outboxq.queue import limits as flow_limits


@dataclass(frozen=True)
class KeyTurn:
    """One per-key claim's turn: its queue, how many jobs it asks for, the key it resumes after, how many keys it
    scans."""

    queue: str
    limit: int
    after_key: str
    max_keys: int

    def params(self) -> dict[str, Any]:
        """The per-key claim statement's parameters for this turn."""
        return {"after_key": self.after_key, "max_keys": self.max_keys}

    def cut_short(self, claimed: int) -> bool:
        """Whether the claim, having taken `claimed` jobs, came back short after scanning fewer keys than it
        might have: the rest may lie in the keys after them (the queue is not idle), to be claimed again at
        once, scanning every key."""
        return claimed < self.limit and self.max_keys < flow_limits.key_budget(self.limit)


class KeyTurns:
    """The per-key turns of one worker's queues (the dispatcher's thread, or a caller's claims)."""

    def __init__(self) -> None:
        self._after_key: dict[str, str] = {}  # where each queue's round robin resumes
        self._depth: dict[str, float] = {}  # the jobs per key each queue's last full claim showed

    def next_turn(self, queue: str, limit: int, *, deep_turns: bool, job_seconds: float | None) -> KeyTurn:
        """The turn of the queue's next claim of up to `limit` jobs. `deep_turns`: whether it may scan fewer
        keys and take more of each, as the keys have shown they hold (only where no key's limit can bind: where
        one can, the claims are small, and a key at its limit among fewer keys would cut them short).
        `job_seconds`: the queue's typical handler run time."""
        depth = self._depth.pop(queue, None)
        max_keys = flow_limits.keys_to_scan(limit, depth if deep_turns else None, job_seconds)
        return KeyTurn(queue, limit, self._after_key.get(queue, ""), max_keys)

    def claimed(self, turn: KeyTurn, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The rows a turn claimed, in the order the handlers take them; the next turn resumes after the last key
        served, and scans as deep as these rows showed the keys to be (when the claim was full)."""
        # Handlers take the batch in round-robin order too (every key's first job, then every key's second...):
        # a key that just arrived does not wait behind another key's share of the batch.
        ordered, self._after_key[turn.queue] = flow_limits.round_robin(rows, turn.after_key)
        shown = flow_limits.key_depth_shown(rows, turn.limit)
        if shown is not None:
            self._depth[turn.queue] = shown
        return ordered
