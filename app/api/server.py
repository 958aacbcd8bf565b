"""`outboxq serve`: wait for the database (bounded), then run the app with uvicorn."""

from __future__ import annotations

import gc
import logging
import secrets
import sys
from typing import Any

import psycopg
import uvicorn

from outboxq.api import create_app
from outboxq.api.auth import parse_tokens
from outboxq.db import database_url
from outboxq.errors import SchemaOutOfDate
from outboxq.queue.migrate import wait_until_current
from outboxq.settings import Settings, get_settings

log = logging.getLogger("outboxq.api")


def wait_for_database(url: str, timeout_s: float) -> bool:
    """Wait up to `timeout_s` for the database to answer with a current schema; False when it never did."""
    try:
        wait_until_current(url, timeout_s)
        return True
    except (psycopg.OperationalError, SchemaOutOfDate) as exc:
        log.warning("starting without a ready database (/readyz answers 503 until it is): %s", exc)
        return False


def ensure_token(settings: Settings) -> None:
    """When no token is configured, generate one admin token and print it once, so nothing runs open."""
    if parse_tokens(settings.api_tokens):
        return
    token = secrets.token_urlsafe(32)
    settings.api_tokens = f"{token}:admin"
    print(f"OUTBOXQ_API_TOKENS is not set; generated an admin token for this run:\n{token}",
          file=sys.stderr, flush=True)


def serve(settings: Settings | None = None) -> None:
    """Run the HTTP service on settings.host:settings.port until interrupted."""
    settings = settings or get_settings()
    ensure_token(settings)
    wait_for_database(database_url(settings), settings.db_wait_s)
    app = create_app(settings)
    # What the process has imported and built by now lives as long as it does: frozen, the collector's full
    # collections no longer walk it. Those came every few large batches (whose objects live long enough to reach
    # the oldest generation), and cost far less frozen.
    gc.collect()
    gc.freeze()
    uvicorn.run(app, **uvicorn_options(settings))


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """The keyword arguments of uvicorn.run (uvicorn.Config) for `outboxq serve`.

    X-Forwarded-For and X-Forwarded-Proto count only from the addresses in OUTBOXQ_FORWARDED_ALLOW_IPS: the
    client address decides whom the failed-authentication throttle holds back, so a client that may set it
    could pick another's. Empty (the default) trusts nobody, where uvicorn's own default trusts 127.0.0.1 and
    FORWARDED_ALLOW_IPS from the environment.
    """
    trusted = [address.strip() for address in settings.forwarded_allow_ips.split(",") if address.strip()]
    # (http and loop stay "auto": httptools and uvloop, dependencies of outboxq, where they install.)
    return {"host": settings.host, "port": settings.port, "log_level": "info", "access_log": False,
            "timeout_graceful_shutdown": 10, "proxy_headers": bool(trusted), "forwarded_allow_ips": trusted}


def main() -> None:
    """Entry point for `python -m app.api.server` (and tests)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    serve(get_settings())


if __name__ == "__main__":
    main()
