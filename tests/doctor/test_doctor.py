"""``delayq doctor``: each finding on a real broker (and a real worker where one is needed), plus
pure classification tests with data for what this machine cannot produce (a cluster, the
delayed-message plugin, old brokers, disabled feature flags)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import amqp
import pytest
from celery.bin.base import CLIContext
from click.testing import CliRunner, Result
from kombu import Exchange, Queue

from celery_delayq import doctor as D
from celery_delayq.cli import delayq
from celery_delayq.doctor import ApiReach
from celery_delayq.ladder.spec import LadderSpec
from celery_delayq.rabbitmq.topology import Topology
from celery_delayq.rabbitmq.client import broker_version
from helpers import BROKER_HOST, management_url, running_worker

pytestmark = pytest.mark.timeout(120)

API = ApiReach("http://mgmt:15672", "ok")
NO_API = ApiReach("http://mgmt:15672", "unreachable")



def run_doctor(app: Any, *args: str) -> Result:
    """``celery -A app delayq doctor --json ARGS`` in-process (no ``-A`` string: the fresh-process probe is skipped)."""
    return CliRunner().invoke(delayq, ["doctor", "--json", *args], obj=CLIContext(app=app, no_color=True, workdir=None),
                              env={"COLUMNS": "200"}, catch_exceptions=False)


def findings(app: Any, *args: str, timeout: str = "0.3") -> dict[str, dict[str, Any]]:
    result = run_doctor(app, "--timeout", timeout, *args)
    doc = json.loads(result.stdout)
    assert [f["check"] for f in doc] == list(D.CHECKS)
    assert all(set(f) == {"check", "status", "summary", "next_step", "details"} for f in doc)
    assert result.exit_code == (1 if any(f["status"] == "error" for f in doc) else 0)
    return {f["check"]: f for f in doc}


@pytest.fixture
def small_app(make_app: Any, uid: str, vhost: str) -> Iterator[Any]:
    """An app with a small ladder of its own (3 levels, 1 s unit), not declared; deleted after."""
    app = make_app(delayq_prefix=f"doc{uid}", delayq_levels=3, delayq_unit_ms=1000,
                   delayq_management_url=management_url())
    yield app
    conn = amqp.Connection(BROKER_HOST, virtual_host=vhost)
    conn.connect()
    try:
        with contextlib.suppress(Exception):
            Topology(LadderSpec(prefix=f"doc{uid}", levels=3, unit_ms=1000), "quorum").delete(conn, if_empty=False)
        with contextlib.suppress(Exception):
            conn.channel().queue_delete(f"doc{uid}.parking")
    finally:
        conn.close()


def small_topology(app: Any, unit_ms: int = 1000) -> Topology:
    return Topology(LadderSpec(prefix=app.conf.delayq_prefix, levels=3, unit_ms=unit_ms), "quorum")


# -- broker, feature flags, the management API ---------------------------------------------------
def test_broker_version_and_feature_flags_through_the_api(small_app: Any, amqp_conn: amqp.Connection) -> None:
    found = findings(small_app)
    version = amqp_conn.server_properties["version"]
    version = version.decode() if isinstance(version, bytes) else version
    assert found["broker"]["status"] == "ok" and found["broker"]["details"]["version"] == version
    assert found["broker"]["details"]["queue_type"] == "quorum"
    flags = found["feature_flags"]
    assert flags["status"] == "ok" and flags["details"]["api"] == "ok"
    assert {"quorum_queue", "stream_queue"} <= set(flags["details"]["enabled"])
    assert found["plugin_exchanges"]["status"] == "ok"  # neither broker here has the plugin


def test_without_the_api_the_doctor_says_so_and_how_to_turn_it_on(make_app: Any, uid: str) -> None:
    app = make_app(delayq_prefix=f"doc{uid}", delayq_levels=3, delayq_unit_ms=1000,
                   delayq_management_url="http://127.0.0.1:1")
    found = findings(app)
    for check in ("feature_flags", "leaders", "plugin_exchanges"):
        assert found[check]["status"] == "warn", found[check]
        assert "not reachable at http://127.0.0.1:1" in found[check]["summary"]
        assert "rabbitmq-plugins enable rabbitmq_management" in found[check]["next_step"]
    assert found["broker"]["status"] == "ok"  # AMQP alone still answers



def test_a_refused_password_is_named_as_such_not_as_an_unreachable_api(make_app: Any, uid: str) -> None:
    """The API answered 401 (wrong password in delayq_management_url): "not reachable" sent the operator to
    the network and the plugin; the doctor says what it answered and that the credentials are the fix."""
    scheme, _, rest = management_url().partition("://")
    wrong = f"wrong-{uid}"
    app = make_app(delayq_prefix=f"doc{uid}", delayq_levels=3, delayq_unit_ms=1000,
                   delayq_management_url=f"{scheme}://guest:{wrong}@{rest}")
    found = findings(app)
    for check in ("feature_flags", "leaders", "plugin_exchanges"):
        assert found[check]["status"] == "warn", found[check]
        assert "answered 401 for the user 'guest'" in found[check]["summary"], found[check]["summary"]
        assert "not reachable" not in found[check]["summary"] and wrong not in str(found[check])
        assert "user and password" in found[check]["next_step"], found[check]["next_step"]


def test_a_monitoring_user_that_cannot_list_feature_flags_is_not_told_the_api_is_unreachable(
        make_app: Any, uid: str, vhost: str, amqp_conn: amqp.Connection) -> None:
    """RabbitMQ 3.x lists feature flags to administrators only: with the 'monitoring' user the docs ask for,
    the doctor said "the management API is not reachable" (and that leaders could not be checked) while it
    had just used that API. It says what it could not read, and where else to read it."""
    import base64
    import urllib.parse

    user, password = f"dqmon-{uid}", f"pw-{uid}-monitoring"
    q = urllib.parse.quote

    def admin(method: str, path: str, body: dict[str, Any] | None = None) -> None:
        request = urllib.request.Request(management_url() + path, method=method,
                                         data=json.dumps(body).encode() if body is not None else None)
        request.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
        request.add_header("Content-Type", "application/json")
        urllib.request.urlopen(request, timeout=10).close()

    admin("PUT", f"/api/users/{user}", {"password": password, "tags": "monitoring"})
    try:
        admin("PUT", f"/api/permissions/{q(vhost, safe='')}/{user}", {"configure": "", "write": "", "read": ".*"})
        scheme, _, rest = management_url().partition("://")
        app = make_app(delayq_prefix=f"doc{uid}", delayq_levels=3, delayq_unit_ms=1000,
                       delayq_management_url=f"{scheme}://{user}:{password}@{rest}")
        found = findings(app)
    finally:
        admin("DELETE", f"/api/users/{user}")
    flags = found["feature_flags"]
    assert "not reachable" not in flags["summary"] and flags["details"]["api"] == "ok", flags
    assert found["leaders"]["status"] == "ok", found["leaders"]
    version = amqp_conn.server_properties["version"]
    if (version.decode() if isinstance(version, bytes) else version).startswith("3."):
        assert flags["status"] == "warn" and "'administrator' tag" in flags["summary"], flags
        assert "rabbitmqctl list_feature_flags" in flags["next_step"] and password not in str(flags)
    else:  # 4.x shows them to a monitoring user
        assert flags["status"] == "ok", flags

def test_an_api_of_another_broker_is_not_believed(make_app: Any, uid: str) -> None:
    # This machine runs two brokers: the default API port (15672) of a 4.3 node on 5673 is the 3.10 node's.
    host, _, port = BROKER_HOST.partition(":")
    other = f"http://{host}:{15673 if int(port or 5672) == 5672 else 15672}"
    try:
        urllib.request.urlopen(other, timeout=2).close()
    except OSError:
        pytest.skip(f"no second broker's management API at {other}")
    app = make_app(delayq_prefix=f"doc{uid}", delayq_levels=3, delayq_unit_ms=1000, delayq_management_url=other)
    flags = findings(app)["feature_flags"]
    assert flags["status"] == "warn" and flags["details"]["api"] == "other_broker"
    assert "answers for another broker" in flags["summary"] and "delayq_management_url" in flags["next_step"]


# -- the ladder --------------------------------------------------------------------------------
def test_ladder_absent_then_complete_then_mismatched(small_app: Any, amqp_conn: amqp.Connection) -> None:
    absent = findings(small_app)["ladder"]
    assert absent["status"] == "warn" and "no ladder on the broker yet" in absent["summary"]
    assert "topology declare" in absent["next_step"]
    topo = small_topology(small_app)
    assert not topo.inspect(amqp_conn).exists  # the doctor created nothing

    topo.declare(amqp_conn)
    ch = amqp_conn.channel()
    ch.confirm_select()
    ch.basic_publish_confirm(amqp.Message("w"), topo.spec.level_exchange(2), "3.0.0.tok")
    found = findings(small_app)
    assert found["ladder"]["status"] == "ok" and found["ladder"]["details"]["waiting"] == 1
    assert "matches the settings" in found["ladder"]["summary"]
    leaders = found["leaders"]
    assert leaders["status"] == "ok" and "single node" in leaders["summary"]
    assert sum(leaders["details"]["leaders"].values()) == 9  # 3 levels x 3 digits
    handles = found["file_handles"]
    if broker_version(amqp_conn) < (4, 0):  # 3.x: each single-node quorum queue reserves 2 + 1 file handles
        node = next(iter(handles["details"]["limits"]))
        assert handles["details"]["reserved"][node] >= 9 * 3
        assert handles["status"] == "ok" and f"of its ~{handles['details']['limits'][node] - 100}" in handles["summary"]
    else:
        assert handles["status"] == "ok" and "reserves no file handles per queue" in handles["summary"]

    # Same names, another unit: every queue's TTL differs from what the app expects.
    small_app.conf.delayq_unit_ms = 500
    mismatched = findings(small_app)["ladder"]
    assert mismatched["status"] == "error" and "x-message-ttl" in mismatched["next_step"]
    assert "topology" in mismatched["next_step"] and "delete" in mismatched["next_step"]


def test_incomplete_ladder_is_an_error_with_exit_status_1(small_app: Any, amqp_conn: amqp.Connection) -> None:
    topo = small_topology(small_app)
    topo.declare(amqp_conn)
    amqp_conn.channel().queue_delete(topo.spec.level_queue(1, 2))
    result = run_doctor(small_app, "--timeout", "0.3")
    assert result.exit_code == 1
    ladder = {f["check"]: f for f in json.loads(result.stdout)}["ladder"]
    assert ladder["status"] == "error" and topo.spec.level_queue(1, 2) in ladder["summary"]
    assert ladder["details"]["missing"] == [f"queue {topo.spec.level_queue(1, 2)}"]


def test_a_ladder_without_entry_exchanges_is_a_warning_not_an_error(small_app: Any, amqp_conn: amqp.Connection) -> None:
    """A ladder 1.0.0rc1 or earlier declared lacks only the queues' entry exchanges: it routes everything."""
    topo = small_topology(small_app)
    topo.declare(amqp_conn)
    ch = amqp_conn.channel()
    for name in topo.spec.entry_exchanges():
        ch.exchange_delete(name)
    result = run_doctor(small_app, "--timeout", "0.3")
    ladder = {f["check"]: f for f in json.loads(result.stdout)}["ladder"]
    assert ladder["status"] == "warn", ladder
    assert "has no entry exchanges (9 missing)" in ladder["summary"] and "Nothing is lost or late" in ladder["summary"]
    assert "topology declare" in ladder["next_step"]
    assert sorted(ladder["details"]["missing"]) == sorted(f"exchange {n}" for n in topo.spec.entry_exchanges())
    assert ladder["details"]["mismatch"] is None  # the rest was verified
    assert not topo.inspect(amqp_conn).complete  # and the doctor created nothing


