"""The page's shell in a real browser (Debian's Chromium via Playwright) over a real broker and worker.

Served with a token, as off loopback: the browser is sent to the login form, logs in with the token and
out again; a waiting task leaves the Waiting list on its own when it runs (no reload); the overview's
lateness chart draws the worker's deliveries; at 390 px no page scrolls sideways, and the keyboard and
the dark scheme work. Saves screenshots (``docs/img/web-login.png``, ``web-dark-overview.png``,
``web-390-*.png``) with ``DELAYQ_UPDATE_SCREENSHOTS=1``.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from celery_delayq import DelayedRetryTask, cancel
from helpers import Collector, running_worker
from test_browser import DOCS_IMG, flash_text, browser  # noqa: F401 - the fixture
from web_live import serve

TOKEN = "shell-token-" + "s" * 16
NARROW = {"width": 390, "height": 844}
WIDE = {"width": 1280, "height": 900}


@pytest.fixture
def served(make_app: Any, uid: str, amqp_conn: Any, tmp_path: Path) -> Iterator[tuple[Any, str]]:
    from celery_delayq.web import WebSettings, create_app

    parking = f"park.{uid}"
    app = make_app(delayq_enabled=True, delayq_parking_queue=parking, delayq_telemetry_dir=str(tmp_path / "events"))
    try:
        with serve(create_app(app, settings=WebSettings(token=TOKEN))) as url:
            yield app, url
    finally:
        ch = amqp_conn.channel()
        ch.queue_delete(parking)
        ch.close()


def _log_in(page: Any, url: str, path: str) -> None:
    page.goto(url + path)
    page.wait_for_selector("input[name=token]")  # sent to the form, not a 401
    assert "/login?next=" in page.url, page.url
    page.fill("input[name=token]", TOKEN)
    page.keyboard.press("Enter")
    page.wait_for_url(lambda u: "/login" not in u)  # the form's answer: back to the page asked for
    assert page.url.startswith(url + path.split("?")[0]), page.url


def _wait(page: Any, expression: str, timeout: float = 15.0) -> None:
    """Wait until ``expression`` is true in the page (``wait_for_function`` evaluates a string, which the
    page's Content-Security-Policy refuses, and the test keeps that policy on)."""
    deadline = time.time() + timeout
    while not page.evaluate(expression):
        assert time.time() < deadline, f"not true within {timeout} s: {expression}"
        time.sleep(0.1)


def _chart_drawn(page: Any, errors: list[str]) -> None:
    """Wait for the lateness chart's canvas; say what the page had if it does not come."""
    try:
        _wait(page, "!!document.querySelector('#chart-lateness canvas')", timeout=20)
    except AssertionError:
        state = page.evaluate("({uplot: typeof uPlot, note: (document.querySelector('[data-chart-note]') || {})"
                              ".textContent, ready: document.readyState, url: location.href})")
        raise AssertionError(f"no chart: {state}, script errors {errors}") from None
    assert not errors, errors


def _no_sideways_scroll(page: Any, what: str) -> None:
    width = page.evaluate("document.documentElement.scrollWidth")
    if width > NARROW["width"]:  # name what sticks out, outermost first
        wide = page.evaluate("""() => [...document.querySelectorAll('main *')].filter(e => {
            const r = e.getBoundingClientRect(); return r.right > 391 && !e.closest('table *');
          }).slice(0, 6).map(e => e.tagName + '.' + e.className + ' ' + Math.round(e.getBoundingClientRect().right))""")
        raise AssertionError(f"{what}: the page is {width} px wide at 390 px: {wide}")


def test_log_in_watch_a_task_leave_charts_narrow_dark_and_log_out(served: tuple[Any, str], browser: Any,  # noqa: F811
                                                                  collector: Collector, tmp_path: Path) -> None:
    from celery_delayq.telemetry import flush_all

    app, url = served
    shots = DOCS_IMG if os.environ.get("DELAYQ_UPDATE_SCREENSHOTS") else tmp_path
    shots.mkdir(parents=True, exist_ok=True)

    @app.task(name=f"{app.main}.report", bind=True)
    def report(self: Any, customer: str) -> None:
        collector.add(kind="report", customer=customer, id=self.request.id)

    @app.task(name=f"{app.main}.charge", base=DelayedRetryTask, delayq_park_on=(ValueError,))
    def charge(amount: int) -> None:
        collector.add(kind="charge", amount=amount)
        raise ValueError(f"card declined for amount {amount}")

    later = [report.apply_async((f"later-{i}",), countdown=900 + 60 * i) for i in range(3)]
    # The task that must appear on its own and then leave when it runs: published first, due late enough
    # that a loaded CI machine lists it before it runs (its appearance waits for the next kept list: its
    # ttl, a whole read of the session's shared index, then a poll; a few seconds on a quiet machine).
    leaving_countdown = 45.0
    leaving = report.apply_async(("leaving",), countdown=leaving_countdown)
    leaving_due = time.time() + leaving_countdown
    context = browser.new_context(viewport=WIDE, timezone_id="Europe/Berlin")
    try:
        page = context.new_page()
        page.on("dialog", lambda d: d.accept())
        script_errors: list[str] = []  # the script and uPlot under the page's CSP: none
        page.on("pageerror", lambda e: script_errors.append(str(e)))
        page.on("console", lambda m: script_errors.append(m.text) if m.type == "error" else None)
        with running_worker(app):
            for i in range(3):  # deliveries with a lateness, for the chart
                report.apply_async((f"early-{i}",), countdown=1)
            charge.delay(-7)  # parked at once: the Parked pages have a row
            collector.wait_for(4, timeout=30)
            flush_all()

            # -- log in: the form, then the page asked for --------------------------------------
            _log_in(page, url, f"/waiting?task={app.main}.*")

            # -- a waiting task leaves the list on its own when it runs ----------------------------
            listed_within = leaving_due - time.time() - 2.0
            assert listed_within > 5, f"the page opened {listed_within:.0f} s before the task is due: too late to see it"
            page.wait_for_selector(f"text={leaving.id}", timeout=listed_within * 1000)
            page.evaluate("window.__sameDocument = true")
            _wait(page, f"!document.querySelector('main').innerText.includes('{leaving.id}')",
                  timeout=leaving_due - time.time() + 25)
            gone_at = time.time()
            assert page.evaluate("window.__sameDocument === true"), "the page was reloaded"
            ran = [i["at"] for i in collector.items if i.get("customer") == "leaving"]
            assert ran, "it left the list without running"
            print(f"\nleft the page {gone_at - ran[0]:.2f} s after it ran")
            # A quiet machine: 2-3 s. A loaded CI run re-reads the session's shared index (every other test's
            # waiting tasks) before the poll sees the change: 8.4 s measured there, hence the bound.
            assert gone_at - ran[0] < 15.0
            age = page.inner_text("[data-live-age]")
            assert re.search(r"· (\d+) s old", age) and int(re.search(r"(\d+) s old", age).group(1)) <= 10, age
            assert all(t.id in page.inner_text("main") for t in later)  # the rest stays

            # -- an action from the page, logged in by the cookie: its form carries the CSRF token ------
            page.locator("table.tasks tbody tr", has_text=later[2].id).locator("button:has-text('Cancel')").click()
            assert "ancelled 1 task" in flash_text(page)

            # -- pause: nothing is fetched while paused ---------------------------------------------
            page.click("[data-live-toggle]")
            assert page.inner_text("[data-live-label]") == "paused"
            page.click("[data-live-toggle]")

            # -- the overview's charts ----------------------------------------------------------------
            page.goto(url + "/")
            _chart_drawn(page, script_errors)
            _wait(page, "Number(document.querySelector('#chart-lateness').dataset.points) > 0")
            series = page.evaluate(f"fetch('{url}/api/series?window=1h').then(r => r.json())")
            assert series["available"] and any(v is not None for v in series["lateness_p99_s"]), series
            assert sum(series["counts"]["delivered"]) >= 3 and sum(series["counts"]["scheduled"]) >= 3
            painted = page.evaluate("""() => { const c = document.querySelector('#chart-lateness canvas');
                const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; let n = 0;
                for (let i = 3; i < d.length; i += 4) { if (d[i] > 0) { n++; } } return n; }""")
            assert painted > 500, painted  # axes, grid and the lines drawn
            page.click("[data-window='24h']")
            _wait(page, "document.querySelector(\"[data-window='24h']\").getAttribute('aria-pressed') === 'true'")
            page.click("[data-window='1h']")
            # times: UTC, then the browser's zone on request, remembered
            assert page.inner_text("p.sub time").endswith("UTC")
            page.click("[data-tz-toggle]")
            assert not page.inner_text("p.sub time").endswith("UTC")  # Europe/Berlin: GMT+1 or CET
            assert re.fullmatch(r"\((now|\d+ s ago)\)", page.inner_text("p.sub .rel")), page.inner_text("p.sub .rel")
            page.reload()
            assert page.inner_text("[data-tz-toggle]") == "Local time"
            page.goto(url + f"/waiting?task={app.main}.*")  # the lists' times follow the choice
            due = page.locator("table.tasks time").first
            assert not due.inner_text().endswith("UTC") and due.get_attribute("title").endswith("UTC"), due.inner_text()
            page.goto(url + "/")
            page.click("[data-tz-toggle]")
            _wait(page, "Number(document.querySelector('#chart-lateness').dataset.points) > 0")
            page.screenshot(path=str(shots / "web-overview.png"), full_page=True)

            # -- 390 px: no page scrolls sideways; the telemetry does not overlap the levels -----------
            parked_id = page.evaluate(f"fetch('{url}/api/parked').then(r => r.json())")["items"][0]["parked_id"]
            narrow = browser.new_context(viewport=NARROW, is_mobile=True, has_touch=True)
            try:
                small = narrow.new_page()
                small.on("pageerror", lambda e: script_errors.append(str(e)))
                small.on("console", lambda m: script_errors.append(m.text) if m.type == "error" else None)
                _log_in(small, url, "/")
                for path, name in (("/", "overview"), (f"/waiting?task={app.main}.*", "waiting"),
                                   ("/retries", "retries"), ("/parked", "parked"), (f"/parked/{parked_id}", None),
                                   (f"/waiting/{later[0].id}", None),
                                   ("/waiting?id=nothing-like-this", None)):
                    small.goto(url + path)
                    small.wait_for_selector("main")
                    if path == "/":
                        _chart_drawn(small, script_errors)
                        tele = small.locator("section.telemetry").bounding_box()
                        levels = small.locator("table.ladder").bounding_box()
                        assert tele["y"] + tele["height"] <= levels["y"] or levels["y"] + levels["height"] <= tele["y"]
                    _no_sideways_scroll(small, path)
                    if name:
                        small.screenshot(path=str(shots / f"web-390-{name}.png"), full_page=True)
                # a wide table scrolls in its own box, its actions reachable
                small.goto(url + f"/waiting?task={app.main}.*")
                box = small.locator("table.tasks")
                assert box.evaluate("t => t.scrollWidth > t.clientWidth && getComputedStyle(t).overflowX === 'auto'")
                small.locator("table.tasks button:has-text('Run now')").first.scroll_into_view_if_needed()
                assert small.locator("table.tasks button:has-text('Run now')").first.is_visible()
                # the keyboard: the first Tab reaches the skip link, with a visible focus ring
                small.keyboard.press("Tab")
                focus = small.evaluate("({cls: document.activeElement.className, "
                                       "ring: getComputedStyle(document.activeElement).outlineStyle})")
                assert focus == {"cls": "skip", "ring": "solid"}, focus
                small.goto(url + "/login")
                _no_sideways_scroll(small, "/login")
            finally:
                narrow.close()

            # -- the browser's dark scheme --------------------------------------------------------------
            dark = browser.new_context(viewport=WIDE, color_scheme="dark")
            try:
                night = dark.new_page()
                night.goto(url + "/login")
                night.screenshot(path=str(shots / "web-login.png"))
                _log_in(night, url, "/")
                _chart_drawn(night, [])
                rgb = night.evaluate("getComputedStyle(document.body).backgroundColor")
                assert sum(int(v) for v in re.findall(r"\d+", rgb)[:3]) < 150, rgb
                panel = night.evaluate("getComputedStyle(document.querySelector('table')).backgroundColor")
                assert sum(int(v) for v in re.findall(r"\d+", panel)[:3]) < 200, panel
                _wait(night, "Number(document.querySelector('#chart-lateness').dataset.points) > 0")
                night.screenshot(path=str(shots / "web-dark-overview.png"), full_page=True)
            finally:
                dark.close()

            # -- log out: the cookie is gone, the form again ---------------------------------------------
            page.goto(url + "/waiting")
            page.click("header button:has-text('Log out')")
            page.wait_for_selector("input[name=token]")
            page.goto(url + "/waiting")
            assert "/login?next=%2Fwaiting" in page.url
            assert page.evaluate(f"fetch('{url}/api/changes').then(r => r.status)") == 401
    finally:
        context.close()
        cancel(app, *[t.id for t in later[:2]])  # the third was cancelled from the page
