"""Spark consumers: delivery protocol, a real local Spark, scale-out over drivers, a standalone cluster."""
