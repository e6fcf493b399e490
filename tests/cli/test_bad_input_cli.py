"""Wrong input to any ``delayq`` command: one line on stderr, a non-zero exit status, never a traceback.

The broker-facing test runs the command lines reported in issue #31 as an
operator types them (``python -m celery -A MODULE delayq ...``, argv bytes
included: ``$'\\xff'`` reaches Python surrogate-escaped) against the test
broker. The others check :class:`celery_delayq.cli.base.DelayqGroup`'s
last resort and ``delayq web``'s refusal of a short secret in-process.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.bin.base import CLIContext
from click.testing import CliRunner

from celery_delayq.cli import delayq
from celery_delayq.rabbitmq import client

pytestmark = pytest.mark.timeout(180)

APP = textwrap.dedent('''
    import os
    from celery import Celery
    app = Celery("bad", broker=os.environ["BAD_BROKER"])
    app.conf.update(delayq_prefix=os.environ["BAD_PREFIX"], delayq_levels=3, delayq_unit_ms=1000,
                    broker_heartbeat=0)
''')

#: (argv after ``delayq``, exit status, what the line says). Argv items may be bytes, as a shell passes them.
REPORTED: list[tuple[list[str | bytes], int, str]] = [
    (["reschedule", "ID", "99999999999999999999", "--yes"], 2, "outside the years 1970-9999"),
    (["reschedule", "ID", "-5m", "--yes"], 2, "run-now"),
    (["reschedule", "ID", "2001-01-01T00:00:00", "--yes"], 2, "run-now"),
    (["reschedule", "ID", "", "--yes"], 2, "empty"),
    (["pending", "--due-before", "99999999999999999999"], 2, "outside the years 1970-9999"),
    (["pending", "--due-before", "999999999999"], 2, "outside the years 1970-9999"),
    (["pending", "--id", b"\xff"], 2, "not valid text (UTF-8)"),
    (["cancel", b"\xff"], 2, "not valid text (UTF-8)"),
    (["cancel", ""], 2, "empty"),
    (["run-now", b"\xff", "--yes"], 2, "not valid text (UTF-8)"),
    (["parking", "purge", "--id", b"\xff", "--yes"], 2, "not valid text (UTF-8)"),
    (["parking", "inspect", b"ab\x01"], 2, "control or unprintable character"),
    (["cancel-matching", "--yes"], 1, "no filter"),
    (["parking", "replay", "--yes"], 1, "no filter"),
    (["doctor", "--timeout", "nan"], 2, "nan is not a number of seconds"),
]


def test_the_reported_command_lines_answer_in_one_line(tmp_path: Path, broker_url: str, uid: str) -> None:
    (tmp_path / f"bad{uid}.py").write_text(APP)
    env = dict(os.environ, BAD_BROKER=broker_url, BAD_PREFIX=f"bad{uid}",
               PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    for args, code, says in REPORTED:
        out = subprocess.run([sys.executable, "-m", "celery", "-A", f"bad{uid}", "delayq", *args], cwd=tmp_path,
                             env=env, capture_output=True, timeout=120)
        stderr = out.stderr.decode("utf-8", "replace")
        lines = stderr.strip().splitlines()
        assert out.returncode == code, (args, stderr)
        assert len(lines) == 1 and lines[0].startswith("Error: ") and says in lines[0], (args, stderr)
        assert out.stdout == b"", (args, out.stdout)


def _invoke(*args: str, env: dict[str, str] | None = None) -> Any:
    app = Celery("lastresort", broker="amqp://guest:guest@127.0.0.1:1//", set_as_current=False)
    return CliRunner().invoke(delayq, list(args), obj=CLIContext(app=app, no_color=True, workdir=None), env=env)


@pytest.mark.parametrize("error, says", [
    (RuntimeError("boom"), "unexpected RuntimeError: boom (a bug: run again with DELAYQ_DEBUG=1"),
    (ValueError("bad\nsecond line"), "invalid value: bad (ValueError; DELAYQ_DEBUG=1 shows the traceback)"),
    (UnicodeEncodeError("utf-8", "\udcff", 0, 1, "surrogates not allowed"), "not valid text (UTF-8)"),
    (FileNotFoundError(2, "No such file or directory", "/nowhere/x"), "/nowhere/x: No such file or directory"),
])
def test_an_unexpected_error_is_one_line_and_debug_shows_it(monkeypatch: pytest.MonkeyPatch, error: Exception,
                                                            says: str) -> None:
    """The group's last resort: any error is one line naming its type; DELAYQ_DEBUG=1 lets it through."""
    def fail(*_: Any, **__: Any) -> Any:
        raise error

    # The module, not the command of the same name that celery_delayq.cli exports.
    monkeypatch.setattr(sys.modules["celery_delayq.cli.pending"], "find_pending", fail)
    out = _invoke("pending")
    assert out.exit_code == 1 and out.stderr.strip().splitlines() == [f"Error: {out.stderr.strip()[7:]}"]
    assert says in out.stderr and "Traceback" not in out.output
    debug = _invoke("pending", env={"DELAYQ_DEBUG": "1"})
    if isinstance(error, (UnicodeError, OSError)):  # specific messages: the same line
        assert says in debug.stderr
    else:
        assert debug.exception is error


