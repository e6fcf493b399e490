"""The file-handle arithmetic of RabbitMQ 3.x (pure; the broker side is tests/cluster/test_file_budget.py)."""

from __future__ import annotations

from celery_delayq.rabbitmq.budget import BudgetCheck, headroom, ladder_reservations, ladders_on, quorum_reservations
from celery_delayq.ladder.spec import LadderSpec
from celery_delayq.ladder.index_layout import IndexLayout
from celery_delayq.rabbitmq.topology import Topology


def test_a_default_ladder_is_43_quorum_queues_that_reserve_129_handles_on_one_node() -> None:
    # Measured on a private 3.10.8 node at ulimit -n 1024 (benchmarks/faults/handles.py): 129 reserved.
    spec = LadderSpec()
    topo = Topology(spec, "quorum", index=IndexLayout(spec))
    quorum = [name for kind, name, args in topo.entities() if args.get("x-queue-type") == "quorum"]
    assert len(quorum) == 43
    assert ladder_reservations(len(quorum), ["rabbit@a"], spread=False) == {"rabbit@a": 129}


def test_on_a_cluster_a_spread_ladder_reserves_the_same_on_every_node() -> None:
    nodes = ["n1", "n2", "n3"]
    # Leader 2 + 3 members, follower 2: 43 queues, 14 or 15 led per node.
    assert ladder_reservations(43, nodes, spread=True) == {"n1": 15 * 5 + 28 * 2, "n2": 14 * 5 + 29 * 2,
                                                           "n3": 14 * 5 + 29 * 2}
    # Client-local: the declaring node leads them all.
    assert ladder_reservations(43, nodes, spread=False) == {"n1": 215, "n2": 86, "n3": 86}


def test_reservations_count_leaders_and_followers_of_quorum_queues_only() -> None:
    rows = [{"type": "quorum", "leader": "a", "members": ["a", "b", "c"]},
            {"type": "quorum", "node": "b", "members": ["b"]},
            {"type": "stream", "leader": "a", "members": ["a", "b", "c"]},
            {"type": "classic", "node": "c"}]
    assert quorum_reservations(rows, ["a", "b", "c"]) == {"a": 5, "b": 2 + 3, "c": 2}


def test_headroom_keeps_a_tenth_for_connections_and_never_less_than_100() -> None:
    assert headroom(924) == 100
    assert headroom(19_900) == 1_990


def test_the_ladders_on_a_broker_are_named_by_namespace_and_vhost() -> None:
    rows = [{"name": f"app.14x4.L{k:02d}.d{d}", "vhost": "/", "type": "quorum"} for k in range(14) for d in (1, 2, 3)]
    rows += [{"name": "other.29x2.L00", "vhost": "v", "type": "quorum"},
             {"name": "app.14x4.s1.L00.d1", "vhost": "/", "type": "quorum"},
             {"name": "app.14x4.index.00", "vhost": "/", "type": "stream"}]
    assert ladders_on(rows) == {"app.14x4 (vhost /)": 43, "other.29x2 (vhost v)": 1}


def test_rabbitmq_4_is_never_checked() -> None:
    check = BudgetCheck((4, 3, 6), api=None)
    assert not check.applies
    check("any.14x4", 43)  # no API, no refusal: 4.x reserves nothing


def test_an_explicit_creation_without_the_api_goes_ahead_and_says_so() -> None:
    check = BudgetCheck((3, 10, 8), api=None, explicit=True)
    check("app.14x4", 43)
    assert check.unchecked == ("app.14x4", 43)
