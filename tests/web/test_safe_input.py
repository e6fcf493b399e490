"""Wrong input to the API and the page changes nothing (issue 31): due times, ids, bulk selections, strict
booleans, body limits, malformed forms, the audit line, the token minimum.

Real broker: the tasks and parked messages a refusal must leave alone are really in the ladder and the
parking queue, and each test reads them back after the refusal.
"""

from __future__ import annotations

import base64
import logging
import time
from typing import Any, Iterator

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

import celery_delayq  # noqa: E402
from celery_delayq import pending  # noqa: E402
from celery_delayq.audit import LOGGER, token_fingerprint  # noqa: E402
from celery_delayq.web import WeakSecret, WebSettings, create_app  # noqa: E402
from retry_helpers import park_synthetic, parking_name_fixture  # noqa: E402,F401
from web_live import serve  # noqa: E402

TOKEN = "a-token-of-24-characters"
BEARER = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def app(make_app: Any, parking_name: str) -> Any:
    app = make_app(delayq_enabled=True, delayq_parking_queue=parking_name, delayq_parking_queue_type="classic",
                   delayq_max_delay=3600)
    celery_delayq.install(app).publisher.declare()
    return app


@pytest.fixture
def api(app: Any) -> TestClient:
    return TestClient(create_app(app, settings=WebSettings(token=TOKEN)), headers=BEARER)


@pytest.fixture
def waiting(app: Any, uid: str) -> Iterator[list[Any]]:
    """Three tasks of this test waiting 20 minutes (cancelled afterwards if still there)."""
    def job(tag: str) -> None:
        pass

    task = app.task(name=f"{app.main}.job")(job)
    sent = [task.apply_async((f"safe-{uid}-{i}",), countdown=1200) for i in range(3)]
    yield sent
    left = [t.task_id for t in pending(app, task=task.name)]
    if left:
        celery_delayq.cancel(app, *left)


def _dues(app: Any) -> dict[str, float]:
    return {t.task_id: t.due for t in pending(app, task=f"{app.main}.*")}


@pytest.mark.parametrize("due,status,says", [
    ("", 400, "due: empty"),
    ("   ", 400, "due: empty"),
    ("-5m", 400, "run-now"),
    ("2000-01-01T00:00:00", 400, "run-now"),
    ("1000000000", 400, "run-now"),  # epoch seconds of 2001
    ("99999999999999999999", 400, "1970-9999"),  # was a 500 (OverflowError)
    ("soonish", 400, "due:"),
    ("2h", 422, "delayq_max_delay"),  # beyond the app's limit: DelayTooLong
])
def test_a_bad_due_time_is_refused_and_the_task_stays(app: Any, api: TestClient, waiting: list[Any], due: str,
                                                      status: int, says: str) -> None:
    before = _dues(app)
    r = api.post(f"/api/waiting/{waiting[0].id}/reschedule", json={"due": due})
    assert r.status_code == status, r.text
    assert says in r.json()["error"] and r.json()["status"] == status
    assert _dues(app) == before  # not run, not moved


def test_ids_and_strict_booleans(app: Any, api: TestClient, waiting: list[Any]) -> None:
    before = _dues(app)
    for path in ("/api/waiting/%20/cancel", "/api/waiting/%07bell/run-now", "/api/waiting/" + "x" * 300):
        method = "GET" if path.count("/") == 3 else "POST"
        r = api.request(method, path)
        assert r.status_code in (400, 422) and r.json()["error"], (path, r.text)
    for body in ({"args": "safe-", "dry_run": "false", "expect": 3}, {"all": "true"},
                 {"args": "safe-", "retries": "false"}, {"args": "safe-", "dry_run": False, "expect": "3"}):
        r = api.post("/api/waiting/cancel", json=body)
        assert r.status_code == 422 and r.json()["error"], (body, r.text)
    for body in ({"all": True, "dry_run": "false"}, {"ids": ["x"], "delay": True}):
        assert api.post("/api/parked/replay", json=body).status_code == 422, body
    assert _dues(app) == before


