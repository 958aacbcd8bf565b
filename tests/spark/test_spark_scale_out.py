"""Several `outboxq spark run` drivers of one processor on one queue, with real Spark and PostgreSQL:
they share the work, a killed driver's snapshot is adopted by a live one, and each job is delivered once."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import psycopg
import pytest

from outboxq.spark_jobs import delivery
from tests.spark_support import (
    enqueue_orders,
    expected_totals,
    order_payloads,
    spark_env,
    spark_run_command,
    statuses,
    summed_totals,
    table_rows,
)
from tests.support import wait_for

pytestmark = pytest.mark.spark


def _registered_drivers(url: str) -> int:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT count(*) FROM outboxq_spark_drivers").fetchone()[0]


def _snapshots(url: str) -> list[dict]:
    with psycopg.connect(url, row_factory=psycopg.rows.dict_row) as conn:
        return conn.execute("SELECT * FROM outboxq_spark_snapshots ORDER BY id").fetchall()


def _start(command: list[str], env: dict[str, str], log_path) -> subprocess.Popen:
    # Its own process group: a kill takes the driver's Spark JVM with it, as a lost machine would.
    with open(log_path, "w") as log:
        return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=log, text=True,
                                start_new_session=True)


def test_several_drivers_of_one_processor_run_together_and_deliver_each_job_once(db_url, tmp_path):
    drivers = 3  # (two drivers were a case of their own once; three cover them and cost one JVM less than both)
    env = spark_env(db_url, OUTBOXQ_POLL_INTERVAL="0.1")
    processes = [_start(spark_run_command("--batch-size", "20"), env, tmp_path / f"driver{i}.log")
                 for i in range(drivers)]
    try:
        # Every driver is up (its Spark session started) before there is work: they all compete for it.
        wait_for(lambda: _registered_drivers(db_url) == drivers, timeout=180, interval=0.5)
        payloads = order_payloads(40 * 20)
        enqueue_orders(db_url, payloads)
        wait_for(lambda: statuses(db_url) == {"done": 800}, timeout=240, interval=0.5)
    finally:
        for p in processes:
            p.send_signal(signal.SIGTERM)
        outputs = [p.communicate(timeout=120)[0] for p in processes]
    logs = "".join(f.read_text()[-2000:] for f in tmp_path.glob("*.log"))

    assert [p.returncode for p in processes] == [0] * drivers, logs
    results = [json.loads(out) for out in outputs]
    assert len({r["driver_id"] for r in results}) == drivers
    assert all(r["batches"] > 0 for r in results), results  # each driver took its share
    assert sum(r["jobs_completed"] for r in results) == 800
    assert sum(r["batches"] for r in results) == 40
    assert summed_totals(table_rows(db_url, "order_totals")) == expected_totals(payloads)
    snapshots = _snapshots(db_url)
    assert len(snapshots) == 40 and {s["state"] for s in snapshots} == {"delivered"}
    assert len({s["driver_id"] for s in snapshots}) == drivers


def test_a_driver_killed_mid_batch_has_its_snapshot_adopted_by_a_running_driver_and_delivered_once(
        db_url, tmp_path):
    payloads = order_payloads(100)
    enqueue_orders(db_url, payloads)
    env = spark_env(db_url, OUTBOXQ_POLL_INTERVAL="0.1", OUTBOXQ_SPARK_LEASE_S="5")
    victim = _start(spark_run_command("--batch-size", "20"), {**env, "OUTBOXQ_SPARK_STALL_AT": "during_processing"},
                    tmp_path / "victim.log")
    survivor = None
    try:
        (claimed,) = wait_for(lambda: _snapshots(db_url), timeout=180, interval=0.5)  # mid-batch, stalled
        survivor = _start(spark_run_command("--batch-size", "20", "--until-empty"), env, tmp_path / "survivor.log")
        wait_for(lambda: _registered_drivers(db_url) == 2, timeout=180, interval=0.5)
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait(timeout=30)
        output = survivor.communicate(timeout=240)[0]
    finally:
        for p in (victim, survivor):
            if p is not None and p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    log = (tmp_path / "survivor.log").read_text()[-3000:]

    assert victim.returncode == -signal.SIGKILL
    assert survivor.returncode == 0, log
    result = json.loads(output)
    assert result["recovered"] == 1 and result["jobs_completed"] == 100
    adopted = next(s for s in _snapshots(db_url) if s["id"] == claimed["id"])
    assert adopted["state"] == "delivered" and adopted["epoch"] == 2
    assert adopted["driver_id"] == result["driver_id"] != claimed["driver_id"]
    assert adopted["job_ids"] == claimed["job_ids"]
    assert adopted["delivery_hash"] == claimed["delivery_hash"] == delivery.delivery_hash(
        claimed["processor_id"], claimed["job_ids"])
    rows = table_rows(db_url, "order_totals")
    assert sum(r[1] for r in rows if r[3] == claimed["delivery_hash"]) == 20  # its rows written once
    assert summed_totals(rows) == expected_totals(payloads)
    assert statuses(db_url) == {"done": 100}