def test_human_output_lists_every_check_with_a_next_step(small_app: Any) -> None:
    result = CliRunner().invoke(delayq, ["doctor", "--timeout", "0.3"],
                                obj=CLIContext(app=small_app, no_color=True, workdir=None),
                                env={"COLUMNS": "200"}, catch_exceptions=False)
    lines = result.stdout.splitlines()
    for check in D.CHECKS:
        assert any(line.split(":")[0].split()[-1] == check for line in lines), check
    assert sum(1 for line in lines if line.strip().startswith("→")) == len(D.CHECKS)


# -- the parking queue -------------------------------------------------------------------------
def test_parking_queue_where_and_what(small_app: Any, amqp_conn: amqp.Connection) -> None:
    name = f"{small_app.conf.delayq_prefix}.parking"
    assert "does not exist yet" in findings(small_app)["parking"]["summary"]
    from celery_delayq.rabbitmq.delivery_limit import declare_arguments
    from celery_delayq.rabbitmq.client import broker_version

    version = broker_version(amqp_conn)
    ch = amqp_conn.channel()
    ch.queue_declare(name, durable=True, auto_delete=False, arguments=declare_arguments("quorum", version))
    ch.basic_publish(amqp.Message("parked"), "", name)
    time.sleep(0.2)
    parking = findings(small_app)["parking"]
    assert parking["status"] == "ok" and parking["details"]["messages"] == 1
    assert parking["details"]["queue_type"] == "quorum" and parking["details"]["node"]
    assert "1 parked" in parking["summary"] and "parking list" in parking["next_step"]


