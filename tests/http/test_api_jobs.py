"""HTTP API: enqueue (one, batch, idempotent), read, list, and every bad input answering 4xx with nothing written."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.api_support import api_client, count, job_count


@pytest.fixture
def api(db_url):
    with api_client(db_url, max_payload_bytes=2000, max_batch_jobs=5) as client:
        yield client


def test_enqueue_returns_201_with_the_job_and_get_reads_it(api, db_url):
    r = api.post("/v1/queues/emails/jobs", json={"payload": {"to": "a@b.c"}, "key": "k1", "priority": 3,
                                                  "max_attempts": 4, "delay_seconds": 60})
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["queue"] == "emails" and job["key"] == "k1" and job["status"] == "queued"
    assert job["payload"] == {"to": "a@b.c"} and job["priority"] == 3 and job["max_attempts"] == 4
    got = api.get(f"/v1/jobs/{job['id']}")
    assert got.status_code == 200
    for field in ("id", "queue", "key", "status", "payload", "attempts", "max_attempts", "priority", "run_at",
                  "last_error", "created_at", "started_at", "finished_at"):
        assert field in got.json()
    assert got.json()["payload"] == {"to": "a@b.c"}
    assert job_count(db_url) == 1


def test_unknown_job_is_404_with_an_error_body(api):
    r = api.get("/v1/jobs/999999")
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "job_not_found"


def test_idempotency_key_same_body_answers_200_with_the_same_job_and_writes_nothing(api, db_url):
    body = {"payload": {"n": 1}}
    first = api.post("/v1/queues/q/jobs", json=body, headers={"Idempotency-Key": "abc"})
    again = api.post("/v1/queues/q/jobs", json=body, headers={"Idempotency-Key": "abc"})
    assert first.status_code == 201 and again.status_code == 200
    assert again.json() == first.json()
    assert job_count(db_url) == 1
    assert count(db_url, "SELECT count(*) FROM outboxq_idempotency_keys") == 1


def test_idempotency_key_with_another_body_is_409_and_writes_nothing(api, db_url):
    assert api.post("/v1/queues/q/jobs", json={"payload": 1}, headers={"Idempotency-Key": "k"}).status_code == 201
    r = api.post("/v1/queues/q/jobs", json={"payload": 2}, headers={"Idempotency-Key": "k"})
    assert r.status_code == 409 and r.json()["error"]["code"] == "idempotency_key_reused"
    assert job_count(db_url) == 1


@pytest.mark.parametrize("path, body", [
    ("/v1/queues/q/jobs", {"payload": {"refuse_at_commit": True}}),
    ("/v1/queues/q/jobs/batch", {"jobs": [{"payload": {"n": 1}}, {"payload": {"refuse_at_commit": True}}]}),
])
def test_a_commit_that_fails_answers_an_error_and_writes_nothing(api, db_url, path, body):
    # The COMMIT goes out while the answer is rendered: a COMMIT the server refuses (here a deferred constraint
    # trigger) must still end in an error answer, never in a 201 for jobs that do not exist.
    import psycopg

    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("""
            CREATE FUNCTION refuse_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.payload ? 'refuse_at_commit' THEN RAISE EXCEPTION 'refused at commit'; END IF;
                RETURN NULL;
            END $$;
            CREATE CONSTRAINT TRIGGER refuse_at_commit AFTER INSERT ON outboxq_jobs
                DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION refuse_at_commit();
        """)
    r = api.post(path, json=body)
    assert r.status_code >= 400 and "refused" not in r.text, r.text
    assert job_count(db_url) == 0
    assert api.post(path.replace("/q/", "/other/"), json={"jobs": [{"payload": 1}]} if "batch" in path
                    else {"payload": 1}).status_code == 201  # the pooled connection is fine afterwards


def test_an_answer_that_cannot_be_made_rolls_the_write_back(api, db_url, monkeypatch):
    # The COMMIT is sent while the answer is rendered; the answer's content is made before it, so a failure
    # there is a 500 with nothing written, never a 500 for jobs that were committed (a retry would write twice).
    import outboxq.api.routes.jobs as routes

    def broken(jobs):
        raise RuntimeError("answer failed")

    monkeypatch.setattr(routes, "jobs_answer", broken)
    r = api.post("/v1/queues/q/jobs/batch", json={"jobs": [{"payload": 1}, {"payload": 2}]})
    assert r.status_code == 500 and job_count(db_url) == 0


def test_a_batch_under_prefer_return_minimal_answers_its_jobs_ids_in_request_order(api, db_url):
    body = {"jobs": [{"payload": {"n": n}, "key": f"k{n}"} for n in range(3)]}
    r = api.post("/v1/queues/q/jobs/batch", json=body, headers={"Prefer": "respond-async, return=minimal"})
    assert r.status_code == 201, r.text
    assert r.headers["Preference-Applied"] == "return=minimal"
    ids = r.json()["ids"]
    assert list(r.json()) == ["ids"] and len(ids) == 3
    assert [api.get(f"/v1/jobs/{i}").json()["key"] for i in ids] == ["k0", "k1", "k2"]
    full = api.post("/v1/queues/q/jobs/batch", json={"jobs": [{"payload": 1}]}, headers={"Prefer": "return=full"})
    assert "Preference-Applied" not in full.headers and full.json()["jobs"][0]["payload"] == 1
    # RFC 7240: a quoted value, whitespace, several Prefer lines; the first return preference wins.
    for prefer in ([("Prefer", 'return = "minimal"')], [("Prefer", "respond-async"), ("Prefer", "return=minimal")]):
        assert "ids" in api.post("/v1/queues/q/jobs/batch", json={"jobs": [{"payload": 1}]}, headers=prefer).json()
    first_wins = api.post("/v1/queues/q/jobs/batch", json={"jobs": [{"payload": 1}]},
                          headers={"Prefer": "return=representation, return=minimal"})
    assert "jobs" in first_wins.json()


def test_a_retried_batch_keeps_the_answers_form_and_another_form_is_a_409(api, db_url):
    body = {"jobs": [{"payload": 1}, {"payload": 2}]}
    headers = {"Idempotency-Key": "batch-1", "Prefer": "return=minimal"}
    first = api.post("/v1/queues/q/jobs/batch", json=body, headers=headers)
    again = api.post("/v1/queues/q/jobs/batch", json=body, headers=headers)
    assert (first.status_code, again.status_code) == (201, 200) and again.json() == first.json()
    other_form = api.post("/v1/queues/q/jobs/batch", json=body, headers={"Idempotency-Key": "batch-1"})
    assert other_form.status_code == 409, other_form.text
    assert job_count(db_url) == 2


def test_idempotency_key_is_not_stored_when_the_write_fails(api, db_url):
    assert api.post("/v1/queues/q/jobs", json={"payload": 1, "key": "dup"}).status_code == 201
    r = api.post("/v1/queues/q/jobs", json={"payload": 1, "key": "dup"}, headers={"Idempotency-Key": "x"})
    assert r.status_code == 409
    assert count(db_url, "SELECT count(*) FROM outboxq_idempotency_keys") == 0


def test_batch_writes_every_job_in_request_order(api, db_url):
    r = api.post("/v1/queues/q/jobs/batch", json={"jobs": [{"payload": i, "key": f"k{i}"} for i in range(5)]})
    assert r.status_code == 201, r.text
    assert [j["payload"] for j in r.json()["jobs"]] == [0, 1, 2, 3, 4]
    assert job_count(db_url) == 5


def test_batch_with_per_job_options_and_a_dependency_on_an_earlier_job(api, db_url):
    r = api.post("/v1/queues/q/jobs/batch", json={"jobs": [
        {"payload": "a", "key": "a"},
        {"payload": "b", "key": "b", "priority": 5, "depends_on": [{"queue": "q", "key": "a"}]},
    ]})
    assert r.status_code == 201, r.text
    assert [j["status"] for j in r.json()["jobs"]] == ["queued", "waiting"]


@pytest.mark.parametrize("keyed", [False, True])  # COPY of key-less jobs, INSERT of keyed ones
def test_batch_answers_each_job_as_reading_it_does(api, keyed):
    jobs = [{"payload": {"i": i}, **({"key": f"k{i}"} if keyed else {})} for i in range(3)]
    r = api.post("/v1/queues/q/jobs/batch", json={"jobs": jobs})
    assert r.status_code == 201, r.text
    written = r.json()["jobs"]
    assert [j["payload"] for j in written] == [{"i": 0}, {"i": 1}, {"i": 2}]
    for job in written:
        assert api.get(f"/v1/jobs/{job['id']}").json() == job


def test_job_json_has_exactly_the_fields_of_the_response_model():
    from outboxq.api.schemas import JobPublic, job_public, jobs_public
    from outboxq.queue.jobs import Job

    job = Job(id=1, queue="q", payload=b"\x00")
    assert set(job_public(job)) == set(JobPublic.model_fields) - {"marker"}
    assert set(job_public(job, "m")) == set(JobPublic.model_fields)
    assert jobs_public([job]) == [job_public(job)]
    assert job_public(job)["payload"] == "AA==" and job_public(job)["payload_encoding"] == "base64"




def test_request_json_is_read_as_json_loads_reads_it(api):
    """Bodies are parsed by orjson; what it would read otherwise (an integer beyond 64 bits: a float) stays exact."""
    body = (b'{"jobs": [{"payload": {"big": 123456789012345678901234567890, "neg": -98765432109876543210987}},'
            b' {"payload": {"max64": 18446744073709551615, "f": 0.1, "s": "\\u00e9"}}]}')
    r = api.post("/v1/queues/exact/jobs/batch", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 201, r.text
    stored = [api.get(f"/v1/jobs/{j['id']}").json()["payload"] for j in r.json()["jobs"]]
    assert stored == [{"big": 123456789012345678901234567890, "neg": -98765432109876543210987},
                      {"max64": 18446744073709551615, "f": 0.1, "s": "\u00e9"}]
    assert type(stored[0]["big"]) is int
    assert [j["payload"] for j in r.json()["jobs"]] == stored  # the answer, spliced from the texts written, too

@pytest.mark.parametrize("payloads, encodings", [
    ([{"i": 1}, b"\x01", [2]], ["json", "base64", "json"]),  # a codec's bytes among JSON payloads
    ([{"i": 1}, None, [2]], ["json", "json", "json"]),  # only JSON: the first job's encoding for all
    ([b"\x01", bytearray(b"\x02")], ["base64", "base64"]),
])
def test_a_batch_of_sibling_jobs_has_the_json_each_job_has_alone(payloads, encodings):
    """jobs_public copies the first of a QueuedBatch's jobs for the others: each must read as it would alone
    (and as the batch's Jobs read)."""
    from datetime import UTC, datetime

    from outboxq.api.schemas import job_public, jobs_public
    from outboxq.queue.jobs import Job, QueuedBatch

    now = datetime(2026, 11, 25, 12, 0, 0, 123456, tzinfo=UTC)
    batch = QueuedBatch(list(range(7, 7 + len(payloads))), payloads, queue="q", priority=3, run_at=now,
                        max_attempts=4, context={"trace": "t"}, created_at=now)
    jobs = batch.jobs()
    assert jobs == [Job(id=7 + i, queue="q", status="queued", payload=p, priority=3, run_at=now, max_attempts=4,
                        context={"trace": "t"}, created_at=now) for i, p in enumerate(payloads)]
    assert jobs_public(batch) == [job_public(job) for job in jobs]
    assert [j["payload_encoding"] for j in jobs_public(batch)] == encodings


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(exclude_categories=())),  # (surrogates too)
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)


