"""Leader placement planning (pure): spread, listener addresses, leader counts."""

from __future__ import annotations

import pytest

from celery_delayq.ladder.spec import LadderSpec
from celery_delayq.rabbitmq.placement import amqp_addresses, leader_counts, spread


def test_spread_gives_every_node_an_equal_share_and_neighbours_different_nodes() -> None:
    names = [q.name for q in LadderSpec(prefix="p").level_queues()]
    plan = spread(names, ["n3", "n1", "n2"])
    counts = {node: list(plan.values()).count(node) for node in ("n1", "n2", "n3")}
    assert counts == {"n1": 14, "n2": 14, "n3": 14}
    assert all(plan[a] != plan[b] for a, b in zip(names, names[1:]))


def test_spread_over_nothing_is_an_error() -> None:
    with pytest.raises(ValueError, match="no nodes"):
        spread(["q"], [])


def test_amqp_addresses_take_running_nodes_and_resolve_wildcards_by_node_host() -> None:
    listeners = [
        {"node": "rabbit@h1", "protocol": "amqp", "ip_address": "::", "port": 5672},
        {"node": "rabbit@h1", "protocol": "clustering", "ip_address": "::", "port": 25672},
        {"node": "rabbit@h2", "protocol": "amqp", "ip_address": "10.0.0.2", "port": 5673},
        {"node": "rabbit@h2", "protocol": "amqp/ssl", "ip_address": "10.0.0.2", "port": 5671},
        {"node": "rabbit@h3", "protocol": "amqp", "ip_address": "10.0.0.3", "port": 5672},
    ]
    assert amqp_addresses(listeners, ["rabbit@h1", "rabbit@h2"]) == {
        "rabbit@h1": ("h1", 5672), "rabbit@h2": ("10.0.0.2", 5673)}


def test_leader_counts_only_count_the_named_queues_by_leader_or_node() -> None:
    rows = [{"name": "a", "leader": "n1"}, {"name": "b", "leader": "n2"}, {"name": "c", "node": "n1"},
            {"name": "other", "leader": "n3"}]
    assert leader_counts(rows, ["a", "b", "c"]) == {"n1": 2, "n2": 1}


def test_spread_with_a_load_fills_the_least_loaded_nodes_first() -> None:
    from celery_delayq.rabbitmq.placement import spread

    assert spread(["a"], ["n1", "n2", "n3"], {"n1": 21, "n2": 20, "n3": 20}) == {"a": "n2"}
    placed = spread([f"q{i}" for i in range(4)], ["n1", "n2"], {"n1": 3})
    assert sorted(placed.values()) == ["n1", "n2", "n2", "n2"]


def test_owned_leaders_counts_each_kind_of_queue_per_node() -> None:
    from celery_delayq.rabbitmq.placement import owned_leaders

    rows = [{"name": "p.14x4.L00.d1", "leader": "n1"}, {"name": "p.14x4.L00.d2", "leader": "n2"},
            {"name": "p.14x4.index.00", "leader": "n3"}, {"name": "p.laps", "node": "n2"},
            {"name": "p.exit.default.q.ab", "leader": "n1"}, {"name": "other", "leader": "n1"}]
    kinds = {"p.14x4.L00.d1": "levels", "p.14x4.L00.d2": "levels", "p.14x4.index.00": "index", "p.laps": "laps"}
    assert owned_leaders(rows, kinds, "p.exit.") == {"levels": {"n1": 1, "n2": 1}, "index": {"n3": 1},
                                                     "laps": {"n2": 1}, "exits": {"n1": 1}}
