"""The schedules' routes on a real PostgreSQL with a real worker: listed with their slots, run by hand (a key
that never collides with a slot), paused (no slot enqueued) and resumed."""

from __future__ import annotations

import time
from datetime import timedelta

import psycopg
import pytest

from outboxq.workers.periodic import Schedule
from outboxq.workers.registry import Consumer
from outboxq.workers.runner import Worker
from tests.api_support import api_client, auth
from tests.support import wait_for


@pytest.fixture
def api(db_url):
    with api_client(db_url, scope=None) as client:
        yield client


def _keys(db_url: str) -> list[str]:
    with psycopg.connect(db_url) as conn:
        return [r[0] for r in conn.execute("SELECT key FROM outboxq_jobs WHERE queue = 'tick' ORDER BY id")]


def test_a_schedule_is_listed_run_by_hand_paused_and_resumed(api, db_url):
    ran: list[str] = []
    schedule = Schedule(name="tick", queue="tick", every=timedelta(seconds=1), payload={"x": 1})
    worker = Worker([Consumer("tick", lambda payload, ctx: ran.append(ctx.key))], url=db_url, schedules=[schedule],
                    poll_interval=0.1).start()
    try:
        wait_for(lambda: len(ran) >= 2, timeout=20)
        listed = api.get("/v1/schedules", headers=auth("read")).json()["items"]
        [tick] = [s for s in listed if s["name"] == "tick"]
        assert tick["queue"] == "tick" and tick["every_s"] == 1.0 and tick["cron"] is None
        assert tick["missed"] and tick["timezone"] and tick["next_slot"] and tick["paused"] is False

        assert api.post("/v1/schedules/tick/run", headers=auth("read")).status_code == 403
        by_hand = api.post("/v1/schedules/tick/run", headers=auth("admin"))
        assert by_hand.status_code == 201, by_hand.text
        assert by_hand.json()["key"].startswith("periodic:tick:manual:") and by_hand.json()["payload"] == {"x": 1}
        wait_for(lambda: by_hand.json()["key"] in ran, timeout=10)

        paused = api.post("/v1/schedules/tick/pause", headers=auth("admin"))
        assert paused.status_code == 200 and paused.json()["paused"] is True
        time.sleep(0.5)  # a slot being enqueued as the pause came is committed by now
        slots = [k for k in _keys(db_url) if ":manual:" not in k]
        time.sleep(2.5)  # two and a half slots pass: none is enqueued while paused
        assert [k for k in _keys(db_url) if ":manual:" not in k] == slots
        assert api.post("/v1/schedules/tick/resume", headers=auth("admin")).json()["paused"] is False
        wait_for(lambda: len([k for k in _keys(db_url) if ":manual:" not in k]) > len(slots), timeout=10)
    finally:
        worker.stop(timeout=5)
    for path in ("/v1/schedules/none/run", "/v1/schedules/none/pause"):
        answer = api.post(path, headers=auth("admin"))
        assert answer.status_code == 404 and "no schedule" in answer.json()["error"]["message"]