@settings(max_examples=200, deadline=None)
@given(payloads=st.lists(JSON_VALUES, min_size=1, max_size=6),
       context=st.none() | st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=3),
       max_attempts=st.none() | st.integers(1, 1000), queue=st.from_regex(r"[a-z][a-z0-9_.-]{0,20}", fullmatch=True))
def test_a_batch_answer_rendered_from_the_payloads_texts_reads_as_each_jobs_own_json(payloads, context,
                                                                                       max_attempts, queue):
    """jobs_answer splices the texts enqueue_many wrote into one rendering of what the jobs share: any JSON
    payloads (integers beyond 64 bits, NUL and lone surrogates, deep nesting) read as job_public reads each job."""
    from datetime import UTC, datetime

    from outboxq.api.responses import RenderedJSON
    from outboxq.api.schemas import job_public, jobs_answer
    from outboxq.queue.enqueue import payload_json
    from outboxq.queue.jobs import QueuedBatch

    now = datetime(2026, 12, 6, 12, 0, 0, 123456, tzinfo=UTC)
    texts = [payload_json(p) for p in payloads]
    batch = QueuedBatch(list(range(2**40, 2**40 + len(payloads))), payloads, queue=queue, priority=-3,
                        run_at=now, max_attempts=max_attempts, context=context, created_at=now,
                        payload_texts=texts)
    answer = jobs_answer(batch)
    assert isinstance(answer, RenderedJSON)
    answer.decode("utf-8")  # (strict: no lone surrogate reaches the wire)
    expected = {"jobs": [job_public(job) for job in batch.jobs()]}
    assert json.loads(answer) == json.loads(json.dumps(expected))
    assert list(json.loads(answer)["jobs"][0]) == list(expected["jobs"][0])  # the fields in JobPublic's order


