"""Private 3-node clusters (RabbitMQ 3.10 on the host, 4.3 in the rmq4 chroot) for placement and fault tests.

They start and kill brokers of their own (``benchmarks/faults/nodes.py``), never
the shared ones, need root, and take about a minute per cluster, so they run
only when asked: ``./dev test --cluster`` (CI does), which sets
``DELAYQ_CLUSTER_TESTS=1``. Elsewhere they are skipped, saying why.
"""

from __future__ import annotations

from typing import Iterator

import pytest
from cluster_helpers import BASE_PORTS, why_not

from benchmarks.faults.nodes import Cluster


@pytest.fixture(scope="session", params=["host", "rmq4"], ids=["rmq310", "rmq43"])
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """A fresh 3-node cluster with the management API on each node."""
    why = why_not(request.param)
    if why:
        pytest.skip(why)
    # pause_minority: RabbitMQ's advice for 3-node clusters, and what the partition test needs.
    with Cluster.start(request.param, size=3, base_port=BASE_PORTS[request.param], prefix=f"dq{request.param[0]}",
                       rabbit_advanced="{cluster_partition_handling, pause_minority}") as started:
        yield started


@pytest.fixture(scope="session", params=["host", "rmq4"], ids=["rmq310", "rmq43"])
def single(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """A private single node, killed by the tests."""
    why = why_not(request.param)
    if why:
        pytest.skip(why)
    with Cluster.start(request.param, size=1, base_port=5698 if request.param == "host" else 5699,
                       prefix=f"dqs{request.param[0]}") as started:
        yield started
