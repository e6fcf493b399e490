"""Prometheus metrics on a real broker: ``celery -A APP delayq metrics`` as a process, and the
exporter a real worker starts with ``delayq_metrics_port`` (counters, lateness, broker gauges)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator

import amqp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from celery_delayq import DelayedRetryTask
from celery_delayq.glue.app_ladder import ladder_for
from helpers import BROKER_HOST, Collector, running_worker

pytestmark = pytest.mark.timeout(90)

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> Samples:
    """Every sample of ``/metrics``, keyed by (name, sorted labels)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def wait_for(port: int, check: Callable[[Samples], bool], timeout: float = 30.0) -> Samples:
    """Scrape until ``check`` holds (the broker and the worker are asynchronous), else fail with the last scrape."""
    deadline = time.time() + timeout
    last: Samples = {}
    while time.time() < deadline:
        with contextlib.suppress(OSError):
            last = scrape(port)
            if check(last):
                return last
        time.sleep(0.2)
    raise AssertionError(f"metrics never matched within {timeout} s: "
                         f"{ {k: v for k, v in last.items() if k[0].startswith('delayq')} }")


def v(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


@contextlib.contextmanager
def ladder_cleanup(app: Any, vhost: str, *queues: str) -> Iterator[None]:
    """Delete the app's ladder (with its index streams) and the named queues afterwards."""
    try:
        yield
    finally:
        conn = amqp.Connection(BROKER_HOST, virtual_host=vhost)
        conn.connect()
        try:
            ctx = ladder_for(app)
            with contextlib.suppress(Exception):
                ctx.topology(conn).delete(conn, if_empty=False, keep_shared=False)
            for name in queues:
                with contextlib.suppress(Exception):
                    conn.channel().queue_delete(name)
        finally:
            conn.close()


def test_cli_serves_the_broker_state(make_app: Callable[..., Any], broker_url: str, vhost: str, uid: str,
                                     amqp_conn: amqp.Connection, tmp_path: Path) -> None:
    prefix = f"mx{uid}"
    (tmp_path / "metrics_app.py").write_text(
        "from celery import Celery\n"
        f"app = Celery('m', broker={broker_url!r})\n"
        f"app.conf.update(delayq_prefix={prefix!r}, delayq_levels=3, delayq_unit_ms=1000, broker_heartbeat=0)\n")
    app = make_app(delayq_prefix=prefix, delayq_levels=3, delayq_unit_ms=1000)
    ctx = ladder_for(app)
    with ladder_cleanup(app, vhost, ctx.config.parking_queue_name):
        ctx.topology(amqp_conn).declare(amqp_conn)
        spec = ctx.config.spec
        ch = amqp_conn.channel()
        ch.queue_declare(ctx.config.parking_queue_name, durable=True, auto_delete=False)
        ch.confirm_select()
        for _ in range(3):  # level 2, digit 2: waits 32 s there
            ch.basic_publish_confirm(amqp.Message("w"), spec.level_exchange(2), "2.0.0.tok")
        for _ in range(2):
            ch.basic_publish_confirm(amqp.Message("p"), "", ctx.config.parking_queue_name)
        ch.basic_publish_confirm(amqp.Message("u"), spec.unroutable_exchange, "")

        port = _free_port()
        env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
                   PYTHONFAULTHANDLER="1")
        proc = subprocess.Popen([sys.executable, "-m", "celery", "-A", "metrics_app", "delayq", "metrics",
                                 "--port", str(port), "--addr", "127.0.0.1"],
                                cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                preexec_fn=_as_at_a_terminal)
        try:
            got = wait_for(port, lambda s: v(s, "delayq_ladder_waiting_messages") == 3
                           and v(s, "delayq_parked_messages") == 2, timeout=40)
        finally:
            out = _ctrl_c(proc)
        assert proc.returncode == 0, out
        assert f"/metrics" in out and str(port) in out
    assert v(got, "delayq_broker_up") == 1 and v(got, "delayq_ladder_exists") == 1
    assert [v(got, "delayq_waiting_messages", level=str(k)) for k in (2, 1, 0)] == [3, 0, 0]
    assert v(got, "delayq_unroutable_messages") == 1
    # a standalone exporter sees no events of its own, but serves the series
    for name in ("delayq_messages_scheduled_total", "delayq_messages_delivered_total",
                 "delayq_retries_scheduled_total", "delayq_messages_parked_total",
                 "delayq_delivery_lateness_seconds_count"):
        assert v(got, name) == 0, name


