"""Workflows: write one whole (enqueue scope), read and list them (read), cancel and retry them (admin)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import JSONResponse

from outboxq.api.auth import EnqueuePrincipal, scoped
from outboxq.api.deps import IdempotencyKey, PoolDep, SettingsDep, idempotent_write, transaction
from outboxq.api.errors import error_responses
from outboxq.api.routes.jobs import check_payload_size
from outboxq.api.routing import OutboxqRoute
from outboxq.api.schemas import (
    WorkflowCancelled,
    WorkflowCreate,
    WorkflowCreated,
    WorkflowEdge,
    WorkflowPage,
    WorkflowPublic,
    WorkflowRetried,
)
from outboxq.errors import WorkflowNotFound
from outboxq.queue.workflows import (
    Workflow,
    cancel_workflow,
    get_workflow,
    list_workflows,
    retry_workflow,
)

router = APIRouter(tags=["workflows"], route_class=OutboxqRoute)

WorkflowId = Annotated[int, Path(ge=1, le=2**63 - 1, description="The workflow's id")]


@router.post("/v1/workflows", status_code=201, response_model=WorkflowCreated, **scoped("enqueue"),
             responses={200: {"model": WorkflowCreated, "description": "A retry with the same Idempotency-Key"},
                        **error_responses(400, 401, 403, 409, 413, 422)})
def create_workflow(body: WorkflowCreate, request: Request, principal: EnqueuePrincipal, pool: PoolDep,
                    settings: SettingsDep, idempotency_key: IdempotencyKey = None) -> JSONResponse:
    """Write a workflow and every step in one transaction (201 with its id); a cycle, an unknown step or a
    repeated step name is a 422 and writes nothing."""
    workflow = Workflow(body.name)
    for index, step in enumerate(body.steps):
        check_payload_size(step.payload, settings.max_payload_bytes, f"steps[{index}].payload")
        after = [(edge.step, edge.on_failure) if isinstance(edge, WorkflowEdge) else edge for edge in step.after]
        workflow.step(step.name, queue=step.queue, payload=step.payload, after=after, priority=step.priority,
                      max_attempts=step.max_attempts)

    def work(conn: Any) -> dict[str, Any]:
        return {"id": workflow.enqueue(conn)}

    return idempotent_write(request, pool, principal.id, idempotency_key,
                            lambda: body.model_dump(mode="json"), work)


@router.get("/v1/workflows", response_model=WorkflowPage, **scoped("read"),
            responses=error_responses(401, 403, 422))
def read_workflows(pool: PoolDep, limit: Annotated[int, Query(ge=1, le=1000)] = 50,
                   before: Annotated[int | None, Query(ge=1, le=2**63 - 1,
                                                       description="next_before of the previous page")] = None
                   ) -> JSONResponse:
    """The newest workflows, each with its status and its steps counted by status."""
    with transaction(pool) as conn:
        items = list_workflows(conn, limit=limit, before=before)
    return JSONResponse({"items": items, "next_before": items[-1]["id"] if len(items) == limit else None})


@router.get("/v1/workflows/{workflow_id}", response_model=WorkflowPublic, **scoped("read"),
            responses=error_responses(401, 403, 404, 422))
def read_workflow(workflow_id: WorkflowId, pool: PoolDep) -> JSONResponse:
    """The workflow's status and every step: status, attempts, result, error, the steps it comes after."""
    with transaction(pool) as conn:
        info = get_workflow(conn, workflow_id)
    if info is None:
        raise WorkflowNotFound(workflow_id)
    return JSONResponse(info.to_dict())


@router.post("/v1/workflows/{workflow_id}/cancel", response_model=WorkflowCancelled, **scoped("admin"),
             responses=error_responses(401, 403, 404, 422))
def cancel(workflow_id: WorkflowId, pool: PoolDep) -> JSONResponse:
    """Cancel every unfinished step (running ones are asked to stop, and fenced)."""
    with transaction(pool) as conn:
        cancelled = cancel_workflow(conn, workflow_id)
    return JSONResponse({"cancelled": cancelled})


@router.post("/v1/workflows/{workflow_id}/retry", response_model=WorkflowRetried, **scoped("admin"),
             responses=error_responses(401, 403, 404, 409, 422))
def retry(workflow_id: WorkflowId, pool: PoolDep) -> JSONResponse:
    """Run the dead steps again and put back the steps cancelled because of them (409 once cancelled)."""
    with transaction(pool) as conn:
        return JSONResponse(retry_workflow(conn, workflow_id))
