"""The shop's HTTP API: orders written with their jobs in one request transaction; outboxq under /outboxq.

    uvicorn app.main:app          (from examples/shop, with DATABASE_URL and OUTBOXQ_API_TOKENS set)
"""

from __future__ import annotations

from decimal import Decimal

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from app.db import async_engine, engine
from app.orders import place_order, place_order_async
from outboxq import DuplicateJob
from outboxq.api import create_router

app = FastAPI(title="shop (an outboxq example)")
app.include_router(create_router(), prefix="/outboxq")


class OrderIn(BaseModel):
    """An order to place. `fail_after_enqueue` makes the route fail after the enqueue (a demo of rollback)."""

    model_config = ConfigDict(extra="forbid")

    customer: str = Field(min_length=1, max_length=200, pattern=r"^[^\x00]*$")
    amount: Decimal = Field(ge=0, max_digits=12, decimal_places=2)
    fail_after_enqueue: bool = False


class OrderOut(BaseModel):
    """The order and its confirmation job, committed together."""

    order_id: int
    job_id: int


def _refuse_after_enqueue() -> None:
    raise HTTPException(409, "the order was refused after its job was enqueued: neither was kept")


@app.post("/orders", status_code=201, response_model=OrderOut)
def create_order(body: OrderIn) -> OrderOut:
    """Sync route: a SQLAlchemy Session, outboxq.enqueue, one commit for the order and its job."""
    with Session(engine()) as session, session.begin():
        try:
            order, job = place_order(session, body.customer, body.amount)
        except DuplicateJob as exc:
            raise HTTPException(409, str(exc)) from exc
        if body.fail_after_enqueue:
            _refuse_after_enqueue()  # raising inside session.begin(): order and job roll back together
        placed = OrderOut(order_id=order.id, job_id=job.id)
    return placed  # committed: the order and its job exist together


@app.post("/orders/async", status_code=201, response_model=OrderOut)
async def create_order_async(body: OrderIn) -> OrderOut:
    """Async route: a SQLAlchemy AsyncSession, outboxq.enqueue_async, one commit for both."""
    async with AsyncSession(async_engine()) as session, session.begin():
        try:
            order, job = await place_order_async(session, body.customer, body.amount)
        except DuplicateJob as exc:
            raise HTTPException(409, str(exc)) from exc
        if body.fail_after_enqueue:
            _refuse_after_enqueue()
        placed = OrderOut(order_id=order.id, job_id=job.id)
    return placed
