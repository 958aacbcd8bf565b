"""Flow control statements: limits per queue, and the claims of limited queues.

A queue without a row in outboxq_queue_limits never runs these: its workers claim with sql.job_claim_batch,
unchanged. A limited queue's claim (the dispatcher's) is two statements in one transaction:

1. A claim slot: transaction-level advisory locks, so that the claims of one limited queue (across every
   worker and host) see each other's jobs. They are taken in a statement of their own because a statement's
   snapshot is taken when it starts: counting in the statement that waited for a lock would miss the jobs
   that the claim holding it just took. A queue has CLAIM_SLOTS slots:
   - `queue_limit_claim_exclusive` holds them all: no other claim of the queue is in flight, so the claim
     counts every job running and every start, and may take all that its limits allow.
   - `queue_limit_claim_shared` holds one: up to CLAIM_SLOTS claims run side by side, none waiting for
     another. Each takes at most SHARED_CLAIM_MAX jobs (per key with limit_by), and keeps the most that the
     claims in flight beside it may have taken, SHARED_RESERVE, out of its allowance: a limit is never
     exceeded, and a claim far from every limit does not queue behind the others (one lock per queue made the
     claims of a limit that did not bind take turns: 0.88 of the unlimited drain with two worker processes).
   Its rows say whether the reserve cut its allowance below what it asked for (`held_back`): a claim so cut
   short, or one that found nothing, is followed by an exclusive one (outboxq.workers.dispatcher); one that the
   backlog cut short is not.
2. `job_claim_limited` (no limit_by) or `job_claim_limited_per_key` (limit_by): count, claim within the
   allowance (less `reserve`: SHARED_RESERVE in a shared slot, 0 in an exclusive claim), and log the starts
   of rate-limited queues, in one statement.

Both claims end with sql.CLAIM_UPDATE, the UPDATE ... RETURNING of sql.job_claim_batch itself (the same columns
set, the same rows returned), so that the limited and the unlimited claims cannot drift apart.

The completer's claims into the slots that its completions free (`job_complete_handing_over`, where a global
concurrency is a queue's only limit) take no claim slot: see there.
"""

from __future__ import annotations

from outboxq.queue.sql import jobs as sql

LIMIT_LOCK_CLASS = 7314

# Counted as started within the window: a start this much older than the period (as a fraction of it), so
# that the jitter between a claim and its handler's start cannot put N + 1 handler starts within one period.
# (A smaller margin let an extra start into a period on a loaded machine; the margin costs the same share of
# the rate.)
RATE_WINDOW_MARGIN = 0.05

CLAIM_SLOTS = 4
SHARED_CLAIM_MAX = 1_000
SHARED_RESERVE = (CLAIM_SLOTS - 1) * SHARED_CLAIM_MAX

# Slot s of a queue is the advisory lock (LIMIT_LOCK_CLASS + s, hashtext(queue)); taken in slot order.
queue_limit_claim_exclusive = f"""
SELECT count(pg_advisory_xact_lock({LIMIT_LOCK_CLASS} + s, hashtext(%(queue)s)))
FROM generate_series(0, {CLAIM_SLOTS - 1}) AS s
"""

# The first free slot from %(first_slot)s on, or (all taken) wait for that one. Holding one slot while waiting
# for none, a shared claim cannot deadlock with an exclusive one, which waits for each slot in turn.
queue_limit_claim_shared = f"""
SELECT coalesce(
    (SELECT (s + %(first_slot)s) %% {CLAIM_SLOTS} FROM generate_series(0, {CLAIM_SLOTS - 1}) AS s
     WHERE pg_try_advisory_xact_lock({LIMIT_LOCK_CLASS} + (s + %(first_slot)s) %% {CLAIM_SLOTS},
                                     hashtext(%(queue)s))
     LIMIT 1),
    (SELECT %(first_slot)s FROM pg_advisory_xact_lock({LIMIT_LOCK_CLASS} + %(first_slot)s, hashtext(%(queue)s))))
    AS slot
"""

