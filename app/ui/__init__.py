"""The web dashboard at /ui (under the router's prefix): static pages that call the same HTTP API with the same
tokens."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, RedirectResponse, Response

STATIC_DIR = Path(__file__).resolve().parent / "static"  # (through a development install's link too)


# The dashboard is same-origin static files: no inline script, no third party, never framed.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}


# The files the dashboard is made of, and their types (nothing else under /ui is served).
FILES = {"index.html": "text/html; charset=utf-8", "app.js": "text/javascript; charset=utf-8",
         "style.css": "text/css; charset=utf-8"}


def ui_router() -> APIRouter:
    """The dashboard as routes of outboxq's router: /ui/ and its files, with SECURITY_HEADERS, under whatever
    prefix the router is included at (the page finds the API beside itself)."""
    router = APIRouter(include_in_schema=False)

    @router.get("/ui")
    def ui_root(request: Request) -> Response:
        """Redirect to the dashboard's index page (relative: the prefix stays)."""
        return RedirectResponse(request.url.path + "/", status_code=307, headers=SECURITY_HEADERS)

    @router.get("/ui/")
    def ui_index() -> Response:
        """The dashboard's page."""
        return _file("index.html")

    @router.get("/ui/{name}")
    def ui_file(name: str) -> Response:
        """One of the dashboard's files; 404 for any other name."""
        return _file(name)

    return router


def _file(name: str) -> Response:
    if name not in FILES:
        return Response("not found", status_code=404, media_type="text/plain", headers=SECURITY_HEADERS)
    # no-cache: a browser checks for a newer dashboard (ETag) after an upgrade instead of running a stale one
    return FileResponse(STATIC_DIR / name, media_type=FILES[name],
                        headers={**SECURITY_HEADERS, "Cache-Control": "no-cache"})
