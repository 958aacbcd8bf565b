"""The web dashboard at /ui: static pages that call the same HTTP API with the same tokens."""

from __future__ import annotations

from pathlib import Path

from starlette.datastructures import URL, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

STATIC_DIR = Path(__file__).resolve().parent / "static"  # (through a development install's link too)


# The dashboard is same-origin static files: no inline script, no third party, never framed.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}


class SecurityHeaders:
    """ASGI middleware: SECURITY_HEADERS on every response under /ui. A plain ASGI wrapper, not
    @app.middleware("http"), whose BaseHTTPMiddleware runs every API request through a task of its own and
    streams each response body again (about a millisecond of a 1,000-job batch's answer)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on; add the headers to the response when its path is the dashboard's."""
        path = URL(scope=scope).path if scope["type"] == "http" else ""
        if not (path == "/ui" or path.startswith("/ui/")):
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message).update(SECURITY_HEADERS)
            await send(message)

        await self.app(scope, receive, send_with_headers)


def mount_ui(app) -> None:
    """Serve the dashboard's files at /ui (index.html at /ui/), with its security headers."""
    from fastapi.responses import RedirectResponse
    from fastapi.staticfiles import StaticFiles

    app.add_middleware(SecurityHeaders)

    @app.get("/ui", include_in_schema=False)
    def ui_root() -> RedirectResponse:
        """Redirect to the dashboard's index page."""
        return RedirectResponse("/ui/")

    app.mount("/ui/", StaticFiles(directory=STATIC_DIR, html=True), name="ui")