def test_parking_queue_with_a_delivery_limit_is_a_warning(small_app: Any, amqp_conn: amqp.Connection) -> None:
    from celery_delayq.rabbitmq.client import broker_version

    if broker_version(amqp_conn) >= (4, 3):
        pytest.skip("on 4.3 a look never counts as a delivery: no limit is a risk (the pure test covers the text)")
    name = f"{small_app.conf.delayq_prefix}.parking"
    amqp_conn.channel().queue_declare(name, durable=True, auto_delete=False,
                                      arguments={"x-queue-type": "quorum", "x-delivery-limit": 5})
    parking = findings(small_app)["parking"]
    assert parking["status"] == "warn" and "x-delivery-limit" in parking["summary"]
    assert ".redeclare()" in parking["next_step"]


# -- activation --------------------------------------------------------------------------------
def test_activation_in_this_process(make_app: Any, uid: str) -> None:
    off = make_app(delayq_prefix=f"doc{uid}", delayq_levels=3, delayq_unit_ms=1000)
    found = findings(off)["activation"]
    assert found["status"] == "warn" and "delayq_enabled is off" in found["summary"]
    assert "CELERY_DELAYQ_ENABLED" in found["next_step"] and found["details"]["rule"] == D.ACTIVATION_RULE
    on = make_app(delayq_prefix=f"doc{uid}", delayq_levels=3, delayq_unit_ms=1000, delayq_enabled=True)
    found = findings(on)["activation"]
    assert found["status"] == "ok" and found["details"]["installed_here"] is True


