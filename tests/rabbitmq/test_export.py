"""Infrastructure-as-code exports: Terraform that applies the first time, definitions that round-trip.

The Terraform provider cannot be downloaded here (no network), so what can
run of Terraform runs (``fmt -check``, ``console`` to evaluate every value)
and the apply itself is reproduced over AMQP in the worst order Terraform
could choose (``tf_apply``). The definitions JSON goes through the real
``rabbitmqctl import_definitions`` into a fresh vhost on both brokers.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import quote

import amqp
import hcl2
import pytest
from hcl2 import SerializationOptions

from celery_delayq.rabbitmq import export
from celery_delayq.config import DelayqConfig
from celery_delayq.ladder.spec import LadderSpec
from celery_delayq.rabbitmq.delivery_limit import declare_arguments
from celery_delayq.rabbitmq.topology import Topology
from helpers import BROKER_HOST
from tf_apply import TERRAFORM, apply, load, terraform_eval

needs_terraform = pytest.mark.skipif(TERRAFORM is None, reason="terraform is not installed")
PARSED = SerializationOptions(strip_string_quotes=True, explicit_blocks=False, with_comments=False)


def _topology(levels: int = 3, prefix: str = "shop_delayq", queue_type: str = "quorum") -> Topology:
    return Topology(LadderSpec(prefix=prefix, levels=levels), queue_type)


def _resources(hcl: str) -> dict[str, dict[str, Any]]:
    doc = hcl2.loads(hcl, serialization_options=PARSED)
    return {f"{rtype}.{name}": body for block in doc["resource"] for rtype, named in block.items()
            for name, body in named.items()}


PARKING = export.ParkingQueueDef("shop_delayq.parking", declare_arguments("quorum", (4, 3)))


# -- Terraform: pure --------------------------------------------------------------------

@needs_terraform
def test_terraform_export_is_fmt_clean(tmp_path: Path) -> None:
    topo = _topology()
    hcl = export.terraform(topo, vhost="/", exits=[topo.destination("", "shop"), topo.destination("orders", "a.*")],
                           parking=PARKING)
    (tmp_path / "delayq.tf").write_text(hcl)
    out = subprocess.run([TERRAFORM, "fmt", "-check", "-diff", str(tmp_path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_terraform_export_requires_its_provider() -> None:
    doc = hcl2.loads(export.terraform(_topology()), serialization_options=PARSED)
    required = doc["terraform"][0]["required_providers"][0]["rabbitmq"]
    assert required == {"source": "cyrilgdn/rabbitmq", "version": export.PROVIDER_VERSION}


def test_bindings_and_dead_letter_targets_reference_resources() -> None:
    """No binding names an exchange or queue literally: Terraform orders by references only."""
    topo = _topology()
    hcl = export.terraform(topo, exits=[topo.destination("", "shop")], parking=PARKING)
    res = _resources(hcl)
    ref = re.compile(r"^\$\{rabbitmq_(exchange|queue)\.(\w+)\.(name|vhost)\}$")
    bindings = {a: b for a, b in res.items() if a.startswith("rabbitmq_binding.")}
    # ladder (per level: its queues, the pass-through, each queue's entry), unroutable, one exit
    assert len(bindings) == 3 * (2 * topo.spec.radix - 1) + 1 + 1
    for address, b in bindings.items():
        for attr in ("source", "destination", "vhost"):
            m = ref.match(b[attr])
            assert m, f"{address}.{attr} = {b[attr]!r} is not a reference"
            assert f"rabbitmq_{m.group(1)}.{m.group(2)}" in res
        assert b["source"].startswith("${rabbitmq_exchange.")
        assert b["vhost"] == b["source"].replace(".name}", ".vhost}")
    for address, body in res.items():
        if address.startswith(("rabbitmq_exchange.", "rabbitmq_queue.")):
            assert body["vhost"] == "${data.rabbitmq_vhost.ladder.name}"
    # a level queue dead-letters into the next level's exchange by reference (created first)
    assert "rabbitmq_exchange.level01.name" in res["rabbitmq_queue.level02_d3"]["settings"][0]["arguments_json"]
    assert "rabbitmq_exchange.deliver.name" in res["rabbitmq_queue.level00_d1"]["settings"][0]["arguments_json"]
    assert res["rabbitmq_exchange.deliver"]["settings"][0]["arguments"] == {
        "alternate-exchange": "${rabbitmq_exchange.unroutable.name}"}
    # each queue's entry is a fanout exchange bound to that queue alone
    assert res["rabbitmq_exchange.level02_d3_entry"]["settings"][0]["type"] == "fanout"
    assert res["rabbitmq_binding.level02_d3_entry"]["destination"] == "${rabbitmq_queue.level02_d3.name}"
    # and the graph has no cycle, with every reference declared
    load(hcl)


def test_resource_names_come_from_the_ladder_not_from_positions() -> None:
    topo = _topology()
    names = set(_resources(export.terraform(topo)))
    assert {"rabbitmq_exchange.level02", "rabbitmq_queue.level02_d3", "rabbitmq_binding.level02_d3",
            "rabbitmq_binding.level02_d0", "rabbitmq_binding.level00_d0", "rabbitmq_exchange.deliver",
            "rabbitmq_exchange.unroutable", "rabbitmq_queue.unroutable", "rabbitmq_binding.unroutable",
            "rabbitmq_exchange.level02_d3_entry", "rabbitmq_binding.level02_d3_entry"} <= names
    assert not [n for n in names if re.search(r"\.b\d{3}_", n)]
    # adding exits and the parking queue adds resources and renames none
    more = set(_resources(export.terraform(topo, exits=[topo.destination("", "shop")], parking=PARKING)))
    assert names < more
    assert more - names == {"rabbitmq_queue.parking", f"rabbitmq_queue.{_exit_key(topo, 'shop')}",
                            f"rabbitmq_binding.{_exit_key(topo, 'shop')}"}
    # one more level adds that level's resources; the others keep their names
    taller = set(_resources(export.terraform(_topology(levels=4))))
    assert names < taller and {"rabbitmq_exchange.level03", "rabbitmq_queue.level03_d1"} <= taller


def test_a_sharded_ladder_exports_every_shard_and_keeps_shard_zero_names() -> None:
    plain = set(_resources(export.terraform(_topology())))
    topo = Topology(LadderSpec(prefix="iac", levels=3, shards=2), "quorum")
    res = _resources(export.terraform(topo))
    assert plain < set(res)  # shard 0 keeps its resource names: adding shards renames nothing
    assert {"rabbitmq_exchange.s1_level02", "rabbitmq_queue.s1_level02_d3", "rabbitmq_binding.s1_level02_d0"} <= set(res)
    # shard 1 dead-letters within shard 1, and its last level into the shared delivery exchange
    assert "rabbitmq_exchange.s1_level01.name" in res["rabbitmq_queue.s1_level02_d3"]["settings"][0]["arguments_json"]
    assert "rabbitmq_exchange.deliver.name" in res["rabbitmq_queue.s1_level00_d1"]["settings"][0]["arguments_json"]
    assert res["rabbitmq_queue.s1_level02_d3"]["name"] == "iac.3x4.s1.L02.d3"
    load(export.terraform(topo))


def _exit_key(topo: Topology, queue: str) -> str:
    return "exit_default_" + queue + "_" + topo.destination("", queue).token


#: The attributes each resource of cyrilgdn/rabbitmq 1.8 to 1.10 accepts (rabbitmq/resource_*.go).
PROVIDER_SCHEMA = {
    "rabbitmq_exchange": ({"name", "vhost", "settings"}, {"type", "durable", "auto_delete", "arguments"}),
    "rabbitmq_queue": ({"name", "vhost", "settings"}, {"durable", "auto_delete", "arguments", "arguments_json"}),
    "rabbitmq_binding": ({"source", "vhost", "destination", "destination_type", "routing_key", "arguments",
                          "arguments_json"}, set()),
}


def test_terraform_attributes_fit_the_provider_schema() -> None:
    topo = _topology()
    for address, body in _resources(export.terraform(topo, exits=[topo.destination("", "shop")],
                                                     parking=PARKING)).items():
        top, settings = PROVIDER_SCHEMA[address.split(".")[0]]
        assert set(body) <= top, address
        for block in body.get("settings", []):
            assert set(block) <= settings, address
            assert not {"arguments", "arguments_json"} <= set(block), f"{address}: the two conflict"


def test_both_exports_hold_the_parking_and_unroutable_queues() -> None:
    topo = _topology()
    parking = export.ParkingQueueDef("shop_delayq.parking", declare_arguments("quorum", (4, 3)))
    doc = json.loads(export.definitions(topo, vhost="v", parking=parking))
    queues = {q["name"]: q for q in doc["queues"]}
    assert queues["shop_delayq.parking"]["arguments"] == {"x-queue-type": "quorum", "x-delivery-limit": -1}
    assert queues["shop_delayq.unroutable"]["arguments"] == {"x-queue-type": "quorum"}
    assert {"source": "shop_delayq.unroutable", "destination": "shop_delayq.unroutable", "destination_type": "queue",
            "routing_key": "", "vhost": "v", "arguments": {}} in doc["bindings"]
    res = _resources(export.terraform(topo, parking=parking))
    assert res["rabbitmq_queue.parking"]["name"] == "shop_delayq.parking"
    assert res["rabbitmq_queue.unroutable"]["name"] == "shop_delayq.unroutable"


def test_parking_queue_arguments_are_the_ones_the_app_declares() -> None:
    """The export asks the parking module, so an export for 3.x never gets 4.x's -1 (a limit of 0 there)."""
    config = DelayqConfig(prefix="shop_delayq")
    assert export.parking_queue_def(config, "quorum", (3, 10, 8)).arguments == declare_arguments("quorum", (3, 10, 8))
    assert export.parking_queue_def(config, "quorum", (4, 3, 6)).arguments == declare_arguments("quorum", (4, 3, 6))
    assert "x-delivery-limit" not in export.parking_queue_def(config, "quorum", None).arguments
    named = export.parking_queue_def(DelayqConfig(parking_queue="dead", parking_queue_type="classic"), "quorum")
    assert named == export.ParkingQueueDef("dead", {"x-queue-type": "classic"})


