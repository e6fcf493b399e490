"""Real-broker fixtures: a private vhost per test session, real in-thread workers.

RabbitMQ must be running (CI starts it). Locally a missing broker skips the
broker tests; with ``CI`` set it fails them, so CI can never go green by
skipping.

Which broker: ``DELAYQ_TEST_BROKER_HOST`` (default ``127.0.0.1:5672``), and
the ``rabbitmqctl`` first on ``PATH`` must manage that same node (checked).
``./dev test --rmq4`` points both at the RabbitMQ 4.3 node on 5673.

A test that never asks for the broker (no ``vhost`` fixture, directly or
through another fixture) is marked ``pure``: ``-m "not pure"`` runs only the
broker-facing tests, which is how the second broker's CI leg saves time.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import uuid
from typing import Any, Callable, Iterator

import amqp
import pytest
from vhost_hygiene import delete_stale_session_vhosts

from helpers import (  # noqa: F401
    BROKER_HOST, Collector, broker_up, delete_ladder, drain, management_url, queue_depth, running_worker,
)

_broker_up = broker_up  # the name some test modules still import from here
#: The session's own vhost (set by the ``vhost`` fixture), for the per-module ladder check.
_VHOST_KEY = pytest.StashKey[str]()


def _rabbitmqctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", "-q", *args], check=True, capture_output=True, timeout=60)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "pure: needs no broker (set automatically: the test uses no vhost fixture)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "vhost" not in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.pure)


def _unavailable(why: str) -> None:
    """Skip locally; fail under CI, where a missing broker must never pass as green."""
    if os.environ.get("CI"):
        pytest.fail(why)
    pytest.skip(why)


def _vhost_reachable(name: str) -> bool:
    try:
        c = amqp.Connection(BROKER_HOST, virtual_host=name, connect_timeout=5)
        c.connect()
        c.close()
        return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def vhost(request: pytest.FixtureRequest) -> Iterator[str]:
    """A vhost of our own, deleted (with everything in it) at the end of the session."""
    if not _broker_up():
        _unavailable(f"RabbitMQ is not reachable at {BROKER_HOST} (./dev test starts 3.10 on 5672, "
                     "./dev test --rmq4 starts 4.3 on 5673)")
    if shutil.which("rabbitmqctl") is None:
        if os.environ.get("CI"):
            pytest.fail("rabbitmqctl is not on PATH: the broker tests need it (vhosts, policies, closing connections)")
        yield "/"  # fall back to unique names in the default vhost
        return
    delete_stale_session_vhosts()
    name = f"delayq-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    request.config.stash[_VHOST_KEY] = name
    _rabbitmqctl("add_vhost", name)
    _rabbitmqctl("set_permissions", "-p", name, "guest", ".*", ".*", ".*")
    if not _vhost_reachable(name):
        with contextlib.suppress(Exception):
            _rabbitmqctl("delete_vhost", name)
        _unavailable(f"the rabbitmqctl on PATH ({shutil.which('rabbitmqctl')}) manages another node than "
                     f"DELAYQ_TEST_BROKER_HOST={BROKER_HOST}: put that node's rabbitmqctl first on PATH "
                     "(./dev test --rmq4 does it for the 4.3 node)")
    try:
        yield name
    finally:
        if not os.environ.get("DELAYQ_KEEP_VHOST"):
            with contextlib.suppress(Exception):
                _rabbitmqctl("delete_vhost", name)


@pytest.fixture(scope="session")
def broker_url(vhost: str) -> str:
    """AMQP URL of the test vhost."""
    from urllib.parse import quote

    return f"amqp://guest:guest@{BROKER_HOST}/{quote(vhost, safe='')}"


@pytest.fixture
def amqp_conn(vhost: str) -> Iterator[amqp.Connection]:
    """A raw py-amqp connection to the test vhost, for inspecting the broker."""
    c = amqp.Connection(BROKER_HOST, virtual_host=vhost)
    c.connect()
    yield c
    with contextlib.suppress(Exception):
        c.close()


@pytest.fixture
def uid() -> str:
    """A short unique id for names of this test."""
    return uuid.uuid4().hex[:8]


@pytest.fixture(scope="session")
def prefix() -> str:
    """The ladder prefix shared by the whole session.

    One ladder for all tests, as in production: RabbitMQ here runs with a soft
    ``ulimit -n`` of 1024, each quorum queue reserves ~3 file handles, and past
    ~320 quorum queues the broker stops accepting connections altogether.
    """
    return f"dq{uuid.uuid4().hex[:8]}"


@pytest.fixture
def private_ladder(vhost: str) -> Iterator[Callable[..., Any]]:
    """Factory of ladders of a test's own (for tests that break or reshape one); deleted after."""
    from celery_delayq.ladder.spec import LadderSpec
    from celery_delayq.rabbitmq.topology import Topology

    made: list[Any] = []

    def factory(queue_type: str = "quorum", **spec_kwargs: Any) -> Any:
        spec_kwargs.setdefault("prefix", f"pv{uuid.uuid4().hex[:8]}")
        topo = Topology(LadderSpec(**spec_kwargs), queue_type)
        made.append(topo)
        return topo

    yield factory
    conn = amqp.Connection(BROKER_HOST, virtual_host=vhost)
    conn.connect()
    try:
        for topo in made:
            with contextlib.suppress(Exception):
                delete_ladder(conn, topo.spec, exit_queues=[d.exit_queue for d in topo._exits.values()])
    finally:
        conn.close()


