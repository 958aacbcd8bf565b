"""Request and response models. Requests forbid unknown fields, so a typo is an error and not a default."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Any, Literal, Required

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    WithJsonSchema,
    with_config,
)
from pydantic.json_schema import JsonDict
from typing_extensions import TypedDict

from outboxq.api.responses import RenderedJSON, render_json
from outboxq.queue.enqueue import MAX_KEY_LENGTH, PRIORITY_RANGE, QUEUE_NAME_PATTERN
from outboxq.queue.jobs import QueuedBatch
from outboxq.queue.limits import MAX_LIMIT_KEY_LENGTH, RATE_LIMIT_PATTERN

QUEUE_PATTERN = f"^{QUEUE_NAME_PATTERN.pattern}$"
KEY_PATTERN = "^[^\\u0000]+$"  # any text but NUL (PostgreSQL's text cannot hold it), as enqueue checks
MAX_DELAY_S = 100 * 365 * 86400.0


def _a_json_number(value: Any) -> Any:
    # JSON Schema's integer and number exclude true, false and "3"; pydantic's lax mode would take them.
    if isinstance(value, bool | str):
        raise ValueError(f"a JSON number is needed, not {value!r}")
    return value


# Request numbers as JSON Schema means them: 5 and 5.0 are the integer 5; true and "5" are no number (strict
# mode would refuse 5.0, lax mode takes true and "5"). The bounds come before the validator, or the document
# loses them.
_A_JSON_NUMBER = BeforeValidator(_a_json_number)
DelaySeconds = Annotated[float, Field(ge=0, le=MAX_DELAY_S, allow_inf_nan=False), _A_JSON_NUMBER]
UniqueSeconds = Annotated[float, Field(gt=0, le=MAX_DELAY_S, allow_inf_nan=False), _A_JSON_NUMBER]
Priority = Annotated[int, Field(ge=PRIORITY_RANGE[0], le=PRIORITY_RANGE[1]), _A_JSON_NUMBER]
MaxAttempts = Annotated[int, Field(ge=0, le=1_000_000), _A_JSON_NUMBER]
# A limit's count: at least 1 in the document; 0 reaches the server's own check (outboxq.queue.limits), whose
# 422 says to pause the queue instead.
LimitCount = Annotated[int, Field(ge=0, le=2**31 - 1), _A_JSON_NUMBER,
                       WithJsonSchema({"type": "integer", "minimum": 1, "maximum": 2**31 - 1})]
BatchSize = Annotated[int, Field(ge=1, le=1_000_000), _A_JSON_NUMBER]


class RequestModel(BaseModel):
    """Base of request bodies: unknown fields are an error."""

    model_config = ConfigDict(extra="forbid")


# A job's request fields are TypedDicts, not models: validating a large batch into model instances took most
# of the route's own cost, into dicts a fraction of it. Fields left out stay out (the idempotency
# hash covers what the client sent) and take JOB_DEFAULTS. JobCreateBody is a JobCreate whose fields agree.
@with_config(ConfigDict(extra="forbid"))
class DependencyRef(TypedDict):
    """A job this one waits for, named by its queue and key."""

    queue: Annotated[str, Field(pattern=QUEUE_PATTERN)]
    key: Annotated[str, Field(min_length=1, max_length=MAX_KEY_LENGTH, pattern=KEY_PATTERN)]


# The value of each optional field of a job that leaves it out (the document shows them as its defaults).
JOB_DEFAULTS: dict[str, Any] = {
    "key": None, "depends_on": (), "run_at": None, "delay_seconds": None, "priority": 0, "max_attempts": None,
    "unique": "forever", "on_conflict": "raise", "on_dependency_failure": "wait", "limit_key": None,
}


def _documented(name: str, description: str | None = None, **constraints: Any) -> Any:
    """A Field for a job's optional field `name`: its constraints and, in the document, its default."""
    default = JOB_DEFAULTS[name]
    return Field(description=description, json_schema_extra={"default": list(default) if isinstance(default, tuple)
                                                             else default}, **constraints)


# What a job's fields require of each other, in the document as the server checks it (so that what the
# document calls valid is what the server accepts): run_at and delay_seconds exclude each other (neither
# null), and a `unique` other than "forever" needs a key.
JOB_FIELD_RULES: JsonDict = {"allOf": [
    {"not": {"required": ["run_at", "delay_seconds"],
             "properties": {"run_at": {"type": "string"}, "delay_seconds": {"type": "number"}}}},
    {"if": {"required": ["unique"], "properties": {"unique": {"not": {"const": "forever"}}}},
     "then": {"required": ["key"], "properties": {"key": {"type": "string"}}}},
]}