@needs_terraform
def test_terraform_values_equal_the_definitions() -> None:
    """Terraform's own evaluation of every name and argument gives what the definitions JSON says.

    Includes a routing key with ``${`` and ``%{``, which HCL would read as a template if not escaped.
    """
    topo = _topology()
    exits = [topo.destination("", "shop"), topo.destination("orders", "a.${b}.%{c}")]
    res = load(export.terraform(topo, vhost="/", exits=exits, parking=PARKING))
    doc = json.loads(export.definitions(topo, vhost="/", exits=exits, parking=PARKING))
    from tf_apply import _evaluate

    _evaluate(res)
    tf_queues = {r.values["name"]: json.loads(r.values["settings"][0].get("arguments_json") or "{}")
                 for r in res.values() if r.type == "rabbitmq_queue"}
    assert tf_queues == {q["name"]: q["arguments"] for q in doc["queues"]}
    tf_exchanges = {r.values["name"]: (r.values["settings"][0]["type"], r.values["settings"][0].get("arguments") or {})
                    for r in res.values() if r.type == "rabbitmq_exchange"}
    assert tf_exchanges == {e["name"]: (e["type"], e["arguments"]) for e in doc["exchanges"]}
    tf_bindings = sorted((r.values["source"], r.values["destination"], r.values["destination_type"],
                          r.values["routing_key"], r.values["vhost"])
                         for r in res.values() if r.type == "rabbitmq_binding")
    assert tf_bindings == sorted((b["source"], b["destination"], b["destination_type"], b["routing_key"], b["vhost"])
                                 for b in doc["bindings"])
    assert terraform_eval(['"a.$${b}"']) == ["a.${b}"]


