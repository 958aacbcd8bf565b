"""Request and response models. Requests forbid unknown fields, so a typo is an error and not a default."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from outboxq.queue.enqueue import MAX_KEY_LENGTH, PRIORITY_RANGE, QUEUE_NAME_PATTERN

QUEUE_PATTERN = f"^{QUEUE_NAME_PATTERN.pattern}$"
MAX_DELAY_S = 100 * 365 * 86400.0


class RequestModel(BaseModel):
    """Base of request bodies: unknown fields are an error."""

    model_config = ConfigDict(extra="forbid")


class DependencyRef(RequestModel):
    """A job this one waits for, named by its queue and key."""

    queue: str = Field(pattern=QUEUE_PATTERN)
    key: str = Field(min_length=1, max_length=MAX_KEY_LENGTH)


class JobCreate(RequestModel):
    """One job to enqueue."""

    payload: Any = Field(description="Any JSON value; the handler receives it as is")
    key: str | None = Field(None, min_length=1, max_length=MAX_KEY_LENGTH,
                            description="Unique within the queue; a second job with the same key is a 409")
    depends_on: list[DependencyRef] = Field(default_factory=list, max_length=1000)
    run_at: AwareDatetime | None = Field(None, description="RFC 3339 time with an offset; not with delay_seconds")
    delay_seconds: float | None = Field(None, ge=0, le=MAX_DELAY_S, allow_inf_nan=False)
    priority: int = Field(0, ge=PRIORITY_RANGE[0], le=PRIORITY_RANGE[1], description="Lower runs first")
    max_attempts: int | None = Field(None, ge=0, le=1_000_000, description="0 retries forever")
    unique: Literal["forever", "active"] | Annotated[float, Field(gt=0, le=MAX_DELAY_S, allow_inf_nan=False)] = Field(
        "forever", description="How long the key blocks another job with it: 'forever' (while the job exists), "
        "'active' (while it is unfinished) or a number of seconds since it was enqueued; needs a key")
    on_conflict: Literal["raise", "ignore"] = Field(
        "raise", description="When the key is held: 'raise' answers 409, 'ignore' returns the job holding it")
    on_dependency_failure: Literal["wait", "cancel", "run"] = Field(
        "wait", description="When a dependency ends dead or cancelled: keep waiting, cancel this job, or run it")


class JobBatchCreate(RequestModel):
    """Many jobs of one queue: all written, or none."""

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
    result: Any = Field(None, description="The handler's return value (JSON), once the job is done")
    progress: float | None = Field(None, description="0.0-1.0, as the handler last reported it")
    progress_message: str | None = None
    marker: str | None = Field(None, description="In listings: pass it as ?marker= to continue after this job")


class JobBatchPublic(BaseModel):
    """The jobs a batch wrote, in request order."""

    jobs: list[JobPublic]


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

    global_concurrency: int | None = Field(None, ge=0, le=2**31 - 1, strict=True,
                                           description="at most N running (per key with limit_by)")
    rate_limit: str | None = Field(None, max_length=32, description="at most N starts per period: N/s, N/m or N/h")


class QueueSummary(BaseModel):
    """A queue: counts per status, paused, failing since when, and its limits with their usage (null when
    unlimited)."""

    queue: str
    paused: bool
    failing_since: str | None
    counts: dict[str, int]
    limits: QueueLimitsPublic | None = None


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
    batch_size: int = Field(1000, ge=1, le=1_000_000)
    master: str | None = Field(None, max_length=200, description="refused: the master is the operator's setting")


class SparkBatchCreated(BaseModel):
    """The id of the submitted batch."""

    id: int


def job_public(job: Any, marker: str | None = None) -> dict[str, Any]:
    """The JSON of a Job (app.queue.jobs.Job)."""
    import base64

    data = job.to_dict()
    payload = data["payload"]
    encoding = "json"
    if isinstance(payload, bytes | bytearray | memoryview):
        payload, encoding = base64.b64encode(bytes(payload)).decode(), "base64"
    out = {name: data.get(name) for name in JobPublic.model_fields if name in data}
    out["payload"], out["payload_encoding"] = payload, encoding
    if marker is not None:
        out["marker"] = marker
    return out
