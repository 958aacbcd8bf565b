"""Retention also forgets old Idempotency-Keys (a retry later than the TTL enqueues anew)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from outboxq.workers.maintenance import prune


def test_prune_forgets_idempotency_keys_older_than_the_ttl(conn):
    conn.execute(
        "INSERT INTO outboxq_idempotency_keys (key, scope, request_hash, response_status, response_body, created_at) "
        "VALUES ('old', 's', 'h', 201, '{}', now() - interval '2 days'), ('new', 's', 'h', 201, '{}', now())"
    )
    conn.commit()
    prune.run_once(conn, now=datetime.now(UTC) + timedelta(minutes=1))
    keys = [r["key"] for r in conn.execute("SELECT key FROM outboxq_idempotency_keys").fetchall()]
    assert keys == ["new"]
