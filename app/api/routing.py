"""What outboxq's routes carry with them, so that they work in outboxq's own app and in anyone else's:
the run-time state (one object on `app.state.outboxq`) and a route class that enforces the body limits and
answers every error in outboxq's JSON shape (the including app's exception handlers are not ours)."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute
from psycopg_pool import ConnectionPool

from outboxq.api import errors
from outboxq.api.auth import FailedAuthLimiter, Principal, TokenEntry, check_headers
from outboxq.db import loads_json
from outboxq.errors import InvalidInput
from outboxq.queue.admin import HealthMonitor
from outboxq.queue.secrets import MARKER_SECRET, shared_secret
from outboxq.settings import Settings

# Room for the envelope (key, depends_on, options) around a payload at the size limit.
REQUEST_OVERHEAD_BYTES = 256 * 1024
# Room for the fields of one job of a batch around its payload: its key and limit key (255 characters each,
# up to 6 bytes apiece escaped) and its options. Dependencies are bounded per request
# (max_dependencies_per_request) and come out of REQUEST_OVERHEAD_BYTES.
JOB_OVERHEAD_BYTES = 4 * 1024
BODY_METHODS = ("POST", "PUT", "PATCH")


@dataclass
class ApiState:
    """The API's run-time state: settings, tokens, marker key, health monitor and (once opened) the pool."""

    settings: Settings
    tokens: list[TokenEntry]
    # OUTBOXQ_MARKER_SECRET, else the secret every API process shares through the database (read once).
    marker_secret: bytes | None
    health_monitor: HealthMonitor
    auth_limiter: FailedAuthLimiter
    pool: ConnectionPool | None = field(default=None)

    def marker_key(self, conn: Any) -> bytes:
        """The listing markers' HMAC key: the configured one, or the one kept in the database."""
        if self.marker_secret is None:
            self.marker_secret = shared_secret(conn, MARKER_SECRET)
        return self.marker_secret

    def body_limit(self, batch: bool) -> int:
        """The largest request body a route accepts: one payload with its job's fields, or for a batch route
        max_batch_jobs of them."""
        single = self.settings.max_payload_bytes + REQUEST_OVERHEAD_BYTES
        if not batch:
            return single
        return max(single, min(self.batch_limit(self.settings.max_batch_jobs), self.settings.max_batch_bytes))

    def batch_limit(self, jobs: int) -> int:
        """The largest body of a batch of `jobs` jobs: each a payload at the size limit with its fields."""
        return jobs * (self.settings.max_payload_bytes + JOB_OVERHEAD_BYTES) + REQUEST_OVERHEAD_BYTES


def api_state(request: Request) -> ApiState:
    """The state of the outboxq API serving this request (set by the router's lifespan)."""
    return request.app.state.outboxq


