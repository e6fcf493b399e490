"""Schemathesis against a live ``delayq web``: every check, every phase, and it finds nothing.

Two servers over a real broker app (the session vhost's ladder, this test's own parking queue with
messages parked in it, so the by-id routes have something to find): (a) bearer-token authentication,
(b) loopback without authentication, where every write needs the page's CSRF token (sent as cookie
and header, as the page's script would). The run is the CLI's, as CI would run it:
``schemathesis run --checks all --phases examples,coverage,fuzzing,stateful``.

One setting is given beyond the defaults: ``positive_data_acceptance`` also accepts 400 and 422.
A JSON Schema cannot say "a time in the future", "within the app's longest delay", "a filter or
all" or "expect equals the count now"; a request that fits the schema but not those rules is
refused with 400 (or 422, ``DelayTooLong``) naming the field, which is this API's contract
(docs/web.md), not a rejected valid request.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("schemathesis")

import celery_delayq  # noqa: E402
from celery_delayq.web import WebSettings, create_app  # noqa: E402
from retry_helpers import park_synthetic, parking_name_fixture  # noqa: E402,F401
from web_live import serve  # noqa: E402

TOKEN = "schemathesis-token-" + "s" * 8
#: Small enough for the file to run in about two minutes on a loaded host, large enough to find a 500.
MAX_EXAMPLES = "12"
CONFIG = """
[checks.positive_data_acceptance]
expected-statuses = ["2xx", "400", "401", "403", "404", "409", "422"]
"""


@pytest.fixture
def app(make_app: Any, parking_name: str, broker_url: str, uid: str, amqp_conn: Any) -> Any:
    # A ladder of its own: the session's shared one holds every earlier test's index entries, and the
    # fuzzer's hundreds of reads each took seconds over them (both runs timed out at the end of the suite).
    app = make_app(delayq_enabled=True, delayq_parking_queue=parking_name, delayq_parking_queue_type="classic",
                   delayq_max_delay=3600, delayq_prefix=f"fz{uid}", delayq_levels=8)
    celery_delayq.install(app).publisher.declare()
    park_synthetic(broker_url, parking_name, 3, task=f"{app.main}.p", exc=ValueError("no"), dest=f"nowhere.{uid}")

    def job(tag: str) -> None:
        pass

    task = app.task(name=f"{app.main}.job")(job)
    sent = [task.apply_async((f"fuzz-{i}",), countdown=1800) for i in range(3)]
    yield app
    assert sent
    from celery_delayq.config import DelayqConfig
    from helpers import delete_ladder

    celery_delayq.uninstall(app)
    delete_ladder(amqp_conn, DelayqConfig.from_app(app).spec)


def _run(url: str, tmp_path: Path, *headers: str) -> None:
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG)
    command = [str(Path(sys.executable).parent / "schemathesis"), "--config-file", str(config), "run",
               f"{url}/api/openapi.json", "--checks", "all", "--phases", "examples,coverage,fuzzing,stateful",
               "--max-examples", MAX_EXAMPLES, "--seed", "31", "--workers", "1", "--request-timeout", "30",
               "--suppress-health-check", "all", "--no-color", "--report-dir", str(tmp_path / "report")]
    for header in headers:
        command += ["-H", header]
    out = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path,
                         env={**os.environ, "SCHEMATHESIS_HOOKS": ""})
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-12000:]
    for phase in ("Examples", "Coverage", "Fuzzing", "Stateful"):
        assert f"✅ {phase}" in text, text[-4000:]  # each phase ran (not skipped) and passed
    assert "No issues found" in text or "passed" in text, text[-4000:]


def test_token_server(app: Any, tmp_path: Path) -> None:
    with serve(create_app(app, settings=WebSettings(token=TOKEN))) as url:
        _run(url, tmp_path, f"Authorization: Bearer {TOKEN}")


def test_loopback_csrf_server(app: Any, tmp_path: Path) -> None:
    csrf = uuid.uuid4().hex  # the page's cookie and its copy in the header (double submit)
    with serve(create_app(app)) as url:
        import httpx

        # The headers do get a write past the CSRF check (not a 403 the fuzzer's checks would accept).
        r = httpx.post(url + "/api/parked/delete", json={"all": True}, headers={"X-CSRF-Token": csrf},
                       cookies={"delayq_csrf": csrf})
        assert r.status_code == 200 and r.json()["matched"] == 3, r.text
        _run(url, tmp_path, f"Cookie: delayq_csrf={csrf}", f"X-CSRF-Token: {csrf}")


#: The API's answers do not differ between RabbitMQ lines: the 3.10 leg runs it, the 4.3 leg skips it.
pytestmark = pytest.mark.one_broker