APP_MODULE = """
import os
from celery import Celery
{import_line}
app = Celery("docprobe", broker=os.environ["DOC_BROKER"])
app.conf.update(delayq_enabled=True, delayq_prefix=os.environ["DOC_PREFIX"], delayq_levels=3,
                delayq_unit_ms=1000, broker_heartbeat=0, delayq_management_url=os.environ["DOC_API"])
"""


def _module(tmp_path: Path, name: str, imports: bool) -> None:
    line = "import celery_delayq" if imports else ""
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(APP_MODULE.format(import_line=line)))


def test_activation_in_a_process_that_only_imports_the_app(tmp_path: Path, broker_url: str, uid: str) -> None:
    """The real command: ``celery -A mod delayq doctor --json``, whose own process always has celery_delayq."""
    _module(tmp_path, f"plain{uid}", imports=False)
    _module(tmp_path, f"hooked{uid}", imports=True)
    env = {"DOC_BROKER": broker_url, "DOC_PREFIX": f"doc{uid}", "DOC_API": management_url(),
           "PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "celery", "-A", f"plain{uid}", "delayq", "doctor", "--json",
                           "--timeout", "0.3"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90)
    found = {f["check"]: f for f in json.loads(done.stdout)}["activation"]
    assert found["status"] == "warn", found
    assert found["details"]["installed_here"] is True  # the delayq command imported celery_delayq ...
    assert found["details"]["plain_process"] == {"imports_celery_delayq": False, "installed": False, "error": None}
    assert "import celery_delayq" in found["next_step"]  # ... but a web process would not have

    with _cwd(tmp_path), _env(env):
        answer = D.probe_plain_process(f"hooked{uid}")
    assert answer == {"imports_celery_delayq": True, "installed": True, "error": None}
    ok = D.activation_finding(enabled=True, installed=True, plain_process=answer)
    assert ok.status == "ok"


