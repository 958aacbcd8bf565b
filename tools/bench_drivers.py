"""Benchmark drivers: one process per run of one queue system (outboxq, PgQueuer or Procrastinate).

`python -m tools bench` starts this file as a script, with outboxq's interpreter for outboxq and with the peers'
separate virtual environment for PgQueuer and Procrastinate, so the peers are never a dependency of
outboxq. The file imports only the standard library at the top and the system under test inside each
driver, so one protocol serves all three:

    python bench_drivers.py '{"system": "pgqueuer", "action": "drain", "url": "...", ...}'

Each run prints JSON lines on stdout ({"event": "ready" | "progress" | "result", ...}) and, for the
actions that wait, reads "go" and "stop" lines on stdin. The parent (tools/bench.py) measures wall time
from "go" to the moment the database says every job is finished, so every system is timed the same way.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from typing import Any

QUEUE = "bench"
PROGRESS_EVERY_S = 0.1


# ---------------------------------------------------------------- protocol helpers


def emit(event: str, **fields: Any) -> None:
    """One JSON line to the parent."""
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


def rss_kb() -> int:
    """The resident set size of this process in KiB (Linux /proc)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class Control:
    """The parent's control lines ("go", "stop"), read by one thread, as events."""

    def __init__(self) -> None:
        self.events = {"go": threading.Event(), "stop": threading.Event()}
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in sys.stdin:
            event = self.events.get(line.strip())
            if event is not None:
                event.set()
        for event in self.events.values():  # stdin closed: the parent is gone
            event.set()

    def wait(self, name: str) -> None:
        """Block until the parent wrote `name`."""
        self.events[name].wait()

    async def wait_async(self, name: str) -> None:
        """Wait for `name` without blocking the event loop."""
        while not self.events[name].is_set():
            await asyncio.sleep(0.02)


_control: Control | None = None


def control() -> Control:
    """The process's one Control (started on first use)."""
    global _control
    if _control is None:
        _control = Control()
    return _control


class Counter:
    """A thread-safe count of handler calls."""

    def __init__(self) -> None:
        self.value = 0
        self._lock = threading.Lock()

    def add(self) -> None:
        """Count one call."""
        with self._lock:
            self.value += 1


def report_progress(counter: Counter, stop: threading.Event) -> None:
    """Print the handled count every PROGRESS_EVERY_S until `stop` (a thread)."""
    while not stop.wait(PROGRESS_EVERY_S):
        emit("progress", handled=counter.value, rss_kb=rss_kb())


def start_progress(counter: Counter) -> threading.Event:
    """Start the progress thread; set the returned event to end it."""
    stop = threading.Event()
    threading.Thread(target=report_progress, args=(counter, stop), daemon=True).start()
    return stop


async def until_stop_or_done(task: asyncio.Task[Any]) -> None:
    """Wait for the parent's "stop", or for the worker task to end (raising its error if it failed)."""
    stop = control().events["stop"]
    while not stop.is_set() and not task.done():
        await asyncio.sleep(0.02)
    if task.done():
        task.result()


# ---------------------------------------------------------------- outboxq


def outboxq_queues(spec: dict[str, Any]) -> list[str]:
    """The queues of a run: QUEUE, or `queues` of them (QUEUE0, QUEUE1...) for the many-queues drain."""
    count = spec.get("queues", 1)
    return [QUEUE] if count == 1 else [f"{QUEUE}{i}" for i in range(count)]


def bench_limit_keys(first: int, count: int, keys: int, key_run: int = 1) -> list[str] | None:
    """The limit keys of jobs `first` to `first + count` of a flow-control drain: they cycle through `keys` keys,
    `key_run` jobs in a row with each (None: no keys)."""
    return [f"k{(first + i) // key_run % keys}" for i in range(count)] if keys else None