def test_bulk_cancel_needs_a_selection_and_the_count_now(app: Any, api: TestClient, waiting: list[Any],
                                                          uid: str, caplog: pytest.LogCaptureFixture) -> None:
    before = _dues(app)
    refused = [
        ({"dry_run": False, "expect": 3}, 400, "no filter"),  # used to cancel every waiting task
        ({"all": True, "args": uid, "dry_run": False, "expect": 3}, 400, "cannot be combined"),
        ({"args": uid, "dry_run": False}, 400, "expect"),
        ({"args": uid, "dry_run": False, "expect": 2}, 409, "now matches 3"),
        ({"args": uid, "dry_run": False, "expect": -1}, 422, "expect"),
    ]
    with caplog.at_level(logging.INFO, logger=LOGGER):
        for body, status, says in refused:
            r = api.post("/api/waiting/cancel", json=body)
            assert r.status_code == status and says in r.json()["error"], (body, r.text)
    assert _dues(app) == before
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert any("action=cancel-matching" in line and "refused=" in line and "now matches 3" in line
               for line in lines), lines
    # the refused empty filter is audited as no filter, not as "all"
    assert any("filter=none" in line and "no filter" in line for line in lines), lines
    dry = api.post("/api/waiting/cancel", json={"args": uid}).json()
    assert (dry["matched"], dry["done"], dry["dry_run"]) == (3, 0, True)
    assert api.post("/api/waiting/cancel", json={"all": True}).json()["matched"] >= 3  # a dry run of all: counts
    done = api.post("/api/waiting/cancel", json={"args": uid, "dry_run": False, "expect": 3}).json()
    assert done["done"] == 3 and not _dues(app)


def test_parked_bulk_needs_a_selection_and_the_count_now(app: Any, api: TestClient, broker_url: str,
                                                          parking_name: str, amqp_conn: Any, uid: str) -> None:
    dest = f"dest.{uid}"
    ch = amqp_conn.channel()
    ch.queue_declare(dest, auto_delete=False)
    try:
        ids = park_synthetic(broker_url, parking_name, 3, task=f"{app.main}.p", exc=ValueError("no"), dest=dest)
        for path in ("/api/parked/replay", "/api/parked/delete"):
            for body, status, says in [({"dry_run": False, "expect": 3}, 400, "no filter"),
                                       ({"all": True, "task": "*", "dry_run": False, "expect": 3}, 400, "cannot"),
                                       ({"all": True, "dry_run": False}, 400, "expect"),
                                       ({"all": True, "dry_run": False, "expect": 2}, 409, "now matches 3")]:
                r = api.post(path, json=body)
                assert r.status_code == status and says in r.json()["error"], (path, body, r.text)
        for delay, status in (("-5m", 400), (-1, 400), ("soon", 400), ("2h", 422), ("", 400)):
            r = api.post("/api/parked/replay", json={"all": True, "dry_run": False, "expect": 3, "delay": delay})
            assert r.status_code == status, (delay, r.text)
        listed = api.get("/api/parked").json()
        assert (listed["total"], listed["matched"]) == (3, 3)  # nothing replayed, nothing deleted
        assert ch.queue_declare(dest, passive=True).message_count == 0
        assert api.post("/api/parked/replay", json={"ids": ids[:1]}).json()["matched"] == 1  # dry run
        done = api.post("/api/parked/replay", json={"ids": ids[:1], "dry_run": False, "expect": 1,
                                                    "delay": 0}).json()
        assert done["done"] == 1
        gone = api.post("/api/parked/delete", json={"all": True, "dry_run": False, "expect": 2}).json()
        assert gone["done"] == 2 and api.get("/api/parked").json()["total"] == 0
        deadline = time.time() + 5
        while ch.queue_declare(dest, passive=True).message_count < 1 and time.time() < deadline:
            time.sleep(0.1)
        assert ch.queue_declare(dest, passive=True).message_count == 1  # the one replayed, now
    finally:
        ch.queue_delete(dest)
        ch.close()