queue_limits_all = """
SELECT queue, global_concurrency, rate_limit_count, rate_limit_period_s, per_key, source, updated_at
FROM outboxq_queue_limits ORDER BY queue
"""

queue_limits_get = """
SELECT queue, global_concurrency, rate_limit_count, rate_limit_period_s, per_key, source, updated_at
FROM outboxq_queue_limits WHERE queue = %(queue)s
"""

# What a worker's @consumer declares, written at its start unless an operator set the queue's limits, whose
# row keeps them; per_key follows the consumer's limit_by (code) in either row. A consumer without limits
# removes a row that came from a consumer (queue_limits_undeclare) and turns per_key off in an operator's
# (queue_limits_not_per_key).
queue_limits_declare = """
INSERT INTO outboxq_queue_limits (queue, global_concurrency, rate_limit_count, rate_limit_period_s, per_key)
VALUES (%(queue)s, %(global_concurrency)s, %(rate_limit_count)s, %(rate_limit_period_s)s, %(per_key)s)
ON CONFLICT (queue) DO UPDATE
SET global_concurrency = CASE WHEN outboxq_queue_limits.source = 'consumer' THEN EXCLUDED.global_concurrency
                              ELSE outboxq_queue_limits.global_concurrency END,
    rate_limit_count = CASE WHEN outboxq_queue_limits.source = 'consumer' THEN EXCLUDED.rate_limit_count
                            ELSE outboxq_queue_limits.rate_limit_count END,
    rate_limit_period_s = CASE WHEN outboxq_queue_limits.source = 'consumer' THEN EXCLUDED.rate_limit_period_s
                               ELSE outboxq_queue_limits.rate_limit_period_s END,
    per_key = EXCLUDED.per_key, updated_at = now()
WHERE outboxq_queue_limits.per_key IS DISTINCT FROM EXCLUDED.per_key
   OR (outboxq_queue_limits.source = 'consumer'
       AND (outboxq_queue_limits.global_concurrency, outboxq_queue_limits.rate_limit_count,
            outboxq_queue_limits.rate_limit_period_s)
           IS DISTINCT FROM (EXCLUDED.global_concurrency, EXCLUDED.rate_limit_count, EXCLUDED.rate_limit_period_s))
"""

queue_limits_undeclare = """
DELETE FROM outboxq_queue_limits WHERE queue = %(queue)s AND source = 'consumer'
"""

queue_limits_not_per_key = """
UPDATE outboxq_queue_limits SET per_key = false, updated_at = now() WHERE queue = %(queue)s AND per_key
"""

# The operator's change (`outboxq queues limit`): each limit given replaces the current one (NULL = none);
# per_key stays what the consumer declared (it follows limit_by, which is code; a row written here before any
# consumer declared says false until a worker declares: queue_limits_declare).
queue_limits_set = """
INSERT INTO outboxq_queue_limits (queue, global_concurrency, rate_limit_count, rate_limit_period_s, source)
VALUES (%(queue)s, %(global_concurrency)s, %(rate_limit_count)s, %(rate_limit_period_s)s, 'operator')
ON CONFLICT (queue) DO UPDATE
SET global_concurrency = CASE WHEN %(set_concurrency)s THEN EXCLUDED.global_concurrency
                              ELSE outboxq_queue_limits.global_concurrency END,
    rate_limit_count = CASE WHEN %(set_rate)s THEN EXCLUDED.rate_limit_count
                            ELSE outboxq_queue_limits.rate_limit_count END,
    rate_limit_period_s = CASE WHEN %(set_rate)s THEN EXCLUDED.rate_limit_period_s
                               ELSE outboxq_queue_limits.rate_limit_period_s END,
    source = 'operator', updated_at = now()
RETURNING queue, global_concurrency, rate_limit_count, rate_limit_period_s, per_key, source, updated_at
"""

