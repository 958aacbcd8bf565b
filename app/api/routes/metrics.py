"""Prometheus metrics of the queues, built with prometheus-client from statements whose cost follows the
unfinished jobs, never the finished history (workers serve their own counters: `outboxq worker
--metrics-port`). Counts only: never a payload, and no limit key (keys come from payloads: customer ids, say)
unless OUTBOXQ_METRICS_KEY_LABELS is set; by default a per-key queue's keys appear as a count."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response
from fastapi.security import HTTPAuthorizationCredentials
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from outboxq.api.auth import check
from outboxq.api.deps import PoolDep, transaction
from outboxq.api.errors import error_responses
from outboxq.api.routing import OutboxqRoute, api_state
from outboxq.queue import limits, sql
from outboxq.queue.sql import spark_stream as stream_sql

router = APIRouter(tags=["metrics"], route_class=OutboxqRoute)

UNFINISHED_STATUSES = ("waiting", "queued", "running", "retrying")


class QueueSnapshot:
    """A prometheus-client collector over one read of the queues' current state."""

    def __init__(self, counts: list[dict[str, Any]], lag: list[dict[str, Any]], states: list[dict[str, Any]],
                 limit_usage: list[dict[str, Any]] | None = None, limit_keys: list[dict[str, Any]] | None = None,
                 *, key_labels: bool = False, streams: list[dict[str, Any]] | None = None):
        self.counts, self.lag, self.states = counts, lag, states
        self.streams = streams or []
        self.limit_usage = limit_usage or []
        self.limit_keys = limit_keys or []
        self.key_labels = key_labels

    def collect(self) -> Iterator[Metric]:
        """The metric families (the prometheus-client collector protocol)."""
        queues = sorted({r["queue"] for r in self.counts} | {r["queue"] for r in self.states})
        by_status = {(r["queue"], r["status"]): r["n"] for r in self.counts}
        jobs = GaugeMetricFamily("outboxq_jobs", "Unfinished jobs, by queue and status", labels=["queue", "status"])
        depth = GaugeMetricFamily("outboxq_queue_depth", "Jobs waiting to run (queued + retrying)", labels=["queue"])
        for queue in queues:
            for status in UNFINISHED_STATUSES:
                jobs.add_metric([queue, status], by_status.get((queue, status), 0))
            depth.add_metric([queue], by_status.get((queue, "queued"), 0) + by_status.get((queue, "retrying"), 0))
        yield jobs
        yield depth
        lag = GaugeMetricFamily("outboxq_queue_lag_seconds",
                                "Age of the oldest job that is ready to run (0 when none is)", labels=["queue"])
        lag_by_queue = {r["queue"]: r["lag_s"] for r in self.lag}
        for queue in queues:
            lag.add_metric([queue], max(0.0, lag_by_queue.get(queue, 0.0)))
        yield lag
        paused = GaugeMetricFamily("outboxq_queue_paused", "1 when the queue is paused", labels=["queue"])
        failing = GaugeMetricFamily("outboxq_queue_failing", "1 while the queue's jobs keep failing (backoff)",
                                    labels=["queue"])
        for r in self.states:
            paused.add_metric([r["queue"]], 1 if r["paused"] else 0)
            failing.add_metric([r["queue"]], 1 if r["failing"] else 0)
        yield paused
        yield failing
        yield from self._limit_families()
        yield from self._stream_families()

    def _stream_families(self) -> Iterator[Metric]:
        """Spark streaming queries reading outboxq (format "outboxq"), by stream name and queue."""
        labels = ["stream", "queue"]
        running = GaugeMetricFamily("outboxq_spark_stream_running", "1 while the streaming query is running",
                                    labels=labels)
        ready = GaugeMetricFamily("outboxq_spark_stream_ready_jobs", "Jobs of the stream's queue ready to read (lag)",
                                  labels=labels)
        batches = CounterMetricFamily("outboxq_spark_stream_micro_batches", "Micro-batches claimed", labels=labels)
        jobs = CounterMetricFamily("outboxq_spark_stream_jobs_read", "Jobs claimed by micro-batches", labels=labels)
        renewals = CounterMetricFamily("outboxq_spark_stream_lease_renewals", "Micro-batch leases renewed",
                                       labels=labels)
        for r in self.streams:
            names = [r["name"], r["queue"]]
            running.add_metric(names, 1 if r["running"] else 0)
            ready.add_metric(names, r["lag"])
            batches.add_metric(names, r["micro_batches"])
            jobs.add_metric(names, r["jobs_read"])
            renewals.add_metric(names, r["lease_renewals"])
        yield from (running, ready, batches, jobs, renewals)

    def _limit_families(self) -> Iterator[Metric]:
        """Flow control: each limited queue's limits and their use (limits.usage); the busiest keys by name only
        with key_labels, else how many keys run per queue."""
        labels = ["queue"]
        concurrency = GaugeMetricFamily("outboxq_queue_limit_concurrency",
                                        "Global concurrency limit (per key when per_key is 1)", labels=labels)
        rate = GaugeMetricFamily("outboxq_queue_limit_rate_per_second",
                                 "Rate limit in starts per second (per key when per_key is 1)", labels=labels)
        per_key = GaugeMetricFamily("outboxq_queue_limit_per_key", "1 when the limits apply to each limit key",
                                    labels=labels)
        running = GaugeMetricFamily("outboxq_queue_limit_running", "Jobs of a limited queue running now",
                                    labels=labels)
        starts = GaugeMetricFamily("outboxq_queue_limit_window_starts",
                                   "Starts within the last rate-limit period", labels=labels)
        keys = GaugeMetricFamily("outboxq_queue_limit_keys_running",
                                 "Limit keys with jobs running now, of a per-key queue", labels=labels)
        for r in self.limit_keys:
            keys.add_metric([r["queue"]], r["keys"])
        key_running = GaugeMetricFamily("outboxq_queue_limit_key_running",
                                        "Jobs running now of a per-key queue's busiest keys (at most five)",
                                        labels=["queue", "key"])
        for u in self.limit_usage:
            queue = [u["queue"]]
            if u["global_concurrency"] is not None:
                concurrency.add_metric(queue, u["global_concurrency"])
            if u["rate_limit"] is not None:
                count, period = limits.parse_rate_limit(u["rate_limit"])
                rate.add_metric(queue, (count or 0) / (period or 1.0))
            per_key.add_metric(queue, 1 if u["per_key"] else 0)
            running.add_metric(queue, u["running"])
            starts.add_metric(queue, u["recent_starts"])
            for k in u["busiest_keys"]:
                key_running.add_metric([u["queue"], k["key"] or ""], k["running"])
        yield from (concurrency, rate, per_key, running, starts, keys)
        if self.key_labels:  # opted in (OUTBOXQ_METRICS_KEY_LABELS): a series per key, named after it
            yield key_running


