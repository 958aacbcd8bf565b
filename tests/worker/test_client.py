"""app.client against the real app: typed results, error mapping, and retries that never enqueue twice."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import httpx
import psycopg
import pytest

from outboxq.client import AsyncClient, Client, Conflict, InvalidRequest, NotFound, Unauthorized
from tests.api_support import TOKENS, api_client, job_count


class LosesFirstResponses(httpx.BaseTransport):
    """Forwards every request to the app, but for the first `drops` POSTs throws the answer away and raises
    ReadError, as when the connection breaks after the server committed."""

    def __init__(self, inner: httpx.BaseTransport, drops: int = 1):
        self.inner, self.drops, self.posts = inner, drops, 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        if request.method == "POST":
            self.posts += 1
            if self.drops > 0:
                self.drops -= 1
                response.read()
                raise httpx.ReadError("connection lost after the server answered", request=request)
        return response


class AnswersUnavailableFirst(httpx.BaseTransport):
    """Answers 503 to the first request without reaching the app, then forwards."""

    def __init__(self, inner: httpx.BaseTransport):
        self.inner, self.failed = inner, False

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if not self.failed:
            self.failed = True
            return httpx.Response(503, json={"error": {"code": "unavailable", "message": "try later"}})
        return self.inner.handle_request(request)


def test_a_retry_after_a_lost_response_does_not_enqueue_twice(db_url):
    with api_client(db_url, scope=None) as app_client:
        transport = LosesFirstResponses(app_client._transport, drops=2)
        with Client("http://testserver", token=TOKENS["admin"], transport=transport, max_backoff_s=0.05) as client:
            job = client.enqueue("emails", {"to": "ann"}, key="welcome-ann")
            jobs = client.enqueue_many("emails", [{"n": 1}, {"n": 2}])
        assert transport.posts == 4  # two answers lost, each request retried with its Idempotency-Key
    assert job.key == "welcome-ann" and job.status == "queued"
    assert [j.payload for j in jobs] == [{"n": 1}, {"n": 2}]
    assert job_count(db_url) == 3


def test_the_client_retries_503_and_maps_errors_to_exceptions(db_url):
    with api_client(db_url, scope=None) as app_client:
        transport = AnswersUnavailableFirst(app_client._transport)
        with Client("http://testserver", token=TOKENS["admin"], transport=transport, max_backoff_s=0.05) as client:
            job = client.enqueue("emails", {"x": 1}, key="k")
            assert client.get_job(job.id).payload == {"x": 1}
            with pytest.raises(Conflict):
                client.enqueue("emails", {"x": 2}, key="k")
            with pytest.raises(InvalidRequest):
                client.enqueue("bad queue!", {})
            with pytest.raises(NotFound):
                client.get_job(999_999)
            client.pause("emails")
            assert any(q["queue"] == "emails" and q["paused"] for q in client.queues())
            client.resume("emails")
            assert client.cancel_job(job.id).status == "cancelled"
            assert client.retry_job(job.id).status == "queued"
            page = client.list_jobs("emails", limit=10)
            assert [j.id for j in page.items] == [job.id]
        with Client("http://testserver", token="wrong", transport=app_client._transport) as client:
            with pytest.raises(Unauthorized):
                client.get_job(job.id)


def test_wait_returns_once_the_job_is_finished(db_url):
    with api_client(db_url, scope=None) as app_client:
        with Client("http://testserver", token=TOKENS["admin"], transport=app_client._transport) as client:
            job = client.enqueue("emails", {})
            with psycopg.connect(db_url) as conn:
                conn.execute("UPDATE outboxq_jobs SET status = 'done', finished_at = now() WHERE id = %s", (job.id,))
            assert client.wait(job.id, timeout=5).status == "done"
            other = client.enqueue("emails", {})
            with pytest.raises(TimeoutError):
                client.wait(other.id, timeout=0.3, poll_s=0.1)


def test_async_client_enqueues_and_reads(db_url):
    with api_client(db_url, scope=None) as app_client:
        app = app_client.app

        async def scenario():
            transport = httpx.ASGITransport(app=app)
            async with AsyncClient("http://testserver", token=TOKENS["admin"], transport=transport) as client:
                job = await client.enqueue("emails", {"async": True}, priority=3)
                jobs = await client.enqueue_many("emails", [{"n": 1}])
                return await client.get_job(job.id), jobs

        job, jobs = asyncio.run(scenario())
    assert job.payload == {"async": True} and job.priority == 3 and len(jobs) == 1


def test_the_async_client_has_every_call_of_the_client_and_they_answer_alike(db_url):
    public = {name for name in dir(Client) if not name.startswith("_")} - {"close", "http"}
    assert public <= {name for name in dir(AsyncClient) if not name.startswith("_")}
    with api_client(db_url, scope=None) as app_client:
        app = app_client.app
        with Client("http://testserver", token=TOKENS["admin"], transport=app_client._transport) as client:
            ids = [client.enqueue("mail", {"n": n}).id for n in range(3)]
        with psycopg.connect(db_url) as conn:
            conn.execute("UPDATE outboxq_jobs SET status = 'dead', last_error = 'boom', finished_at = now() "
                         "WHERE id = %s", (ids[0],))

        async def scenario():
            transport = httpx.ASGITransport(app=app)
            async with AsyncClient("http://testserver", token=TOKENS["admin"], transport=transport) as aclient:
                page = await aclient.list_jobs("mail", limit=2)
                rest = await aclient.list_jobs("mail", limit=2, marker=page.next_marker)
                return page, rest, await aclient.queues(), await aclient.errors("mail"), await aclient.retry_queue("mail")

        page, rest, queues, errors, retried = asyncio.run(scenario())
    assert [j.id for j in page.items + rest.items] == ids  # two pages, through the marker
    assert {q["queue"]: q["counts"]["dead"] for q in queues} == {"mail": 1}
    assert [(j.id, j.last_error) for j in errors] == [(ids[0], "boom")] and retried == 1


def test_the_client_sends_every_job_option_of_the_http_api(db_url):
    from outboxq.api.schemas import JOB_DEFAULTS
    from outboxq.client import JOB_OPTIONS

    assert {*JOB_OPTIONS, "run_at", "depends_on"} == set(JOB_DEFAULTS)
    with api_client(db_url, scope=None) as app_client:
        with Client("http://testserver", token=TOKENS["admin"], transport=app_client._transport) as client:
            first = client.enqueue("emails", {"n": 1}, key="k", unique="active", limit_key="tenant-7")
            again = client.enqueue("emails", {"n": 2}, key="k", unique="active", on_conflict="ignore")
            waits = client.enqueue_many("emails", [{"n": 3}], depends_on=[("emails", "k")],
                                        on_dependency_failure="cancel", limit_key="tenant-8")
            window = client.enqueue("emails", {"n": 4}, key="w", unique=timedelta(minutes=5))
            in_window = client.enqueue("emails", {"n": 5}, key="w", unique=timedelta(minutes=5), on_conflict="ignore")
            with pytest.raises(TypeError, match="unknown enqueue options: colour"):
                client.enqueue("emails", {}, colour="red")
    assert again.id == first.id and in_window.id == window.id
    with psycopg.connect(db_url) as conn:
        rows = conn.execute("SELECT id, limit_key FROM outboxq_jobs ORDER BY id").fetchall()
    assert rows == [(first.id, "tenant-7"), (waits[0].id, "tenant-8"), (window.id, None)]
