"""The dashboard in a real headless Chromium against `outboxq serve` and a real worker.

Screenshots go to artifacts/screenshots/ (not in git).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psycopg
import pytest
from playwright.sync_api import sync_playwright

from outboxq import enqueue, get_job
from outboxq.queue import limits
from outboxq.queue.jobs import JobStatus
from outboxq.workers.registry import Consumer
from outboxq.workers.runner import Worker
from tests.support import CHROMIUM, CHROMIUM_ARGS, sequence_held_by_a_dead_job, wait_for

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "artifacts" / "screenshots"
TOKEN = "dashboard-test-admin-token"
READ_TOKEN = "dashboard-test-read-only-token"

failing = {"on": True}


def flaky_handler(payload, ctx):
    if failing["on"]:
        raise ConnectionError("downstream is down (dashboard test)")




def serving(db_url, command, prefix=""):
    """Run `command` (with {port} filled in) as the dashboard's server on the test database until it answers
    /healthz under `prefix`; yield its base URL (with the prefix), then stop it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "DATABASE_URL": db_url, "OUTBOXQ_API_TOKENS": f"{TOKEN}:admin,{READ_TOKEN}:read", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([part.format(port=port) for part in command], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}{prefix}"
    try:
        wait_for(lambda: _answers(base + "/healthz"), timeout=30)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=20)


@pytest.fixture
def server(db_url):
    """`outboxq serve`: the dashboard at /ui/."""
    yield from serving(db_url, [sys.executable, "-m", "outboxq.cli", "serve", "--host", "127.0.0.1", "--port", "{port}"])


def _answers(url):
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _signed_in(browser, server, token=TOKEN, **page_options):
    """A new page of the dashboard signed in with `token`, and the console errors it logs from then on."""
    page = browser.new_page(**page_options)
    console_errors: list[str] = []
    page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
    page.goto(server + "/ui/")
    page.fill("#token", token)
    page.click("#sign-in-form button")
    return page, console_errors


def status_of(db_url, job_id):
    with psycopg.connect(db_url) as c:
        return get_job(c, job_id).status


