"""The outbox example: an order row and its confirmation job, written in one transaction."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from outboxq.api.auth import EnqueuePrincipal, scoped
from outboxq.api.deps import IdempotencyKey, PoolDep, idempotent_write
from outboxq.api.errors import error_responses
from outboxq.api.schemas import OrderCreate, OrderCreated
from outboxq.queue.enqueue import enqueue

router = APIRouter(tags=["orders"])

CONFIRMATION_QUEUE = "order-confirmation"
# The business statement of the example (not a job statement, so it does not belong in app/queue/sql.py).
order_insert = "INSERT INTO orders (customer, amount) VALUES (%(customer)s, %(amount)s) RETURNING id"


def confirmation_key(order_id: int) -> str:
    """The key of an order's confirmation job: one confirmation per order."""
    return f"order-{order_id}"


@router.post("/v1/orders", status_code=201, response_model=OrderCreated, **scoped("enqueue"),
             responses={200: {"model": OrderCreated, "description": "A retry with the same Idempotency-Key"},
                        **error_responses(400, 401, 403, 409, 422)})
def create_order(body: OrderCreate, request: Request, principal: EnqueuePrincipal, pool: PoolDep,
                 idempotency_key: IdempotencyKey = None) -> JSONResponse:
    """Write an order and enqueue its order-confirmation job in one transaction; bad input writes neither."""

    def work(conn: Any) -> dict[str, Any]:
        row = conn.execute(order_insert, {"customer": body.customer, "amount": body.amount}).fetchone()
        order_id = row["id"]
        job = enqueue(conn, CONFIRMATION_QUEUE,
                      {"order_id": order_id, "customer": body.customer, "amount": str(body.amount)},
                      key=confirmation_key(order_id))
        return {"order_id": order_id, "job_id": job.id}

    return idempotent_write(request, pool, principal.id, idempotency_key,
                            lambda: body.model_dump(mode="json"), work)