def outboxq_fill(spec: dict[str, Any]) -> dict[str, Any]:
    """Enqueue `n` no-op jobs with enqueue_many, `batch` per transaction, spread evenly over the run's queues."""
    import psycopg

    from outboxq.queue.enqueue import enqueue_many

    n, batch, keys, key_run = spec["n"], spec.get("batch", 10_000), spec.get("keys", 0), spec.get("key_run", 1)
    queues = outboxq_queues(spec)
    started = time.perf_counter()
    with psycopg.connect(spec["url"]) as conn:
        for index, queue in enumerate(queues):
            share = n // len(queues) + (1 if index < n % len(queues) else 0)
            for offset in range(0, share, batch):
                count = min(batch, share - offset)
                # (Limit keys given explicitly: no consumer is registered here.)
                enqueue_many(conn, queue, [None] * count, limit_keys=bench_limit_keys(offset, count, keys, key_run))
                conn.commit()
    elapsed = time.perf_counter() - started
    return {"n": n, "seconds": elapsed, "jobs_per_s": n / elapsed}


def outboxq_enqueue_single(spec: dict[str, Any]) -> dict[str, Any]:
    """`n` calls of enqueue + commit on one connection; with spec["autocommit"], of enqueue on an autocommit
    connection (each call its own transaction, one round trip: how the peers' single enqueue runs)."""
    import psycopg

    from outboxq.queue.enqueue import enqueue

    n, autocommit = spec["n"], bool(spec.get("autocommit"))
    with psycopg.connect(spec["url"], autocommit=autocommit) as conn:
        started = time.perf_counter()
        for i in range(n):
            enqueue(conn, QUEUE, {"i": i})
            if not autocommit:
                conn.commit()
        elapsed = time.perf_counter() - started
    return {"n": n, "seconds": elapsed, "jobs_per_s": n / elapsed}


def outboxq_worker(spec: dict[str, Any], handler: Any) -> Any:
    """A Worker with outboxq's default settings (plus any `worker` overrides), a consumer per queue of the run."""
    from outboxq.workers.registry import Consumer
    from outboxq.workers.runner import Worker

    consumers = [Consumer(queue=queue, handler=handler, **spec.get("consumer", {})) for queue in outboxq_queues(spec)]
    worker = Worker(consumers, url=spec["url"], **spec.get("worker", {}))
    # The collector as `outboxq worker` tunes it for its process (a variant's older package may not have it).
    try:
        from outboxq.gc_tuning import tune_collector
    except ImportError:
        pass
    else:
        tune_collector()
    return worker


