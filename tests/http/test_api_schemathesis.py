"""Schemathesis against a live `outboxq serve` (admin token, every check): the OpenAPI document tells the
truth. Generated requests never get a 5xx, every response matches the document, a request the document calls
valid is accepted and one it calls invalid is refused (headers it does not name are ignored, as proxies add
their own), OPTIONS answers with the right Allow header.

Rejections that depend on the server's state or configuration, which no schema can express, are allowed:
an unknown listing marker (400 invalid_marker), dependencies on jobs that do not exist (422
unknown_dependency), an Idempotency-Key reused with another body (409), a Spark processor name the operator
did not register (422), a workflow whose steps make no DAG (422 invalid_workflow: a graph's rules are beyond
JSON Schema), a search's payload that is no JSON object or a bulk filter matching every job without "all"
(422 invalid_filter: JSON inside a query parameter, and a rule across fields), and a NUL character or a lone
surrogate in a payload (422: JSON allows them, PostgreSQL's text and jsonb cannot hold them).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import negative_data_rejection, positive_data_acceptance

from tests.support import wait_for

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "schemathesis-admin-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def live_api(pg_server_url, template_db):
    """`outboxq serve` on a migrated database of its own; the schema read from its /openapi.json."""
    import httpx

    from tests.spark_support import extra_database

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with extra_database(pg_server_url, template_db) as url:
        env = {**os.environ, "DATABASE_URL": url, "OUTBOXQ_API_TOKENS": f"{TOKEN}:admin",
               # Schemathesis sends wrong tokens on purpose: no 429 for this client, the rest is tested.
               "OUTBOXQ_AUTH_MAX_FAILURES": "1000000", "PYTHONPATH": str(ROOT)}
        proc = subprocess.Popen([sys.executable, "-m", "outboxq.cli", "--log-level", "WARNING", "serve",
                                 "--host", "127.0.0.1", "--port", str(port)],
                                env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}"
        try:
            wait_for(lambda: _answers(httpx, base + "/healthz"), timeout=30)
            yield schemathesis.openapi.from_url(base + "/openapi.json")
        finally:
            proc.terminate()
            proc.wait(timeout=20)


def _answers(httpx, url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


STATE_DEPENDENT = {(400, "invalid_marker"), (422, "unknown_dependency"), (409, "idempotency_key_reused"),
                   (422, "invalid_workflow"), (422, "invalid_filter")}
EXAMPLES_PER_OPERATION_AND_MODE = 20


def _state_dependent(case, response) -> bool:
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        return False
    if (response.status_code, error.get("code")) in STATE_DEPENDENT:
        return True
    message = str(error.get("message"))
    if response.status_code == 422 and error.get("code") == "invalid_input" and (
            "unsupported Unicode escape sequence" in message or "0x00" in message or "not valid Unicode" in message):
        return True  # a NUL character or a lone surrogate: JSON text that PostgreSQL's text and jsonb cannot hold
    return case.path == "/v1/spark/batches" and response.status_code == 422 and "unknown processor" in message


def _only_headers_invalid(case) -> bool:
    # Headers the document does not name are ignored, not refused: proxies and clients add their own.
    components = case.meta.components if case.meta is not None else {}
    invalid = [location for location, info in components.items() if info.mode is GenerationMode.NEGATIVE]
    return bool(invalid) and all(location.value == "header" for location in invalid)


def test_the_api_does_what_its_openapi_document_says(live_api):
    # (Schemathesis' own pytest plugin does not run under this pytest; its strategies and checks are used
    # directly, every operation in turn, valid and invalid requests.)
    failures: list[str] = []
    operations = [result.ok() for result in live_api.get_all_operations()]
    assert len(operations) > 20
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(max_examples=EXAMPLES_PER_OPERATION_AND_MODE, deadline=None, derandomize=True,
                      suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate],
                      database=None)
            def exercise(case):
                response = case.call(headers=AUTH, timeout=30)
                excluded = [positive_data_acceptance] if _state_dependent(case, response) else []
                if _only_headers_invalid(case):
                    excluded.append(negative_data_rejection)
                try:
                    case.validate_response(response, headers=AUTH, excluded_checks=excluded)
                except BaseException as exc:  # (schemathesis raises an exception group)
                    where = case.meta.components if case.meta is not None else None
                    raise AssertionError(f"{exc}\nanswer {response.status_code}: {response.text[:300]}\n"
                                         f"invalid parts: {where}; query {case.query!r}") from None

            try:
                exercise()
            except Unsatisfiable:
                assert mode is GenerationMode.NEGATIVE  # an operation without inputs has no invalid request
            except Exception as exc:  # noqa: BLE001 - every operation's failure is reported, then the test fails
                failures.append(f"{operation.label} ({mode.value}): {str(exc)[:1500]}")
    assert not failures, "\n\n".join(failures)
