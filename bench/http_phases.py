"""Where a 1,000-job batch request's time goes: `POST /v1/queues/{q}/jobs/batch` against the API in a child
process whose phases are timed, alternating with the same enqueue_many through Python (what `outboxq bench
enqueue` compares).

    python bench/http_phases.py [--database-url postgresql://...] [--requests 100] [--jobs 1000]

It creates a scratch database (on --database-url's server, else an embedded one), starts the API with timers
around its phases (an ASGI wrapper marking the body read and the answer sent; wrappers around the route's
functions), sends the requests, and prints the median of each phase in ms beside the Python path's time.
The phases: body read, FastAPI's dependencies (the body's validation among them), the hop to the thread pool,
getting a pooled connection, enqueue_many, the answer's JSON, COMMIT, rendering, sending; what remains of
the client's time is httpx's (encoding the body, reading the answer).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from outboxq.db import url_with_database  # noqa: E402
from outboxq.queue.migrate import upgrade  # noqa: E402

TOKEN = "phases-token-long-enough"


def serve(port: int) -> None:
    """The child: the API with its phases timed; GET /_phases answers their medians (ms)."""
    import fastapi.routing
    import uvicorn

    import outboxq.api.deps as deps
    import outboxq.api.routes.jobs as routes
    from outboxq.api import create_app

    times: dict[str, list[float]] = defaultdict(list)
    marks: dict[str, float] = {}

    def timed(module: Any, name: str) -> None:
        function = getattr(module, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            if name == "check_dependency_count":  # the route's first call: the thread-pool hop ends here
                times["hop to the thread pool"].append(started - marks["solved"])
            try:
                return function(*args, **kwargs)
            finally:
                times[name].append(time.perf_counter() - started)
                marks[name] = time.perf_counter()

        setattr(module, name, wrapper)

    for name in ("check_dependency_count", "enqueue_many", "jobs_public", "idempotent_write"):
        timed(routes, name)

    @contextmanager
    def transaction(pool: Any) -> Any:
        started = time.perf_counter()
        with pool.connection() as conn:
            times["pooled connection"].append(time.perf_counter() - started)
            yield conn
            committing = time.perf_counter()
        times["commit"].append(time.perf_counter() - committing)

    deps.transaction = transaction
    solve = fastapi.routing.solve_dependencies

    async def solve_timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        solved = await solve(*args, **kwargs)
        if isinstance(kwargs.get("body"), dict) and "jobs" in kwargs["body"]:
            marks["solved"] = time.perf_counter()
            times["dependencies and validation"].append(marks["solved"] - started)
        return solved

    fastapi.routing.solve_dependencies = solve_timed
    app = create_app()

    @app.get("/_phases")
    def phases() -> dict[str, float]:
        return {name: statistics.median(values) * 1000 for name, values in times.items()}

    async def measured(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].endswith("/batch"):
            return await app(scope, receive, send)
        started = time.perf_counter()

        async def receive_timed() -> Any:
            message = await receive()
            if not message.get("more_body"):
                times["body read"].append(time.perf_counter() - started)
            return message

        async def send_timed(message: Any) -> None:
            if message["type"] == "http.response.start":
                marks["answer"] = time.perf_counter()
                times["rendering"].append(marks["answer"] - marks["idempotent_write"])
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                ended = time.perf_counter()
                times["sending"].append(ended - marks["answer"])
                times["server, in all"].append(ended - started)

        await app(scope, receive_timed, send_timed)

    uvicorn.run(measured, host="127.0.0.1", port=port, log_level="warning")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url")
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--jobs", type=int, default=1000, help="jobs per request")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # the child
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return 0
    server_url = args.database_url
    if not server_url:
        from outboxq.embedded import start_embedded

        server_url = start_embedded(Path(tempfile.mkdtemp(prefix="outboxq-phases-")) / "pgdata",
                                    cleanup_mode="delete")
    name = f"outboxq_phases_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = url_with_database(server_url, name)
    upgrade(url)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "DATABASE_URL": url, "OUTBOXQ_API_TOKENS": f"{TOKEN}:admin", "PYTHONPATH": str(ROOT)}
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port)], env=env, cwd=ROOT)
    try:
        from outboxq.queue.enqueue import enqueue_many

        body = {"jobs": [{"payload": {"i": i}} for i in range(args.jobs)]}
        payloads = [job["payload"] for job in body["jobs"]]
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {TOKEN}"},
                          timeout=60) as client, psycopg.connect(url) as conn:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if client.get("/readyz").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline or server.poll() is not None:
                    print("the API did not become ready", file=sys.stderr)
                    return 1
                time.sleep(0.2)
            http_s, python_s = [], []
            for i in range(args.requests + 3):  # the first three warm up
                started = time.perf_counter()
                client.post("/v1/queues/phases/jobs/batch", json=body).raise_for_status()
                middle = time.perf_counter()
                enqueue_many(conn, "phases", payloads)
                conn.commit()
                if i >= 3:
                    http_s.append(middle - started)
                    python_s.append(time.perf_counter() - middle)
            phases = client.get("/_phases").json()
        http_ms, python_ms = statistics.median(http_s) * 1000, statistics.median(python_s) * 1000
        print(f"{args.requests} requests of {args.jobs} jobs, medians in ms")
        for phase, ms in phases.items():
            print(f"  {phase:<30} {ms:7.2f}")
        print(f"  {'client, in all':<30} {http_ms:7.2f}")
        print(f"  {'Python path (enqueue_many)':<30} {python_ms:7.2f}")
        print(f"HTTP / Python: {python_ms / http_ms:.2f}")
        return 0
    finally:
        server.terminate()
        server.wait(timeout=30)
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    sys.exit(main())