@pytest.fixture(autouse=True)
def _delete_exit_queues(request: pytest.FixtureRequest) -> Iterator[None]:
    """Delete the exit queues a test created, so quorum queues do not pile up (see ``prefix``)."""
    from celery_delayq import signals

    created: set[str] = set()

    def on_schedule(sender: Any = None, plan: Any = None, **_: Any) -> None:
        created.add(plan.destination.exit_queue)

    signals.before_schedule.connect(on_schedule, weak=False)
    yield
    signals.before_schedule.disconnect(on_schedule)
    if not created or "vhost" not in request.fixturenames:
        return
    vhost = request.getfixturevalue("vhost")
    with contextlib.suppress(Exception):
        conn = amqp.Connection(BROKER_HOST, virtual_host=vhost)
        conn.connect()
        for name in created:
            ch = conn.channel()
            with contextlib.suppress(Exception):
                ch.queue_delete(name)
        conn.close()


@pytest.fixture
def collector() -> Collector:
    return Collector()


@pytest.fixture
def make_app(broker_url: str, prefix: str, uid: str, vhost: str) -> Iterator[Callable[..., Any]]:
    """Factory of Celery apps on the test vhost, with delayq installed and torn down."""
    from celery import Celery

    import celery_delayq

    apps: list[Any] = []

    def factory(**conf: Any) -> Any:
        app = Celery(f"t{uid}", broker=broker_url, set_as_current=False)
        settings = {
            "broker_heartbeat": 0,
            "task_default_queue": f"q.{uid}",
            "delayq_prefix": prefix,
            "worker_hijack_root_logger": False,
            "worker_prefetch_multiplier": 50,
            "broker_connection_retry_on_startup": True,
        }
        settings.update(conf)
        app.conf.update(settings)
        # Tests define tasks of the same name in many apps; Celery's default shared=True
        # would hand a later app an earlier test's callable (and its collector).
        task = app.task

        def unshared_task(*args: Any, **opts: Any) -> Any:
            opts.setdefault("shared", False)
            return task(*args, **opts)

        app.task = unshared_task  # type: ignore[method-assign]
        apps.append(app)
        return app

    yield factory
    for app in apps:
        celery_delayq.uninstall(app)
    # A ladder of a test's own prefix goes with the test (the session's shared one stays).
    own = {cfg.spec for cfg in (celery_delayq.DelayqConfig.from_app(app) for app in apps) if cfg.prefix != prefix}
    if own:
        with contextlib.suppress(Exception):
            conn = amqp.Connection(BROKER_HOST, virtual_host=vhost)
            conn.connect()
            try:
                for spec in own:
                    with contextlib.suppress(Exception):
                        delete_ladder(conn, spec)
            finally:
                conn.close()
    import kombu.pools

    from celery_delayq.rabbitmq import fixed as _fixed
    from celery_delayq.rabbitmq import publisher as _pub

    # kombu's pools are global and shared by equal connections: reset, don't close one
    with contextlib.suppress(Exception):
        kombu.pools.reset()

    for pub in list(_pub._PUBLISHERS.values()):
        with contextlib.suppress(Exception):
            pub.close()
    _pub._PUBLISHERS.clear()
    # The fixed and buckets backends (the default) hold a publisher of their own: a test must not inherit one
    # whose topology remembers exit queues an earlier test's cleanup deleted.
    _fixed._FIXED.clear()


