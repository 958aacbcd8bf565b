"""Every view of the dashboard as a person sees it, served by a user's own app under a prefix (/outboxq/ui/):
light and dark screenshots of each (artifacts/screenshots/views/), an accessibility check with axe-core
(no moderate, serious or critical violation), and a job enqueued while its queue's page is open showing up unasked."""

from __future__ import annotations

import sys
from datetime import timedelta

import psycopg
import pytest
from axe_playwright_python.sync_playwright import Axe
from playwright.sync_api import sync_playwright

from outboxq import Workflow, enqueue
from outboxq.queue import limits
from outboxq.workers.periodic import Schedule
from outboxq.workers.registry import Consumer
from outboxq.workers.runner import Worker
from tests.e2e.test_dashboard import SHOTS, _signed_in, serving
from tests.support import CHROMIUM, CHROMIUM_ARGS

PREFIX = "/outboxq"


@pytest.fixture
def prefixed_server(db_url):
    """uvicorn serving tests.prefixed_app (outboxq's router included at /outboxq); the base URL with the prefix."""
    yield from serving(db_url, [sys.executable, "-m", "uvicorn", "tests.prefixed_app:app", "--host", "127.0.0.1",
                                "--port", "{port}"], PREFIX)


def _views(job_id: int, workflow_id: int) -> dict[str, str]:
    """Each view's address (after /ui/) and a selector that shows it has loaded."""
    return {
        "#/": "#queues tr[data-queue='views-mail']",
        "#/queues/views-mail": "#queue-figures #queue-times",
        f"#/jobs/{job_id}": "#retry-job",
        "#/jobs?q=queue:views-mail": "#search-results tbody input.pick",
        "#/workers": "#workers tr[data-worker]",
        "#/limits": "#limits tr[data-queue='views-mail']",
        "#/schedules": "#schedules tr[data-schedule='views-tick']",
        "#/workflows": "#workflows",
        f"#/workflows/{workflow_id}": "#workflow-graph",
        "#/spark": "#spark-streams",
    }


def test_every_view_under_a_prefix_in_light_and_dark_mode_passes_axe(db_url, prefixed_server):
    with psycopg.connect(db_url) as conn:
        job_id = enqueue(conn, "views-mail", {"to": "a@example.com"}, key="order-1").id
        wf = Workflow("views-order")
        first = wf.step("fetch", queue="views-fetch", payload={})
        wf.step("send", queue="views-mail", payload={}, after=[first])
        workflow_id = wf.enqueue(conn)
        conn.commit()
    worker = Worker([Consumer("views-tick", lambda payload, ctx: None)], url=db_url, poll_interval=0.1,
                    schedules=[Schedule(name="views-tick", queue="views-tick", every=timedelta(hours=1))]).start()
    shots = SHOTS / "views"
    shots.mkdir(parents=True, exist_ok=True)
    problems: list[str] = []
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            for scheme in ("light", "dark"):
                page, console_errors = _signed_in(browser, prefixed_server, color_scheme=scheme)
                page.wait_for_selector("#queues")  # signed in
                for address, loaded in _views(job_id, workflow_id).items():
                    page.goto(f"{prefixed_server}/ui/{address}")
                    page.wait_for_selector(loaded)
                    name = address.strip("#/").replace("/", "-").replace("?q=", "-").replace(":", "-") or "queues"
                    page.screenshot(path=str(shots / f"{name}-{scheme}.png"), full_page=True)
                    found = Axe().run(page).response
                    assert len(found["passes"]) > 20  # axe ran its rules on the page
                    for violation in found["violations"]:
                        if violation["impact"] in ("moderate", "serious", "critical"):
                            targets = [node["target"] for node in violation["nodes"]][:3]
                            problems.append(f"{address} ({scheme}): {violation['id']} {violation['help']} {targets}")
                assert console_errors == [], console_errors
                page.close()
            browser.close()
    finally:
        worker.stop(timeout=5)
    assert problems == []


def test_a_job_enqueued_while_its_queue_page_is_open_appears_without_a_reload(db_url, prefixed_server):
    with psycopg.connect(db_url) as conn:
        enqueue(conn, "views-live", {"n": 1})
        conn.commit()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        page, console_errors = _signed_in(browser, prefixed_server)
        page.wait_for_selector("#queues")  # signed in
        page.goto(f"{prefixed_server}/ui/#/queues/views-live")
        page.wait_for_selector("#jobs tbody tr td a")
        with psycopg.connect(db_url) as conn:
            late = enqueue(conn, "views-live", {"n": 2}).id
            conn.commit()
        page.wait_for_selector(f"#jobs a[href='#/jobs/{late}']", timeout=10_000)  # the live refresh brought it
        assert page.url.endswith("#/queues/views-live")
        browser.close()
    assert console_errors == []


def test_the_keyboard_reaches_every_page_and_the_search_box(db_url, prefixed_server):
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        page, console_errors = _signed_in(browser, prefixed_server)
        page.wait_for_selector("#queues")
        for letter, address, loaded in (("w", "#/workers", "#workers"), ("l", "#/limits", "#limits"),
                                        ("c", "#/schedules", "#schedules"),
                                        ("f", "#/workflows", "#workflows"), ("k", "#/spark", "#spark-streams"),
                                        ("q", "#/", "#queues")):
            page.keyboard.press("g")
            page.keyboard.press(letter)
            page.wait_for_selector(loaded)
            assert page.url.endswith(address)
        page.keyboard.press("/")
        page.wait_for_selector("#search:focus")
        page.keyboard.type("queue:none")  # typing in the box is not taken for keys
        assert page.input_value("#search") == "queue:none" and "#/jobs" in page.url
        page.locator("#search").blur()
        page.keyboard.press("?")
        assert "g w workers" in page.inner_text("#flash")
        browser.close()
    assert console_errors == []


def test_the_limits_page_edits_a_queues_limits(db_url, prefixed_server):
    with psycopg.connect(db_url) as conn:
        enqueue(conn, "views-limited", {"n": 1})
        conn.commit()
    answers = ["4", "10/s"]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        page, console_errors = _signed_in(browser, prefixed_server)
        page.on("dialog", lambda dialog: dialog.accept(answers.pop(0)))
        page.wait_for_selector("#queues")
        page.goto(f"{prefixed_server}/ui/#/limits")
        row = "#limits tr[data-queue='views-limited']"
        page.click(f"{row} button[data-action='limits']")
        page.wait_for_selector("#flash:has-text('Limits of views-limited: changed')")
        page.wait_for_selector(f"{row} td:has-text('10/s')")
        assert "4" in page.locator(f"{row} td").nth(2).inner_text() and page.url.endswith("#/limits")
        browser.close()
    assert console_errors == []
    with psycopg.connect(db_url) as conn:
        stored = limits.load(conn)["views-limited"]
    assert (stored.global_concurrency, stored.rate_limit) == (4, "10/s")
