"""The chaos soak's fault schedule, drawn from a seed (pure: the same seed and length give the same schedule).

Two kinds of fault, run by two threads of :mod:`.soak`:

- broker faults (``kill9``, ``stop_app``, ``partition`` of one node of three), one at a time, so the
  cluster keeps its majority: each starts at its planned time or 15 s after the previous one healed,
  whichever is later (a restart's length is not known in advance);
- client faults (``worker_kill9``, ``worker_restart``, ``publisher_kill9`` mid-``batch()``,
  ``conn_cut`` through the management API), at their planned times, overlapping the broker faults:
  about half the broker faults get one drawn inside their window on purpose.

``target`` is a node, worker, publisher or connection index (a connection index is taken modulo the
connections listed when the fault runs, so it replays only as far as the connections are the same).
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["FaultPlan", "BROKER_FAULTS", "CLIENT_FAULTS", "draw_schedule"]

BROKER_FAULTS = ("kill9", "stop_app", "partition")
CLIENT_FAULTS = ("worker_kill9", "worker_restart", "publisher_kill9", "conn_cut")


@dataclass(frozen=True)
class FaultPlan:
    """One planned fault: at ``at_s`` seconds into the load, on ``target``, lasting ``down_s``."""

    at_s: float
    kind: str
    target: int
    down_s: float

    @property
    def broker(self) -> bool:
        return self.kind in BROKER_FAULTS

    def row(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        what = {"kill9": "kill -9 node", "stop_app": "stop_app node", "partition": "partition node",
                "worker_kill9": "kill -9 worker", "worker_restart": "restart worker",
                "publisher_kill9": "kill -9 publisher (mid-batch)", "conn_cut": "close connection #"}[self.kind]
        return f"t={self.at_s:.0f}s {what} {self.target + 1} ({self.down_s:.0f} s)"


def draw_schedule(seed: int, minutes: float, *, nodes: int = 3, workers: int = 2, publishers: int = 2,
                  quiet_head_s: float = 20.0, quiet_tail_s: float = 45.0) -> list[FaultPlan]:
    """The faults of a ``minutes``-long load, from ``seed``, sorted by time.

    About one broker fault per 2.5 minutes (at least two: a kill -9 and one other kind) and one client
    fault per 1.2 minutes (at least one of each kind), in ``[quiet_head_s, length - quiet_tail_s]``.
    """
    if minutes <= 0:
        raise ValueError(f"minutes must be positive, got {minutes}")
    rng = random.Random(seed)
    length = minutes * 60.0
    lo, hi = quiet_head_s, max(quiet_head_s + 1.0, length - quiet_tail_s)
    n_broker = max(2, round(minutes / 2.5))
    n_client = max(len(CLIENT_FAULTS), round(minutes / 1.2))
    # Every kind at least once, then drawn at random; broker faults spread over the window in order.
    broker_kinds = ["kill9", rng.choice(("stop_app", "partition"))]
    if n_broker >= 3:
        broker_kinds.append("partition" if broker_kinds[1] == "stop_app" else "stop_app")
    broker_kinds += [rng.choice(BROKER_FAULTS) for _ in range(n_broker - len(broker_kinds))]
    rng.shuffle(broker_kinds)
    plans: list[FaultPlan] = []
    slot = (hi - lo) / n_broker
    for i, kind in enumerate(broker_kinds):
        at = lo + slot * i + rng.uniform(0.0, slot * 0.5)
        down = rng.uniform(5.0, 30.0)
        plans.append(FaultPlan(round(at, 1), kind, rng.randrange(nodes), round(down, 1)))
    client_kinds = list(CLIENT_FAULTS) + [rng.choice(CLIENT_FAULTS) for _ in range(n_client - len(CLIENT_FAULTS))]
    rng.shuffle(client_kinds)
    broker_plans = list(plans)
    for i, kind in enumerate(client_kinds):
        if i < len(broker_plans) and rng.random() < 0.5:  # on purpose inside a broker fault's window
            b = broker_plans[i]
            at = b.at_s + rng.uniform(1.0, max(1.5, b.down_s))
        else:
            at = rng.uniform(lo, hi)
        target = rng.randrange({"worker_kill9": workers, "worker_restart": workers,
                                "publisher_kill9": publishers, "conn_cut": 1000}[kind])
        down = rng.uniform(2.0, 10.0) if kind != "conn_cut" else 0.0
        plans.append(FaultPlan(round(min(at, hi), 1), kind, target, round(down, 1)))
    return sorted(plans, key=lambda p: (p.at_s, p.kind))
