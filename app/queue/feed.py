"""Commit-safe listing markers: page through a queue's jobs without ever skipping or repeating one.

Why not the id: ids are taken from a sequence before commit, so a transaction that started first may commit
last, and a job with a small id appears after a reader has already paged past it (the Zaqar problem).

The rule here: a page only holds jobs whose enqueuing transaction id (`created_xid`) is below the xmin of
the reader's snapshot. Every transaction below xmin has finished, so no job can ever appear below that line
later. Jobs are ordered by (created_xid, id) and the marker encodes the (created_xid, id) of the last job
handed out. A transaction still in progress holds the feed back until it finishes; that is intended.

The marker is opaque to clients and tamper-evident: an HMAC over the queue and the position.

The feed's statement is sql.job_feed_page (app/queue/sql/jobs.py).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from dataclasses import dataclass
from typing import Any

from psycopg.rows import dict_row

from outboxq.errors import InvalidInput, InvalidMarker
from outboxq.queue import sql
from outboxq.queue.enqueue import psycopg_connection, validate_queue_name
from outboxq.queue.jobs import Job, JobStatus

MARKER_VERSION = "1"


_MAC_BYTES = 16
MAX_PAGE_SIZE = 1000


@dataclass(frozen=True, slots=True)
class FeedItem:
    """A job of a page and the marker that resumes right after it."""

    job: Job
    marker: str


@dataclass(frozen=True, slots=True)
class FeedPage:
    """One page: its items, and the marker of the next page (None when the page is empty)."""

    items: list[FeedItem]
    next_marker: str | None


def _mac(secret: bytes, queue: str, body: str) -> bytes:
    return hmac.new(secret, f"{queue}\x00{body}".encode(), hashlib.sha256).digest()[:_MAC_BYTES]


def encode_marker(secret: bytes, queue: str, created_xid: int, job_id: int) -> str:
    """The opaque marker of position (created_xid, job_id) in `queue`."""
    body = f"{MARKER_VERSION}.{created_xid}.{job_id}"
    token = body.encode() + b"." + _mac(secret, queue, body)
    return base64.urlsafe_b64encode(token).decode().rstrip("=")


def decode_marker(secret: bytes, queue: str, marker: str) -> tuple[int, int]:
    """The (created_xid, job_id) of a marker, or InvalidInput when it is malformed, forged or of another queue."""
    invalid = InvalidMarker(
        "invalid marker: pass back a marker exactly as a listing of this queue returned it "
        "(or omit it to start from the beginning)"
    )
    if not isinstance(marker, str) or not 0 < len(marker) <= 200 or not marker.isascii():
        raise invalid
    try:
        raw = base64.urlsafe_b64decode(marker + "=" * (-len(marker) % 4))
    except (binascii.Error, ValueError):
        raise invalid from None
    # The body itself holds dots, and the MAC may too: split at the fixed MAC length.
    if len(raw) < _MAC_BYTES + 2 or raw[-_MAC_BYTES - 1 : -_MAC_BYTES] != b".":
        raise invalid
    body, mac = raw[: -_MAC_BYTES - 1], raw[-_MAC_BYTES:]
    try:
        text = body.decode("ascii")
    except UnicodeDecodeError:
        raise invalid from None
    if not hmac.compare_digest(mac, _mac(secret, queue, text)):
        raise invalid
    parts = text.split(".")
    if len(parts) != 3 or parts[0] != MARKER_VERSION or not all(p.isdigit() for p in parts[1:]):
        raise invalid
    created_xid, job_id = int(parts[1]), int(parts[2])
    if created_xid >= 2**63 or job_id >= 2**63:
        raise invalid
    # Only the canonical spelling is accepted (base64 padding bits and leading zeros cannot vary).
    if not hmac.compare_digest(marker.encode(), encode_marker(secret, queue, created_xid, job_id).encode()):
        raise invalid
    return created_xid, job_id


def list_page(
    conn: Any,
    secret: bytes,
    queue: str,
    *,
    marker: str | None = None,
    limit: int = 100,
    status: str | JobStatus | None = None,
    include_result: bool = True,
) -> FeedPage:
    """One page of `queue`'s committed jobs after `marker`, in enqueue-commit-safe order; without their results
    (None) unless `include_result`."""
    validate_queue_name(queue)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE_SIZE:
        raise InvalidInput(f"limit must be an integer from 1 to {MAX_PAGE_SIZE}")
    if status is not None:
        try:
            status = JobStatus(status).value
        except ValueError:
            raise InvalidInput(
                f"invalid status {status!r}: use one of {', '.join(s.value for s in JobStatus)}"
            ) from None
    after_xid, after_id = decode_marker(secret, queue, marker) if marker else (-1, -1)
    with psycopg_connection(conn).cursor(row_factory=dict_row) as cur:
        cur.execute(
            sql.job_feed_page,
            {"queue": queue, "after_xid": after_xid, "after_id": after_id, "status": status, "limit": limit,
             "include_result": include_result},
        )
        rows = cur.fetchall()
    items = []
    for row in rows:
        if row.get("payload") is None and row.get("payload_bytes") is not None:
            row["payload"] = bytes(row["payload_bytes"])
        items.append(FeedItem(Job.from_row(row), encode_marker(secret, queue, row["created_xid"], row["id"])))
    return FeedPage(items, items[-1].marker if items else None)
