"""Shared by the cluster tests (imported by name, never ``from conftest import``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for benchmarks.faults
from benchmarks.faults.nodes import unavailable  # noqa: E402

#: AMQP base port per flavour of the 3-node clusters (nodes use base, base+1, base+2);
#: ``DELAYQ_CLUSTER_BASE_PORTS="host=5676,rmq4=5687"`` moves them (two sessions on one machine).
BASE_PORTS = {"host": 5690, "rmq4": 5695, **{
    flavour: int(port) for flavour, _, port in (item.partition("=") for item in
                                                os.environ.get("DELAYQ_CLUSTER_BASE_PORTS", "").split(",") if item)}}


def why_not(flavour: str) -> str | None:
    """Why the cluster tests of ``flavour`` do not run here (``None``: they do)."""
    if not os.environ.get("DELAYQ_CLUSTER_TESTS"):
        return "cluster tests run with ./dev test --cluster (DELAYQ_CLUSTER_TESTS=1)"
    return unavailable(flavour)
