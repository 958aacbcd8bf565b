"""The API's edges: bodies too large, too full or nested too deep refused before they are parsed, wrong tokens
that never lock out a right one, limits of 0, the documentation pages' security headers, the bound on Spark
batches, what an enqueue-only token learns of a job holding its key, and listings without results."""

from __future__ import annotations

import base64
import hashlib
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import psycopg
import pytest
import uvicorn

from outboxq.api import create_app
from outboxq.errors import InvalidInput
from outboxq.queue import limits
from outboxq.queue.sql import spark as spark_sql
from outboxq.workers.registry import Consumer
from tests.api_support import TOKEN_SPEC, TOKENS, api_client, api_settings, auth, count, job_count
from tests.support import CHROMIUM, CHROMIUM_ARGS, wait_for

ROOT = Path(__file__).resolve().parents[2]
MiB = 1024 * 1024


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def served(db_url, tmp_path):
    """`outboxq.api.server.main` in a process of its own (default settings, the test tokens): its base URL and
    its process."""
    port = _free_port()
    env = {**os.environ, "DATABASE_URL": db_url, "OUTBOXQ_HOST": "127.0.0.1", "OUTBOXQ_PORT": str(port),
           "OUTBOXQ_API_TOKENS": TOKEN_SPEC}
    log = tmp_path / "api.log"
    process = subprocess.Popen([sys.executable, "-c", "from outboxq.api.server import main; main()"], cwd=ROOT,
                               env=env, stdout=subprocess.DEVNULL, stderr=log.open("w"))
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, log.read_text()
            try:
                if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the API did not become ready: " + log.read_text()
            time.sleep(0.1)
        yield base, psutil.Process(process.pid)
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _flood_body(jobs: int = 100_000, dicts: int = 100) -> bytes:
    """A batch body of `jobs` jobs whose payloads are `dicts` empty objects each: 30 MiB at the defaults, and ten
    million objects once parsed (each a Python dict: many times the bytes it took as JSON)."""
    job = b'{"payload":[' + b",".join([b"{}"] * dicts) + b"]}"
    return b'{"jobs":[' + b",".join([job] * jobs) + b"]}"


