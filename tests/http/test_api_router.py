"""outboxq's API as a router inside someone else's FastAPI app: its own pool, auth, limits and error shape;
the user's app, state and error handling untouched."""

from __future__ import annotations

import re

import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient

from outboxq.api import create_router
from tests.api_support import api_client, api_settings, auth, job_count


class OutOfStock(Exception):
    """The user's own error, with the user's own handler."""


def user_app(db_url: str) -> FastAPI:
    """A user's app with its own state, route and exception handler, mounting outboxq under /outboxq."""
    app = FastAPI()
    app.state.settings = "the user's settings"  # names outboxq must not touch
    app.state.pool = "the user's pool"

    @app.exception_handler(OutOfStock)
    async def out_of_stock(request, exc):
        return JSONResponse({"detail": "sold out"}, status_code=409)

    @app.get("/items/{item}")
    def item(item: str):
        if item == "gone":
            raise OutOfStock()
        return {"item": item, "settings": app.state.settings}

    app.include_router(create_router(api_settings(db_url, max_payload_bytes=2000)), prefix="/outboxq")
    return app


@pytest.fixture
def client(db_url):
    with TestClient(user_app(db_url), headers=auth("admin")) as client:  # lifespans run
        yield client


def test_enqueue_and_read_back_through_the_mounted_router(client, db_url):
    r = client.post("/outboxq/v1/queues/emails/jobs", json={"payload": {"to": "ann"}, "key": "ann"})
    assert r.status_code == 201, r.text
    job = client.get(f"/outboxq/v1/jobs/{r.json()['id']}").json()
    assert job["queue"] == "emails" and job["payload"] == {"to": "ann"}
    assert job_count(db_url) == 1
    assert client.get("/outboxq/readyz").json()["ready"] is True


def test_errors_answer_in_outboxq_shape_and_write_nothing(client, db_url):
    assert client.post("/outboxq/v1/queues/emails/jobs", json={"payload": 1, "key": "k"}).status_code == 201
    duplicate = client.post("/outboxq/v1/queues/emails/jobs", json={"payload": 2, "key": "k"})
    assert duplicate.status_code == 409 and duplicate.json()["error"]["code"] == "duplicate_job"
    bad = client.post("/outboxq/v1/queues/emails/jobs", json={"payload": 1, "priority": "high"})
    assert bad.status_code == 422 and "priority" in bad.json()["error"]["message"]
    no_token = client.post("/outboxq/v1/queues/emails/jobs", json={"payload": 1}, headers={"Authorization": ""})
    assert no_token.status_code == 401 and no_token.json()["error"]["code"] == "unauthorized"
    too_large = client.post("/outboxq/v1/queues/emails/jobs", json={"payload": "x" * 300_000})
    assert too_large.status_code == 413 and too_large.json()["error"]["code"] in ("request_too_large",
                                                                                   "payload_too_large")
    assert job_count(db_url) == 1


def test_the_users_own_routes_state_and_errors_are_untouched(client):
    assert client.get("/items/pen").json() == {"item": "pen", "settings": "the user's settings"}
    gone = client.get("/items/gone")
    assert gone.status_code == 409 and gone.json() == {"detail": "sold out"}
    missing = client.get("/nowhere")
    assert missing.status_code == 404 and missing.json() == {"detail": "Not Found"}  # FastAPI's, not ours


def test_docs_and_redoc_load_their_assets_from_the_app_not_a_cdn(db_url):
    with api_client(db_url) as api:
        for page in ("/docs", "/redoc"):
            html = api.get(page)
            assert html.status_code == 200 and "text/html" in html.headers["content-type"]
            assets = re.findall(r"""(?:src|href)=["']([^"']+)["']""", html.text)
            assert assets, html.text[:500]
            assert not [a for a in assets if re.match(r"(https?:)?//", a)], assets  # nothing from another host
            for asset in assets:
                if asset.endswith((".js", ".css")):
                    answer = api.get(asset)
                    assert answer.status_code == 200 and len(answer.content) > 10_000, asset
        assert "cdn" not in api.get("/docs").text.lower()
