"""The lists (Waiting, Retries, Parked) without a broker: paging, bulk actions on every match or on the
selected rows, errors grouped, the detail pages and the page's wording.

The parked list runs the real :class:`~celery_delayq.web.service.Service` over a parking queue held in
memory (its paging and grouping are the service's); the waiting lists run over the routes' fake service.
The same lists on a real broker and worker, in a browser: ``test_browser.py``.
"""

from __future__ import annotations

import re
from typing import Iterator

import pytest

pytest.importorskip("fastapi")
from celery import Celery  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from celery_delayq.index import TaskNotWaiting  # noqa: E402
from celery_delayq.error_groups import group_errors, message_pattern  # noqa: E402
from celery_delayq.parking import ParkedFilter, ParkedMessage, ParkedMessageNotFound  # noqa: E402
from celery_delayq.parking.replay import ReplayReport  # noqa: E402
from celery_delayq.web import create_app  # noqa: E402
from celery_delayq.web.service import get_service  # noqa: E402
from celery_delayq.web.pages import for_page  # noqa: E402
from celery_delayq.web.service import Service  # noqa: E402
from test_routes import TASK, TOKEN, FakeService, api, fake  # noqa: E402,F401 (fixtures)

NOW = 1_700_000_000.0  # 2023: parked in the past


def _parked(i: int) -> ParkedMessage:
    kind = "builtins.ValueError" if i % 3 else "requests.Timeout"
    text = f"card declined for amount {i}" if i % 3 else f"read timed out after {i} s"
    return ParkedMessage(f"p{i:04d}", NOW + i, "exhausted", "proj.charge", f"t{i:04d}", 3, NOW, NOW + i, kind, text,
                         "Traceback ...", "", "q", headers={"x-delayq-exc-type": kind.encode()}, properties={},
                         body=b"[[1], {}, {}]")


class MemoryParking:
    """A parking queue in memory: what :class:`Service` reads and does on it."""

    def __init__(self, n: int) -> None:
        self.messages = [_parked(i) for i in range(n)]
        self.replayed: list[tuple[list[str], bool]] = []

    def __enter__(self) -> MemoryParking:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def list(self, match: ParkedFilter | None = None, limit: int | None = None) -> list[ParkedMessage]:
        return [m for m in self.messages if match is None or match(m)][:limit]

    def count(self) -> int:
        return len(self.messages)

    def get(self, parked_id: str) -> ParkedMessage:
        found = self.list(ParkedFilter(ids=(parked_id,)))
        if len(found) != 1:
            raise ParkedMessageNotFound(f"no parked message ... {parked_id!r}; run `celery -A APP delayq parking list`")
        return found[0]

    def replay(self, match: ParkedFilter, *, delay: float | None = None, reset_attempts: bool = False) -> ReplayReport:
        chosen = self.list(match)
        self.replayed.append(([m.parked_id for m in chosen], reset_attempts))
        self.messages = [m for m in self.messages if m not in chosen]
        return ReplayReport(replayed=len(chosen))


@pytest.fixture
def parking() -> MemoryParking:
    return MemoryParking(62)