def test_dashboard_shows_queues_retries_a_failed_job_and_pauses_a_queue(db_url, server):
    SHOTS.mkdir(parents=True, exist_ok=True)
    failing["on"] = True
    consumers = [Consumer("ui-flaky", flaky_handler, max_attempts=1),
                 Consumer("ui-paused", lambda payload, ctx: None)]
    with psycopg.connect(db_url) as conn:
        failed_job = enqueue(conn, "ui-flaky", {"order": 7}, key="order-7")
        conn.commit()
    worker = Worker(consumers, url=db_url, poll_interval=0.1).start()
    try:
        wait_for(lambda: status_of(db_url, failed_job.id) is JobStatus.DEAD)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            page = browser.new_page()
            prompt_answers: list[str] = []  # what the next prompts answer; confirmations are accepted
            page.on("dialog", lambda dialog: dialog.accept(prompt_answers.pop(0) if dialog.type == "prompt" else ""))

            page.goto(server + "/ui/")
            page.fill("#token", "wrong-token")
            page.click("#sign-in-form button")
            page.wait_for_selector("text=That token was refused.")
            page.fill("#token", TOKEN)
            page.click("#sign-in-form button")
            page.wait_for_selector("#queues tr[data-queue='ui-flaky']")
            page.wait_for_selector("#throughput-chart")
            page.screenshot(path=str(SHOTS / "queues.png"), full_page=True)
            assert "dead" in page.inner_text("#queues thead")
            assert page.inner_text("#finished-window").endswith("finished in the last 24 h")

            # A failed job's page: its timeline (the attempt, its worker, error and stack, the end); retry it once
            # the downstream is back.
            page.goto(f"{server}/ui/#/jobs/{failed_job.id}")
            page.wait_for_selector("#timeline .event.error details pre", state="attached")
            events = page.locator("#timeline .event").all_inner_texts()
            assert events[0].endswith("enqueued"), events
            failed_event = next(e for e in events if "attempt 1 failed on" in e)
            assert worker.worker_id in failed_event and "downstream is down" in failed_event
            assert "dead: out of attempts" in events[-1]
            page.click("#timeline .event.error summary")
            assert "ConnectionError" in page.inner_text("#timeline .event.error details pre")
            page.screenshot(path=str(SHOTS / "job-dead.png"), full_page=True)
            failing["on"] = False
            page.click("#retry-job")
            page.wait_for_selector("text=Retry job")
            wait_for(lambda: status_of(db_url, failed_job.id) is JobStatus.DONE)
            page.reload()
            page.wait_for_selector("#job-status .status.done")
            page.screenshot(path=str(SHOTS / "job-done.png"), full_page=True)

            # Pause a queue from the dashboard: the worker stops taking its jobs.
            with psycopg.connect(db_url) as conn:
                enqueue(conn, "ui-paused", {"first": True})
                conn.commit()
            page.goto(server + "/ui/#/")
            row = "#queues tr[data-queue='ui-paused']"
            page.wait_for_selector(row)
            page.click(f"{row} button[data-action='pause']")
            page.wait_for_selector(f"{row} button[data-action='resume']")
            with psycopg.connect(db_url) as conn:
                held = enqueue(conn, "ui-paused", {"while": "paused"})
                conn.commit()
            time.sleep(1.0)  # ten poll intervals: a running worker would have taken it by now
            assert status_of(db_url, held.id) is JobStatus.QUEUED
            page.screenshot(path=str(SHOTS / "queue-paused.png"), full_page=True)
            page.click(f"{row} button[data-action='resume']")
            wait_for(lambda: status_of(db_url, held.id) is JobStatus.DONE)

            # Flow control: change a queue's limits from the dashboard (two prompts); its row shows them.
            assert page.inner_text(f"{row} td.limits") == "none"
            prompt_answers.extend(["3", "20/m"])
            page.click(f"{row} button[data-action='limits']")
            page.wait_for_selector(f"{row} td.limits:has-text('limit 3')")
            assert "limit 20/m" in page.inner_text(f"{row} td.limits")
            with psycopg.connect(db_url) as conn:
                stored = limits.load(conn)["ui-paused"]
            assert (stored.global_concurrency, stored.rate_limit) == (3, "20/m")
            page.screenshot(path=str(SHOTS / "queue-limits.png"), full_page=True)
            # A value that is not a number: the API's message is shown and nothing changes.
            prompt_answers.extend(["many", ""])
            page.click(f"{row} button[data-action='limits']")
            page.wait_for_selector("#flash.error")
            assert "global_concurrency" in page.inner_text("#flash")
            with psycopg.connect(db_url) as conn:
                assert limits.load(conn)["ui-paused"].global_concurrency == 3

            # The queue's jobs page and the Spark page load.
            page.goto(server + "/ui/#/queues/ui-paused?status=done")
            page.wait_for_selector("#jobs tbody tr td a")
            page.screenshot(path=str(SHOTS / "queue-jobs.png"), full_page=True)
            page.goto(server + "/ui/#/spark")
            page.wait_for_selector("#spark-batches")
            assert "No streaming query has read outboxq yet." in page.inner_text("#spark-streams")
            browser.close()
    finally:
        worker.stop(timeout=5)


def test_the_api_docs_render_in_a_browser_that_may_reach_nothing_but_the_server(server):
    """Swagger UI at /docs draws the operations with every request outside the server refused."""
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page()
        elsewhere: list[str] = []

        def only_the_server(route):
            if route.request.url.startswith(server):
                route.continue_()
            else:
                elsewhere.append(route.request.url)
                route.abort()

        page.route("**/*", only_the_server)
        page.goto(server + "/docs")
        page.wait_for_selector(".opblock-summary-path[data-path='/v1/queues/{queue}/jobs']", timeout=30_000)
        assert page.locator(".opblock").count() > 10
        assert elsewhere == []
        browser.close()


def test_a_workflow_is_drawn_with_each_steps_state_and_cancelled_from_its_page(db_url, server):
    """The workflows list, a workflow's graph (a box per step, in its status's colour, linking to its job), the
    job page's link back, and the cancel button; no console error on the way."""
    from outboxq import Workflow, get_workflow
    from outboxq.testing import TestQueue
    from outboxq.workers.registry import register

    SHOTS.mkdir(parents=True, exist_ok=True)
    wf = Workflow("ui-order")
    fetch = wf.step("fetch", queue="ui-wf-fetch", payload={"order": 1})
    left = wf.step("left", queue="ui-wf-left", after=[fetch])
    right = wf.step("right", queue="ui-wf-right", after=[(fetch, "run")])
    wf.step("join", queue="ui-wf-join", after=[left, right])
    with psycopg.connect(db_url) as conn:
        workflow_id = wf.enqueue(conn)
        conn.commit()
    register(Consumer("ui-wf-fetch", lambda payload, ctx: {"rows": 2}))
    TestQueue(db_url).run_one("ui-wf-fetch")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        page, console_errors = _signed_in(browser, server)
        page.on("dialog", lambda dialog: dialog.accept())
        page.wait_for_selector("#queues")
        page.click("nav a[href='#/workflows']")
        page.wait_for_selector(f"#workflows a[href='#/workflows/{workflow_id}']")
        assert "running" in page.inner_text("#workflows tbody")
        page.click(f"#workflows a[href='#/workflows/{workflow_id}']")
        page.wait_for_selector("#workflow-graph")
        states = {page.get_attribute(f"#workflow-graph a[data-step='{name}']", "class") for name in ("fetch",)}
        assert states == {"done"}
        assert page.get_attribute("#workflow-graph a[data-step='left']", "class") == "queued"
        assert page.get_attribute("#workflow-graph a[data-step='join']", "class") == "waiting"
        assert page.locator("#workflow-graph path.edge").count() == 4
        assert page.locator("#workflow-graph path.edge.run").count() == 1
        page.screenshot(path=str(SHOTS / "workflow.png"), full_page=True)
        page.click("#workflow-graph a[data-step='join']")
        page.wait_for_selector("#job-workflow")
        assert f"workflow {workflow_id}, step join" in page.inner_text("#job-workflow")
        page.click("#job-workflow")
        page.wait_for_selector("#cancel-workflow")
        page.click("#cancel-workflow")
        page.wait_for_selector("#workflow-status .status.cancelled")
        browser.close()
    assert console_errors == []
    with psycopg.connect(db_url) as conn:
        assert get_workflow(conn, workflow_id).status == "cancelled"


