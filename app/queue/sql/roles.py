"""What a per-component role (outboxq.queue.roles) may do beyond its grants, and the lock-down that takes it
away: PostgreSQL gives PUBLIC, so every role, CONNECT and TEMPORARY on each database it creates.

The statements with identifiers are psycopg.sql templates ({database}, {role}).
"""

from __future__ import annotations

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