def thread_cpu_s() -> dict[str, float]:
    """CPU seconds (user + system) of each live thread of this process, by thread name (Linux /proc)."""
    import os

    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        name = names.get(int(tid), f"tid-{tid}")
        # handler threads are many and alike: one line for all of them
        key = "outboxq-handler-*" if name.startswith("outboxq-handler-") else name
        out[key] = out.get(key, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


class ThreadProfiles:
    """cProfile in every thread the worker starts (Worker._spawn and the listener), merged at the end."""

    def __init__(self) -> None:
        self.profiles: list[Any] = []
        self._lock = threading.Lock()

    def wrap(self, target: Any) -> Any:
        import cProfile

        def run(*args: Any, **kwargs: Any) -> Any:
            # the thread's CPU time, not wall time: a thread blocked on a queue or on the database costs
            # nothing here (the server side is sampled separately, from pg_stat_activity)
            profile = cProfile.Profile(time.thread_time)
            with self._lock:
                self.profiles.append(profile)
            profile.enable()
            try:
                return target(*args, **kwargs)
            finally:
                profile.disable()

        return run

    def install(self) -> None:
        from outboxq.workers import listener, runner

        original_spawn = runner.Worker._spawn
        profiles = self

        def spawn(worker: Any, target: Any, name: str) -> None:
            original_spawn(worker, profiles.wrap(target), name)

        runner.Worker._spawn = spawn  # type: ignore[method-assign]
        original_listener_run = listener.Listener._run

        def listener_run(self_: Any) -> None:
            profiles.wrap(original_listener_run)(self_)

        listener.Listener._run = listener_run  # type: ignore[method-assign]

    def report(self, path: str | None, top: int = 25) -> list[dict[str, Any]]:
        """Merge the threads' profiles; save them to `path` (pstats) and return the top functions."""
        import pstats

        if not self.profiles:
            return []
        stats = pstats.Stats(self.profiles[0])
        for profile in self.profiles[1:]:
            stats.add(profile)
        if path:
            stats.dump_stats(path)
        rows = []
        for (filename, line, function), (_cc, calls, tottime, cumtime, _callers) in stats.stats.items():  # type: ignore[attr-defined]
            rows.append({"function": f"{filename.rsplit('/', 2)[-1] if '/' in filename else filename}:{line}"
                                     f"({function})", "calls": calls, "tottime_s": round(tottime, 4),
                         "cumtime_s": round(cumtime, 4)})
        rows.sort(key=lambda r: r["tottime_s"], reverse=True)
        return rows[:top]


def outboxq_drain(spec: dict[str, Any]) -> dict[str, Any]:
    """Run a default worker from "go" until "stop" (with spec["running_at_go"], from before "ready": the
    parent enqueues the jobs at "go"); count handler calls.

    With spec["profile"] == "cprofile", every worker thread runs under cProfile, timed in thread CPU
    seconds (slower: for the shape of the time, not for the rate); the per-thread CPU seconds are
    reported on every run.
    """
    counter = Counter()

    sleep = spec.get("sleep", 0.0)

    def noop(payload: Any) -> None:
        if sleep:
            time.sleep(sleep)
        counter.add()

    profiles = None
    if spec.get("profile") == "cprofile":
        profiles = ThreadProfiles()
        profiles.install()
    worker = outboxq_worker(spec, noop)
    if spec.get("running_at_go"):  # a worker already running, idle, when its jobs are enqueued at "go"
        worker.start()
        if worker.listener is not None:
            worker.listener.ready.wait(10)
        deadline = time.monotonic() + 30
        while not worker.dispatcher.limits_known and time.monotonic() < deadline:  # (declared before the jobs)
            time.sleep(0.01)
        time.sleep(0.5)  # its start-up claims found nothing: the dispatcher waits for a notification
    emit("ready", rss_kb=rss_kb())
    control().wait("go")
    cpu_before = thread_cpu_s()
    progress = start_progress(counter)
    if not spec.get("running_at_go"):
        worker.start()
    control().wait("stop")
    progress.set()
    cpu_after = thread_cpu_s()  # before stop(): the worker's threads are still alive
    end_rss = rss_kb()
    worker.stop(timeout=10)
    thread_cpu = {name: round(cpu - cpu_before.get(name, 0.0), 3) for name, cpu in cpu_after.items()}
    import outboxq

    # (Where the worker's package came from: this checkout's install, or a variant's folder.)
    out = {"handled": counter.value, "rss_kb": end_rss, "stats": worker.stats, "package": outboxq.__path__[0],
           "concurrency": worker.concurrency, "batch_size": worker.batch_size,
           "thread_cpu_s": {k: v for k, v in sorted(thread_cpu.items(), key=lambda kv: -kv[1]) if v > 0}}
    if profiles is not None:
        out["cprofile_top"] = profiles.report(spec.get("profile_path"))
    return out


def outboxq_latency_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """An idle worker that records, per job, the wall time its handler started."""
    started: dict[int, float] = {}

    def record(payload: Any) -> None:
        started[payload["seq"]] = time.time()

    worker = outboxq_worker(spec, record)
    worker.start()
    if worker.listener is not None:
        worker.listener.ready.wait(10)
    time.sleep(0.3)  # let the start-up claims find nothing and the dispatcher go idle
    emit("ready", rss_kb=rss_kb())
    control().wait("stop")
    worker.stop(timeout=5)
    return {"started": started}


def outboxq_latency_enqueue(spec: dict[str, Any]) -> dict[str, Any]:
    """Enqueue one job at a time, `gap_s` apart, recording when each commit returned."""
    import psycopg

    from outboxq.queue.enqueue import enqueue

    committed: dict[int, float] = {}
    with psycopg.connect(spec["url"]) as conn:
        for seq in range(spec["n"]):
            enqueue(conn, QUEUE, {"seq": seq})
            conn.commit()
            committed[seq] = time.time()
            time.sleep(spec["gap_s"])
    return {"committed": committed}


# ---------------------------------------------------------------- PgQueuer


async def _pgqueuer_queries(url: str) -> tuple[Any, Any]:
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries

    conn = await asyncpg.connect(url)
    return conn, Queries(AsyncpgDriver(conn))


async def pgqueuer_setup(spec: dict[str, Any]) -> dict[str, Any]:
    """Install PgQueuer's schema (library defaults: durable tables)."""
    conn, queries = await _pgqueuer_queries(spec["url"])
    await queries.install()
    await conn.close()
    return {}


async def pgqueuer_fill(spec: dict[str, Any]) -> dict[str, Any]:
    """Enqueue `n` jobs with PgQueuer's batch enqueue, `batch` per call."""
    conn, queries = await _pgqueuer_queries(spec["url"])
    n, batch = spec["n"], spec.get("batch", 10_000)
    started = time.perf_counter()
    for offset in range(0, n, batch):
        size = min(batch, n - offset)
        await queries.enqueue([QUEUE] * size, [None] * size, [0] * size)
    elapsed = time.perf_counter() - started
    await conn.close()
    return {"n": n, "seconds": elapsed, "jobs_per_s": n / elapsed}


async def pgqueuer_enqueue_single(spec: dict[str, Any]) -> dict[str, Any]:
    """`n` single-job enqueues on one connection (each its own transaction)."""
    conn, queries = await _pgqueuer_queries(spec["url"])
    n = spec["n"]
    started = time.perf_counter()
    for i in range(n):
        await queries.enqueue(QUEUE, json.dumps({"i": i}).encode())
    elapsed = time.perf_counter() - started
    await conn.close()
    return {"n": n, "seconds": elapsed, "jobs_per_s": n / elapsed}


async def _pgqueuer_run(spec: dict[str, Any], handler: Any, ready: Any) -> None:
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries, QueueManager

    conn = await asyncpg.connect(spec["url"])
    qm = QueueManager(Queries(AsyncpgDriver(conn)))
    qm.entrypoint(QUEUE)(handler)
    await ready()
    run_options = {k: v for k, v in spec.get("worker", {}).items() if k == "batch_size"}
    task = asyncio.create_task(qm.run(**run_options))
    await until_stop_or_done(task)
    qm.shutdown.set()
    await asyncio.wait_for(task, timeout=30)
    await conn.close()


async def pgqueuer_drain(spec: dict[str, Any]) -> dict[str, Any]:
    """One QueueManager (asyncpg) from "go" until "stop"; library defaults unless `worker` overrides."""
    counter = Counter()

    async def noop(job: Any) -> None:
        counter.value += 1  # one event loop thread

    progress: list[threading.Event] = []

    async def ready() -> None:
        emit("ready", rss_kb=rss_kb())
        await control().wait_async("go")
        progress.append(start_progress(counter))

    await _pgqueuer_run(spec, noop, ready)
    for event in progress:
        event.set()
    return {"handled": counter.value, "rss_kb": rss_kb()}


async def pgqueuer_latency_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """An idle QueueManager recording the wall time each job's handler started."""
    started: dict[int, float] = {}

    async def record(job: Any) -> None:
        started[json.loads(job.payload)["seq"]] = time.time()

    async def ready() -> None:
        async def later() -> None:
            await asyncio.sleep(0.5)  # LISTEN set up, first empty dequeue done
            emit("ready", rss_kb=rss_kb())

        asyncio.create_task(later())

    await _pgqueuer_run(spec, record, ready)
    return {"started": started}


async def pgqueuer_latency_enqueue(spec: dict[str, Any]) -> dict[str, Any]:
    """Enqueue one job at a time, `gap_s` apart, recording when each enqueue returned (committed)."""
    conn, queries = await _pgqueuer_queries(spec["url"])
    committed: dict[int, float] = {}
    for seq in range(spec["n"]):
        await queries.enqueue(QUEUE, json.dumps({"seq": seq}).encode())
        committed[seq] = time.time()
        await asyncio.sleep(spec["gap_s"])
    await conn.close()
    return {"committed": committed}


# ---------------------------------------------------------------- Procrastinate


def _procrastinate_app(url: str, handler: Any = None) -> Any:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))
    if handler is not None:
        app.task(name=QUEUE, queue=QUEUE)(handler)
    else:
        async def noop(**kwargs: Any) -> None:
            return None

        app.task(name=QUEUE, queue=QUEUE)(noop)
    return app