def test_a_batch_answer_without_texts_or_of_a_codec_is_built_from_the_jobs():
    from datetime import UTC, datetime

    from outboxq.api.schemas import job_public, jobs_answer
    from outboxq.queue.jobs import QueuedBatch

    now = datetime(2026, 12, 6, tzinfo=UTC)
    batch = QueuedBatch([1, 2], [b"\x01", b"\x02"], queue="q", priority=0, run_at=now, max_attempts=None,
                        context=None, created_at=now)
    assert jobs_answer(batch) == {"jobs": [job_public(job) for job in batch.jobs()]}
    assert jobs_answer([]) == {"jobs": []}


def test_an_idempotent_batch_replays_the_rendered_answer_as_it_was_sent(api, db_url):
    body = {"jobs": [{"payload": {"i": i, "s": "\u00e9\u2028\U0001f600"}} for i in range(3)]}
    headers = {"Idempotency-Key": "rendered-1"}
    first = api.post("/v1/queues/q/jobs/batch", json=body, headers=headers)
    again = api.post("/v1/queues/q/jobs/batch", json=body, headers=headers)
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json() == first.json() and job_count(db_url) == 3
    assert [j["payload"] for j in first.json()["jobs"]] == [job["payload"] for job in body["jobs"]]


def test_batch_whose_jobs_differ_in_options_writes_each_with_its_own(api):
    r = api.post("/v1/queues/q/jobs/batch", json={"jobs": [
        {"payload": 1}, {"payload": 2, "priority": 5}, {"payload": 3, "delay_seconds": 3600}]})
    assert r.status_code == 201, r.text
    jobs = [api.get(f"/v1/jobs/{j['id']}").json() for j in r.json()["jobs"]]
    assert [j["priority"] for j in jobs] == [0, 5, 0]
    assert jobs[2]["run_at"] > jobs[1]["run_at"]


