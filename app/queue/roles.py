"""Least privilege: one database role per component (`outboxq create-role NAME --for api|worker|spark`).

Every role reads and writes rows and never changes the schema (`outboxq migrate` runs as the schema's owner),
has a `statement_timeout` (a runaway statement cannot hold a connection, or a lock, for long) and a
connection limit. What each may do beyond that:

- api: SELECT, INSERT, UPDATE on outboxq's tables, DELETE only on the queue limits (an operator's reset);
  it cannot delete a job (a refused enqueue_many rolls back to a savepoint instead).
- worker: also DELETE everywhere (prune, the rate limits' start log, expired Idempotency-Keys).
- spark: as the worker, plus CREATE on the Spark results schema, where its output tables go.
- all: the union, for a deployment that runs everything as one role.

Each role also holds CONNECT on its database. PostgreSQL gives PUBLIC, so every role, CONNECT on every database
and TEMPORARY (temporary tables) on each: no grant to one role can take those away. `public_reach` tells what a
role may still do that way; `lock_down_public` (`create-role --lock-down-public`) revokes TEMPORARY on this
database and CONNECT on the others from PUBLIC, which changes what every other role of the server may do too,
so it is never done unasked. A password never reaches the server in clear: it is hashed (SCRAM) by libpq first,
so the statement that sets it, which a server may log, holds only the hash.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from psycopg import sql as pgsql
from psycopg.rows import tuple_row

from outboxq.errors import InvalidInput
from outboxq.queue.schema import VERSION_TABLE, metadata
from outboxq.queue.sql import roles as roles_sql


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
# Powers an outboxq role never has: a role holding one is not outboxq's to update (another role's name, say).
POWERS = ("SUPERUSER", "CREATEDB", "CREATEROLE", "REPLICATION", "BYPASSRLS")


class RoleExists(InvalidInput):
    """The role exists already (and was not to be updated, or is not outboxq's to update)."""


@dataclass(frozen=True)
class PublicReach:
    """What a role may do beyond its grants (through PUBLIC's defaults, or other grants)."""

    temporary: bool  # create temporary tables in this database
    other_databases: list[str]  # connect to these databases

    def __bool__(self) -> bool:
        return self.temporary or bool(self.other_databases)


def app_role_statements(role: str, *, component: str = "all", password: str | None = None,
                        schema: str = "public", results_schema: str = "outboxq_results",
                        statement_timeout_s: float | None = None, connection_limit: int | None = None,
                        database: str | None = None, existing: bool = False) -> list[pgsql.Composed]:
    """The statements that create `role` (LOGIN, no superuser, no DDL) with just the rights `component` uses,
    and CONNECT on `database` (when given). With `existing`, they bring an existing role to that instead: its
    rights on outboxq's tables are revoked, then granted anew (its password kept when `password` is None)."""
    if component not in PROFILES:
        raise ValueError(f"component must be one of {', '.join(PROFILES)}, not {component!r}")
    profile = PROFILES[component]
    timeout_ms = int(1000 * (profile.statement_timeout_s if statement_timeout_s is None else statement_timeout_s))
    limit = profile.connection_limit if connection_limit is None else connection_limit
    ident = pgsql.Identifier(role)
    create = roles_sql.composed(roles_sql.role_alter if existing else roles_sql.role_create,
                                role=ident, connection_limit=pgsql.Literal(limit))
    if password is not None:
        create = roles_sql.composed(roles_sql.role_with_password, statement=create, password=pgsql.Literal(password))
    everything = sorted(metadata.tables)
    schema_ident = pgsql.Identifier(schema)
    statements = [create]
    if existing:  # what an earlier profile granted (a worker role made an api role, say) goes first
        statements.append(roles_sql.composed(roles_sql.role_revoke_tables,
                                             tables=roles_sql.table_list(schema, [*everything, VERSION_TABLE]),
                                             role=ident))
    if database is not None:
        statements.append(roles_sql.composed(roles_sql.database_grant_connect,
                                             database=pgsql.Identifier(database), role=ident))
    deletable = everything if profile.deletes_everywhere else list(API_DELETABLE)
    statements += [
        roles_sql.composed(roles_sql.role_set_statement_timeout, role=ident, timeout_ms=pgsql.Literal(timeout_ms)),
        roles_sql.composed(roles_sql.schema_grant_usage, schema=schema_ident, role=ident),
        roles_sql.composed(roles_sql.tables_grant_write, tables=roles_sql.table_list(schema, everything), role=ident),
        roles_sql.composed(roles_sql.tables_grant_delete, tables=roles_sql.table_list(schema, deletable), role=ident),
        roles_sql.composed(roles_sql.table_grant_select, table=pgsql.Identifier(schema, VERSION_TABLE), role=ident),
        roles_sql.composed(roles_sql.sequences_grant_use, schema=schema_ident, role=ident),
    ]
    if profile.creates_results:
        results = pgsql.Identifier(results_schema)
        statements += [
            roles_sql.composed(roles_sql.results_schema_create, schema=results),
            roles_sql.composed(roles_sql.results_schema_grant, schema=results, role=ident),
        ]
    return statements


def create_app_role(conn: Any, role: str, *, component: str = "all", password: str | None = None,
                    schema: str = "public", results_schema: str = "outboxq_results",
                    statement_timeout_s: float | None = None, connection_limit: int | None = None,
                    update_existing: bool = False) -> bool:
    """Create the component's role on the connection's database (run as the schema owner, then commit); True.
    An existing role is RoleExists, or with `update_existing` brought to the component's rights and limits
    (False): for a deployment that runs this at each start, which also grants a newer outboxq's new tables."""
    cur = _tuples(conn)
    powers = cur.execute(roles_sql.role_powers, {"role": role}).fetchone()
    if powers is not None:
        held = [name for name, has in zip(POWERS, powers, strict=True) if has]
        if held:
            raise RoleExists(f"role {role} exists and has {', '.join(held)}, which an outboxq role never has: "
                             "pick another name")
        if not update_existing:
            raise RoleExists(f"role {role} exists (update it with --update-existing, or pick another name)")
    if password is not None:
        # The server gets the SCRAM hash only, as `ALTER ROLE ... PASSWORD` from psql's \password does: never the
        # password in the text of a statement that log_statement or pg_stat_statements would keep.
        password = conn.pgconn.encrypt_password(password.encode(), role.encode()).decode()
    database = cur.execute(roles_sql.database_current).fetchone()[0]
    for statement in app_role_statements(role, component=component, password=password, schema=schema,
                                         results_schema=results_schema, statement_timeout_s=statement_timeout_s,
                                         connection_limit=connection_limit, database=database,
                                         existing=powers is not None):
        conn.execute(statement)
    return powers is None


def public_reach(conn: Any, role: str) -> PublicReach:
    """What `role` may do beyond its grants: temporary tables here, connections to other databases."""
    cur = _tuples(conn)
    temporary = cur.execute(roles_sql.role_may_create_temporary, {"role": role}).fetchone()[0]
    others = [r[0] for r in cur.execute(roles_sql.role_other_databases, {"role": role}).fetchall()]
    return PublicReach(temporary=bool(temporary), other_databases=others)


def lock_down_public(conn: Any) -> list[str]:
    """Revoke from PUBLIC TEMPORARY on this database and CONNECT on every other one (returned). Every role not
    granted those itself loses them (owners and superusers keep them). PUBLIC keeps CONNECT on this database:
    the application's own roles connect to it too (outboxq's hold CONNECT there themselves)."""
    cur = _tuples(conn)
    database = cur.execute(roles_sql.database_current).fetchone()[0]
    conn.execute(roles_sql.composed(roles_sql.database_revoke_public_temporary, database=pgsql.Identifier(database)))
    others = [r[0] for r in cur.execute(roles_sql.database_others).fetchall()]
    for name in others:
        conn.execute(roles_sql.composed(roles_sql.database_revoke_public_connect, database=pgsql.Identifier(name)))
    return others


def drop_app_role(conn: Any, role: str) -> None:
    """Revoke what the role was granted in this database and drop it."""
    ident = pgsql.Identifier(role)
    conn.execute(roles_sql.composed(roles_sql.role_drop_owned, role=ident))
    conn.execute(roles_sql.composed(roles_sql.role_drop, role=ident))


def _tuples(conn: Any) -> Any:
    """A cursor of tuple rows, whatever the connection's row factory (dicts on outboxq's own connections)."""
    return conn.cursor(row_factory=tuple_row)
