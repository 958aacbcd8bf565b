"""The workflow routes on a real PostgreSQL: POST /v1/workflows (enqueue scope; a cycle or an unknown step is a
422 and writes nothing), GET one and the listing (read), cancel and retry (admin)."""

from __future__ import annotations

import psycopg
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from outboxq.testing import TestQueue
from outboxq.workers.maintenance import promote
from outboxq.workers.registry import Consumer, register
from tests.api_support import api_client, auth, count
from tests.handlers_runtime import isolated_registry  # noqa: F401

DIAMOND = {"name": "order-42", "steps": [
    {"name": "fetch", "queue": "fetch", "payload": {"order": 42}},
    {"name": "left", "queue": "left", "payload": {}, "after": ["fetch"]},
    {"name": "right", "queue": "right", "payload": {}, "after": [{"step": "fetch", "on_failure": "run"}]},
    {"name": "join", "queue": "join", "payload": {}, "after": ["left", "right"]},
]}


@pytest.fixture
def api(db_url):
    with api_client(db_url, scope=None) as client:
        yield client


def _written(db_url: str) -> tuple[int, int]:
    return (count(db_url, "SELECT count(*) FROM outboxq_workflows"),
            count(db_url, "SELECT count(*) FROM outboxq_jobs"))


def test_a_workflow_is_written_read_listed_cancelled_and_refused_retry_with_the_right_scopes(api, db_url):
    created = api.post("/v1/workflows", json=DIAMOND, headers=auth("enqueue"))
    assert created.status_code == 201, created.text
    workflow_id = created.json()["id"]
    assert api.get(f"/v1/workflows/{workflow_id}", headers=auth("enqueue")).status_code == 403
    shown = api.get(f"/v1/workflows/{workflow_id}", headers=auth("read"))
    assert shown.status_code == 200
    body = shown.json()
    assert body["name"] == "order-42" and body["status"] == "running"
    steps = {s["name"]: s for s in body["steps"]}
    assert {n: s["status"] for n, s in steps.items()} == {"fetch": "queued", "left": "waiting",
                                                           "right": "waiting", "join": "waiting"}
    assert steps["right"]["after"] == [{"step": "fetch", "job_id": steps["fetch"]["job_id"], "on_failure": "run"}]
    job = api.get(f"/v1/jobs/{steps['join']['job_id']}", headers=auth("read")).json()
    assert job["workflow_id"] == workflow_id and job["step"] == "join"
    listed = api.get("/v1/workflows", headers=auth("read")).json()
    assert listed["items"][0]["id"] == workflow_id and listed["items"][0]["unfinished"] == 4

    assert api.post("/v1/workflows", json=DIAMOND, headers=auth("read")).status_code == 403  # writing needs enqueue
    assert _written(db_url) == (1, 4)
    for path in ("cancel", "retry"):  # acting on a workflow needs admin
        for scope in ("read", "enqueue"):
            assert api.post(f"/v1/workflows/{workflow_id}/{path}", headers=auth(scope)).status_code == 403
    assert api.get(f"/v1/workflows/{workflow_id}", headers=auth("read")).json()["status"] == "running"
    assert api.post(f"/v1/workflows/{workflow_id}/cancel", headers=auth("read")).status_code == 403
    cancelled = api.post(f"/v1/workflows/{workflow_id}/cancel", headers=auth("admin"))
    assert cancelled.status_code == 200 and cancelled.json() == {"cancelled": 4}
    assert api.get(f"/v1/workflows/{workflow_id}", headers=auth("read")).json()["status"] == "cancelled"
    retried = api.post(f"/v1/workflows/{workflow_id}/retry", headers=auth("admin"))
    assert retried.status_code == 409 and "cancelled" in retried.json()["error"]["message"]
    for path in (f"/v1/workflows/{workflow_id + 99}", ):
        assert api.get(path, headers=auth("read")).status_code == 404
    assert api.post(f"/v1/workflows/{workflow_id + 99}/cancel", headers=auth("admin")).status_code == 404


def _failed_diamond(api, db_url) -> int:
    """DIAMOND written and run until its left step is dead: the workflow is failed, its join cancelled."""
    workflow_id = api.post("/v1/workflows", json=DIAMOND, headers=auth("enqueue")).json()["id"]

    def broken(payload, ctx):
        raise RuntimeError("left broke")

    register(Consumer("fetch", lambda payload, ctx: {"rows": 3}))
    register(Consumer("left", broken, max_attempts=1))
    queue = TestQueue(db_url)
    queue.run_one("fetch")
    assert queue.drain("left", expect_success=False) == 1
    with psycopg.connect(db_url) as conn:
        promote.run_once(conn)
    return workflow_id


def _steps(api, workflow_id: int) -> tuple[str, dict[str, tuple[str, int]]]:
    body = api.get(f"/v1/workflows/{workflow_id}", headers=auth("read")).json()
    return body["status"], {s["name"]: (s["status"], s["attempts"]) for s in body["steps"]}


