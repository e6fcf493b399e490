"""``delayq parking`` commands, run with Celery's own CLI context against the real broker."""

from __future__ import annotations

import json
import time
from collections import Counter

import pytest

from cli_helpers import run_delayq
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

    def invoke(*args: str, ok: bool = True):
        return run_delayq(app, "parking", *args, ok=ok)
    return invoke


def _ids(output: str) -> list[str]:
    return [row["parked_id"] for row in json.loads(output)]


def test_list_shows_and_filters_without_consuming(cli, broker_url, parking_name, dest) -> None:
    charge = park_synthetic(broker_url, parking_name, 2, task="proj.billing.charge", exc=TimeoutError("slow"),
                            dest=dest)
    mail = park_synthetic(broker_url, parking_name, 1, task="proj.mail.send", exc=KeyError("to"), dest=dest)
    table = cli("list").output
    assert "3 shown of 3 parked" in table and "proj.billing.charge" in table and "TimeoutError" in table
    rows = json.loads(cli("list", "--json", "--task", "proj.billing.*").output)
    assert [r["parked_id"] for r in rows] == charge and rows[0]["attempts"] == 4
    assert _ids(cli("list", "--json", "--exception", "KeyError").output) == mail
    later = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(time.time() + 120))  # no offset: UTC
    assert cli("list", "--json", "--since", later).output.strip() == "[]"
    assert len(_ids(cli("list", "--json", "--until", later).output)) == 3


def test_list_of_an_empty_queue(cli, broker_url, parking_name, dest, amqp_conn) -> None:
    assert cli("list", "--json").output.strip() == "[]"  # the queue does not exist yet
    park_synthetic(broker_url, parking_name, 1, exc=IOError("x"), dest=dest)
    assert "purged 1" in cli("purge", "--yes").output
    assert cli("list", "--json").output.strip() == "[]"  # exists, empty
    assert "nothing is parked in" in cli("list").output  # an empty queue says so, not an empty table


def test_inspect_shows_metadata_traceback_once_and_body(cli, broker_url, parking_name, dest) -> None:
    try:
        raise KeyError("missing")
    except KeyError as raised:  # with a real traceback
        exc = raised
    (pid,) = park_synthetic(broker_url, parking_name, 1, exc=exc, dest=dest)
    text = cli("inspect", pid[:10]).output
    assert pid in text and "builtins.KeyError" in text and "[[0], {}, {}]" in text
    assert text.count("Traceback (most recent call last)") == 1 and "x-delayq-traceback" not in text
    data = json.loads(cli("inspect", pid, "--json").output)
    assert data["parked_id"] == pid and data["routing_key"] == dest and data["headers"]["retries"] == 3
    assert json.dumps(data).count("Traceback (most recent call last)") == 1
    missing = cli("inspect", "nope", ok=False)
    assert missing.exit_code == 1 and "no parked message" in missing.output


def test_inspect_takes_the_task_id(cli, broker_url, parking_name, dest) -> None:
    (pid,) = park_synthetic(broker_url, parking_name, 1, exc=KeyError("k"), dest=dest)
    task_id = json.loads(cli("list", "--json").output)[0]["task_id"]
    assert task_id and task_id != pid
    data = json.loads(cli("inspect", task_id, "--json").output)
    assert data["parked_id"] == pid and data["task_id"] == task_id
    assert pid in cli("inspect", task_id[:8]).output  # the start of a task id, as for a parked id
    missing = cli("inspect", "feedface-nothing", ok=False)
    assert missing.exit_code == 1 and "parked id or a task id" in missing.output


def _shared_prefix(ids: list[str]) -> str:
    """A one-character prefix that at least two ids share (17 hex ids always have one)."""
    return next(ch for ch, n in Counter(i[0] for i in ids).items() if n > 1)


def test_an_ambiguous_id_lists_its_candidates(cli, broker_url, parking_name, dest) -> None:
    ids = park_synthetic(broker_url, parking_name, 17, exc=IOError("x"), dest=dest)
    prefix = _shared_prefix(ids)
    candidates = sorted(i for i in ids if i.startswith(prefix))
    out = cli("inspect", prefix, ok=False)
    assert out.exit_code == 1 and "give more of the id" in out.output
    assert all(c in out.output for c in candidates[:10])
    for command in ("replay", "purge"):
        refused = cli(command, "--id", prefix, "--yes", ok=False)
        assert refused.exit_code == 1 and candidates[0] in refused.output
    assert len(_ids(cli("list", "--json").output)) == 17  # nothing replayed or purged


def test_replay_dry_run_changes_nothing(cli, broker_url, parking_name, dest, amqp_conn, uid) -> None:
    ok = park_synthetic(broker_url, parking_name, 2, task="proj.a", exc=IOError("x"), dest=dest)
    gone = park_synthetic(broker_url, parking_name, 1, task="proj.b", exc=IOError("x"), dest=f"gone.{uid}")
    out = cli("replay", "--dry-run").output
    assert "dry run: 3 of 3" in out and all(i[:12] in out for i in ok + gone)
    assert "would replay 2 at once; 1 would stay parked" in out and "Nothing was changed" in out
    assert "after 5 s in the ladder" in cli("replay", "--dry-run", "--delay", "5", "--task", "proj.a").output
    assert queue_depth(amqp_conn, parking_name) == 3 and queue_depth(amqp_conn, dest) == 0


def test_replay_filtered_then_purge(cli, broker_url, parking_name, dest, amqp_conn) -> None:
    keep = park_synthetic(broker_url, parking_name, 2, task="proj.a", exc=IOError("x"), dest=dest)
    again = park_synthetic(broker_url, parking_name, 3, task="proj.b", exc=IOError("x"), dest=dest)
    out = cli("replay", "--task", "proj.b", "--yes", "--batch-size", "2").output
    assert "replayed 3" in out and "2 not selected" in out
    assert sorted(m.headers["x-delayq-replay"] for m in drain(amqp_conn, dest, 3, timeout=5)) == sorted(again)
    refused = cli("replay", "--task", "proj.a", ok=False)  # not a terminal, no --yes: refused, not replayed
    assert refused.exit_code == 1 and "Replay 2 matching message(s)" in refused.output and "--yes" in refused.output
    assert cli("purge", ok=False).exit_code == 1
    assert queue_depth(amqp_conn, parking_name) == 2
    out = cli("purge", "--id", keep[0][:12], "--yes").output
    assert "purged 1" in out
    assert _ids(cli("list", "--json").output) == keep[1:]
    assert "purged 1" in cli("purge", "--force").output  # the old spelling still works
    assert queue_depth(amqp_conn, parking_name) == 0


def test_replay_with_delay_goes_through_the_ladder(cli, broker_url, parking_name, dest, amqp_conn) -> None:
    park_synthetic(broker_url, parking_name, 2, exc=IOError("x"), dest=dest)
    t0 = time.time()
    assert "replayed 2" in cli("replay", "--delay", "0.5", "--yes").output
    got = drain(amqp_conn, dest, 2, timeout=5)
    assert all(m.arrived - t0 >= 0.5 and m.headers["x-delayq-delay"] == 0.5 for m in got)
