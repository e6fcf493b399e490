"""One rule for every time option, ``report`` as a real ``delayq`` command, hints that name the app.

The broker-facing tests run ``python -m celery -A MODULE delayq ...`` as a
subprocess, as an operator does, with ``TZ`` set to a zone 14 hours off UTC
(``Pacific/Kiritimati``): a time read as local instead of UTC is then off by
half a day, so a wrong reading cannot pass by chance.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

import click
import pytest
from click.testing import CliRunner

import celery_delayq
from celery_delayq.cli import delayq
from celery_delayq.options import Delay, DueTime, Id, Moment
from celery_delayq.inputs import DELAY_FORMS, DUE_FORMS
from celery_delayq.ladder.moments import parse_moment
from helpers import management_url
from retry_helpers import park_synthetic, parking_name_fixture  # noqa: F401  (fixture)

#: Time parsing and hints do not differ between RabbitMQ lines: the 3.10 leg runs them, the 4.3 leg skips them.
pytestmark = [pytest.mark.timeout(120), pytest.mark.one_broker]

#: UTC+14: any local reading of a time without an offset is 14 hours off.
FAR_ZONE = "Pacific/Kiritimati"
T = 1_764_000_000.0  # 2025-11-24T16:00:00Z

APP = textwrap.dedent('''
    import os
    from celery import Celery
    app = Celery("{main}", broker=os.environ["CLI_BROKER"])
    app.conf.update(delayq_prefix=os.environ["CLI_PREFIX"], delayq_levels=4, delayq_unit_ms=1000,
                    delayq_parking_queue=os.environ.get("CLI_PARKING", "unused"),
                    delayq_parking_queue_type="classic", broker_heartbeat=0,
                    delayq_management_url=os.environ["CLI_MGMT"])  # topology delete lists the broker through it
''')


def _time_options() -> list[tuple[str, click.Option]]:
    """Every option of every ``delayq`` command (and sub-command) whose value is a time."""
    found = []

    def walk(command: click.Command, path: str) -> None:
        for param in command.params:
            if isinstance(param, click.Option) and (param.metavar == "WHEN" or param.name in (
                    "since", "until", "due_before", "due_after")):
                found.append((f"{path} {param.opts[-1]}", param))
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                walk(sub, f"{path} {name}")

    walk(delayq, "delayq")
    return found


def test_every_time_option_reads_time_one_way_and_says_so() -> None:
    options = _time_options()
    names = {name for name, _ in options}
    assert {"delayq pending --due-before", "delayq pending --due-after", "delayq parking list --since",
            "delayq parking replay --until", "delayq report --since", "delayq report --until"} <= names
    for name, option in options:
        assert isinstance(option.type, Moment), name
        assert "UTC unless it has an offset" in (option.help or ""), name
        ahead = option.type.direction == "ahead"
        assert ("from now" if ahead else "ago") in (option.help or ""), name


def _commands(command: click.Command = delayq,
              path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    """Every command of the ``delayq`` group, sub-groups' commands included, with its path."""
    yield path, command
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from _commands(sub, (*path, name))


#: Parameter names that read a time or a delay; each must have one of the CLI's time types.
_TIME_NAMES = ("since", "until", "due", "when", "delay")


def test_every_time_or_delay_parameter_shows_its_forms_in_help() -> None:
    """Each option or argument that takes a time or a delay says, in the --help an operator reads, how to write it."""
    checked = 0
    for path, command in _commands():
        timed = [p for p in command.params if isinstance(p.type, (Moment, DueTime, Delay))
                 or any(word in (p.name or "") for word in _TIME_NAMES)]
        if not timed:
            continue
        shown = CliRunner().invoke(delayq, [*path, "--help"], terminal_width=200)
        assert shown.exit_code == 0, shown.output
        text = " ".join(shown.output.split())  # click wraps the help
        for param in timed:
            where = f"delayq {' '.join(path)} {param.human_readable_name}"
            assert isinstance(param.type, (Moment, DueTime, Delay)), f"{where}: not read by a time type"
            forms = {Moment: "ISO 8601 (UTC unless it has an offset), epoch seconds, or a duration",
                     DueTime: DUE_FORMS, Delay: DELAY_FORMS}[type(param.type)]
            assert " ".join(forms.split()) in text, f"{where}: its --help does not name the forms"
            checked += 1
    assert checked >= 12  # pending, cancel-matching, reschedule, parking list/replay/purge, report


def test_every_id_is_read_as_one() -> None:
    """Ids (task ids, parked ids, prefixes) all go through :func:`celery_delayq.inputs.check_id`."""
    ids = [(path, p) for path, command in _commands() for p in command.params
           if p.name in ("task_id", "task_ids", "ids", "parked_id", "id_prefix")]
    assert len(ids) >= 8
    for path, param in ids:
        assert isinstance(param.type, Id), f"delayq {' '.join(path)} {param.human_readable_name}"