@router.get("/metrics", response_class=PlainTextResponse,
            responses={200: {"description": "The Prometheus text exposition format",
                             "content": {CONTENT_TYPE_LATEST.split(";")[0]: {"schema": {"type": "string"}}}},
                       **error_responses(401, 403)},
            openapi_extra={"x-required-scope": "read (none when metrics_public is true)"})
def metrics(request: Request, pool: PoolDep) -> Response:
    """Prometheus metrics: unfinished jobs per queue and status, depth, lag, paused and failing queues, and the
    limited queues' limits and usage. Needs the read scope unless OUTBOXQ_METRICS_PUBLIC is set: the queue
    names and their load are the application's business too."""
    settings = api_state(request).settings
    if not settings.metrics_public:
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        credentials = HTTPAuthorizationCredentials(scheme=scheme, credentials=token.strip()) if header else None
        check(request, credentials, "read")
    with transaction(pool) as conn:
        snapshot = QueueSnapshot(conn.execute(sql.metrics_unfinished_counts).fetchall(),
                                 conn.execute(sql.metrics_queue_lag).fetchall(),
                                 conn.execute(sql.metrics_queue_states).fetchall(),
                                 limits.usage(conn),
                                 conn.execute(sql.metrics_limit_keys_running).fetchall(),
                                 key_labels=settings.metrics_key_labels,
                                 streams=conn.execute(stream_sql.spark_stream_list,
                                                      {"limit": 500, "lapse_s": stream_sql.STREAM_LAPSE_S}).fetchall())
    registry = CollectorRegistry()
    registry.register(snapshot)
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