@with_config(ConfigDict(extra="forbid", json_schema_extra=JOB_FIELD_RULES))
class JobCreate(TypedDict, total=False):
    """One job to enqueue."""

    payload: Required[Annotated[Any, Field(description="Any JSON value; the handler receives it as is")]]
    key: Annotated[str | None, _documented(
        "key", "Unique within the queue; a second job with the same key is a 409",
        min_length=1, max_length=MAX_KEY_LENGTH, pattern=KEY_PATTERN)]
    depends_on: Annotated[list[DependencyRef], _documented("depends_on", max_length=1000)]
    run_at: Annotated[AwareDatetime | None, _documented("run_at", "RFC 3339 time with an offset; not with "
                                                                  "delay_seconds")]
    delay_seconds: Annotated[DelaySeconds | None, _documented("delay_seconds")]
    priority: Annotated[Priority, _documented("priority", "Lower runs first")]
    max_attempts: Annotated[MaxAttempts | None, _documented("max_attempts", "0 retries forever")]
    unique: Annotated[Literal["forever", "active"] | UniqueSeconds, _documented(
        "unique", "How long the key blocks another job with it: 'forever' (while the job exists), 'active' "
        "(while it is unfinished) or a number of seconds since it was enqueued; needs a key")]
    on_conflict: Annotated[Literal["raise", "ignore"], _documented(
        "on_conflict", "When the key is held: 'raise' answers 409, 'ignore' returns the job holding it")]
    on_dependency_failure: Annotated[Literal["wait", "cancel", "run"], _documented(
        "on_dependency_failure", "When a dependency ends dead or cancelled: keep waiting, cancel this job, or "
        "run it")]
    limit_key: Annotated[str | None, _documented(
        "limit_key", "The job's key for its queue's per-key limits (a consumer's limit_by); without it the "
        "worker computes the key from the payload", max_length=MAX_LIMIT_KEY_LENGTH, pattern=KEY_PATTERN)]


def fields_disagree(job: JobCreate) -> str | None:
    """The rule of JOB_FIELD_RULES that a job's fields break, said as what to fix; None when they agree."""
    if job.get("run_at") is not None and job.get("delay_seconds") is not None:
        return "give either run_at or delay_seconds, not both"
    if job.get("unique", "forever") != "forever" and job.get("key") is None:
        return "unique applies to jobs with a key: give key"
    return None


def _fields_agree(job: JobCreate) -> JobCreate:
    problem = fields_disagree(job)
    if problem is not None:
        raise ValueError(problem)
    return job


JobCreateBody = Annotated[JobCreate, AfterValidator(_fields_agree)]
JOB_CREATE = TypeAdapter(JobCreateBody)


def batch_fields_disagree(jobs: list[JobCreate]) -> list[dict[str, Any]]:
    """The jobs of a batch whose fields break JOB_FIELD_RULES, as the problems pydantic reports for a
    JobCreateBody that does (a value_error at body.jobs.N), so that they answer the same 422."""
    problems = []
    for index, job in enumerate(jobs):
        # (Only a job giving run_at or unique can break a rule: the loop's test, not a call, for the others.)
        if "run_at" in job or "unique" in job:
            problem = fields_disagree(job)
            if problem is not None:
                problems.append({"type": "value_error", "loc": ("body", "jobs", index), "input": job,
                                 "msg": f"Value error, {problem}", "ctx": {"error": problem}})
    return problems


def job_option(job: JobCreate, name: str) -> Any:
    """A job's field `name` as given, else its default (JOB_DEFAULTS)."""
    return job.get(name, JOB_DEFAULTS[name])


class JobBatchCreate(RequestModel):
    """Many jobs of one queue: all written, or none."""

    # JobCreate, not JobCreateBody: pydantic calling _fields_agree for each job was half of a 1,000-job batch's
    # validation; the route checks the rules once for the batch (batch_fields_disagree), with the same answer.
    jobs: list[JobCreate] = Field(min_length=1, description="Up to the server's max_batch_jobs (default 1000)")


