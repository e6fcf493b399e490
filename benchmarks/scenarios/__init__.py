"""One module per measurement of issue 5; each exposes ``run(ctx) -> dict``.

The :class:`ModeConfig` of ``--quick`` and ``--full`` lives here, so every
size, rate and delay a result depends on is in one place and is written into
the JSON next to the numbers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from ..common import Budget
from ..pool import ChildPool



def shipped_ladder() -> dict[str, Any]:
    """The ladder celery_delayq ships with (its ``DelayqConfig`` defaults), on quorum queues.

    Read from the core rather than written down here, so the benchmark always
    measures the default as it is (``queue_type`` "auto" resolves to quorum on
    RabbitMQ >= 3.10).
    """
    from celery_delayq.config import DelayqConfig

    d = DelayqConfig()
    return {"radix": d.radix, "unit_ms": d.unit_ms, "levels": d.levels, "queue_type": "quorum"}


#: The shipped ladder: what "celery_delayq" means in every scenario but the trade-offs.
DEFAULT_LADDER: dict[str, Any] = shipped_ladder()


def _variants(*shapes: tuple[int, ...] | tuple[int, int, str] | tuple[int, int, str, int]) -> tuple[dict[str, Any], ...]:
    """Trade-off variants ``(radix, unit_ms, queue_type[, shards])``, minus the shipped default."""
    out = []
    for radix, unit, qtype, *more in shapes:
        shards = int(more[0]) if more else 1
        v: dict[str, Any] = {"radix": radix, "unit_ms": unit, "queue_type": qtype}
        if shards > 1:
            v["shards"] = shards
        if not (radix == DEFAULT_LADDER["radix"] and unit == DEFAULT_LADDER["unit_ms"]
                and qtype == DEFAULT_LADDER["queue_type"] and shards == 1):
            out.append(v)
    return tuple(out)


@dataclass(frozen=True)
class ModeConfig:
    """Sizes of one benchmark mode. Quick must finish in five minutes on 2 cores."""

    name: str
    budget_s: float
    #: Throughput: target seconds of publishing per measurement, hard cap, delays (long, so
    #: nothing dead-letters while publishing), and process counts.
    tp_seconds: float
    tp_max_seconds: float
    tp_delay: tuple[float, float] = (600.0, 610.0)
    tp_procs: tuple[int, ...] = (1, 8)
    tp_rounds: int = 2
    #: Lateness: seconds of steady offered load per rate, delay range, offered rates.
    lat_duration: float = 3.0
    lat_delay: tuple[float, float] = (1.0, 5.0)
    lat_rates: tuple[int, ...] = (200, 1000, 3000)
    lat_worker_rates: tuple[int, ...] = (1000,)
    #: Peers whose higher rates are tried only while the lower ones are sustained.
    lat_other_rates: tuple[int, ...] = (200, 1000)
    #: Worker RSS: pending delayed tasks.
    rss_pending: int = 20_000
    rss_systems: tuple[str, ...] = ("classic", "delayq")
    #: Head-of-line blocking: the long delay published first.
    hol_long: float = 20.0
    #: Broker cost at saturation: messages, first due (s), spread of due times (s).
    sat_n: int = 8_000
    sat_d0: float = 4.0
    sat_width: float = 1.0
    #: Dead-letter limit of a single TTL queue: messages.
    dl_n: int = 20_000
    #: Design trade-offs: ladder variants, lateness at 1000/s too? (Saturation uses sat_*.)
    variants: tuple[dict[str, Any], ...] = ()
    variant_lateness: bool = False
    #: Capacity (full only): pending messages, publisher processes.
    capacity_n: int = 0
    capacity_procs: int = 4
    capacity_max_delivery_s: float = 1800.0
    #: (background, foreground) scenario pairs run at the same time to save wall-clock time;
    #: only for scenarios whose result is on a scale of seconds (head-of-line blocking).
    overlap: tuple[tuple[str, str], ...] = ()
    #: Profile of apply_async: calls per measurement, A/B rounds of the what-ifs.
    profile_calls: int = 5000
    profile_rounds: int = 2
    #: Measure the what-if core changes too (noisy with few calls, so full mode only).
    profile_whatifs: bool = True

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


QUICK = ModeConfig(
    name="quick", budget_s=270.0, tp_seconds=1.5, tp_max_seconds=3.0, tp_rounds=2,
    lat_duration=2.5, lat_delay=(1.0, 5.0), lat_rates=(200, 1000, 3000), lat_worker_rates=(1000,),
    lat_other_rates=(200, 1000), rss_pending=20_000, hol_long=20.0,
    sat_n=8_000, sat_d0=3.0, sat_width=1.0, dl_n=15_000,
    variants=_variants((8, 10, "quorum"), (4, 10, "quorum"), (2, 10, "quorum"), (2, 10, "classic"),
                       (2, 1, "quorum"), (4, 10, "quorum", 4)),
    variant_lateness=False, capacity_n=0, profile_calls=1500, profile_rounds=1, profile_whatifs=False,
    overlap=(("hol", "worker_rss"),),
)

FULL = ModeConfig(
    name="full", budget_s=4 * 3600.0, tp_seconds=6.0, tp_max_seconds=20.0, tp_rounds=3,
    lat_duration=15.0, lat_delay=(1.0, 10.0), lat_rates=(200, 500, 1000, 2000, 3000, 5000),
    lat_worker_rates=(200, 1000, 3000), lat_other_rates=(200, 500, 1000, 2000, 3000),
    rss_pending=100_000, rss_systems=("classic", "delayq", "native"), hol_long=60.0,
    sat_n=60_000, sat_d0=12.0, sat_width=2.0, dl_n=60_000,
    variants=_variants((4, 10, "quorum", 4), (2, 10, "quorum"), (4, 10, "quorum"), (8, 10, "quorum"), (16, 10, "quorum"),
                       (2, 10, "classic"), (8, 10, "classic"), (2, 1, "quorum"), (4, 1, "quorum")),
    variant_lateness=True, capacity_n=1_000_000, capacity_procs=4,
    profile_calls=5000, profile_rounds=2,
)

MODES = {"quick": QUICK, "full": FULL}


@dataclass
class Ctx:
    """What a scenario gets: the mode, the child pool, the time budget, earlier results."""

    cfg: ModeConfig
    pool: ChildPool
    budget: Budget
    log: Callable[[str], None]
    results: dict[str, Any] = field(default_factory=dict)
    #: Scenario this one ran alongside (quick mode's overlap), for the report.
    concurrent_with: str | None = None

    @property
    def quick(self) -> bool:
        return self.cfg.name == "quick"


#: Run order. Throughput first (its "pure" reference children start clean), capacity last.
ORDER = ("throughput", "limits", "confirm_safety", "lateness", "hol", "worker_rss", "broker_cost",
         "profile", "tradeoffs", "index_cost", "capacity")
