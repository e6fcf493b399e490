"""Item 5: broker cost. Queue hops per delayed message, and dead-letters/s at saturation.

* Hops: the ``x-delayq-hops`` header (celery_delayq's own count, exit queue
  included) and the broker's ``x-death`` counts, which count every
  dead-lettering of the message; for the other systems the analytic value
  for the same delay distribution (native: popcount of the whole seconds;
  naive: 1; classic ETA: 0) next to what the lateness runs measured.
* Saturation: :func:`benchmarks.measure.saturation` on the default ladder:
  a burst due within a short window, so the ladder runs flat out; the
  delivered rate, x-death per message and their product, dead-letters/s.
  The ladder's queue depths are sampled meanwhile (AMQP passive declares,
  which cost the broker far less than ``rabbitmqctl``).
"""

from __future__ import annotations

import random
from typing import Any

from ..common import vhost
from ..measure import saturation
from ..peers import make_peer
from . import DEFAULT_LADDER, Ctx

NAME = "broker_cost"
TITLE = "Broker cost"


def expected_hops(peer: str, delay: tuple[float, float], opts: dict[str, Any], samples: int = 20000) -> float:
    """Mean queue hops of ``peer`` for delays uniform in ``delay`` (analytic, sampled)."""
    p = make_peer(peer, "amqp://unused/", **opts)
    rng = random.Random(7)
    return round(sum(p.expected_hops(rng.uniform(*delay)) for _ in range(samples)) / samples, 2)


def run(ctx: Ctx) -> dict[str, Any]:
    c = ctx.cfg
    analytic = {
        peer: expected_hops(peer, c.lat_delay, dict(DEFAULT_LADDER) if peer == "delayq" else {})
        for peer in ("delayq", "native", "naive", "classic")
    }
    ctx.log(f"  analytic hops for delays {c.lat_delay}: {analytic}")
    with vhost("sat") as vh:
        sat = saturation(ctx, vh, dict(DEFAULT_LADDER), c.sat_n, c.sat_d0, c.sat_width)
    ctx.log(f"  saturation: {sat.get('delivered_per_s')} delivered/s x {sat.get('mean_dead_letterings')} "
            f"dead-letterings = {sat.get('dead_letters_per_s')} dead-letters/s (saturated: {sat.get('saturated')})")
    return {"analytic_hops": analytic, "analytic_delay_s": list(c.lat_delay), "saturation": sat}
