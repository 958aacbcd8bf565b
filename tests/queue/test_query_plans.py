"""The plan guard: beside a large history of finished jobs, the hot statements use the indexes meant for
them and never scan the jobs table (a regression here costs throughput long before a test would time out)."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from outboxq.queue import sql
from outboxq.queue.sql import limits as limits_sql
from outboxq.queue.sql import spark_stream as spark_stream_sql
from outboxq.workers.claim_cursor import FROM_THE_FRONT
from tests.support import explain_prepared, plan_nodes

HISTORY = 200_000


@pytest.fixture
def history(conn):
    """200,000 finished jobs (finished over the 2.3 days before the last two), 200 ready ones and 50 running
    ones with leases, then ANALYZE."""
    conn.execute("""
        INSERT INTO outboxq_jobs (queue, status, payload, finished_at)
        SELECT 'emails', (ARRAY['done', 'dead', 'cancelled'])[1 + i %% 3], '{}'::jsonb,
               now() - interval '2 days' - i * interval '1 second'  -- a history older than the figures' windows
        FROM generate_series(1, %s) AS i
    """, (HISTORY,))
    conn.execute("""INSERT INTO outboxq_jobs (queue, status, payload)
                    SELECT 'emails', 'queued', '{}'::jsonb FROM generate_series(1, 200)""")
    conn.execute("""INSERT INTO outboxq_jobs (queue, status, payload, lease_token, lease_expires_at, attempts)
                    SELECT 'emails', 'running', '{}'::jsonb, gen_random_uuid(), now() + interval '1 min', 1
                    FROM generate_series(1, 50)""")
    conn.commit()
    conn.autocommit = True
    conn.execute("ANALYZE outboxq_jobs")
    conn.autocommit = False
    return conn


def plan_of(conn, statement: str, params: dict) -> dict:
    """EXPLAIN (FORMAT JSON) of a statement: the plan only, nothing is executed."""
    rows = conn.execute("EXPLAIN (FORMAT JSON) " + statement, params).fetchall()
    conn.rollback()
    return rows[0]["QUERY PLAN"][0]["Plan"]


def scans_of_jobs(plan: dict) -> list[tuple[str, str | None]]:
    return [(n["Node Type"], n.get("Index Name")) for n in plan_nodes(plan) if n.get("Relation Name") == "outboxq_jobs"]


def scans_of_jobs_that_can_run(plan: dict) -> list[tuple[str, str | None]]:
    """scans_of_jobs, less those below a node whose condition the planner found false (never executed)."""
    if plan.get("One-Time Filter") == "false":
        return []
    own = [(plan["Node Type"], plan.get("Index Name"))] if plan.get("Relation Name") == "outboxq_jobs" else []
    return own + [scan for child in plan.get("Plans", []) for scan in scans_of_jobs_that_can_run(child)]


def assert_no_seq_scan(plan: dict) -> None:
    seq = [n for n in plan_nodes(plan) if n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "outboxq_jobs"]
    assert not seq, json.dumps(plan, indent=1)[:3000]


def test_the_claim_reads_the_claim_index(history):
    plan = plan_of(history, sql.job_claim_batch, {
        "queue": "emails", "limit": 500, "lease_token": uuid.uuid4(), "lease_s": 60.0, "worker_id": "w",
        "default_max_attempts": 25, **FROM_THE_FRONT,
    })
    assert_no_seq_scan(plan)
    assert ("Index Scan", "outboxq_jobs_claim_idx") in scans_of_jobs(plan) or \
        ("Index Only Scan", "outboxq_jobs_claim_idx") in scans_of_jobs(plan), scans_of_jobs(plan)


def test_completion_and_heartbeat_find_jobs_by_primary_key(history):
    running = history.execute("SELECT id, lease_token FROM outboxq_jobs WHERE status = 'running'").fetchall()
    params = {"ids": [r["id"] for r in running], "lease_tokens": [r["lease_token"] for r in running]}
    for statement, extra in ((sql.job_complete_batch, {}), (sql.job_heartbeat, {"lease_s": 60.0})):
        plan = plan_of(history, statement, {**params, **extra})
        assert_no_seq_scan(plan)
        assert any(index == "outboxq_jobs_pkey" for _, index in scans_of_jobs(plan)), scans_of_jobs(plan)


def test_rescue_reads_the_lease_index(history):
    plan = plan_of(history, sql.job_rescue_lock_expired, {"now": datetime.now(UTC), "limit": 1000})
    assert_no_seq_scan(plan)
    assert any(index == "outboxq_jobs_lease_idx" for _, index in scans_of_jobs(plan)), scans_of_jobs(plan)
    # (Over every queue, although the queue is the index's first column: the lease is its index condition, and
    # only the expired leases' rows are visited.)
    conditions = [n.get("Index Cond", "") for n in plan_nodes(plan) if n.get("Index Name") == "outboxq_jobs_lease_idx"]
    assert all("lease_expires_at <" in c for c in conditions), conditions


@pytest.mark.parametrize("status", [None, "running", "done"])
def test_the_listing_feed_reads_its_running_jobs_through_the_lease_index_and_the_rest_through_the_feed_index(
        history, status):
    plan = plan_of(history, sql.job_feed_page, {"queue": "emails", "after_xid": -1, "after_id": -1,
                                                "status": status, "limit": 100, "include_result": False})
    assert_no_seq_scan(plan)
    used = {i for _, i in scans_of_jobs_that_can_run(plan)}
    # (A status given leaves the planner the one part that can hold it.)
    wanted = {None: {"outboxq_jobs_feed_idx", "outboxq_jobs_lease_idx"}, "running": {"outboxq_jobs_lease_idx"},
              "done": {"outboxq_jobs_feed_idx"}}[status]
    assert used == wanted, scans_of_jobs(plan)


def test_the_feed_index_leaves_the_running_jobs_out_so_that_a_claim_writes_no_entry_there(conn):
    """A claim's new row versions (running) meet no predicate of the feed index (migration 0012)."""
    definition = conn.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'outboxq_jobs_feed_idx'").fetchone()
    assert definition["indexdef"].endswith("WHERE (status <> 'running'::text)"), definition