async def procrastinate_setup(spec: dict[str, Any]) -> dict[str, Any]:
    """Apply Procrastinate's schema."""
    app = _procrastinate_app(spec["url"])
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
    return {}


async def procrastinate_fill(spec: dict[str, Any]) -> dict[str, Any]:
    """Defer `n` jobs with Procrastinate's batch_defer, `batch` per call."""
    app = _procrastinate_app(spec["url"])
    task = app.tasks[QUEUE]
    n, batch = spec["n"], spec.get("batch", 10_000)
    async with app.open_async():
        started = time.perf_counter()
        for offset in range(0, n, batch):
            await task.batch_defer_async(*({} for _ in range(min(batch, n - offset))))
        elapsed = time.perf_counter() - started
    return {"n": n, "seconds": elapsed, "jobs_per_s": n / elapsed}


async def procrastinate_enqueue_single(spec: dict[str, Any]) -> dict[str, Any]:
    """`n` single defers on one app (each its own transaction)."""
    app = _procrastinate_app(spec["url"])
    task = app.tasks[QUEUE]
    n = spec["n"]
    async with app.open_async():
        started = time.perf_counter()
        for i in range(n):
            await task.defer_async(i=i)
        elapsed = time.perf_counter() - started
    return {"n": n, "seconds": elapsed, "jobs_per_s": n / elapsed}


