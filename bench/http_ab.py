"""The HTTP batch route of another revision beside this checkout's, in the same moments: both APIs served side by
side, each round one 1,000-job batch request to each (with the jobs in the answer, then with `Prefer:
return=minimal`) and the same enqueue_many through Python; each one's median and its ratio to the Python path.
The requests go through the standard library's http.client on kept-alive connections, each body encoded by
orjson within its time (tools.bench_http.post_batch, as `bench enqueue` times the route; httpx's own parsing of
the answer cost 1.4 ms a request, not the route's: bench/README.md, 2026-12-07).

    python bench/http_ab.py [--database-url postgresql://...] [--base HEAD] [--rounds 40] [--jobs 1000]

The base revision is exported as `bench drain --variant` exports one (tools/bench_variants.py: it must share
this checkout's migrations) and its API runs with that export first on PYTHONPATH. Alternated request by
request, the two revisions meet the machine's changes of speed alike, which runs minutes apart do not.
"""

from __future__ import annotations

import argparse
import http.client
import os
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack, closing
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_db import scratch_database, server_or_embedded  # noqa: E402

from outboxq.queue.enqueue import enqueue_many  # noqa: E402
from tools.bench_drivers import QUEUE  # noqa: E402
from tools.bench_http import api_process, batch_headers, free_port, post_batch  # noqa: E402
from tools.bench_variants import prepare  # noqa: E402

TOKEN = "http-ab-token-long-enough"


def main() -> None:
    """Serve both revisions, alternate their requests with enqueue_many, print the medians and ratios."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url")
    parser.add_argument("--base", default="HEAD", help="the git revision to serve beside the checkout")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--jobs", type=int, default=1000, help="jobs per request")
    args = parser.parse_args()
    server_url = server_or_embedded(args.database_url, "outboxq-http-ab-")
    scratch = Path(tempfile.mkdtemp(prefix="outboxq-http-ab-"))
    base = prepare("base", args.base, scratch)
    payloads = [{"i": i} for i in range(args.jobs)]
    body = {"jobs": [{"payload": payload} for payload in payloads]}
    forms = {"": batch_headers(TOKEN), " minimal": batch_headers(TOKEN, minimal=True)}
    times: dict[str, list[float]] = {}
    with scratch_database(server_url, "outboxq_http_ab") as url, ExitStack() as stack:
        clients = {}
        for name, import_root in (("checkout", ""), (f"base {args.base}", str(base.import_root))):
            port = free_port()
            env = {**os.environ, "DATABASE_URL": url, "OUTBOXQ_API_TOKENS": f"{TOKEN}:admin",
                   "OUTBOXQ_PORT": str(port), "OUTBOXQ_HOST": "127.0.0.1", "PYTHONPATH": import_root}
            base_url = f"http://127.0.0.1:{port}"
            # (cwd outside the checkout: the base's API imports its own outboxq, not the checkout's.)
            stack.enter_context(api_process([sys.executable, "-m", "outboxq.api.server"], env, base_url,
                                            cwd=scratch))
            clients[name] = stack.enter_context(closing(http.client.HTTPConnection("127.0.0.1", port, timeout=60)))
        with psycopg.connect(url) as conn:
            for round_ in range(args.rounds + 2):  # (the first two warm both up)
                for name, client in clients.items():
                    for form, headers in forms.items():
                        started = time.perf_counter()
                        post_batch(client, body, headers)
                        if round_ >= 2:
                            times.setdefault(name + form, []).append(time.perf_counter() - started)
                started = time.perf_counter()
                enqueue_many(conn, QUEUE, payloads)
                conn.commit()
                if round_ >= 2:
                    times.setdefault("Python path (enqueue_many)", []).append(time.perf_counter() - started)
    python = statistics.median(times["Python path (enqueue_many)"])
    print(f"{args.rounds} rounds of {args.jobs}-job batches, medians in ms")
    for name, taken in times.items():
        median = statistics.median(taken)
        print(f"  {name:32s} {median * 1000:8.2f}   {python / median:.2f} of the Python path")


if __name__ == "__main__":
    main()