class OutboxqRoute(APIRoute):
    """An APIRoute that refuses oversized, overfull or too deeply nested bodies before parsing them (413, 422)
    and maps every error it raises."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        """The route's handler, wrapped: body limits first, then outboxq's error mapping around it."""
        handle = super().get_route_handler()
        batch = self.path.endswith("/batch")
        scope = (self.openapi_extra or {}).get("x-required-scope")  # (auth.scoped's)
        # The query parameters this route declares (its dependencies' too): any other is a typo to point out,
        # not something to ignore (`?limt=5` would otherwise list 100).
        accepted = _query_parameters(self.dependant)

        async def handler(request: Request) -> Response:
            request = FastJsonRequest(request.scope, request.receive)
            try:
                unknown = sorted(set(request.query_params) - accepted)
                if unknown:
                    raise errors.ApiProblem(
                        422, "invalid_request", f"unknown query parameter {', '.join(map(repr, unknown[:5]))}: "
                        f"this route takes {', '.join(sorted(accepted)) or 'none'}")
                if request.method in BODY_METHODS:
                    principal = None
                    if scope is not None:
                        # The headers say who asks: a request that may not be served is refused before its body
                        # (a batch's may hold max_batch_jobs payloads) is read. (The route checks again, as ever.)
                        principal = await check_headers(request, scope)
                    refused = await _read_body(request, api_state(request), batch)
                    if refused is not None:
                        return refused
                    answered = await self.answer_directly(request, principal)
                    if answered is not None:
                        return answered
                return await handle(request)
            except Exception as exc:  # every error answers in outboxq's shape, whoever's app this is
                return errors.response_for(request, exc)

        return handler

    async def answer_directly(self, request: FastJsonRequest, principal: Principal | None) -> Response | None:
        """The answer to a request whose body is read and passed the limits, made without FastAPI's dependencies and
        validation (`principal`: who the headers say asks, checked for the route's scope; None for a route without
        one); None (here, always) for the route's own handling. A subclass answers its commonest requests so where
        they cost more than the work (BatchRoute)."""
        return None


class FastJsonRequest(Request):
    """A Request whose JSON body is parsed by orjson (outboxq.db.loads_json: what orjson would read otherwise or
    refuses goes to json.loads, so the values and the errors are json.loads' own): orjson parses a large batch's
    body several times faster."""

    async def json(self) -> Any:
        """The body as JSON values."""
        if not hasattr(self, "_json"):
            self._json = loads_json(await self.body())
        return self._json


def _query_parameters(dependant: Any) -> set[str]:
    """The names of the query parameters a route (a FastAPI Dependant) and its dependencies declare."""
    names = {param.alias for param in dependant.query_params}
    for dependency in dependant.dependencies:
        names |= _query_parameters(dependency)
    return names


async def _read_body(request: FastJsonRequest, state: ApiState, batch: bool) -> Response | None:
    """Read the request's body for the route (Request.body() returns `_body` once set), refusing on the way
    what is too large (413: from Content-Length before reading, else as soon as the bytes pass the limit) or,
    on a batch route, holds too many jobs (422: counted while it arrives); then, before anything parses it,
    JSON nested deeper than max_json_depth (422). None when the route may go on."""
    settings = state.settings
    limit = state.body_limit(batch)
    length = request.headers.get("content-length")
    if length is not None and not (length.isdigit() and int(length) <= limit):
        return _too_large(state, limit, batch)
    # A body no larger than one job's is parsed whole at little cost; a batch's larger one is looked at while
    # it arrives, so that 100,000 jobs are refused after their first thousand, not parsed (or even read) whole.
    single = state.body_limit(False)
    counter = (JobCounter(settings.max_batch_jobs, settings.max_json_depth, first_look=single)
               if batch and (length is None or int(length) > single) else None)
    received = bytearray()
    async for chunk in request.stream():
        received += chunk
        if len(received) > limit:
            return _too_large(state, limit, batch)
        if counter is not None:
            counter.feed(received)
    body = bytes(received)
    del received
    # JSON in UTF-16 or UTF-32 (json.loads reads them) is looked at and parsed as UTF-8: their bytes alone do not
    # say where the strings are.
    encoding = json.detect_encoding(body)
    if encoding != "utf-8":
        with contextlib.suppress(UnicodeError):  # (the parser then refuses it: 400)
            body = body.decode(encoding).encode()
    request._body = body
    if counter is not None:
        jobs = counter.finish(body)
        # Each job's payload is checked once parsed; parsing itself is bounded by the jobs the body holds.
        if jobs is not None and len(body) > state.batch_limit(jobs):
            return errors.error_json(
                413, "request_too_large",
                f"the request body is {len(body)} bytes, over the {state.batch_limit(jobs)} bytes a batch of {jobs} "
                f"jobs may hold (max_payload_bytes {settings.max_payload_bytes} and {JOB_OVERHEAD_BYTES} bytes of "
                "fields a job); send smaller payloads")
    if nested_deeper_than(body, settings.max_json_depth):
        raise errors.ApiProblem(
            422, "json_too_deep", f"the request body's JSON nests objects and arrays more than "
            f"{settings.max_json_depth} levels deep (max_json_depth); send a flatter payload")
    if batch:
        # Counted before FastAPI validates each job (a few thousand jobs' errors would be collected, not one).
        try:
            parsed = await request.json()
        except (ValueError, RecursionError):
            parsed = None  # FastAPI parses it again, and answers what is wrong with it
        jobs_given = parsed.get("jobs") if isinstance(parsed, dict) else None
        if isinstance(jobs_given, list) and len(jobs_given) > settings.max_batch_jobs:
            raise InvalidInput(too_many_jobs(settings.max_batch_jobs, len(jobs_given)))
    return None


def _too_large(state: ApiState, limit: int, batch: bool) -> Response:
    settings = state.settings
    if batch:
        message = (f"the request body is over {limit} bytes (max_batch_bytes {settings.max_batch_bytes}, or "
                   f"max_batch_jobs ({settings.max_batch_jobs}) jobs of max_payload_bytes "
                   f"({settings.max_payload_bytes}) and {JOB_OVERHEAD_BYTES} bytes of fields each, and "
                   f"{REQUEST_OVERHEAD_BYTES} for the request); send fewer or smaller jobs per batch")
    else:
        message = (f"the request body is over {limit} bytes: max_payload_bytes ({settings.max_payload_bytes}) "
                   f"and {REQUEST_OVERHEAD_BYTES} for the other fields; send a smaller payload")
    return errors.error_json(413, "request_too_large", message)


def too_many_jobs(most: int, count: int | None = None) -> str:
    """What to say to a batch of `count` jobs (None: more than `most`, not all counted)."""
    given = f"not {count}" if count is not None else "this one has more"
    return f"a batch holds at most {most} jobs (max_batch_jobs), {given}; split it"


# ---------------------------------------------------------------- a look at JSON before it is parsed
# Parsing is what costs: a body of many small jobs becomes Python objects many times its size, and
# JSON nested 1,000 deep made the parser (or the code after it) recurse until it failed. So the raw bytes are
# looked at first, with bulk operations of bytes (no loop per byte): the strings taken out, what is left
# reduced to its brackets, whose nesting and (for a batch) elements are then counted.

_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b"[]{},")
_SQUARE = bytes.maketrans(b"{}", b"[]")  # an object nests as an array does
_COMMA, _CLOSE = ord(","), ord("]")
_BATCH_START = re.compile(rb'\s*\{\s*"jobs"\s*:\s*\[')
_SMALL_BODY = 64 * 1024
# A job nested deeper than this is not counted while the body arrives (the depth check refuses it later).
_ELEMENT_HEIGHT_MAX = 100


def outside_strings(text: bytes) -> bytes:
    """The bytes of JSON text that are outside its strings (a string that `text` ends in is left out)."""
    if b"\\" in text:
        # An escaped backslash, then an escaped quote, neither opens nor closes a string (pairs are taken
        # from the left, as a parser reads them: an odd backslash before a quote is the one escaping it).
        text = text.replace(b"\\\\", b"").replace(b'\\"', b"")
    return b"".join(text.split(b'"')[::2])


def nested_deeper_than(body: bytes, most: int) -> bool:
    """Whether the JSON text nests objects and arrays more than `most` levels deep (or, malformed, opens more
    levels than that before a parser would stop), found without parsing it."""
    if len(body) <= _SMALL_BODY and body.count(b"[") + body.count(b"{") <= most:
        return False  # (a single job's usual body: a larger one is counted as fast by the look itself)
    brackets = outside_strings(body).translate(_SQUARE, _NOT_BRACKETS)
    # Each pass takes out the innermost pairs, whatever their number: as many passes as the deepest nesting.
    levels = 0
    while brackets:
        inner = brackets.replace(b"[]", b"")
        if len(inner) == len(brackets):
            # Unbalanced: malformed, but a parser opens the levels left before it finds out.
            return levels + inner.count(b"[") > most
        brackets, levels = inner, levels + 1
        if levels > most:
            return True
    return False


@lru_cache(maxsize=8)
def _element(height: int) -> re.Pattern[bytes]:
    """A pattern of one element of an array in a skeleton of brackets and commas (a scalar leaves nothing):
    nothing, or an array nesting at most `height` levels (a pattern nested that many times; possessive, so it
    never backtracks)."""
    nested = rb"\[,*+\]"
    for _ in range(height - 1):
        nested = rb"\[(?:,|" + nested + rb")*+\]"
    return re.compile(rb"(?:" + nested + rb")?+")


class JobCounter:
    """Counts the jobs of a batch body (`{"jobs": [...]}`) while it arrives, from the skeleton of its brackets
    and commas: InvalidInput as soon as they are more than `most`. The skeleton is made again at each look, at
    `first_look` bytes and then each time the bytes received have grown fourfold: linear time in all, and a
    body of far too many jobs is refused once a little more than `first_look` bytes have arrived."""

    def __init__(self, most: int, max_depth: int, first_look: int):
        self.most = most
        self.element = _element(max(1, min(max_depth - 2, _ELEMENT_HEIGHT_MAX)))
        self.next_look = first_look
        self.start: int | None = None  # where the jobs array's elements start in the body
        self.at = 0  # where the count is in the skeleton
        self.count = 1  # elements so far: the commas between them, plus one
        self.jobs: int | None = None  # the count, once the array's end is found
        self.done = False  # no more looks: the array's end was found, or this body cannot be counted so

    def feed(self, received: bytearray) -> None:
        """Look at the bytes received so far, when they have grown enough since the last look."""
        if not self.done and len(received) >= self.next_look:
            self.next_look = 4 * len(received)
            self._count(bytes(received), complete=False)

    def finish(self, body: bytes) -> int | None:
        """The body's jobs (an empty array counts as one), or None when it is not a `{"jobs": [...]}` whose
        jobs could be counted so (they are then counted once parsed)."""
        if not self.done:
            self._count(body, complete=True)
        return self.jobs

    def _count(self, body: bytes, complete: bool) -> None:
        if self.start is None:
            start = _BATCH_START.match(body)
            if start is None:
                self.done = complete  # (a few bytes may not show it yet)
                return
            self.start = start.end()
        # The skeleton of a longer prefix begins with that of a shorter one: the count goes on where it was.
        skeleton = outside_strings(body[self.start:]).translate(_SQUARE, _NOT_STRUCTURE)
        while True:
            element = self.element.match(skeleton, self.at)  # (the pattern matches, if only nothing)
            end = element.end() if element else self.at
            if end == len(skeleton):
                break  # more to come
            if skeleton[end] == _COMMA:
                self.count += 1
                self.at = end + 1
                if self.count > self.most:
                    raise InvalidInput(too_many_jobs(self.most))
            elif skeleton[end] == _CLOSE:
                self.jobs, self.done = self.count, True
                return
            else:
                break  # an element cut off where the bytes end, or nested too deep (refused after)
        self.done = complete