class JobPublic(BaseModel):
    """A job as the API shows it."""

    id: int
    queue: str
    key: str | None = None
    status: str
    payload: Any = None
    payload_encoding: str = Field("json", description="json, or base64 for a queue with its own codec")
    attempts: int = 0
    max_attempts: int | None = None
    priority: int = 0
    run_at: str | None = None
    last_error: str | None = None
    waiting_reason: str | None = None
    cancel_requested: bool = False
    created_at: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    snoozes: int = 0
    result: Any = Field(None, description="The handler's return value (JSON), once the job is done; in listings "
                                          "only with include=result")
    progress: float | None = Field(None, description="0.0-1.0, as the handler last reported it")
    progress_message: str | None = None
    workflow_id: int | None = Field(None, description="The workflow this job is a step of (GET /v1/workflows/{id})")
    step: str | None = Field(None, description="Its step's name within the workflow")
    sequence: str | None = Field(None, description="The sequence it runs in: one job at a time, in enqueue order")
    marker: str | None = Field(None, description="In listings: pass it as ?marker= to continue after this job")


class JobBatchPublic(BaseModel):
    """The jobs a batch wrote, in request order."""

    jobs: list[JobPublic]


class JobBatchIds(BaseModel):
    """The ids of the jobs a batch wrote, in request order: the answer to `Prefer: return=minimal`."""

    ids: list[int]


class JobPage(BaseModel):
    """A page of a queue's jobs in enqueue order; next_marker is null when the page is empty."""

    items: list[JobPublic]
    next_marker: str | None


class JobList(BaseModel):
    """Jobs, oldest first."""

    items: list[JobPublic]


class KeyUsage(BaseModel):
    """A limit key of a per-key queue and how many of its jobs run now."""

    key: str | None
    running: int


class QueueLimitsPublic(BaseModel):
    """A queue's limits (per key when per_key) and their use now: jobs running, starts in the rate window."""

    queue: str
    global_concurrency: int | None
    rate_limit: str | None = Field(description="N/s, N/m or N/h; null when none")
    per_key: bool
    source: str = Field(description="consumer (declared by @consumer) or operator (set at run time)")
    running: int
    recent_starts: int = Field(description="starts within the last rate-limit period")
    busiest_keys: list[KeyUsage] = Field(description="per-key queues: the five keys with most jobs running")


class QueueLimitsChange(RequestModel):
    """New limits for a queue: each field given replaces the current limit (null removes it); fields left out
    keep theirs."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"minProperties": 1})  # (an empty change: 422)

    global_concurrency: LimitCount | None = Field(
        None, description="at most N running (per key with limit_by), N from 1; to stop the queue, pause it")
    # The pattern is the document's (no count of 0); the server's own check says what to fix
    # (outboxq.queue.limits).
    rate_limit: Annotated[str | None, WithJsonSchema({"anyOf": [
        {"type": "string", "pattern": "^(?!0+/)" + RATE_LIMIT_PATTERN.pattern.removeprefix("^")},
        {"type": "null"}]})] = Field(
        None, description="at most N starts per period: N/s, N/m or N/h (N from 1, up to 9 digits); to stop the "
                          "queue, pause it")


class QueueSummary(BaseModel):
    """A queue: counts per status, paused, failing since when, and its limits with their usage (null when
    unlimited)."""

    queue: str
    paused: bool
    failing_since: str | None
    counts: dict[str, int]
    limits: QueueLimitsPublic | None = None
    lag_s: float = Field(0.0, description="seconds the oldest job ready to run has waited (0 when none is)")
    state: Literal["paused", "failing", "limited", "idle", "running"] = Field(
        description="paused; failing (its last attempts failed: backing off); limited (a limit binds now); idle "
                    "(nothing to run); running")


class QueueList(BaseModel):
    """Every known queue. Its counts of finished jobs (done, dead, cancelled) cover the last
    `finished_window_s` seconds; unfinished counts are all of them."""

    queues: list[QueueSummary]
    finished_window_s: float


class RetriedCount(BaseModel):
    """How many jobs were set to run again."""

    queue: str
    retried: int


class QueueState(BaseModel):
    """A queue's paused state after the call."""

    queue: str
    paused: bool


class StatsList(BaseModel):
    """One row per queue."""

    items: list[dict[str, Any]]


class Health(BaseModel):
    """Queue health."""

    healthy: bool
    in_startup_grace: bool
    queues_in_error: list[dict[str, Any]]


