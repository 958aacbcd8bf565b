"""Every statement outboxq runs, named entity-first, one module per table or concern (River's way). Nothing
else in outboxq's product code writes SQL.

- jobs: outboxq_jobs and its dependency and history tables (enqueue, claim, complete, fail, operators' actions);
- queues, maintenance (rescue, promote, prune), stats (stats routes and /metrics), idempotency, secrets,
  schema_version, leader (maintenance leadership), workflows, workers (the live workers' registry), search:
  re-exported here, so `sql.job_claim_batch` names them all;
- limits (flow control), schedules (periodic jobs), spark (Spark consumers), roles (`create-role`'s roles: their
  creation and grants, and what they may do through PUBLIC) and schema_ddl (the DDL that migrations share):
  imported as modules.

Statements that depend on time take a `now` parameter where tests need to move the clock.
"""

from __future__ import annotations

import re
from functools import lru_cache

from outboxq.queue.names import TABLES, VERSION_TABLE
from outboxq.queue.sql.idempotency import *  # noqa: F403
from outboxq.queue.sql.jobs import *  # noqa: F403
from outboxq.queue.sql.leader import *  # noqa: F403
from outboxq.queue.sql.maintenance import *  # noqa: F403
from outboxq.queue.sql.queues import *  # noqa: F403
from outboxq.queue.sql.schema_version import *  # noqa: F403
from outboxq.queue.sql.search import *  # noqa: F403
from outboxq.queue.sql.secrets import *  # noqa: F403
from outboxq.queue.sql.stats import *  # noqa: F403
from outboxq.queue.sql.workers import *  # noqa: F403
from outboxq.queue.sql.workflows import *  # noqa: F403

# outboxq's table names, longest first so that outboxq_jobs never matches inside outboxq_jobs_x; not after a
# quote: 'outboxq_jobs' is also the notification channel's name (schema.NOTIFY_CHANNEL), a string to keep.
_TABLE_NAME = re.compile(
    r"(?<![\w.\"'])(" + "|".join(sorted([*TABLES, VERSION_TABLE], key=len, reverse=True)) + r")\b"
)


@lru_cache(maxsize=256)
def qualified(statement: str, schema: str) -> str:
    """`statement` with each outboxq table named in `schema` (for statements run on the caller's connection,
    whose search_path is the caller's, not outboxq's)."""
    return _TABLE_NAME.sub(lambda m: f'"{schema}".{m.group(1)}', statement)
