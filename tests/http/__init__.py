"""The HTTP API (FastAPI), in process and as a served application, on a real PostgreSQL."""
