"""Flow control: global and per-key concurrency limits and rate limits, kept in PostgreSQL.

A @consumer declares its queue's limits (global_concurrency, rate_limit, limit_by); a worker writes them to
outboxq_queue_limits when it starts, unless an operator has set that queue's limits (`outboxq queues limit`),
which then stay until reset. Every worker re-reads the table every few seconds, so a change reaches all of
them without a restart. The statements are in sql/limits.py.
"""

from __future__ import annotations

import itertools
import math
import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from outboxq.errors import InvalidInput, InvalidLimit, InvalidPayload
from outboxq.queue.jobs import CLAIM_ORDER
from outboxq.queue.sql import limits as limits_sql

RATE_PERIODS_S = {"s": 1.0, "m": 60.0, "h": 3600.0}
# N/s, N/m or N/h, N of at most 9 digits (below MAX_LIMIT); the HTTP schema states the same pattern.
RATE_LIMIT_PATTERN = re.compile(r"^([0-9]{1,9})/([smh])$")
_RATE_SHAPE = re.compile(r"^([0-9]+)/([smh])$")

# The limits are stored as PostgreSQL integers: larger values are refused with a clear message.
MAX_LIMIT = 2**31 - 1

# How often a worker re-reads the limits of its queues (a change takes effect within this, plus a claim).
LIMITS_REFRESH_S = 2.0

# Fairness between keys: a worker holds (claimed, running or about to) at most about this many seconds of a
# per-key queue's work, so the job of a key that arrives later waits at most that long behind it.
FAIR_HOLD_S = 0.1

LimitBy = str | Callable[[Any], Any]


@dataclass(frozen=True)
class QueueLimits:
    """The limits of one queue; None means no such limit. With per_key, they apply to each limit key."""

    queue: str
    global_concurrency: int | None = None
    rate_limit_count: int | None = None
    rate_limit_period_s: float | None = None
    per_key: bool = False
    source: str = "consumer"

    @property
    def limited(self) -> bool:
        """True when any limit applies (a queue without one takes the unlimited claim)."""
        return self.global_concurrency is not None or self.rate_limit_count is not None

    @property
    def rate_limit(self) -> str | None:
        """The rate limit as written ("10/s"), or None."""
        if self.rate_limit_count is None or self.rate_limit_period_s is None:
            return None
        unit = next((u for u, s in RATE_PERIODS_S.items() if s == self.rate_limit_period_s), None)
        return f"{self.rate_limit_count}/{unit}" if unit else f"{self.rate_limit_count}/{self.rate_limit_period_s:g}s"

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> QueueLimits:
        """From a row of outboxq_queue_limits."""
        return cls(queue=row["queue"], global_concurrency=row["global_concurrency"],
                   rate_limit_count=row["rate_limit_count"], rate_limit_period_s=row["rate_limit_period_s"],
                   per_key=row["per_key"], source=row["source"])


# What a limit of 0 is told: it would hold every job of the queue back, which is what pausing it says.
_PAUSE_INSTEAD = ("to stop a queue's jobs from starting, pause the queue instead (`outboxq pause QUEUE`, POST "
                  "/v1/queues/{queue}/pause, outboxq.queue.admin.pause_queue)")


def parse_rate_limit(rate_limit: str | None) -> tuple[int | None, float | None]:
    """("N/s" | "N/m" | "N/h") -> (N, period in seconds); None -> (None, None); InvalidLimit otherwise. (It reads
    what is stored, too: a limit of 0 written before validate_rate_limit refused it still reads.)"""
    if rate_limit is None:
        return None, None
    match = _RATE_SHAPE.fullmatch(rate_limit) if isinstance(rate_limit, str) else None
    if match is None:
        raise InvalidLimit(f"invalid rate limit {rate_limit!r}: write N/s, N/m or N/h (for example '10/s')")
    if RATE_LIMIT_PATTERN.fullmatch(rate_limit) is None:
        raise InvalidLimit(f"invalid rate limit {rate_limit!r}: at most 999999999 starts per period")
    count = int(match.group(1))
    return count, RATE_PERIODS_S[match.group(2)]


def validate_rate_limit(rate_limit: str | None) -> tuple[int | None, float | None]:
    """A rate limit to set, parsed (parse_rate_limit); InvalidLimit when malformed or of 0 starts."""
    count, period = parse_rate_limit(rate_limit)
    if count == 0:
        raise InvalidLimit(f"rate limit {rate_limit!r} would let no job start; {_PAUSE_INSTEAD}, or give 1 or more "
                           "starts per period (None or null: no rate limit)")
    return count, period


