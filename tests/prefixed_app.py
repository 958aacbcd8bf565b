"""A user's own FastAPI app with outboxq's router (API and dashboard) included under /outboxq, as the README
shows: `uvicorn tests.prefixed_app:app`. Settings come from the environment."""

from __future__ import annotations

from fastapi import FastAPI

from outboxq.api import create_router

app = FastAPI(title="a shop")
app.include_router(create_router(), prefix="/outboxq")


@app.get("/")
def home() -> dict[str, str]:
    """The user's own route, beside outboxq's."""
    return {"shop": "open"}