class Liveness(BaseModel):
    """The process answers."""

    status: str


class Readiness(BaseModel):
    """The database answers and its schema is current."""

    ready: bool
    schema_revision: str | None = None


class SparkBatchCreate(RequestModel):
    """A Spark batch to run over a queue: a processor registered by the operator, by name."""

    queue: str = Field(pattern=QUEUE_PATTERN)
    processor: str = Field(min_length=1, max_length=200, description="a name from OUTBOXQ_SPARK_PROCESSORS")
    output_table: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
    batch_size: BatchSize = 1000
    # Only null is valid (the document says so); the route answers a given master with its own message.
    master: Annotated[str | None, WithJsonSchema({"type": "null"})] = Field(
        None, description="must be null: the Spark master is the operator's setting")


class SparkBatchCreated(BaseModel):
    """The id of the submitted batch."""

    id: int


def job_public(job: Any, marker: str | None = None, *, result: bool = True) -> dict[str, Any]:
    """The JSON of a Job (app.queue.jobs.Job); without its result when `result` is False (listings)."""
    out = _job_public(job, {})
    if not result:
        del out["result"]
    if marker is not None:
        out["marker"] = marker
    return out


def job_held_public(job: Any) -> dict[str, Any]:
    """The JSON of a job found holding a key (on_conflict "ignore") for a caller that may not read jobs: its id,
    queue, key and status."""
    # That the key is held, by which job and how far it got: what the caller needs to go on. Not its payload,
    # result or errors, which are for whoever may read jobs (the job may be another client's).
    return {"id": job.id, "queue": job.queue, "key": job.key, "status": str(job.status)}


def jobs_public(jobs: QueuedBatch | Sequence[Any]) -> list[dict[str, Any]]:
    """The JSON of each Job (or of each job of a QueuedBatch); a time shared by several of them (a batch's
    created_at) is formatted once (by the time object's id(): the jobs must all stay alive meanwhile, hence a
    sequence, not any iterable)."""
    if isinstance(jobs, QueuedBatch):
        return _batch_public(jobs) if jobs.ids else []
    formatted: dict[int, str] = {}
    return [_job_public(job, formatted) for job in jobs]


def jobs_answer(jobs: QueuedBatch | Sequence[Any]) -> dict[str, Any] | RenderedJSON:
    """A batch route's answer, `{"jobs": [...]}` (jobs_public): for a QueuedBatch of JSON payloads, rendered from
    its payloads' texts as written, with what its jobs share rendered once (a third of building and rendering
    each job's dict)."""
    if isinstance(jobs, QueuedBatch) and jobs.payload_texts is not None and jobs.ids:
        return _batch_json(jobs, jobs.payload_texts)
    return {"jobs": jobs_public(jobs)}


def _batch_json(batch: QueuedBatch, texts: Sequence[str]) -> RenderedJSON:
    """`{"jobs": [...]}` for jobs that differ only in id and payload: the first job's fields (as _job_public
    orders them, the id first: the answer's field order is tested) rendered once around the two that differ, each
    payload's text spliced in as written."""
    first = _job_public(batch.jobs(1)[0], {})
    names = list(first)
    at = names.index("payload")
    # Each part is a JSON object's members without its braces: '"queue":"q","key":null,"status":"queued"'.
    before = render_json({name: first[name] for name in names[1:at]})[1:-1].decode()
    after = render_json({name: first[name] for name in names[at + 1:]})[1:-1].decode()
    head, middle, tail = '{"id":', f',{before},"payload":', f",{after}}}"
    # (The texts are payload_json's: orjson's UTF-8 or json.dumps' ASCII, so the whole encodes.)
    jobs = ",".join([f"{head}{job_id}{middle}{text}{tail}" for job_id, text in zip(batch.ids, texts, strict=True)])
    return RenderedJSON(f'{{"jobs":[{jobs}]}}'.encode())


def _batch_public(batch: QueuedBatch) -> list[dict[str, Any]]:
    """The JSON of jobs that differ only in id and payload: the first job's, copied, with each one's id and
    payload (a third of the time of building each), and no Job built but the first."""
    first = _job_public(batch.jobs(1)[0], {})
    out: list[dict[str, Any]] = []
    append = out.append
    # When every payload is JSON already (the usual batch), its encoding is the first job's, and no call per job
    # asks.
    binary = any(isinstance(payload, _BINARY) for payload in batch.payloads)
    for job_id, payload in zip(batch.ids, batch.payloads, strict=True):
        one = first.copy()
        one["id"] = job_id
        if binary:
            one["payload"], one["payload_encoding"] = _public_payload(payload)
        else:
            one["payload"] = payload
        append(one)
    return out