@contextlib.contextmanager
def _cwd(path: Path) -> Iterator[None]:
    import os

    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


@contextlib.contextmanager
def _env(values: dict[str, str]) -> Iterator[None]:
    import os

    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# -- tasks held by workers ---------------------------------------------------------------------
def test_eta_tasks_held_by_a_real_worker(make_app: Any, uid: str, amqp_conn: amqp.Connection) -> None:
    app = make_app(delayq_prefix=f"doc{uid}", delayq_levels=3, delayq_unit_ms=1000,
                   delayq_management_url=management_url())

    @app.task(name=f"doc.held.{uid}")
    def held() -> None:
        return None

    none = findings(app)["worker_eta"]
    assert none["status"] == "warn" and "no worker answered" in none["summary"]
    with running_worker(app, hostname=f"doc{uid}@localhost"):
        for _ in range(3):
            held.apply_async(countdown=300)  # delayq_enabled is off: the worker holds them
        deadline = time.time() + 20
        while True:
            found = findings(app, timeout="1.5")["worker_eta"]
            if found["details"].get("held") == 3 or time.time() > deadline:
                break
        assert found["status"] == "warn" and found["details"]["held"] == 3, found
        assert found["details"]["tasks"] == {f"doc.held.{uid}": 3}
        assert found["details"]["workers"] == {f"doc{uid}@localhost": 3}
        assert "exactly once" in found["next_step"] and "SIGTERM" in found["next_step"]
    amqp_conn.channel().queue_purge(f"q.{uid}")  # handed back at shutdown; not needed any more


# -- Celery's native delayed delivery ----------------------------------------------------------
@contextlib.contextmanager
def native_topology(app: Any, vhost: str) -> Iterator[None]:
    """Celery's native delayed-delivery topology, declared and bound by kombu's own functions (as its worker does)."""
    from kombu.transport.native_delayed_delivery import (bind_queue_to_native_delayed_delivery_exchange,
                                                         declare_native_delayed_delivery_exchanges_and_queues)

    with app.connection_for_write() as conn:
        declare_native_delayed_delivery_exchanges_and_queues(conn, "quorum")
        for queue in app.amqp.queues.values():
            queue(conn.default_channel).declare()  # the worker declares its queues first
            bind_queue_to_native_delayed_delivery_exchange(conn, queue)
    try:
        yield
    finally:
        delete_native_topology(vhost)


def delete_native_topology(vhost: str) -> None:
    """Delete ``celery_delayed_*`` (28 quorum queues count against the broker's file-handle limit)."""
    conn = amqp.Connection(BROKER_HOST, virtual_host=vhost)
    conn.connect()
    try:
        for name in D.native_queue_names():
            for delete in ("queue_delete", "exchange_delete"):
                ch = conn.channel()
                with contextlib.suppress(Exception):
                    getattr(ch, delete)(name)
        with contextlib.suppress(Exception):
            conn.channel().exchange_delete(D.NATIVE_DELIVERY_EXCHANGE)
    finally:
        conn.close()