@pytest.mark.parametrize("name", ["spark_source_id_range", "spark_stream_newest_job"])
def test_the_spark_sources_bounds_of_a_small_queue_read_its_own_entries_not_the_whole_history(history, name):
    """A small queue beside a large one: its least and greatest ids come from its own range of the feed index
    (and the lease index for its running jobs), not from a walk of the primary key over the other queue's jobs."""
    history.execute("INSERT INTO outboxq_jobs (queue, status, payload) SELECT 'tiny', 'queued', '{}'::jsonb "
                    "FROM generate_series(1, 20)")
    history.commit()
    history.autocommit = True
    history.execute("ANALYZE outboxq_jobs")
    history.autocommit = False
    plan = plan_of(history, getattr(spark_stream_sql, name), {
        "queue": "tiny", "id_from": 0, "id_to": 2**63 - 1, "statuses": None, "created_from": None,
        "created_to": None, "finished_from": None, "finished_to": None})
    assert_no_seq_scan(plan)
    assert {i for _, i in scans_of_jobs(plan)} <= {"outboxq_jobs_feed_idx", "outboxq_jobs_lease_idx"}, \
        scans_of_jobs(plan)


@pytest.mark.parametrize("name", ["metrics_unfinished_counts", "metrics_queue_lag"])
def test_metrics_statements_never_scan_the_finished_history(history, name):
    plan = plan_of(history, getattr(sql, name), {})
    assert_no_seq_scan(plan)
    assert scans_of_jobs(plan) and all(index is not None for _, index in scans_of_jobs(plan)), scans_of_jobs(plan)


@pytest.fixture
def error_history(history):
    """Beside the finished jobs: 100,000 old error rows (failed attempts of those jobs), then ANALYZE."""
    history.execute("""
        INSERT INTO outboxq_job_errors (job_id, attempt, error, failed_at)
        SELECT id, 1, 'boom', now() - interval '3 days' FROM outboxq_jobs WHERE status = 'dead' LIMIT 100000
    """)
    history.commit()
    history.autocommit = True
    history.execute("ANALYZE outboxq_job_errors")
    history.autocommit = False
    return history


def assert_no_seq_scan_of_history(plan: dict) -> None:
    seq = [n for n in plan_nodes(plan) if n["Node Type"] == "Seq Scan"
           and n.get("Relation Name") in ("outboxq_jobs", "outboxq_job_errors")]
    assert not seq, json.dumps(plan, indent=1)[:3000]


