"""What ``topology delete`` counts as the ladder's: exactly the names its naming scheme makes (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from celery_delayq.ladder.index_layout import IndexLayout
from celery_delayq.ladder.spec import LadderSpec
from celery_delayq.rabbitmq.fixed import fixed_queue_name
from celery_delayq.rabbitmq.topology import Topology, ladder_role, select_owned


def _made(spec: LadderSpec) -> list[tuple[str, str, str]]:
    """``(kind, name, role)`` of everything a ladder of ``spec`` and its publishers create."""
    topo = Topology(spec, "quorum", index=IndexLayout(spec))
    made = [(kind.split(":")[0], name, "") for kind, name, _args in topo.entities()]
    dests = [topo.destination("", "celery"), topo.destination("", "other"), topo.destination("x.y", "a.*.#"),
             topo.destination("", spec.laps_queue), topo.destination("", "é" * 100)]
    made += [("queue", d.exit_queue, "exit") for d in dests]
    made += [("queue", fixed_queue_name(spec, d, ttl), "fixed") for d in dests for ttl in (1000, 600000)]
    made.append(("queue", f"{spec.prefix}.parking", "parking"))
    return made


@pytest.mark.parametrize("spec", [LadderSpec(prefix="app", levels=3), LadderSpec(prefix="app", levels=14, shards=3),
                                  LadderSpec(prefix="a.b-c", levels=12, radix=2, shards=2),
                                  LadderSpec(prefix="app", levels=4, radix=36)])
def test_every_name_the_ladder_makes_is_recognised_with_its_role(spec: LadderSpec) -> None:
    shape = f"{spec.levels}x{spec.radix}"
    for kind, name, role in _made(spec):
        found = ladder_role(spec.prefix, kind, name)
        assert found is not None, (kind, name)
        if role:
            assert found == (role, ""), name  # exit, fixed, parking: every shape of the prefix shares them
        elif name.startswith(f"{spec.namespace}."):
            assert found[1] == shape, name  # levels of every shard, delivery, streams: this shape's
        else:
            assert found[0] in ("laps", "unroutable") and found[1] == "", name
    entries = set(spec.entry_exchanges())
    assert entries and all(ladder_role(spec.prefix, "exchange", n) == ("entries", shape) for n in entries)


@pytest.mark.parametrize("kind,name", [
    ("queue", "appx.exit.default_celery.0123456789abcdef"),  # another prefix that starts with the same characters
    ("queue", "appx.laps"), ("exchange", "appx.unroutable"), ("queue", "appx.3x4.L00.d1"),
    ("queue", "app.tasks"), ("queue", "app"), ("exchange", "app.events"),  # the app's own, not the ladder's
    ("queue", "app.exit.default_celery.nothexnothexnoth"), ("queue", "app.exit.default_celery.0123456789abcde"),
    ("queue", "app.exit.a.b.0123456789abcdef"), ("queue", "app.exit..0123456789abcdef"),
    ("queue", "app.fixed.1000.default_q.0123456789abcdef"), ("queue", "app.fixed.ms.default_q.0123456789abcdef"),
    ("queue", "app.3x4.L00.extra"), ("queue", "app.3x4.L0"), ("queue", "app.3x4.L00.d0"), ("queue", "app.3x4.cancelsx"),
    ("queue", "app.3x4.index.100"), ("queue", "app.0x4.L00.d1"), ("exchange", "app.3x4.deliverx"),
    ("exchange", "app.3x4.L00.d1"), ("queue", "app.3x4.deliver"), ("exchange", "app.laps"),
    ("queue", "app.3x4.s0.L00.d1"), ("queue", "other.app.unroutable"), ("queue", "APP.unroutable"),
    ("queue", "app.3x4.L00.d1.entry"), ("exchange", "app.3x4.L00.d0.entry"), ("exchange", "app.3x4.L00.d1.entryx"),
])
def test_names_the_ladder_does_not_make_are_not_its(kind: str, name: str) -> None:
    assert ladder_role("app", kind, name) is None


def test_a_prefix_with_regex_characters_matches_only_itself() -> None:
    assert ladder_role("a.b", "queue", "a.b.laps") == ("laps", "")
    assert ladder_role("a.b", "queue", "axb.laps") is None and ladder_role("a+", "queue", "aa.laps") is None


def test_a_parking_queue_named_by_the_settings_is_the_ladders() -> None:
    assert ladder_role("app", "queue", "billing-parked", parking_queue="billing-parked") == ("parking", "")
    assert ladder_role("app", "queue", "billing-parked") is None


def _rows(spec: LadderSpec, *extra: tuple[str, str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    made = [(kind, name) for kind, name, _role in _made(spec)] + list(extra)
    queues = [{"name": n, "type": "stream" if ".index." in n or n.endswith(".cancels") else "quorum", "messages": 2}
              for k, n in made if k == "queue"]
    return queues, [{"name": n, "type": "topic"} for k, n in made if k == "exchange"]


def test_select_takes_every_shard_and_destination_and_parking_only_on_request() -> None:
    listed = LadderSpec(prefix="app", levels=3, shards=2)
    configured = LadderSpec(prefix="app", levels=3)  # the app's settings know one shard only
    queues, exchanges = _rows(listed, ("queue", "app.tasks"), ("queue", "appx.laps"))
    picked = select_owned(configured, queues, exchanges)
    names = {o.name for o in picked.delete}
    assert {q.name for q in listed.level_queues()} <= names and set(listed.level_exchanges()) <= names
    assert {n for k, n, role in _made(listed) if role in ("exit", "fixed")} <= names
    assert "app.tasks" not in names and "appx.laps" not in names and "app.parking" not in names
    assert [o.name for o in picked.kept] == ["app.parking"] and picked.other_shapes == ()
    streams = [o for o in picked.delete if o.role in ("index", "cancels")]
    assert len(streams) == 17 and all(o.stream for o in streams)
    assert "app.parking" in {o.name for o in select_owned(configured, queues, exchanges, with_parking=True).delete}


def test_select_leaves_another_shape_and_what_it_shares() -> None:
    old, new = LadderSpec(prefix="app", levels=3), LadderSpec(prefix="app", levels=4)
    queues, exchanges = _rows(new)
    absent = select_owned(old, queues, exchanges)  # the app's shape is gone; another one uses the shared parts
    assert absent.delete == () and {o.name for o in absent.kept} >= {"app.unroutable", "app.laps"}
    assert {o.shape for o in absent.other_shapes} == {"4x4"}
    queues_both, exchanges_both = _rows(old, *[(k, n) for k, n, _r in _made(new)])
    kept = select_owned(old, queues_both, exchanges_both, keep_shared=True)
    assert {o.shape for o in kept.delete} == {"3x4"} and "app.unroutable" in {o.name for o in kept.kept}
    assert all(o.shape == "4x4" for o in kept.other_shapes)
