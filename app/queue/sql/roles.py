"""What a per-component role (outboxq.queue.roles) may do beyond its grants, and the lock-down that takes it
away: PostgreSQL gives PUBLIC, so every role, CONNECT and TEMPORARY on each database it creates.

Also the statements that create, update and drop such a role (outboxq.queue.roles.app_role_statements,
drop_app_role): CREATE/ALTER ROLE and its grants.

The statements with identifiers or literals are psycopg.sql templates ({database}, {role}, {schema}, {tables},
...): `composed(template, **parts)` fills one in.
"""

from __future__ import annotations

from collections.abc import Iterable

from psycopg import sql as pgsql


def composed(template: str, **parts: pgsql.Composable) -> pgsql.Composed:
    """`template` (one of this module's) with its {placeholders} filled in by psycopg.sql composables."""
    return pgsql.SQL(template).format(**parts)


def table_list(schema: str, names: Iterable[str]) -> pgsql.Composable:
    """The tables `names` of `schema`, qualified and quoted, for {tables}: "schema"."a", "schema"."b"."""
    return pgsql.SQL(", ").join(pgsql.Identifier(schema, name) for name in names)

# The attributes of an existing role (no row: there is none) that an outboxq role never has.
role_powers = """
SELECT rolsuper, rolcreatedb, rolcreaterole, rolreplication, rolbypassrls FROM pg_roles WHERE rolname = %(role)s
"""

database_current = "SELECT current_database()"

# The other databases `role` may connect to, whether through PUBLIC or a grant of its own (template0 takes no
# connections at all).
role_other_databases = """
SELECT datname FROM pg_database
WHERE datallowconn AND datname <> current_database() AND has_database_privilege(%(role)s, oid, 'CONNECT')
ORDER BY datname
"""

# Whether `role` may create temporary tables in this database.
role_may_create_temporary = "SELECT has_database_privilege(%(role)s, current_database(), 'TEMPORARY')"

# The databases other than this one that take connections: the lock-down revokes PUBLIC's CONNECT on each.
database_others = """
SELECT datname FROM pg_database WHERE datallowconn AND datname <> current_database() ORDER BY datname
"""

# outboxq's roles hold CONNECT on their database themselves, so that they keep it when an operator revokes it
# from PUBLIC (a common hardening step).
database_grant_connect = "GRANT CONNECT ON DATABASE {database} TO {role}"
database_revoke_public_temporary = "REVOKE TEMPORARY ON DATABASE {database} FROM PUBLIC"
database_revoke_public_connect = "REVOKE CONNECT ON DATABASE {database} FROM PUBLIC"

# ---------------------------------------------------------------- a component's role (outboxq.queue.roles)

# Created LOGIN, without powers or DDL, with a connection limit. ALTER ROLE (an existing role brought to a
# profile) leaves NOSUPERUSER out: only a superuser may state it there, and an operator with CREATEROLE may
# update the roles it made (create_app_role refuses to update a superuser anyway).
role_create = ("CREATE ROLE {role} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT "
               "CONNECTION LIMIT {connection_limit}")
role_alter = "ALTER ROLE {role} LOGIN NOCREATEDB NOCREATEROLE NOINHERIT CONNECTION LIMIT {connection_limit}"
# role_create or role_alter ({statement}) setting the password too (its SCRAM hash: create_app_role).
role_with_password = "{statement} PASSWORD {password}"
# What an earlier profile granted on outboxq's tables, revoked before an existing role is granted anew.
role_revoke_tables = "REVOKE ALL ON {tables} FROM {role}"
role_set_statement_timeout = "ALTER ROLE {role} SET statement_timeout = {timeout_ms}"
schema_grant_usage = "GRANT USAGE ON SCHEMA {schema} TO {role}"
tables_grant_write = "GRANT SELECT, INSERT, UPDATE ON {tables} TO {role}"
tables_grant_delete = "GRANT DELETE ON {tables} TO {role}"
table_grant_select = "GRANT SELECT ON {table} TO {role}"
sequences_grant_use = "GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {schema} TO {role}"
# The Spark results schema, where a spark (or all) role creates its output tables.
results_schema_create = "CREATE SCHEMA IF NOT EXISTS {schema}"
results_schema_grant = "GRANT USAGE, CREATE ON SCHEMA {schema} TO {role}"

# drop_app_role: what the role was granted (and owns) in this database, then the role.
role_drop_owned = "DROP OWNED BY {role}"
role_drop = "DROP ROLE IF EXISTS {role}"
