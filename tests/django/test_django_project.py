"""A Django project configures celery_delayq through CELERY_DELAYQ_* settings (real broker, real worker)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import delete_ladder

pytest.importorskip("django")

PROJECT = Path(__file__).resolve().parents[2] / "examples" / "django_shop"

SCRIPT = textwrap.dedent('''
    import json, time, django
    django.setup()
    from celery.contrib.testing.worker import start_worker
    from shop.celery import app
    from shop import tasks
    import celery_delayq
    router = celery_delayq.ladder_for(app)
    cfg = router.config
    with start_worker(app, pool="solo", perform_ping_check=False, loglevel="WARNING", shutdown_timeout=10):
        tasks.send_reminder.apply_async((7, time.time() + 0.7), countdown=0.7)
        deadline = time.time() + 15
        while not tasks.RUNS and time.time() < deadline:
            time.sleep(0.05)
    print(json.dumps({"enabled": cfg.enabled, "prefix": cfg.prefix, "unit_ms": cfg.unit_ms, "runs": tasks.RUNS}))
''')


def test_django_settings_drive_the_ladder(broker_url: str, uid: str, amqp_conn) -> None:
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="shop.settings", CELERY_BROKER_URL=broker_url,
               SHOP_QUEUE=f"shop.{uid}", SHOP_DELAYQ_PREFIX=f"dj{uid}",
               PYTHONPATH=os.pathsep.join([str(PROJECT), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["enabled"] is True and result["prefix"] == f"dj{uid}" and result["unit_ms"] == 10
    assert len(result["runs"]) == 1
    run = result["runs"][0]
    assert run["at"] >= run["due"]
    assert run["entry"]  # it came out of the ladder (a plain shared_task: the app-wide switch)

    # the project declared a ladder of its own: remove it (quorum queues cost file handles)
    from celery_delayq.ladder.spec import LadderSpec
    from celery_delayq.rabbitmq.topology import Topology

    spec = LadderSpec(prefix=f"dj{uid}")
    delete_ladder(amqp_conn, spec, exit_queues=[Topology(spec, "quorum").destination("", f"shop.{uid}").exit_queue])