# Back to what the consumers declare: the row goes (the next worker to start declares it again).
queue_limits_reset = "DELETE FROM outboxq_queue_limits WHERE queue = %(queue)s RETURNING queue"

# Usage per queue (every limited queue, or only %(queue)s): running jobs (lease still valid) and starts within
# the rate-limit window, with the five busiest keys of per-key queues. Reads the running jobs (the partial
# lease index) and the start log only: its cost follows what is running, never the finished history.
queue_limits_usage = """
SELECT l.queue, l.global_concurrency, l.rate_limit_count, l.rate_limit_period_s, l.per_key, l.source,
       coalesce(r.running, 0) AS running, coalesce(s.recent_starts, 0) AS recent_starts,
       coalesce(r.busiest_keys, '[]'::jsonb) AS busiest_keys
FROM outboxq_queue_limits l
LEFT JOIN LATERAL (
    SELECT sum(n) AS running,
           jsonb_agg(jsonb_build_object('key', limit_key, 'running', n) ORDER BY rank)
               FILTER (WHERE l.per_key AND rank <= 5) AS busiest_keys
    FROM (SELECT limit_key, count(*) AS n, row_number() OVER (ORDER BY count(*) DESC, limit_key) AS rank
          FROM outboxq_jobs
          WHERE status = 'running' AND queue = l.queue AND lease_expires_at > clock_timestamp()
          GROUP BY limit_key) k
) r ON true
LEFT JOIN LATERAL (
    SELECT sum(starts) AS recent_starts FROM outboxq_limit_starts
    WHERE queue = l.queue
      AND started_at > clock_timestamp() - l.rate_limit_period_s * interval '1 second'
) s ON true
WHERE %(queue)s::text IS NULL OR l.queue = %(queue)s
ORDER BY l.queue
"""

# Jobs of a per-key queue written without a limit key (enqueued where its consumer, and so its limit_by, was not
# known: over HTTP, by another service, before limit_by was added): a per-key claim reads the key index, which
# they are not in, and would never take them. The worker reads those at the front of the queue (its first
# `window` queued and retrying jobs, in claim order, through the claim and retry indexes: a bounded read whatever
# the backlog) and gives them a key (outboxq.workers.dispatcher.FlowControl.adopt_keyless (workers/flow.py)).
job_keyless_window = """
SELECT id, queue, payload, payload_bytes FROM (
    (SELECT id, queue, payload, payload_bytes, limit_key FROM outboxq_jobs
     WHERE queue = %(queue)s AND status = 'queued' ORDER BY priority, run_at, id LIMIT %(window)s)
    UNION ALL
    (SELECT id, queue, payload, payload_bytes, limit_key FROM outboxq_jobs
     WHERE queue = %(queue)s AND status = 'retrying' ORDER BY run_at, id LIMIT %(window)s)
) front
WHERE limit_key IS NULL
"""

# The same for the newest jobs, whatever the backlog ahead of them (a keyless job enqueued behind 100,000 keyed
# ones would otherwise wait for them to reach the front window), in commit order, the listing feed's rule
# (outboxq.queue.feed): per queue, the jobs after the previous look's place (created_xid, id) whose enqueue
# ended before every transaction still running began (created_xid below the snapshot's xmin), so that no job
# can commit behind a place once read past, however long its transaction or large its batch; at most `window`
# a queue, through the feed index. Waiting jobs too (a job released by its dependency later is not read again).
# Per queue: the last place read and how many were read (scanned), with each keyless job's row, or one row of
# NULLs beside those where none is keyless; no row for a queue where none was read.
job_keyless_newest = """
WITH horizon AS MATERIALIZED (
    SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint AS xmin
), recent AS MATERIALIZED (
    SELECT p.queue, r.id, r.created_xid, r.status, r.limit_key
    FROM unnest(%(queues)s::text[], %(after_xids)s::bigint[], %(after_ids)s::bigint[])
        AS p(queue, after_xid, after_id)
    CROSS JOIN horizon h
    CROSS JOIN LATERAL (
        SELECT j.id, j.created_xid, j.status, j.limit_key FROM outboxq_jobs j
        WHERE j.queue = p.queue AND j.status <> 'running'  -- (the feed index's jobs; a running one is claimed already)
          AND j.created_xid < h.xmin AND (j.created_xid, j.id) > (p.after_xid, p.after_id)
        ORDER BY j.created_xid, j.id LIMIT %(window)s
    ) r
), seen AS (
    SELECT DISTINCT ON (queue) queue, created_xid AS last_xid, id AS last_id,
        count(*) OVER (PARTITION BY queue) AS scanned
    FROM recent ORDER BY queue, created_xid DESC, id DESC
)
SELECT s.queue, s.last_xid, s.last_id, s.scanned, j.id, j.payload, j.payload_bytes
FROM seen s
LEFT JOIN (recent r JOIN outboxq_jobs j ON j.id = r.id)
    ON r.queue = s.queue AND r.status IN ('waiting', 'queued', 'retrying') AND r.limit_key IS NULL
"""