def test_a_failed_step_fails_the_workflow_and_retry_through_the_api_puts_it_back(api, db_url):
    created = {"id": _failed_diamond(api, db_url)}
    body = api.get(f"/v1/workflows/{created['id']}", headers=auth("read")).json()
    assert body["status"] == "failed"
    steps = {s["name"]: s for s in body["steps"]}
    assert steps["join"]["status"] == "cancelled" and steps["right"]["status"] == "queued"
    assert steps["fetch"]["result"] == {"rows": 3} and "left broke" in steps["left"]["last_error"]
    assert api.post(f"/v1/workflows/{created['id']}/retry", headers=auth("admin")).json() == \
        {"retried": 1, "waiting": 1}
    assert api.get(f"/v1/workflows/{created['id']}", headers=auth("read")).json()["status"] == "running"


def test_a_read_token_cannot_write_a_workflow(api, db_url):
    refused = api.post("/v1/workflows", json=DIAMOND, headers=auth("read"))
    assert refused.status_code == 403, refused.text
    assert refused.json()["error"]["code"] == "forbidden" and "enqueue" in refused.json()["error"]["message"]
    assert _written(db_url) == (0, 0)
    assert api.post("/v1/workflows", json=DIAMOND, headers=auth("enqueue")).status_code == 201  # the same body
    assert _written(db_url) == (1, 4)


@pytest.mark.parametrize("scope", ["read", "enqueue", "enqueue+read"])
def test_a_token_without_admin_can_neither_retry_nor_cancel_a_workflow(api, db_url, scope):
    workflow_id = _failed_diamond(api, db_url)
    before = _steps(api, workflow_id)
    assert before == ("failed", {"fetch": ("done", 1), "left": ("dead", 1), "right": ("queued", 0),
                                 "join": ("cancelled", 0)})
    for action in ("retry", "cancel"):
        refused = api.post(f"/v1/workflows/{workflow_id}/{action}", headers=auth(scope))
        assert refused.status_code == 403, (action, refused.text)
        assert refused.json()["error"]["code"] == "forbidden" and "admin" in refused.json()["error"]["message"]
        assert _steps(api, workflow_id) == before, action  # nothing retried, nothing cancelled
    # the same requests with an admin token do act: the refusals above were the scope's
    assert api.post(f"/v1/workflows/{workflow_id}/retry", headers=auth("admin")).json() == \
        {"retried": 1, "waiting": 1}
    assert api.post(f"/v1/workflows/{workflow_id}/cancel", headers=auth("admin")).json() == {"cancelled": 3}
    assert _steps(api, workflow_id)[0] == "cancelled"


@pytest.mark.parametrize("steps, message", [
    ([{"name": "a", "queue": "q", "after": ["b"]}, {"name": "b", "queue": "q", "after": ["a"]}], "cycle"),
    ([{"name": "a", "queue": "q", "after": ["nowhere"]}], "nowhere"),
    ([{"name": "a", "queue": "q"}, {"name": "a", "queue": "q"}], "two steps named"),
    ([{"name": "a", "queue": "q", "after": [{"step": "a", "on_failure": "run"}]}], "itself"),
    ([{"name": "a", "queue": "q", "after": [{"step": "b", "on_failure": "maybe"}]}], "on_failure"),
    ([{"name": "a", "queue": "bad queue"}], "queue"),
    ([{"name": "nul\u0000", "queue": "q"}], "body field 'steps.0.name' must not contain a NUL character"),
    ([{"name": "a", "queue": "q", "after": ["nul\u0000"]}],
     "body field 'steps.0.after.0' must not contain a NUL character (\\u0000); remove it"),
    ([{"name": "a", "queue": "q", "after": [{"step": "nul\u0000"}]}],
     "body field 'steps.0.after.0.WorkflowEdge.step' must not contain a NUL character"),
    ([{"name": "a", "queue": "q", "after": [5]}], "valid string"),
    ([], "steps"),
])
def test_a_bad_workflow_is_a_422_that_says_what_to_fix_and_writes_nothing(api, db_url, steps, message):
    r = api.post("/v1/workflows", json={"name": "bad", "steps": steps}, headers=auth("enqueue"))
    assert r.status_code == 422, r.text
    assert message in r.json()["error"]["message"], r.text
    assert _written(db_url) == (0, 0)


def test_workflow_routes_refuse_without_a_token_and_bad_ids(api):
    assert api.post("/v1/workflows", json=DIAMOND).status_code == 401
    for bad in ("0", "-1", "x", str(2**63)):
        assert api.get(f"/v1/workflows/{bad}", headers=auth("read")).status_code == 422


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edges=st.lists(st.tuples(st.integers(0, 7), st.integers(0, 7)), max_size=20),
       names=st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=8, unique=True))
@example(edges=[(0, 3), (1, 3), (2, 3)], names=["0", "1", "00", "\x00"])  # a NUL named in five places
def test_generated_workflows_are_written_whole_or_refused_whole(api, db_url, edges, names):
    steps = [{"name": name, "queue": "gen", "after": sorted({names[b % len(names)] for a, b in edges
                                                              if a % len(names) == i})}
             for i, name in enumerate(names)]
    before = _written(db_url)
    r = api.post("/v1/workflows", json={"name": "generated", "steps": steps}, headers=auth("enqueue"))
    after = _written(db_url)
    assert r.status_code in (201, 422), r.text
    if r.status_code == 201:
        assert after == (before[0] + 1, before[1] + len(names))
    else:
        assert after == before
        assert any(word in r.json()["error"]["message"] for word in ("cycle", "itself", "name", "NUL")), r.text
