"""The queue core: enqueue in the caller's transaction, read jobs, the SQL. No FastAPI or Spark imports here.

Its public names are re-exported by the top-level package: `from outboxq import enqueue, ...`.
"""