@pytest.fixture
def native_app(make_app: Any, uid: str, vhost: str, amqp_conn: amqp.Connection) -> Iterator[Any]:
    """An app whose queue is quorum behind a topic exchange: Celery's native delayed delivery is active for it."""
    exchange = Exchange(f"nx.{uid}", type="topic")
    app = make_app(delayq_prefix=f"doc{uid}", delayq_levels=3, delayq_unit_ms=1000,
                   delayq_management_url=management_url(), task_default_queue=f"nq.{uid}",
                   task_default_exchange=f"nx.{uid}", task_default_exchange_type="topic",
                   task_default_routing_key=f"nq.{uid}",
                   task_queues=[Queue(f"nq.{uid}", exchange, routing_key=f"nq.{uid}",
                                      queue_arguments={"x-queue-type": "quorum"})])
    yield app
    ch = amqp_conn.channel()
    with contextlib.suppress(Exception):
        ch.queue_delete(f"nq.{uid}")
    with contextlib.suppress(Exception):
        amqp_conn.channel().exchange_delete(f"nx.{uid}")


def test_native_delayed_delivery_queues_in_use(native_app: Any, vhost: str, uid: str) -> None:
    before = findings(native_app)["native_delayed_delivery"]
    assert before["status"] == "ok" and before["details"]["quorum_queue_in_app"] is True

    @native_app.task(name=f"doc.native.{uid}")
    def later() -> None:
        return None

    with native_topology(native_app, vhost):
        empty = findings(native_app)["native_delayed_delivery"]
        assert empty["status"] == "ok" and empty["details"]["queues"] == D.NATIVE_LEVELS
        for _ in range(2):
            later.apply_async(countdown=100)  # delayq_enabled off: Celery's own ladder (100 s = 64+32+4)
        deadline = time.time() + 10
        while True:
            found = findings(native_app)["native_delayed_delivery"]
            if found["details"]["messages"] == 2 or time.time() > deadline:
                break
            time.sleep(0.2)
        assert found["status"] == "warn" and found["details"]["messages"] == 2, found
        assert set(found["details"]["busy"]) == {"celery_delayed_6"}  # both wait 64 s there first
        assert found["details"]["empty_within_s"] == 127
        assert "still arrive" in found["summary"] and "Keep the celery_delayed_*" in found["next_step"]


# -- pure classification: what this machine cannot produce -------------------------------------
def test_broker_versions() -> None:
    assert D.broker_finding((3, 9, 29), "classic").status == "warn"
    assert "at-most-once" in D.broker_finding((3, 9, 29), "classic").summary
    old = D.broker_finding((3, 13, 7), "quorum")
    assert old.status == "ok" and "plugin" in old.next_step
    assert D.broker_finding((4, 3, 6), "quorum").next_step == "Nothing to do."


def test_feature_flags_classification() -> None:
    flags = [{"name": "quorum_queue", "state": "enabled", "stability": "stable"},
             {"name": "stream_queue", "state": "disabled", "stability": "stable"}]
    bad = D.feature_flags_finding(flags, API)
    assert bad.status == "error" and "enable_feature_flag stream_queue" in bad.next_step
    flags[1]["state"] = "enabled"
    flags.append({"name": "khepri_db", "state": "disabled", "stability": "experimental"})
    assert D.feature_flags_finding(flags, API).next_step == "Nothing to do."  # experimental flags stay off
    flags.append({"name": "drop_unroutable_metric", "state": "disabled", "stability": "stable"})
    pending = D.feature_flags_finding(flags, API)
    assert pending.status == "ok" and "enable_feature_flag all" in pending.next_step
    off = D.feature_flags_finding(None, ApiReach(None, "off"))
    assert off.status == "warn" and "switched off" in off.summary


def _q(name: str, leader: str, members: int = 3, kind: str = "quorum") -> dict[str, Any]:
    return {"name": name, "type": kind, "leader": leader, "node": leader,
            "members": [f"rabbit@n{i}" for i in range(members)]}