def test_payload_integers_beyond_64_bits_round_trip(api):
    payload = {"big": 2**70, "negative": -(2**65), "float": 1.5}
    one = api.post("/v1/queues/q/jobs", json={"payload": payload})
    batch = api.post("/v1/queues/q/jobs/batch", json={"jobs": [{"payload": payload}, {"payload": 1}]},
                     headers={"Idempotency-Key": "big-ints"})
    again = api.post("/v1/queues/q/jobs/batch", json={"jobs": [{"payload": payload}, {"payload": 1}]},
                     headers={"Idempotency-Key": "big-ints"})
    assert (one.status_code, batch.status_code, again.status_code) == (201, 201, 200)
    assert one.json()["payload"] == batch.json()["jobs"][0]["payload"] == payload
    assert again.json() == batch.json()


@pytest.mark.parametrize("jobs", [
    [{"payload": 1, "key": "same"}, {"payload": 2, "key": "same"}],  # duplicate within the batch
    [{"payload": 1}, {"payload": 2, "depends_on": [{"queue": "q", "key": "missing"}]}],  # unknown dependency
    [{"payload": 1}, {"payload": "x" * 3000}],  # one payload over the limit
    [{"payload": 1}, {"payload": 2, "bogus": True}],  # unknown field
    [{"payload": i} for i in range(6)],  # over max_batch_jobs
])
def test_batch_is_all_or_nothing(api, db_url, jobs):
    r = api.post("/v1/queues/q/jobs/batch", json={"jobs": jobs})
    assert 400 <= r.status_code < 500, r.text
    assert r.json()["error"]["message"]
    assert job_count(db_url) == 0


@pytest.mark.parametrize("bad,rule", [
    ({"payload": 2, "run_at": "2030-01-01T00:00:00Z", "delay_seconds": 5},
     "give either run_at or delay_seconds, not both"),
    ({"payload": 2, "unique": "active"}, "unique applies to jobs with a key: give key"),
    ({"payload": 2, "unique": 60, "key": None}, "unique applies to jobs with a key: give key"),
])
def test_batch_jobs_whose_fields_disagree_are_named_by_index_and_nothing_is_written(api, db_url, bad, rule):
    agreeing = [{"payload": 1, "run_at": "2030-01-01T00:00:00Z", "delay_seconds": None},
                {"payload": 3, "unique": "active", "key": "k3"}, {"payload": 4, "unique": "forever"}]
    r = api.post("/v1/queues/q/jobs/batch", json={"jobs": [agreeing[0], bad, *agreeing[1:], bad]})
    assert r.status_code == 422, r.text
    assert r.json()["error"] == {"code": "invalid_request", "message": f"body field 'jobs.1' Value error, {rule}; "
                                                                       f"body field 'jobs.4' Value error, {rule}"}
    assert job_count(db_url) == 0
    assert api.post("/v1/queues/q/jobs/batch", json={"jobs": agreeing}).status_code == 201


