"""The exactly-once protocol of the Spark consumers (snapshot, delivery hash, recovery, epoch fencing).

These drive spark_jobs' consumer with the plain-Python engine on a real PostgreSQL: the same claim,
snapshot, delivery and recovery code the Spark engine uses, without a Spark session
(tests/spark/test_spark_consumer.py runs the same with a real one).
"""

from __future__ import annotations

import threading

import psycopg
import pytest

from outboxq import get_job
from outboxq.queue.backoff import RetryPolicy
from outboxq.spark_jobs import delivery
from outboxq.spark_jobs.delivery import (
    STEP_AFTER_COMMIT,
    STEP_AFTER_SNAPSHOT,
    STEP_AFTER_WRITE,
    STEP_DURING_PROCESSING,
    DeliveryFenced,
    DriverReplaced,
    OutputTableMismatch,
)
from outboxq.spark_jobs.processing import PythonEngine, isolate_failures
from tests.spark_support import (
    QUEUE,
    RESULTS,
    TABLE,
    Crash,
    consumer,
    crash_at,
    enqueue_orders,
    extra_database,
    order_payloads,
    plain_customer_totals,
    run_until_empty,
    statuses,
    table_rows,
)

ENGINE = PythonEngine(plain_customer_totals)


def _snapshots(url: str) -> list[dict]:
    with psycopg.connect(url, row_factory=psycopg.rows.dict_row) as conn:
        return conn.execute("SELECT * FROM outboxq_spark_snapshots ORDER BY id").fetchall()


def test_a_normal_run_writes_each_batch_once_with_its_delivery_hash(db_url):
    ids = enqueue_orders(db_url, order_payloads(100))

    stats = run_until_empty(db_url, ENGINE, batch_size=30)

    assert stats.batches == 4 and stats.jobs_completed == 100 and stats.jobs_failed == 0
    assert statuses(db_url) == {"done": 100}
    snapshots = _snapshots(db_url)
    assert [s["state"] for s in snapshots] == ["delivered"] * 4
    assert sorted(i for s in snapshots for i in s["job_ids"]) == ids  # every job in exactly one batch
    for s in snapshots:
        assert s["delivery_hash"] == delivery.delivery_hash("totals", s["job_ids"])
    rows = table_rows(db_url)
    assert sum(r[1] for r in rows) == 100  # the orders column: each job counted once
    assert {r[3] for r in rows} == {s["delivery_hash"] for s in snapshots}
    with psycopg.connect(db_url) as conn:  # created from the results plus the delivery hash
        columns = conn.execute("SELECT column_name, data_type FROM information_schema.columns "
                               "WHERE table_name = %s ORDER BY ordinal_position", (TABLE,)).fetchall()
    assert columns == [("customer", "text"), ("orders", "bigint"), ("total", "numeric"),
                       ("delivery_hash", "text")]


def test_the_delivery_hash_is_stable_and_independent_of_order():
    assert delivery.delivery_hash("p", [3, 1, 2]) == delivery.delivery_hash("p", [1, 2, 3])
    assert delivery.delivery_hash("p", [1, 2, 3]) != delivery.delivery_hash("q", [1, 2, 3])
    assert delivery.delivery_hash("p", [1, 2, 3]) != delivery.delivery_hash("p", [1, 2])


@pytest.mark.parametrize("step", [STEP_AFTER_SNAPSHOT, STEP_DURING_PROCESSING, STEP_AFTER_WRITE,
                                  STEP_AFTER_COMMIT])
def test_a_run_killed_at_any_step_then_rerun_equals_an_uninterrupted_run(db_url, pg_server_url, template_db,
                                                                        step):
    payloads = order_payloads(100)
    with extra_database(pg_server_url, template_db) as reference_url:
        enqueue_orders(reference_url, payloads)
        run_until_empty(reference_url, ENGINE, batch_size=30)
        expected = table_rows(reference_url)

    enqueue_orders(db_url, payloads)
    with pytest.raises(Crash):
        run_until_empty(db_url, ENGINE, batch_size=30, on_step=crash_at(step, nth=2))
    stats = run_until_empty(db_url, ENGINE, batch_size=30)  # the restarted processor: recover, go on

    assert table_rows(db_url) == expected
    assert statuses(db_url) == {"done": 100}
    assert stats.recovered == (0 if step == STEP_AFTER_COMMIT else 1)
    assert [s["state"] for s in _snapshots(db_url)] == ["delivered"] * 4


