"""The page's shell without a broker: login with the token (session cookie, CSRF, logout), the live change
signal, the charts' series, and ``--host``.

The service is the routes' fake (``app.dependency_overrides``); the change signal's broker read (the parking
queue's count) is replaced where it would reach a broker. The browser test (``test_browser_shell.py``) runs
the same over a real broker and worker.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("fastapi")
from celery import Celery  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from celery_delayq.telemetry.lasthour import last_hour  # noqa: E402
from celery_delayq.telemetry.series import quantile, series  # noqa: E402
from celery_delayq.web import WebSettings, create_app  # noqa: E402
from celery_delayq.web import live as live_mod  # noqa: E402
from celery_delayq.web.api.live import get_live  # noqa: E402
from celery_delayq.web.service import get_service  # noqa: E402
from celery_delayq.web.live import Live  # noqa: E402
from celery_delayq.web.session import SESSION_COOKIE, Sessions, safe_next  # noqa: E402
from test_routes import TOKEN, FakeService  # noqa: E402

HTML = {"Accept": "text/html,application/xhtml+xml"}


# -- the session cookie -----------------------------------------------------------------------
def test_a_session_cookie_is_signed_expires_and_never_holds_the_token() -> None:
    sessions = Sessions(WebSettings(token=TOKEN), ttl_s=60)
    value = sessions.issue(now=1000.0)
    assert TOKEN not in value and sessions.valid(value, now=1000.0) and sessions.valid(value, now=1059.0)
    assert not sessions.valid(value, now=1061.0)  # expired
    payload, _, sig = value.rpartition(".")
    _, expires, nonce = payload.split(".")
    assert not sessions.valid(f"v1.{int(expires) + 3600}.{nonce}.{sig}", now=1000.0)  # a longer life is not signed
    assert not sessions.valid(value[:-2] + ("AA" if not value.endswith("AA") else "BB"), now=1000.0)
    assert not sessions.valid("", now=1000.0) and not sessions.valid("v1.x.y.z", now=1000.0)
    assert not Sessions(WebSettings(token=TOKEN)).valid(value, now=1000.0)  # another process (or a restart)
    assert not Sessions(WebSettings(token=TOKEN + "-rotated")).valid(value, now=1000.0)
    sessions.revoke(value, now=1000.0)  # logout
    assert not sessions.valid(value, now=1000.0) and sessions.valid(sessions.issue(now=1000.0), now=1000.0)
    assert sessions.token_ok(TOKEN) and sessions.token_ok(f" {TOKEN}\n") and not sessions.token_ok(TOKEN[:-1])
    assert not Sessions(WebSettings()).enabled and not Sessions(WebSettings()).token_ok("")
    cookie = sessions.cookie(value, path="/ops", secure=True)
    assert {"HttpOnly", "SameSite=Strict", "Secure", "Path=/ops", "Max-Age=60"} <= {p.strip() for p in cookie.split(";")}


def test_a_client_that_keeps_guessing_is_refused_for_a_minute() -> None:
    sessions = Sessions(WebSettings(token=TOKEN))
    for i in range(Sessions.FAILS_ALLOWED):
        assert not sessions.throttled("10.0.0.9", now=1000.0 + i)
        sessions.failed("10.0.0.9", now=1000.0 + i)
    assert sessions.throttled("10.0.0.9", now=1010.0) and not sessions.throttled("10.0.0.8", now=1010.0)
    assert not sessions.throttled("10.0.0.9", now=1065.0)  # the oldest failures left the minute
    client = _client(WebSettings(token=TOKEN))
    for _ in range(Sessions.FAILS_ALLOWED):
        assert _log_in(client, token="guess-guess-guess-guess").status_code == 401
    refused = _log_in(client)  # the right token, but too late: refused without a check
    assert refused.status_code == 429 and "wait a minute" in refused.text and SESSION_COOKIE not in client.cookies


def test_after_login_only_a_path_of_this_site() -> None:
    assert safe_next("/waiting?task=a.*") == "/waiting?task=a.*"
    for bad in ("//evil.example/x", "https://evil.example/", "/\\evil.example", "javascript:alert(1)", "", None,
                "/a\r\nSet-Cookie: x=1"):
        assert safe_next(bad) == "/", bad


# -- the middleware and the login routes, over the fake service --------------------------------
def _client(settings: WebSettings, fake: FakeService | None = None) -> TestClient:
    fake = fake or FakeService()
    web = create_app(Celery("shell", broker="amqp://guest:guest@127.0.0.1:1//"), settings=settings)
    web.dependency_overrides[get_service] = lambda: fake
    return TestClient(web, raise_server_exceptions=False)


def _log_in(client: TestClient, token: str = TOKEN, next_: str = "/waiting") -> Any:
    form = client.get(f"/login?next={next_}", headers=HTML)
    assert form.status_code == 200 and 'type="password"' in form.text
    return client.post("/login", data={"token": token, "next": next_, "csrf_token": client.cookies["delayq_csrf"]},
                       follow_redirects=False)


def test_a_browser_is_sent_to_the_login_form_and_a_script_gets_its_401() -> None:
    client = _client(WebSettings(token=TOKEN))
    r = client.get("/waiting?task=a.*", headers=HTML, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/login?next=%2Fwaiting%3Ftask%3Da.%2A"
    for path, headers in (("/waiting", {}), ("/api/waiting", HTML), ("/api/changes", {"Accept": "application/json"})):
        r = client.get(path, headers=headers, follow_redirects=False)
        assert r.status_code == 401 and "log in at /login" in r.json()["error"], path
    assert client.post("/actions/cancel", headers=HTML, data={"task_id": "t-1"}).status_code == 401
    assert client.get("/static/delayq.js").status_code == 200
    # basic auth: the browser asks (a 401 with its challenge), there is no form to go to
    basic = _client(WebSettings(username="ops", password="pw-" + "p" * 16))
    r = basic.get("/", headers=HTML, follow_redirects=False)
    assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Basic")


def test_log_in_with_the_token_act_with_csrf_and_log_out() -> None:
    fake = FakeService()
    client = _client(WebSettings(token=TOKEN), fake)
    wrong = _log_in(client, token="not-the-token-at-all")
    assert wrong.status_code == 401 and "not the token" in wrong.text and SESSION_COOKIE not in client.cookies
    assert client.post("/login", data={"token": TOKEN}, follow_redirects=False).status_code == 403  # no CSRF token
    done = _log_in(client, next_="/waiting?task=a.*")
    assert done.status_code == 303 and done.headers["location"] == "/waiting?task=a.*"
    cookie = done.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and TOKEN not in cookie
    page = client.get("/waiting", headers=HTML)
    assert page.status_code == 200 and "Log out" in page.text and "proj.job" in page.text
    assert client.get("/api/changes").status_code != 401  # the page's own polling, with the cookie
    # a write authenticated by the cookie still needs the CSRF token
    refused = client.post("/api/waiting/t-1/cancel")
    assert refused.status_code == 403 and "CSRF" in refused.json()["error"]
    ok = client.post("/api/waiting/t-1/cancel", headers={"X-CSRF-Token": client.cookies["delayq_csrf"]})
    assert ok.status_code == 200 and fake.calls[-1][2]["who"].startswith("token:")  # audited as the token
    bearer = client.post("/api/waiting/t-1/cancel", headers={"Authorization": f"Bearer {TOKEN}"})
    assert bearer.status_code == 200  # the header decides first: a script needs no CSRF token, cookie or not
    kept = client.cookies[SESSION_COOKIE]
    out = client.post("/logout", data={"csrf_token": client.cookies["delayq_csrf"]}, follow_redirects=False)
    assert out.status_code == 303 and "Max-Age=0" in out.headers["set-cookie"]
    client.cookies.set(SESSION_COOKIE, kept)  # the old cookie, replayed: logged out for good
    assert client.get("/waiting", headers=HTML, follow_redirects=False).status_code == 303
    # scripts keep the bearer token
    assert client.get("/api/waiting", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200


def test_login_works_mounted_under_a_path() -> None:
    from fastapi import FastAPI

    outer = FastAPI()
    outer.mount("/ops/delayq", _client(WebSettings(token=TOKEN)).app)
    client = TestClient(outer)
    r = client.get("/ops/delayq/parked?x=1", headers=HTML, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/ops/delayq/login?next=%2Fparked%3Fx%3D1"
    assert 'action="/ops/delayq/login"' in client.get("/ops/delayq/login?next=/parked").text
    r = client.post("/ops/delayq/login", data={"token": TOKEN, "next": "/parked",
                                                "csrf_token": client.cookies["delayq_csrf"]}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/ops/delayq/parked"
    assert "Path=/ops/delayq;" in r.headers["set-cookie"]


def test_a_read_only_page_can_still_be_logged_into() -> None:
    client = _client(WebSettings(token=TOKEN, read_only=True))
    assert _log_in(client).status_code == 303
    assert client.post("/api/waiting/t-1/cancel", headers={"X-CSRF-Token": client.cookies["delayq_csrf"]}
                       ).status_code == 403


# -- the change signal ---------------------------------------------------------------------------
class _Snapshot:
    def __init__(self, items: list[Any]) -> None:
        self.items, self.ttl, self.gets, self.read_s = items, 5.0, 0, 0.01

    def get(self) -> tuple[list[Any], float, float]:
        self.gets += 1
        time.sleep(0.01)
        return self.items, self.read_s, 0.5


def _task(task_id: str, due: float = 4e9) -> Any:
    return SimpleNamespace(task_id=task_id, due=due)


def test_the_signal_is_computed_once_a_second_and_moves_only_on_a_change(monkeypatch: pytest.MonkeyPatch) -> None:
    snap = _Snapshot([_task("a"), _task("b")])
    live = Live(SimpleNamespace(snapshot=snap))  # type: ignore[arg-type]
    assert snap.ttl == live_mod.SNAPSHOT_TTL  # the kept list is re-read often while pages poll
    parked = {"n": 3}
    monkeypatch.setattr(live, "_parked_count", lambda: parked["n"])
    first = live.changes()
    assert (first.waiting, first.parked, first.error) == (2, 3, None) and first.read_at <= first.now - 0.5 + 0.1
    threads = [threading.Thread(target=live.changes) for _ in range(20)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert snap.gets == 1  # twenty viewers within the second: one look at the list
    monkeypatch.setattr(live_mod, "SIGNAL_TTL", 0.0)
    same = live.changes()
    assert same.version == first.version and same.changed_at == first.changed_at
    snap.items = [_task("a"), _task("b")]  # a new read with the same content: no change
    assert live.changes().version == first.version
    snap.items = [_task("a")]  # b ran
    gone = live.changes()
    assert gone.version != first.version and gone.changed_at > first.changed_at and gone.waiting == 1
    parked["n"] = 4
    assert live.changes().version != gone.version
    assert snap.ttl == live_mod.SNAPSHOT_TTL
    snap.read_s = 4.0  # 100,000 tasks: the next read starts once the list is as old as a read takes
    live.changes()
    assert snap.ttl == 4.0


def test_a_browse_of_the_parking_queue_is_not_a_change(monkeypatch: pytest.MonkeyPatch) -> None:
    live = Live(SimpleNamespace(snapshot=_Snapshot([]), context=SimpleNamespace(  # type: ignore[arg-type]
        config=SimpleNamespace(parking_queue_name="park"))))
    live._raw = object()  # type: ignore[assignment]
    counts = {"now": (5, 0)}
    monkeypatch.setattr(live_mod, "queue_counts", lambda raw, name: counts["now"])
    assert live._parked_count() == 5
    counts["now"] = (0, 1)  # a page holds them while it reads them: the count is not trusted
    assert live._parked_count() == 5
    counts["now"] = (4, 0)
    assert live._parked_count() == 4


def test_the_signal_and_series_routes(tmp_path: Path) -> None:
    fake = FakeService()
    fake.context = SimpleNamespace(config=SimpleNamespace(telemetry_dir=str(tmp_path)))
    client = _client(WebSettings(token=TOKEN), fake)
    signal = live_mod.Changes(version="v1", changed_at=1.0, read_at=1.0, now=2.0, waiting=0, parked=None,
                              poll_s=1.0, refresh_s=3.0)
    client.app.dependency_overrides[get_live] = lambda: SimpleNamespace(changes=lambda: signal)  # type: ignore[attr-defined]
    auth = {"Authorization": f"Bearer {TOKEN}"}
    r = client.get("/api/changes", headers=auth)
    assert r.status_code == 200 and r.json()["version"] == "v1" and r.headers["etag"] == '"v1"'
    _events(tmp_path, [("delivered", time.time() - 30, {"due_at": time.time() - 31})])
    doc = client.get("/api/series", params={"window": "1h"}, headers=auth).json()
    assert doc["available"] is True and len(doc["t"]) == 60 and sum(doc["counts"]["delivered"]) == 1
    assert client.get("/api/series", params={"window": "2h"}, headers=auth).status_code == 422
    fake.context = SimpleNamespace(config=SimpleNamespace(telemetry_dir=None))
    off = client.get("/api/series", headers=auth).json()
    assert off["available"] is False and "delayq_telemetry_dir" in off["reason"]
    paths = client.get("/api/openapi.json", headers=auth).json()["paths"]
    assert "ChartSeries" in json.dumps(paths["/api/series"]) and "Changes" in json.dumps(paths["/api/changes"])


# -- the charts' series ----------------------------------------------------------------------------
def _events(root: Path, events: list[tuple[str, float, dict[str, Any]]]) -> None:
    """Write events as the recorder lays them out (``date=/hour=`` partitions of their own ``ts``)."""
    for kind, ts, extra in events:
        part = root / time.strftime("date=%Y-%m-%d/hour=%H", time.gmtime(ts))
        part.mkdir(parents=True, exist_ok=True)
        with open(part / "events-test.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"event": kind, "ts": ts, **extra}) + "\n")


def test_series_counts_and_lateness_per_bucket(tmp_path: Path) -> None:
    now = 1_800_000_000.0 + 1800  # half past an hour
    late = [0.1 * i for i in range(1, 101)]  # 0.1 .. 10.0 s
    events = [("delivered", now - 90, {"due_at": now - 90 - x}) for x in late]
    events += [("scheduled", now - 30, {}), ("scheduled", now - 3000, {}), ("retried", now - 30, {}),
               ("parked", now - 200, {}), ("succeeded", now - 30, {}), ("delivered", now - 7200, {"due_at": 0})]
    _events(tmp_path, events)
    hour = series(str(tmp_path), "1h", now=now)
    assert hour is not None and len(hour.t) == 60 and hour.step_s == 60 and hour.t[-1] <= now < hour.t[-1] + 60
    assert sum(hour.counts["delivered"]) == 100 and sum(hour.counts["scheduled"]) == 2  # the 2 h old one is out
    assert sum(hour.counts["retried"]) == 1 and sum(hour.counts["parked"]) == 1
    i = hour.counts["delivered"].index(100)
    assert hour.lateness_p50_s[i] == pytest.approx(5.0) and hour.lateness_p99_s[i] == pytest.approx(9.9)
    assert [v for j, v in enumerate(hour.lateness_p50_s) if j != i] == [None] * 59
    day = series(str(tmp_path), "24h", now=now)
    assert day is not None and len(day.t) == 96 and sum(day.counts["delivered"]) == 101
    week = series(str(tmp_path), "7d", now=now)
    assert week is not None and len(week.t) == 168 and week.step_s == 3600
    assert series(str(tmp_path / "missing"), "1h") is None
    with pytest.raises(KeyError):
        series(str(tmp_path), "2h")
    assert quantile([], 0.5) is None and quantile([1.0], 0.99) == 1.0 and quantile([1.0, 2.0], 0.5) == 1.0
    # the overview's last hour reads through the same window
    summary = last_hour(str(tmp_path), now=now)
    assert summary is not None and summary.counts["delivered"] == 100 and summary.counts["succeeded"] == 1
    assert summary.lateness_max_s == pytest.approx(10.0) and sum(summary.per_minute) == 100


# -- the command line ------------------------------------------------------------------------------
def test_host_is_the_same_option_as_address(tmp_path: Path) -> None:
    (tmp_path / "webapp.py").write_text("from celery import Celery\napp = Celery('w', broker='amqp://127.0.0.1:1//')\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path) + ":" + str(Path(__file__).resolve().parents[2])}
    run = [sys.executable, "-m", "celery", "-A", "webapp", "delayq", "web"]
    out = subprocess.run(run + ["--host", "0.0.0.0"], capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert out.returncode == 1 and "refusing to serve the delayq page on 0.0.0.0" in out.stderr, out.stderr
    helped = subprocess.run(run + ["--help"], capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert "--address, --host" in helped.stdout, helped.stdout
