"""Tools of the outboxq repository: benchmarks against the peers, the chaos suite. Not part of the queue core."""
