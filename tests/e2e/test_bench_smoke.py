"""A quick run of each `python -m tools bench` sub-benchmark with tiny sizes: it works and prints sane numbers.

Speed itself is measured by `python -m tools bench`, never asserted here. The harness is the checkout's
`tools` package (tools/__main__.py), not part of outboxq.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import psycopg
import pytest

import outboxq
from tools import bench_variants, spark_bench
from tools.__main__ import build_parser, main
from tools.bench import Bench, claim_plan, render, summarize
from tools.bench_drivers import QUEUE
from tools.bench_http import BatchRefused, batch_headers, post_batch

ROOT = Path(__file__).resolve().parents[2]

TINY = [
    "--jobs", "300", "--enqueue-calls", "40", "--enqueue-many-batches", "1", "--latency-samples", "10",
    "--latency-gap-ms", "5", "--backlog-jobs", "600", "--finished-jobs", "3000", "--max-seconds", "60",
    "--quiet", "--no-http",
]


def _run(db_url: str, tmp_path: Path, *extra: str) -> dict:
    output = tmp_path / "bench.json"
    code = main(["bench", *extra, *TINY, "--url", db_url, "--output", str(output)])
    assert code == 0
    return json.loads(output.read_text())


def test_bench_drain_enqueue_latency_produce_sane_numbers(db_url, tmp_path, capsys):
    results = _run(db_url, tmp_path, "drain", "enqueue", "latency")

    drain = results["summary"]["drain_jobs_per_s"]["outboxq"]
    assert drain["median"] > 0
    run = results["runs"]["drain"]["outboxq"][0]
    assert run["finished"] == run["n"] == 300 and not run["timed_out"]
    assert run["rss_start_kb"] > 0 and run["rss_end_kb"] > 0
    assert run["worker_defaults"]["concurrency"] and run["worker_defaults"]["batch_size"]

    enqueue = results["summary"]["enqueue"]["outboxq"]
    for key in ("enqueue_commit_per_s", "insert_commit_per_s", "enqueue_many_10k_per_s"):
        assert enqueue[key] > 0
    assert 0 < enqueue["enqueue_vs_insert"] < 100

    latency = results["summary"]["latency"]["outboxq"]
    assert latency["samples"] == 10 and latency["missing"] == 0
    assert 0 < latency["p50_ms"] <= latency["p99_ms"] < 10_000

    printed = capsys.readouterr().out
    assert "| drain |" in printed and "latency" in printed


def test_bench_http_figure_posts_batches_to_the_real_api_and_refuses_an_error(db_url):
    bench = Bench(build_parser().parse_args(["bench", "enqueue", "--url", db_url, "--quiet"]))
    try:
        with bench.api_server(db_url) as (port, token), \
                closing(http.client.HTTPConnection("127.0.0.1", port, timeout=30)) as conn:
            body = {"jobs": [{"payload": {"i": i}} for i in range(3)]}
            answer = json.loads(post_batch(conn, body, batch_headers(token)))
            assert [job["payload"] for job in answer["jobs"]] == [{"i": 0}, {"i": 1}, {"i": 2}]
            with pytest.raises(BatchRefused, match="answered 401"):  # (on the same kept-alive connection)
                post_batch(conn, body, batch_headers("not-the-bench-token-at-all"))
        rates = bench.enqueue_http(db_url, rounds=2)
    finally:
        bench.cleanup()
    assert set(rates) == {"http_batch_1k_per_s", "http_minimal_batch_1k_per_s", "http_batch_1k_httpx_per_s",
                          "http_minimal_batch_1k_httpx_per_s", "python_batch_1k_interleaved_per_s"}
    assert all(rate > 0 for rate in rates.values())
    # The 3 jobs, then 1,000 a request or enqueue_many: 3 warm-up rounds of two requests, then 2 rounds of four
    # requests and one enqueue_many.
    with psycopg.connect(db_url) as conn:
        written = conn.execute("SELECT count(*) FROM outboxq_jobs WHERE queue = %s", (QUEUE,)).fetchone()[0]
    assert written == 3 + 1000 * (3 * 2 + 2 * 5)


def test_a_failed_http_figure_is_rendered_with_its_reason():
    runs = {"outboxq": [{"enqueue_commit_per_s": 10.0, "http_error": "the API did not become ready"}]}
    results = {"machine": {"cpus": 2, "cpu_model": "x", "memory_gb": 1, "load_1m": 0, "python": "3"},
               "server": {"version": "15", "synchronous_commit": "on", "fsync": "on", "shared_buffers": "1"},
               "settings": {"rounds": 1, "jobs": 1, "peer_slow_jobs": 1}, "summary": summarize({"enqueue": runs})}
    table = render(results)
    assert "| ratio HTTP / Python (1,000-job batches, alternating) | - |" in table
    assert "| HTTP batch route failed | the API did not become ready |" in table


def test_bench_backlog_checks_the_claim_plan_and_memory(db_url, tmp_path):
    backlog = _run(db_url, tmp_path, "backlog")["backlog"]

    assert backlog["large"]["finished"] == 600
    assert backlog["large"]["rss_max_kb"] >= backlog["large"]["rss_start_kb"] > 0
    plan = backlog["claim_plan"]
    assert plan["uses_claim_index"] and not plan["search_seq_scan"], plan
    assert backlog["with_finished"]["finished"] == 300
    # the drain beside the history and the baseline alternate: a median of each makes the ratio
    assert len(backlog["with_finished_runs"]) == len(backlog["baseline_runs"]) == 3
    assert backlog["with_finished_vs_baseline"] == backlog["with_finished"]["jobs_per_s"] / backlog["baseline"]["jobs_per_s"]


def test_bench_many_queues_and_dead_rows_drain_every_job_and_give_their_ratios(db_url, tmp_path, capsys):
    results = _run(db_url, tmp_path, "manyqueues", "deadrows", "--dead-rows-jobs", "400")

    many = results["runs"]["manyqueues"]["many_queues"][0]
    assert many["finished"] == many["n"] == 300 and not many["timed_out"]
    held = results["runs"]["deadrows"]["snapshot_held"][0]
    assert held["finished"] == held["n"] == 400 and not held["timed_out"]
    ratios = results["summary"]["ratios"]
    assert ratios["manyqueues_many_queues_vs_one_queue"] > 0 and ratios["deadrows_snapshot_held_vs_free"] > 0
    printed = capsys.readouterr().out
    assert "many queues" in printed and "dead rows" in printed


def test_a_drain_can_enqueue_its_jobs_at_go_to_running_workers(db_url):
    # `--limits`' outboxq_gc4_50ms_running: the workers start before "go"; the jobs are enqueued at "go".
    import psycopg

    bench = Bench(build_parser().parse_args(["bench", "drain", *TINY, "--url", db_url]))
    try:
        url = bench.fresh_db("outboxq")
        run = bench.drain("outboxq", 40, "running at go", db_url=url, processes=2, flow={
            "consumer": {"global_concurrency": 4}, "sleep": 0.01, "running_at_go": True})
        with psycopg.connect(url) as conn:
            # (a starting worker declares its consumer's limit: the row was written before any job existed)
            done, declared_before_jobs = conn.execute(
                "SELECT count(*) FILTER (WHERE status = 'done'), "
                "(SELECT updated_at FROM outboxq_queue_limits) < min(created_at) FROM outboxq_jobs").fetchone()
    finally:
        bench.cleanup()
    assert run["finished"] == run["n"] == 40 and not run["timed_out"]
    assert done == 40 and declared_before_jobs


def test_claim_plan_uses_the_claim_index_beside_finished_jobs(db_url):
    import psycopg

    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("INSERT INTO outboxq_jobs (queue, status, payload, finished_at) "
                     "SELECT 'bench', 'done', 'null', now() FROM generate_series(1, 5000)")
        conn.execute("INSERT INTO outboxq_jobs (queue, payload) SELECT 'bench', 'null' FROM generate_series(1, 50)")
        conn.execute("ANALYZE outboxq_jobs")
    plan = claim_plan(db_url)
    assert plan["uses_claim_index"] and not plan["search_seq_scan"], plan


def test_bench_is_a_subcommand_of_the_harness():
    args = build_parser().parse_args(["bench", "drain", "--compare", "--rounds", "3", "--json"])
    assert args.which == ["drain"] and args.compare and args.rounds == 3 and args.json
    assert main(["bench", "nonsense", "--quiet"]) == 2


def test_the_flow_control_drains_can_be_chosen_by_name_and_an_unknown_name_is_refused(capsys):
    args = build_parser().parse_args(["bench", "drain", "--limits", "--flows", "gc10000,per_key_gc10000"])
    assert args.flows == ["gc10000", "per_key_gc10000"]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "drain", "--limits", "--flows", "per_key"])
    assert "unknown flow-control drain per_key; choose from gc10000, per_key_gc10000" in capsys.readouterr().err


def test_a_variant_revision_drains_beside_the_checkout_importing_its_own_package(db_url, tmp_path, capsys):
    """--variant NAME=REV: every outboxq drain once more, side by side in each round, by workers that import
    outboxq as it is at REV (exported from git into the run's scratch folder), with the ratios between the two."""
    results = _run(db_url, tmp_path, "drain", "--outboxq-processes", "", "--variant", "base=HEAD")
    runs = results["runs"]["drain"]
    assert runs["outboxq"][0]["package"] == outboxq.__path__[0]
    variant = runs["outboxq@base"][0]
    assert variant["finished"] == variant["n"] == 300 and not variant["timed_out"]
    assert Path(variant["package"]).parts[-3:] == ("variants", "base-import", "outboxq"), variant["package"]
    ratios = results["summary"]["ratios"]
    assert ratios["outboxq_vs_outboxq@base"] > 0 and ratios["outboxq_vs_outboxq@base_per_round"] > 0
    assert "| outboxq@base |" in capsys.readouterr().out


def test_a_variant_git_cannot_export_or_of_another_schema_is_refused_with_the_reason(tmp_path, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "drain", "--variant", "Base=HEAD"])
    assert "a variant is NAME=REV" in capsys.readouterr().err
    assert main(["bench", "drain", "--quiet", "--variant", "base=no-such-revision"]) == 2
    assert "variant base: git cannot export 'no-such-revision'" in capsys.readouterr().err
    assert main(["bench", "drain", "--quiet", "--variant", "a=HEAD", "--variant", "a=HEAD~1"]) == 2
    assert "each --variant needs a name of its own, not a, a" in capsys.readouterr().err
    # A revision whose migrations differ from the checkout's (a scratch repository: the variant would need
    # databases of its own).
    repo = tmp_path / "repo"
    (repo / "migrations").mkdir(parents=True)
    (repo / "migrations" / "0001.py").write_text("first = 1\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "first"], check=True)
    (repo / "migrations" / "0001.py").write_text("first = 2\n")
    with pytest.raises(ValueError, match="the migrations of 'HEAD' differ from this checkout's"):
        bench_variants.prepare("old", "HEAD", tmp_path / "variants", repo=repo)


def test_the_harness_runs_as_python_m_tools_from_the_checkout():
    run = subprocess.run([sys.executable, "-m", "tools", "bench", "nonsense", "--quiet"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "unknown sub-benchmark nonsense" in run.stderr, run.stderr
    helps = subprocess.run([sys.executable, "-m", "tools", "--help"], cwd=ROOT, capture_output=True, text=True,
                           timeout=120)
    assert helps.returncode == 0 and all(c in helps.stdout for c in ("bench", "chaos", "spark-bench"))


def test_render_without_results_sections():
    results = {"machine": {"cpus": 2, "cpu_model": "x", "memory_gb": 1, "load_1m": 0, "python": "3"},
               "server": {"version": "15", "synchronous_commit": "on", "fsync": "on", "shared_buffers": "1"},
               "settings": {"rounds": 1, "jobs": 1, "peer_slow_jobs": 1}, "summary": {}}
    assert "machine: 2 CPUs" in render(results)


def test_summary_ratios_with_peer_runs():
    # The peers themselves run only in `python -m tools bench --compare` (a separate virtual environment, never in
    # CI); here, made-up runs check that the summary picks the best PgQueuer configuration and the ratios.
    def run(rate: float) -> dict:
        return {"jobs_per_s": rate, "rss_start_kb": 1, "rss_end_kb": 1}

    summary = summarize({"drain": {
        "outboxq": [run(100), run(300), run(200)],
        "pgqueuer_defaults": [run(50)],
        "pgqueuer_b100_p1": [run(80)],
        "pgqueuer_b500_p2": [run(160), {"error": "boom"}],
        "procrastinate_defaults": [run(10)],
        "pgbench": [{"1x1": {"jobs_per_s": 400.0}, "100x4": {"jobs_per_s": 1000.0}}],
    }})
    assert summary["drain_jobs_per_s"]["outboxq"]["median"] == 200
    assert summary["pgqueuer_best"] == {"config": "pgqueuer_b500_p2", "jobs_per_s": 160}
    ratios = summary["ratios"]
    assert ratios["outboxq_vs_pgqueuer_best"] == 1.25 and ratios["outboxq_vs_pgqueuer_defaults"] == 4
    assert ratios["outboxq_vs_procrastinate_defaults"] == 20 and ratios["outboxq_vs_pgbench_batched_best"] == 0.2
    # The slowest outboxq round (100) against its median (200), and against PgQueuer's best's fastest (160).
    assert ratios["outboxq_slowest_round_of_median"] == 0.5
    assert ratios["outboxq_slowest_vs_pgqueuer_best_fastest"] == 100 / 160


def test_summary_gives_a_variants_flow_against_the_variants_own_defaults_round_by_round():
    # --variant with --limits: the variant's unbinding limit against the variant's defaults, as the medians'
    # ratio and round by round (the two differ on a machine whose speed drifts between rounds).
    def run(rate: float) -> dict:
        return {"jobs_per_s": rate, "rss_start_kb": 1, "rss_end_kb": 1}

    summary = summarize({"drain": {
        "outboxq": [run(1000), run(600)], "outboxq@v": [run(1000), run(500)],
        "outboxq_per_key_gc10000": [run(900), run(500)], "outboxq_per_key_gc10000@v": [run(950), run(450)],
    }})
    ratios = summary["ratios"]
    assert ratios["outboxq_per_key_gc10000@v_vs_defaults@v"] == 700 / 750
    assert ratios["outboxq_per_key_gc10000@v_vs_defaults@v_per_round"] == (0.95 + 0.9) / 2
    assert ratios["outboxq_per_key_gc10000_vs_outboxq_per_key_gc10000@v_per_round"] == (900 / 950 + 500 / 450) / 2


def test_the_drain_is_rendered_round_by_round_beside_pgqueuers_best_with_the_workers_statements():
    def run(rate: float, claims: int | None = None) -> dict:
        return {"jobs_per_s": rate, "rss_start_kb": 1, "rss_end_kb": 1, "fill_jobs_per_s": 9000.0,
                "thread_cpu_s": {"outboxq-dispatcher": 0.25, "outboxq-completer": 0.25},
                "worker_stats": {"claims": claims, "writes": 7} if claims else {}}

    runs = {"outboxq": [run(300, 12), run(200, 11)], "pgqueuer_b500_p2": [run(100), run(250)]}
    results = {"machine": {"cpus": 2, "cpu_model": "x", "memory_gb": 1, "load_1m": 0, "python": "3"},
               "server": {"version": "15", "synchronous_commit": "on", "fsync": "on", "shared_buffers": "1"},
               "settings": {"rounds": 2, "jobs": 1, "peer_slow_jobs": 1}, "runs": {"drain": runs},
               "summary": summarize({"drain": runs})}
    table = render(results)
    assert "| 1 | 300 | 100 | 3.00 | 12 | 7 | 0.50 | 9,000 |" in table
    assert "| 2 | 200 | 250 | 0.80 | 11 | 7 | 0.50 | 9,000 |" in table


def test_summary_gives_the_flow_control_figures_as_the_issue_states_them():
    # `--limits`: a limit that does not bind against the defaults of the same run; the binding
    # global_concurrency=4 on jobs of 50 ms against the 80 jobs/s it allows, with its decimal.
    def run(rate: float) -> dict:
        return {"jobs_per_s": rate, "rss_start_kb": 1, "rss_end_kb": 1}

    summary = summarize({"drain": {
        "outboxq": [run(1000), run(1200)], "outboxq_gc10000": [run(950), run(1050)],
        "outboxq_per_key_gc10000": [run(880)], "outboxq_gc4_50ms": [run(72.04), run(71.8)],
        "outboxq_gc4_50ms_running": [run(76.0)], "outboxq_rate200": [run(193.4)],
    }})
    ratios = summary["ratios"]
    assert ratios["outboxq_gc10000_vs_defaults"] == 1000 / 1100
    assert ratios["outboxq_per_key_gc10000_vs_defaults"] == 880 / 1100
    # Round by round too (the median of 950/1000 and 1050/1200; per key had one round only).
    assert ratios["outboxq_gc10000_vs_defaults_per_round"] == (0.95 + 0.875) / 2
    assert ratios["outboxq_per_key_gc10000_vs_defaults_per_round"] == 880 / 1000
    assert ratios["outboxq_gc4_50ms_of_the_80_allowed"] == 71.92 / 80
    assert ratios["outboxq_gc4_50ms_running_of_the_80_allowed"] == 76.0 / 80
    assert not any(name.startswith("outboxq_rate200") for name in ratios)  # its goal is a range of jobs/s
    assert summary["drain_jobs_per_s"]["outboxq_gc4_50ms"]["runs"] == [72.0, 71.8]
    results = {"machine": {"cpus": 2, "cpu_model": "x", "memory_gb": 1, "load_1m": 0, "python": "3"},
               "server": {"version": "15", "synchronous_commit": "on", "fsync": "on", "shared_buffers": "1"},
               "settings": {"rounds": 2, "jobs": 1, "peer_slow_jobs": 1}, "summary": summary}
    table = render(results)
    assert "| outboxq_gc4_50ms | 71.9 |" in table and "| outboxq_gc4_50ms_of_the_80_allowed | 0.90 |" in table


def test_spark_bench_warms_both_engines_and_gives_each_rounds_rows_per_second(db_url):
    # A process of its own: the bench stops its Spark session when it ends.
    # (--no-stream: the streaming query's round is run by test_spark_datasource.py, in its Spark session)
    run = subprocess.run([sys.executable, "-m", "tools", "spark-bench", "--jobs", "300", "--no-stream",
                          "--batch-size", "100", "--rounds", "2", "--master", "local[1]", "--json"],
                         env={**os.environ, "DATABASE_URL": db_url}, cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    results = json.loads(run.stdout)
    assert set(results["median_rows_per_s"]) == {"spark", "plain"}
    assert all(rate > 0 for rate in results["median_rows_per_s"].values())
    assert all(len(times) == spark_bench.WARM_UP_BATCHES for times in results["warm_up_s"].values())
    for runs in results["runs"].values():
        assert len(runs) == 2 and all(set(r["steps_s"]) == {"claim", "process", "deliver"} for r in runs)
    assert "Spark / plain" in results["table"]


def test_the_single_enqueue_driver_on_autocommit_commits_every_call(db_url):
    """`python -m tools bench enqueue --compare` alternates this driver with PgQueuer's single enqueue: each call its
    own transaction, committed as it returns (visible to another connection)."""
    import psycopg

    from tools import bench_drivers

    def written() -> int:
        with psycopg.connect(db_url) as conn:
            return conn.execute("SELECT count(*) FROM outboxq_jobs WHERE queue = %s",
                                (bench_drivers.QUEUE,)).fetchone()[0]

    before = written()
    result = bench_drivers.outboxq_enqueue_single({"url": db_url, "n": 5, "autocommit": True})
    assert result["n"] == 5 and result["jobs_per_s"] > 0
    assert written() - before == 5