def test_batch_with_a_key_that_already_exists_writes_none_of_its_jobs(api, db_url):
    assert api.post("/v1/queues/q/jobs", json={"payload": 0, "key": "taken"}).status_code == 201
    r = api.post("/v1/queues/q/jobs/batch", json={"jobs": [{"payload": 1, "key": "new"},
                                                            {"payload": 2, "key": "taken"}]})
    assert r.status_code == 409
    assert job_count(db_url) == 1


BAD_INPUTS = [
    # (description, request kwargs, expected status, words the message must hold)
    ("malformed JSON", {"content": b'{"payload": ', "headers": {"Content-Type": "application/json"}}, 400, "JSON"),
    ("not an object", {"json": [1, 2]}, 422, "body"),
    ("missing payload", {"json": {"key": "k"}}, 422, "payload"),
    ("wrong type of priority", {"json": {"payload": 1, "priority": "high"}}, 422, "priority"),
    ("priority out of range", {"json": {"payload": 1, "priority": 99999}}, 422, "priority"),
    ("wrong type of depends_on", {"json": {"payload": 1, "depends_on": "q:k"}}, 422, "depends_on"),
    ("unknown field", {"json": {"payload": 1, "colour": "red"}}, 422, "colour"),
    ("naive run_at", {"json": {"payload": 1, "run_at": "2030-01-01T00:00:00"}}, 422, "run_at"),
    ("run_at and delay", {"json": {"payload": 1, "run_at": "2030-01-01T00:00:00Z", "delay_seconds": 5}}, 422,
     "delay"),
    ("negative delay", {"json": {"payload": 1, "delay_seconds": -1}}, 422, "delay_seconds"),
    ("empty key", {"json": {"payload": 1, "key": ""}}, 422, "key"),
    ("NUL character in the key", {"json": {"payload": 1, "key": "a\x00b"}}, 422, "key"),
    ("NUL character in the payload", {"json": {"payload": {"a": "x\x00y"}}}, 422, ""),
    ("lone surrogate in the payload", {"content": b'{"payload": "\\ud800"}',
                                       "headers": {"Content-Type": "application/json"}}, 422, "rejected"),
    ("NaN in the payload", {"content": b'{"payload": NaN}', "headers": {"Content-Type": "application/json"}},
     422, "JSON"),
    ("unknown dependency", {"json": {"payload": 1, "depends_on": [{"queue": "q", "key": "nope"}]}}, 422, "nope"),
    ("payload over the limit", {"json": {"payload": "x" * 3000}}, 413, "limit"),
    ("request body over the limit", {"content": b'{"payload": "' + b"x" * 400_000 + b'"}',
                                      "headers": {"Content-Type": "application/json"}}, 413, "bytes"),
]


