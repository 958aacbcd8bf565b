"""A Python client for outboxq's HTTP API, sync (`Client`) and async (`AsyncClient`).

Every write carries an Idempotency-Key, generated once per call and reused on each retry, so a retry after
a lost response never enqueues twice. Transient failures (connection errors, 503, 429) are retried with
exponential backoff (tenacity).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from typing import Any

import httpx
from tenacity import (
    AsyncRetrying,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential_jitter,
)

from outboxq.errors import (
    ApiError,
    Conflict,
    Forbidden,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    Unauthorized,
    Unavailable,
)

FINISHED = ("done", "dead", "cancelled")
RETRY_STATUSES = (429, 502, 503, 504)


# ---------------------------------------------------------------- results


@dataclass(frozen=True)
class JobInfo:
    """A job as the API returns it."""

    id: int
    queue: str
    status: str
    key: str | None = None
    payload: Any = None
    attempts: int = 0
    max_attempts: int | None = None
    priority: int = 0
    run_at: str | None = None
    last_error: str | None = None
    created_at: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    marker: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobInfo:
        """Build from the API's JSON; fields this client does not know go to `extra`."""
        known = {f.name for f in fields(cls)} - {"extra"}
        return cls(**{k: v for k, v in data.items() if k in known},
                   extra={k: v for k, v in data.items() if k not in known})

    @property
    def finished(self) -> bool:
        """True once the job is done, dead or cancelled."""
        return self.status in FINISHED


@dataclass(frozen=True)
class JobPage:
    """One page of a queue's jobs and the marker of the next page (None at the end)."""

    items: list[JobInfo]
    next_marker: str | None


# ---------------------------------------------------------------- errors (defined in outboxq.errors)




_BY_STATUS = {400: InvalidRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Conflict,
              413: PayloadTooLarge, 422: InvalidRequest, 429: Unavailable, 503: Unavailable}