# -- against the broker: a fresh vhost per test ------------------------------------------------

def _ctl(*args: str) -> subprocess.CompletedProcess[str]:
    # PATH decides which broker: /tmp/rmq4shim first on PATH for RabbitMQ 4.x.
    return subprocess.run(["rabbitmqctl", "-q", *args], check=True, capture_output=True, text=True, timeout=120)


@pytest.fixture
def fresh_vhost(vhost: str) -> Iterator[str]:
    """A vhost created for this test only (the imports target it), deleted with everything in it.

    Asks for the session's ``vhost`` fixture, which checks the broker and its rabbitmqctl (and
    keeps these tests in the broker-facing set that each broker's CI leg runs).
    """
    name = f"delayq-iac-{uuid.uuid4().hex[:8]}"
    _ctl("add_vhost", name)
    _ctl("set_permissions", "-p", name, "guest", ".*", ".*", ".*")
    try:
        yield name
    finally:
        with contextlib.suppress(Exception):
            _ctl("delete_vhost", name)


def _connect(vhost: str) -> amqp.Connection:
    conn = amqp.Connection(BROKER_HOST, virtual_host=vhost, connect_timeout=10)
    conn.connect()
    return conn


APP = textwrap.dedent('''
    import os, time
    from celery import Celery
    import celery_delayq  # noqa: F401  (delayq_enabled takes effect in processes that import it)
    app = Celery("iacapp", broker=os.environ["IAC_BROKER"])
    app.conf.update(delayq_enabled=True, delayq_prefix=os.environ["IAC_PREFIX"], delayq_levels=8,
                    delayq_declare=os.environ.get("IAC_DECLARE", "0") == "1", broker_heartbeat=0,
                    task_default_queue=os.environ["IAC_QUEUE"], worker_hijack_root_logger=False)

    @app.task(bind=True)
    def due(self, at):
        print(f"ARRIVED late={time.time() - at:.3f} entry={(self.request.headers or {}).get('x-delayq-entry')}",
              flush=True)
''')

