"""Held dead-letter messages, told from ready and unacked ones (pure)."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from urllib.parse import quote

from helpers import management_url

from celery_delayq.rabbitmq.recovery import held, ladder_held

sys.path.insert(0, str(Path(__file__).parents[1] / "cli"))  # cli_helpers


def test_held_counts_messages_beyond_ready_and_unacked_of_the_named_queues() -> None:
    rows = [
        {"name": "p.L01", "messages": 40, "messages_ready": 8, "messages_unacknowledged": 0},
        {"name": "p.L02", "messages": 5, "messages_ready": 3, "messages_unacknowledged": 2},
        {"name": "p.L03", "messages": 0},
        {"name": "other", "messages": 9, "messages_ready": 0},
    ]
    assert held(rows, ["p.L01", "p.L02", "p.L03"]) == {"p.L01": 32}


def test_held_tolerates_rows_without_statistics() -> None:
    assert held([{"name": "p.L01", "messages": None}], ["p.L01"]) == {}


def test_ladder_held_takes_only_the_queues_of_its_prefix() -> None:
    rows = [{"name": "p.14x4.L01.d1", "messages": 4, "messages_ready": 1},
            {"name": "p.exit.q.ab", "messages": 2, "messages_ready": 0},
            {"name": "pq.14x4.L01.d1", "messages": 9, "messages_ready": 0},
            {"name": "other", "messages": 9, "messages_ready": 0}]
    assert ladder_held(iter(rows), "p") == {"p.14x4.L01.d1": 3, "p.exit.q.ab": 2}


def test_recover_on_a_healthy_ladder_changes_nothing_and_the_touch_leaves_no_policy(make_app, vhost: str) -> None:
    """On the real broker (3.10 and 4.3): the policy the touch uses is accepted, then gone."""
    from cli_helpers import run_delayq

    from celery_delayq.rabbitmq.management import ManagementAPI
    from celery_delayq.rabbitmq.recovery import TOUCH_POLICY, Recovery

    # A ladder of its own: the session's shared one may hold messages for a destination a test deleted.
    app = make_app(delayq_enabled=True, delayq_management_url=management_url(),
                   delayq_prefix=f"rcv{uuid.uuid4().hex[:8]}")

    @app.task
    def add(x: int) -> int:
        return x

    add.apply_async((1,), countdown=3600)
    out = run_delayq(app, "topology", "recover", "--held-for", "0.5")
    assert "nothing to do" in out.output
    with app.connection_for_write() as conn:
        api = ManagementAPI.for_connection(conn, management_url())
    assert api is not None and api.same_broker
    prefix = app.conf.delayq_prefix
    assert Recovery(api, prefix).touch() is True
    left = api._get(f"/api/policies/{quote(vhost, safe='')}")
    # Only this ladder's policy: a worker of another test may be touching its own ladder at this moment.
    assert isinstance(left, list) and not [p for p in left if p.get("name") == f"{TOUCH_POLICY}-{prefix}"]


def test_the_touch_pattern_takes_level_and_exit_queues_but_no_stream() -> None:
    import re

    from celery_delayq.rabbitmq.recovery import touch_pattern

    pattern = re.compile(touch_pattern("my.app"))
    assert pattern.match("my.app.14x4.L03.d2") and pattern.match("my.app.8x2.L00")
    assert pattern.match("my.app.14x4.s3.L03.d2")  # a shard's level queue
    assert pattern.match("my.app.exit.default_q.6f5c722c826da0b4")
    assert not pattern.match("my.app.14x4.index.0a") and not pattern.match("my.app.14x4.cancels")
    assert not pattern.match("myXapp.14x4.L03.d2") and not pattern.match("my.app.parking")
