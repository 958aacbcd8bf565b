"""Spark consumers of outboxq queues with exactly-once effects (delivery hashes in the same database)."""
