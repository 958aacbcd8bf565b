"""What the HTTP benchmarks share (`bench enqueue`'s HTTP figure, bench/http_ab.py and the other bench scripts
that load an API): a free port, an API process that is ready, and a batch request sent and its answer read.

The timed client is the standard library's http.client on a kept-alive connection: httpx's own handling of a
1,000-job answer (454 KB, through its pure-Python HTTP parser) took 1.4 ms of a 10 ms request on a fast machine,
a cost of the client that the route's figure is not about (bench/README.md, results of 2026-12-07)."""

from __future__ import annotations

import http.client
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

import orjson

from tools.bench_drivers import QUEUE

BENCH_BATCH_PATH = f"/v1/queues/{QUEUE}/jobs/batch"  # (the benchmarks' queue)
HTTP_ROUNDS = 30  # alternated rounds of `bench enqueue`'s HTTP figures (about 10 ms a request): medians of 30


class BatchRefused(RuntimeError):
    """A batch request answered with something else than 201."""


def free_port() -> int:
    """A loopback TCP port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ready(base: str) -> bool:
    """Whether GET `base`/readyz answers 200 now."""
    address = urlsplit(base)
    try:
        with closing(http.client.HTTPConnection(address.hostname or "127.0.0.1", address.port, timeout=1)) as probe:
            probe.request("GET", "/readyz")
            return probe.getresponse().status == 200
    except OSError:
        return False


@contextmanager
def api_process(command: list[str], env: dict[str, str], base: str, cwd: Path,
                stdout: IO[Any] | None = None) -> Iterator[subprocess.Popen]:
    """The API started by `command` (its output to `stdout`, else inherited), once GET `base`/readyz answers 200
    (a RuntimeError after 60 s or when the process ends first); terminated at the end (killed after 30 s)."""
    server = subprocess.Popen(command, env=env, cwd=cwd, stdout=stdout,
                              stderr=subprocess.STDOUT if stdout is not None else None)
    try:
        deadline = time.monotonic() + 60
        while not _ready(base):
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("the API did not become ready")
            time.sleep(0.1)
        yield server
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def batch_headers(token: str, *, minimal: bool = False) -> dict[str, str]:
    """The headers of a batch request: the token, JSON, and `Prefer: return=minimal` when `minimal`."""
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    return {**headers, "Prefer": "return=minimal"} if minimal else headers


def post_batch(connection: http.client.HTTPConnection, body: dict[str, Any], headers: dict[str, str]) -> bytes:
    """POST a batch body to BENCH_BATCH_PATH on a kept-alive connection, encoded by orjson (as a client sending
    batches for speed would: the encoding is part of the client's time), and read the whole answer; its bytes.
    BatchRefused unless it answers 201."""
    connection.request("POST", BENCH_BATCH_PATH, body=orjson.dumps(body), headers=headers)
    response = connection.getresponse()
    answer = response.read()
    if response.status != 201:
        raise BatchRefused(f"POST {BENCH_BATCH_PATH} answered {response.status}: {answer[:300]!r}")
    return answer