class _Watch:
    """While it runs: the server's largest resident memory, and the slowest of its /healthz answers."""

    def __init__(self, base: str, process: psutil.Process):
        self.base, self.process = base, process
        self.baseline = process.memory_info().rss
        self.peak, self.slowest, self.answers = self.baseline, 0.0, 0
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._memory), threading.Thread(target=self._health)]

    def __enter__(self) -> _Watch:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join()

    def _memory(self) -> None:
        while not self.stop.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(0.005)

    def _health(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self.stop.is_set():
                started = time.monotonic()
                answered = client.get(f"{self.base}/healthz").status_code == 200
                self.slowest = max(self.slowest, time.monotonic() - started if answered else float("inf"))
                self.answers += 1
                time.sleep(0.02)


# ---------------------------------------------------------------- 1. bodies too large or too full


def test_a_30_mib_batch_of_100k_jobs_is_refused_without_the_server_growing_or_stalling(served, db_url):
    base, process = served
    body = _flood_body()
    assert 29 * MiB < len(body) < 31 * MiB
    headers = {**auth("enqueue"), "Content-Type": "application/json"}
    with httpx.Client(timeout=60) as client:
        warm = client.post(f"{base}/v1/queues/flood/jobs/batch", json={"jobs": [{"payload": [{}] * 100}] * 10},
                           headers=headers)
        assert warm.status_code == 201, warm.text
        for name, content in (("with Content-Length", body), ("chunked", (body[i:i + MiB]
                                                                          for i in range(0, len(body), MiB)))):
            with _Watch(base, process) as watch:
                wait_for(lambda watch=watch: watch.answers >= 1, timeout=10)  # a /healthz answered before
                before = watch.answers
                refused = client.post(f"{base}/v1/queues/flood/jobs/batch", content=content, headers=headers)
                wait_for(lambda watch=watch, before=before: watch.answers >= before + 2, timeout=10)  # and after, the server still there
            assert refused.status_code in (413, 422), (name, refused.text)
            assert "max_batch_jobs" in refused.json()["error"]["message"], name
            assert watch.peak - watch.baseline < 256 * MiB, (name, (watch.peak - watch.baseline) / MiB)
            assert watch.answers >= 3 and watch.slowest < 1.0, (name, watch.answers, watch.slowest)
    assert job_count(db_url) == 10


def test_a_batch_of_too_many_jobs_is_refused_before_the_rest_of_its_body_is_even_sent(served):
    """The server answers once the jobs it has read are too many: the client has sent 2 MiB of 30."""
    base, _ = served
    body = _flood_body()
    port = int(base.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"POST /v1/queues/flood/jobs/batch HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Authorization: Bearer " + TOKENS["enqueue"].encode() + b"\r\n"
                     b"Content-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n")
        sock.sendall(body[:2 * MiB])
        answer = b""
        while b"max_batch_jobs" not in answer and (chunk := sock.recv(65536)):  # (the body may come apart)
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 422"), answer[:200]
    assert b"max_batch_jobs" in answer


@pytest.mark.parametrize("authorization, status", [(b"", b"401"), (b"Bearer not-a-configured-token-x", b"401"),
                                                   (b"Bearer " + TOKENS["read"].encode(), b"403")])
def test_a_request_that_may_not_be_served_is_refused_before_its_body_is_sent(served, authorization, status):
    base, _ = served
    port = int(base.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"POST /v1/queues/q/jobs/batch HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     + (b"Authorization: " + authorization + b"\r\n" if authorization else b"")
                     + b"Content-Type: application/json\r\nContent-Length: " + str(500 * MiB).encode() + b"\r\n\r\n")
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 " + status), answer[:200]


def test_a_batch_over_max_batch_jobs_in_a_small_body_is_a_422_naming_max_batch_jobs(db_url):
    with api_client(db_url, max_batch_jobs=5) as api:
        r = api.post("/v1/queues/q/jobs/batch", json={"jobs": [{"payload": i} for i in range(6)]})
        assert r.status_code == 422 and "max_batch_jobs" in r.json()["error"]["message"], r.text
        assert "5 jobs" in r.json()["error"]["message"] and "not 6" in r.json()["error"]["message"]
        # Jobs that are no objects are counted too, before each is validated.
        r = api.post("/v1/queues/q/jobs/batch", json={"jobs": [1] * 10_000})
        assert r.status_code == 422 and "max_batch_jobs" in r.json()["error"]["message"], r.text
        assert api.post("/v1/queues/q/jobs/batch", json={"jobs": [{"payload": i} for i in range(5)]}).status_code == 201
    assert job_count(db_url) == 5


def test_bodies_over_their_cap_are_413_from_content_length_or_as_soon_as_the_bytes_pass_it(db_url):
    # The caps: max_payload_bytes and 256 KiB (one job), max_batch_jobs times (max_payload_bytes and 4 KiB), and
    # 256 KiB (a batch): 264,144 and 292,624 bytes here.
    single, batch = 2000 + 256 * 1024, 5 * (2000 + 4096) + 256 * 1024
    with api_client(db_url, max_payload_bytes=2000, max_batch_jobs=5) as api:
        def post(path, size, chunked):
            body = b'{"payload": "' + b"x" * (size - 15) + b'"}'
            content = iter([body[:1000], body[1000:]]) if chunked else body
            return api.post(path, content=content, headers={"Content-Type": "application/json"})

        for chunked in (False, True):
            r = post("/v1/queues/q/jobs", single + 1, chunked)
            assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large", r.text
            assert f"over {single} bytes" in r.json()["error"]["message"]
            assert "max_payload_bytes" in r.json()["error"]["message"]
            r = post("/v1/queues/q/jobs/batch", batch + 1, chunked)
            assert r.status_code == 413 and f"over {batch} bytes" in r.json()["error"]["message"], r.text
            assert "max_batch_jobs" in r.json()["error"]["message"]
        # Within the batch cap, one job's body is held to what one job may take, before it is parsed.
        one = b'{"jobs": [{"payload": "' + b"x" * 280_000 + b'"}]}'
        r = api.post("/v1/queues/q/jobs/batch", content=one, headers={"Content-Type": "application/json"})
        assert r.status_code == 413 and "a batch of 1 jobs" in r.json()["error"]["message"], r.text
    assert job_count(db_url) == 0


# ---------------------------------------------------------------- 2. JSON nested too deep


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@pytest.mark.parametrize("depth", [1000, 3000])
def test_json_nested_deeper_than_max_json_depth_is_a_422_naming_it_on_every_json_route(db_url, depth):
    with api_client(db_url, raise_server_exceptions=False) as api:
        deep = _nested(depth)
        bodies = {"/v1/queues/q/jobs": b'{"payload": ' + deep + b"}",
                  "/v1/queues/q/jobs/batch": b'{"jobs": [{"payload": ' + deep + b"}]}",
                  "/v1/spark/batches": b'{"queue": "q", "processor": ' + deep + b', "output_table": "t"}'}
        for path, body in bodies.items():
            r = api.post(path, content=body, headers={"Content-Type": "application/json"})
            assert r.status_code == 422, (path, r.status_code, r.text[:300])
            assert r.json()["error"]["code"] == "json_too_deep"
            assert "64" in r.json()["error"]["message"] and "max_json_depth" in r.json()["error"]["message"]
        r = api.put("/v1/queues/q/limits", content=b'{"rate_limit": ' + deep + b"}",
                    headers={"Content-Type": "application/json"})
        assert r.status_code == 422 and "max_json_depth" in r.json()["error"]["message"], r.text
        # Unclosed, or in UTF-16 (which json.loads reads): refused the same.
        unclosed = api.post("/v1/queues/q/jobs", content=b'{"payload": ' + b"[" * depth,
                            headers={"Content-Type": "application/json"})
        assert unclosed.status_code == 422 and "max_json_depth" in unclosed.text, unclosed.text
        utf16 = api.post("/v1/queues/q/jobs", content=('{"payload": ' + "[" * depth + "]" * depth + "}").encode(
            "utf-16"), headers={"Content-Type": "application/json"})
        assert utf16.status_code == 422 and "max_json_depth" in utf16.text, utf16.text
    assert job_count(db_url) == 0


def test_json_within_max_json_depth_is_accepted_and_brackets_in_strings_do_not_count(db_url):
    with api_client(db_url) as api:
        payload = {"a": [[[[[[[["deep"]]]]]]]]}  # the body's depth is 10: {"payload": {"a": [[[[[[[[
        r = api.post("/v1/queues/q/jobs", json={"payload": payload})
        assert r.status_code == 201, r.text
        assert api.get(f"/v1/jobs/{r.json()['id']}").json()["payload"] == payload
        text = "[" * 3000 + '\\"{' * 100 + "]" * 10  # brackets, quotes and backslashes inside a string
        r = api.post("/v1/queues/q/jobs/batch", json={"jobs": [{"payload": text}, {"payload": {"t": text}}]})
        assert r.status_code == 201, r.text
        assert api.get(f"/v1/jobs/{r.json()['jobs'][1]['id']}").json()["payload"] == {"t": text}
    with api_client(db_url, max_json_depth=10) as strict:
        assert strict.post("/v1/queues/q/jobs", json={"payload": payload}).status_code == 201
        r = strict.post("/v1/queues/q/jobs", json={"payload": [payload]})
        assert r.status_code == 422 and "more than 10 levels" in r.json()["error"]["message"], r.text


# ---------------------------------------------------------------- 3. wrong tokens and the right one


def test_wrong_tokens_never_lock_out_a_right_token(db_url):
    with api_client(db_url, scope=None, auth_max_failures=60) as api:
        wrong = {"Authorization": "Bearer this-is-not-a-configured-token"}
        for _ in range(60):
            assert api.get("/v1/queues", headers=wrong).status_code == 401
        assert api.get("/v1/queues", headers=auth("admin")).status_code == 200
        refused = api.get("/v1/queues", headers=wrong)
        assert refused.status_code == 429 and int(refused.headers["Retry-After"]) > 0
        assert refused.json()["error"]["code"] == "too_many_failed_authentications"
        assert api.get("/v1/queues").status_code == 429  # no token, where one is needed: refused too
        assert api.get("/v1/queues", headers=auth("read")).status_code == 200
        assert api.post("/v1/queues/q/jobs", json={"payload": 1}, headers=auth("enqueue")).status_code == 201


@pytest.mark.parametrize("trusted, throttled", [("", True), ("127.0.0.1", False)])
def test_a_forged_x_forwarded_for_does_not_escape_the_throttle(db_url, trusted, throttled):
    """Served by uvicorn with proxy headers on and no proxy trusted (outboxq's default,
    OUTBOXQ_FORWARDED_ALLOW_IPS), a client cannot pick the address its wrong tokens count against. (Trusting
    127.0.0.1 shows the header would otherwise decide.)"""
    app = create_app(api_settings(db_url, auth_max_failures=3))
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, proxy_headers=True,
                                           forwarded_allow_ips=trusted, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline
            time.sleep(0.02)
        statuses = []
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            for n in range(8):
                headers = {"Authorization": "Bearer this-is-not-a-configured-token",
                           "X-Forwarded-For": f"203.0.113.{n + 1}"}
                statuses.append(client.get("/v1/queues", headers=headers).status_code)
            assert client.get("/v1/queues", headers=auth("read")).status_code == 200
    finally:
        server.should_exit = True
        thread.join(timeout=15)
    assert statuses == ([401] * 3 + [429] * 5 if throttled else [401] * 8)


# ---------------------------------------------------------------- 4. limits of 0


@pytest.mark.parametrize("body", [{"global_concurrency": 0}, {"rate_limit": "0/s"}, {"rate_limit": "000/h"},
                                  {"global_concurrency": 0, "rate_limit": "5/s"}])
def test_a_limit_of_zero_is_refused_with_a_422_saying_to_pause_instead(db_url, body):
    with api_client(db_url) as api:
        r = api.put("/v1/queues/zero/limits", json=body)
        assert r.status_code == 422, r.text
        assert "pause" in r.json()["error"]["message"], r.text
        # A per-key queue (limit_by): the same field is each key's limit.
        with psycopg.connect(db_url) as conn:
            limits.declare(conn, Consumer("tenants", lambda p: None, global_concurrency=3, limit_by="t").limits)
            conn.commit()
        r = api.put("/v1/queues/tenants/limits", json=body)
        assert r.status_code == 422 and "pause" in r.json()["error"]["message"], r.text
        assert api.get("/v1/queues/tenants/limits").json()["global_concurrency"] == 3
        assert api.get("/v1/queues/zero/limits").status_code == 404
        assert api.put("/v1/queues/zero/limits", json={"global_concurrency": 1, "rate_limit": "1/h"}).status_code == 200
        document = api.get("/openapi.json").json()["components"]["schemas"]["QueueLimitsChange"]["properties"]
    concurrency = [s for s in document["global_concurrency"]["anyOf"] if s.get("type") == "integer"]
    assert concurrency[0]["minimum"] == 1
    pattern = next(s["pattern"] for s in document["rate_limit"]["anyOf"] if s.get("type") == "string")
    assert not re.search(pattern, "0/s") and not re.search(pattern, "00/m") and re.search(pattern, "10/s")


def test_the_python_api_refuses_a_limit_of_zero_too(db_url):
    with psycopg.connect(db_url) as conn:
        for change in ({"global_concurrency": 0, "set_concurrency": True}, {"rate_limit": "0/m", "set_rate": True}):
            with pytest.raises(InvalidInput, match="pause"):
                limits.set_limits(conn, "zero", **change)
    for options in ({"global_concurrency": 0}, {"rate_limit": "0/s"}, {"global_concurrency": 0, "limit_by": "t"}):
        with pytest.raises(InvalidInput, match="pause"):
            Consumer("zero", lambda p: None, **options).limits  # noqa: B018
    assert Consumer("zero", lambda p: None, global_concurrency=1, rate_limit="1/s").limits.limited


# ---------------------------------------------------------------- 5. the documentation pages' headers


def test_docs_redoc_and_openapi_send_the_dashboards_security_headers(db_url):
    with api_client(db_url, None) as client:
        for path in ("/docs", "/redoc", "/docs/oauth2-redirect", "/openapi.json",
                     "/static-offline-docs/swagger-ui-bundle.js"):
            r = client.get(path)
            assert r.status_code == 200, path
            assert r.headers["x-content-type-options"] == "nosniff", path
            assert r.headers["x-frame-options"] == "DENY", path
            assert r.headers["referrer-policy"] == "no-referrer", path
            policy = r.headers["content-security-policy"]
            assert "frame-ancestors 'none'" in policy, path
            if path.endswith((".json", ".js")):
                assert policy.startswith("default-src 'none'"), path
                continue
            assert "default-src 'self'" in policy and "unsafe-inline" not in policy.split("script-src")[1].split(";")[0]
            # The page's own inline scripts run (allowed by their hashes), no other.
            scripts = re.findall(r"<script>(.*?)</script>", r.text, re.DOTALL)
            for script in scripts:
                digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
                assert f"'sha256-{digest}'" in policy, path
        assert "content-security-policy" not in client.get("/healthz").headers  # the API's JSON is left alone


def test_swagger_ui_and_redoc_work_under_their_policy(db_url):
    from playwright.sync_api import sync_playwright

    app = create_app(api_settings(db_url))
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run)
    thread.start()
    try:
        wait_for(lambda: server.started or not thread.is_alive(), timeout=30)
        assert server.started and thread.is_alive()
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            try:
                for path, rendered in (("/docs", ".swagger-ui .info .title"), ("/redoc", "h1")):
                    page = browser.new_page()
                    problems: list[str] = []
                    page.on("console", lambda m, problems=problems: m.type == "error" and problems.append(m.text))
                    page.on("pageerror", lambda e, problems=problems: problems.append(str(e)))
                    page.goto(f"http://127.0.0.1:{port}{path}")
                    page.wait_for_selector(rendered, timeout=20_000)
                    assert "outboxq" in page.inner_text(rendered)
                    page.wait_for_timeout(500)
                    # Only what comes from another host is blocked (ReDoc's logo from its CDN): nothing of the page.
                    assert [m for m in problems if "127.0.0.1" in m or "inline" in m or "eval" in m] == [], problems
            finally:
                browser.close()
    finally:
        server.should_exit = True
        thread.join(timeout=15)


