"""`serve` as a separate process, spoken to over real HTTP on 127.0.0.1."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from outboxq.client import Client, Conflict, Forbidden
from tests.api_support import job_count

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(db_url: str, tmp_path: Path, tokens: str | None) -> tuple[subprocess.Popen, str, Path]:
    port = _free_port()
    env = {**os.environ, "DATABASE_URL": db_url, "OUTBOXQ_HOST": "127.0.0.1", "OUTBOXQ_PORT": str(port)}
    env.pop("OUTBOXQ_API_TOKENS", None)
    if tokens is not None:
        env["OUTBOXQ_API_TOKENS"] = tokens
    log = tmp_path / f"api-{port}.log"
    process = subprocess.Popen([sys.executable, "-c", "from outboxq.api.server import main; main()"], cwd=ROOT,
                               env=env, stdout=subprocess.DEVNULL, stderr=log.open("w"))
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text()
        try:
            if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                return process, base, log
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    process.kill()
    pytest.fail("the API did not become ready: " + log.read_text())


def _stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def test_served_api_over_real_http(db_url, tmp_path):
    process, base, log = _start(db_url, tmp_path, "served-admin-token:admin,served-reader-token:read")
    try:
        with Client(base, "served-admin-token", retries=0) as client:
            job = client.enqueue("served", {"n": 1}, key="one")
            assert job.status == "queued" and client.get_job(job.id).payload == {"n": 1}
            with pytest.raises(Conflict):
                client.enqueue("served", {"n": 2}, key="one")
            jobs = client.enqueue_many("served", [1, 2, 3])
            page = client.list_jobs("served", limit=2)
            rest = client.list_jobs("served", limit=10, marker=page.next_marker)
            assert [j.id for j in page.items + rest.items] == [job.id, *[j.id for j in jobs]]
            client.pause("served")
            assert {q["queue"]: q["paused"] for q in client.queues()}["served"] is True
        with Client(base, "served-reader-token", retries=0) as reader:
            with pytest.raises(Forbidden):
                reader.enqueue("served", 1)
        r = httpx.post(f"{base}/v1/queues/served/jobs", content=b"{oops", timeout=5,
                       headers={"Authorization": "Bearer served-admin-token", "Content-Type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "malformed_json"
        assert httpx.get(f"{base}/metrics", timeout=5).status_code == 401  # a read token by default
        assert httpx.get(f"{base}/metrics", timeout=5,
                         headers={"Authorization": "Bearer served-reader-token"}).status_code == 200
        assert job_count(db_url) == 4
    finally:
        _stop(process)
    assert "served-admin" not in log.read_text() and "served-reader" not in log.read_text()


def test_served_api_generates_and_prints_an_admin_token_when_none_is_configured(db_url, tmp_path):
    process, base, log = _start(db_url, tmp_path, None)
    try:
        lines = log.read_text().splitlines()
        index = next(i for i, line in enumerate(lines) if "generated an admin token" in line)
        token = lines[index + 1].strip()
        assert httpx.get(f"{base}/v1/queues", timeout=5).status_code == 401
        r = httpx.post(f"{base}/v1/queues/q/pause", headers={"Authorization": f"Bearer {token}"}, timeout=5)
        assert r.status_code == 200
    finally:
        _stop(process)
    assert log.read_text().count(token) == 1


def test_the_dashboard_is_served_with_its_security_headers(db_url):
    from tests.api_support import api_client

    with api_client(db_url, None) as client:
        page = client.get("/ui/")
        script = client.get("/ui/app.js")
        redirect = client.get("/ui", follow_redirects=False)
        missing = client.get("/ui/missing.js")
        api = client.get("/healthz")
    assert page.status_code == 200 and "<script src=\"app.js\">" in page.text
    assert redirect.status_code == 307 and missing.status_code == 404
    assert "content-security-policy" not in api.headers  # the dashboard's headers, on its paths only
    for response in (page, script, redirect, missing):
        assert "frame-ancestors 'none'" in response.headers["content-security-policy"]
        assert "default-src 'self'" in response.headers["content-security-policy"]
        assert response.headers["x-content-type-options"] == "nosniff"