@pytest.mark.parametrize("description,kwargs,status,words", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_answers_4xx_with_a_message_and_writes_nothing(api, db_url, description, kwargs, status, words):
    r = api.post("/v1/queues/q/jobs", **kwargs)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["code"] and error["message"]
    assert words.lower() in error["message"].lower()
    assert job_count(db_url) == 0


@pytest.mark.parametrize("queue", ["has space", "x" * 129, "semi;colon", "ümlaut"])
def test_bad_queue_name_is_422_and_writes_nothing(api, db_url, queue):
    r = api.post(f"/v1/queues/{queue}/jobs", json={"payload": 1})
    assert r.status_code == 422, r.text
    assert "queue" in r.json()["error"]["message"]
    assert job_count(db_url) == 0


def test_duplicate_key_is_409_and_keeps_the_first_job(api, db_url):
    assert api.post("/v1/queues/q/jobs", json={"payload": 1, "key": "k"}).status_code == 201
    r = api.post("/v1/queues/q/jobs", json={"payload": 2, "key": "k"})
    assert r.status_code == 409 and r.json()["error"]["code"] == "duplicate_job"
    assert "k" in r.json()["error"]["message"]
    assert job_count(db_url) == 1


def test_listing_pages_through_a_queue_in_enqueue_order(api):
    ids = [api.post("/v1/queues/q/jobs", json={"payload": i}).json()["id"] for i in range(7)]
    api.post("/v1/queues/other/jobs", json={"payload": "not listed"})
    seen, marker = [], None
    while True:
        params = {"limit": 3, **({"marker": marker} if marker else {})}
        page = api.get("/v1/queues/q/jobs", params=params).json()
        assert all(item["marker"] for item in page["items"])
        seen += [item["id"] for item in page["items"]]
        if not page["next_marker"]:
            break
        marker = page["next_marker"]
    assert seen == ids


def test_listing_filters_by_status(api, db_url):
    ids = [api.post("/v1/queues/q/jobs", json={"payload": i}).json()["id"] for i in range(3)]
    count(db_url, "WITH u AS (UPDATE outboxq_jobs SET status = 'dead' WHERE id = %s RETURNING 1) "
                  "SELECT count(*) FROM u", (ids[1],))
    page = api.get("/v1/queues/q/jobs", params={"status": "dead"}).json()
    assert [i["id"] for i in page["items"]] == [ids[1]]
    assert api.get("/v1/queues/q/jobs", params={"status": "sleeping"}).status_code == 422


@pytest.mark.parametrize("params", [{"limit": 0}, {"limit": 1001}, {"limit": "many"}])
def test_listing_rejects_a_bad_limit(api, params):
    r = api.get("/v1/queues/q/jobs", params=params)
    assert r.status_code == 422 and "limit" in r.json()["error"]["message"]


def test_tampered_or_foreign_marker_is_400(api):
    for i in range(2):
        api.post("/v1/queues/q/jobs", json={"payload": i})
    marker = api.get("/v1/queues/q/jobs", params={"limit": 1}).json()["next_marker"]
    assert api.get("/v1/queues/q/jobs", params={"marker": marker}).status_code == 200
    flipped = marker[:5] + ("A" if marker[5] != "A" else "B") + marker[6:]
    for bad in [flipped, marker + "A", marker[:-2], "1.0.0", "not-a-marker", "%%%"]:
        r = api.get("/v1/queues/q/jobs", params={"marker": bad})
        assert r.status_code == 400, (bad, r.text)
        assert r.json()["error"]["code"] == "invalid_marker"
    # a marker of queue q is not accepted for another queue
    assert api.get("/v1/queues/other/jobs", params={"marker": marker}).status_code == 400


def test_a_marker_stays_valid_for_another_app_with_the_same_secret(db_url):
    with api_client(db_url) as first:
        for i in range(2):
            first.post("/v1/queues/q/jobs", json={"payload": i})
        page = first.get("/v1/queues/q/jobs", params={"limit": 1}).json()
    with api_client(db_url) as second:
        rest = second.get("/v1/queues/q/jobs", params={"marker": page["next_marker"]}).json()
    assert [i["payload"] for i in page["items"] + rest["items"]] == [0, 1]


def test_job_json_round_trips_unicode_payloads(api):
    payload = {"text": "żółć ✓ 日本", "nested": [1, 2.5, None, True, {"k": "v"}]}
    r = api.post("/v1/queues/q/jobs", content=json.dumps(payload and {"payload": payload}).encode(),
                 headers={"Content-Type": "application/json"})
    assert r.status_code == 201
    assert api.get(f"/v1/jobs/{r.json()['id']}").json()["payload"] == payload


def test_dependencies_over_the_per_request_cap_are_refused_before_anything_is_written(db_url):
    with api_client(db_url, max_dependencies_per_request=3) as api:
        for key in ("a", "b", "c", "d"):
            assert api.post("/v1/queues/deps/jobs", json={"payload": 1, "key": key}).status_code == 201
        before = job_count(db_url)
        refs = [{"queue": "deps", "key": k} for k in ("a", "b", "c", "d")]
        one = api.post("/v1/queues/deps/jobs", json={"payload": 1, "depends_on": refs})
        assert one.status_code == 422 and "4 dependencies" in one.text and "max_dependencies_per_request" in one.text
        # Across a batch: 2 + 2 is over 3, although each job alone is within it.
        batch = api.post("/v1/queues/deps/jobs/batch", json={"jobs": [
            {"payload": 1, "depends_on": refs[:2]}, {"payload": 2, "depends_on": refs[2:]}]})
        assert batch.status_code == 422 and "4 dependencies" in batch.text
        assert job_count(db_url) == before
        assert count(db_url, "SELECT count(*) FROM outboxq_job_dependencies") == 0
        within = api.post("/v1/queues/deps/jobs", json={"payload": 1, "depends_on": refs[:3]})
        assert within.status_code == 201, within.text