def test_leaders_all_on_one_node_of_a_cluster_is_a_warning() -> None:
    spec = LadderSpec(prefix="shop", levels=3)
    names = [q.name for q in spec.level_queues()]
    nodes = ["rabbit@n0", "rabbit@n1", "rabbit@n2"]
    together = D.leaders_finding([_q(n, "rabbit@n0") for n in names], nodes, names, API, vhost="/",
                                 namespace=spec.namespace)
    assert together.status == "warn" and "all 9 ladder queue leaders sit on rabbit@n0" in together.summary
    rebalance = "rabbitmq-queues rebalance quorum --vhost-pattern '^/$' --queue-pattern '^shop\\.3x4\\.'"
    assert rebalance in together.next_step
    spread = D.leaders_finding([_q(n, nodes[i % 3]) for i, n in enumerate(names)], nodes, names, API)
    assert spread.status == "ok" and spread.details["leaders"] == {"rabbit@n0": 3, "rabbit@n1": 3, "rabbit@n2": 3}
    short = D.leaders_finding([_q(n, nodes[i % 3], members=1) for i, n in enumerate(names)], nodes, names, API)
    assert short.status == "warn" and "rabbitmq-queues grow" in short.next_step
    classic = D.leaders_finding([_q(n, nodes[i % 3], kind="classic") for i, n in enumerate(names)], nodes, names, API)
    assert classic.status == "warn" and "not replicated" in classic.summary
    single = D.leaders_finding([_q(n, "rabbit@n0", 1) for n in names], ["rabbit@n0"], names, API)
    assert single.status == "ok" and "single node" in single.summary
    others = D.leaders_finding([_q("unrelated", "rabbit@n0")], nodes, names, API)
    assert others.status == "ok" and "no ladder queues yet" in others.summary
    assert D.leaders_finding(None, None, names, NO_API).status == "warn"


def test_node_loss_on_a_3x_cluster_names_the_delay_and_the_advanced_config_setting() -> None:
    nodes = ["rabbit@n0", "rabbit@n1", "rabbit@n2"]
    old = D.node_loss_finding((3, 10, 8), nodes, "quorum", API)
    assert old.status == "warn" and "180 s" in old.summary and "up to 360 s" in old.summary
    assert "[{rabbit, [{dead_letter_worker_publisher_confirm_timeout, 5000}]}]." in old.next_step
    assert "twice" in old.next_step  # the duplicate trade-off is stated
    assert old.details["default_timeout_ms"] == 180000
    assert D.node_loss_finding((3, 12, 5), nodes, "quorum", API).status == "ok"  # the source's fix
    assert D.node_loss_finding((4, 3, 6), nodes, "quorum", API).status == "ok"
    assert D.node_loss_finding((3, 10, 8), ["rabbit@n0"], "quorum", API).status == "ok"  # no cluster
    assert D.node_loss_finding((3, 10, 8), nodes, "classic", API).status == "ok"
    unknown = D.node_loss_finding((3, 10, 8), None, "quorum", NO_API)
    assert unknown.status == "ok" and "cannot tell whether this is a cluster" in unknown.summary


def test_quorum_queue_file_handle_reservations_on_3x() -> None:
    nodes = {"rabbit@n0": 1024, "rabbit@n1": 1024, "rabbit@n2": 65536}
    # A leader reserves 2 + members, a follower 2; classic queues reserve nothing.
    queues = [_q(f"q{i}", f"rabbit@n{i % 2}") for i in range(4)] + [_q("c", "rabbit@n0", kind="classic")]
    assert D.quorum_reservations(queues, nodes) == {"rabbit@n0": 5 + 5 + 2 + 2, "rabbit@n1": 14, "rabbit@n2": 8}
    single = [_q(f"q{i}", "rabbit@n0", members=1) for i in range(150)]
    ok = D.file_handles_finding((3, 10, 8), {"rabbit@n0": 1024}, single, API)
    assert ok.status == "ok" and "reserve 450 of its ~924 file handles" in ok.summary
    half = D.file_handles_finding((3, 10, 8), {"rabbit@n0": 1024}, single, API, missing_ladder_queues=45)
    assert half.status == "warn" and "585 of its ~924" in half.summary and "45 ladder queues" in half.summary
    full = D.file_handles_finding((3, 10, 8), {"rabbit@n0": 1024}, single * 2, API)
    assert full.status == "error" and "LimitNOFILE" in full.next_step and "silently" in full.summary
    roomy = D.file_handles_finding((3, 13, 7), {"rabbit@n0": 65536}, single * 2, API)
    assert roomy.status == "ok"
    gone = D.file_handles_finding((4, 3, 6), {"rabbit@n0": 1024}, single * 4, API)
    assert gone.status == "ok" and "reserves no file handles" in gone.summary
    assert D.file_handles_finding((3, 10, 8), None, None, NO_API).status == "warn"


