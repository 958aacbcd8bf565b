"""The live workers' registry on a real PostgreSQL with real worker processes: each announces itself with its
queues and jobs in flight; one stopped leaves at once, one SIGKILLed lapses out of GET /v1/workers and
`outboxq workers` (nobody deletes it by hand)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.api_support import api_client, auth
from tests.support import stop_processes, wait_for

ROOT = Path(__file__).resolve().parents[2]
LAPSE_S = "3"  # (30 s by default: short here so that the test waits a few seconds, not half a minute)


def _worker(db_url: str, log: Path) -> subprocess.Popen:
    env = {**os.environ, "DATABASE_URL": db_url, "PYTHONPATH": str(ROOT), "OUTBOXQ_WORKER_LAPSE_S": LAPSE_S}
    return subprocess.Popen([sys.executable, "-m", "outboxq.cli", "--log-level", "WARNING", "worker", "--processes",
                             "1", "--handlers", "tests.handlers_basic", "--concurrency", "3"],
                            env=env, cwd=ROOT, stdout=open(log, "ab"), stderr=subprocess.STDOUT)  # noqa: SIM115


def _cli_workers(db_url: str) -> list[dict]:
    env = {**os.environ, "DATABASE_URL": db_url, "OUTBOXQ_WORKER_LAPSE_S": LAPSE_S}
    done = subprocess.run([sys.executable, "-m", "outboxq.cli", "--log-level", "WARNING", "workers", "--json"],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_workers_announce_themselves_a_stopped_one_leaves_and_a_killed_one_lapses(db_url, tmp_path):
    workers = [_worker(db_url, tmp_path / "w.log") for _ in range(3)]
    with api_client(db_url, scope=None, worker_lapse_s=float(LAPSE_S)) as api:
        def listed() -> dict[int, dict]:
            answer = api.get("/v1/workers", headers=auth("read"))
            assert answer.status_code == 200, answer.text
            return {w["pid"]: w for w in answer.json()["items"]}

        try:
            wait_for(lambda: set(listed()) == {w.pid for w in workers}, timeout=30)
            one = listed()[workers[0].pid]
            assert {q["queue"] for q in one["queues"]} >= {"count", "slow"}
            assert one["concurrency"] == 3 and one["in_flight"] == 0 and one["version"]
            assert one["id"].split(":")[1] == str(workers[0].pid)
            assert {w["pid"] for w in _cli_workers(db_url)} == {w.pid for w in workers}
            assert api.get("/v1/workers").status_code == 401

            stop_processes(workers[1])  # a clean stop: it leaves the registry at once
            assert workers[1].pid not in listed()
            workers[2].send_signal(signal.SIGKILL)  # killed outright: it says nothing, and lapses
            workers[2].wait()
            assert workers[2].pid in listed()
            wait_for(lambda: workers[2].pid not in listed(), timeout=3 * float(LAPSE_S) + 10)
            assert set(listed()) == {workers[0].pid}  # the live one is still announced
            assert {w["pid"] for w in _cli_workers(db_url)} == {workers[0].pid}
        finally:
            stop_processes(*workers)