@pytest.fixture
def real(parking: MemoryParking, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    app = Celery("lists", broker="amqp://guest:guest@127.0.0.1:1//")
    svc = Service(app, FakeService().settings)
    monkeypatch.setattr(svc, "parking", lambda: parking)
    monkeypatch.setattr(svc, "_acting", lambda: None)
    web = create_app(app, settings=svc.settings)
    web.dependency_overrides[get_service] = lambda: svc
    yield TestClient(web, headers={"Authorization": f"Bearer {TOKEN}"}, raise_server_exceptions=False)


def _ids(html: str) -> list[str]:
    return re.findall(r'name="parked_id" value="(p\d{4})" form="selected"', html)


# -- 1. paging ---------------------------------------------------------------------------------------
def test_parked_pages_by_offset_and_limit_in_api_and_page(real: TestClient) -> None:
    """``offset`` used to be ignored: ``/parked?offset=50`` showed the first 50 again."""
    doc = real.get("/api/parked", params={"offset": 50}).json()
    assert (doc["total"], doc["matched"], doc["offset"], doc["limit"]) == (62, 62, 50, 50)
    assert [p["parked_id"] for p in doc["items"]] == [f"p{i:04d}" for i in range(50, 62)]
    assert _ids(real.get("/parked", params={"offset": 50}).text) == [f"p{i:04d}" for i in range(50, 62)]
    page = real.get("/parked", params={"offset": 20, "limit": 20}).text
    assert _ids(page) == [f"p{i:04d}" for i in range(20, 40)]
    assert "21–40 of 62" in page and 'aria-current="page">2<' in page
    assert 'href="?offset=40&amp;limit=20"' in page and "last » (4)" in page  # next page and the last
    assert 'href="?offset=0&amp;limit=100"' in page  # page sizes, bookmarkable
    past = real.get("/parked", params={"offset": 500}).text
    assert "past the last one" in past and "Nothing is parked" not in past


def test_waiting_pages_pass_offset_and_limit(api: TestClient, fake: FakeService) -> None:
    page = api.get("/waiting", params={"task": "proj.*", "offset": 50, "limit": 20}).text
    assert fake.calls[0][2] == {"offset": 50, "limit": 20}
    assert 'href="?task=proj.%2A&amp;offset=0&amp;limit=20"' in page  # first, with the filter kept
    api.get("/retries", params={"offset": "x", "limit": 10_000})  # nonsense: the first page, at most page_max
    assert fake.calls[-2][2] == {"offset": 0, "limit": fake.settings.page_max}


# -- 2. bulk actions ---------------------------------------------------------------------------------
def test_replay_all_62_with_reset_attempts_from_the_page(real: TestClient, parking: MemoryParking) -> None:
    page = real.get("/parked").text
    assert "Replay all 62" in page and 'name="expect" value="62"' in page
    r = real.post("/actions/replay", data={"all": "1", "expect": "62", "reset_attempts": "1"}, follow_redirects=False,
                  headers={"Referer": "http://testserver/parked?offset=50"})
    assert r.status_code == 303 and "Replayed+62+parked+tasks%3B+their+retries+start+over" in r.headers["location"]
    assert r.headers["location"].startswith("/parked?offset=50")
    assert len(parking.replayed[0][0]) == 62 and parking.replayed[0][1] is True


def test_replay_of_the_selected_rows_confirms_their_number(real: TestClient, parking: MemoryParking) -> None:
    chosen = ["p0003", "p0010", "p0051"]
    r = real.post("/actions/replay", data={"parked_id": chosen}, follow_redirects=False)
    assert "Replayed+3+parked+tasks." in r.headers["location"]
    assert parking.replayed == [(chosen, False)]
    again = real.post("/actions/replay", data={"parked_id": chosen}, follow_redirects=False)  # gone: nothing done
    assert "failed=1" in again.headers["location"] and "now+matches+0" in again.headers["location"]


def test_api_replay_takes_reset_attempts(api: TestClient, fake: FakeService) -> None:
    body = {"exception": "builtins.ValueError", "message": "card declined for amount *", "dry_run": False,
            "expect": 41, "reset_attempts": True}
    assert api.post("/api/parked/replay", json=body).status_code == 200
    name, (fields,), kwargs = fake.calls[-1]
    assert fields == {"task": None, "exception": "builtins.ValueError", "message": "card declined for amount *",
                      "ids": []}
    assert kwargs["reset_attempts"] is True and kwargs["expect"] == 41
    assert api.post("/api/parked/replay", json={"all": True, "reset_attempts": "yes"}).status_code == 422


def test_move_selected_and_every_match(api: TestClient, fake: FakeService) -> None:
    ids = [f"t-{i}" for i in range(10)]
    r = api.post("/actions/move", data={"task_id": ids, "due": "10m"}, follow_redirects=False)
    assert re.search(r"Moved\+10\+tasks\+to\+20\d\d-.*\+UTC\+%28in\+10\+min%29", r.headers["location"])
    assert fake.calls[-1][:2] == ("move", (ids, "10m"))
    api.post("/actions/move", data={"task_id": ids[:2], "due": "", "now": "1"}, follow_redirects=False)
    assert fake.calls[-1][:2] == ("move", (ids[:2], None))
    r = api.post("/actions/move", data={"error": "TimeoutError", "retries": "1", "expect": "7", "now": "1"},
                 follow_redirects=False)
    name, (fields, due), kwargs = fake.calls[-1]
    assert (name, due, fields["error"], fields["retries"], kwargs["expect"], kwargs["dry_run"]) == (
        "move_matching", None, "TimeoutError", True, 7, False)
    assert "will+run+now" in r.headers["location"]
    assert api.post("/api/waiting/move-selected", json={"ids": ids, "due": "2h"}).json()["done"] == 10
    assert api.post("/api/waiting/move", json={"all": True}).json()["dry_run"] is True


def test_waiting_bulk_buttons_act_on_every_match_not_the_page(api: TestClient) -> None:
    page = api.get("/retries").text
    assert "Run all 1 now" in page and "Move all 1" in page and "Cancel all 1 matching" in page
    assert 'class="select-all"' in page and "Move selected" in page and "Run selected now" in page


# -- 3. grouped by error -----------------------------------------------------------------------------
def test_message_patterns_group_what_differs_only_in_numbers_and_quotes() -> None:
    assert message_pattern("card declined for amount 17") == message_pattern("card declined  for amount -99")
    assert message_pattern("no host '10.0.0.5:5672' (id 4f1c-9a)") == "no host * (id *)"
    groups = group_errors([("ValueError", "amount 1"), ("ValueError", "amount 2"), ("KeyError", "'x'"),
                           ("ValueError", "bad input")])
    assert [(g.exception, g.pattern, g.count) for g in groups] == [
        ("ValueError", None, 3), ("ValueError", "amount *", 2), ("ValueError", "bad input", 1),
        ("KeyError", None, 1), ("KeyError", "*", 1)]


def test_parked_grouped_by_exception_and_one_group_replayed(real: TestClient, parking: MemoryParking) -> None:
    doc = real.get("/api/parked").json()
    assert doc["groups"][:2] == [{"exception": "builtins.ValueError", "pattern": None, "count": 41},
                                 {"exception": "builtins.ValueError", "pattern": "card declined for amount *",
                                  "count": 41}]
    page = real.get("/parked").text
    assert "By exception" in page and "Replay 41" in page and "Replay 21" in page
    r = real.post("/actions/replay", data={"exception": "requests.Timeout", "expect": "21"}, follow_redirects=False)
    assert "Replayed+21+parked+tasks." in r.headers["location"]
    assert {m.exc_type for m in parking.messages} == {"builtins.ValueError"} and len(parking.messages) == 41
    stale = real.post("/actions/replay", data={"exception": "builtins.ValueError", "expect": "40"},
                      follow_redirects=False)
    assert "failed=1" in stale.headers["location"] and len(parking.messages) == 41  # 409: nothing done


def test_retries_grouped_by_error(api: TestClient, fake: FakeService) -> None:
    assert api.get("/api/waiting/groups").json()[0] == {"exception": "ValueError", "pattern": None, "count": 1}
    page = api.get("/retries").text
    assert "By error" in page and "Run 1 now" in page and 'href="?error=ValueError&amp;message=no"' in page
    assert [c[1][0].retries_only for c in fake.calls if c[0] == "error_groups"] == [True, True]


# -- 4. detail pages ---------------------------------------------------------------------------------
def test_waiting_detail_is_linked_and_shows_what_the_index_has(api: TestClient) -> None:
    assert 'href="/waiting/t-1"' in api.get("/waiting").text
    page = api.get("/waiting/t-1").text
    assert "Retry <code>t-1</code>" in page and "ValueError: no" in page and "Passes through the ladder" in page
    assert "x-delayq-entry" in page and "a" * 100 + "…" in page  # arguments cut at body_max
    doc = api.get("/api/waiting/t-1").json()
    assert doc["passes"] == [{"entry": "e-1", "due": TASK.due_iso, "attempt": 1, "last_error": "ValueError: no"}]


def test_a_retrys_detail_shows_its_last_traceback(api: TestClient, fake: FakeService,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    assert "No traceback recorded for this retry" in api.get("/waiting/t-1").text  # an entry written before 1.0
    trace = 'Traceback (most recent call last):\n  File "shop/billing.py", line 12, in charge\nValueError: <no>'
    monkeypatch.setattr(fake, "detail", lambda task_id: (dataclasses.replace(TASK, last_traceback=trace), [TASK]))
    page = api.get("/waiting/t-1").text
    assert "Last traceback" in page and 'File "shop/billing.py", line 12, in charge' in page.replace("&#34;", '"')
    assert "ValueError: &lt;no&gt;" in page  # escaped, never markup
    assert api.get("/api/waiting/t-1").json()["last_traceback"] == trace


def test_replay_from_a_parked_detail_goes_back_to_the_list(real: TestClient) -> None:
    page = real.get("/parked/p0007").text
    assert "Headers" in page and "x-delayq-exc-type" in page and "reset attempts" in page
    r = real.post("/actions/replay", data={"parked_id": "p0007", "expect": "1"}, follow_redirects=False,
                  headers={"Referer": "http://testserver/parked/p0007"})
    assert r.headers["location"].startswith("http://testserver/parked?msg=Replayed+1+parked+task.")
    gone = real.get("/parked/p0007").text
    assert "replayed or deleted" in gone and "celery -A" not in gone
    fake_error = "the index ... is not on the broker: start a worker, or run `celery -A APP delayq topology declare`."
    assert for_page(fake_error).endswith("or run `delayq topology declare` on the command line.")


# -- 5. wording --------------------------------------------------------------------------------------
def test_the_page_speaks_its_own_words(api: TestClient, fake: FakeService, real: TestClient) -> None:
    from celery_delayq.pending.browse import Page

    fake.waiting = lambda match, **kw: Page([], 0, 0, 50, 0.0)  # type: ignore[method-assign]
    empty = api.get("/waiting", params={"args": "1012"}).text
    assert "No waiting task has arguments containing “1012”." in empty and "--args" not in empty
    assert "nothing has failed" in api.get("/retries").text
    parked = real.get("/parked").text
    assert re.search(r"<time [^>]*>20\d\d-\d\d-\d\d \d\d:\d\d:\d\d UTC</time> <small class=\"rel\">\(.* ago\)", parked)
    assert "No parked task has exception “nothing”." in real.get("/parked", params={"exception": "nothing"}).text
    fake.fail = TaskNotWaiting("no task 'nope' is waiting; `delayq pending --id` lists what waits")
    refused = api.post("/actions/cancel", data={"task_id": "nope"}, headers={"Referer": "http://testserver/waiting"},
                       follow_redirects=False).headers["location"]
    assert "failed=1" in refused and "delayq" not in refused
    assert "delayq pending" not in api.get(refused).text
    missing = api.get("/waiting/nope").text
    assert "Task nope is not waiting in the ladder: it ran, was cancelled or moved" in missing
    assert "delayq pending" not in missing


def test_read_only_lists_offer_no_action(fake: FakeService) -> None:
    from dataclasses import replace

    fake.settings = replace(fake.settings, read_only=True)
    web = create_app(Celery("lists", broker="amqp://guest:guest@127.0.0.1:1//"), settings=fake.settings)
    web.dependency_overrides[get_service] = lambda: fake
    client = TestClient(web, headers={"Authorization": f"Bearer {TOKEN}"})
    shown = {"/waiting": "/waiting/t-1", "/retries": "By error", "/waiting/t-1": "Passes through the ladder",
             "/parked": "By exception", "/parked/p-1": "Headers"}
    for path, what in shown.items():
        page = client.get(path).text
        assert what in page and 'method="post"' not in page and "select-all" not in page, path