def validate_concurrency(global_concurrency: Any) -> int | None:
    """The global concurrency (None = unlimited; per key with limit_by), or InvalidLimit."""
    if global_concurrency is None:
        return None
    if (isinstance(global_concurrency, bool) or not isinstance(global_concurrency, int)
            or not 0 <= global_concurrency <= MAX_LIMIT):
        raise InvalidLimit(f"global_concurrency must be an integer from 1 to {MAX_LIMIT}, not {global_concurrency!r}")
    if global_concurrency == 0:
        raise InvalidLimit(f"global_concurrency 0 would let no job start; {_PAUSE_INSTEAD}, or give 1 or more "
                           "(None or null: no concurrency limit)")
    return global_concurrency


def declared_limits(queue: str, *, global_concurrency: int | None, rate_limit: str | None,
                    limit_by: LimitBy | None) -> QueueLimits:
    """What a @consumer's options declare (validated when the consumer is registered)."""
    if limit_by is not None and not (callable(limit_by) or (isinstance(limit_by, str) and limit_by)):
        raise InvalidLimit("limit_by must be a top-level payload field name or a callable payload -> str")
    count, period = validate_rate_limit(rate_limit)
    return QueueLimits(queue=queue, global_concurrency=validate_concurrency(global_concurrency),
                       rate_limit_count=count, rate_limit_period_s=period, per_key=limit_by is not None)


def fair_hold(concurrency: int, typical_job_s: float | None, most: int) -> int:
    """How many jobs of a per-key queue a worker with `concurrency` handlers holds at once: FAIR_HOLD_S of work
    at the typical handler run time (typical_job_seconds; one per handler until there is a measure), at most
    `most`."""
    if typical_job_s is None:
        return min(concurrency, most)
    return max(concurrency, min(most, int(concurrency * FAIR_HOLD_S / max(typical_job_s, 1e-6))))


def typical_job_seconds(before: float | None, durations: list[float]) -> float:
    """A limited queue's typical handler run time (fair_hold, keys_to_scan), updated with one completion write's
    run times: a moving average of each write's median. The median, not the mean: run times are wall time, and a
    few handlers of a write that waited milliseconds (for the GIL, behind the dispatcher building a claim's jobs)
    made a write's mean of no-op jobs 10 to 100 times their typical time (traced in a per-key drain)."""
    typical = statistics.median(durations)
    return typical if before is None else 0.7 * before + 0.3 * typical


def round_robin(rows: list[dict[str, Any]], after_key: str) -> tuple[list[dict[str, Any]], str]:
    """A per-key claim's rows in the order its handlers take them, and where the next claim resumes.

    Every key's first job (priority, run_at, id), then every key's second job, and so on, the keys after
    `after_key` first (then wrapping around). The next claim resumes after the last key the claim's scan served
    (its `resume_key`, in the database's collation: Python's string order, used here only to interleave the
    keys, need not match it)."""
    # (Grouped first, then each key's few jobs sorted: cheaper than one sort of the whole claim and setdefault.)
    by_key: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        group = by_key.get(r["limit_key"])
        if group is None:
            by_key[r["limit_key"]] = [r]
        else:
            group.append(r)
    keys = sorted(by_key, key=lambda k: (k <= after_key, k))
    turns = itertools.zip_longest(*(sorted(by_key[k], key=CLAIM_ORDER) for k in keys))  # (every key's first job), ...
    return [r for turn in turns for r in turn if r is not None], rows[0]["resume_key"] if rows else after_key


def shares_claim_slots(limits: QueueLimits, limit: int) -> bool:
    """Whether a claim of `limit` jobs may take a shared claim slot: no larger than a shared claim may be, and
    every limit of the queue above the reserve for the claims beside it (below, only an exclusive claim could
    take a job)."""
    return limit <= limits_sql.SHARED_CLAIM_MAX and all(
        value is None or value > limits_sql.SHARED_RESERVE
        for value in (limits.global_concurrency, limits.rate_limit_count))


def claim_size(batch_size: int, max_in_flight: int) -> int:
    """The most jobs one claim of a limited queue takes (where its limit binds, or per key, the dispatcher's
    room caps it further): what the worker may hold, up to the largest claim that still shares the claim slots,
    and never less than a batch. A limited claim costs more than an unlimited one whatever its size (a claim
    slot, the count of running jobs, a commit that waits for the disk; per key, a probe per key): with limits
    that did not bind, limited drains ran slower than the unlimited one in claims of a batch, and closer to it
    in larger claims. Where the limit cannot bind, the worker may hold two such claims
    (WorkerState.max_in_flight_limited): holding one, a full claim waited for every job before it to be written
    (claims fell well short of the largest), and holding two brought the drains closer still."""
    return max(batch_size, min(max_in_flight, limits_sql.SHARED_CLAIM_MAX))


# A per-key claim scans this many keys more than it may claim jobs, to pass keys that are at their limit.
KEY_SCAN_MARGIN = 64


