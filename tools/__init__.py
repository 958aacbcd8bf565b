"""The outboxq repository's harness: benchmarks against the peers (bench), the chaos suite (chaos), the Spark
bench. Not part of the outboxq package: never installed, never imported by it. Run from a checkout, at the
repository's root: `python -m tools bench|chaos|spark-bench ...` (tools/__main__.py)."""