def _job_public(job: Any, formatted: dict[int, str]) -> dict[str, Any]:
    """The fields of JobPublic but marker, in its order, as one dict display: the per-job cost of a 1,000-job
    batch's answer (Job.to_dict, then a JobPublic.model_fields lookup per job, took half as long as writing
    the batch; tests check the keys against the model). `formatted` holds the ISO text of the datetimes seen
    so far, by identity: the jobs hold them while it is used, and equal times with other offsets must not
    share a text."""
    payload, encoding = _public_payload(job.payload)
    return {
        "id": job.id, "queue": job.queue, "key": job.key,
        "status": str(job.status),  # a JobStatus is a StrEnum: its value (an Enum call is slower)
        "payload": payload, "payload_encoding": encoding, "attempts": job.attempts,
        "max_attempts": job.max_attempts, "priority": job.priority, "run_at": _iso(job.run_at, formatted),
        "last_error": job.last_error, "waiting_reason": job.waiting_reason,
        "cancel_requested": job.cancel_requested, "created_at": _iso(job.created_at, formatted),
        "started_at": _iso(job.started_at, formatted), "finished_at": _iso(job.finished_at, formatted),
        "snoozes": job.snoozes, "result": job.result, "progress": job.progress,
        "progress_message": job.progress_message, "workflow_id": job.workflow_id, "step": job.step,
        "sequence": job.sequence,
    }


# The payloads of a queue with its own codec (what _public_payload writes as base64).
_BINARY = (bytes, bytearray, memoryview)


def _public_payload(payload: Any) -> tuple[Any, str]:
    """A payload as JSON and its encoding: bytes (a queue with its own codec) as base64 text."""
    if isinstance(payload, _BINARY):
        return base64.b64encode(bytes(payload)).decode(), "base64"
    return payload, "json"


def _iso(value: datetime | None, formatted: dict[int, str]) -> str | None:
    """The ISO text of a datetime (None for None), formatted once per object while `formatted` is used."""
    if value is None:
        return None
    text = formatted.get(id(value))
    if text is None:
        text = formatted[id(value)] = value.isoformat()
    return text


class WorkflowEdge(RequestModel):
    """An edge to an earlier step, with what this step does when that one fails."""

    step: str = Field(min_length=1, max_length=255, pattern=KEY_PATTERN)
    on_failure: Literal["cancel", "run"] = Field(
        "cancel", description="'cancel': this step (and what comes after it) is cancelled when that step fails; "
                              "'run': this step runs once that step finished, however (a clean-up step)")


class WorkflowStepCreate(RequestModel):
    """One step of a workflow: a job of `queue`, run after the steps of `after`."""

    name: str = Field(min_length=1, max_length=255, pattern=KEY_PATTERN, description="Unique within the workflow")
    queue: str = Field(pattern=QUEUE_PATTERN)
    payload: Any = Field(None, description="Any JSON value; the step's handler receives it as is")
    after: list[Annotated[str, Field(min_length=1, max_length=255, pattern=KEY_PATTERN)] | WorkflowEdge] = Field(
        default_factory=list, max_length=10_000,
                                            description="The steps it waits for: names, or edges with a policy")
    priority: Priority = 0
    max_attempts: MaxAttempts | None = None


class WorkflowCreate(RequestModel):
    """A whole workflow: written in one transaction, or not at all (a cycle or an unknown step is a 422)."""

    name: str = Field(min_length=1, max_length=255, pattern=KEY_PATTERN)
    steps: list[WorkflowStepCreate] = Field(min_length=1, max_length=10_000)


class WorkflowCreated(BaseModel):
    """The id of the workflow written."""

    id: int


class WorkflowStepPublic(BaseModel):
    """A step of a workflow and where it stands."""

    name: str
    job_id: int
    queue: str
    status: str
    attempts: int
    max_attempts: int | None = None
    result: Any = None
    last_error: str | None = None
    waiting_reason: str | None = None
    worker_id: str | None = Field(None, description="The worker that ran (or runs) its latest attempt")
    created_at: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    after: list[dict[str, Any]] = Field(default_factory=list, description="{step, job_id, on_failure} each")


