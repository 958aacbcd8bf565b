"""The batch route answers a batch of payloads alone without FastAPI's validation (BatchRoute): what it writes and
answers is what the validated route writes and answers for the same jobs, whatever the payloads."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import outboxq.api.routes.jobs as jobs_routes
from tests.api_support import api_client, count, job_count

# The fields of an answered job that differ between two writes of the same jobs.
WRITTEN_FIELDS = ("id", "run_at", "created_at")

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@pytest.fixture
def api(db_url):
    with api_client(db_url, max_payload_bytes=2000, max_batch_jobs=20) as client:
        yield client


@pytest.fixture
def direct_answers(monkeypatch):
    """Each batch that BatchRoute found to be payloads alone (the direct path taken), or None where it was not."""
    seen: list[list | None] = []

    def recorded(body, most):
        batch = payloads_alone(body, most)
        seen.append(batch)
        return batch

    payloads_alone = jobs_routes.payloads_alone
    monkeypatch.setattr(jobs_routes, "payloads_alone", recorded)
    return seen


def _post(api, jobs, minimal):
    headers = {"Content-Type": "application/json", **({"Prefer": "return=minimal"} if minimal else {})}
    return api.post("/v1/queues/q/jobs/batch", content=_dumps({"jobs": jobs}), headers=headers)


def _dumps(value):
    return json.dumps(value).encode()  # (json, not orjson: integers beyond 64 bits too)


def _comparable(response):
    body = response.json()
    if "jobs" in body:
        body = {"jobs": [{k: v for k, v in job.items() if k not in WRITTEN_FIELDS} for job in body["jobs"]]}
    elif "ids" in body:
        body = {"ids": len(body["ids"])}
    return response.status_code, response.headers.get("preference-applied"), body


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payloads=st.lists(json_values | st.just("x\x00y") | st.just("z" * 2100), min_size=1, max_size=6),
       minimal=st.booleans())
@example(payloads=[{"a": "x\x00y"}], minimal=False)  # a NUL the database refuses: 422, nothing written
@example(payloads=[1, "z" * 2100], minimal=True)  # a payload over max_payload_bytes: 413
def test_a_batch_of_payloads_alone_is_written_and_answered_as_the_validated_route_does(
        api, db_url, direct_answers, payloads, minimal):
    before = job_count(db_url)
    direct = _post(api, [{"payload": p} for p in payloads], minimal)
    assert direct_answers[-1] is not None, "the batch of payloads alone should have been answered directly"
    written_directly = job_count(db_url) - before
    # priority 0 is every job's default: the same jobs, through FastAPI's validation.
    validated = _post(api, [{"payload": p, "priority": 0} for p in payloads], minimal)
    assert direct_answers[-1] is None
    assert _comparable(direct) == _comparable(validated)
    assert job_count(db_url) - before == 2 * written_directly
    assert written_directly in (0, len(payloads))
    if direct.status_code == 201:
        ids = [j["id"] for j in direct.json()["jobs"]] if not minimal else direct.json()["ids"]
        stored = count(db_url, "SELECT count(*) FROM outboxq_jobs WHERE id = ANY(%s) AND queue = 'q' "
                               "AND status = 'queued' AND priority = 0", (ids,))
        assert stored == len(payloads)


@pytest.mark.parametrize("description,body,headers", [
    ("another field", {"jobs": [{"payload": 1}, {"payload": 2, "colour": "red"}]}, {}),
    ("a key", {"jobs": [{"payload": 1, "key": "k"}]}, {}),
    ("no jobs", {"jobs": []}, {}),
    ("too many jobs", {"jobs": [{"payload": i} for i in range(21)]}, {}),
    ("another top-level field", {"jobs": [{"payload": 1}], "extra": 1}, {}),
    ("a job that is not an object", {"jobs": [{"payload": 1}, [1]]}, {}),
    ("an Idempotency-Key", {"jobs": [{"payload": 1}]}, {"Idempotency-Key": "direct-1"}),
    ("another content type", {"jobs": [{"payload": 1}]}, {"Content-Type": "text/plain"}),
])
def test_any_other_batch_takes_the_validated_route(api, direct_answers, description, body, headers):
    r = api.post("/v1/queues/q/jobs/batch", content=_dumps(body),
                 headers={"Content-Type": "application/json", **headers})
    assert all(seen is None for seen in direct_answers), description
    if description in ("a key", "an Idempotency-Key"):
        assert r.status_code == 201, r.text
    else:
        assert 400 <= r.status_code < 500 and r.json()["error"]["message"], r.text


def test_the_direct_answer_still_needs_a_token_with_the_enqueue_scope(db_url):
    body = _dumps({"jobs": [{"payload": 1}]})
    for scope, status in ((None, 401), ("read", 403), ("enqueue", 201)):
        with api_client(db_url, scope) as client:
            r = client.post("/v1/queues/q/jobs/batch", content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == status, r.text
    assert job_count(db_url) == 1


def test_a_queue_name_the_path_refuses_is_answered_by_the_validated_route(api, db_url, direct_answers):
    r = api.post("/v1/queues/has%20space/jobs/batch", content=_dumps({"jobs": [{"payload": 1}]}),
                 headers={"Content-Type": "application/json"})
    assert r.status_code == 422 and "queue" in r.json()["error"]["message"]
    assert direct_answers == []
    assert job_count(db_url) == 0
