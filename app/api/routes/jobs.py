"""Jobs: enqueue one or a batch, read one, list a queue's jobs page by page."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Body, Query, Request, Response
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from psycopg_pool import ConnectionPool
from starlette.concurrency import run_in_threadpool

from outboxq.api.auth import EnqueuePrincipal, Principal, scoped
from outboxq.api.deps import (
    IdempotencyKey,
    IncludeResult,
    JobId,
    PoolDep,
    Prefer,
    QueueName,
    SettingsDep,
    idempotent_write,
    prefers_minimal,
    transaction,
)
from outboxq.api.errors import ApiProblem, error_responses
from outboxq.api.routing import FastJsonRequest, OutboxqRoute, api_state, too_many_jobs
from outboxq.api.schemas import (
    JOB_CREATE,
    JobBatchCreate,
    JobBatchIds,
    JobBatchPublic,
    JobCreate,
    JobCreateBody,
    JobPage,
    JobPublic,
    batch_fields_disagree,
    job_held_public,
    job_option,
    job_public,
    jobs_answer,
    jobs_public,
)
from outboxq.errors import InvalidInput, JobNotFound
from outboxq.queue import admin, feed, sql
from outboxq.queue.enqueue import QUEUE_NAME_PATTERN, enqueue, enqueue_many_written, get_job
from outboxq.queue.jobs import Job, JobStatus, QueuedBatch
from outboxq.settings import Settings

router = APIRouter(tags=["jobs"], route_class=OutboxqRoute)


def check_payload_size(payload: Any, limit: int, where: str = "payload") -> None:
    """413 when the payload's JSON is over `limit` bytes."""
    try:
        size = len(json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass"))
    except (TypeError, ValueError):
        return  # enqueue reports what is wrong with it
    if size > limit:
        raise ApiProblem(413, "payload_too_large",
                         f"{where} is {size} bytes of JSON, over the limit of {limit} bytes (max_payload_bytes)")


def check_dependency_count(jobs: list[JobCreate], limit: int) -> None:
    """422 when the request's jobs name more dependencies than one request may write (before anything is)."""
    count = sum(len(job["depends_on"]) for job in jobs if "depends_on" in job)
    if count > limit:
        raise InvalidInput(f"the request names {count} dependencies, over the limit of {limit} per request "
                           "(max_dependencies_per_request); split it into several requests")


# The request fields that enqueue_many applies to every job of a batch, with the names enqueue gives them (key
# is per job; depends_on, and on_dependency_failure with it, make a batch per-job).
SHARED_OPTIONS = {"run_at": "run_at", "delay_seconds": "delay", "priority": "priority",
                  "max_attempts": "max_attempts", "unique": "unique", "on_conflict": "on_conflict"}
# A job that gives only these takes the defaults of every shared option (a batch's usual job).
PER_JOB_FIELDS = frozenset({"payload", "key", "limit_key"})


def _shared_options(job: JobCreate) -> tuple[Any, ...]:
    """The values of SHARED_OPTIONS in a job, in that order."""
    return tuple(job_option(job, name) for name in SHARED_OPTIONS)


def _uniform(jobs: list[JobCreate]) -> bool:
    """Whether one enqueue_many can write the batch: no dependencies, the same shared options in every job."""
    if all(job.keys() <= PER_JOB_FIELDS for job in jobs):
        return True
    first = _shared_options(jobs[0])
    return all(not job.get("depends_on") and _shared_options(job) == first for job in jobs)


def _options(job: JobCreate) -> dict[str, Any]:
    return {
        **{option: job_option(job, name) for name, option in SHARED_OPTIONS.items()},
        "key": job.get("key"),
        "limit_key": job.get("limit_key"),
        "depends_on": [(d["queue"], d["key"]) for d in job_option(job, "depends_on")],
        "on_dependency_failure": job_option(job, "on_dependency_failure"),
    }


@router.post("/v1/queues/{queue}/jobs", status_code=201, response_model=JobPublic, **scoped("enqueue"),
             responses={200: {"model": JobPublic, "description": "A retry with the same Idempotency-Key, or "
                                                                  "the job holding the key (on_conflict ignore; "
                                                                  "to a token without the read scope, only its "
                                                                  "id, queue, key and status)"},
                        **error_responses(400, 401, 403, 409, 413, 422)})
def create_job(queue: QueueName, body: Annotated[JobCreateBody, Body()], request: Request,
               principal: EnqueuePrincipal, pool: PoolDep, settings: SettingsDep,
               idempotency_key: IdempotencyKey = None) -> JSONResponse:
    """Enqueue one job (201); with an Idempotency-Key, a retry of the same request answers 200 with the same job,
    and so does on_conflict="ignore" when the job holding the key is returned (nothing written): in full to a
    token that may read jobs, else only its id, queue, key and status."""
    check_payload_size(body["payload"], settings.max_payload_bytes)
    check_dependency_count([body], settings.max_dependencies_per_request)
    existed: list[bool] = []
    options = _options(body)

    def work(conn: Any) -> dict[str, Any]:
        job = enqueue(conn, queue, body["payload"], **options)
        if options["on_conflict"] == "ignore" and options["key"] is not None:
            # The job holding the key was returned, not written, when it was created before this transaction.
            started = conn.execute(sql.transaction_started_at).fetchone()["now"]
            existed.append(job.created_at is not None and job.created_at < started)
            if existed[-1] and "read" not in principal.scopes:
                return job_held_public(job)  # someone else's job, perhaps: enqueuing is no leave to read it
        return job_public(job)

    return idempotent_write(request, pool, principal.id, idempotency_key,
                            lambda: JOB_CREATE.dump_python(body, mode="json"), work,
                            status=lambda: 200 if any(existed) else 201)


def create_jobs(queue: QueueName, body: JobBatchCreate, request: Request, principal: EnqueuePrincipal,
                pool: PoolDep, settings: SettingsDep, idempotency_key: IdempotencyKey = None,
                prefer: Prefer = None) -> JSONResponse:
    """Enqueue many jobs of one queue in one transaction: all written, or none. The answer holds each job
    (JobBatchPublic), or only their ids (JobBatchIds) under `Prefer: return=minimal`. A job found holding its
    key (on_conflict "ignore") is answered in full to a token that may read jobs, else by its id, queue, key
    and status."""
    # (The route class counted the jobs before the body was parsed; this holds for any route class.)
    if len(body.jobs) > settings.max_batch_jobs:
        raise InvalidInput(too_many_jobs(settings.max_batch_jobs, len(body.jobs)))
    disagreeing = batch_fields_disagree(body.jobs)
    if disagreeing:
        raise RequestValidationError(disagreeing)

    def request_body() -> dict[str, Any]:
        # The answer's form is part of the request: a retry with the same key and another form is refused (409)
        # rather than answered in the form the first request chose. ("return" is no field of a batch's body.)
        dumped = body.model_dump(mode="json", exclude_unset=True)
        return {**dumped, "return": "minimal"} if prefers_minimal(request) else dumped

    return write_batch(queue, body.jobs, request, principal, pool, settings, idempotency_key, request_body)


def write_batch(queue: str, batch: list[JobCreate], request: Request, principal: Principal, pool: ConnectionPool,
                settings: Settings, idempotency_key: str | None, request_body: Callable[[], Any], *,
                payloads_only: bool = False) -> JSONResponse:
    """Write a batch's valid jobs in one transaction and answer them (create_jobs; BatchRoute for a batch of
    payloads alone, `payloads_only`): the payloads' size checked, the jobs written by one enqueue_many when they
    share their options, else one by one."""
    request_bytes = int(request.headers.get("content-length") or settings.max_payload_bytes)
    # Re-encoding a payload can make it longer than it was in the request (1E15 becomes 1000000000000000.0,
    # 4.5 times), never 8 times: a smaller request cannot hold a payload over the limit, and is not checked.
    if request_bytes * 8 > settings.max_payload_bytes:
        for index, job in enumerate(batch):
            check_payload_size(job["payload"], settings.max_payload_bytes, f"jobs[{index}].payload")
    minimal = prefers_minimal(request)  # (every Prefer line: `prefer` of create_jobs documents the header)
    if payloads_only:  # (no options, keys or dependencies: a look at each job would find nothing)
        uniform, hide_held = True, False
    else:
        check_dependency_count(batch, settings.max_dependencies_per_request)
        uniform = _uniform(batch)
        hide_held = "read" not in principal.scopes and any(
            job_option(j, "on_conflict") == "ignore" and "key" in j for j in batch)

    def work(conn: Any) -> dict[str, Any] | bytes:
        jobs: QueuedBatch | list[Job]
        if uniform:
            shared = _options(batch[0])
            # (keys=None when no job has one: a key-less batch is then written as enqueue_many writes one, with
            # no check per key.)
            keys = ([j.get("key") for j in batch] if not payloads_only and any("key" in j for j in batch)
                    else None)
            limit_keys = ([j.get("limit_key") for j in batch]
                          if not payloads_only and any("limit_key" in j for j in batch) else None)
            jobs = enqueue_many_written(conn, queue, [j["payload"] for j in batch], keys=keys,
                                        limit_keys=limit_keys,
                                        **{option: shared[option] for option in SHARED_OPTIONS.values()})
        else:  # per-job options or dependencies (a job may depend on an earlier one of the batch)
            jobs = [enqueue(conn, queue, j["payload"], **_options(j)) for j in batch]
        if minimal:
            return {"ids": list(jobs.ids) if isinstance(jobs, QueuedBatch) else [job.id for job in jobs]}
        if hide_held and not isinstance(jobs, QueuedBatch):  # (a QueuedBatch holds only jobs it wrote)
            answer = jobs_public(jobs)
            _hide_held_jobs(conn, jobs, answer)
            return {"jobs": answer}
        return jobs_answer(jobs)

    response = idempotent_write(request, pool, principal.id, idempotency_key, request_body, work)
    if minimal:
        response.headers["Preference-Applied"] = "return=minimal"
    return response


def payloads_alone(body: Any, most: int) -> list[JobCreate] | None:
    """The jobs of a parsed batch body that gives each job its payload alone and nothing else (`{"jobs":
    [{"payload": ...}, ...]}`, a batch's usual body), when there are 1 to `most` of them; None for any other
    body."""
    if type(body) is not dict or len(body) != 1:
        return None
    jobs = body.get("jobs")
    if type(jobs) is not list or not 0 < len(jobs) <= most:
        return None
    for job in jobs:
        if type(job) is not dict or len(job) != 1 or "payload" not in job:
            return None
    return jobs


class BatchRoute(OutboxqRoute):
    """The batch route, which writes a batch of payloads alone without FastAPI's dependencies and validation.

    Such a body is valid as it is (a payload is any JSON value), and those were most of a 1,000-job request's own
    time: it goes to write_batch as create_jobs would send it, with the same checks and answer. Any other request
    (other fields, an Idempotency-Key, a body that is not JSON, a queue name the path refuses) takes the route's
    own handling, which validates it and says what is wrong.
    """

    async def answer_directly(self, request: FastJsonRequest, principal: Principal | None) -> Response | None:
        """write_batch's answer to a batch of payloads alone; None for any other request."""
        queue = request.path_params.get("queue")
        media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if (media_type != "application/json" or "idempotency-key" in request.headers
                or not isinstance(queue, str) or QUEUE_NAME_PATTERN.fullmatch(queue) is None):
            return None
        state = api_state(request)
        try:
            body = await request.json()  # (parsed already, as the route class read the body)
        except (ValueError, RecursionError):
            return None
        batch = payloads_alone(body, state.settings.max_batch_jobs)
        if batch is None or principal is None or state.pool is None:
            return None
        return await run_in_threadpool(write_batch, queue, batch, request, principal, state.pool, state.settings,
                                       None, lambda: body, payloads_only=True)


router.add_api_route(
    "/v1/queues/{queue}/jobs/batch", create_jobs, methods=["POST"], route_class_override=BatchRoute,
    status_code=201, response_model=JobBatchPublic | JobBatchIds, **scoped("enqueue"),
    responses={200: {"model": JobBatchPublic | JobBatchIds, "description": "A retry with the same Idempotency-Key"},
               **error_responses(400, 401, 403, 409, 413, 422)})


def _hide_held_jobs(conn: Any, jobs: list[Job], answer: list[dict[str, Any]]) -> None:
    """Reduce, in `answer`, the jobs that were there before this transaction (found holding their key) to what a
    token without the read scope may learn of them (job_held_public)."""
    started = conn.execute(sql.transaction_started_at).fetchone()["now"]
    for index, job in enumerate(jobs):
        if job.created_at is not None and job.created_at < started:
            answer[index] = job_held_public(job)


@router.get("/v1/jobs/{job_id}", response_model=JobPublic, **scoped("read"),
            responses=error_responses(401, 403, 404, 422))
def read_job(job_id: JobId, pool: PoolDep) -> JSONResponse:
    """The job with this id."""
    with transaction(pool) as conn:
        job = get_job(conn, job_id)
    if job is None:
        raise JobNotFound(job_id)
    return JSONResponse(job_public(job))


@router.get("/v1/jobs/{job_id}/errors", **scoped("read"), responses=error_responses(401, 403, 404, 422))
def read_job_errors(job_id: JobId, pool: PoolDep) -> JSONResponse:
    """Every failed or snoozed attempt of the job: attempt, error, traceback, failed_at, kind (error or snooze)
    and worker_id (the worker process that ran it)."""
    with transaction(pool) as conn:
        if get_job(conn, job_id) is None:
            raise JobNotFound(job_id)
        history = admin.error_history(conn, job_id)
    return JSONResponse({"items": jsonable_encoder(history)})


@router.get("/v1/jobs/{job_id}/dependencies", **scoped("read"), responses=error_responses(401, 403, 404, 422))
def read_job_dependencies(job_id: JobId, pool: PoolDep) -> JSONResponse:
    """What the job waits for (depends_on) and what waits for it (dependents)."""
    with transaction(pool) as conn:
        if get_job(conn, job_id) is None:
            raise JobNotFound(job_id)
        return JSONResponse(admin.job_dependencies(conn, job_id))


@router.get("/v1/queues/{queue}/jobs", response_model=JobPage, **scoped("read"),
            responses=error_responses(400, 401, 403, 422))
def list_jobs(
    queue: QueueName,
    request: Request,
    pool: PoolDep,
    status: Annotated[JobStatus | None, Query(description="Only jobs in this status")] = None,
    limit: Annotated[int, Query(ge=1, le=feed.MAX_PAGE_SIZE)] = 100,
    marker: Annotated[str | None, Query(max_length=200, description="next_marker (or an item's marker) "
                                                                      "of the previous page")] = None,
    include: IncludeResult = None,
) -> JSONResponse:
    """A page of the queue's jobs in enqueue order; markers never skip or repeat a job. Their results only with
    include=result."""
    with_result = include == "result"
    with transaction(pool) as conn:
        page = feed.list_page(conn, api_state(request).marker_key(conn), queue, marker=marker, limit=limit,
                              status=status, include_result=with_result)
    return JSONResponse({"items": [job_public(i.job, i.marker, result=with_result) for i in page.items],
                         "next_marker": page.next_marker})
