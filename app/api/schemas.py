"""Request and response models. Requests forbid unknown fields, so a typo is an error and not a default."""

from __future__ import annotations

from typing import Any

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


class QueueSummary(BaseModel):
    """A queue: counts per status, paused, failing since when."""

    queue: str
    paused: bool
    failing_since: str | None
    counts: dict[str, int]


class QueueList(BaseModel):
    """Every known queue."""

    queues: list[QueueSummary]


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