# Where the look at the newest jobs of a queue starts (xmin: after every job whose enqueue has ended, which are
# the front window's, before every one still to commit), and the first transaction id not yet given (xmax).
job_newest_place = """
SELECT pg_snapshot_xmin(s)::text::bigint AS xmin, pg_snapshot_xmax(s)::text::bigint AS xmax
FROM pg_current_snapshot() AS s
"""

# (Only where no key was given meanwhile.)
job_set_limit_keys = """
UPDATE outboxq_jobs j SET limit_key = k.limit_key
FROM unnest(%(ids)s::bigint[], %(limit_keys)s::text[]) AS k(id, limit_key)
WHERE j.id = k.id AND j.limit_key IS NULL
"""

# ---------------------------------------------------------------- the claims of limited queues

# A limited claim runs with its generic plan (psycopg prepares it from its sixth run on; on the worker's own
# connections from its first): planned once per connection instead of before every claim. Left to
# plan_cache_mode "auto", PostgreSQL kept planning them anew (the generic plan's estimates look dearer), and
# planning was a real share of a per-key claim (bench/flow_claim_explain.py --generic measures it);
# the generic plans read the same indexes. Without sequential
# scans (sql.generic_plans): made while the queue was empty, the plan updated the claimed jobs through a
# sequential scan of the jobs table, which every claim after it would have run over the whole table and its
# history. For the rest of the claim's transaction only (on a caller's connection; the worker's own have it
# for the session).
claim_generic_plan = sql.generic_plans.format(local="true")


def _compact(statement: str) -> str:
    """The statement without its comments and indentation. psycopg keeps its conversion of a query's
    placeholders only for texts of up to 4,096 bytes (psycopg._queries.MAX_CACHED_STATEMENT_LENGTH) and converts
    longer ones at every run (the handover's is longer, and runs at every write of a limited queue)."""
    lines = (line.split("--", 1)[0].strip() for line in statement.splitlines())
    return "\n".join(line for line in lines if line)


_LIMITS = f"""
flow_limits AS (
    SELECT global_concurrency, rate_limit_count, per_key,
           rate_limit_period_s * {1 + RATE_WINDOW_MARGIN} * interval '1 second' AS rate_window
    FROM outboxq_queue_limits WHERE queue = %(queue)s
)"""

# Log the starts (rate-limited queues only) and forget those older than the window.
_STARTS = """
flow_started AS (
    INSERT INTO outboxq_limit_starts (queue, limit_key, started_at, starts)
    SELECT %(queue)s, k.limit_key, clock_timestamp(), k.n FROM flow_claimed_keys k
    WHERE (SELECT rate_limit_count FROM flow_limits) IS NOT NULL
),
flow_forgotten AS (
    -- (SKIP LOCKED: claims side by side in shared slots do not wait for each other's deletions.)
    DELETE FROM outboxq_limit_starts
    WHERE id IN (SELECT id FROM outboxq_limit_starts
                 WHERE queue = %(queue)s AND started_at < clock_timestamp() - (SELECT rate_window FROM flow_limits)
                 FOR UPDATE SKIP LOCKED)
)"""

