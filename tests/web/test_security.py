"""Who may look and act: binding, token and basic auth, CSRF, read-only, and what never reaches the page."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from typing import Any

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from celery_delayq.web import UnsafeBinding, WebSettings, create_app  # noqa: E402
from celery_delayq.web.settings import is_loopback  # noqa: E402

TOKEN = "tok-" + "t" * 16
PASSWORD = "pw-" + "p" * 16


# -- pure ---------------------------------------------------------------------------------
def test_binding_beyond_loopback_needs_auth() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3") and not is_loopback("example.org")
    WebSettings().check_binding("127.0.0.1")
    with pytest.raises(UnsafeBinding, match="DELAYQ_WEB_TOKEN"):
        WebSettings().check_binding("0.0.0.0")
    WebSettings(token="s3cret-s3cret-s3cret").check_binding("0.0.0.0")
    WebSettings(username="ops", password=PASSWORD).check_binding("0.0.0.0")
    with pytest.raises(UnsafeBinding):
        WebSettings(username="ops").check_binding("0.0.0.0")  # a user without a password is no auth


def test_settings_come_from_app_then_environment() -> None:
    from celery import Celery

    app = Celery("s", set_as_current=False)
    env = {"DELAYQ_WEB_TOKEN": "from-env-" + "e" * 16, "DELAYQ_WEB_BODY_MAX": "100"}
    assert WebSettings.from_app(app, environ=env).token == "from-env-" + "e" * 16
    assert WebSettings.from_app(app, environ=env).body_max == 100
    app.conf.delayq_web_token = "from-conf-" + "c" * 16
    assert WebSettings.from_app(app, environ=env).token == "from-conf-" + "c" * 16
    assert "from-conf" not in repr(WebSettings(password="from-conf-" + "c" * 16))


def test_cli_refuses_a_public_address_without_auth(tmp_path: Any) -> None:
    (tmp_path / "webapp.py").write_text("from celery import Celery\napp = Celery('w', broker='amqp://127.0.0.1:1//')\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "celery", "-A", "webapp", "delayq", "web", "--address", "0.0.0.0"],
                         capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert out.returncode == 1 and "refusing to serve the delayq page on 0.0.0.0" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr



def test_cli_refuses_an_empty_address_even_with_a_token(tmp_path: Any) -> None:
    """``--host ''`` (an unset ``$HOST``) bound every interface, IPv4 and IPv6, and printed ``http://:5580/``:
    a typo that opens the page to the network. It is a usage error now, before anything listens."""
    (tmp_path / "webapp.py").write_text("from celery import Celery\napp = Celery('w', broker='amqp://127.0.0.1:1//')\n")
    import celery_delayq  # this checkout's package, not whichever one the interpreter has installed

    package_root = os.path.dirname(os.path.dirname(celery_delayq.__file__))
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": os.pathsep.join([str(tmp_path), package_root]),
           "DELAYQ_WEB_TOKEN": TOKEN}
    for empty in ("", "  "):
        out = subprocess.run([sys.executable, "-m", "celery", "-A", "webapp", "delayq", "web", "--host", empty,
                              "--port", "1"], capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
        assert out.returncode == 2 and "Invalid value for '--address'" in out.stderr, out.stderr
        assert "0.0.0.0" in out.stderr and "Traceback" not in out.stderr and "delayq web on" not in out.stdout

# -- broker -------------------------------------------------------------------------------
@pytest.fixture
def app(make_app: Any) -> Any:
    import celery_delayq

    app = make_app(delayq_enabled=True)
    celery_delayq.install(app).publisher.declare()
    return app


def test_token_and_basic_auth_are_required_when_configured(app: Any) -> None:
    client = TestClient(create_app(app, settings=WebSettings(token=TOKEN, username="ops", password=PASSWORD)))
    for path in ("/", "/waiting", "/api/waiting", "/api/openapi.json"):
        r = client.get(path)
        assert r.status_code == 401 and r.json()["error"].startswith("authentication required"), path
    assert client.get("/api/waiting", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/api/waiting", headers={"Authorization": "Bearer " + TOKEN}).status_code == 200
    good = base64.b64encode(b"ops:" + PASSWORD.encode()).decode()
    bad = base64.b64encode(b"ops:nope").decode()
    assert client.get("/waiting", headers={"Authorization": f"Basic {good}"}).status_code == 200
    assert client.get("/waiting", headers={"Authorization": f"Basic {bad}"}).status_code == 401
    assert client.get("/static/delayq.css").status_code == 200  # nothing secret


def test_unauthenticated_write_is_refused(app: Any) -> None:
    client = TestClient(create_app(app, settings=WebSettings(token=TOKEN)))
    r = client.post("/api/waiting/cancel", json={"dry_run": True})
    assert r.status_code == 401


def test_browser_writes_need_the_csrf_token(app: Any) -> None:
    basic = {"Authorization": "Basic " + base64.b64encode(b"ops:" + PASSWORD.encode()).decode()}
    client = TestClient(create_app(app, settings=WebSettings(username="ops", password=PASSWORD)), headers=basic)
    refused = client.post("/api/waiting/cancel", json={"dry_run": True})
    assert refused.status_code == 403 and "CSRF" in refused.json()["error"]
    form = client.post("/actions/cancel", data={"task_id": "x"})
    assert form.status_code == 403
    page = client.get("/waiting")
    token = client.cookies["delayq_csrf"]
    assert f'value="{token}"' in page.text or "No delayed task" in page.text
    wrong = client.post("/api/waiting/cancel", json={"dry_run": True}, headers={"X-CSRF-Token": "forged" * 5})
    assert wrong.status_code == 403
    ok = client.post("/api/waiting/cancel", json={"dry_run": True, "all": True}, headers={"X-CSRF-Token": token})
    assert ok.status_code == 200 and ok.json()["dry_run"] is True
    # A bearer token is never sent by a browser on its own: no CSRF token needed.
    api = TestClient(create_app(app, settings=WebSettings(token=TOKEN)), headers={"Authorization": "Bearer " + TOKEN})
    assert api.post("/api/waiting/cancel", json={"dry_run": True, "all": True}).status_code == 200


def _indexed(app: Any, task_id: str, timeout: float = 10.0) -> None:
    """Wait until the task's index entry is written: a single publish's entry may wait 0.25 s for others
    (``index.writer.LINGER_S``), and a page keeps the list it read for a few seconds."""
    import time

    from celery_delayq import pending

    deadline = time.time() + timeout
    while not pending(app, task_id=task_id):
        assert time.time() < deadline, f"{task_id} never reached the index"
        time.sleep(0.1)


def test_read_only_hides_and_refuses_every_action(app: Any) -> None:
    def ro() -> None:
        pass

    task = app.task(name=f"{app.main}.ro")(ro)
    waiting = task.apply_async(countdown=120)
    try:
        _indexed(app, waiting.id)
        client = TestClient(create_app(app, read_only=True))
        # The session's tests share one ladder: a page of all waiting tasks may be full of theirs.
        page = client.get("/waiting", params={"task": f"{app.main}.ro"})
        assert waiting.id in page.text
        assert "Run now" not in page.text and "Cancel" not in page.text and "/actions/" not in page.text
        assert "read-only" in page.text
        token = client.cookies["delayq_csrf"]
        for path in (f"/api/waiting/{waiting.id}/cancel", f"/api/waiting/{waiting.id}/run-now", "/api/parked/replay",
                     "/actions/cancel"):
            r = client.post(path, headers={"X-CSRF-Token": token}, json={})
            assert r.status_code == 403 and "read-only" in r.json()["error"], path
        assert client.delete("/api/parked/abc", headers={"X-CSRF-Token": token}).status_code == 403
    finally:
        from celery_delayq import cancel
        cancel(app, waiting.id)


def test_no_password_and_bodies_cut(app: Any, broker_url: str) -> None:
    password = broker_url.split(":")[2].split("@")[0]
    def big(blob: str) -> None:
        pass

    task = app.task(name=f"{app.main}.big")(big)
    waiting = task.apply_async(("z" * 5000,), countdown=120)
    try:
        _indexed(app, waiting.id)
        client = TestClient(create_app(app, settings=WebSettings(body_max=50)))
        for path in ("/", "/waiting", "/api/overview", "/api/waiting"):
            text = client.get(path).text
            assert f":{password}@" not in text, path
        mine = client.get("/api/waiting", params={"task": f"{app.main}.big"}).json()["items"]  # a shared ladder
        [item] = [t for t in mine if t["task_id"] == waiting.id]
        assert len(item["args"]) <= 51  # the index keeps 256 characters, the API shows body_max
    finally:
        from celery_delayq import cancel
        cancel(app, waiting.id)


@pytest.mark.parametrize("method,path,body", [
    ("get", "/api/waiting/no-such-id", None),
    ("post", "/api/waiting/no-such-id/run-now", None),
    ("post", "/api/waiting/no-such-id/cancel", None),
    ("post", "/api/waiting/no-such-id/reschedule", {"due": "10m"}),
    ("get", "/api/parked/no-such-id", None),
    ("delete", "/api/parked/no-such-id", None),
    ("get", "/api/waiting?due_after=yesterday-ish", None),
    ("get", "/api/waiting?limit=100000", None),
    ("get", "/api/waiting?limit=0", None),
    ("get", "/api/waiting?offset=-1", None),
    ("post", "/api/waiting/x/reschedule", {"due": "not a time"}),
    ("post", "/api/waiting/x/reschedule", {"when": "10m"}),
    ("post", "/api/waiting/cancel", {"dry_run": False}),
    ("post", "/api/waiting/cancel", {"due_before": "soonish"}),
    ("post", "/api/parked/replay", {"delay": -1}),
])
def test_bad_input_is_a_4xx_json_error(app: Any, method: str, path: str, body: Any) -> None:
    client = TestClient(create_app(app, settings=WebSettings(token=TOKEN)), headers={"Authorization": "Bearer " + TOKEN})
    r = client.request(method.upper(), path, json=body)
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    doc = r.json()
    assert isinstance(doc["error"], str) and doc["error"] and "Traceback" not in r.text


def test_nothing_from_another_vhost_reaches_the_page(app: Any, broker_url: str, prefix: str, uid: str) -> None:
    """Same prefix, same broker, another vhost: its tasks and counts never show here."""
    import contextlib
    import shutil

    from celery import Celery

    import celery_delayq

    if shutil.which("rabbitmqctl") is None:
        pytest.skip("needs rabbitmqctl to make a second vhost")
    other_vhost = f"delayq-web-other-{uid}"
    subprocess.run(["rabbitmqctl", "-q", "add_vhost", other_vhost], check=True, capture_output=True, timeout=60)
    try:
        subprocess.run(["rabbitmqctl", "-q", "set_permissions", "-p", other_vhost, "guest", ".*", ".*", ".*"],
                       check=True, capture_output=True, timeout=60)
        other = Celery("other", broker=broker_url.rsplit("/", 1)[0] + "/" + other_vhost, set_as_current=False)
        other.conf.update(delayq_enabled=True, delayq_prefix=prefix, task_default_queue=f"q.{uid}",
                          broker_heartbeat=0)
        celery_delayq.install(other)

        def secret(x: str) -> None:
            pass

        hidden = other.task(name=f"{app.main}.secret", shared=False)(secret).apply_async(("other-vhost-arg",),
                                                                                         countdown=300)
        assert [t.task_id for t in celery_delayq.pending(other)] == [hidden.id]  # it is there, over there

        def here(x: str) -> None:
            pass

        mine = app.task(name=f"{app.main}.here")(here).apply_async(("this-vhost-arg",), countdown=300)
        client = TestClient(create_app(app))
        mine_only = f"task={app.main}.*"  # both tasks have this app's names; the session's list is long
        for path in ("/", "/waiting", "/retries", "/api/overview", "/api/waiting", f"/api/waiting?id={hidden.id}",
                     f"/waiting?{mine_only}", f"/api/waiting?{mine_only}"):
            text = client.get(path).text
            assert hidden.id not in text and "other-vhost-arg" not in text, path
        assert client.get(f"/api/waiting/{hidden.id}").status_code == 404
        assert client.get("/api/overview").json()["totals"]["waiting"] >= 1
        assert mine.id in client.get(f"/waiting?{mine_only}").text
        celery_delayq.uninstall(other)
        celery_delayq.cancel(app, mine.id)
    finally:
        with contextlib.suppress(Exception):
            subprocess.run(["rabbitmqctl", "-q", "delete_vhost", other_vhost], capture_output=True, timeout=300)


#: What this module checks does not differ between RabbitMQ lines: the 3.10 leg runs it, the 4.3 leg skips it.
pytestmark = pytest.mark.one_broker
