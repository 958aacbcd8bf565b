"""Workflows: DAGs of steps, each step a job, written whole in the caller's transaction; a step's handler gets
the results of the steps it comes after (ctx.parent_results).

    wf = Workflow("order-42")
    fetch = wf.step("fetch", queue="fetch", payload={"order": 42})
    left = wf.step("left", queue="left", after=[fetch])
    right = wf.step("right", queue="right", after=[fetch])
    wf.step("join", queue="join", after=[left, (right, "run")])   # "run": join runs even if right fails
    workflow_id = wf.enqueue(conn)                                   # nothing committed here

A step that ends dead cancels the steps after it (transitively, through its "cancel" edges, the default), and
the workflow is `failed`; an edge with "run" lets its step run once the step before it finished, however.
The steps are ordinary jobs (workflow_id and step set), claimed, retried, rescued and fenced as any job is;
the hand-off is the dependency release that completing a job already does.
"""

from __future__ import annotations

import graphlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from outboxq.errors import InvalidInput, InvalidTransition, InvalidWorkflow, WorkflowNotFound
from outboxq.queue import context as job_context
from outboxq.queue import sql
from outboxq.queue.admin import statement_rows
from outboxq.queue.enqueue import (
    PRIORITY_RANGE,
    Plan,
    Statement,
    _encode_payload,
    _limit_key_of,
    _run_plan,
    _run_plan_async,
    validate_queue_name,
)
from outboxq.registry import Registry, default_registry

EDGE_POLICIES = ("cancel", "run")
MAX_STEPS = 10_000  # one statement writes them all; a larger DAG is better written as several workflows
MAX_NAME_LENGTH = 255
WORKFLOW_STATUSES = ("running", "done", "failed", "cancelled")


def _validate_name(what: str, name: Any) -> str:
    if not isinstance(name, str) or not name or len(name) > MAX_NAME_LENGTH or "\x00" in name:
        raise InvalidInput(f"invalid {what} name {name!r}: use a non-empty string of at most {MAX_NAME_LENGTH} "
                           "characters without NUL")
    return name


@dataclass(frozen=True)
class Step:
    """A step as Workflow.step() returns it: pass it in a later step's `after`."""

    name: str
    queue: str
    payload: Any = None
    after: tuple[tuple[str, str], ...] = ()  # (step name, edge policy)
    priority: int = 0
    max_attempts: int | None = None