def test_recovery_is_idempotent_and_skips_delivered_snapshots(db_url):
    enqueue_orders(db_url, order_payloads(40))
    with pytest.raises(Crash):
        run_until_empty(db_url, ENGINE, batch_size=40, on_step=crash_at(STEP_AFTER_SNAPSHOT))
    first = run_until_empty(db_url, ENGINE, batch_size=40)
    again = run_until_empty(db_url, ENGINE, batch_size=40)

    assert (first.recovered, again.recovered) == (1, 0)
    assert sum(r[1] for r in table_rows(db_url)) == 40


def _claim_and_process(url: str, *, driver_id: str | None = "driver-a", lease_s: float = 600):
    """A started consumer that claimed one batch of 20 and processed it, without delivering yet."""
    started = consumer(url, ENGINE, batch_size=20, driver_id=driver_id)
    started.start()
    snapshot = delivery.claim_snapshot(
        started.conn, processor_id=started.processor_id, driver_id=started.driver_id, epoch=started.epoch,
        queue=QUEUE, output_table=TABLE, batch_size=20, lease_s=lease_s, default_max_attempts=25)
    return started, snapshot, ENGINE.process(snapshot.jobs, snapshot.delivery_hash)


def test_a_zombie_driver_cannot_deliver_after_a_new_one_started_with_its_id(db_url):
    enqueue_orders(db_url, order_payloads(20))
    zombie, snapshot, result = _claim_and_process(db_url)

    successor = consumer(db_url, ENGINE, batch_size=20, driver_id="driver-a")
    successor.start()  # bumps the epoch, adopts the zombie's snapshot at once and delivers it
    successor.close()
    assert successor.stats.recovered == 1

    with pytest.raises(DeliveryFenced):
        delivery.deliver(zombie.conn, snapshot, epoch=zombie.epoch, columns=result.columns, rows=result.rows)
    zombie.close()
    assert sum(r[1] for r in table_rows(db_url)) == 20  # written once, by the successor
    assert statuses(db_url) == {"done": 20}


def test_a_zombie_is_fenced_even_before_the_new_driver_recovers_its_batch(db_url):
    enqueue_orders(db_url, order_payloads(20))
    zombie, snapshot, result = _claim_and_process(db_url)
    with psycopg.connect(db_url) as conn:
        delivery.register_driver(conn, zombie.driver_id, zombie.processor_id)  # a new driver with its id started

    with pytest.raises(DriverReplaced, match="epoch"):
        delivery.deliver(zombie.conn, snapshot, epoch=zombie.epoch, columns=result.columns, rows=result.rows)
    zombie.close()
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT to_regclass(%s)", (f"{RESULTS}.{TABLE}",)).fetchone()[0] is None  # not written
    assert statuses(db_url) == {"running": 20}


def test_two_processors_at_once_never_claim_the_same_job(db_url):
    ids = enqueue_orders(db_url, order_payloads(600))
    claimed: dict[str, list[int]] = {"a": [], "b": []}
    start = threading.Barrier(2)

    def claim_all(name: str) -> None:
        with psycopg.connect(db_url) as conn:
            processor_id = f"proc-{name}"
            epoch = delivery.register_driver(conn, f"{processor_id}#0", processor_id)
            start.wait()
            while True:
                snapshot = delivery.claim_snapshot(
                    conn, processor_id=processor_id, driver_id=f"{processor_id}#0", epoch=epoch, queue=QUEUE,
                    output_table=f"t_{name}",
                    batch_size=7, lease_s=600, default_max_attempts=25)
                if snapshot is None:
                    return
                claimed[name].extend(snapshot.job_ids)

    threads = [threading.Thread(target=claim_all, args=(name,)) for name in claimed]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert claimed["a"] and claimed["b"]
    assert not set(claimed["a"]) & set(claimed["b"])
    assert sorted(claimed["a"] + claimed["b"]) == ids


