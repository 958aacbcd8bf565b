"""Maintenance leadership: a session advisory lock held by the leading worker's maintenance connection."""

from __future__ import annotations

# Session-level advisory lock (class MAINTENANCE_LOCK_CLASS, key: hash of the instance's lock name) held by the
# leading worker's maintenance connection; PostgreSQL releases it when that connection ends.
MAINTENANCE_LOCK_CLASS = 7291

maintenance_leader_try = f"""
SELECT pg_try_advisory_lock({MAINTENANCE_LOCK_CLASS}, hashtext(%(name)s)) AS leader
"""

maintenance_leader_pid = f"""
SELECT pid FROM pg_locks
WHERE locktype = 'advisory' AND granted AND objsubid = 2 AND classid = {MAINTENANCE_LOCK_CLASS}::oid
  AND objid = (hashtext(%(name)s)::bigint & 4294967295)::oid
"""
