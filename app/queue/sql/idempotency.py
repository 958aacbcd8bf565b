"""Idempotency-Key records of the HTTP API (app/queue/idempotency.py)."""

from __future__ import annotations

idempotency_lock = "SELECT pg_advisory_xact_lock(hashtextextended(%(scope)s || E'\\n' || %(key)s, 7001))"

idempotency_get = """
SELECT request_hash, response_status, response_body
FROM outboxq_idempotency_keys WHERE scope = %(scope)s AND key = %(key)s
"""

idempotency_insert = """
INSERT INTO outboxq_idempotency_keys (scope, key, request_hash, response_status, response_body)
VALUES (%(scope)s, %(key)s, %(request_hash)s, %(response_status)s, %(response_body)s)
"""

idempotency_key_prune = """
DELETE FROM outboxq_idempotency_keys WHERE created_at < %(before)s
"""
