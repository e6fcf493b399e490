"""Leader placement planning (pure): spread, listener addresses, leader counts."""

from __future__ import annotations

import pytest

from celery_delayq.ladder import LadderSpec
from celery_delayq.placement import amqp_addresses, leader_counts, spread


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