def test_a_payload_the_processor_rejects_fails_alone_and_the_others_are_delivered(db_url):
    payloads = order_payloads(30)
    payloads[11] = {"customer": "c1", "amount": "boom"}
    payloads[20] = [1, 2, 3]  # not an object
    ids = enqueue_orders(db_url, payloads)

    stats = run_until_empty(db_url, ENGINE, batch_size=30)

    assert stats.jobs_completed == 28 and stats.jobs_failed == 2
    assert sum(r[1] for r in table_rows(db_url)) == 28
    with psycopg.connect(db_url) as conn:
        boom, not_object = get_job(conn, ids[11]), get_job(conn, ids[20])
    assert boom.status == "retrying" and "cannot read amount 'boom'" in boom.last_error
    assert not_object.status == "retrying" and "not a JSON object" in not_object.last_error
    snapshot = _snapshots(db_url)[0]
    assert snapshot["state"] == "delivered" and "2 job(s) failed" in snapshot["error"]


def test_with_an_error_queue_a_rejected_payload_is_dead_and_kept_there(db_url):
    payloads = order_payloads(10)
    payloads[3] = {"customer": "c3", "amount": "boom"}
    ids = enqueue_orders(db_url, payloads)

    run_until_empty(db_url, ENGINE, batch_size=10, error_queue="orders-in-errors")

    with psycopg.connect(db_url) as conn:
        assert get_job(conn, ids[3]).status == "dead"
        (error_payload,) = conn.execute(
            "SELECT payload FROM outboxq_jobs WHERE queue = 'orders-in-errors'").fetchone()
    assert error_payload["job_id"] == ids[3] and error_payload["payload"]["amount"] == "boom"
    assert "cannot read amount" in error_payload["error"]
    assert statuses(db_url) == {"done": 9, "dead": 1}


def test_a_processor_broken_for_every_batch_fails_the_batch_with_its_message(db_url):
    def broken(records):
        raise RuntimeError("the processor is broken")

    ids = enqueue_orders(db_url, order_payloads(12))
    stats = run_until_empty(db_url, PythonEngine(broken), batch_size=12)

    assert stats.failed_batches == 1 and stats.jobs_completed == 0
    snapshot = _snapshots(db_url)[0]
    assert snapshot["state"] == "failed" and "the processor is broken" in snapshot["error"]
    with psycopg.connect(db_url) as conn:
        job = get_job(conn, ids[0])
    assert job.status == "retrying" and "the processor is broken" in job.last_error


def test_jobs_out_of_attempts_are_dead_after_a_failed_batch(db_url):
    def broken(records):
        raise RuntimeError("still broken")

    ids = enqueue_orders(db_url, order_payloads(3))
    with psycopg.connect(db_url) as conn:
        conn.execute("UPDATE outboxq_jobs SET max_attempts = 1")
        conn.commit()
    run_until_empty(db_url, PythonEngine(broken), batch_size=3)
    with psycopg.connect(db_url) as conn:
        assert {get_job(conn, i).status for i in ids} == {"dead"}


def test_a_failed_batch_retries_each_job_after_its_consumers_own_backoff(db_url):
    def broken(records):
        raise RuntimeError("downstream down")

    ids = enqueue_orders(db_url, order_payloads(4))
    policy = RetryPolicy(max_attempts=5, backoff_base=100.0, backoff_max=1000.0, jitter=0.0)
    run_until_empty(db_url, PythonEngine(broken), batch_size=4, retry_policy=policy)
    with psycopg.connect(db_url) as conn:
        rows = conn.execute("SELECT status, attempts, extract(epoch FROM run_at - now()) FROM outboxq_jobs "
                            "WHERE id = ANY(%s)", (ids,)).fetchall()
        failing = conn.execute("SELECT consecutive_failures FROM outboxq_queues WHERE queue = %s",
                               (QUEUE,)).fetchone()
    # attempt 1 failed: the policy's 100 s (no jitter), not the settings' default of 5 s
    assert [(status, attempts) for status, attempts, _ in rows] == [("retrying", 1)] * 4
    assert all(95 < wait <= 100 for *_, wait in rows)
    assert failing == (4,)  # one consecutive failure per failed job