# sql.job_claim_batch's parts as CTEs (queue_state, fresh and retry: sql.CLAIM_QUEUE_STATE and
# sql.CLAIM_CANDIDATES, with its limit replaced by a flow_allowance CTE's n; flow_claimed: its UPDATE ...
# RETURNING, sql.CLAIM_UPDATE, left open).
_CLAIM_WITHIN_ALLOWANCE = f"""{sql.CLAIM_QUEUE_STATE},
{sql.CLAIM_CANDIDATES.format(limit="coalesce((SELECT n FROM flow_allowance), 0)")},
flow_claimed AS (
{sql.CLAIM_UPDATE}"""

# The queue's running jobs, as every limited claim counts them: a job whose lease expired no longer counts (its
# worker is gone; the rescue will requeue it). Read from the queue's range of the lease index (migration 0013),
# whatever runs in the other queues.
_RUNNING_COUNT = """(SELECT count(*) FROM outboxq_jobs
                   WHERE status = 'running' AND queue = %(queue)s AND lease_expires_at > clock_timestamp())"""

# No limit_by: sql.job_claim_batch with its limit replaced by the queue's allowance.
job_claim_limited = (
    "WITH " + _LIMITS.strip() + """,
flow_allowance AS (
    SELECT greatest(0, least(%(limit)s, r.room))::int AS n, %(reserve)s > 0 AND r.room < %(limit)s AS held_back
    FROM (SELECT least(
              l.global_concurrency - %(reserve)s - """ + _RUNNING_COUNT + """,
              l.rate_limit_count - %(reserve)s - (SELECT coalesce(sum(starts), 0) FROM outboxq_limit_starts
                                                 WHERE queue = %(queue)s
                                                   AND started_at > clock_timestamp() - l.rate_window)) AS room
          FROM flow_limits l) r
),
"""
    + _CLAIM_WITHIN_ALLOWANCE
    + """
),
flow_claimed_keys AS (SELECT '' AS limit_key, count(*)::int AS n FROM flow_claimed HAVING count(*) > 0),"""
    + _STARTS
    + "\nSELECT c.*, (SELECT held_back FROM flow_allowance) AS held_back FROM flow_claimed c\n"
)

# A slot handed over (the completer's write, for a queue whose only limit is its global concurrency, binding
# within one worker): the worker's completions (sql.job_complete_batch's) and, in the same statement, the claim
# of as many of the queue's next jobs as the completions of its `handed_ids` freed slots (at most `limit`: the
# worker's idle handlers). It takes no claim slot: the statement commits a job leaving `running` and one
# entering it together, so every other claim's snapshot sees the same running count with or without it. Where
# that does not hold, it claims nothing and the slot goes to the dispatcher's counted claim:
# - a limit lowered meanwhile: it replaces no job above the limit (the running jobs it counts include those it
#   completes, which its own snapshot still shows running);
# - a lease about to expire: an expired job no longer counts as running for the other claims, which may have
#   given its slot away already; only jobs with more than `lease_margin_s` of their lease left (half the lease:
#   far beyond this statement and its commit) hand theirs over;
# - any other limit, set by an operator since the worker last read the limits: a rate limit (each start must
#   be logged and counted) or limit_by.
# One statement and one round trip on the completer's autocommit connection, instead of the completion, the
# claim slot, the claim and the commit (halving the cost of writing one outcome and claiming its next job).
job_complete_handing_over = _compact(
    "WITH " + sql.JOB_COMPLETE_CTES.format(fence=sql.FENCE_BY_TOKENS, also_set="") + ",\n" + _LIMITS.strip() + """,
flow_handed AS (
    -- (By primary key: written as one IS TRUE test, the queue and the lease are no index condition: the generic
    -- plan read every job of the queue, history too, through the feed index.)
    SELECT count(*)::int AS n FROM done
    WHERE done.id IN (SELECT id FROM outboxq_jobs
                      WHERE id = ANY(%(handed_ids)s::bigint[])
                        AND (queue = %(queue)s AND lease_expires_at > clock_timestamp()
                             + %(lease_margin_s)s::float8 * interval '1 second') IS TRUE)
),
flow_allowance AS (
    -- (In bigint: a limit raised to the largest integer since the worker read it plus the jobs handed over would
    -- overflow an integer, and the completions would fail with it until the worker read the limits again.)
    SELECT greatest(0, least(%(limit)s, h.n, l.global_concurrency::bigint + h.n - """ + _RUNNING_COUNT + """))::int AS n
    FROM flow_limits l CROSS JOIN flow_handed h
    WHERE l.rate_limit_count IS NULL AND NOT l.per_key
),
"""
    + _CLAIM_WITHIN_ALLOWANCE
    + """
)
""" + sql.JOB_COMPLETE_ANSWER + """,
       c.*
FROM (SELECT) AS one LEFT JOIN flow_claimed c ON true
"""
)

