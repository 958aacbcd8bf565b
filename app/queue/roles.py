"""Least privilege: the database role the API and the workers run as.

They read and write rows; they never change the schema (`outboxq migrate` runs as the schema's owner).
Spark consumers that create their output table on first use also need CREATE on the schema, or the
table created beforehand and granted to this role.
"""

from __future__ import annotations

from typing import Any

from psycopg import sql as pgsql

from outboxq.queue.schema import VERSION_TABLE, metadata


def app_role_statements(role: str, *, password: str | None = None, schema: str = "public") -> list[pgsql.Composed]:
    """The statements that create `role` (LOGIN, no superuser, no DDL) with just the rights it uses."""
    ident = pgsql.Identifier(role)
    create = pgsql.SQL("CREATE ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT").format(ident)
    if password is not None:
        create = pgsql.SQL("{} PASSWORD {}").format(create, pgsql.Literal(password))
    tables = pgsql.SQL(", ").join(pgsql.Identifier(schema, t) for t in sorted(metadata.tables))
    return [
        create,
        pgsql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(pgsql.Identifier(schema), ident),
        pgsql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON {} TO {}").format(tables, ident),
        pgsql.SQL("GRANT SELECT ON {} TO {}").format(pgsql.Identifier(schema, VERSION_TABLE), ident),
        pgsql.SQL("GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {} TO {}").format(pgsql.Identifier(schema), ident),
    ]


def create_app_role(conn: Any, role: str, *, password: str | None = None, schema: str = "public") -> None:
    """Create the service role on the connection's database (run as the schema owner, then commit)."""
    for statement in app_role_statements(role, password=password, schema=schema):
        conn.execute(statement)


def drop_app_role(conn: Any, role: str) -> None:
    """Revoke what the role was granted in this database and drop it."""
    ident = pgsql.Identifier(role)
    conn.execute(pgsql.SQL("DROP OWNED BY {}").format(ident))
    conn.execute(pgsql.SQL("DROP ROLE IF EXISTS {}").format(ident))