@pytest.mark.parametrize("text, direction, expected", [
    ("2025-11-24T16:00:00", "ago", T),            # no offset: UTC, whatever TZ says
    ("2025-11-24 16:00", "ahead", T),
    ("2025-11-24T16:00:00Z", "ago", T),
    ("2025-11-24T17:00:00+01:00", "ago", T),
    ("1764000000", "ago", T),
    ("2h", "ago", T - 7200),
    ("2h", "ahead", T + 7200),
    ("+90s", "ago", T + 90),                      # a sign overrides the option's direction
    ("-10m", "ahead", T - 600),
    ("1w", "ago", T - 7 * 86400),
])
def test_moment_forms(text: str, direction: Any, expected: float, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", FAR_ZONE)
    time.tzset()
    try:
        assert parse_moment(text, direction=direction, now=T) == expected
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


@pytest.fixture
def cli(tmp_path: Path, broker_url: str, uid: str) -> Callable[..., subprocess.CompletedProcess[str]]:
    """``python -m celery -A hintsapp_<uid> delayq ARGS`` in a subprocess, TZ 14 hours off UTC."""
    module = f"hintsapp_{uid}"
    (tmp_path / f"{module}.py").write_text(APP.format(main=f"shop{uid}"))
    env = dict(os.environ, CLI_BROKER=broker_url, CLI_PREFIX=f"tz{uid}", TZ=FAR_ZONE, CLI_MGMT=management_url(),
               PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))

    def run(*args: str, app: str = module, **extra_env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "celery", "-A", app, "delayq", *args],
                              env={**env, **extra_env}, capture_output=True, text=True, timeout=120, cwd=tmp_path)

    run.module = module  # type: ignore[attr-defined]
    return run


def _utc_naive(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")


def test_parking_since_reads_utc_like_pending(cli, broker_url: str, parking_name: str, amqp_conn) -> None:
    dest = f"dest.{uuid.uuid4().hex[:6]}"
    amqp_conn.channel().queue_declare(dest, durable=True, auto_delete=False)
    try:
        parked_at = time.time() - 1800
        [pid] = park_synthetic(broker_url, parking_name, 1, exc=TimeoutError("slow"), dest=dest, parked_at=parked_at)

        def listed(*args: str) -> list[str]:
            out = cli("parking", "list", "--json", *args, CLI_PARKING=parking_name)
            assert out.returncode == 0, out.stderr
            return [row["parked_id"] for row in json.loads(out.stdout)]

        # Read as local time (UTC+14) these would be half a day off and flip both answers.
        assert listed("--since", _utc_naive(parked_at - 60)) == [pid]
        assert listed("--until", _utc_naive(parked_at - 60)) == []
        assert listed("--since", "1h") == [pid]          # a duration looks back for --since
        assert listed("--since", "10m") == []
    finally:
        amqp_conn.channel().queue_delete(dest)


def test_pending_due_before_reads_utc(cli, make_app, uid: str) -> None:
    app = make_app(delayq_enabled=True, delayq_prefix=f"tz{uid}", delayq_levels=4, delayq_unit_ms=1000)

    @app.task(name=f"tz{uid}.later")
    def later() -> None:
        return None

    celery_delayq.install(app).publisher.declare()
    try:
        result = later.apply_async(countdown=30)
        due = time.time() + 30

        def listed(*args: str) -> list[str]:
            out = cli("pending", "--json", *args)
            assert out.returncode == 0, out.stderr
            return [row["task_id"] for row in json.loads(out.stdout)]

        assert listed("--due-before", _utc_naive(due + 5)) == [result.id]
        assert listed("--due-after", _utc_naive(due + 5)) == []
        assert listed("--due-before", "2m") == [result.id]  # a duration looks ahead for a due time
    finally:
        out = cli("topology", "delete", "--discard-messages", "--yes")
        assert out.returncode == 0, out.stderr


def test_report_is_a_delayq_command_with_its_options_and_errors(cli) -> None:
    bad = cli("report", "--since", "banana")
    assert bad.returncode == 2
    assert bad.stderr.splitlines() == [bad.stderr.strip()]  # one line: the error, then where the help is
    assert "Invalid value for '--since': 'banana' is not a time" in bad.stderr
    assert "(see 'python -m celery delayq report --help')" in bad.stderr
    shown = cli("report", "--help")
    assert shown.returncode == 0
    for option in ("--events", "--out", "--since", "--until", "--incremental", "--master", "--conf", "--live"):
        assert option in shown.stdout, option
    assert "UTC unless it has an offset" in " ".join(shown.stdout.split())  # click wraps the help


def test_hints_name_the_app_as_it_was_given(cli) -> None:
    absent = cli("status")
    assert absent.returncode == 1
    assert f"`celery -A {cli.module} delayq topology declare`" in absent.stderr
    assert "-A APP" not in absent.stderr
    # Given as module:attribute, the hint repeats exactly that.
    spelled = cli("status", app=f"{cli.module}:app")
    assert f"`celery -A {cli.module}:app delayq topology declare`" in spelled.stderr
    as_json = cli("status", "--json")
    assert f"celery -A {cli.module} delayq topology declare" in as_json.stderr