@pytest.mark.parametrize(("name", "params"), [
    ("queue_counts", {"finished_window_s": 86400.0}),
    ("stats_retries", {"since": datetime.now(UTC) - timedelta(days=1), "queue": None}),
    ("stats_processing_time", {"since": datetime.now(UTC) - timedelta(days=1), "queue": None}),
    ("stats_throughput", {"now": datetime.now(UTC), "minutes": 60, "queue": None}),
])
def test_the_queue_listing_and_stats_read_unfinished_jobs_and_a_window_of_history_only(error_history, name,
                                                                                       params):
    plan = plan_of(error_history, getattr(sql, name), params)
    assert_no_seq_scan_of_history(plan)
    scanned = [(n["Node Type"], n.get("Index Name")) for n in plan_nodes(plan)
               if n.get("Relation Name") in ("outboxq_jobs", "outboxq_job_errors")]
    assert scanned and all(index is not None for _, index in scanned), scanned


KEYS = 10_000


@pytest.fixture
def many_keys(history):
    """Beside the history: a per-key queue with 10,000 distinct limit keys (two ready jobs each) and 100 running
    jobs, its limits row, then ANALYZE."""
    history.execute("""
        INSERT INTO outboxq_jobs (queue, status, payload, limit_key)
        SELECT 'tenants', 'queued', '{}'::jsonb, 'tenant-' || (i %% %s) FROM generate_series(1, %s) AS i
    """, (KEYS, 2 * KEYS))
    history.execute("""
        INSERT INTO outboxq_jobs (queue, status, payload, limit_key, lease_token, lease_expires_at, attempts)
        SELECT 'tenants', 'running', '{}'::jsonb, 'tenant-' || i, gen_random_uuid(), now() + interval '1 min', 1
        FROM generate_series(1, 100) AS i
    """)
    history.execute("INSERT INTO outboxq_queue_limits (queue, global_concurrency, per_key) VALUES ('tenants', 2, true)")
    history.commit()
    history.autocommit = True
    history.execute("ANALYZE outboxq_jobs")
    history.autocommit = False
    return history


def analyzed(conn, statement: str, params: dict) -> dict:
    """EXPLAIN (ANALYZE, FORMAT JSON): the statement runs, then its transaction is rolled back."""
    rows = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, params).fetchall()
    conn.rollback()
    return rows[0]["QUERY PLAN"][0]["Plan"]


def reads_of_jobs(plan: dict) -> list[tuple[str, str | None]]:
    """The scans of outboxq_jobs (not the UPDATE's ModifyTable node) with their index."""
    return [(node, index) for node, index in scans_of_jobs(plan) if "Scan" in node]


def rows_read_from_jobs(plan: dict) -> int:
    return sum(n.get("Actual Rows", 0) * n.get("Actual Loops", 1) for n in plan_nodes(plan)
               if n.get("Relation Name") == "outboxq_jobs" and "Scan" in n["Node Type"])


def test_the_per_key_claim_with_10000_keys_is_index_driven_and_reads_only_the_keys_it_serves(many_keys):
    from outboxq.queue import limits
    from outboxq.queue.sql import limits as limits_sql

    limit = 500  # what a worker asks with a full batch
    max_keys = limits.key_budget(limit)
    params = {"queue": "tenants", "limit": limit, "lease_token": uuid.uuid4(), "lease_s": 60.0, "worker_id": "w",
              "default_max_attempts": 25, "after_key": "tenant-5000", "max_keys": max_keys, "reserve": 0}
    plan = analyzed(many_keys, limits_sql.job_claim_limited_per_key, params)
    assert_no_seq_scan(plan)
    scans = reads_of_jobs(plan)
    assert all(index is not None for _, index in scans), [s for s in scans if s[1] is None]
    assert {"outboxq_jobs_limit_key_idx", "outboxq_jobs_lease_idx", "outboxq_jobs_pkey"} <= {i for _, i in scans}
    # It walks at most max_keys keys (one index probe each) and the jobs it claims: never all 10,000 keys, the
    # 20,000 ready jobs or the 200,000 finished ones.
    assert rows_read_from_jobs(plan) <= 2 * max_keys + 2 * limit + 100, rows_read_from_jobs(plan)
    claimed = plan["Actual Rows"]
    assert claimed == limit  # each key gives at most its two, one per turn: 500 keys served