# ---------------------------------------------------------------- 6. the bound on Spark batches


def test_spark_submissions_beyond_the_running_and_pending_bound_get_a_429_with_retry_after(db_url, monkeypatch):
    from outboxq.spark_jobs import batches

    launched: list[int] = []
    monkeypatch.setattr(batches, "launch_batch", lambda batch_id, settings=None: launched.append(batch_id))
    body = {"queue": "q", "processor": "totals", "output_table": "totals"}
    slots = [psycopg.connect(db_url, autocommit=True) for _ in range(2)]
    try:
        with api_client(db_url, spark_max_batches=2, spark_max_pending_batches=2,
                        spark_processors={"totals": "tests.spark_support:totals"}) as api:
            # Two batch processes hold the two slots (as running batches do), two more batches wait.
            for slot, conn in enumerate(slots):
                assert conn.execute(spark_sql.spark_batch_try_slot, {"slot": slot}).fetchone()[0] is True
            assert api.post("/v1/spark/batches", json=body).status_code == 202
            assert api.post("/v1/spark/batches", json=body).status_code == 202
            refused = api.post("/v1/spark/batches", json=body)
            assert refused.status_code == 429, refused.text
            assert int(refused.headers["Retry-After"]) > 0
            message = refused.json()["error"]["message"]
            assert "2 Spark batches are running" in message and "2 wait" in message
            assert "spark_max_batches" in message and "spark_max_pending_batches" in message
            # A slot freed (its batch's process ended, whatever its row says): one more may wait for it.
            slots.pop().close()
            # (its backend lets go of the slot's lock when it has exited, a moment after the close; a refused
            # submission writes nothing, so asking again until one is taken adds exactly one batch)
            wait_for(lambda: api.post("/v1/spark/batches", json=body).status_code == 202, timeout=30, interval=0.1)
            slots.append(psycopg.connect(db_url, autocommit=True))  # a waiting batch takes the slot
            assert slots[-1].execute(spark_sql.spark_batch_try_slot, {"slot": 1}).fetchone()[0] is True
            assert api.post("/v1/spark/batches", json=body).status_code == 429
    finally:
        for conn in slots:
            conn.close()
    assert len(launched) == 3
    assert count(db_url, "SELECT count(*) FROM outboxq_spark_batches WHERE state = 'pending'") == 3


