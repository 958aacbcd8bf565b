"""Where a 1,000-job batch request's time goes: `POST /v1/queues/{q}/jobs/batch` against the API in a child
process whose phases are timed, alternating with the same enqueue_many through Python (what `python -m tools bench
enqueue` compares).

    python bench/http_phases.py [--database-url postgresql://...] [--requests 100] [--jobs 1000] [--minimal]

It creates a scratch database (on --database-url's server, else an embedded one), starts the API with timers
around its phases (an ASGI wrapper marking the body read and the answer sent; wrappers around the route's
functions), sends the requests, and prints the median of each phase in ms beside the Python path's time.
The phases: body read, FastAPI's dependencies (the body's validation among them; for a batch of payloads alone,
which the batch route answers directly, payloads_alone's look at the body instead), the hop to the thread pool,
getting a pooled connection, enqueue_many, the answer's JSON, COMMIT, rendering, sending; what remains of
the client's time is httpx's (sending the body orjson encoded, reading the answer). --minimal sends `Prefer:
return=minimal`: the answer is then the jobs' ids, not the jobs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_db import scratch_database, server_or_embedded  # noqa: E402

from tools.bench_http import api_process, free_port  # noqa: E402

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
            result = None
            try:
                result = function(*args, **kwargs)
                return result
            finally:
                times[name].append(time.perf_counter() - started)
                marks[name] = time.perf_counter()
                if name == "payloads_alone" and result is not None:
                    marks["solved"] = marks[name]  # (answered directly: no dependencies solved, the hop follows)

        setattr(module, name, wrapper)

    for name in ("payloads_alone", "check_dependency_count", "enqueue_many_written", "jobs_answer",
                 "idempotent_write"):
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
    parser.add_argument("--minimal", action="store_true", help="send Prefer: return=minimal (answer: the ids)")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # the child
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return 0
    server_url = server_or_embedded(args.database_url, "outboxq-phases-")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with scratch_database(server_url, "outboxq_phases") as url:
        env = {**os.environ, "DATABASE_URL": url, "OUTBOXQ_API_TOKENS": f"{TOKEN}:admin", "PYTHONPATH": str(ROOT)}
        with api_process([sys.executable, __file__, "--serve", str(port)], env, base, ROOT):
            return measure(args, base, url)


def measure(args: argparse.Namespace, base: str, url: str) -> int:
    """The requests, alternating with enqueue_many through Python; print the phases' medians."""
    from outboxq.queue.enqueue import enqueue_many

    body = {"jobs": [{"payload": {"i": i}} for i in range(args.jobs)]}
    payloads = [job["payload"] for job in body["jobs"]]
    http_s, python_s = [], []
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    if args.minimal:
        headers["Prefer"] = "return=minimal"
    with httpx.Client(base_url=base, headers=headers, timeout=60) as client, psycopg.connect(url) as conn:
        for i in range(args.requests + 3):  # the first three warm up
            started = time.perf_counter()
            # The client encodes each request's body with orjson, as a client that sends batches for speed would
            # (httpx's json= is the standard library's json.dumps: 0.7 ms of a 1,000-job body).
            client.post("/v1/queues/phases/jobs/batch", content=orjson.dumps(body)).raise_for_status()
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

if __name__ == "__main__":
    sys.exit(main())
