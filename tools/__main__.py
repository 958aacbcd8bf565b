"""`python -m tools`: the benchmark and chaos harness, run from a checkout of the repository.

    python -m tools bench [SUB ...] [options]  throughput, enqueue cost, latency, scale (tools/bench.py)
    python -m tools chaos [options]            faults: nothing lost, nothing run twice (tools/chaos.py)
    python -m tools spark-bench [options]      Spark rows/s against the plain path (tools/spark_bench.py)

Run it from the repository's root (the folder that holds tools/), with outboxq installed: the harness is not
part of the outboxq package and never ships in its wheel. Each subcommand takes the arguments it took as a
subcommand of the `outboxq` command (bench, chaos, spark bench) before the harness left the package.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    """The harness's command: --log-level (as outboxq's) and a subcommand per tool."""
    from tools import bench, chaos, spark_bench

    parser = argparse.ArgumentParser(prog="python -m tools", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--log-level", default="INFO")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in (bench, chaos, spark_bench):
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the subcommand as the `outboxq` command runs its own (logging, outboxq's errors)."""
    from outboxq.cli import run

    return run(build_parser(), argv, "python -m tools")


if __name__ == "__main__":
    sys.exit(main())