@pytest.mark.parametrize("name", ["job_claim_limited", "queue_limits_usage"])
def test_the_limited_claim_and_the_usage_never_scan_the_finished_history(many_keys, name):
    from outboxq.queue.sql import limits as limits_sql

    many_keys.execute("INSERT INTO outboxq_queue_limits (queue, global_concurrency) VALUES ('emails', 10)")
    many_keys.commit()
    plan = plan_of(many_keys, getattr(limits_sql, name), {
        "queue": "emails", "limit": 500, "lease_token": uuid.uuid4(), "lease_s": 60.0, "worker_id": "w",
        "default_max_attempts": 25, **FROM_THE_FRONT, "reserve": 0})
    assert_no_seq_scan(plan)
    assert reads_of_jobs(plan) and all(index is not None for _, index in reads_of_jobs(plan)), reads_of_jobs(plan)


def test_the_workers_claims_and_writes_are_planned_once_per_connection_and_read_indexes_once_the_table_grows(
        db_url):
    """The dispatcher's and the completer's connections run their statements with their generic plan
    (sql.session_generic_plans): planned once, not at every claim and every write of a few outcomes. Made while
    the table held 30 jobs, where a sequential scan is cheapest, those plans still read the claim index and the
    primary key once it holds 20,000 more."""
    from outboxq import enqueue_many
    from outboxq.workers.executor import Outcome
    from outboxq.workers.registry import Consumer
    from outboxq.workers.runner import Worker

    consumer = Consumer("plans", lambda payload: None)
    with psycopg.connect(db_url) as conn:
        enqueue_many(conn, "plans", [{} for _ in range(30)])
        conn.commit()
    worker = Worker([consumer], url=db_url, run_maintenance=False, listen=False)
    with worker.state.connect_for_claims() as claims, worker.state.connect_for_completions() as writes:
        for _ in range(12):
            [job] = worker.claim(claims, consumer, 1)
            worker.write_outcomes(writes, [Outcome(job=job, succeeded=True)])
        with psycopg.connect(db_url) as conn:
            enqueue_many(conn, "plans", [{} for _ in range(20_000)])
            conn.commit()
        # Prepared at their first run: the 12 claims and 12 completions all ran a generic plan (the claim is
        # prepared twice: the first, from the front of the index, sends its cursor as untyped NULLs).
        counts = [c.execute("SELECT sum(generic_plans) AS generic_plans, sum(custom_plans) AS custom_plans "
                            "FROM pg_prepared_statements WHERE statement LIKE %s", (f"%{marker}%",)).fetchone()
                  for c, marker in ((claims, "fresh AS ("), (writes, "done AS ("))]
        assert all(row["custom_plans"] == 0 and row["generic_plans"] == 12 for row in counts), counts
        claims.autocommit = False
        claim_plans = explain_prepared(claims, sql.job_claim_batch, {
            "queue": "plans", "limit": 100, "lease_token": uuid.uuid4(), "lease_s": 60.0, "worker_id": "w",
            "default_max_attempts": 25, **FROM_THE_FRONT})
        claims.rollback()
        complete_plans = explain_prepared(writes, sql.job_complete_batch, {"ids": "{1,2}", "lease_tokens": "{}"})
        writes.rollback()
    # Only the indexes meant for them (none that grows with the history, as the feed index would).
    allowed = {"claim": {"outboxq_jobs_claim_idx", "outboxq_jobs_retry_idx", "outboxq_jobs_lease_idx",
                         "outboxq_jobs_pkey", "outboxq_queues_pkey"},
               "complete": {"outboxq_jobs_pkey", "outboxq_jobs_waiting_idx", "outboxq_job_dependencies_pkey",
                            "outboxq_job_dependencies_depends_on_idx"}}
    assert len(claim_plans) == 2 and len(complete_plans) == 1  # (the claim from the front and from its cursor)
    for name, plan, index in [("claim", plan, "outboxq_jobs_claim_idx") for plan in claim_plans] + [
            ("complete", plan, "outboxq_jobs_pkey") for plan in complete_plans]:
        assert_no_seq_scan(plan)
        used = {n["Index Name"] for n in plan_nodes(plan) if n.get("Index Name")}
        assert index in used and used <= allowed[name], (name, used)


