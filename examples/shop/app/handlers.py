"""The shop's job handlers (`outboxq worker --handlers app.handlers`, from examples/shop).

Each writes its effect with ctx.transaction(): the effect and the job's completion commit together, so it
happens exactly once, whatever fails.
"""

from __future__ import annotations

from outboxq import JobContext, consumer


def record_effect(payload: dict, ctx: JobContext) -> None:
    """Write the job's effect row and complete the job in one transaction."""
    tag = payload.get("tag") or f"order-confirmation:{payload['order_id']}"
    with ctx.transaction() as conn:
        conn.execute("INSERT INTO shop_effects (tag, job_id, queue, attempt) VALUES (%s, %s, %s, %s)",
                     (tag, ctx.job_id, ctx.queue, ctx.attempt))


@consumer("order-confirmation", backoff_base=0.2, backoff_max=2.0)
def send_order_confirmation(payload: dict, ctx: JobContext) -> None:
    """Pretend to e-mail a confirmation for an order."""
    record_effect(payload, ctx)


@consumer("flaky-downstream", backoff_base=0.2, backoff_max=2.0, max_attempts=5)
def call_flaky_downstream(payload: dict, ctx: JobContext) -> None:
    """Fails on its first attempt (the downstream is 'down'), succeeds on the retry."""
    if ctx.attempt == 1:
        raise ConnectionError("downstream unavailable (the demo's deliberate first failure)")
    record_effect(payload, ctx)


@consumer("invoices", backoff_base=0.2, backoff_max=2.0)
def build_invoice(payload: dict, ctx: JobContext) -> None:
    """Runs only after its order's confirmation is done (depends_on)."""
    record_effect(payload, ctx)