def key_budget(limit: int) -> int:
    """How many keys a per-key claim of `limit` jobs scans at most (each key scanned costs an index probe)."""
    return limit + KEY_SCAN_MARGIN


# A key's turn in a per-key claim whose keys all hold more jobs than their equal share (deficit round robin's
# quantum): at most this many jobs, and this much of the handlers' time. Each key a claim scans costs an index
# probe and a pick of its own (with many keys and few jobs a key, the per-key drain ran well below the unlimited
# one); in turns of up to 40 jobs a claim scans few keys. The price: a key that arrives behind a backlog of N
# busy keys waits for N turns, at most N x KEY_TURN_MAX jobs (N x KEY_TURN_S of handler time, shared by the
# handlers), instead of about one claim. Shallower turns did no better, and deeper ones worse: they scatter each claim over more
# of the table.
# The handlers' time is wall time (typical_job_seconds): on a loaded machine no-op jobs took far longer for
# stretches of a drain (their handlers waiting for the GIL and the CPU), and much shorter turns then shrank to
# a few jobs, the claims scanning many more keys (each key scanned costs the server CPU: bench/claim_cpu.py
# measures it). With this bound full turns hold throughout a drain, and a job that really takes a tenth of it
# still gets turns of a tenth of KEY_TURN_MAX.
KEY_TURN_MAX = 40
KEY_TURN_S = 0.04


def keys_to_scan(limit: int, key_depth: float | None, typical_job_s: float | None) -> int:
    """How many keys a per-key claim of `limit` jobs scans. Every key it may need (key_budget) until a full
    claim has shown how many jobs its keys held at least (`key_depth`: its jobs per key served); then enough
    keys for `limit` in turns of twice that depth (the next claim's keys may hold more: a claim that finds
    them shallower comes back short, and the next scans every key again), at most KEY_TURN_MAX jobs and
    KEY_TURN_S of the handlers' time (`typical_job_s`: typical_job_seconds) each. Not after a claim of one job per
    key (more keys than jobs: they may hold no more, and turns of two would come back short every other claim)."""
    if key_depth is None or key_depth < 2 or typical_job_s is None:
        return key_budget(limit)
    turn = min(2 * key_depth, KEY_TURN_MAX, KEY_TURN_S / max(typical_job_s, 1e-6))
    return key_budget(limit) if turn < 2 else min(key_budget(limit), math.ceil(limit / turn))


def key_depth_shown(rows: list[dict[str, Any]], limit: int) -> float | None:
    """The jobs per key that a per-key claim of `limit` jobs showed its keys hold at least (every key gave its
    whole share: the claim is full), or None (short: the keys were shallower, or at their limits)."""
    if not rows or len(rows) < limit:
        return None
    return len(rows) / len({r["limit_key"] for r in rows})


# A limit key is indexed (outboxq_jobs_limit_key_idx): longer keys could exceed an index entry's size.
MAX_LIMIT_KEY_LENGTH = 255


def _valid_limit_key(key: str) -> bool:
    return len(key) <= MAX_LIMIT_KEY_LENGTH and "\x00" not in key


# The key of a per-key queue's jobs whose payload gives none (limit_by finds no field, or returns None): they share
# the limits of this one key, rather than have no key (a per-key claim takes only jobs with a key).
NO_LIMIT_KEY = ""


def limit_key_of(limit_by: LimitBy, payload: Any) -> str | None:
    """The limit key of a payload: its `limit_by` field, or what the callable returns (None: no key);
    InvalidPayload when the callable fails or the key is no valid limit key (nothing is written)."""
    if callable(limit_by):
        try:
            value = limit_by(payload)
        except Exception as exc:  # the user's callable: any error of it is this payload's, told as such
            raise InvalidPayload(f"limit_by could not give this payload a limit key ({exc!r}); fix the payload, "
                                 f"or pass limit_key= to enqueue") from exc
    elif isinstance(payload, dict):
        value = payload.get(limit_by)
    else:
        value = None
    if value is None:
        return None
    key = str(value)
    if not _valid_limit_key(key):
        raise InvalidPayload(f"the limit key that limit_by gives this payload ({key!r:.80}) is too long or holds a "
                             f"NUL character: keys are at most {MAX_LIMIT_KEY_LENGTH} characters; pass limit_key= "
                             f"to enqueue")
    return key


def job_limit_key(limit_by: LimitBy, payload: Any) -> str:
    """The limit key a per-key queue's job gets from its payload: limit_key_of, or the shared NO_LIMIT_KEY where
    that gives none (enqueue, and the worker keying jobs enqueued without the consumer)."""
    key = limit_key_of(limit_by, payload)
    return NO_LIMIT_KEY if key is None else key


