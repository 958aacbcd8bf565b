"""Idempotency keys: a retried write with the same key and body gets the first response, nothing new written.

The key row is written in the same transaction as the write it protects, so either both exist or neither.
Concurrent requests with the same key are serialized with a transaction-level advisory lock: the second
waits for the first to commit, then finds its stored response.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from outboxq.errors import IdempotencyKeyReused, InvalidInput
from outboxq.queue import sql
from outboxq.queue.enqueue import psycopg_connection

MAX_KEY_LENGTH = 255
# Printable ASCII, no space at either end (HTTP would strip it): what the HTTP schema states too.
KEY_PATTERN = re.compile(r"^[!-~]([ -~]{0,253}[!-~])?$")


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """The response recorded for the first request with a key."""

    status: int
    body: Any


def validate_idempotency_key(key: str) -> str:
    """The key, or InvalidInput saying what a valid one looks like."""
    if not KEY_PATTERN.fullmatch(key):
        raise InvalidInput(f"invalid Idempotency-Key: use 1 to {MAX_KEY_LENGTH} printable ASCII characters, no "
                           "space at either end (a UUID is a good choice)")
    return key


def request_hash(body: Any) -> str:
    """A stable hash of a request body (key order does not matter)."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


def begin(conn: Any, scope: str, key: str, body_hash: str) -> StoredResponse | None:
    """Lock the key for this transaction; the stored response when it was used with the same body.

    Raises IdempotencyKeyReused when the key was used with another body.
    """
    validate_idempotency_key(key)
    with psycopg_connection(conn).cursor(row_factory=dict_row) as cur:
        cur.execute(sql.idempotency_lock, {"scope": scope, "key": key})
        cur.execute(sql.idempotency_get, {"scope": scope, "key": key})
        row = cur.fetchone()
    if row is None:
        return None
    if row["request_hash"] != body_hash:
        raise IdempotencyKeyReused(
            f"Idempotency-Key {key!r} was already used with a different request body; "
            "use a new key for a new request"
        )
    return StoredResponse(row["response_status"], row["response_body"])


def record(conn: Any, scope: str, key: str, body_hash: str, status: int, body: Any) -> None:
    """Store the response of the first request with this key, in the caller's transaction; `body` is its JSON
    value, or its UTF-8 JSON text as bytes (an answer rendered already)."""
    stored = Jsonb(body, dumps=bytes.decode) if isinstance(body, bytes) else Jsonb(body)
    with psycopg_connection(conn).cursor() as cur:
        cur.execute(
            sql.idempotency_insert,
            {"scope": scope, "key": key, "request_hash": body_hash, "response_status": status,
             "response_body": stored},
        )