def test_page_forms_go_through_the_same_checks(app: Any, waiting: list[Any], uid: str, broker_url: str,
                                               parking_name: str) -> None:
    client = TestClient(create_app(app), follow_redirects=False)
    client.get("/parked")
    token = client.cookies["delayq_csrf"]
    before = _dues(app)

    def post(path: str, **data: Any) -> str:
        r = client.post(path, data={"csrf_token": token, **data}, headers={"referer": "/waiting"})
        assert r.status_code == 303, r.text
        return r.headers["location"]

    assert "failed=1" in post("/actions/reschedule", task_id=waiting[0].id, due="-5m")
    assert "run-now" in post("/actions/reschedule", task_id=waiting[0].id, due="")
    assert "failed=1" in post("/actions/cancel-matching", expect="3")  # no filter, no all
    assert "failed=1" in post("/actions/cancel-matching", args=uid, expect="2")
    assert "failed=1" in post("/actions/cancel-matching", args=uid, expect="three")
    assert "failed=1" in post("/actions/cancel", task_id="\x07")
    assert _dues(app) == before
    park_synthetic(broker_url, parking_name, 2, task=f"{app.main}.p", exc=ValueError("no"), dest=f"nowhere.{uid}")
    page = client.get("/parked").text
    assert 'name="all" value="1"' in page and 'name="expect" value="2"' in page  # no filter: all, the count shown
    assert "failed=1" in post("/actions/delete-parked", expect="2")  # the page's button sends all; this did not
    assert "failed=1" in post("/actions/replay", expect="2", all="1", delay="-1")
    assert client.get("/api/parked").json()["total"] == 2
    assert "failed=1" not in post("/actions/delete-parked", expect="2", all="1")
    assert client.get("/api/parked").json()["total"] == 0


def test_every_action_logs_one_audit_line(app: Any, waiting: list[Any], caplog: pytest.LogCaptureFixture) -> None:
    """Who: the token's fingerprint, user:NAME for basic auth, loopback unauthenticated; via api or page."""
    basic = WebSettings(username="operator", password="a-password-of-24-chars!!")
    with caplog.at_level(logging.INFO, logger=LOGGER):
        api = TestClient(create_app(app, settings=WebSettings(token=TOKEN)), headers=BEARER)
        assert api.post(f"/api/waiting/{waiting[0].id}/cancel").status_code == 200
        page = TestClient(create_app(app, settings=basic), follow_redirects=False, headers={
            "Authorization": "Basic " + base64.b64encode(b"operator:a-password-of-24-chars!!").decode()})
        page.get("/parked")
        r = page.post("/actions/run-now", data={"task_id": waiting[1].id, "csrf_token": page.cookies["delayq_csrf"]})
        assert r.status_code == 303 and "failed" not in r.headers["location"]
        local = TestClient(create_app(app), client=("127.0.0.1", 40000))
        local.get("/parked")
        r = local.post(f"/api/waiting/{waiting[2].id}/reschedule", json={"due": "-5m"},
                       headers={"X-CSRF-Token": local.cookies["delayq_csrf"]})
        assert r.status_code == 400
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(lines) == 3, lines
    cancelled, ran, refused = lines
    assert f"who={token_fingerprint(TOKEN)} via=api action=cancel ids=1 [{waiting[0].id}]" in cancelled
    assert TOKEN not in cancelled
    assert f"who=user:operator via=page action=run-now ids=1 [{waiting[1].id}]" in ran
    assert f"who=loopback via=api action=reschedule ids=1 [{waiting[2].id}]" in refused
    assert "refused=" in refused and "run-now" in refused