# limit_by: the distinct keys with claimable jobs, found by a skip scan of outboxq_jobs_limit_key_idx that
# starts after `after_key` (the last key the worker served) and wraps around, at most `max_keys` of them;
# each key's allowance (its own concurrency and rate limits), capped at its part of `limit` (flow_shares); the
# handlers take them round robin: every key's first job, then every key's second job, and so on. `pos` is each key's place in the
# scan: the worker resumes after the last key it served (`resume_key`, in the database's collation, which
# Python's string order need not match). The handlers' order is computed from the rows returned
# (outboxq.queue.limits.round_robin): joining each row back to flow_picked here cost a tenth of the claim.
# The skip scan keeps each key's first live index entry (priority, run_at, id), and the key's jobs are read
# from there: during a drain the entries of the jobs already claimed lie at the front of every key's range,
# and walking them twice per key per claim cost more than the claim itself. `attempts >= 0` (always true) reads a column the index lacks, so the scan visits the
# heap instead of being index-only: only then does PostgreSQL mark the dead entries it meets as dead in the
# index (so the next claims step over them without a heap visit, which makes them markedly cheaper).
_FIRST_OF_NEXT_KEY = """SELECT j.limit_key, j.priority, j.run_at, j.id FROM outboxq_jobs j
        WHERE j.queue = %(queue)s AND j.status IN ('queued', 'retrying') AND j.limit_key IS NOT NULL
          {after} {until}
          AND j.attempts >= 0
        ORDER BY j.limit_key, j.priority, j.run_at, j.id LIMIT 1"""


def _keys_scan(name: str, first_pos: str, until: str) -> str:
    """A recursive skip scan of the keys: the first job of the first key, then of each next key."""
    first = _FIRST_OF_NEXT_KEY.format(after="AND j.limit_key > %(after_key)s" if not until else "", until=until)
    step = _FIRST_OF_NEXT_KEY.format(after="AND j.limit_key > k.limit_key", until=until)
    return f"""{name}(limit_key, priority, run_at, id, pos) AS (
    (SELECT f.*, {first_pos} FROM ({first}) f)
    UNION ALL
    SELECT f.*, k.pos + 1 FROM {name} k CROSS JOIN LATERAL ({step}) f
    WHERE k.pos < %(max_keys)s
)"""


