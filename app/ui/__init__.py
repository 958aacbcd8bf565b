"""The web dashboard at /ui: static pages that call the same HTTP API with the same tokens."""

from __future__ import annotations

from pathlib import Path

STATIC_DIR = Path(__file__).parent / "static"


def mount_ui(app) -> None:
    """Serve the dashboard's files at /ui (index.html at /ui/)."""
    from fastapi.responses import RedirectResponse
    from fastapi.staticfiles import StaticFiles

    @app.get("/ui", include_in_schema=False)
    def ui_root() -> RedirectResponse:
        """Redirect to the dashboard's index page."""
        return RedirectResponse("/ui/")

    app.mount("/ui/", StaticFiles(directory=STATIC_DIR, html=True), name="ui")