# -- the body limit and malformed forms ----------------------------------------------------------
def test_a_body_over_the_limit_is_refused_before_it_is_read(app: Any) -> None:
    import httpx

    asgi = create_app(app, settings=WebSettings(token=TOKEN, body_limit=4096))
    client = TestClient(asgi, headers=BEARER)
    r = client.post("/api/waiting/cancel", content=b"{" + b" " * 5000 + b"}",
                    headers={"content-type": "application/json"})
    assert r.status_code == 413 and "delayq_web_body_limit" in r.json()["error"]
    sent = 0

    def chunks() -> Iterator[bytes]:  # no Content-Length: chunked, counted while it streams
        nonlocal sent
        for _ in range(100_000):  # 100 MB if it were all read
            sent += 1024
            yield b" " * 1024

    with serve(asgi) as url:
        with httpx.Client(headers=BEARER, timeout=30) as http:
            try:
                r = http.post(url + "/api/waiting/cancel", content=chunks(),
                              headers={"content-type": "application/json"})
                assert r.status_code == 413, r.text
            except httpx.HTTPError:
                pass  # the server answered and closed while the client was still sending: also a refusal
    assert sent < 100_000 * 1024  # the server stopped it long before the end
    ok = client.post("/api/waiting/cancel", json={"all": True})
    assert ok.status_code == 200  # under the limit: served


def test_body_limit_counts_a_chunked_body_without_reading_past_it() -> None:
    """Pure ASGI: the app behind is never called and no chunk past the limit is asked for."""
    import asyncio

    from celery_delayq.web.security import BodyLimit

    called: list[bool] = []
    pulled = 0

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        called.append(True)

    async def receive() -> dict[str, Any]:
        nonlocal pulled
        pulled += 1
        return {"type": "http.request", "body": b"x" * 1000, "more_body": True}

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/api/waiting/cancel", "headers": [], "query_string": b""}
    asyncio.run(BodyLimit(inner, limit=10_000)(scope, receive, send))
    assert not called and pulled == 11 and sent[0]["status"] == 413


@pytest.mark.parametrize("content_type,body,status", [
    ("multipart/form-data; boundary=xyz", b"--xyz\r\nContent-Disposition: form-data\r\n\r\nno name\r\n--xyz--\r\n",
     400),
    ("multipart/form-data", b"--xyz\r\n\r\n", 400),  # no boundary
    ("multipart/form-data; boundary=xyz", b"--xyz\r\nContent-Type: text/plain\r\n\r\nx\r\n--xyz--\r\n", 400),
    ("multipart/form-data; boundary=xyz", b"--xyz\r\nContent-Disposition: form-data; name=\"csrf_token\"\r\n\r\n"
     + b"a" * (1024 * 1024 + 10) + b"\r\n--xyz--\r\n", 413),  # a field over 1 MB: was a 500 with a traceback
])
def test_a_malformed_form_is_a_400_without_a_traceback(app: Any, content_type: str, body: bytes, status: int,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    client = TestClient(create_app(app), raise_server_exceptions=False)
    with caplog.at_level(logging.DEBUG):
        r = client.post("/actions/cancel", content=body, headers={"content-type": content_type})
    assert r.status_code == status, r.text
    assert ("malformed form body" if status == 400 else "delayq_web_body_limit") in r.json()["error"]
    assert "Traceback" not in caplog.text


# -- the token minimum (pure) --------------------------------------------------------------------
def test_a_short_token_or_password_is_refused_at_start() -> None:
    from celery import Celery

    with pytest.raises(WeakSecret, match=r"delayq_web_token / DELAYQ_WEB_TOKEN: the web token has 1 character"):
        WebSettings(token="t")
    with pytest.raises(WeakSecret, match="at least 16"):
        WebSettings(username="ops", password="fifteen-chars!!")
    WebSettings(token="x" * 16)
    app = Celery("s", set_as_current=False)
    with pytest.raises(WeakSecret, match="DELAYQ_WEB_TOKEN"):
        WebSettings.from_app(app, environ={"DELAYQ_WEB_TOKEN": "short"})
    with pytest.raises(ValueError, match="delayq_web_body_limit / DELAYQ_WEB_BODY_LIMIT: 'lots'"):
        WebSettings.from_app(app, environ={"DELAYQ_WEB_BODY_LIMIT": "lots"})
    assert WebSettings.from_app(app, environ={"DELAYQ_WEB_BODY_LIMIT": "2048"}).body_limit == 2048
    assert WebSettings.from_app(app, environ={}).body_limit == 1048576


#: What this module checks does not differ between RabbitMQ lines except the parking queue: run on both.
