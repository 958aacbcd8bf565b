"""The web dashboard at /ui: static pages that call the same HTTP API with the same tokens."""

from __future__ import annotations

from pathlib import Path

STATIC_DIR = Path(__file__).parent / "static"


# The dashboard is same-origin static files: no inline script, no third party, never framed.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}


def mount_ui(app) -> None:
    """Serve the dashboard's files at /ui (index.html at /ui/), with its security headers."""
    from fastapi.responses import RedirectResponse
    from fastapi.staticfiles import StaticFiles

    @app.middleware("http")
    async def ui_security_headers(request, call_next):
        response = await call_next(request)
        if request.url.path == "/ui" or request.url.path.startswith("/ui/"):
            response.headers.update(SECURITY_HEADERS)
        return response

    @app.get("/ui", include_in_schema=False)
    def ui_root() -> RedirectResponse:
        """Redirect to the dashboard's index page."""
        return RedirectResponse("/ui/")

    app.mount("/ui/", StaticFiles(directory=STATIC_DIR, html=True), name="ui")