def validate_limit_key(limit_key: Any) -> str | None:
    """A limit key given to enqueue (or None), or InvalidInput."""
    if limit_key is None:
        return None
    if not isinstance(limit_key, str) or not _valid_limit_key(limit_key):
        raise InvalidInput(f"invalid limit_key {limit_key!r}: use a string of at most {MAX_LIMIT_KEY_LENGTH} "
                           f"characters")
    return limit_key


# ---------------------------------------------------------------- reading and writing the limits


def declare(conn: Any, limits: QueueLimits) -> None:
    """Write a consumer's declared limits (an operator's limits of the queue stay, but per_key follows limit_by,
    which is code, whoever set the row); not committed."""
    if limits.limited or limits.per_key:
        conn.execute(limits_sql.queue_limits_declare, {
            "queue": limits.queue, "global_concurrency": limits.global_concurrency,
            "rate_limit_count": limits.rate_limit_count, "rate_limit_period_s": limits.rate_limit_period_s,
            "per_key": limits.per_key})
    else:
        conn.execute(limits_sql.queue_limits_undeclare, {"queue": limits.queue})
        conn.execute(limits_sql.queue_limits_not_per_key, {"queue": limits.queue})


def declaration_changes(declared: QueueLimits, stored: QueueLimits | None, *, starting: bool = True) -> bool:
    """Whether declare() would change what PostgreSQL holds for the queue (`stored`: its row, if any). A worker
    that starts with its consumers' limits already stored writes nothing: no row lock that the workers starting
    beside it wait for, no commit to flush. Once started (`starting` false, the workers' periodic re-reads) it
    declares only a row gone since (an operator's reset: back to what the consumers declare): workers of two
    versions of a consumer, side by side during a deployment, would otherwise take turns rewriting the row. At
    start, per_key follows limit_by even in an operator's row (limits set before any worker declared)."""
    if stored is None:
        return declared.limited or declared.per_key
    if not starting:
        return False
    if declared.per_key != stored.per_key:
        return True
    if stored.source != "consumer":
        return False  # an operator's limits stay until reset (declare leaves them)
    if not (declared.limited or declared.per_key):
        return True  # what a consumer declared goes when the consumer declares nothing
    return (declared.global_concurrency, declared.rate_limit_count, declared.rate_limit_period_s,
            declared.per_key) != (stored.global_concurrency, stored.rate_limit_count, stored.rate_limit_period_s,
                                  stored.per_key)


def load(conn: Any) -> dict[str, QueueLimits]:
    """Every queue's limits, by queue."""
    cur = conn.cursor(row_factory=_dict_row())
    return {r["queue"]: QueueLimits.from_row(r) for r in cur.execute(limits_sql.queue_limits_all).fetchall()}


def set_limits(conn: Any, queue: str, *, global_concurrency: int | None = None, rate_limit: str | None = None,
               set_concurrency: bool = False, set_rate: bool = False) -> QueueLimits:
    """An operator's change: each limit asked for replaces the current one (None removes it); not committed."""
    from outboxq.queue.enqueue import validate_queue_name

    validate_queue_name(queue)
    count, period = validate_rate_limit(rate_limit) if set_rate else (None, None)
    cur = conn.cursor(row_factory=_dict_row())
    row = cur.execute(limits_sql.queue_limits_set, {
        "queue": queue, "global_concurrency": validate_concurrency(global_concurrency) if set_concurrency else None,
        "rate_limit_count": count, "rate_limit_period_s": period,
        "set_concurrency": set_concurrency, "set_rate": set_rate}).fetchone()
    return QueueLimits.from_row(row)


def reset_limits(conn: Any, queue: str) -> bool:
    """Forget an operator's limits of `queue` (its consumers' declarations apply again); not committed."""
    return conn.execute(limits_sql.queue_limits_reset, {"queue": queue}).fetchone() is not None


def usage(conn: Any, queue: str | None = None) -> list[dict[str, Any]]:
    """Each limited queue (or only `queue`): its limits, jobs running now, starts in the rate window, and the
    busiest keys ([{"key", "running"}], most running first, at most five) of per-key queues."""
    cur = conn.cursor(row_factory=_dict_row())
    rows = cur.execute(limits_sql.queue_limits_usage, {"queue": queue}).fetchall()
    return [{"queue": r["queue"], "global_concurrency": r["global_concurrency"],
             "rate_limit": QueueLimits.from_row(r).rate_limit, "per_key": r["per_key"], "source": r["source"],
             "running": int(r["running"]), "recent_starts": int(r["recent_starts"]),
             "busiest_keys": [{"key": k["key"], "running": int(k["running"])} for k in r["busiest_keys"]]}
            for r in rows]


def _dict_row() -> Any:
    from psycopg.rows import dict_row

    return dict_row