def test_plugin_exchanges_classification() -> None:
    waiting = [{"name": "orders.delayed", "type": "x-delayed-message", "messages_delayed": 42},
               {"name": "amq.direct", "type": "direct"}]
    warn = D.plugin_finding(waiting, plugin_enabled=True, version=(3, 13, 7), api=API)
    assert warn.status == "warn" and "42 message(s) still delayed" in warn.summary
    assert "disabling the plugin deletes every message" in warn.next_step and "delayq_enabled" in warn.next_step
    drained = D.plugin_finding([dict(waiting[0], messages_delayed=0)], plugin_enabled=True, version=(3, 13, 7), api=API)
    assert drained.status == "ok"
    unknown = D.plugin_finding([{"name": "x", "type": "x-delayed-message"}], plugin_enabled=True,
                               version=(3, 12, 0), api=API)
    assert unknown.status == "warn" and "do not say" in unknown.summary
    stranded = D.plugin_finding(waiting, plugin_enabled=False, version=(4, 3, 6), api=API)
    assert stranded.status == "error" and "does not run" in stranded.summary
    idle = D.plugin_finding([], plugin_enabled=True, version=(3, 13, 7), api=API)
    assert idle.status == "ok" and "rabbitmq-plugins disable rabbitmq_delayed_message_exchange" in idle.next_step
    assert D.plugin_finding([], plugin_enabled=False, version=(4, 3, 6), api=API).next_step == "Nothing to do."


def test_activation_classification() -> None:
    assert D.activation_finding(enabled=False, installed=True, ladder_tasks=2).summary.endswith(
        "only the 2 DelayedRetryTask task(s) use the ladder.")
    assert D.activation_finding(enabled=True, installed=False).status == "error"
    broken = D.activation_finding(enabled=True, installed=True,
                                  plain_process={"error": "ModuleNotFoundError: No module named 'proj'"})
    assert broken.status == "warn" and "No module named 'proj'" in broken.summary


def test_worker_eta_and_native_classification() -> None:
    now = 1_000_000.0
    replies = {"w1@h": [{"eta": "1970-01-12T13:48:20+00:00", "request": {"name": "t.a"}}], "w2@h": []}
    held = D.worker_eta_finding(replies, enabled=True, timeout=1, now=now)
    assert held.status == "warn" and held.details["held"] == 1 and held.details["workers"] == {"w1@h": 1, "w2@h": 0}
    assert "due in 1.7 min" in held.summary  # eta 1,000,100 = now + 100 s
    assert D.worker_eta_finding({"w1@h": []}, enabled=True, timeout=1).status == "ok"
    native = D.native_finding({"celery_delayed_3": 5, "celery_delayed_0": 1, "celery_delayed_1": 0},
                              delivery_exchange=True, quorum_app=True, enabled=True, now=now)
    assert native.status == "warn" and native.details["empty_within_s"] == 15 and native.details["messages"] == 6
    assert D.native_finding({}, delivery_exchange=False, quorum_app=False, enabled=True).status == "ok"
    parked = D.parking_finding(park=True, name="p", exists=True, messages=3, queue_type="quorum", node="rabbit@n1",
                               risk="it is a quorum queue with a delivery limit", version=(4, 1, 0))
    assert parked.status == "warn" and "(quorum on rabbit@n1)" in parked.summary