class WorkflowPublic(BaseModel):
    """A workflow: running, done, failed (a step is dead) or cancelled, with every step."""

    id: int
    name: str
    status: Literal["running", "done", "failed", "cancelled"]
    created_at: str
    cancelled_at: str | None = None
    steps: list[WorkflowStepPublic]


class WorkflowSummary(BaseModel):
    """A workflow in a listing: its status and its steps counted."""

    id: int
    name: str
    status: Literal["running", "done", "failed", "cancelled"]
    steps: int
    done: int
    dead: int
    cancelled: int
    unfinished: int
    created_at: str


class WorkflowPage(BaseModel):
    """The newest workflows; pass next_before as ?before= for the older ones (null: no more)."""

    items: list[WorkflowSummary]
    next_before: int | None = None


class WorkflowCancelled(BaseModel):
    """How many unfinished steps were cancelled."""

    cancelled: int


class WorkflowRetried(BaseModel):
    """How many dead steps run again, and how many steps cancelled because of them wait again."""

    retried: int
    waiting: int


class WorkerPublic(BaseModel):
    """A live worker process: what it runs and when it was last seen."""

    id: str
    host: str
    pid: int
    version: str
    queues: list[dict[str, Any]] = Field(description="{queue, global_concurrency, rate_limit, per_key} each")
    concurrency: int = Field(description="Its handler threads")
    in_flight: int = Field(description="Jobs it holds (claimed and not yet written back)")
    started_at: str
    last_seen_at: str


class WorkerList(BaseModel):
    """The worker processes seen within worker_lapse_s (30 s by default): a killed one lapses out of the list."""

    items: list[WorkerPublic]


class JobFilterBody(RequestModel):
    """Which jobs (every field optional, as GET /v1/jobs takes them)."""

    queue: str | None = Field(None, pattern=QUEUE_PATTERN)
    status: list[Literal["waiting", "queued", "running", "retrying", "done", "dead", "cancelled"]] = Field(
        default_factory=list, max_length=7)
    key: str | None = Field(None, min_length=1, max_length=255, pattern=KEY_PATTERN, description="A key prefix")
    payload: dict[str, Any] | None = Field(None, description="A JSON object the payloads contain")
    error: str | None = Field(None, min_length=1, max_length=255, pattern=KEY_PATTERN,
                              description="Text in the last error, any case")
    since: AwareDatetime | None = None
    until: AwareDatetime | None = None


class BulkByIds(RequestModel):
    """The jobs to act on, by id."""

    # (bounded where a JSON number is still an exact integer: job ids are far below it)
    ids: list[Annotated[int, Field(ge=1, le=2**53 - 1), _A_JSON_NUMBER]] = Field(min_length=1, max_length=10_000)


class BulkByFilter(RequestModel):
    """Every job matching `filter` (a filter that matches every job needs `"all": true`)."""

    filter: JobFilterBody
    all: bool = False


BulkAction = BulkByIds | BulkByFilter


class JobCount(BaseModel):
    """How many jobs match a search, counted up to 10,000; more: whether there are more than that."""

    count: int
    more: bool


class BulkCount(BaseModel):
    """How many jobs the action changed (a filter's action changes at most 10,000 a call: call again)."""

    count: int


class JobSearchPage(BaseModel):
    """Jobs newest first, without their results; next_marker continues (null: the last page)."""

    items: list[JobPublic]
    next_marker: str | None = None


class SchedulePublic(BaseModel):
    """A periodic schedule as the workers stored it."""

    name: str
    queue: str
    cron: str | None = Field(None, description="Its cron expression, or null for an interval")
    every_s: float | None = Field(None, description="Its interval in seconds, or null for a cron expression")
    timezone: str
    missed: Literal["latest", "skip", "all"]
    last_slot: str | None = None
    next_slot: str
    last_job_id: int | None = None
    last_job_status: str | None = None
    paused: bool


class ScheduleList(BaseModel):
    """Every stored schedule."""

    items: list[SchedulePublic]


class TokenScopes(BaseModel):
    """What the request's token may do (the dashboard disables the actions a read-only token may not take)."""

    scopes: list[Literal["enqueue", "read", "admin"]]