@pytest.fixture
def celery_worker() -> Callable[..., Any]:
    """Shadows pytest-celery's Docker fixture (no Docker here): an in-thread worker factory."""
    return running_worker


#: Queues a ladder owns (levels, index streams, cancel log, unroutable, laps, parking, exit queues).
_LADDER_QUEUE = re.compile(r"\.\d+x\d+\.(?:s\d+\.)?(?:L\d\d|index\.|cancels$)|\.(?:unroutable|laps|parking)$|\.exit\.")


def _ladder_queues() -> set[tuple[str, str]] | None:
    """``(vhost, name)`` of every ladder queue on the test broker, every vhost (``None``: no API)."""
    import base64
    import json
    import urllib.request

    req = urllib.request.Request(f"{management_url()}/api/queues?columns=name,vhost")
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            rows = json.load(resp)
    except Exception:
        return None
    return {(str(r["vhost"]), str(r["name"])) for r in rows if _LADDER_QUEUE.search(str(r["name"]))}


@pytest.fixture(scope="module", autouse=True)
def _no_ladder_left_behind(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test module must delete every ladder queue it creates, but those of the session's shared ladder.

    On RabbitMQ 3.x each quorum queue reserves file handles, and leftover ladders
    wedge the broker for every client (celery_delayq.rabbitmq.budget). Checked per module
    in the session's vhost, through the management API (skipped where it cannot
    be reached): other vhosts may belong to other test runs on a shared broker,
    and the tests that make vhosts of their own delete them whole. The session's
    ``prefix`` ladder is shared on purpose and goes with its vhost.
    """
    if os.environ.get("DELAYQ_SKIP_LEAK_CHECK"):
        yield
        return
    shared = f"{request.getfixturevalue('prefix')}."
    before = _ladder_queues()
    yield
    if before is None:
        return
    after = _ladder_queues()
    if after is None:
        return
    session_vhost = request.session.config.stash.get(_VHOST_KEY, None)
    left = sorted(name for vhost, name in after - before
                  if vhost == session_vhost and not name.startswith(shared))
    if left:
        shown = ", ".join(left[:8]) + (f" and {len(left) - 8} more" if len(left) > 8 else "")
        pytest.fail(f"{request.module.__name__} left {len(left)} ladder queue(s) behind in vhost {session_vhost}: "
                    f"{shown}. Delete what a "
                    "test creates (Topology.delete, the private_ladder fixture, or the session's shared prefix).",
                    pytrace=False)


@pytest.fixture(autouse=True)
def _broker_health_probe(request: pytest.FixtureRequest) -> Iterator[None]:
    """With DELAYQ_HEALTHCHECK=1, report after each test whether the broker still accepts connections."""
    yield
    if os.environ.get("DELAYQ_HEALTHCHECK"):
        ok = True
        try:
            c = amqp.Connection(BROKER_HOST, connect_timeout=4)
            c.connect()
            c.close()
        except Exception:
            ok = False
        print(f"\nHEALTH after {request.node.name}: {'ok' if ok else 'HUNG'}")