SEND = textwrap.dedent('''
    import time
    from iacapp import app, due
    due.apply_async((time.time() + 0.5,), countdown=0.5)
    print("SENT", flush=True)
''')


@pytest.fixture
def iac_app(tmp_path: Path, fresh_vhost: str) -> Any:
    """A project whose app may only verify the ladder (delayq_declare = False), in the fresh vhost."""
    (tmp_path / "iacapp.py").write_text(APP)
    (tmp_path / "send.py").write_text(SEND)
    uid = uuid.uuid4().hex[:8]
    env = dict(os.environ, IAC_BROKER=f"amqp://guest:guest@{BROKER_HOST}/{quote(fresh_vhost, safe='')}",
               IAC_PREFIX=f"iac{uid}", IAC_QUEUE=f"iac.{uid}",
               PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))

    base_env = env

    class Project:
        vhost = fresh_vhost
        queue = env["IAC_QUEUE"]
        spec = LadderSpec(prefix=env["IAC_PREFIX"], levels=8)

        def run(self, *args: str, ok: bool = True,
                env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
            out = subprocess.run([sys.executable, *args], env={**base_env, **(env or {})}, cwd=tmp_path,
                                 capture_output=True, text=True, timeout=180)
            if ok:
                assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
            return out

        def celery(self, *args: str, ok: bool = True,
                   env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
            return self.run("-m", "celery", "-A", "iacapp", *args, ok=ok, env=env)

        def delayed_task_arrives(self) -> str:
            """Start a real worker, send a task with a countdown, return the line it printed."""
            worker = subprocess.Popen([sys.executable, "-m", "celery", "-A", "iacapp", "worker", "--pool", "solo",
                                       "--concurrency", "1", "--loglevel", "WARNING", "--without-heartbeat",
                                       "--without-gossip", "--without-mingle"],
                                      env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True)
            lines: "queue.Queue[str]" = queue.Queue()
            threading.Thread(target=lambda: [lines.put(line) for line in worker.stdout or ()], daemon=True).start()
            try:
                self.run("send.py")
                deadline = time.time() + 60
                seen: list[str] = []
                while time.time() < deadline:
                    try:
                        line = lines.get(timeout=1)
                    except queue.Empty:
                        continue
                    seen.append(line)
                    if "ARRIVED" in line:
                        return line
                raise AssertionError("the delayed task did not arrive; worker said:\n" + "".join(seen[-30:]))
            finally:
                worker.terminate()
                try:
                    worker.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    worker.kill()
                    worker.wait()

    return Project()


def _broker_version() -> tuple[int, ...]:
    from celery_delayq.rabbitmq.client import broker_version

    conn = _connect("/")
    try:
        return broker_version(conn)
    finally:
        conn.close()


def test_definitions_import_into_a_fresh_vhost_then_verify_and_deliver(iac_app: Any) -> None:
    """`rabbitmqctl import_definitions`, then `topology verify` passes and a delayed task arrives."""
    version = _broker_version()
    # no --broker-version: the CLI asks the app's broker, for the parking queue's arguments
    out = iac_app.celery("delayq", "export", "--format", "definitions", "--vhost", iac_app.vhost,
                         "--destination", iac_app.queue).stdout
    doc = json.loads(out)
    assert {q["vhost"] for q in doc["queues"]} == {iac_app.vhost}
    # The destination queue is the app's (Celery declares it); the export holds only its exit queue.
    ch = _connect(iac_app.vhost)
    ch.channel().queue_declare(iac_app.queue, durable=True, auto_delete=False)
    ch.close()
    # The broker node reads the file itself (as user rabbitmq; for 4.x the shim copies it into its chroot).
    with tempfile.NamedTemporaryFile("w", suffix=".json", dir="/tmp", delete=False) as fh:
        fh.write(out)
    os.chmod(fh.name, 0o644)
    try:
        _ctl("import_definitions", fh.name)
    finally:
        os.unlink(fh.name)

    assert "complete" in iac_app.celery("delayq", "topology", "verify").stdout
    conn = _connect(iac_app.vhost)
    try:
        for name in (f"{iac_app.spec.prefix}.parking", iac_app.spec.unroutable_queue):
            conn.channel().queue_declare(name, passive=True)
        # the parking queue is the one the app would have declared on this broker
        ch = conn.channel()
        ch.queue_declare(f"{iac_app.spec.prefix}.parking", durable=True, auto_delete=False,
                         arguments=declare_arguments("quorum", version))
    finally:
        conn.close()
    line = iac_app.delayed_task_arrives()
    assert "entry=" in line and "entry=None" not in line, line  # it came out of the ladder
    assert float(re.search(r"late=(-?[\d.]+)", line).group(1)) >= 0


@needs_terraform
def test_terraform_applies_first_time_in_the_worst_order(iac_app: Any) -> None:
    """Every resource created as soon as its references allow, bindings first: no 404, then a task arrives."""
    version = _broker_version()
    hcl = iac_app.celery("delayq", "export", "--format", "terraform", "--vhost", iac_app.vhost,
                         "--destination", iac_app.queue, "--broker-version", ".".join(map(str, version))).stdout
    conn = _connect(iac_app.vhost)
    conn.channel().queue_declare(iac_app.queue, durable=True, auto_delete=False)
    conn.close()
    created = apply(hcl, _connect)
    assert created.index("rabbitmq_binding.level00_d1") > created.index("rabbitmq_queue.level00_d1")
    assert created.index("rabbitmq_binding.level00_d1") > created.index("rabbitmq_exchange.level00")
    assert "rabbitmq_queue.parking" in created and "rabbitmq_queue.unroutable" in created
    assert "complete" in iac_app.celery("delayq", "topology", "verify").stdout
    line = iac_app.delayed_task_arrives()
    assert "entry=" in line and "entry=None" not in line, line


@needs_terraform
def test_the_worst_order_apply_catches_a_literal_binding(fresh_vhost: str) -> None:
    """The check above can fail: a binding written as the old export wrote it (names, no references)
    is created before its exchange and queue exist, and the broker answers 404."""
    topo = _topology(prefix=f"lit{uuid.uuid4().hex[:6]}")
    hcl = export.terraform(topo, vhost=fresh_vhost)
    s = topo.spec
    referenced = "\n".join([
        "  source           = rabbitmq_exchange.level00.name",
        "  vhost            = rabbitmq_exchange.level00.vhost",
        "  destination      = rabbitmq_queue.level00_d1.name"])
    literal = "\n".join([
        f'  source           = "{s.level_exchange(0)}"',
        f'  vhost            = "{fresh_vhost}"',
        f'  destination      = "{s.level_queue(0, 1)}"'])
    assert referenced in hcl
    with pytest.raises(amqp.NotFound):
        apply(hcl.replace(referenced, literal), _connect)


@needs_terraform
def test_terraform_apply_stops_at_a_missing_vhost(vhost: str) -> None:
    """The vhost is read through a data source: a missing one fails before anything is created."""
    hcl = export.terraform(_topology(prefix="nowhere"), vhost=f"no-such-vhost-{uuid.uuid4().hex[:6]}")
    created: list[str] = []

    def connect(vhost: str) -> amqp.Connection:
        created.append(vhost)
        return _connect(vhost)

    with pytest.raises(Exception):
        apply(hcl, connect)
    assert len(created) == 1


def test_export_without_a_broker_assumes_3x_parking_arguments_and_says_so(iac_app: Any) -> None:
    nowhere = {"IAC_BROKER": "amqp://guest:guest@127.0.0.1:1//"}
    out = iac_app.celery("delayq", "export", "--format", "definitions", env=nowhere)
    parking = {q["name"]: q for q in json.loads(out.stdout)["queues"]}[f"{iac_app.spec.prefix}.parking"]
    assert parking["arguments"] == {"x-queue-type": "quorum"}
    assert "--broker-version" in out.stderr
    pinned = iac_app.celery("delayq", "export", "--broker-version", "4.3", env=nowhere)
    parking = {q["name"]: q for q in json.loads(pinned.stdout)["queues"]}[f"{iac_app.spec.prefix}.parking"]
    assert parking["arguments"] == {"x-queue-type": "quorum", "x-delivery-limit": -1}
    assert pinned.stderr == ""
