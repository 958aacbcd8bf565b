"""Maintenance services, one per file, each with run_once(conn, now=...) that tests call directly."""
