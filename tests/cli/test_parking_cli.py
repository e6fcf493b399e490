"""``delayq parking`` commands, run with Celery's own CLI context against the real broker."""

from __future__ import annotations

import json
import time

import pytest
from celery.bin.base import CLIContext
from click.testing import CliRunner

from celery_delayq.cli.parking import parking
from helpers import drain, queue_depth
from retry_helpers import park_synthetic, parking_name_fixture, retry_app_fixture  # noqa: F401  (fixtures)

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def dest(amqp_conn, uid: str):
    name = f"cli.{uid}"
    amqp_conn.channel().queue_declare(name, durable=True, auto_delete=False)
    yield name
    amqp_conn.channel().queue_delete(name)


@pytest.fixture
def cli(retry_app):
    app = retry_app()
    runner = CliRunner()

    def invoke(*args: str, ok: bool = True):
        result = runner.invoke(parking, list(args), obj=CLIContext(app=app, no_color=True, workdir=None),
                               env={"COLUMNS": "250"}, catch_exceptions=False)
        if ok:
            assert result.exit_code == 0, result.output
        return result
    return invoke


def test_list_shows_and_filters_without_consuming(cli, broker_url, parking_name, dest) -> None:
    charge = park_synthetic(broker_url, parking_name, 2, task="proj.billing.charge", exc=TimeoutError("slow"),
                            dest=dest)
    mail = park_synthetic(broker_url, parking_name, 1, task="proj.mail.send", exc=KeyError("to"), dest=dest)
    table = cli("list").output
    assert "3 shown of 3 parked" in table and "proj.billing.charge" in table and "TimeoutError" in table
    rows = [json.loads(line) for line in cli("list", "--json", "--task", "proj.billing.*").output.splitlines()]
    assert [r["parked_id"] for r in rows] == charge and rows[0]["attempts"] == 4
    rows = [json.loads(line) for line in cli("list", "--json", "--exception", "KeyError").output.splitlines()]
    assert [r["parked_id"] for r in rows] == mail
    later = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(time.time() + 120))
    assert cli("list", "--json", "--since", later).output == ""
    assert len(cli("list", "--json", "--until", later).output.splitlines()) == 3


def test_inspect_shows_metadata_traceback_and_body(cli, broker_url, parking_name, dest) -> None:
    (pid,) = park_synthetic(broker_url, parking_name, 1, exc=KeyError("missing"), dest=dest)
    text = cli("inspect", pid[:10]).output
    assert pid in text and "builtins.KeyError" in text and "[[0], {}, {}]" in text
    data = json.loads(cli("inspect", pid, "--json").output)
    assert data["parked_id"] == pid and data["routing_key"] == dest and data["headers"]["retries"] == 3
    missing = cli("inspect", "nope", ok=False)
    assert missing.exit_code != 0 and "no parked message" in missing.output


def test_replay_filtered_then_purge(cli, broker_url, parking_name, dest, amqp_conn) -> None:
    keep = park_synthetic(broker_url, parking_name, 2, task="proj.a", exc=IOError("x"), dest=dest)
    again = park_synthetic(broker_url, parking_name, 3, task="proj.b", exc=IOError("x"), dest=dest)
    out = cli("replay", "--task", "proj.b", "--yes", "--batch-size", "2").output
    assert "replayed 3" in out and "2 not selected" in out
    assert sorted(m.headers["x-delayq-replay"] for m in drain(amqp_conn, dest, 3, timeout=5)) == sorted(again)
    assert cli("replay", "--task", "proj.a", ok=False).exit_code != 0  # asks first; no answer aborts
    out = cli("purge", "--id", keep[0][:12], "--force").output
    assert "purged 1" in out
    assert [json.loads(line)["parked_id"] for line in cli("list", "--json").output.splitlines()] == keep[1:]
    assert "purged 1" in cli("purge", "--force").output
    assert queue_depth(amqp_conn, parking_name) == 0


def test_replay_with_delay_goes_through_the_ladder(cli, broker_url, parking_name, dest, amqp_conn) -> None:
    park_synthetic(broker_url, parking_name, 2, exc=IOError("x"), dest=dest)
    t0 = time.time()
    assert "replayed 2" in cli("replay", "--delay", "0.5", "--yes").output
    got = drain(amqp_conn, dest, 2, timeout=5)
    assert all(m.arrived - t0 >= 0.5 and m.headers["x-delayq-delay"] == 0.5 for m in got)
