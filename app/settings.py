"""One Settings object for every outboxq process (API, workers, Spark, CLI)."""

from __future__ import annotations

from functools import lru_cache
from typing import Annotated, Literal

from pydantic import AliasChoices, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


class Settings(BaseSettings):
    """Configuration read from the environment (``OUTBOXQ_*``, plus ``DATABASE_URL``)."""

    model_config = SettingsConfigDict(env_prefix="OUTBOXQ_", extra="ignore")

    # A postgresql:// URL. None means: start (or reuse) the embedded PostgreSQL.
    database_url: str | None = Field(
        default=None, validation_alias=AliasChoices("DATABASE_URL", "OUTBOXQ_DATABASE_URL")
    )
    # The PostgreSQL schema that holds every outboxq object (OUTBOXQ_SCHEMA): several independent outboxq
    # instances can share one database, one schema each. Enqueue qualifies its statements with it; outboxq's
    # own connections (workers, API, CLI) put it first on their search_path.
    db_schema: str = Field(default="public", pattern=r"^[a-z_][a-z0-9_]{0,62}$",
                           validation_alias=AliasChoices("OUTBOXQ_SCHEMA", "OUTBOXQ_DB_SCHEMA"))
    # Where the embedded PostgreSQL keeps its data; None means the user's data directory.
    embedded_data_dir: str | None = None

    # Worker defaults; a consumer may override each of them.
    max_attempts: int = 25
    backoff_base: float = 5.0
    backoff_max: float = 3600.0
    backoff_jitter: float = 0.25
    lease_s: float = 60.0
    max_execute_s: float = 300.0
    # Seconds after which a running attempt is failed (OUTBOXQ_JOB_TIMEOUT_S; None: no timeout). An async
    # handler is cancelled; a sync one is fenced and its handler slot given to a new thread.
    job_timeout_s: float | None = Field(default=None, gt=0)
    poll_interval: float = 1.0
    batch_size: int = 500
    concurrency: int = 16
    # `outboxq worker` processes (OUTBOXQ_WORKER_PROCESSES; --processes): a number, or "auto": one per core up
    # to outboxq.workers.processes.MAX_AUTO_PROCESSES (each process holds about five connections).
    worker_processes: str = Field(default="auto", pattern=r"^(auto|[1-9][0-9]{0,3})$")
    shutdown_timeout: float = 30.0
    # A worker not seen for this long has left the live workers' list (GET /v1/workers, `outboxq workers`);
    # each worker announces itself six times within it.
    worker_lapse_s: float = Field(default=30.0, ge=1.0, le=86400.0)
    # sys.setswitchinterval for worker processes (0: leave the interpreter's 5 ms default).
    worker_switch_interval_s: float = 0.001

    # Maintenance
    retention_done_s: float = 7 * 24 * 3600.0
    retention_dead_s: float = 30 * 24 * 3600.0
    # How long an Idempotency-Key is remembered: a client retrying later than this enqueues anew.
    idempotency_ttl_s: float = 24 * 3600.0
    healthy_allowed_error_time_s: float = 15 * 60.0
    health_startup_grace_s: float = 60.0

    # Log lines: "auto" is readable on a terminal and JSON otherwise; "json" or "text" always (OUTBOXQ_LOG_FORMAT).
    log_format: Literal["auto", "json", "text"] = "auto"

    # Context variables captured at enqueue ("module:name" of a contextvars.ContextVar).
    context_vars: list[str] = Field(default_factory=list)

    # HTTP service
    api_tokens: str = ""
    max_payload_bytes: int = 1024 * 1024
    max_batch_jobs: int = 1000
    # A batch request's body (OUTBOXQ_MAX_BATCH_BYTES): a bound of its own, below max_batch_jobs payloads of
    # max_payload_bytes (a GiB by default), since a body within it is held and parsed whole.
    max_batch_bytes: int = Field(default=32 * 1024 * 1024, ge=1024)
    # Dependency rows one request may write (a job's depends_on, summed over a batch's jobs).
    max_dependencies_per_request: int = Field(default=1000, ge=0)
    db_pool_min: int = 1
    db_pool_max: int = 10
    host: str = "127.0.0.1"
    port: int = 8000
    # A client (address) that sent this many wrong tokens within the window is answered 429 until the oldest
    # of them leaves the window.
    auth_max_failures: int = Field(default=10, ge=1)
    auth_failure_window_s: float = Field(default=60.0, gt=0)
    # HMAC key of the listing markers; empty: a random key made by the first API process and kept in the
    # database (outboxq_secrets), so markers survive restarts and agree across API processes.
    marker_secret: str = ""
    # How long `outboxq serve` waits for the database at start-up before serving (503 on /readyz) anyway, and
    # `outboxq worker` and `outboxq spark run` before they give up (exit 1).
    db_wait_s: float = 30.0
    # True: GET /metrics answers without a token (OUTBOXQ_METRICS_PUBLIC); by default it needs the read scope.
    metrics_public: bool = False
    # True: per-key limit series carry the limit key as a label (OUTBOXQ_METRICS_KEY_LABELS); by default a
    # queue's keys appear only as a count, since keys come from payloads (customer ids, say).
    metrics_key_labels: bool = False
    # Addresses whose X-Forwarded-For / X-Forwarded-Proto `outboxq serve` trusts (comma-separated, "*" for all;
    # OUTBOXQ_FORWARDED_ALLOW_IPS). Empty: none, so a client cannot pick the address it is throttled under.
    forwarded_allow_ips: str = ""
    # JSON bodies nested deeper than this (objects and arrays) are refused with 422 before they are parsed.
    max_json_depth: int = Field(default=64, ge=2, le=1000)
    # HTTP-submitted Spark batches pending (waiting for one of spark_max_batches) beyond this: 429.
    spark_max_pending_batches: int = Field(default=16, ge=0)

    # Bounds of what a handler hands back (documented in the README's security section).
    # A stored result's JSON (OUTBOXQ_MAX_RESULT_BYTES): a larger result fails its attempt ("result not storable").
    max_result_bytes: int = Field(default=1024 * 1024, ge=1024)
    # A failure's error text and traceback (each): longer ones are cut, with a marker saying how much was cut.
    max_error_bytes: int = Field(default=64 * 1024, ge=256)
    max_traceback_bytes: int = Field(default=64 * 1024, ge=256)
    # One log line's message: longer ones are cut, with a marker.
    max_log_line_bytes: int = Field(default=16 * 1024, ge=256)

    # Spark consumers (spark_jobs): any master URL works (local[*], spark://, yarn, k8s://).
    spark_master: str = "local[*]"
    spark_app_name: str = "outboxq-spark"
    spark_shuffle_partitions: int = 2
    spark_batch_size: int = 10_000
    # A Spark batch holds its jobs' lease this long; the consumer renews it while processing.
    spark_lease_s: float = 600.0
    # Extra Spark configuration (JSON object in OUTBOXQ_SPARK_CONF), e.g. {"spark.executor.memory": "2g"}.
    spark_conf: dict[str, str] = Field(default_factory=dict)
    # The processors an HTTP request may name (OUTBOXQ_SPARK_PROCESSORS="totals=my_app.spark:totals,..."):
    # a request picks one by name and never names code to import.
    spark_processors: Annotated[dict[str, str], NoDecode] = Field(default_factory=dict)
    # How many payloads of a batch its schema is inferred from (0: all) when the processor declares none.
    spark_schema_sample: int = Field(default=1000, ge=0)
    # At most this many HTTP-submitted Spark batches run at once; the others wait as `pending`.
    spark_max_batches: int = Field(default=2, ge=1)
    # The PostgreSQL schema the Spark output tables go to: never outboxq's own schema or tables.
    spark_results_schema: str = Field(default="outboxq_results", pattern=r"^[a-z_][a-z0-9_]{0,62}$")
    # Where HTTP-submitted batches log (created private to this user); None: a folder under the temp dir.
    spark_log_dir: str | None = None

    @field_validator("spark_processors", mode="before")
    @classmethod
    def _parse_processors(cls, value: object) -> object:
        """``name=module:function`` pairs separated by commas (a dict passes through as it is)."""
        if not isinstance(value, str):
            return value
        registry = {}
        for entry in filter(None, (part.strip() for part in value.split(","))):
            name, sep, spec = (item.strip() for item in entry.partition("="))
            if not sep or not name or ":" not in spec:
                raise ValueError(f"OUTBOXQ_SPARK_PROCESSORS entry {entry!r}: write name=module:function")
            registry[name] = spec
        return registry

    @model_validator(mode="after")
    def _results_apart_from_outboxq(self) -> Settings:
        """Spark output tables never share outboxq's schema (a table named like outboxq's would be its)."""
        if self.spark_results_schema == self.db_schema:
            raise ValueError("OUTBOXQ_SPARK_RESULTS_SCHEMA must differ from OUTBOXQ_SCHEMA")
        return self


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once from the environment."""
    return Settings()
