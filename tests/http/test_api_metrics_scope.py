"""GET /metrics: the read scope by default (OUTBOXQ_METRICS_PUBLIC opens it), and limit keys, which come from
payloads, only as a count per queue unless OUTBOXQ_METRICS_KEY_LABELS names them."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from tests.api_support import api_client, auth
from tests.support import claim_running


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_metrics_need_a_token_with_the_read_scope_by_default(db_url):
    with api_client(db_url, None) as client:
        refused = client.get("/metrics")
        assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
        assert "outboxq_jobs" not in refused.text
        assert client.get("/metrics", headers=auth("enqueue")).status_code == 403
        read = client.get("/metrics", headers=auth("read"))
        assert read.status_code == 200 and read.headers["content-type"].startswith("text/plain")
        assert client.get("/metrics", headers=auth("admin")).status_code == 200


def test_metrics_answer_without_a_token_when_made_public(db_url, monkeypatch):
    monkeypatch.setenv("OUTBOXQ_METRICS_PUBLIC", "true")
    with api_client(db_url, None) as client:
        assert client.get("/metrics").status_code == 200


def test_limit_keys_appear_only_as_a_count_per_queue_by_default(db_url):
    claim_running(db_url, "tenants", ["customer-4711", "customer-4711", "customer-0815"])
    with api_client(db_url, "read") as client:
        r = client.get("/metrics")
    assert r.status_code == 200
    assert "customer-4711" not in r.text and "customer-0815" not in r.text
    samples = _samples(r.text)
    assert samples[("outboxq_queue_limit_keys_running", (("queue", "tenants"),))] == 2
    assert samples[("outboxq_queue_limit_running", (("queue", "tenants"),))] == 3
    assert not any("key" in dict(labels) for _, labels in samples)


def test_limit_keys_are_labels_when_asked_for(db_url):
    claim_running(db_url, "tenants", ["customer-4711", "customer-4711", "customer-0815"])
    with api_client(db_url, "read", metrics_key_labels=True) as client:
        r = client.get("/metrics")
    samples = _samples(r.text)
    assert samples[("outboxq_queue_limit_key_running", (("key", "customer-4711"), ("queue", "tenants")))] == 2
    assert samples[("outboxq_queue_limit_key_running", (("key", "customer-0815"), ("queue", "tenants")))] == 1
    assert samples[("outboxq_queue_limit_keys_running", (("queue", "tenants"),))] == 2