def test_an_existing_output_table_without_the_needed_columns_is_a_clear_error(db_url):
    with psycopg.connect(db_url) as conn:
        conn.execute(f"CREATE SCHEMA {RESULTS}; CREATE TABLE {RESULTS}.{TABLE} (customer text)")
        conn.commit()
    enqueue_orders(db_url, order_payloads(5))
    with pytest.raises(OutputTableMismatch, match="without the columns"):
        run_until_empty(db_url, ENGINE, batch_size=5)
    assert statuses(db_url) == {"running": 5}  # nothing completed: the next start recovers the batch


def test_an_existing_output_table_with_the_columns_is_used_as_it_is(db_url):
    with psycopg.connect(db_url) as conn:
        conn.execute(f"CREATE SCHEMA {RESULTS}; CREATE TABLE {RESULTS}.{TABLE} (id bigserial, customer text, orders int, total numeric(10,2), "
                     "delivery_hash text NOT NULL)")
        conn.commit()
    enqueue_orders(db_url, order_payloads(5))
    run_until_empty(db_url, ENGINE, batch_size=5)
    rows = table_rows(db_url)
    assert sum(r[2] for r in rows) == 5 and all(r[0] for r in rows)


def test_the_processor_receives_the_delivery_hash(db_url):
    seen = []

    def remember(records, delivery_hash):
        seen.append(delivery_hash)
        return [{"n": len(records)}]

    enqueue_orders(db_url, order_payloads(4))
    run_until_empty(db_url, PythonEngine(remember), batch_size=4, output_table="hashes")
    assert seen == [_snapshots(db_url)[0]["delivery_hash"]]


def test_a_snapshot_whose_lease_expired_and_was_rescued_is_recovered_with_the_same_hash(db_url):
    from outboxq.workers.maintenance import rescue

    enqueue_orders(db_url, order_payloads(10))
    with pytest.raises(Crash):
        run_until_empty(db_url, ENGINE, batch_size=10, on_step=crash_at(STEP_AFTER_SNAPSHOT))
    with psycopg.connect(db_url) as conn:
        conn.execute("UPDATE outboxq_jobs SET lease_expires_at = now() - interval '1 second'")
        conn.commit()
        rescue.run_once(conn)
        conn.commit()
    assert statuses(db_url) == {"retrying": 10}

    stats = run_until_empty(db_url, ENGINE, batch_size=10)
    assert stats.recovered == 1
    (snapshot,) = _snapshots(db_url)
    assert snapshot["state"] == "delivered"
    assert {r[3] for r in table_rows(db_url)} == {snapshot["delivery_hash"]}


def test_bisection_isolates_exactly_the_bad_jobs_deterministically():
    from outboxq.spark_jobs.delivery import SnapshotJob

    jobs = [SnapshotJob(i, "q", 1, 25, "{}") for i in range(1, 65)]
    bad = {7, 40}

    def attempt(subset):
        hit = [j.id for j in subset if j.id in bad]
        if hit:
            raise ValueError(f"bad job {hit[0]}")
        return [j.id for j in subset]

    result, failed, runs, error = isolate_failures(jobs, attempt, max_runs=64)
    assert error is None and set(failed) == bad and result == [j.id for j in jobs if j.id not in bad]
    assert failed[7] == "ValueError: bad job 7"
    assert isolate_failures(jobs, attempt, max_runs=64)[:2] == (result, failed)
    # A processor that fails for everything is a whole-batch failure, within the run budget.
    _, failed, runs, error = isolate_failures(jobs, lambda s: 1 / 0, max_runs=16)
    assert failed == {} and isinstance(error, ZeroDivisionError) and runs <= 16


def test_a_consumer_whose_connection_is_cut_reconnects_and_delivers_each_batch_once(db_url):
    enqueue_orders(db_url, order_payloads(60))
    c = consumer(db_url, ENGINE, batch_size=20)
    cut = {"done": False}

    def cut_connection(step: str) -> None:
        if step == STEP_DURING_PROCESSING and not cut["done"]:
            cut["done"] = True
            with psycopg.connect(db_url, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (c.conn.info.backend_pid,))

    c.on_step = cut_connection
    c.start()
    first_epoch = c.epoch
    stats = c.run(until_empty=True)
    c.close()

    assert cut["done"] and c.epoch == first_epoch + 1 and stats.recovered == 1
    assert statuses(db_url) == {"done": 60}
    assert sum(r[1] for r in table_rows(db_url)) == 60
    assert [s["state"] for s in _snapshots(db_url)] == ["delivered"] * 3


