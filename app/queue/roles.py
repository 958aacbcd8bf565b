"""Least privilege: one database role per component (`outboxq create-role NAME --for api|worker|spark`).

Every role reads and writes rows and never changes the schema (`outboxq migrate` runs as the schema's owner),
has a `statement_timeout` (a runaway statement cannot hold a connection, or a lock, for long) and a
connection limit. What each may do beyond that:

- api: SELECT, INSERT, UPDATE on outboxq's tables, DELETE only on the queue limits (an operator's reset);
  it cannot delete a job (a refused enqueue_many rolls back to a savepoint instead).
- worker: also DELETE everywhere (prune, the rate limits' start log, expired Idempotency-Keys).
- spark: as the worker, plus CREATE on the Spark results schema, where its output tables go.
- all: the union, for a deployment that runs everything as one role.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from psycopg import sql as pgsql

from outboxq.queue.schema import VERSION_TABLE, metadata


@dataclass(frozen=True)
class RoleProfile:
    """What one component's role may do, and its default limits."""

    deletes_everywhere: bool
    creates_results: bool
    statement_timeout_s: float
    connection_limit: int


PROFILES = {
    "api": RoleProfile(deletes_everywhere=False, creates_results=False, statement_timeout_s=15,
                       connection_limit=40),
    "worker": RoleProfile(deletes_everywhere=True, creates_results=False, statement_timeout_s=60,
                          connection_limit=200),
    # A claim or a delivery of a large Spark batch (100,000 jobs) is one long statement.
    "spark": RoleProfile(deletes_everywhere=True, creates_results=True, statement_timeout_s=600,
                         connection_limit=40),
    "all": RoleProfile(deletes_everywhere=True, creates_results=True, statement_timeout_s=600,
                       connection_limit=200),
}
# The one table the API deletes from: DELETE /v1/queues/{queue}/limits resets an operator's limits.
API_DELETABLE = ("outboxq_queue_limits",)


def app_role_statements(role: str, *, component: str = "all", password: str | None = None,
                        schema: str = "public", results_schema: str = "outboxq_results",
                        statement_timeout_s: float | None = None,
                        connection_limit: int | None = None) -> list[pgsql.Composed]:
    """The statements that create `role` (LOGIN, no superuser, no DDL) with just the rights `component` uses."""
    if component not in PROFILES:
        raise ValueError(f"component must be one of {', '.join(PROFILES)}, not {component!r}")
    profile = PROFILES[component]
    timeout_ms = int(1000 * (profile.statement_timeout_s if statement_timeout_s is None else statement_timeout_s))
    limit = profile.connection_limit if connection_limit is None else connection_limit
    ident = pgsql.Identifier(role)
    create = pgsql.SQL("CREATE ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT CONNECTION LIMIT {}"
                       ).format(ident, pgsql.Literal(limit))
    if password is not None:
        create = pgsql.SQL("{} PASSWORD {}").format(create, pgsql.Literal(password))

    def tables(names: list[str]) -> pgsql.Composable:
        return pgsql.SQL(", ").join(pgsql.Identifier(schema, t) for t in names)

    everything = sorted(metadata.tables)
    statements = [
        create,
        pgsql.SQL("ALTER ROLE {} SET statement_timeout = {}").format(ident, pgsql.Literal(timeout_ms)),
        pgsql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(pgsql.Identifier(schema), ident),
        pgsql.SQL("GRANT SELECT, INSERT, UPDATE ON {} TO {}").format(tables(everything), ident),
        pgsql.SQL("GRANT DELETE ON {} TO {}").format(
            tables(everything if profile.deletes_everywhere else list(API_DELETABLE)), ident),
        pgsql.SQL("GRANT SELECT ON {} TO {}").format(pgsql.Identifier(schema, VERSION_TABLE), ident),
        pgsql.SQL("GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {} TO {}").format(pgsql.Identifier(schema), ident),
    ]
    if profile.creates_results:
        results = pgsql.Identifier(results_schema)
        statements += [
            pgsql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(results),
            pgsql.SQL("GRANT USAGE, CREATE ON SCHEMA {} TO {}").format(results, ident),
        ]
    return statements


def create_app_role(conn: Any, role: str, *, component: str = "all", password: str | None = None,
                    schema: str = "public", results_schema: str = "outboxq_results",
                    statement_timeout_s: float | None = None, connection_limit: int | None = None) -> None:
    """Create the component's role on the connection's database (run as the schema owner, then commit)."""
    for statement in app_role_statements(role, component=component, password=password, schema=schema,
                                         results_schema=results_schema, statement_timeout_s=statement_timeout_s,
                                         connection_limit=connection_limit):
        conn.execute(statement)


def drop_app_role(conn: Any, role: str) -> None:
    """Revoke what the role was granted in this database and drop it."""
    ident = pgsql.Identifier(role)
    conn.execute(pgsql.SQL("DROP OWNED BY {}").format(ident))
    conn.execute(pgsql.SQL("DROP ROLE IF EXISTS {}").format(ident))
