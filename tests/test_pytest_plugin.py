"""A user's own test suite: Celery's ``celery_app``/``celery_worker`` fixtures with the setting alone.

The user's test module never imports celery_delayq; pytest loads it through the package's
``pytest11`` entry point, so the in-thread test worker runs the delayed task out of the ladder.
Peer in the same run: the same suite with ``-p no:celery_delayq`` holds it in the worker (classic ETA).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import amqp
import pytest

pytestmark = pytest.mark.timeout(180)

USER_SUITE = textwrap.dedent('''
    import json, os, time
    import pytest

    @pytest.fixture(scope="session")
    def celery_config():
        return {"broker_url": os.environ["BROKER"], "result_backend": "cache+memory://",
                "delayq_enabled": True, "delayq_prefix": os.environ["PREFIX"],
                "task_default_queue": os.environ["QUEUE"], "broker_heartbeat": 0}

    @pytest.fixture(scope="session")
    def celery_worker_parameters():
        return {"queues": (os.environ["QUEUE"],), "perform_ping_check": False}

    def test_a_delayed_task(celery_app, celery_worker):
        @celery_app.task(bind=True)
        def where(self):
            return {"ladder": bool(self.request.get("x-delayq-entry")), "at": time.time()}

        celery_worker.reload()
        sent = time.time()
        result = where.apply_async(countdown=0.5).get(timeout=30)
        with open(os.environ["OUT"], "w") as out:
            json.dump(dict(result, sent=sent), out)
''')


@pytest.mark.parametrize("plugin", ["loaded", "disabled"])
def test_the_setting_alone_works_in_celerys_own_test_worker(plugin: str, broker_url: str, prefix: str, uid: str,
                                                             tmp_path: Path, amqp_conn: amqp.Connection) -> None:
    queue = f"plug.{uid}"
    (tmp_path / "test_user_suite.py").write_text(USER_SUITE)
    out = tmp_path / "out.json"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(BROKER=broker_url, PREFIX=prefix, QUEUE=queue, OUT=str(out))
    # Celery's own fixtures (pytest-celery 1.x, installed here, replaces celery_worker by a Docker one)
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:celery", "-p", "celery.contrib.pytest",
            str(tmp_path / "test_user_suite.py")]
    if plugin == "disabled":
        args[4:4] = ["-p", "no:celery_delayq"]  # the peer: what a suite did before the plugin
    try:
        done = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=150)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        ran = json.loads(out.read_text())
    finally:
        amqp_conn.channel().queue_delete(queue)
    assert ran["at"] >= ran["sent"] + 0.5
    assert ran["ladder"] is (plugin == "loaded"), ran
