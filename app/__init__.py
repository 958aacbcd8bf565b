"""outboxq: a transactional-outbox job queue that lives inside PostgreSQL."""

__version__ = "0.1.0"