def test_a_job_held_by_a_dead_job_of_its_sequence_says_so_on_its_page(db_url, server):
    with psycopg.connect(db_url) as conn:
        dead, held = sequence_held_by_a_dead_job(conn, "ui-seq", "customer-7")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        page, console_errors = _signed_in(browser, server)
        page.wait_for_selector("#queues")
        page.goto(f"{server}/ui/#/jobs/{held.id}")
        page.wait_for_selector("#job-waiting-reason")
        assert "sequence customer-7" in page.inner_text("#job-sequence")
        reason = page.inner_text("#job-waiting-reason")
        assert "is dead" in reason and str(dead.id) in reason
        browser.close()
    assert console_errors == []


def test_search_with_qualifiers_selects_and_retries_and_the_workers_and_schedules_pages_act(db_url, server):
    """The search box's qualifiers give the URL's results; selected jobs are retried after a confirmation that
    names how many; the workers page lists a live worker; the schedules page runs one now and pauses it."""
    from datetime import timedelta

    from outboxq.workers.periodic import Schedule

    SHOTS.mkdir(parents=True, exist_ok=True)
    with psycopg.connect(db_url) as conn:
        acme = [enqueue(conn, "ui-search", {"customer": "acme", "n": n}, key=f"order-{n}").id for n in range(3)]
        enqueue(conn, "ui-search", {"customer": "globex"}, key="order-9")
        conn.execute("UPDATE outboxq_jobs SET status = 'dead', finished_at = now(), last_error = 'Mailbox full' "
                     "WHERE id = ANY(%s)", (acme,))
        conn.commit()
    worker = Worker([Consumer("ui-tick", lambda payload, ctx: None)], url=db_url, poll_interval=0.1,
                    schedules=[Schedule(name="ui-tick", queue="ui-tick", every=timedelta(hours=1))]).start()
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            page, console_errors = _signed_in(browser, server)
            confirmations: list[str] = []
            page.on("dialog", lambda dialog: (confirmations.append(dialog.message), dialog.accept()))
            page.wait_for_selector("#queues")
            page.goto(server + "/ui/#/jobs")
            page.wait_for_selector("#search")
            page.fill("#search", 'queue:ui-search status:dead payload.customer:acme error:"mailbox"')
            page.click("#search-form button")
            # the unfiltered listing has the same table: wait for the one that answers this search
            page.wait_for_selector("#search-results[data-q*='payload.customer'] tbody input.pick")
            assert "payload.customer" in page.url  # the results are addressable by URL
            shown = [int(t) for t in page.locator("#search-results tbody td:nth-child(2) a").all_inner_texts()]
            assert shown == sorted(acme, reverse=True)
            page.screenshot(path=str(SHOTS / "search.png"), full_page=True)
            page.locator("#search-results input.pick").nth(0).check()
            page.locator("#search-results input.pick").nth(1).check()
            page.click("#retry-selected")
            page.wait_for_selector("#flash:has-text('Retried 2 of 2 jobs')")
            assert confirmations[-1] == "Retry 2 jobs?"
            with psycopg.connect(db_url) as conn:
                assert get_job(conn, acme[2]).status is JobStatus.QUEUED and get_job(conn, acme[0]).status is JobStatus.DEAD
            # the whole filter: only the one acme job still dead matches, and the confirmation says so
            page.click("#cancel-matching")
            page.wait_for_selector("#flash:has-text('Cancelled 1 of 1 matching jobs')")
            assert confirmations[-1] == ('Cancel 1 job matching "queue:ui-search status:dead payload.customer:acme '
                                         'error:"mailbox""?')
            with psycopg.connect(db_url) as conn:
                assert get_job(conn, acme[0]).status is JobStatus.CANCELLED
                assert get_job(conn, acme[2]).status is JobStatus.QUEUED  # not dead: the filter left it

            page.click("nav a[href='#/workers']")
            page.wait_for_selector(f"#workers tr[data-worker='{worker.worker_id}']")
            assert "ui-tick" in page.inner_text(f"#workers tr[data-worker='{worker.worker_id}']")
            page.click("nav a[href='#/schedules']")
            row = "#schedules tr[data-schedule='ui-tick']"
            page.wait_for_selector(row)
            page.click(f"{row} button[data-action='run']")
            wait_for(lambda: _manual_runs(db_url) == 1)
            page.click(f"{row} button[data-action='pause']")
            page.wait_for_selector(f"{row} button[data-action='resume']")
            page.screenshot(path=str(SHOTS / "schedules.png"), full_page=True)
            browser.close()
        assert console_errors == []
    finally:
        worker.stop(timeout=5)