# ---------------------------------------------------------------- 7. conflicts and the read scope


def _held_job(api, db_url) -> dict:
    """A job holding key "k" of queue q, done, with a result and an earlier error."""
    job = api.post("/v1/queues/q/jobs", json={"payload": {"card": "4111"}, "key": "k"}, headers=auth("admin")).json()
    count(db_url, "WITH u AS (UPDATE outboxq_jobs SET status = 'done', result = '{\"secret\": 1}', "
                  "last_error = 'boom at card 4111' WHERE id = %s RETURNING 1) SELECT count(*) FROM u", (job["id"],))
    return job


def test_an_ignored_conflict_shows_an_enqueue_only_token_only_the_jobs_id_and_status(db_url):
    with api_client(db_url, None) as api:
        held = _held_job(api, db_url)
        single = api.post("/v1/queues/q/jobs", json={"payload": 2, "key": "k", "on_conflict": "ignore"},
                          headers=auth("enqueue"))
        assert single.status_code == 200, single.text
        assert single.json() == {"id": held["id"], "queue": "q", "key": "k", "status": "done"}
        batch = api.post("/v1/queues/q/jobs/batch", headers=auth("enqueue"), json={"jobs": [
            {"payload": 3, "key": "k", "on_conflict": "ignore"}, {"payload": 4, "key": "new", "on_conflict": "ignore"}]})
        assert batch.status_code == 201, batch.text
        held_answer, new_answer = batch.json()["jobs"]
        assert held_answer == {"id": held["id"], "queue": "q", "key": "k", "status": "done"}
        assert new_answer["payload"] == 4 and new_answer["key"] == "new"  # its own job, in full
        # Per-job options (the batch is written job by job): the same.
        mixed = api.post("/v1/queues/q/jobs/batch", headers=auth("enqueue"), json={"jobs": [
            {"payload": 5, "key": "k", "on_conflict": "ignore", "priority": 1}, {"payload": 6, "priority": 2}]})
        assert mixed.status_code == 201 and mixed.json()["jobs"][0] == held_answer, mixed.text
        for text in (single.text, batch.text, mixed.text):
            assert "4111" not in text and "secret" not in text
    assert job_count(db_url) == 3


