"""Auth: every route that needs a scope answers 401 without a token and 403 with a token lacking the scope."""

from __future__ import annotations

import logging
import re
import time

import pytest

from outboxq.api import create_app
from outboxq.api.auth import authenticate, parse_tokens
from outboxq.api.server import ensure_token
from outboxq.settings import Settings
from tests.api_support import TOKENS, api_client, api_settings, auth

SCOPE_HOLDERS = {"admin": {"admin"}, "read": {"read", "enqueue+read", "admin"},
                 "enqueue": {"enqueue", "enqueue+read", "admin"}}


def _operations(db_url):
    """(method, path template, declared scope) of every operation in the app's OpenAPI document."""
    document = create_app(api_settings(db_url)).openapi()
    return [(method.upper(), path, operation.get("x-required-scope"))
            for path, item in document["paths"].items() for method, operation in item.items()]


def _scoped_routes(db_url):
    """(method, concrete path, scope) of every operation that declares a required scope."""
    return [(method, re.sub(r"\{(\w+)\}", lambda m: "q" if m.group(1) == "queue" else "1", path), scope)
            for method, path, scope in _operations(db_url) if scope in SCOPE_HOLDERS]


def test_every_route_except_probes_and_metrics_declares_a_scope(db_url):
    open_routes = {path for _, path, scope in _operations(db_url) if scope not in SCOPE_HOLDERS}
    assert open_routes == {"/healthz", "/readyz", "/metrics"}
    admin_paths = {p for _, p, s in _scoped_routes(db_url) if s == "admin"}
    assert {"/v1/jobs/1/retry", "/v1/queues/q/retry", "/v1/jobs/1/cancel", "/v1/queues/q/pause",
            "/v1/queues/q/resume"} <= admin_paths


def test_every_scoped_route_answers_401_and_403(db_url):
    routes = _scoped_routes(db_url)
    assert len(routes) >= 15
    # One wrong token per route: more than the default limit of wrong tokens (429, tested below).
    with api_client(db_url, None, auth_max_failures=1000) as client:
        for method, path, scope in routes:
            r = client.request(method, path)
            assert r.status_code == 401, (method, path, r.text)
            assert r.json()["error"]["code"] == "unauthorized"
            assert r.headers["WWW-Authenticate"] == "Bearer"
            r = client.request(method, path, headers={"Authorization": "Bearer not-a-token"})
            assert r.status_code == 401, (method, path)
            r = client.request(method, path, headers={"Authorization": f"Basic {TOKENS['admin']}"})
            assert r.status_code == 401, (method, path)
            for holder in TOKENS:
                r = client.request(method, path, headers=auth(holder))
                if holder in SCOPE_HOLDERS[scope]:
                    assert r.status_code not in (401, 403), (method, path, holder, r.text)
                else:
                    assert r.status_code == 403, (method, path, holder, r.text)
                    assert scope in r.json()["error"]["message"]


def test_admin_scope_implies_enqueue_and_read():
    (entry,) = parse_tokens("tok-long-enough-123:admin")
    assert entry.scopes == {"admin", "enqueue", "read"}
    (entry,) = parse_tokens(" tok-long-enough-123:enqueue+read ")
    assert entry.scopes == {"enqueue", "read"}


@pytest.mark.parametrize("spec", ["tok", "tok:", ":admin", "tok:root", "tok:read+sudo"])
def test_a_malformed_token_spec_is_refused_without_showing_the_token(spec):
    with pytest.raises(ValueError) as info:
        parse_tokens(spec)
    assert "tok" not in str(info.value).replace("token", "")


def test_tokens_are_kept_only_as_digests_and_matched_exactly():
    tokens = parse_tokens("alpha-token-0123456:read,beta-token-01234567:admin")
    assert all(b"alpha-token" not in repr(t).encode() for t in tokens)
    assert authenticate(tokens, "alpha-token-0123456").scopes == {"read"}
    assert authenticate(tokens, "beta-token-01234567").scopes == {"admin", "enqueue", "read"}
    assert authenticate(tokens, "alpha-token-012345") is None
    assert authenticate(tokens, "alpha-token-0123456 ") is None


def test_tokens_never_appear_in_logs(db_url, caplog):
    caplog.set_level(logging.DEBUG)
    with api_client(db_url) as client:
        client.post("/v1/queues/q/jobs", json={"payload": 1})
        client.get("/v1/queues", headers={"Authorization": "Bearer wrong-secret-token"})
        client.post("/v1/queues/q/pause", headers=auth("read"))
    for secret in [*TOKENS.values(), "wrong-secret-token"]:
        assert secret not in caplog.text


def test_without_configured_tokens_the_app_refuses_everything(db_url):
    with api_client(db_url, None, api_tokens="") as client:
        assert client.get("/v1/queues", headers={"Authorization": "Bearer anything"}).status_code == 401


def test_serve_generates_and_prints_one_admin_token_when_none_is_configured(capsys):
    settings = Settings(api_tokens="")
    ensure_token(settings)
    printed = capsys.readouterr().err
    (entry,) = parse_tokens(settings.api_tokens)
    token = settings.api_tokens.rsplit(":", 1)[0]
    assert token in printed and printed.count(token) == 1
    assert entry.scopes == {"admin", "enqueue", "read"}
    configured = Settings(api_tokens="my-own-read-token-1:read")
    ensure_token(configured)
    assert configured.api_tokens == "my-own-read-token-1:read" and capsys.readouterr().err == ""


@pytest.mark.parametrize("spec", ["Xq7:admin", "Zz9Zz9:read", "fifteen-chars-x:admin"])
def test_tokens_shorter_than_16_characters_are_refused_at_start(spec):
    with pytest.raises(ValueError, match="shorter than 16 characters") as refused:
        parse_tokens(spec)
    assert spec.split(":")[0] not in str(refused.value)  # the message never repeats the token


def test_repeated_wrong_tokens_are_answered_429_with_retry_after_then_allowed_again(db_url):
    with api_client(db_url, scope=None, auth_max_failures=3, auth_failure_window_s=1.0) as api:
        wrong = {"Authorization": "Bearer this-is-not-a-configured-token"}
        for _ in range(3):
            assert api.get("/v1/queues", headers=wrong).status_code == 401
        refused = api.get("/v1/queues", headers=wrong)
        assert refused.status_code == 429 and refused.headers["Retry-After"] in ("1",)
        assert refused.json()["error"]["code"] == "too_many_failed_authentications"
        # While refused, a request without a token is too; one with a right token never is.
        assert api.get("/v1/queues").status_code == 429
        assert api.get("/v1/queues", headers=auth("read")).status_code == 200
        time.sleep(1.1)
        assert api.get("/v1/queues", headers=wrong).status_code == 401


def test_every_dependency_of_the_routes_runs_on_the_event_loop():
    """No route dependency is a plain def: FastAPI would run each in the thread pool, a hop per request."""
    import inspect

    from fastapi.routing import APIRoute

    def calls(dependant):
        for dependency in dependant.dependencies:
            yield dependency.call
            yield from calls(dependency)

    app = create_app(api_settings("postgresql://unused/unused"))
    def is_async(call):  # a coroutine function, or an object whose __call__ is one (HTTPBearer)
        return inspect.iscoroutinefunction(call) or inspect.iscoroutinefunction(type(call).__call__)

    sync = {getattr(call, "__name__", repr(call)) for route in app.routes if isinstance(route, APIRoute)
            for call in calls(route.dependant) if not is_async(call)}
    assert sync == set()