def test_a_workflows_detail_and_the_workflow_listing_read_its_steps_through_the_workflow_index(conn):
    """Beside 200,000 finished workflow steps (50,000 workflows), one workflow's steps and the newest
    workflows' counts are index lookups by workflow, never a scan of the jobs."""
    conn.execute("INSERT INTO outboxq_workflows (name, steps) SELECT 'w' || g, 4 FROM generate_series(1, %s) g",
                 (HISTORY // 4,))
    conn.execute("""
        INSERT INTO outboxq_jobs (queue, status, payload, workflow_id, step, finished_at)
        SELECT 'hist', 'done', '{}'::jsonb, w.id, s.step, now()
        FROM outboxq_workflows w, unnest(ARRAY['fetch', 'left', 'right', 'join']) AS s(step)""")
    conn.commit()
    conn.autocommit = True
    conn.execute("ANALYZE")
    conn.autocommit = False
    middle = HISTORY // 8
    for statement, params in ((sql.workflow_steps, {"id": middle}),
                              (sql.workflow_list, {"limit": 50, "before": None}),
                              (sql.workflow_list, {"limit": 50, "before": middle}),
                              (sql.workflow_cancel_steps, {"id": middle}),
                              (sql.workflow_retry_steps, {"id": middle})):
        plan = plan_of(conn, statement, params)
        assert_no_seq_scan(plan)
        assert ("Index Scan", "outboxq_jobs_workflow_step_idx") in scans_of_jobs(plan) or \
            ("Bitmap Index Scan", "outboxq_jobs_workflow_step_idx") in [
                (n["Node Type"], n.get("Index Name")) for n in plan_nodes(plan)], json.dumps(plan, indent=1)[:3000]


@pytest.mark.parametrize("params", [
    {"statuses": ["running"], "queue": "emails"},
    {"payload": '{"customer": "nobody"}'},
    {"error": "never", "key_prefix": "order-"},
])
def test_the_operators_search_walks_a_bounded_window_of_the_newest_jobs(history, params):
    """Beside 200,000 finished jobs, a search reads an index: the one for its status or key, or the primary key
    backwards from the newest job down to the window's floor; never the whole table, whatever its filter."""
    base = {"queue": None, "statuses": None, "key_prefix": None, "payload": None, "error": None, "since": None,
            "until": None, "before": None, "floor": HISTORY - 100_000, "limit": 50}
    plan = plan_of(history, sql.job_search, {**base, **params})
    assert_no_seq_scan(plan)
    scans = [n for n in plan_nodes(plan) if n.get("Relation Name") == "outboxq_jobs"]
    # (a status or key filter may take the index made for it; a content search walks the window by id)
    assert scans and all(n["Node Type"] in ("Index Scan", "Bitmap Heap Scan") for n in scans), \
        json.dumps(plan, indent=1)[:3000]
    if "payload" in params:
        assert scans[0].get("Index Name") == "outboxq_jobs_pkey" and "id >" in scans[0]["Index Cond"], scans[0]


def test_a_limited_queues_count_of_running_jobs_reads_only_its_own_in_the_lease_index(history):
    """Beside 5,000 running jobs of another queue, a limited claim counts the queue's running jobs through the
    lease index with the queue as its condition (migration 0013): before, it read every queue's running jobs."""
    history.execute("""INSERT INTO outboxq_jobs (queue, status, payload, lease_token, lease_expires_at, attempts)
                       SELECT 'busy', 'running', '{}'::jsonb, gen_random_uuid(), now() + interval '1 min', 1
                       FROM generate_series(1, 5000)""")
    history.execute("INSERT INTO outboxq_queue_limits (queue, global_concurrency) VALUES ('emails', 10)")
    history.commit()
    history.autocommit = True
    history.execute("ANALYZE outboxq_jobs")
    history.autocommit = False
    params = {"queue": "emails", "limit": 10, "reserve": 0, "lease_token": uuid.uuid4(), "lease_s": 60.0,
              "worker_id": "w", "default_max_attempts": 25, **FROM_THE_FRONT}
    plan = plan_of(history, limits_sql.job_claim_limited, params)
    assert_no_seq_scan(plan)
    counts = [n for n in plan_nodes(plan) if n.get("Index Name") == "outboxq_jobs_lease_idx"]
    assert counts and all("(queue = 'emails'::text)" in n.get("Index Cond", "") for n in counts), counts
    # And when run: the count visits the queue's 50 running jobs, not the other queue's 5,000.
    rows = history.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + limits_sql.job_claim_limited, params).fetchall()
    history.rollback()
    ran = [n for n in plan_nodes(rows[0]["QUERY PLAN"][0]["Plan"]) if n.get("Index Name") == "outboxq_jobs_lease_idx"]
    assert ran and all(n["Actual Rows"] + n.get("Rows Removed by Filter", 0) <= 50 for n in ran), ran
