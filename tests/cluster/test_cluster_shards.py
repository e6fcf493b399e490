"""Sharded ladders and same-due bursts on private brokers (the short version of two benchmarks).

``benchmarks/faults/burst.py`` and ``benchmarks/faults/scale.py`` make the
committed tables; these run the same code, smaller, so that CI catches a
sharded ladder that loses, duplicates or delivers early on a real cluster, and a
burst that comes out later than the goal.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from benchmarks.faults.burst import run_burst
from benchmarks.faults.nodes import Cluster
from benchmarks.faults.scale import run_saturation

pytestmark = pytest.mark.timeout(900)


def _shard_leaders(cluster: Cluster) -> dict[str, set[str]]:
    """Leader nodes of each shard's level queues (of every ladder named ``scale*``), by shard tag."""
    node = cluster.nodes[0]
    req = urllib.request.Request(f"{node.mgmt_url}/api/queues/%2F?columns=name,type,leader,node")
    req.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")
    rows: list[dict[str, Any]] = json.load(urllib.request.urlopen(req, timeout=10))
    found: dict[str, set[str]] = {}
    for row in rows:
        name = str(row["name"])
        if name.startswith("scale") and ".L" in name and row.get("type") == "quorum":
            shard = name.split(".")[2] if name.split(".")[2].startswith("s") else "s0"
            found.setdefault(shard, set()).add(str(row.get("leader") or row.get("node")))
    return found


def test_a_sharded_ladder_on_a_cluster_delivers_everything_on_time_from_every_node(
        cluster: Cluster, tmp_path: Path) -> None:
    # Due 40 s after the start: the burst must be published before it comes due, or lateness would measure
    # the publishers. On a 3-node 3.10 cluster sharing 2 cores, 3,000 publishes from 2 processes took over
    # 15 s on 2026-11-26 with this code and with the last landed one alike (machine CPU 147-164 %).
    result = run_saturation(cluster, shards=3, tasks=3000, procs=2, due_s=40.0, workdir=tmp_path)
    print(result)
    assert result.lost == 0 and result.early == 0, result
    assert not result.publish_overran_due, result
    assert result.late_max_s < 60, result  # 3,000 tasks due within one second, on a cluster sharing 2 cores
    leaders = _shard_leaders(cluster)
    assert set(leaders) == {"s0", "s1", "s2"}, leaders
    for shard, nodes in leaders.items():  # every shard's levels are led from every node
        assert len(nodes) == 3, (shard, nodes)


@pytest.mark.parametrize("shards", [1, 2], ids=["unsharded", "2-shards"])
def test_a_same_due_burst_arrives_complete_and_within_ten_seconds(single: Cluster, tmp_path: Path,
                                                                 shards: int) -> None:
    result = run_burst(single.nodes[0], settings=f"shards{shards}", tasks=4000, procs=4, countdown=2.0,
                       workdir=tmp_path, batched=True, shards=shards)
    print(result)
    assert result.lost == 0 and result.early == 0, result
    assert result.late_max_s <= 10.0, result