job_claim_limited_per_key = (
    "WITH RECURSIVE " + _LIMITS.strip() + ",\n"
    + _keys_scan("flow_keys_after", "1", "") + ",\n"
    + _keys_scan("flow_keys_wrapped", "(SELECT count(*) FROM flow_keys_after)::int + 1",
                 "AND j.limit_key <= %(after_key)s") + """,
flow_keys AS (
    SELECT * FROM flow_keys_after
    UNION ALL
    SELECT * FROM flow_keys_wrapped WHERE pos <= %(max_keys)s
),
-- Counted per key only when the queue's total could bring a key near its concurrency limit: otherwise every
-- key may take at least `limit` more, whatever its share of the total (grouping 2,000 running jobs by key cost
-- twice their count, a tenth of a claim's selection).
flow_running_total AS (
    SELECT count(*) AS n FROM outboxq_jobs
    WHERE status = 'running' AND queue = %(queue)s AND lease_expires_at > clock_timestamp()
      AND (SELECT global_concurrency FROM flow_limits) IS NOT NULL  -- (a rate limit alone counts no running job)
),
flow_running AS (
    SELECT limit_key, count(*) AS n FROM outboxq_jobs
    WHERE status = 'running' AND queue = %(queue)s AND lease_expires_at > clock_timestamp()
      AND (SELECT l.global_concurrency - %(reserve)s - t.n < %(limit)s FROM flow_limits l, flow_running_total t)
    GROUP BY limit_key
),
flow_recent AS (
    SELECT limit_key, sum(starts) AS n FROM outboxq_limit_starts
    WHERE queue = %(queue)s AND started_at > clock_timestamp() - (SELECT rate_window FROM flow_limits)
    GROUP BY limit_key
),
""" + sql.CLAIM_QUEUE_STATE + """,
flow_allowance AS (
    SELECT k.limit_key, k.pos, k.priority, k.run_at, k.id,
           greatest(0, least(l.global_concurrency - %(reserve)s - coalesce(r.n, 0),
                             l.rate_limit_count - %(reserve)s - coalesce(s.n, 0)))::int AS allowed
    FROM flow_keys k
    CROSS JOIN flow_limits l
    LEFT JOIN flow_running r ON r.limit_key = k.limit_key
    LEFT JOIN flow_recent s ON s.limit_key = k.limit_key
    WHERE NOT (SELECT paused FROM queue_state)
),
-- `limit` shared out between the keys that may start a job, in scan order: each key's equal part, one more for
-- the first (limit mod keys) of them; with more keys than `limit`, one job each for the first `limit` keys (with
-- 10,000 keys, locking a job of every scanned key cost more than the claim). The parts add up to `limit` at
-- most: no job is locked that the claim does not take, and nothing is left to sort or cut after the picks.
flow_shares AS (
    SELECT a.*, row_number() OVER (ORDER BY a.pos) AS rank, count(*) OVER () AS keys
    FROM flow_allowance a WHERE a.allowed > 0
),
flow_picked AS (
    SELECT c.id, a.limit_key, a.pos
    FROM flow_shares a
    CROSS JOIN LATERAL (
        SELECT j.id FROM outboxq_jobs j
        WHERE j.queue = %(queue)s AND j.status IN ('queued', 'retrying') AND j.limit_key = a.limit_key
          AND (j.priority, j.run_at, j.id) >= (a.priority, a.run_at, a.id) AND j.run_at <= now()
        ORDER BY j.priority, j.run_at, j.id
        LIMIT least(a.allowed, %(limit)s / a.keys + CASE WHEN a.rank <= %(limit)s %% a.keys THEN 1 ELSE 0 END)
        FOR UPDATE SKIP LOCKED
    ) c
    WHERE a.rank <= %(limit)s
),
fresh AS (SELECT id FROM flow_picked),
retry AS (SELECT NULL::bigint AS id WHERE false),
flow_claimed AS (
""" + sql.CLAIM_UPDATE + """, j.limit_key
),
flow_claimed_keys AS (SELECT limit_key, count(*)::int AS n FROM flow_claimed GROUP BY limit_key),"""
    + _STARTS
    + """
SELECT c.*, (SELECT p.limit_key FROM flow_picked p ORDER BY p.pos DESC LIMIT 1) AS resume_key,
       (SELECT %(reserve)s > 0 AND bool_or(a.allowed < %(limit)s) FROM flow_allowance a) AS held_back
FROM flow_claimed c
"""
)