def _manual_runs(db_url):
    with psycopg.connect(db_url) as conn:
        return conn.execute("SELECT count(*) FROM outboxq_jobs WHERE key LIKE 'periodic:ui-tick:manual:%%'").fetchone()[0]


def test_a_queues_page_updates_itself_pauses_on_request_and_follows_the_readers_dark_mode(db_url, server):
    """A job enqueued while a queue's page is open appears without a reload; with updates paused it does not
    until they are resumed; times read "… ago" with the exact time on hover; dark mode follows the system."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    with psycopg.connect(db_url) as conn:
        enqueue(conn, "ui-live", {"n": 0})
        conn.commit()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        page, console_errors = _signed_in(browser, server, color_scheme="dark")
        page.wait_for_selector("#queues")
        page.goto(server + "/ui/#/queues/ui-live")
        page.wait_for_selector("#jobs tbody tr td a")
        assert page.locator("#jobs tbody tr").count() == 1
        created = page.locator("#jobs tbody time").first
        assert created.inner_text() in ("now", "1 s ago", "2 s ago", "3 s ago") or created.inner_text().endswith("s ago")
        assert created.get_attribute("title").endswith("Z")
        with psycopg.connect(db_url) as conn:
            second = enqueue(conn, "ui-live", {"n": 1}).id
            conn.commit()
        page.wait_for_selector(f"#jobs a[href='#/jobs/{second}']", timeout=10_000)  # no reload
        page.click("#live-toggle")
        assert page.inner_text("#live-toggle") == "Resume updates"
        with psycopg.connect(db_url) as conn:
            third = enqueue(conn, "ui-live", {"n": 2}).id
            conn.commit()
        time.sleep(5)  # two and a half refresh intervals: a live page would show it by now
        assert page.locator(f"#jobs a[href='#/jobs/{third}']").count() == 0
        page.click("#live-toggle")
        page.wait_for_selector(f"#jobs a[href='#/jobs/{third}']", timeout=10_000)
        background = page.evaluate("getComputedStyle(document.body).backgroundColor")
        assert background == "rgb(18, 21, 28)", background
        page.screenshot(path=str(SHOTS / "queue-jobs-dark.png"), full_page=True)
        browser.close()
    assert console_errors == []


def test_a_read_only_token_sees_every_page_with_its_actions_disabled(db_url, server):
    with psycopg.connect(db_url) as conn:
        job = enqueue(conn, "ui-readonly", {"n": 1}).id
        conn.commit()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        page, console_errors = _signed_in(browser, server, READ_TOKEN)
        row = "#queues tr[data-queue='ui-readonly']"
        page.wait_for_selector(f"{row} button[data-action='pause'][disabled]")
        assert page.locator(f"{row} button:not([disabled])").count() == 0
        page.goto(f"{server}/ui/#/jobs/{job}")
        page.wait_for_selector("#retry-job[disabled]")
        assert page.get_attribute("#cancel-job", "title") == "needs a token with the admin scope"
        page.goto(f"{server}/ui/#/jobs?q=queue:ui-readonly")
        page.wait_for_selector("#search-results tbody input.pick")
        page.wait_for_selector("#retry-selected[disabled]")  # disabled once the token's scopes are known
        assert page.is_enabled("#search-form button")
        for view in ("workers", "schedules", "workflows", "spark"):
            page.goto(f"{server}/ui/#/{view}")
            page.wait_for_selector(f"#{'spark-batches' if view == 'spark' else view}")
        browser.close()
    assert console_errors == []