def test_an_ignored_conflict_shows_a_token_with_read_the_whole_job(db_url):
    with api_client(db_url, None) as api:
        held = _held_job(api, db_url)
        for scope in ("enqueue+read", "admin"):
            single = api.post("/v1/queues/q/jobs", json={"payload": 2, "key": "k", "on_conflict": "ignore"},
                              headers=auth(scope))
            assert single.status_code == 200, single.text
            assert single.json()["id"] == held["id"] and single.json()["payload"] == {"card": "4111"}
            assert single.json()["result"] == {"secret": 1} and "4111" in single.json()["last_error"]
            batch = api.post("/v1/queues/q/jobs/batch", headers=auth(scope),
                             json={"jobs": [{"payload": 3, "key": "k", "on_conflict": "ignore"}]})
            assert batch.json()["jobs"][0] == api.get(f"/v1/jobs/{held['id']}", headers=auth("read")).json()
    assert job_count(db_url) == 1


# ---------------------------------------------------------------- 8. listings without results


def test_listings_leave_results_out_unless_include_result_and_reading_a_job_has_it(db_url):
    with api_client(db_url) as api:
        ids = [api.post("/v1/queues/q/jobs", json={"payload": i}).json()["id"] for i in range(2)]
        count(db_url, "WITH u AS (UPDATE outboxq_jobs SET status = 'done', result = jsonb_build_object('n', id) "
                      "RETURNING 1) SELECT count(*) FROM u")
        # (A listing shows what every transaction older than its snapshot's has committed: wait for the server's.)
        wait_for(lambda: len(api.get("/v1/queues/q/jobs").json()["items"]) == 2)
        page = api.get("/v1/queues/q/jobs").json()
        assert [item["id"] for item in page["items"]] == ids
        assert all("result" not in item and item["payload"] is not None for item in page["items"])
        with_results = api.get("/v1/queues/q/jobs", params={"include": "result", "limit": 1})
        assert with_results.json()["items"][0]["result"] == {"n": ids[0]}
        rest = api.get("/v1/queues/q/jobs", params={"include": "result", "marker": with_results.json()["next_marker"]})
        assert rest.json()["items"][0]["result"] == {"n": ids[1]}
        assert api.get("/v1/queues/q/jobs", params={"status": "done"}).json()["items"][0].keys() == page["items"][0].keys()
        assert api.get("/v1/queues/q/jobs", params={"include": "payload"}).status_code == 422
        assert api.get(f"/v1/jobs/{ids[0]}").json()["result"] == {"n": ids[0]}