def _as_at_a_terminal() -> None:
    """In the exporter's process before exec: Ctrl-C does what it does at a terminal.

    A test run started in the background by a shell without job control (``./dev test &``, a CI runner)
    inherits SIGINT ignored, and so did the exporter: Python leaves an ignored SIGINT ignored, so it never
    raised KeyboardInterrupt and still served 20 s after Ctrl-C (the 4.3 leg of a rehearsal, twice).
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _ctrl_c(proc: subprocess.Popen[Any]) -> str:
    """Ctrl-C the exporter; if it has not exited 20 s later, fail with every thread's stack (faulthandler)."""
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)  # PYTHONFAULTHANDLER=1: dumps every thread's stack to stderr
        out, err = proc.communicate(timeout=20)
        pytest.fail(f"delayq metrics still ran 20 s after Ctrl-C; its threads:\n{_text(err) or _text(out)}")
    return _text(out) + _text(err)


def _text(data: str | bytes | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


def _reachable(host: str, port: int) -> bool:
    """Does ``http://host:port/metrics`` answer (a whole request, so no half-open connection is left)?"""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def _outside_address() -> str:
    """An address of this host that is not loopback (what another machine would connect to)."""
    out = subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split()
    v4 = [a for a in out if "." in a and not a.startswith("127.")]
    if not v4:
        pytest.skip("this host has no non-loopback IPv4 address to connect from")
    return v4[0]


def test_the_exporter_listens_on_loopback_unless_told(make_app: Callable[..., Any], vhost: str) -> None:
    from celery_delayq.telemetry.metrics import serve

    outside = _outside_address()
    default = serve(make_app(), 0)
    try:
        assert default.httpd.server_address[0] == "127.0.0.1"
        assert _reachable("127.0.0.1", default.port) and not _reachable(outside, default.port)
        assert v(scrape(default.port), "delayq_broker_up") is not None
    finally:
        default.close()
    chosen = serve(make_app(delayq_metrics_address="0.0.0.0"), 0)  # the explicit choice, as a setting
    try:
        assert chosen.httpd.server_address[0] == "0.0.0.0" and _reachable(outside, chosen.port)
    finally:
        chosen.close()


def test_cli_exporter_binds_loopback_by_default_and_addr_when_given(
        make_app: Callable[..., Any], broker_url: str, vhost: str, uid: str, tmp_path: Path) -> None:
    outside = _outside_address()
    name = f"ma{uid}"
    (tmp_path / f"{name}.py").write_text(f"from celery import Celery\napp = Celery({name!r}, broker={broker_url!r})\n"
                                         f"app.conf.delayq_prefix = 'ma{uid}'\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
               PYTHONFAULTHANDLER="1")
    for extra, on_outside in (((), False), (("--addr", "0.0.0.0"), True)):
        port = _free_port()
        proc = subprocess.Popen([sys.executable, "-m", "celery", "-A", name, "delayq", "metrics", "--port", str(port),
                                 *extra], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                preexec_fn=_as_at_a_terminal)
        try:
            deadline = time.time() + 30
            while not _reachable("127.0.0.1", port) and time.time() < deadline:
                time.sleep(0.2)
            assert _reachable("127.0.0.1", port), proc.stderr.read() if proc.poll() is not None else "not listening"
            assert _reachable(outside, port) is on_outside, extra
        finally:
            _ctrl_c(proc)


def test_worker_exporter_binds_loopback_by_default(make_app: Callable[..., Any], vhost: str, uid: str) -> None:
    outside = _outside_address()
    port = _free_port()
    app = make_app(delayq_enabled=True, delayq_prefix=f"mw{uid}", delayq_levels=3, delayq_unit_ms=1000,
                   delayq_metrics_port=port)
    with ladder_cleanup(app, vhost), running_worker(app):
        wait_for(port, lambda s: v(s, "delayq_broker_up") == 1)
        assert not _reachable(outside, port)


def test_cli_reports_a_taken_port(make_app: Callable[..., Any], vhost: str) -> None:
    from celery.bin.base import CLIContext
    from click.testing import CliRunner

    from celery_delayq.cli import delayq

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        result = CliRunner().invoke(delayq, ["metrics", "--port", str(port), "--addr", "127.0.0.1"],
                                    obj=CLIContext(app=make_app(), no_color=True, workdir=None))
    assert result.exit_code == 1 and f"cannot listen on 127.0.0.1:{port}" in result.output


def test_worker_exporter_counts_events_and_reads_the_broker(
        make_app: Callable[..., Any], vhost: str, uid: str, collector: Collector) -> None:
    port = _free_port()
    parking = f"park.{uid}"
    app = make_app(delayq_enabled=True, delayq_prefix=f"mw{uid}", delayq_levels=3, delayq_unit_ms=1000,
                   delayq_metrics_port=port, delayq_parking_queue=parking, delayq_parking_queue_type="classic")

    @app.task
    def ping(tag: str) -> None:
        collector.add(task="ping", tag=tag)

    @app.task(base=DelayedRetryTask, bind=True, max_retries=2)
    def flaky(self: Any) -> None:
        collector.add(task="flaky", retries=self.request.retries)
        if self.request.retries == 0:
            raise self.retry(exc=IOError("once"), countdown=1)

    @app.task(base=DelayedRetryTask, bind=True, acks_late=False, autoretry_for=(Exception,),
              delayq_park_on=(ValueError,))
    def bad(self: Any) -> None:
        collector.add(task="bad")
        raise ValueError("park me")

    with ladder_cleanup(app, vhost, parking), running_worker(app):
        before = wait_for(port, lambda s: v(s, "delayq_broker_up") == 1)
        assert v(before, "delayq_messages_delivered_total") == 0
        assert v(before, "delayq_ladder_waiting_messages") == 0
        for i in range(3):
            ping.apply_async((f"late{i}",), countdown=40)  # waits in level 2 for 32 s
        ping.apply_async(("soon",), countdown=1)
        flaky.delay()
        bad.delay()
        collector.wait_for(4, timeout=30)  # ping soon, flaky twice, bad once
        got = wait_for(port, lambda s: v(s, "delayq_messages_delivered_total") == 2
                       and v(s, "delayq_messages_parked_total") == 1 and v(s, "delayq_parked_messages") == 1)
    assert sorted(i["task"] for i in collector.items) == ["bad", "flaky", "flaky", "ping"]
    assert v(got, "delayq_messages_scheduled_total") == 5  # 3 late + 1 soon + 1 retry
    assert v(got, "delayq_retries_scheduled_total") == 1
    # both ladder deliveries (the countdown and the retry) were observed, each under a second late
    assert v(got, "delayq_delivery_lateness_seconds_count") == 2
    assert v(got, "delayq_delivery_lateness_seconds_bucket", le="1.0") == 2
    assert 0 <= v(got, "delayq_delivery_lateness_seconds_sum") < 2  # type: ignore[operator]
    assert v(got, "delayq_ladder_waiting_messages") == 3
    assert v(got, "delayq_waiting_messages", level="2") == 3
    # the worker stopped: so did its exporter
    with pytest.raises(OSError):
        scrape(port)
