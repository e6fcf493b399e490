"""Activation as users deploy: a publisher process of its own that never calls ``install()``.

Each test writes a small Celery project into a temporary directory and runs
it in a subprocess, the way a web process, a script or celery beat runs:
only the setting ``delayq_enabled`` (or Django's ``CELERY_DELAYQ_ENABLED``)
turns the ladder on. The test process then drains the destination queue
with a raw AMQP consumer and checks that every message came through the
ladder (``x-delayq-entry``) and none arrived early.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import amqp
import pytest

from helpers import delete_ladder, drain

pytestmark = pytest.mark.timeout(120)

#: The project every test runs; {preamble} and {body} vary per test.
PROJECT = '''
import json, os, sys, time
{before_app}
from celery import Celery, chain, group, signature

app = Celery("proj", broker=os.environ["BROKER"], set_as_current=True)
{configure}

@app.task(name="proj.add")
def add(x, y=0):
    return x + y

{after_app}
'''


def _write(tmp_path: Path, *, before_app: str = "", configure: str = "", after_app: str = "") -> Path:
    src = PROJECT.format(before_app=textwrap.dedent(before_app), configure=textwrap.dedent(configure),
                         after_app=textwrap.dedent(after_app))
    (tmp_path / "proj.py").write_text(src)
    return tmp_path


def _run(tmp_path: Path, env: dict[str, str], code: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def project_env(broker_url: str, prefix: str, uid: str, amqp_conn: amqp.Connection) -> Any:
    queue = f"dep.{uid}"
    ch = amqp_conn.channel()
    ch.queue_declare(queue, durable=True, auto_delete=False)
    env = dict(os.environ, BROKER=broker_url, PREFIX=prefix, QUEUE=queue, PYTHONPATH=os.pathsep.join(
        [os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    yield env
    ch.queue_delete(queue)
    ch.close()


SETTINGS = '''
app.conf.update(delayq_enabled=True, delayq_prefix=os.environ["PREFIX"], task_default_queue=os.environ["QUEUE"],
                broker_heartbeat=0)
'''

#: Every publishing API Celery offers, each with a countdown of 1.5 s.
PUBLISH_ALL = '''
import json, time
from celery import chain, group, signature
from proj import app, add
import celery_delayq  # noqa: F401  (a process that imports the package; nothing else)
sent = time.time()
ids = [add.apply_async((1,), countdown=1.5).id,
       app.send_task("proj.add", (2,), countdown=1.5).id,
       add.s(3).set(countdown=1.5).apply_async().id,
       signature("proj.add", args=(4,), app=app).apply_async(countdown=1.5).id]
ids += [r.id for r in group(add.s(i).set(countdown=1.5) for i in (5, 6)).apply_async().results]
ids.append(chain(add.s(7).set(countdown=1.5), add.s()).apply_async().parent.id)
print(json.dumps({"sent": sent, "ids": ids, "installed": getattr(__import__("celery_delayq"), "is_installed", lambda a: None)(app)}))
'''


def _check_arrivals(amqp_conn: amqp.Connection, queue: str, out: dict[str, Any], delay: float) -> None:
    got = drain(amqp_conn, queue, len(out["ids"]), timeout=30, key=lambda m: m.headers["id"])
    by_id = {m.headers["id"]: m for m in got}
    assert set(by_id) == set(out["ids"])
    for task_id, m in by_id.items():
        headers = m.headers
        assert "x-delayq-entry" in headers, f"{task_id} did not pass through the ladder: {headers}"
        due = float(headers["x-delayq-due"])
        assert due >= out["sent"] + delay - 0.05
        assert m.arrived >= due, f"{task_id} arrived {due - m.arrived:.3f} s early"  # type: ignore[attr-defined]


@pytest.mark.parametrize("order", ["import-before-app", "import-after-config-loaded"])
def test_setting_alone_routes_every_publish_api_through_the_ladder(
        tmp_path: Path, project_env: dict[str, str], amqp_conn: amqp.Connection, order: str) -> None:
    if order == "import-before-app":
        _write(tmp_path, before_app="import celery_delayq", configure=SETTINGS)
    else:
        # The app reads its configuration (and builds its producer pool) before
        # celery_delayq is imported at all.
        _write(tmp_path, configure=SETTINGS + "\napp.conf.broker_pool_limit; app.producer_pool\n")
    done = _run(tmp_path, project_env, PUBLISH_ALL)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["installed"] in (True, None)
    _check_arrivals(amqp_conn, project_env["QUEUE"], out, 1.5)


def test_django_style_namespaced_setting(tmp_path: Path, project_env: dict[str, str], amqp_conn: amqp.Connection) -> None:
    _write(tmp_path, configure='''
        class Settings:
            CELERY_DELAYQ_ENABLED = True
            CELERY_DELAYQ_PREFIX = os.environ["PREFIX"]
            CELERY_TASK_DEFAULT_QUEUE = os.environ["QUEUE"]
            CELERY_BROKER_HEARTBEAT = 0
        app.config_from_object(Settings, namespace="CELERY")
    ''')
    done = _run(tmp_path, project_env, PUBLISH_ALL)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    _check_arrivals(amqp_conn, project_env["QUEUE"], out, 1.5)


def test_too_long_a_delay_fails_in_a_publisher_process_and_sends_nothing(
        tmp_path: Path, project_env: dict[str, str], amqp_conn: amqp.Connection) -> None:
    # Without a cap a 40-day delay makes laps through the ladder (tests/rabbitmq/test_laps.py);
    # with delayq_max_delay it is refused before anything is sent.
    _write(tmp_path, configure=SETTINGS + "\napp.conf.delayq_max_delay = 31 * 86400\n")
    done = _run(tmp_path, project_env, '''
        from proj import add
        import celery_delayq, time
        try:
            add.apply_async((1,), countdown=40 * 86400)
        except celery_delayq.DelayTooLong as exc:
            print("DelayTooLong:", exc)
    ''')
    assert done.returncode == 0, done.stderr
    assert "DelayTooLong:" in done.stdout
    time.sleep(0.5)
    ch = amqp_conn.channel()
    assert ch.queue_declare(project_env["QUEUE"], passive=True).message_count == 0
    ch.close()


def test_without_the_setting_nothing_changes(tmp_path: Path, project_env: dict[str, str], amqp_conn: amqp.Connection) -> None:
    _write(tmp_path, before_app="import celery_delayq",
           configure='app.conf.update(task_default_queue=os.environ["QUEUE"], broker_heartbeat=0)')
    done = _run(tmp_path, project_env, '''
        from proj import app, add
        import celery_delayq, json
        r = add.apply_async((1,), countdown=30)
        print(json.dumps({"installed": getattr(celery_delayq, "is_installed", lambda a: False)(app),
                          "producer": type(app.amqp.producer_pool.create_producer()).__name__}))
    ''')
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out == {"installed": False, "producer": "Producer"}
    (m,) = drain(amqp_conn, project_env["QUEUE"], 1, timeout=10)
    assert "x-delayq-entry" not in m.headers and m.headers["eta"]  # Celery's own ETA message


def test_celery_beat_publishes_delayed_entries_through_the_ladder(
        tmp_path: Path, project_env: dict[str, str], amqp_conn: amqp.Connection) -> None:
    _write(tmp_path, before_app="import celery_delayq", configure=SETTINGS + '''
app.conf.beat_schedule = {"tick": {"task": "proj.add", "schedule": 1.0, "args": (1,),
                                   "options": {"countdown": 1.5}}}
''')
    beat = subprocess.Popen([sys.executable, "-m", "celery", "-A", "proj", "beat", "-s", str(tmp_path / "beat.db"),
                             "--max-interval", "1", "-l", "warning"], cwd=tmp_path, env=project_env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        started = time.time()
        got = drain(amqp_conn, project_env["QUEUE"], 2, timeout=40, key=lambda m: m.headers["id"])
    finally:
        beat.send_signal(signal.SIGTERM)
        try:
            output = beat.communicate(timeout=20)[0]
        except subprocess.TimeoutExpired:
            beat.kill()
            output = beat.communicate()[0]
    assert got, output
    for m in got:
        assert "x-delayq-entry" in m.headers, f"beat's publish skipped the ladder: {m.headers}\n{output}"
        assert m.arrived >= float(m.headers["x-delayq-due"]) >= started  # type: ignore[attr-defined]


def test_a_misspelt_setting_is_named_when_the_app_loads_its_configuration(
        tmp_path: Path, project_env: dict[str, str]) -> None:
    _write(tmp_path, before_app="import celery_delayq, logging\nlogging.basicConfig()",
           configure='app.conf.update(delayq_enable=True, task_default_queue=os.environ["QUEUE"])')
    done = _run(tmp_path, project_env, '''
        from proj import app, add
        import celery_delayq
        app.conf.task_default_queue  # any first read of the configuration
        print(celery_delayq.is_installed(app))
    ''')
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
    assert "unknown setting 'delayq_enable'" in done.stderr and "'delayq_enabled'" in done.stderr


def test_first_delayed_publish_of_a_new_process_is_not_late(
        tmp_path: Path, project_env: dict[str, str], amqp_conn: amqp.Connection, uid: str) -> None:
    # A prefix nobody declared yet: the first publish creates the whole ladder on its way.
    env = dict(project_env, PREFIX=f"first{uid}")
    _write(tmp_path, before_app="import celery_delayq", configure=SETTINGS)
    done = _run(tmp_path, env, '''
        import json, time
        from proj import app, add
        start = time.time()
        r = add.apply_async((1,), countdown=1)
        print(json.dumps({"id": r.id, "call": time.time() - start}))
    ''')
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    try:
        (m,) = drain(amqp_conn, env["QUEUE"], 1, timeout=20)
        lateness = m.arrived - float(m.headers["x-delayq-due"])  # type: ignore[attr-defined]
        # Creating the ladder on the way delays the publish itself: a call that took longer than the
        # countdown cannot be on time, but its message must then go straight through (not wait again).
        spent = max(0.0, out["call"] - 1)
        assert 0 <= lateness < 0.3 + spent, (
            f"first publish landed {lateness * 1000:.0f} ms late (call took {out['call']:.3f} s)")
    finally:
        from celery_delayq.ladder.spec import LadderSpec
        from celery_delayq.rabbitmq.topology import Topology

        spec = LadderSpec(prefix=env["PREFIX"])  # with its index and cancel streams and the exit queue
        with contextlib.suppress(Exception):
            delete_ladder(amqp_conn, spec, exit_queues=[Topology(spec, "quorum").destination("", env["QUEUE"]).exit_queue])
