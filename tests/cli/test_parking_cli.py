"""``delayq parking`` commands, run with Celery's own CLI context against the real broker."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
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
    assert "purged 1" in cli("purge", "--all", "--yes", "--expect", "1").output
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
    out = cli("replay", "--all", "--dry-run").output
    assert "dry run: 3 of 3" in out and "--yes --expect 3" in out and all(i[:12] in out for i in ok + gone)
    assert "would replay 2 at once; 1 would stay parked" in out and "Nothing was changed" in out
    assert "after 5 s in the ladder" in cli("replay", "--dry-run", "--delay", "5", "--task", "proj.a").output
    assert queue_depth(amqp_conn, parking_name) == 3 and queue_depth(amqp_conn, dest) == 0


def test_replay_filtered_then_purge(cli, broker_url, parking_name, dest, amqp_conn) -> None:
    keep = park_synthetic(broker_url, parking_name, 2, task="proj.a", exc=IOError("x"), dest=dest)
    again = park_synthetic(broker_url, parking_name, 3, task="proj.b", exc=IOError("x"), dest=dest)
    out = cli("replay", "--task", "proj.b", "--yes", "--expect", "3", "--batch-size", "2").output
    assert "replayed 3" in out and "2 not selected" in out
    assert sorted(m.headers["x-delayq-replay"] for m in drain(amqp_conn, dest, 3, timeout=5)) == sorted(again)
    refused = cli("replay", "--task", "proj.a", ok=False)  # not a terminal, no --yes: refused, not replayed
    assert refused.exit_code == 1 and "Replay 2 parked message(s)" in refused.output
    assert "--yes --expect 2" in refused.output
    assert cli("purge", ok=False).exit_code == 1
    assert queue_depth(amqp_conn, parking_name) == 2
    out = cli("purge", "--id", keep[0][:12], "--yes").output
    assert "purged 1" in out
    assert _ids(cli("list", "--json").output) == keep[1:]
    assert "purged 1" in cli("purge", "--all", "--expect", "1", "--force").output  # the old spelling of --yes
    assert queue_depth(amqp_conn, parking_name) == 0


def test_replay_with_delay_goes_through_the_ladder(cli, broker_url, parking_name, dest, amqp_conn) -> None:
    park_synthetic(broker_url, parking_name, 2, exc=IOError("x"), dest=dest)
    t0 = time.time()
    assert "replayed 2" in cli("replay", "--all", "--delay", "0.5", "--yes", "--expect", "2").output
    got = drain(amqp_conn, dest, 2, timeout=5)
    assert all(m.arrived - t0 >= 0.5 and m.headers["x-delayq-delay"] == 0.5 for m in got)


def _refusal(result, code: int = 1) -> str:
    """The one line a refused command prints on stderr (no traceback, nothing else)."""
    assert result.exit_code == code, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


def test_replay_and_purge_refuse_unknown_ids_and_unconfirmed_counts(cli, broker_url, parking_name, dest,
                                                                     amqp_conn) -> None:
    """An unknown --id is exit 1 (as for cancel and inspect); no filter, --yes without --expect, --all with a
    filter and a count that changed are refused; nothing is replayed or deleted."""
    ids = park_synthetic(broker_url, parking_name, 3, task="proj.a", exc=IOError("x"), dest=dest)
    for command in ("replay", "purge"):
        line = _refusal(cli(command, "--id", "feedface", "--yes", ok=False))
        assert "no parked message" in line and "'feedface'" in line and "nothing was changed" in line
        assert "'feedface'" in _refusal(cli(command, "--id", ids[0], "--id", "feedface", "--yes", ok=False))
        assert "no filter" in _refusal(cli(command, "--yes", ok=False))
        assert "cannot be combined" in _refusal(cli(command, "--all", "--task", "proj.a", "--dry-run", ok=False))
        assert "--dry-run" in _refusal(cli(command, "--task", "proj.a", "--yes", ok=False))
        assert "not the 2 confirmed" in _refusal(cli(command, "--task", "proj.a", "--yes", "--expect", "2", ok=False))
        assert "Invalid value for '--id'" in _refusal(cli(command, "--id", "\udcff", "--yes", ok=False), 2)
    assert queue_depth(amqp_conn, parking_name) == 3 and queue_depth(amqp_conn, dest) == 0
    dry = cli("purge", "--task", "proj.a", "--dry-run").output
    assert "dry run: 3 of 3" in dry and "--yes --expect 3" in dry and "Nothing was changed" in dry
    one = cli("replay", "--id", ids[0][:12], "--yes")  # --id alone: the ids are the count, no --expect
    assert "replayed 1" in one.stdout
    assert f"action=parking-replay ids=1 [{ids[0]}]" in one.stderr and "via=cli" in one.stderr
    rest = cli("purge", "--task", "proj.a", "--yes", "--expect", "2")
    assert "purged 2" in rest.stdout
    assert "action=parking-purge ids=2" in rest.stderr and all(i in rest.stderr for i in ids[1:])
    assert queue_depth(amqp_conn, parking_name) == 0 and len(drain(amqp_conn, dest, 1, timeout=5)) == 1


def test_replay_delay_reads_a_duration_and_refuses_a_negative_one(cli, broker_url, parking_name, dest,
                                                                   amqp_conn) -> None:
    park_synthetic(broker_url, parking_name, 1, exc=IOError("x"), dest=dest)
    assert "after 90 s in the ladder" in cli("replay", "--all", "--delay", "90s", "--dry-run").output
    for bad in ("-5", "soon", "nan"):
        line = _refusal(cli("replay", "--all", "--delay", bad, "--yes", "--expect", "1", ok=False), 2)
        assert "Invalid value for '--delay'" in line and "90s, 10m" in line
    assert queue_depth(amqp_conn, parking_name) == 1


_PTY_APP = '''
import os
from celery import Celery
app = Celery("ptypark", broker=os.environ["PTY_BROKER"])
app.conf.update(delayq_parking_queue=os.environ["PTY_PARKING"], delayq_parking_queue_type="classic",
                broker_heartbeat=0)
'''


def test_at_a_terminal_the_prompt_shows_the_count_and_confirms(cli, broker_url, parking_name, dest, amqp_conn,
                                                                tmp_path) -> None:
    """Without --yes, a terminal is asked (the count in the question) instead of --expect; "n" changes nothing."""
    park_synthetic(broker_url, parking_name, 2, task="proj.a", exc=IOError("x"), dest=dest)
    keep = park_synthetic(broker_url, parking_name, 1, task="proj.b", exc=IOError("x"), dest=dest)
    (tmp_path / "ptypark.py").write_text(_PTY_APP)
    env = dict(os.environ, PTY_BROKER=broker_url, PTY_PARKING=parking_name,
               PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))

    def at_terminal(answer: str, *extra: str) -> str:
        leader, follower = pty.openpty()
        proc = subprocess.Popen([sys.executable, "-m", "celery", "-A", "ptypark", "delayq", "parking", "purge",
                                 "--task", "proj.a", *extra], stdin=follower, stdout=follower, stderr=follower,
                                env=env, cwd=tmp_path)
        os.close(follower)
        seen = b""
        try:
            while b"[y/N]" not in seen and proc.poll() is None:
                seen += os.read(leader, 4096)
            if b"[y/N]" in seen:
                os.write(leader, answer.encode() + b"\n")
            proc.wait(timeout=60)
            while chunk := os.read(leader, 4096):
                seen += chunk
        except OSError:  # the terminal closed with the process
            pass
        os.close(leader)
        return seen.decode()

    said_no = at_terminal("n")
    assert "Delete 2 parked message(s)" in said_no and "Aborted" in said_no
    assert queue_depth(amqp_conn, parking_name) == 3
    changed = at_terminal("y", "--expect", "3")  # a count that changed is refused before the question
    assert "not the 3 confirmed" in changed and "[y/N]" not in changed and queue_depth(amqp_conn, parking_name) == 3
    said_yes = at_terminal("y")
    assert "purged 2" in said_yes and "action=parking-purge ids=2" in said_yes
    assert _ids(cli("list", "--json").output) == keep
