"""The listing never skips or repeats a job, whatever order concurrent enqueuing transactions commit in."""

from __future__ import annotations

import random
import threading
import time

import psycopg
import pytest

from outboxq.queue.enqueue import enqueue
from tests.api_support import api_client


@pytest.fixture
def api(db_url):
    with api_client(db_url, "read") as client:
        yield client


def _page(api, marker, limit):
    params = {"limit": limit, **({"marker": marker} if marker else {})}
    r = api.get("/v1/queues/feed/jobs", params=params)
    assert r.status_code == 200, r.text
    return r.json()


def test_a_transaction_that_started_first_and_commits_last_is_not_skipped(api, db_url):
    early = psycopg.connect(db_url)
    early_job = enqueue(early, "feed", "early")  # smaller id and xid, not committed yet
    with psycopg.connect(db_url) as late:
        late_job = enqueue(late, "feed", "late")
    assert late_job.id > early_job.id
    page = _page(api, None, 10)
    # The late job committed, but the early transaction holds the feed back: an id marker would skip it.
    assert page["items"] == [] and page["next_marker"] is None
    early.commit()
    early.close()
    page = _page(api, None, 1)
    assert [i["payload"] for i in page["items"]] == ["early"]
    rest = _page(api, page["next_marker"], 10)
    assert [i["payload"] for i in rest["items"]] == ["late"]
    assert _page(api, rest["next_marker"], 10)["items"] == []


def test_concurrent_writers_and_a_paging_reader_see_every_committed_job_exactly_once(api, db_url):
    committed: set[int] = set()
    rolled_back: set[int] = set()
    lock = threading.Lock()
    # The writers run at least four seconds and until there is enough to check (a busy machine, a checkpoint of
    # another test's database, may stall commits for seconds), within a bound.
    run_at_least = time.monotonic() + 4.0
    run_at_most = time.monotonic() + 120.0
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer(seed: int) -> None:
        rng = random.Random(seed)
        try:
            with psycopg.connect(db_url) as conn:
                while not stop.is_set():
                    ids = [enqueue(conn, "feed", {"w": seed, "n": n}).id for n in range(rng.randint(1, 3))]
                    time.sleep(rng.uniform(0, 0.06))  # hold the transaction open a random time
                    if rng.random() < 0.2:
                        conn.rollback()
                        with lock:
                            rolled_back.update(ids)
                    else:
                        conn.commit()
                        with lock:
                            committed.update(ids)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(seed,)) for seed in range(8)]
    for t in threads:
        t.start()
    rng = random.Random(42)
    seen: list[int] = []
    marker = None
    pages = 0

    def read_once() -> None:
        nonlocal marker, pages
        page = _page(api, marker, rng.randint(1, 3))
        pages += 1
        seen.extend(item["id"] for item in page["items"])
        if page["items"]:
            assert page["next_marker"] == page["items"][-1]["marker"]
            marker = page["next_marker"]

    while not stop.is_set():
        read_once()
        now = time.monotonic()
        with lock:
            enough = len(committed) > 150 and pages > 60
        if (now > run_at_least and enough) or now > run_at_most or errors:
            stop.set()
    for t in threads:
        t.join()
    assert not errors, errors
    deadline = time.monotonic() + 60
    while set(seen) != committed and time.monotonic() < deadline:
        read_once()  # an unrelated transaction on the server may hold the feed back a little longer
    read_once()
    assert len(committed) > 100, "the writers should have committed many jobs"
    assert pages > 50, "the reader should have paged many times while the writers ran"
    assert len(seen) == len(set(seen)), "a job was listed twice"
    assert set(seen) == committed, "the listing skipped committed jobs or showed rolled-back ones"
    assert not set(seen) & rolled_back


def test_without_a_configured_secret_markers_survive_restarts_and_agree_across_processes(db_url):
    from tests.api_support import api_client

    with api_client(db_url, marker_secret="") as first:
        for i in range(3):
            assert first.post("/v1/queues/feed/jobs", json={"payload": {"i": i}}).status_code == 201
        page = first.get("/v1/queues/feed/jobs", params={"limit": 1}).json()
    marker = page["next_marker"]
    with api_client(db_url, marker_secret="") as second:  # another process, or the same one restarted
        rest = second.get("/v1/queues/feed/jobs", params={"marker": marker})
    assert rest.status_code == 200, rest.text
    assert [j["payload"]["i"] for j in rest.json()["items"]] == [1, 2]
    with api_client(db_url, marker_secret="another-configured-secret") as configured:
        assert configured.get("/v1/queues/feed/jobs", params={"marker": marker}).status_code == 400
