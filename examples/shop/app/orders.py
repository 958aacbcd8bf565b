"""Placing an order: the order row and its jobs in one transaction (sync and async, same rules)."""

from __future__ import annotations

from decimal import Decimal

from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from app.models import Order
from outboxq import Job, enqueue, enqueue_async

CONFIRMATION_QUEUE = "order-confirmation"


def confirmation_key(order_id: int) -> str:
    """The key of an order's confirmation job: one confirmation per order."""
    return f"order-{order_id}"


def place_order(session: Session, customer: str, amount: Decimal) -> tuple[Order, Job]:
    """Write the order and enqueue its confirmation in the session's transaction (the caller commits)."""
    order = Order(customer=customer, amount=amount)
    session.add(order)
    session.flush()  # the order's id, for the job's key
    job = enqueue(session, CONFIRMATION_QUEUE, {"order_id": order.id, "customer": customer, "amount": str(amount)},
                  key=confirmation_key(order.id))
    return order, job


async def place_order_async(session: AsyncSession, customer: str, amount: Decimal) -> tuple[Order, Job]:
    """place_order() for async routes."""
    order = Order(customer=customer, amount=amount)
    session.add(order)
    await session.flush()
    job = await enqueue_async(session, CONFIRMATION_QUEUE,
                              {"order_id": order.id, "customer": customer, "amount": str(amount)},
                              key=confirmation_key(order.id))
    return order, job