class Workflow:
    """A DAG of steps, written whole by enqueue() / enqueue_async() in the caller's transaction."""

    def __init__(self, name: str, *, registry: Registry | None = None):
        self.name = _validate_name("workflow", name)
        self.registry = registry or default_registry
        self.steps: dict[str, Step] = {}

    def step(self, name: str, *, queue: str, payload: Any = None, after: Iterable[Any] = (), priority: int = 0,
             max_attempts: int | None = None) -> Step:
        """Add a step. `after` lists the steps it waits for: a Step, a step's name, or (step, "run") for an edge
        whose failure does not cancel this step (a clean-up step). Refused at once: a repeated name, a bad
        queue, priority or max_attempts; an unknown name or a cycle is refused by enqueue()."""
        _validate_name("step", name)
        if name in self.steps:
            raise InvalidWorkflow(f"workflow {self.name!r} has two steps named {name!r}: step names are unique")
        validate_queue_name(queue)
        if isinstance(priority, bool) or not isinstance(priority, int) \
                or not PRIORITY_RANGE[0] <= priority <= PRIORITY_RANGE[1]:
            raise InvalidInput(f"step {name!r}: priority must be an integer from {PRIORITY_RANGE[0]} to "
                               f"{PRIORITY_RANGE[1]}")
        if max_attempts is not None and (isinstance(max_attempts, bool) or not isinstance(max_attempts, int)
                                         or max_attempts < 0):
            raise InvalidInput(f"step {name!r}: max_attempts must be an integer >= 0 (0: unlimited)")
        step = Step(name=name, queue=queue, payload=payload, after=_edges(name, after), priority=priority,
                    max_attempts=max_attempts)
        self.steps[name] = step
        return step

    def enqueue(self, conn: Any) -> int:
        """Write the workflow and every step in `conn`'s transaction (psycopg or SQLAlchemy, as enqueue takes);
        returns its id. Nothing is committed here: roll back and none of it exists."""
        return _run_plan(conn, self._plan())

    async def enqueue_async(self, conn: Any) -> int:
        """enqueue() for async code (psycopg AsyncConnection, SQLAlchemy AsyncSession / AsyncConnection)."""
        return await _run_plan_async(conn, self._plan())

    def _plan(self) -> Plan:
        order = self._checked_order()
        columns: dict[str, list[Any]] = {c: [] for c in ("queues", "steps", "statuses", "payloads", "payloads_bytes",
                                                         "priorities", "max_attempts", "limit_keys")}
        edges: dict[str, list[str]] = {"edge_steps": [], "edge_after": [], "edge_policies": []}
        for name in order:
            step = self.steps[name]
            hooks = self.registry.payload_hooks(step.queue)
            text, binary = _encode_payload(step.queue, step.payload, hooks)
            for column, value in (("queues", step.queue), ("steps", name),
                                  ("statuses", "waiting" if step.after else "queued"), ("payloads", text),
                                  ("payloads_bytes", binary), ("priorities", step.priority),
                                  ("max_attempts", step.max_attempts),
                                  ("limit_keys", _limit_key_of(step.payload, None, hooks))):
                columns[column].append(value)
            for before, policy in step.after:
                edges["edge_steps"].append(name)
                edges["edge_after"].append(before)
                edges["edge_policies"].append(policy)
        row = yield Statement(sql.workflow_insert, {"name": self.name, "context": job_context.capture(),
                                                    **columns, **edges}, rows="one")
        return row["id"]

    def _checked_order(self) -> list[str]:
        """The steps' names in an order where each comes after those it waits for; InvalidInput for an empty
        workflow, too many steps, an unknown name or a cycle."""
        if not self.steps:
            raise InvalidInput(f"workflow {self.name!r} has no steps")
        if len(self.steps) > MAX_STEPS:
            raise InvalidInput(f"workflow {self.name!r} has {len(self.steps)} steps; at most {MAX_STEPS}")
        for step in self.steps.values():
            unknown = [before for before, _ in step.after if before not in self.steps]
            if unknown:
                raise InvalidWorkflow(f"step {step.name!r} comes after {unknown[0]!r}, which is not a step of "
                                   f"workflow {self.name!r}")
        sorter = graphlib.TopologicalSorter({s.name: [b for b, _ in s.after] for s in self.steps.values()})
        try:
            return list(sorter.static_order())
        except graphlib.CycleError as cycle:
            path = " -> ".join(cycle.args[1])
            raise InvalidWorkflow(f"workflow {self.name!r} has a cycle: {path}") from None


def _edges(name: str, after: Iterable[Any]) -> tuple[tuple[str, str], ...]:
    """`after` as (step name, policy) pairs, each step once."""
    if isinstance(after, str | Step):
        after = [after]
    edges: dict[str, str] = {}
    for entry in after:
        target, policy = entry if isinstance(entry, tuple) and len(entry) == 2 else (entry, "cancel")
        before = target.name if isinstance(target, Step) else target
        if not isinstance(before, str):
            raise InvalidInput(f"step {name!r}: each `after` entry is a step, a step's name or (step, policy), "
                               f"not {entry!r}")
        if policy not in EDGE_POLICIES:
            raise InvalidInput(f"step {name!r}: the policy after {before!r} must be one of "
                               f"{', '.join(EDGE_POLICIES)}, not {policy!r}")
        if before == name:
            raise InvalidWorkflow(f"step {name!r} cannot come after itself")
        edges[before] = policy
    return tuple(edges.items())


@dataclass(frozen=True)
class StepInfo:
    """A step of a stored workflow: its job and where it stands."""

    name: str
    job_id: int
    queue: str
    status: str
    attempts: int
    max_attempts: int | None
    result: Any
    last_error: str | None
    waiting_reason: str | None
    worker_id: str | None
    created_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    after: list[dict[str, Any]] = field(default_factory=list)  # {"step", "job_id", "on_failure"}

    def to_dict(self) -> dict[str, Any]:
        """The step as JSON-able values."""
        out = dict(self.__dict__)
        for name in ("created_at", "started_at", "finished_at"):
            out[name] = out[name].isoformat() if out[name] is not None else None
        return out


@dataclass(frozen=True)
class WorkflowInfo:
    """A stored workflow: its status (running, done, failed, cancelled) read from its steps'."""

    id: int
    name: str
    status: str
    created_at: datetime
    cancelled_at: datetime | None
    steps: list[StepInfo]

    def to_dict(self) -> dict[str, Any]:
        """The workflow as JSON-able values."""
        return {"id": self.id, "name": self.name, "status": self.status, "created_at": self.created_at.isoformat(),
                "cancelled_at": self.cancelled_at.isoformat() if self.cancelled_at else None,
                "steps": [s.to_dict() for s in self.steps]}


