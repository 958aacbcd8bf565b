"""The JSON response of the routes that answer many jobs at once, rendered with orjson; the security headers
of the documentation pages (/docs, /redoc)."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from typing import Any

import orjson
from fastapi.responses import JSONResponse
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class RenderedJSON(bytes):
    """A response's content rendered as UTF-8 JSON already (a batch's answer made from its payloads' texts):
    OrjsonResponse sends it as it is."""


def render_json(content: Any) -> bytes:
    """JSON values (times as text, as job_public makes them; no NaN, which payloads refuse) as UTF-8 JSON, by
    orjson; what orjson refuses, an integer beyond 64 bits that a JSON payload may hold, the standard way
    instead: the same values either way."""
    try:
        return orjson.dumps(content)
    except orjson.JSONEncodeError:
        return json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


class OrjsonResponse(JSONResponse):
    """A JSONResponse rendered by orjson (render_json): a 1,000-job batch's answer in a fifth of json.dumps'
    time; a RenderedJSON content is sent as it is."""

    def render(self, content: Any) -> bytes:
        """The content as UTF-8 JSON."""
        return content if isinstance(content, RenderedJSON) else render_json(content)


# ---------------------------------------------------------------- the documentation pages' security headers

# The pages FastAPIOffline serves (create_app): Swagger UI and ReDoc, their static files, and the document.
DOCS_PAGES = ("/docs", "/docs/oauth2-redirect", "/redoc")
DOCS_FILES = ("/openapi.json", "/static-offline-docs/")
# Swagger UI and ReDoc come from the app itself (FastAPIOffline) and start from a short inline script: that
# script is allowed by its hash, not every inline script. Both set inline styles as they render (and ReDoc
# runs its search in a worker made from a blob), so styles are allowed inline; images may be data: URLs.
DOCS_PAGE_POLICY = ("default-src 'self'; script-src 'self'{hashes}; style-src 'self' 'unsafe-inline'; "
                    "img-src 'self' data:; font-src 'self' data:; connect-src 'self'; worker-src 'self' blob:; "
                    "object-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'")
# The document and the static files are no page: nothing runs in them, nothing frames them.
DOCS_FILE_POLICY = "default-src 'none'; frame-ancestors 'none'"
_INLINE_SCRIPT = re.compile(rb"<script(?![^>]*\bsrc=)[^>]*>(.*?)</script>", re.DOTALL | re.IGNORECASE)


class DocsSecurityHeaders:
    """ASGI middleware: the dashboard's security headers (outboxq.ui.SECURITY_HEADERS) on /docs, /redoc and
    what they load, with a Content-Security-Policy that lets Swagger UI and ReDoc run: a page's own inline
    scripts by their SHA-256 (read from the page as it is sent: it names the document's URL, which depends on
    the root path), styles inline. A plain ASGI wrapper, as the dashboard's, that passes every other request
    on untouched."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on; add the headers to the response of a documentation path."""
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if path in DOCS_PAGES:
            await self.app(scope, receive, _PageWithHeaders(send))
        elif path.startswith(DOCS_FILES):
            async def send_with_headers(message: Message) -> None:
                if message["type"] == "http.response.start":
                    MutableHeaders(scope=message).update(_docs_headers(DOCS_FILE_POLICY))
                await send(message)

            await self.app(scope, receive, send_with_headers)
        else:
            await self.app(scope, receive, send)


class _PageWithHeaders:
    """A `send` that holds a documentation page's response until its body is complete (a few kB), then sends
    it with the headers and the hashes of its inline scripts."""

    def __init__(self, send: Send) -> None:
        self.send = send
        self.start: Message | None = None
        self.body = bytearray()

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.start = message
            return
        start = self.start
        if message["type"] != "http.response.body" or start is None:
            await self.send(message)
            return
        self.body += message.get("body", b"")
        if message.get("more_body", False):
            return
        hashes = "".join(f" 'sha256-{base64.b64encode(hashlib.sha256(script).digest()).decode()}'"
                         for script in _INLINE_SCRIPT.findall(self.body))
        MutableHeaders(scope=start).update(_docs_headers(DOCS_PAGE_POLICY.format(hashes=hashes)))
        await self.send(start)
        await self.send({"type": "http.response.body", "body": bytes(self.body), "more_body": False})


def _docs_headers(policy: str) -> dict[str, str]:
    from outboxq.ui import SECURITY_HEADERS

    return {**SECURITY_HEADERS, "Content-Security-Policy": policy}


def install_docs_headers(app: Any) -> None:
    """Send the security headers on the documentation pages of `app` (create_app's, by FastAPIOffline)."""
    app.add_middleware(DocsSecurityHeaders)
