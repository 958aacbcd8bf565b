"""Secrets kept in PostgreSQL, made once and shared by every process (the listing markers' key)."""

from __future__ import annotations

import secrets
from typing import Any

from outboxq.queue import sql

MARKER_SECRET = "marker"


def shared_secret(conn: Any, name: str) -> bytes:
    """The secret `name`, created (32 random bytes, hex) by the first process that asks; committed."""
    for _ in range(2):  # the second read sees the row a racing first writer committed
        row = conn.execute(sql.secret_get_or_create, {"name": name, "value": secrets.token_hex(32)}).fetchone()
        conn.commit()
        if row is not None:
            return (row["value"] if isinstance(row, dict) else row[0]).encode()
    raise RuntimeError(f"the shared secret {name!r} could not be read")
