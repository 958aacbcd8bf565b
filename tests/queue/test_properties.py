"""Property-based test of the core on a real PostgreSQL: random sequences of every statement that moves a job
(enqueue with or without dependencies, claim, complete, fail, snooze, hand back, Spark's release, rescue,
promote, retry, cancel and a cancel honoured while running), checked against the table of allowed
transitions after every step.
"""

from __future__ import annotations

import psycopg
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test
from psycopg.rows import dict_row

from outboxq import enqueue, enqueue_many
from outboxq.errors import InvalidTransition
from outboxq.queue import admin, sql
from outboxq.queue.jobs import ALLOWED_TRANSITIONS, JobStatus
from outboxq.queue.sql import spark as spark_sql
from outboxq.workers.executor import ClaimedJob, Outcome
from outboxq.workers.maintenance import promote, rescue
from outboxq.workers.registry import Consumer
from outboxq.workers.runner import Worker

QUEUE = "prop"
MAX_ATTEMPTS = 3


def make_machine(url: str):
    consumer = Consumer(QUEUE, lambda p, c: None, max_attempts=MAX_ATTEMPTS, backoff_base=0.0, jitter=0.0)

    class QueueMachine(RuleBasedStateMachine):
        """Two workers racing over one queue, with an operator and a rescuer."""

        @initialize()
        def reset(self):
            self.conn = psycopg.connect(url, row_factory=dict_row)
            self.conn.execute("TRUNCATE outboxq_jobs, outboxq_queues, outboxq_job_errors CASCADE")
            self.conn.commit()
            self.workers = [Worker([consumer], url=url, listen=False, run_maintenance=False) for _ in range(2)]
            self.held: list[dict[int, ClaimedJob]] = [{}, {}]
            self.seen: dict[int, JobStatus] = {}
            self.pairs = 0

        def teardown(self):
            self.conn.close()

        def _ids(self) -> list[int]:
            return sorted(self.seen)

        @rule(n=st.integers(1, 4))
        def enqueue(self, n):
            enqueue_many(self.conn, QUEUE, [{"i": i} for i in range(n)])
            self.conn.commit()

        @rule(on_failure=st.sampled_from(["wait", "cancel", "run"]))
        def enqueue_dependent(self, on_failure):
            """A keyed parent and a child that waits for it (the child starts waiting)."""
            self.pairs += 1
            enqueue(self.conn, QUEUE, {}, key=f"parent-{self.pairs}")
            enqueue(self.conn, QUEUE, {}, key=f"child-{self.pairs}", depends_on=[(QUEUE, f"parent-{self.pairs}")],
                    on_dependency_failure=on_failure)
            self.conn.commit()

        @rule()
        def promote_waiting(self):
            """Maintenance's promote pass: release, cancel or keep waiting jobs per their dependencies."""
            promote.run_once(self.conn)

        @rule(worker=st.integers(0, 1), data=st.data())
        def honour_cancel(self, worker, data):
            """A handler saw ctx.cancelled (the operator cancelled its running job) and stopped."""
            if not self.held[worker]:
                return
            job = self.held[worker].pop(data.draw(st.sampled_from(sorted(self.held[worker]))))
            outcome = Outcome(job=job, succeeded=False, error="cancelled while running", cancelled=True)
            self.workers[worker].write_outcomes(self.conn, [outcome])

        @rule(worker=st.integers(0, 1), data=st.data())
        def spark_release(self, worker, data):
            """A Spark driver gives back the jobs of a snapshot it cannot deliver (spark_jobs_release)."""
            if not self.held[worker]:
                return
            job = self.held[worker].pop(data.draw(st.sampled_from(sorted(self.held[worker]))))
            self.conn.execute(spark_sql.spark_jobs_release, {"ids": [job.id], "lease_token": job.lease_token})
            self.conn.commit()

        @rule(worker=st.integers(0, 1), limit=st.integers(1, 3))
        def claim(self, worker, limit):
            for job in self.workers[worker].claim(self.conn, consumer, limit):
                self.held[worker][job.id] = job

        @rule(worker=st.integers(0, 1), data=st.data(), succeed=st.booleans())
        def finish(self, worker, data, succeed):
            if not self.held[worker]:
                return
            job_id = data.draw(st.sampled_from(sorted(self.held[worker])))
            job = self.held[worker].pop(job_id)
            outcome = Outcome(job=job, succeeded=succeed, error=None if succeed else "fail")
            self.workers[worker].write_outcomes(self.conn, [outcome])

        @rule(worker=st.integers(0, 1), data=st.data(), seconds=st.sampled_from([0.0, 60.0]))
        def snooze(self, worker, data, seconds):
            """A handler raised Snooze(seconds): its attempt is given back (sql.job_snooze)."""
            if not self.held[worker]:
                return
            job = self.held[worker].pop(data.draw(st.sampled_from(sorted(self.held[worker]))))
            outcome = Outcome(job=job, succeeded=False, error=f"snoozed for {seconds:g} s", snooze_s=seconds)
            self.workers[worker].write_outcomes(self.conn, [outcome])

        @rule(worker=st.integers(0, 1), data=st.data())
        def hand_back_unstarted(self, worker, data):
            """A stopping worker releases a claimed job it never started (sql.job_release_unstarted)."""
            if not self.held[worker]:
                return
            job = self.held[worker].pop(data.draw(st.sampled_from(sorted(self.held[worker]))))
            self.conn.execute(sql.job_release_unstarted, {"ids": [job.id], "lease_tokens": [job.lease_token]})
            self.conn.commit()

        @rule(data=st.data())
        def expire_and_rescue(self, data):
            running = self.conn.execute("SELECT id FROM outboxq_jobs WHERE status = 'running'").fetchall()
            if not running:
                return
            job_id = data.draw(st.sampled_from([r["id"] for r in running]))
            self.conn.execute("UPDATE outboxq_jobs SET lease_expires_at = now() - interval '1 s' WHERE id = %s",
                              (job_id,))
            self.conn.commit()
            rescue.run_once(self.conn)

        @rule(data=st.data(), action=st.sampled_from(["retry", "cancel"]))
        def operator(self, data, action):
            if not self.seen:
                return
            job_id = data.draw(st.sampled_from(self._ids()))
            try:
                (admin.retry_job if action == "retry" else admin.cancel_job)(self.conn, job_id)
            except InvalidTransition:
                pass
            self.conn.commit()

        @invariant()
        def transitions_are_allowed_and_leases_exclusive(self):
            if not hasattr(self, "conn"):
                return
            rows = self.conn.execute(
                "SELECT id, status, attempts, max_attempts, lease_token FROM outboxq_jobs").fetchall()
            self.conn.commit()
            for r in rows:
                status = JobStatus(r["status"])
                before = self.seen.get(r["id"])
                if before is not None and before != status:
                    assert status in ALLOWED_TRANSITIONS[before], f"job {r['id']}: {before} -> {status}"
                self.seen[r["id"]] = status
                if r["max_attempts"]:
                    assert r["attempts"] <= r["max_attempts"]
                holders = [w for w in range(2)
                           if r["id"] in self.held[w] and self.held[w][r["id"]].lease_token == r["lease_token"]]
                assert len(holders) <= 1, f"job {r['id']} is in two workers' hands"
                if holders:
                    assert status is JobStatus.RUNNING
                if status is not JobStatus.RUNNING:
                    assert r["lease_token"] is None

    return QueueMachine


def test_random_operation_sequences_respect_the_transition_table(db_url):
    machine = make_machine(db_url)
    run_state_machine_as_test(
        machine,
        settings=settings(max_examples=60, stateful_step_count=40, deadline=None,
                          suppress_health_check=list(HealthCheck)),
    )
