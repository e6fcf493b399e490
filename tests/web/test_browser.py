"""The page in a real browser (Debian's Chromium via Playwright), a real broker and a real worker.

Loads each view (and saves a screenshot of it, to ``docs/img/web-*.png`` with
``DELAYQ_UPDATE_SCREENSHOTS=1``),
finds a task by id, cancels one and sees it not run, runs one now and sees it
run once, moves one to a new due time and sees it run once then, and replays a parked task. Skips when Chromium or Playwright is not
installed, except under CI (``./dev`` installs Chromium there).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from celery_delayq import DelayedRetryTask, cancel
from helpers import Collector, running_worker

CHROMIUM = os.environ.get("DELAYQ_CHROMIUM", "/usr/bin/chromium")
DOCS_IMG = Path(__file__).resolve().parents[2] / "docs" / "img"
#: How long a page or an action may take before a step fails (Playwright's default: 30 s). A loaded CI machine's
#: 4.3 leg needed more: a page of waiting tasks, and a move, read the session's shared index of every other test's
#: waiting tasks (8.4 s measured there on a quiet step). What is checked stays what the page shows.
SLOW_PAGE_MS = 120_000


def _need(what: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{what} is missing (./dev installs Chromium: apt-get install chromium)")
    pytest.skip(f"{what} is not installed")


def flash_text(page: Any) -> str:
    """The one-line result of the action just clicked; fails with its text when the page refused it.

    Waits for either kind of result (up to :data:`SLOW_PAGE_MS`): waiting for a good one only would hide a
    refusal behind a timeout."""
    page.wait_for_selector(".flash", timeout=SLOW_PAGE_MS)
    flash = page.locator(".flash").first
    text = flash.inner_text()
    assert "good" in (flash.get_attribute("class") or "").split(), f"the page refused the action: {text}"
    return text


@pytest.fixture
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _need("playwright")
    if not shutil.which(CHROMIUM) and not Path(CHROMIUM).exists():
        _need("chromium")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def served(make_app: Any, uid: str, amqp_conn: Any, tmp_path: Path) -> Iterator[tuple[Any, str]]:
    import uvicorn

    from celery_delayq.web import create_app

    parking = f"park.{uid}"
    app = make_app(delayq_enabled=True, delayq_parking_queue=parking, delayq_telemetry_dir=str(tmp_path / "events"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(app), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 10
    while not server.started and time.time() < deadline:
        time.sleep(0.05)
    try:
        yield app, f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        ch = amqp_conn.channel()
        ch.queue_delete(parking)
        ch.close()


def test_operator_finds_cancels_runs_now_and_replays(served: tuple[Any, str], browser: Any,
                                                      collector: Collector, tmp_path: Path) -> None:
    app, url = served
    # The README's screenshots are refreshed on request only: a test run leaves the checkout as it found it.
    shots = DOCS_IMG if os.environ.get("DELAYQ_UPDATE_SCREENSHOTS") else tmp_path

    @app.task(name=f"{app.main}.report", bind=True)
    def report(self: Any, customer: str) -> None:
        collector.add(kind="report", customer=customer, id=self.request.id)

    @app.task(name=f"{app.main}.charge", bind=True, base=DelayedRetryTask, delayq_park_on=(ValueError,),
              max_retries=3)
    def charge(self: Any, amount: int) -> None:
        collector.add(kind="charge", amount=amount, attempt=self.request.retries)
        if amount < 0 and self.request.retries == 0 and not collector.items[1:]:
            raise self.retry(exc=TimeoutError("card network timed out"), countdown=600)
        if amount < 0 and not self.request.delivery_info.get("redelivered") and len(
                [i for i in collector.items if i.get("amount") == amount]) == 1:
            raise ValueError(f"card declined for amount {amount}")

    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(SLOW_PAGE_MS)
    page.on("dialog", lambda d: d.accept())
    shots.mkdir(parents=True, exist_ok=True)
    with running_worker(app):
        doomed_due = time.time() + 25
        doomed = report.apply_async(("acme-doomed",), countdown=25)
        soon = report.apply_async(("acme-now",), countdown=600)
        others = [report.apply_async((f"customer-{i}",), countdown=900 + 60 * i) for i in range(12)]
        retried = charge.apply_async((-5,), countdown=0)  # fails once: a retry waits, with its error
        parked = charge.apply_async((-7,))  # declined: parked at once
        time.sleep(2)  # the retry and the park happen; index entries linger 0.25 s

        page.goto(url + "/")
        page.wait_for_selector("text=waiting in the ladder")

        # This app's tasks: the session's ladder also holds other tests' (over a thousand in a full run),
        # and the unfiltered list shows the 50 soonest first.
        page.goto(url + f"/waiting?task={app.main}.*")
        assert page.locator(f"text={soon.id}").count() == 1, page.inner_text("body")
        page.screenshot(path=str(shots / "web-waiting.png"), full_page=True)

        page.fill("input[name=id]", doomed.id[:8])  # search by id prefix
        page.click("text=Filter")
        rows = page.locator("table.tasks tbody tr")
        assert rows.count() == 1 and doomed.id in rows.first.inner_text()
        rows.first.locator("button:has-text('Cancel')").click()
        assert "Cancelled 1 task" in flash_text(page)

        page.goto(url + "/waiting?args=acme-now")  # search by argument
        assert page.locator("table.tasks tbody tr").count() == 1
        page.locator("button:has-text('Run now')").click()
        flash_text(page)
        deadline = time.time() + 10
        while time.time() < deadline and not [i for i in collector.items if i.get("customer") == "acme-now"]:
            time.sleep(0.1)

        moved = others[0]  # reschedule: due in 900 s, moved to 3 s from now with the row's own form
        page.goto(url + "/waiting?args=customer-0")
        row = page.locator("table.tasks tbody tr")
        assert row.count() == 1 and moved.id in row.first.inner_text()
        moved_at = time.time()
        row.first.locator("input[name=due]").fill("3s")
        row.first.locator("button:has-text('Move')").click()
        assert f"Task {moved.id} is now due" in flash_text(page)
        deadline = time.time() + 20
        while time.time() < deadline and not [i for i in collector.items if i.get("customer") == "customer-0"]:
            time.sleep(0.1)

        # A task's own page (linked from its row): moved from there, it lists both passes through the ladder.
        later = others[1]
        page.goto(url + "/waiting?args='customer-1'")
        page.click(f"a[href$='/waiting/{later.id}']")
        assert "Passes through the ladder" in page.inner_text("main") and "('customer-1',)" in page.inner_text("pre")
        assert page.locator("table.tasks tbody tr").count() == 1
        page.fill("form[action$='/actions/reschedule'] input[name=due]", "30m")
        page.click("form[action$='/actions/reschedule'] button")
        flash_text(page)
        page.reload()
        assert page.locator("table.tasks tbody tr").count() == 2, page.inner_text("main")

        page.goto(url + "/waiting?id=nothing-like-this")
        assert "No waiting task has id starting with “nothing-like-this”." in page.inner_text("p.empty")

        page.goto(url + "/retries")
        assert "card network timed out" in page.inner_text("table.tasks")
        page.screenshot(path=str(shots / "web-retries.png"), full_page=True)

        page.goto(url + "/parked")
        assert "card declined" in page.inner_text("table.tasks")
        page.screenshot(path=str(shots / "web-parked.png"), full_page=True)
        page.locator("table.tasks tbody tr a").first.click()
        assert "x-delayq-exc-type" in page.inner_text("table.headers")  # its headers
        page.wait_for_selector("text=Traceback")
        page.screenshot(path=str(shots / "web-parked-detail.png"), full_page=True)
        page.locator("button:has-text('Replay')").click()
        assert "Replayed 1 parked task." in flash_text(page)
        assert page.url.split("?")[0].endswith("/parked")  # the list: the message replayed is gone
        deadline = time.time() + 15
        while time.time() < deadline and len([i for i in collector.items if i.get("amount") == -7]) < 2:
            time.sleep(0.1)
        time.sleep(max(0.0, doomed_due + 3 - time.time()))  # past the cancelled task's due time
        from celery_delayq.telemetry import flush_all

        flush_all()
        page.goto(url + "/")
        assert "Deliveries per minute" in page.inner_text("main")
        page.screenshot(path=str(shots / "web-overview.png"), full_page=True)
    ran = [i.get("customer") for i in collector.items if i["kind"] == "report"]
    assert ran.count("acme-now") == 1 and "acme-doomed" not in ran
    assert ran.count("customer-0") == 1, ran  # moved, ran once: the copy due in 900 s was cancelled
    moved_ran = next(i["at"] for i in collector.items if i.get("customer") == "customer-0")
    assert moved_ran >= moved_at + 3 - 0.05, f"the moved task ran {moved_at + 3 - moved_ran:.3f} s early"
    assert len([i for i in collector.items if i.get("amount") == -7]) == 2  # parked, replayed, ran again
    cancel(app, *[o.id for o in others[1:]], retried.id)  # soon ran now: a cancel of it is refused


def _parked_count(app: Any, n: int, timeout: float = 60.0) -> int:
    """Wait until ``n`` messages are parked (or the timeout); how many are."""
    from celery_delayq.parking import ParkingQueue

    deadline = time.time() + timeout
    with ParkingQueue.for_app(app) as pq:
        while (found := pq.count()) != n and time.time() < deadline:
            time.sleep(0.2)
    return found


@pytest.mark.parametrize("width", [1280, 390], ids=["desktop", "phone"])
def test_operator_pages_replays_all_moves_selected_and_replays_one_class(served: tuple[Any, str], browser: Any,
                                                                         collector: Collector, width: int) -> None:
    """62 parked: paged through, all replayed with reset attempts (they fail again and park again), then every
    parked task of one exception class replayed; 10 of 12 waiting tasks selected and moved at once. On a
    desktop and on a phone-width screen (390 px), where the page never scrolls sideways."""
    app, url = served
    failing = {"on": True}

    @app.task(name=f"{app.main}.charge", bind=True, base=DelayedRetryTask, max_retries=1)
    def charge(self: Any, i: int) -> None:
        collector.add(kind="charge", i=i, retries=self.request.retries)
        if failing["on"]:
            exc = KeyError(f"no customer {i}") if i % 3 == 0 else ValueError(f"card declined for amount {i}")
            raise self.retry(exc=exc, countdown=0.2)

    @app.task(name=f"{app.main}.report", bind=True)
    def report(self: Any, n: int) -> None:
        collector.add(kind="report", n=n, id=self.request.id)

    def runs(i: int) -> list[int]:
        return [r["retries"] for r in collector.items if r.get("i") == i]

    page = browser.new_page(viewport={"width": width, "height": 900})
    page.set_default_timeout(SLOW_PAGE_MS)
    page.on("dialog", lambda d: d.accept())

    def fits() -> None:
        assert page.evaluate("document.documentElement.scrollWidth") <= width, page.url

    with running_worker(app):
        for i in range(62):
            charge.delay(i)
        reports = [report.apply_async((n,), countdown=900 + n) for n in range(12)]
        assert _parked_count(app, 62) == 62

        # Paging: 50 a page, then 20 a page; each page shows other messages, the last page the rest.
        page.goto(url + "/parked")
        assert "1–50 of 62 parked" in page.inner_text("nav.pager")
        first = page.locator("input[form=selected]").evaluate_all("boxes => boxes.map(b => b.value)")
        page.click("nav.pager >> text=next ›")
        second = page.locator("input[form=selected]").evaluate_all("boxes => boxes.map(b => b.value)")
        assert (len(first), len(second)) == (50, 12) and not set(first) & set(second)
        page.click("nav.pager .sizes >> text=20")
        page.click("nav.pager >> text=last »")
        assert "61–62 of 62 parked" in page.inner_text("nav.pager") and "limit=20" in page.url
        assert page.locator("table.tasks tbody tr").count() == 2
        fits()

        # Replay all 62 (not the 2 rows shown), attempts reset: each runs twice more, and parks again.
        bar = page.locator(".bulk.all")
        bar.locator("input[name=reset_attempts]").first.check()
        bar.locator("button:has-text('Replay all 62')").click()
        assert "Replayed 62 parked tasks; their retries start over." in flash_text(page)
        assert _parked_count(app, 62) == 62
        assert all(runs(i) == [0, 1, 0, 1] for i in range(62)), [runs(i) for i in range(3)]

        # Move 10 of the 12 waiting reports at once: select every row, clear two, move the rest to 3 s from now.
        page.goto(url + f"/waiting?task={app.main}.report")
        page.check("input.select-all")
        for kept in reports[10:]:
            page.uncheck(f"input[value='{kept.id}']")
        fits()
        page.fill("#selected input[name=due]", "3s")
        moved_at = time.time()
        page.click("#selected >> text=Move selected")
        assert re.search(r"Moved 10 tasks to 20\d\d-\S+ \S+ UTC \(in [\d.]+ s\); each runs once.", flash_text(page))

        # Every parked task of one exception class, in one action (they run once more and succeed).
        failing["on"] = False
        page.goto(url + "/parked")
        group = page.locator("table.groups tr.kind", has_text="builtins.KeyError")
        assert group.locator("td.num").inner_text() == "21"
        fits()
        group.locator("button:has-text('Replay 21')").click()
        assert "Replayed 21 parked tasks." in flash_text(page)
        assert _parked_count(app, 41) == 41
        assert "41 parked" in page.inner_text("main") and "builtins.KeyError" not in page.inner_text("table.groups")
        deadline = time.time() + 30
        while time.time() < deadline and (len([r for r in collector.items if r["kind"] == "report"]) < 10
                                          or any(len(runs(i)) < 5 for i in range(0, 62, 3))):
            time.sleep(0.2)
    ran = [r for r in collector.items if r["kind"] == "report"]
    assert sorted(r["n"] for r in ran) == list(range(10)), ran  # the 10 moved ran once each, the 2 kept did not
    assert min(r["at"] for r in ran) >= moved_at + 3 - 0.05
    assert all(runs(i) == [0, 1, 0, 1, 1] for i in range(0, 62, 3))  # replayed without a reset: one more attempt
    assert all(len(runs(i)) == 4 for i in range(62) if i % 3)  # the other class is still parked
    cancel(app, *[r.id for r in reports[10:]])
