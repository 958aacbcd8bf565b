"""The embedded server's bootstrap: its database, made once (app/embedded.py)."""

from __future__ import annotations

database_exists = "SELECT 1 FROM pg_database WHERE datname = %s"
# A template for psycopg.sql: the name is filled in as an Identifier.
database_create = "CREATE DATABASE {name}"