async def _procrastinate_run(spec: dict[str, Any], handler: Any, ready: Any) -> None:
    app = _procrastinate_app(spec["url"], handler)
    async with app.open_async():
        await ready()
        options = {"install_signal_handlers": False, "queues": [QUEUE], **spec.get("worker", {})}
        task = asyncio.create_task(app.run_worker_async(**options))
        await until_stop_or_done(task)
        task.cancel()
        try:
            await asyncio.wait_for(task, timeout=30)
        except (asyncio.CancelledError, TimeoutError):
            pass


async def procrastinate_drain(spec: dict[str, Any]) -> dict[str, Any]:
    """One Procrastinate worker from "go" until "stop"; defaults unless `worker` overrides (concurrency)."""
    counter = Counter()

    async def noop(**kwargs: Any) -> None:
        counter.value += 1

    progress: list[threading.Event] = []

    async def ready() -> None:
        emit("ready", rss_kb=rss_kb())
        await control().wait_async("go")
        progress.append(start_progress(counter))

    await _procrastinate_run(spec, noop, ready)
    for event in progress:
        event.set()
    return {"handled": counter.value, "rss_kb": rss_kb()}


async def procrastinate_latency_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """An idle Procrastinate worker recording the wall time each job's handler started."""
    started: dict[int, float] = {}

    async def record(seq: int) -> None:
        started[seq] = time.time()

    async def ready() -> None:
        async def later() -> None:
            await asyncio.sleep(0.7)
            emit("ready", rss_kb=rss_kb())

        asyncio.create_task(later())

    await _procrastinate_run(spec, record, ready)
    return {"started": started}


async def procrastinate_latency_enqueue(spec: dict[str, Any]) -> dict[str, Any]:
    """Defer one job at a time, `gap_s` apart, recording when each defer returned (committed)."""
    app = _procrastinate_app(spec["url"])
    task = app.tasks[QUEUE]
    committed: dict[int, float] = {}
    async with app.open_async():
        for seq in range(spec["n"]):
            await task.defer_async(seq=seq)
            committed[seq] = time.time()
            await asyncio.sleep(spec["gap_s"])
    return {"committed": committed}


# ---------------------------------------------------------------- entry point


def main(argv: list[str]) -> int:
    """Run the action of the JSON spec in argv[1] and print its result line."""
    spec = json.loads(argv[1])
    function = globals().get(f"{spec['system']}_{spec['action']}")
    if function is None:
        emit("result", error=f"no driver for {spec['system']} {spec['action']}")
        return 2
    if spec["system"] == "outboxq":
        import logging

        logging.basicConfig(level=logging.WARNING)
    result = function(spec)
    if asyncio.iscoroutine(result):
        try:
            import uvloop

            uvloop.install()
        except ImportError:
            pass
        result = asyncio.run(result)
    emit("result", **result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
