"""Bearer tokens with scopes, from OUTBOXQ_API_TOKENS ("token:scope+scope,..."). Tokens are never logged."""

from __future__ import annotations

import hashlib
import hmac
import math
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from functools import cache
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from outboxq.api.errors import ApiProblem

SCOPES = ("enqueue", "read", "admin")
_bearer = HTTPBearer(auto_error=False, description="A token from OUTBOXQ_API_TOKENS")


@dataclass(frozen=True, slots=True)
class TokenEntry:
    """A configured token, kept only as its SHA-256 digest, and its scopes."""

    digest: bytes
    scopes: frozenset[str]


@dataclass(frozen=True, slots=True)
class Principal:
    """Who made the request: a non-secret id of the token, and its scopes."""

    id: str
    scopes: frozenset[str]


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


# A token short enough to guess is refused when the API starts.
MIN_TOKEN_LENGTH = 16


def parse_tokens(spec: str) -> list[TokenEntry]:
    """The tokens of an OUTBOXQ_API_TOKENS value; ValueError (not naming the token) when it is malformed."""
    entries = []
    for position, item in enumerate((s.strip() for s in spec.split(",")), start=1):
        if not item:
            continue
        token, sep, scope_text = item.rpartition(":")
        if not sep or not token:
            raise ValueError(f"OUTBOXQ_API_TOKENS entry {position} must look like token:scope+scope")
        if len(token) < MIN_TOKEN_LENGTH:
            raise ValueError(f"OUTBOXQ_API_TOKENS entry {position} is shorter than {MIN_TOKEN_LENGTH} characters; "
                             "use a long random token (for example `python -c 'import secrets; "
                             "print(secrets.token_urlsafe(32))'`)")
        scopes = {s.strip() for s in scope_text.split("+") if s.strip()}
        unknown = scopes - set(SCOPES)
        if not scopes or unknown:
            raise ValueError(
                f"OUTBOXQ_API_TOKENS entry {position} has scopes {sorted(unknown) or 'none'}; "
                f"use {', '.join(SCOPES)} joined with +"
            )
        if "admin" in scopes:
            scopes = set(SCOPES)
        entries.append(TokenEntry(_digest(token), frozenset(scopes)))
    return entries


def authenticate(tokens: list[TokenEntry], presented: str) -> Principal | None:
    """The principal of a presented token, comparing with every configured token in constant time."""
    digest = _digest(presented)
    found: TokenEntry | None = None
    for entry in tokens:  # no early exit: the time does not depend on which token matched
        if hmac.compare_digest(entry.digest, digest):
            found = entry
    if found is None:
        return None
    return Principal(found.digest.hex()[:16], found.scopes)


class FailedAuthLimiter:
    """Counts wrong tokens per client address in a sliding window; over the limit, the client's requests with a
    wrong token (or none) are answered 429 until its oldest failure leaves the window. A right token is always
    let through: clients behind one address (a NAT, a proxy) are not locked out by another's wrong tokens, and
    tokens are long and random (MIN_TOKEN_LENGTH), so slowing guesses is not what keeps them secret."""

    MAX_CLIENTS = 10_000  # clients tracked at once; the least recently failing ones are forgotten first

    def __init__(self, max_failures: int, window_s: float):
        self.max_failures, self.window_s = max_failures, window_s
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()
        self._lock = threading.Lock()

    def retry_after(self, client: str) -> float | None:
        """Seconds until `client` may try again, or None when it may try now."""
        with self._lock:
            failures = self._recent(client, time.monotonic())
            if failures is None or len(failures) < self.max_failures:
                return None
            return max(0.0, failures[0] + self.window_s - time.monotonic())

    def failed(self, client: str) -> None:
        """Record a wrong token from `client`."""
        now = time.monotonic()
        with self._lock:
            failures = self._recent(client, now)
            if failures is None:
                failures = self._failures[client] = deque(maxlen=self.max_failures)
                if len(self._failures) > self.MAX_CLIENTS:
                    self._failures.popitem(last=False)
            failures.append(now)
            self._failures.move_to_end(client)

    def _recent(self, client: str, now: float) -> deque[float] | None:
        failures = self._failures.get(client)
        while failures and failures[0] <= now - self.window_s:
            failures.popleft()
        return failures


def check(request: Request, credentials: HTTPAuthorizationCredentials | None, scope: str) -> Principal:
    """The request's principal when it holds `scope`; 401 or 403 otherwise. A request without a right token is
    answered 429 while its address has sent too many wrong ones; one with a right token never is."""
    from outboxq.api.routing import api_state  # routing imports this module (TokenEntry)

    state = api_state(request)
    # (The address is the connection's: the server rewrites it from X-Forwarded-For only for the proxies it is
    # told to trust, OUTBOXQ_FORWARDED_ALLOW_IPS, so a client cannot pick the address it is counted under.)
    client = request.client.host if request.client else "unknown"
    if credentials is None or credentials.scheme.lower() != "bearer" or not credentials.credentials:
        _refuse_if_throttled(state.auth_limiter, client)
        raise ApiProblem(401, "unauthorized", "send Authorization: Bearer <token> (tokens come from "
                         "OUTBOXQ_API_TOKENS)", {"WWW-Authenticate": "Bearer"})
    principal = authenticate(state.tokens, credentials.credentials)
    if principal is None:
        _refuse_if_throttled(state.auth_limiter, client)
        state.auth_limiter.failed(client)
        raise ApiProblem(401, "unauthorized", "unknown token", {"WWW-Authenticate": "Bearer"})
    if scope not in principal.scopes:
        raise ApiProblem(403, "forbidden", f"this route needs a token with the {scope!r} scope")
    return principal


async def check_headers(request: Request, scope: str) -> Principal:
    """check() from the request's Authorization header, before anything reads its body (OutboxqRoute)."""
    return check(request, await _bearer(request), scope)


def _refuse_if_throttled(limiter: FailedAuthLimiter, client: str) -> None:
    """429 when `client` has sent too many wrong tokens lately (a refused request is not counted again)."""
    wait_s = limiter.retry_after(client)
    if wait_s is not None:
        raise ApiProblem(429, "too_many_failed_authentications",
                         f"too many wrong tokens from this address; try again in {math.ceil(wait_s)} s "
                         "(a right token is not refused)", {"Retry-After": str(math.ceil(wait_s))})


@cache
def require(scope: str) -> Any:
    """A dependency that returns the Principal when the token has `scope` (one callable per scope)."""
    if scope not in SCOPES:
        raise ValueError(f"unknown scope {scope!r}")

    # async: FastAPI runs a plain def dependency in the thread pool, a hop to a thread and back for a hash and
    # a comparison that never wait; on the event loop it costs nothing but them.
    async def dependency(
        request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
    ) -> Principal:
        return check(request, credentials, scope)

    dependency.__name__ = f"require_{scope}"
    return dependency


def scoped(scope: str) -> dict[str, Any]:
    """Route options: the scope dependency, and the scope recorded in OpenAPI (x-required-scope)."""
    return {"dependencies": [Depends(require(scope))], "openapi_extra": {"x-required-scope": scope}}


EnqueuePrincipal = Annotated[Principal, Depends(require("enqueue"))]
