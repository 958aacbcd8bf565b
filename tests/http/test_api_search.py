"""The operators' search across queues and the bulk actions, on a real PostgreSQL: every filter alone, all of
them together, one that matches nothing, paging by marker; retry and cancel by ids and by filter, refused
without the admin scope or for a filter that would match everything without "all": true."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from outboxq import enqueue, enqueue_many
from tests.api_support import api_client, auth


@pytest.fixture
def api(db_url):
    with api_client(db_url, scope=None) as client:
        yield client


@pytest.fixture
def jobs(db_url):
    """Jobs in three queues: statuses, keys, payloads and errors to search for; their ids by name."""
    ids = {}
    with psycopg.connect(db_url) as conn:
        for n in range(6):
            ids[f"mail-{n}"] = enqueue(conn, "mail", {"customer": "acme" if n % 2 else "globex", "n": n},
                                       key=f"order-{n}").id
        ids["sms"] = enqueue(conn, "sms", {"customer": "acme", "tier": {"gold": True}}, key="user-9").id
        ids["push"] = enqueue(conn, "push", {"customer": "initech"}).id
        conn.execute("UPDATE outboxq_jobs SET status = 'dead', finished_at = now(), "
                     "last_error = 'SMTPError: Mailbox FULL' WHERE id = ANY(%s)", ([ids["mail-1"], ids["mail-2"]],))
        conn.execute("UPDATE outboxq_jobs SET status = 'retrying', last_error = 'timeout' WHERE id = %s",
                     (ids["sms"],))
        conn.execute("UPDATE outboxq_jobs SET created_at = now() - interval '2 days' WHERE id = %s",
                     (ids["push"],))
        conn.commit()
    return ids


def _ids(api, **params) -> list[int]:
    answer = api.get("/v1/jobs", params=params, headers=auth("read"))
    assert answer.status_code == 200, answer.text
    assert all("result" not in item or item["result"] is None for item in answer.json()["items"])
    return [item["id"] for item in answer.json()["items"]]


def test_each_filter_alone_and_all_together_newest_first(api, jobs):
    every = sorted(jobs.values(), reverse=True)
    assert _ids(api) == every
    assert _ids(api, queue="mail") == sorted((v for k, v in jobs.items() if k.startswith("mail")), reverse=True)
    assert _ids(api, status=["dead", "retrying"]) == sorted([jobs["mail-1"], jobs["mail-2"], jobs["sms"]],
                                                            reverse=True)
    assert _ids(api, key="order-") == sorted((v for k, v in jobs.items() if k.startswith("mail")), reverse=True)
    assert _ids(api, key="user") == [jobs["sms"]]
    assert _ids(api, payload='{"customer": "acme"}') == sorted(
        [jobs["mail-1"], jobs["mail-3"], jobs["mail-5"], jobs["sms"]], reverse=True)
    assert _ids(api, payload='{"tier": {"gold": true}}') == [jobs["sms"]]
    assert _ids(api, error="mailbox full") == sorted([jobs["mail-1"], jobs["mail-2"]], reverse=True)
    yesterday = (datetime.now(UTC) - timedelta(days=1)).isoformat()
    assert _ids(api, until=yesterday) == [jobs["push"]]
    assert jobs["push"] not in _ids(api, since=yesterday)
    assert _ids(api, queue="mail", status=["dead"], key="order-1", payload='{"customer": "acme"}',
                error="smtp", since=yesterday) == [jobs["mail-1"]]
    assert _ids(api, queue="mail", status=["done"]) == []  # a filter that matches nothing
    assert _ids(api, payload='{"customer": "nobody"}') == []


def test_pages_follow_the_marker_without_a_gap_or_a_repeat(api, jobs):
    seen, marker = [], None
    while True:
        params = {"limit": 3, **({"marker": marker} if marker else {})}
        page = api.get("/v1/jobs", params=params, headers=auth("read")).json()
        seen += [i["id"] for i in page["items"]]
        marker = page["next_marker"]
        if marker is None:
            break
    assert seen == sorted(jobs.values(), reverse=True)


@pytest.mark.parametrize("params, word", [({"payload": "[1, 2]"}, "payload"), ({"payload": "{"}, "payload"),
                                          ({"status": "sleeping"}, "status"), ({"marker": "abc"}, "marker"),
                                          ({"queue": "bad queue"}, "queue"), ({"limit": 0}, "limit"),
                                          ({"since": "yesterday"}, "since")])
def test_a_bad_filter_is_a_422_that_names_it(api, params, word):
    answer = api.get("/v1/jobs", params=params, headers=auth("read"))
    assert answer.status_code == 422 and word in answer.json()["error"]["message"], answer.text


def test_bulk_retry_and_cancel_by_ids_and_by_filter_with_the_admin_scope(api, jobs, db_url):
    dead = [jobs["mail-1"], jobs["mail-2"]]
    assert api.post("/v1/jobs/retry", json={"ids": dead}, headers=auth("read")).status_code == 403
    assert api.post("/v1/jobs/retry", json={"ids": dead}).status_code == 401
    retried = api.post("/v1/jobs/retry", json={"ids": [*dead, jobs["mail-0"]]}, headers=auth("admin"))
    assert retried.status_code == 200 and retried.json() == {"count": 2}  # mail-0 is queued: not retried
    assert _ids(api, status=["dead"]) == []
    cancelled = api.post("/v1/jobs/cancel", json={"filter": {"queue": "mail", "payload": {"customer": "globex"}}},
                         headers=auth("admin"))
    assert cancelled.json() == {"count": 3}
    assert _ids(api, status=["cancelled"]) == sorted([jobs["mail-0"], jobs["mail-2"], jobs["mail-4"]], reverse=True)
    again = api.post("/v1/jobs/retry", json={"filter": {"status": ["cancelled"]}}, headers=auth("admin"))
    assert again.json() == {"count": 3}
    refused = api.post("/v1/jobs/cancel", json={"filter": {}}, headers=auth("admin"))
    assert refused.status_code == 422 and '"all": true' in refused.json()["error"]["message"]
    both = api.post("/v1/jobs/cancel", json={"ids": dead, "filter": {"queue": "mail"}}, headers=auth("admin"))
    assert both.status_code == 422
    everything = api.post("/v1/jobs/cancel", json={"filter": {}, "all": True}, headers=auth("admin"))
    assert everything.json() == {"count": len(jobs)}
    assert set(_ids(api, status=["cancelled"])) == set(jobs.values())


def test_the_count_of_a_search_is_capped_where_one_bulk_action_stops(api, jobs, db_url):
    def count(**params):
        answer = api.get("/v1/jobs/count", params=params, headers=auth("read"))
        assert answer.status_code == 200, answer.text
        return answer.json()

    assert count(queue="mail", payload='{"customer": "globex"}') == {"count": 3, "more": False}
    assert count(status=["dead", "retrying"]) == {"count": 3, "more": False}
    assert count(queue="mail", error="nothing like this") == {"count": 0, "more": False}
    assert count() == {"count": len(jobs), "more": False}
    assert api.get("/v1/jobs/count", params={"status": "lost"}, headers=auth("read")).status_code == 422
    assert api.get("/v1/jobs/count").status_code == 401
    with psycopg.connect(db_url) as conn:
        enqueue_many(conn, "bulk", [{"n": n} for n in range(10_001)])
        conn.commit()
    assert count(queue="bulk") == {"count": 10_000, "more": True}  # what one bulk action by filter changes