def workflow_status(*, cancelled: bool, unfinished: int, dead: int, cancelled_steps: int) -> str:
    """cancelled (by an operator), failed (a step is dead), running (a step is unfinished), else done, or
    cancelled when a step was cancelled by hand and nothing failed."""
    if cancelled:
        return "cancelled"
    if dead:
        return "failed"
    if unfinished:
        return "running"
    return "cancelled" if cancelled_steps else "done"


def _get_plan(workflow_id: int) -> Plan:
    head = yield Statement(sql.workflow_get, {"id": workflow_id}, rows="one")
    if head is None:
        return None
    rows = yield Statement(sql.workflow_steps, {"id": workflow_id})
    steps = [StepInfo(name=r["step"], job_id=r["id"], queue=r["queue"], status=r["status"],
                      attempts=r["attempts"], max_attempts=r["max_attempts"], result=r["result"],
                      last_error=r["last_error"], waiting_reason=r["waiting_reason"], worker_id=r["worker_id"],
                      created_at=r["created_at"], started_at=r["started_at"], finished_at=r["finished_at"],
                      after=r["after"]) for r in rows]
    statuses = [s.status for s in steps]
    status = workflow_status(
        cancelled=head["cancelled_at"] is not None,
        unfinished=sum(s in ("waiting", "queued", "running", "retrying") for s in statuses),
        dead=statuses.count("dead"), cancelled_steps=statuses.count("cancelled"))
    return WorkflowInfo(id=head["id"], name=head["name"], status=status, created_at=head["created_at"],
                        cancelled_at=head["cancelled_at"], steps=steps)


def get_workflow(conn: Any, workflow_id: int) -> WorkflowInfo | None:
    """The workflow with every step's status, attempts and result; None when no workflow has that id."""
    return _run_plan(conn, _get_plan(workflow_id))


async def get_workflow_async(conn: Any, workflow_id: int) -> WorkflowInfo | None:
    """get_workflow() for async code."""
    return await _run_plan_async(conn, _get_plan(workflow_id))


def list_workflows(conn: Any, *, limit: int = 50, before: int | None = None) -> list[dict[str, Any]]:
    """The newest workflows (ids below `before`, for the next page): id, name, status, steps and their counts."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1000:
        raise InvalidInput("limit must be an integer from 1 to 1000")
    rows = statement_rows(conn, sql.workflow_list, {"limit": limit, "before": before})
    return [{"id": r["id"], "name": r["name"],
             "status": workflow_status(cancelled=r["cancelled_at"] is not None, unfinished=r["unfinished"],
                                       dead=r["dead"], cancelled_steps=r["cancelled"]),
             "steps": r["steps"], "done": r["done"], "dead": r["dead"], "cancelled": r["cancelled"],
             "unfinished": r["unfinished"], "created_at": r["created_at"].isoformat()} for r in rows]


def cancel_workflow(conn: Any, workflow_id: int) -> int:
    """Cancel every unfinished step (a running one is asked to stop, as a cancelled job is: fenced once its
    worker's heartbeat, woken by the cancel's notification, revokes its lease); the workflow is `cancelled`.
    Returns how many steps; WorkflowNotFound for an unknown id. Not committed here."""
    def plan() -> Plan:
        if (yield Statement(sql.workflow_mark_cancelled, {"id": workflow_id}, rows="one")) is None:
            raise WorkflowNotFound(workflow_id)
        row = yield Statement(sql.workflow_cancel_steps, {"id": workflow_id}, rows="one")
        return int(row["cancelled"])
    return _run_plan(conn, plan())


def retry_workflow(conn: Any, workflow_id: int) -> dict[str, int]:
    """Run the dead steps again and put back the steps cancelled because of them: {"retried", "waiting"}.
    InvalidTransition for a workflow an operator cancelled (enqueue it anew). Not committed here."""
    def plan() -> Plan:
        head = yield Statement(sql.workflow_get, {"id": workflow_id}, rows="one")
        if head is None:
            raise WorkflowNotFound(workflow_id)
        if head["cancelled_at"] is not None:
            raise InvalidTransition(f"workflow {workflow_id} was cancelled; enqueue it anew to run it again")
        row = yield Statement(sql.workflow_retry_steps, {"id": workflow_id}, rows="one")
        return {"retried": int(row["retried"]), "waiting": int(row["waiting"])}
    return _run_plan(conn, plan())