def _raise_for(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        error = response.json().get("error", {})
        code, message = error.get("code", "error"), error.get("message", response.text)
    except (ValueError, AttributeError):
        code, message = "error", response.text
    raise _BY_STATUS.get(response.status_code, ApiError)(response.status_code, code, message)


def _transient(exc: BaseException) -> bool:
    return isinstance(exc, httpx.TransportError) or (
        isinstance(exc, ApiError) and exc.status in RETRY_STATUSES
    )


# The job fields of the HTTP API (outboxq.api.schemas.JobCreate) that the client sends as given; run_at and
# depends_on are converted (_job_body). Not imported from there: the client needs no server code.
JOB_OPTIONS = ("key", "priority", "max_attempts", "delay_seconds", "unique", "on_conflict",
               "on_dependency_failure", "limit_key")


def _job_body(payload: Any, options: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = {"payload": payload}
    for name in JOB_OPTIONS:
        if options.get(name) is not None:
            body[name] = options[name]
    if isinstance(options.get("unique"), timedelta):  # (a window, as enqueue takes it: seconds over HTTP)
        body["unique"] = options["unique"].total_seconds()
    if options.get("run_at") is not None:
        run_at = options["run_at"]
        body["run_at"] = run_at.isoformat() if isinstance(run_at, datetime) else run_at
    if options.get("depends_on"):
        body["depends_on"] = [
            d if isinstance(d, dict) else {"queue": d[0], "key": d[1]} for d in options["depends_on"]
        ]
    unknown = set(options) - {*JOB_OPTIONS, "run_at", "depends_on"}
    if unknown:
        raise TypeError(f"unknown enqueue options: {', '.join(sorted(unknown))}")
    return body


class _Base:
    def __init__(self, base_url: str, token: str | None, *, retries: int, max_backoff_s: float):
        self.base_url = base_url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.retry_args: dict[str, Any] = {
            "retry": retry_if_exception(_transient),
            "stop": stop_after_attempt(retries + 1),
            "wait": wait_exponential_jitter(multiplier=0.1, max=max_backoff_s),
            "reraise": True,
        }

    @staticmethod
    def _headers_for(method: str) -> dict[str, str]:
        return {"Idempotency-Key": uuid.uuid4().hex} if method == "POST" else {}


# ---------------------------------------------------------------- sync


class Client(_Base):
    """Synchronous client: `Client("http://127.0.0.1:8000", token="...")`."""

    def __init__(self, base_url: str, token: str | None = None, *, timeout: float = 10.0, retries: int = 5,
                 max_backoff_s: float = 5.0, transport: httpx.BaseTransport | None = None):
        super().__init__(base_url, token, retries=retries, max_backoff_s=max_backoff_s)
        self.http = httpx.Client(base_url=self.base_url, headers=self.headers, timeout=timeout,
                                 transport=transport)

    def close(self) -> None:
        """Close the connection pool."""
        self.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """One API call with retries of transient failures; the same Idempotency-Key on every try."""
        headers = {**self._headers_for(method), **kwargs.pop("headers", {})}
        for attempt in Retrying(**self.retry_args):
            with attempt:
                response = self.http.request(method, path, headers=headers, **kwargs)
                _raise_for(response)
        return response.json() if response.content else None

    def enqueue(self, queue: str, payload: Any, **options: Any) -> JobInfo:
        """Enqueue one job (options: key, depends_on, run_at, delay_seconds, priority, max_attempts, unique,
        on_conflict, on_dependency_failure, limit_key; as in the HTTP API, unique also a timedelta)."""
        return JobInfo.from_json(self.request("POST", f"/v1/queues/{queue}/jobs", json=_job_body(payload, options)))

    def enqueue_many(self, queue: str, payloads: list[Any], **options: Any) -> list[JobInfo]:
        """Enqueue many jobs of one queue in one request: all written or none."""
        body = {"jobs": [_job_body(p, options) for p in payloads]}
        data = self.request("POST", f"/v1/queues/{queue}/jobs/batch", json=body)
        return [JobInfo.from_json(j) for j in (data["jobs"] if isinstance(data, dict) else data)]

    def get_job(self, job_id: int) -> JobInfo:
        """The job with this id."""
        return JobInfo.from_json(self.request("GET", f"/v1/jobs/{job_id}"))

    def wait(self, job_id: int, timeout: float = 30.0, poll_s: float = 0.2) -> JobInfo:
        """Poll until the job is done, dead or cancelled; TimeoutError after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            job = self.get_job(job_id)
            if job.finished:
                return job
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {job.status} after {timeout} s")
            time.sleep(poll_s)

    def list_jobs(self, queue: str, *, status: str | None = None, limit: int = 100,
                  marker: str | None = None) -> JobPage:
        """One page of a queue's jobs in enqueue order."""
        return _job_page(self.request("GET", f"/v1/queues/{queue}/jobs", params=_page_params(status, limit, marker)))

    def queues(self) -> list[dict[str, Any]]:
        """Each queue with its counts per status and whether it is paused."""
        return _queue_list(self.request("GET", "/v1/queues"))

    def errors(self, queue: str) -> list[JobInfo]:
        """Retrying and dead jobs of a queue."""
        return _error_jobs(self.request("GET", f"/v1/queues/{queue}/errors"))

    def retry_job(self, job_id: int) -> JobInfo:
        """Run a retrying, dead or cancelled job again now (admin)."""
        return JobInfo.from_json(self.request("POST", f"/v1/jobs/{job_id}/retry"))

    def retry_queue(self, queue: str) -> int:
        """Retry every retrying and dead job of the queue (admin); how many."""
        return _retried(self.request("POST", f"/v1/queues/{queue}/retry"))

    def cancel_job(self, job_id: int) -> JobInfo:
        """Cancel a job (admin)."""
        return JobInfo.from_json(self.request("POST", f"/v1/jobs/{job_id}/cancel"))

    def pause(self, queue: str) -> None:
        """Pause a queue (admin)."""
        self.request("POST", f"/v1/queues/{queue}/pause")

    def resume(self, queue: str) -> None:
        """Resume a queue (admin)."""
        self.request("POST", f"/v1/queues/{queue}/resume")


# What the sync and async clients make of the answers they share.
def _page_params(status: str | None, limit: int, marker: str | None) -> dict[str, Any]:
    return {k: v for k, v in {"status": status, "limit": limit, "marker": marker}.items() if v is not None}


def _job_page(data: Any) -> JobPage:
    return JobPage([JobInfo.from_json(j) for j in data["items"]], data.get("next_marker"))


def _queue_list(data: Any) -> list[dict[str, Any]]:
    return data["queues"] if isinstance(data, dict) and "queues" in data else data


def _error_jobs(data: Any) -> list[JobInfo]:
    return [JobInfo.from_json(j) for j in (data["items"] if isinstance(data, dict) else data)]


def _retried(data: Any) -> int:
    return int(data["retried"] if isinstance(data, dict) else data)


# ---------------------------------------------------------------- async


class AsyncClient(_Base):
    """Asynchronous client with the same calls as Client, as coroutines."""

    def __init__(self, base_url: str, token: str | None = None, *, timeout: float = 10.0, retries: int = 5,
                 max_backoff_s: float = 5.0, transport: httpx.AsyncBaseTransport | None = None):
        super().__init__(base_url, token, retries=retries, max_backoff_s=max_backoff_s)
        self.http = httpx.AsyncClient(base_url=self.base_url, headers=self.headers, timeout=timeout,
                                      transport=transport)

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self.http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """One API call with retries of transient failures; the same Idempotency-Key on every try."""
        headers = {**self._headers_for(method), **kwargs.pop("headers", {})}
        async for attempt in AsyncRetrying(**self.retry_args):
            with attempt:
                response = await self.http.request(method, path, headers=headers, **kwargs)
                _raise_for(response)
        return response.json() if response.content else None

    async def enqueue(self, queue: str, payload: Any, **options: Any) -> JobInfo:
        """Enqueue one job (the options of Client.enqueue)."""
        data = await self.request("POST", f"/v1/queues/{queue}/jobs", json=_job_body(payload, options))
        return JobInfo.from_json(data)

    async def enqueue_many(self, queue: str, payloads: list[Any], **options: Any) -> list[JobInfo]:
        """Enqueue many jobs of one queue in one request."""
        body = {"jobs": [_job_body(p, options) for p in payloads]}
        data = await self.request("POST", f"/v1/queues/{queue}/jobs/batch", json=body)
        return [JobInfo.from_json(j) for j in (data["jobs"] if isinstance(data, dict) else data)]

    async def get_job(self, job_id: int) -> JobInfo:
        """The job with this id."""
        return JobInfo.from_json(await self.request("GET", f"/v1/jobs/{job_id}"))

    async def wait(self, job_id: int, timeout: float = 30.0, poll_s: float = 0.2) -> JobInfo:
        """Poll until the job is finished; TimeoutError after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            job = await self.get_job(job_id)
            if job.finished:
                return job
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {job.status} after {timeout} s")
            await asyncio.sleep(poll_s)

    async def list_jobs(self, queue: str, *, status: str | None = None, limit: int = 100,
                        marker: str | None = None) -> JobPage:
        """One page of a queue's jobs in enqueue order."""
        return _job_page(await self.request("GET", f"/v1/queues/{queue}/jobs",
                                            params=_page_params(status, limit, marker)))

    async def queues(self) -> list[dict[str, Any]]:
        """Each queue with its counts per status and whether it is paused."""
        return _queue_list(await self.request("GET", "/v1/queues"))

    async def errors(self, queue: str) -> list[JobInfo]:
        """Retrying and dead jobs of a queue."""
        return _error_jobs(await self.request("GET", f"/v1/queues/{queue}/errors"))

    async def retry_queue(self, queue: str) -> int:
        """Retry every retrying and dead job of the queue (admin); how many."""
        return _retried(await self.request("POST", f"/v1/queues/{queue}/retry"))

    async def retry_job(self, job_id: int) -> JobInfo:
        """Run a retrying, dead or cancelled job again now (admin)."""
        return JobInfo.from_json(await self.request("POST", f"/v1/jobs/{job_id}/retry"))

    async def cancel_job(self, job_id: int) -> JobInfo:
        """Cancel a job (admin)."""
        return JobInfo.from_json(await self.request("POST", f"/v1/jobs/{job_id}/cancel"))

    async def pause(self, queue: str) -> None:
        """Pause a queue (admin)."""
        await self.request("POST", f"/v1/queues/{queue}/pause")

    async def resume(self, queue: str) -> None:
        """Resume a queue (admin)."""
        await self.request("POST", f"/v1/queues/{queue}/resume")
