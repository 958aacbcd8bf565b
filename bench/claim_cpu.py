"""What a claim costs the server, without the noise of a whole drain: the PostgreSQL server process's CPU time
per job while one connection claims and completes a queue's jobs until none is left (claim, commit, complete,
commit), for each claim configuration given, alternated over `--rounds` rounds (medians), with the claims' and the
completions' shares.

    python bench/claim_cpu.py [--url postgresql://root@127.0.0.1:5432/postgres] [--jobs 40000] [--keys 100]
                              [--rounds 5] [CONFIG ...]

CONFIG is KIND:LIMIT[:MAX_KEYS]: KIND one of unlimited, global_concurrency, per_key (the claims of
bench/flow_claim_explain.py, with its jobs and limits), LIMIT the jobs a claim asks for, MAX_KEYS the keys a
per-key claim scans (default: every key it may need, outboxq.queue.limits.key_budget). Default configs:
global_concurrency:1000 per_key:1000:50 per_key:1000:100. The server must run on this machine: its process's CPU
time is read from /proc (resolution 10 ms: use enough jobs). A wall-clock drain on a shared 2-core machine
moves by +-20% between runs; this measure moved by about 2 us a job (2026-11-26).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import psycopg
from psycopg.rows import dict_row

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flow_claim_explain import CLAIMS, fill, params, scratch_database  # noqa: E402

from outboxq.queue import limits, sql  # noqa: E402
from outboxq.queue.sql import limits as limits_sql  # noqa: E402


def server_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) used so far by server process `pid`."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def drain(conn: psycopg.Connection, kind: str, limit: int, max_keys: int | None) -> tuple[int, float, float]:
    """Claim and complete until the queue is empty, as a worker's dispatcher and completer would; jobs done, and
    the server CPU seconds of the claims and of the completions (each with its commit)."""
    pid = conn.info.backend_pid
    after_key, done, claims_s, completions_s = "", 0, 0.0, 0.0
    while True:
        started = server_cpu_s(pid)
        if kind != "unlimited":
            conn.execute(limits_sql.queue_limit_claim_exclusive, {"queue": "q"})
        values = params(limit, after_key)
        if max_keys is not None:
            values["max_keys"] = max_keys
        rows = conn.execute(CLAIMS[kind], values, prepare=True).fetchall()
        conn.commit()
        claimed = server_cpu_s(pid)
        claims_s += claimed - started
        if not rows:
            return done, claims_s, completions_s
        if kind == "per_key":
            after_key = limits.round_robin(rows, after_key)[1]
        conn.execute(sql.job_complete_batch, {"ids": [r["id"] for r in rows],
                                              "lease_tokens": [values["lease_token"]] * len(rows)},
                     prepare=True).fetchall()
        conn.commit()
        completions_s += server_cpu_s(pid) - claimed
        done += len(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=None)
    parser.add_argument("--jobs", type=int, default=40_000)
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("configs", nargs="*", default=["global_concurrency:1000", "per_key:1000:50",
                                                       "per_key:1000:100"])
    args = parser.parse_args()
    configs = []
    for text in args.configs:
        kind, limit, *max_keys = text.split(":")
        if kind not in CLAIMS or len(max_keys) > 1:
            parser.error(f"config {text!r}: expected KIND:LIMIT[:MAX_KEYS] with KIND one of {', '.join(CLAIMS)}")
        configs.append((text, kind, int(limit), int(max_keys[0]) if max_keys else None))

    per_job: dict[str, list[float]] = {text: [] for text, *_ in configs}
    # (The claims' and the completions' shares: /proc's clock ticks are 10 ms, so read them over a whole drain.)
    claims: dict[str, list[float]] = {text: [] for text, *_ in configs}
    completions: dict[str, list[float]] = {text: [] for text, *_ in configs}
    with scratch_database(args.url) as url:
        print(f"{args.jobs:,} jobs, {args.keys:,} keys (per_key), {args.rounds} alternated rounds: server CPU "
              "per job (us)")
        with psycopg.connect(url, row_factory=dict_row) as conn:
            pid = conn.info.backend_pid
            for round_number in range(args.rounds):
                for text, kind, limit, max_keys in (configs if round_number % 2 == 0 else configs[::-1]):
                    conn.autocommit = True
                    fill(conn, kind, args.keys, args.jobs)
                    conn.execute(sql.session_generic_plans)  # as on the worker's own connections
                    conn.autocommit = False
                    before = server_cpu_s(pid)
                    done, claims_s, completions_s = drain(conn, kind, limit, max_keys)
                    per_job[text].append((server_cpu_s(pid) - before) / max(done, 1) * 1e6)
                    claims[text].append(claims_s / max(done, 1) * 1e6)
                    completions[text].append(completions_s / max(done, 1) * 1e6)
                print(f"  round {round_number + 1}: " + ", ".join(f"{t} {v[-1]:.1f}" for t, v in per_job.items()))
        for text, values in per_job.items():
            print(f"  {text:28} median {statistics.median(values):6.1f} us a job (claims "
                  f"{statistics.median(claims[text]):.1f}, completions {statistics.median(completions[text]):.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