@pytest.mark.parametrize("variable", ["DELAYQ_WEB_TOKEN", "DELAYQ_WEB_PASSWORD"])
def test_web_refuses_a_short_secret_in_one_line(variable: str) -> None:
    env = {variable: "x", "DELAYQ_WEB_USERNAME": "ops"}
    out = _invoke("web", "--port", "0", env=env)
    assert out.exit_code == 1, out.output
    [line] = out.stderr.strip().splitlines()
    assert "1 character(s); give at least 16" in line and "Traceback" not in out.output
    assert "delayq web on" not in out.output  # never served


def _silent_listener() -> socket.socket:
    """A port that takes connections and never speaks AMQP: a broker too busy to finish the handshake."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    held: list[Any] = []
    threading.Thread(target=lambda: [held.append(srv.accept()) for _ in range(8)], daemon=True).start()
    return srv


def test_a_broker_that_does_not_answer_gets_the_read_side_s_time_and_is_named_as_slow(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A reading command waits READ_SIDE_CONNECT_TIMEOUT_S for the handshake, not Celery's 4 s (or the app's
    shorter ``broker_connection_timeout``), then says the broker did not answer, not that it is unreachable."""
    monkeypatch.setattr(client, "READ_SIDE_CONNECT_TIMEOUT_S", 3.0)
    srv = _silent_listener()
    try:
        app = Celery("slow", broker=f"amqp://guest:guest@127.0.0.1:{srv.getsockname()[1]}//", set_as_current=False)
        app.conf.update(delayq_enabled=True, broker_connection_timeout=1)
        started = time.monotonic()
        out = CliRunner().invoke(delayq, ["status"], obj=CLIContext(app=app, no_color=True, workdir=None))
        waited = time.monotonic() - started
    finally:
        srv.close()
    assert out.exit_code == 1 and 2.9 <= waited < 10, (waited, out.output)
    [line] = out.output.strip().splitlines()
    assert "did not answer within 3 s" in line and "overloaded" in line and "cannot reach" not in line


def test_a_closed_port_is_named_unreachable_at_once() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    app = Celery("closed", broker=f"amqp://guest:guest@127.0.0.1:{port}//", set_as_current=False)
    app.conf.update(delayq_enabled=True)
    started = time.monotonic()
    out = CliRunner().invoke(delayq, ["status"], obj=CLIContext(app=app, no_color=True, workdir=None))
    assert out.exit_code == 1 and time.monotonic() - started < 3, out.output
    [line] = out.output.strip().splitlines()
    assert f"cannot reach RabbitMQ at amqp://guest:**@127.0.0.1:{port}//" in line and "refused" in line.lower()
