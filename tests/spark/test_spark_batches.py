"""Spark batches over HTTP with real Spark and PostgreSQL: registered processors only, the master from the
operator's settings, batches of one queue running side by side under a cap, a private environment and log."""

from __future__ import annotations

import stat
import time
from pathlib import Path

import pytest

from tests.api_support import api_client, count
from tests.spark_support import (
    enqueue_orders,
    expected_totals,
    order_payloads,
    statuses,
    summed_totals,
    table_rows,
)
from tests.support import wait_for

pytestmark = pytest.mark.spark

REGISTERED = {"totals": "outboxq.spark_jobs.examples:order_totals",
              "lines": "outboxq.spark_jobs.examples:order_lines"}


def _spark_api(db_url: str, log_dir: Path, **overrides):
    """An API whose operator registered two processors and runs batches on local[1] Spark."""
    return api_client(db_url, spark_processors=REGISTERED, spark_master="local[1]", spark_log_dir=str(log_dir),
                      spark_shuffle_partitions=1, **overrides)


def _batch_processes(db_url: str) -> dict[int, int]:
    """batch id -> pid of every `outboxq spark run --batch-id N` process on this machine driving db_url's database.

    Filtered by database because an earlier test's driver may still be shutting its JVM down after its batch
    was recorded done."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if b"--batch-id" not in argv or b"outboxq.cli" not in argv:
                continue
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if b"DATABASE_URL=" + db_url.encode() in environ:
            found[int(argv[argv.index(b"--batch-id") + 1])] = int(entry.name)
    return found


def _wait_until_finished(api, batch_id: int, timeout: float = 300) -> dict:
    return wait_for(lambda: (b := api.get(f"/v1/spark/batches/{batch_id}").json())["state"] in ("done", "failed")
                    and b, timeout=timeout, interval=0.5)


def test_a_batch_of_a_registered_processor_runs_and_reports_its_counts(db_url, tmp_path):
    payloads = order_payloads(30)
    enqueue_orders(db_url, payloads)
    with _spark_api(db_url, tmp_path / "logs") as api:
        r = api.post("/v1/spark/batches", json={"queue": "orders-in", "output_table": "http_totals",
                                                "processor": "totals", "batch_size": 10})
        assert r.status_code == 202, r.text
        batch = _wait_until_finished(api, r.json()["id"])

    log = "".join(p.read_text() for p in (tmp_path / "logs").glob("*.log"))
    assert batch["state"] == "done", (batch, log[-3000:])
    assert batch["master"] is None  # the operator's local[1], never a request's
    assert batch["jobs_claimed"] == 30 and batch["rows_written"] == len(table_rows(db_url, "http_totals"))
    assert [s["jobs"] for s in batch["snapshots"]] == [10, 10, 10]
    assert all(s["state"] == "delivered" for s in batch["snapshots"])
    assert summed_totals(table_rows(db_url, "http_totals")) == expected_totals(payloads)
    assert statuses(db_url) == {"done": 30}


def test_an_unregistered_processor_is_refused_with_the_registered_names_and_nothing_starts(db_url, tmp_path):
    with _spark_api(db_url, tmp_path / "logs") as api:
        for processor in ("outboxq.spark_jobs.examples:order_totals", "os:system", "no_such"):
            r = api.post("/v1/spark/batches", json={"queue": "orders-in", "output_table": "t",
                                                    "processor": processor})
            assert r.status_code == 422, r.text
            message = r.json()["error"]["message"]
            assert f"unknown processor {processor!r}" in message and "lines, totals" in message
    assert count(db_url, "SELECT count(*) FROM outboxq_spark_batches") == 0
    assert not (tmp_path / "logs").exists() and not _batch_processes(db_url)


def test_a_request_naming_a_master_is_refused_and_nothing_starts(db_url, tmp_path):
    with _spark_api(db_url, tmp_path / "logs") as api:
        r = api.post("/v1/spark/batches", json={"queue": "orders-in", "output_table": "t", "processor": "totals",
                                                "master": "spark://attacker.example:7077"})
    assert r.status_code == 422 and r.json()["error"]["code"] == "master_not_allowed"
    assert count(db_url, "SELECT count(*) FROM outboxq_spark_batches") == 0
    assert not (tmp_path / "logs").exists() and not _batch_processes(db_url)


def test_batches_on_one_queue_run_side_by_side_and_a_third_waits_pending_under_the_cap(
        db_url, tmp_path, monkeypatch):
    monkeypatch.setenv("OUTBOXQ_API_TOKENS", "the-api-secret:admin")  # in the API's environment only
    payloads = order_payloads(600)
    enqueue_orders(db_url, payloads)
    body = {"queue": "orders-in", "output_table": "shared_totals", "processor": "totals", "batch_size": 20}
    with _spark_api(db_url, tmp_path / "logs", spark_max_batches=2) as api:
        ids = [api.post("/v1/spark/batches", json=body).json()["id"] for _ in range(3)]

        def states() -> list[str]:
            return [api.get(f"/v1/spark/batches/{i}").json()["state"] for i in ids]

        wait_for(lambda: sorted(states()) == ["pending", "running", "running"], timeout=60, interval=0.2)
        pending = ids[states().index("pending")]
        # The waiting batch's process is up, with only the environment a driver needs.
        pid = wait_for(lambda: _batch_processes(db_url).get(pending), timeout=30)
        environ = dict(line.split("=", 1) for line in Path(f"/proc/{pid}/environ").read_text().split("\0") if line)
        assert "OUTBOXQ_API_TOKENS" not in environ and environ["DATABASE_URL"] == db_url
        assert environ["OUTBOXQ_SPARK_PROCESSORS"] == "totals=outboxq.spark_jobs.examples:order_totals," \
                                                     "lines=outboxq.spark_jobs.examples:order_lines"
        time.sleep(3)
        assert states().count("pending") == 1  # still under the cap of 2 while two run
        finished = [_wait_until_finished(api, i) for i in ids]

    log_dir = tmp_path / "logs"
    logs = "".join(p.read_text()[-2000:] for p in log_dir.glob("*.log"))
    assert [b["state"] for b in finished] == ["done"] * 3, logs
    running = [b for b in finished if b["id"] != pending]
    assert all(b["jobs_claimed"] > 0 for b in running), running  # the first two shared the queue
    assert sum(b["jobs_claimed"] for b in finished) == 600
    assert finished[ids.index(pending)]["started_at"] >= min(b["finished_at"] for b in running)
    assert summed_totals(table_rows(db_url, "shared_totals")) == expected_totals(payloads)
    assert statuses(db_url) == {"done": 600}
    assert stat.S_IMODE(log_dir.stat().st_mode) == 0o700
    assert {stat.S_IMODE(p.stat().st_mode) for p in log_dir.glob("*.log")} == {0o600}


def test_the_processor_registry_setting_reads_name_equals_module_function_pairs(monkeypatch):
    from pydantic import ValidationError

    from outboxq.settings import Settings

    monkeypatch.setenv("OUTBOXQ_SPARK_PROCESSORS", " totals = my_app.spark:totals,lines=my_app.spark:lines ,")
    assert Settings().spark_processors == {"totals": "my_app.spark:totals", "lines": "my_app.spark:lines"}
    for bad in ("totals", "totals=my_app.spark.totals", "=m:f"):
        monkeypatch.setenv("OUTBOXQ_SPARK_PROCESSORS", bad)
        with pytest.raises(ValidationError, match="name=module:function"):
            Settings()