def test_a_zombie_drivers_late_delivery_is_refused_once_another_driver_adopted_its_snapshot(db_url):
    enqueue_orders(db_url, order_payloads(20))
    zombie, snapshot, result = _claim_and_process(db_url, driver_id=None, lease_s=0.5)
    with psycopg.connect(db_url) as conn:  # the zombie stopped renewing: its snapshot's lease lapses
        conn.execute("UPDATE outboxq_spark_snapshots SET lease_expires_at = now() - interval '1 second'")
        conn.commit()

    adopter = consumer(db_url, ENGINE, batch_size=20)
    adopter.start()  # a driver of the same processor with an id of its own: it adopts the lapsed snapshot
    adopter.close()
    assert adopter.driver_id != zombie.driver_id and adopter.stats.recovered == 1

    with pytest.raises(DeliveryFenced, match="no longer claimed by this lease"):
        delivery.deliver(zombie.conn, snapshot, epoch=zombie.epoch, columns=result.columns, rows=result.rows)
    zombie.close()
    (row,) = _snapshots(db_url)
    assert row["state"] == "delivered" and row["driver_id"] == adopter.driver_id and row["epoch"] == 2
    assert row["delivery_hash"] == snapshot.delivery_hash  # same jobs, same hash
    assert {r[3] for r in table_rows(db_url)} == {snapshot.delivery_hash}
    assert sum(r[1] for r in table_rows(db_url)) == 20  # written once, by the adopter
    assert statuses(db_url) == {"done": 20}


def test_a_snapshot_whose_lease_is_live_is_not_adopted_by_another_driver(db_url):
    enqueue_orders(db_url, order_payloads(20))
    owner, snapshot, result = _claim_and_process(db_url, driver_id=None)
    other = consumer(db_url, ENGINE, batch_size=20)
    other.start()
    assert other.driver_id != owner.driver_id and other.stats.recovered == 0
    assert not other.run_once()  # nothing due, nothing to adopt
    other.close()

    delivery.deliver(owner.conn, snapshot, epoch=owner.epoch, columns=result.columns, rows=result.rows)
    owner.close()
    assert statuses(db_url) == {"done": 20}


def test_drivers_without_an_id_take_distinct_slots_and_a_restarted_one_takes_its_slot_back(db_url):
    first, second = consumer(db_url, ENGINE), consumer(db_url, ENGINE)
    first.start()
    second.start()
    assert (first.driver_id, second.driver_id) == ("totals#0", "totals#1")
    first.close()
    again = consumer(db_url, ENGINE)
    again.start()
    assert again.driver_id == "totals#0" and again.epoch == 2  # the same id, a new epoch
    again.close()
    second.close()


def test_a_driver_closed_and_restarted_at_once_always_gets_its_slot_back(db_url):
    # A closed connection's backend releases its locks a moment after the close: close() gives the slot back
    # itself, or a restart within that moment takes another id (and waits out its own snapshots' lease).
    for epoch in range(1, 21):
        driver = consumer(db_url, ENGINE)
        driver.start()
        try:
            assert (driver.driver_id, driver.epoch) == ("totals#0", epoch)
        finally:
            driver.close()


def test_three_drivers_of_one_processor_drain_a_queue_together_exactly_once(db_url):
    enqueue_orders(db_url, order_payloads(900))
    drivers = [consumer(db_url, ENGINE, batch_size=25) for _ in range(3)]
    for d in drivers:
        d.start()
    threads = [threading.Thread(target=d.run, kwargs={"until_empty": True}) for d in drivers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for d in drivers:
        d.close()

    assert sorted(d.driver_id for d in drivers) == ["totals#0", "totals#1", "totals#2"]
    assert sum(d.stats.jobs_completed for d in drivers) == 900
    assert all(d.stats.batches > 0 for d in drivers)
    assert statuses(db_url) == {"done": 900}
    assert sum(r[1] for r in table_rows(db_url)) == 900
    assert {s["state"] for s in _snapshots(db_url)} == {"delivered"}
