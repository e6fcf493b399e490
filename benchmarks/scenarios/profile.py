"""Where the time goes in ``apply_async`` -> LadderProducer.publish -> AppLadder.divert -> LadderPublisher.schedule.

In one child process: cProfile of N ``apply_async`` calls (plain, and inside
``celery_delayq.batch``), reduced to the functions on that path, and
"what-if" measurements: the same calls with small caches monkeypatched in
(in this child only), so each proposed core change comes with a measured
speed-up instead of a guess. Unprofiled rates are measured A/B/A/B to
average out broker noise.
"""

from __future__ import annotations

import cProfile
import functools
import pstats
import time
from typing import Any, Callable

from ..common import vhost
from . import DEFAULT_LADDER, Ctx

NAME = "profile"
TITLE = "Profile of apply_async"

#: Functions on the publish path (file suffix, function name) reported from the profile.
PATH = (
    ("celery_delayq/glue/task.py", "apply_async"),
    ("celery/app/task.py", "apply_async"),
    ("celery/app/base.py", "send_task"),
    ("celery_delayq/glue/task.py", "_native_delayed_delivery_active"),
    ("celery/app/base.py", "connection_for_write"),
    ("celery_delayq/config.py", "spec"),
    ("celery/app/amqp.py", "as_task_v2"),
    ("celery/app/amqp.py", "send_task_message"),
    ("celery_delayq/glue/producer.py", "publish"),
    ("celery_delayq/router.py", "publish"),
    ("celery_delayq/router.py", "_schedule"),
    ("kombu/messaging.py", "maybe_declare"),
    ("kombu/messaging.py", "_prepare"),
    ("celery_delayq/rabbitmq/publisher.py", "schedule"),
    ("celery_delayq/rabbitmq/publisher.py", "plan"),
    ("celery_delayq/ladder/spec.py", "digits"),
    ("celery_delayq/rabbitmq/publisher.py", "_wait"),
    ("celery_delayq/rabbitmq/confirms.py", "publish"),
    ("amqp/channel.py", "_basic_publish"),
)


def _patch(obj: Any, name: str, value: Any) -> Callable[[], None]:
    old = obj.__dict__[name] if isinstance(obj, type) else getattr(obj, name)
    setattr(obj, name, value)
    return lambda: setattr(obj, name, old)


def _whatif_native_cache() -> Callable[[], None]:
    """Cache ``_native_delayed_delivery_active(app)`` per app (it builds a kombu Connection per call)."""
    from celery_delayq.glue import task as T

    orig = T._native_delayed_delivery_active
    cache: dict[int, bool] = {}

    def cached(app: Any) -> bool:
        key = id(app)
        if key not in cache:
            cache[key] = orig(app)
        return cache[key]

    return _patch(T, "_native_delayed_delivery_active", cached)


def _whatif_spec_cache() -> Callable[[], None]:
    """Cache ``DelayqConfig.spec`` (a new, validated LadderSpec on every access)."""
    from celery_delayq.config import DelayqConfig

    orig = DelayqConfig.__dict__["spec"]
    memo = functools.lru_cache(maxsize=64)(lambda cfg: orig.fget(cfg))
    return _patch(DelayqConfig, "spec", property(lambda self: memo(self)))


def _whatif_digits_cache() -> Callable[[], None]:
    """Memoise ``LadderSpec.digits`` (plan() derives the digits three times per message)."""
    from celery_delayq.ladder.spec import LadderSpec

    orig = LadderSpec.__dict__["digits"]
    return _patch(LadderSpec, "digits", functools.lru_cache(maxsize=4096)(orig))


WHATIFS: tuple[tuple[str, str, Callable[[], Callable[[], None]]], ...] = (
    ("cache_native_check", "cache _native_delayed_delivery_active per app", _whatif_native_cache),
    ("cache_spec", "+ cache DelayqConfig.spec", _whatif_spec_cache),
    ("cache_digits", "+ memoise LadderSpec.digits", _whatif_digits_cache),
)


def _rates(app: Any, task: Any, n: int) -> dict[str, float]:
    import celery_delayq

    from ..peers.apps import TASK_NAME

    out = {}
    t0 = time.perf_counter()
    for i in range(n // 3):
        task.apply_async((0.0, i), countdown=600 + (i % 100) / 10)
    out["apply_async"] = (n // 3) / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    with celery_delayq.batch(app):
        for i in range(n):
            task.apply_async((0.0, i), countdown=600 + (i % 100) / 10)
    out["apply_async_batch"] = n / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    for i in range(n):
        app.send_task(TASK_NAME, (0.0, i))
    out["send_task_unconfirmed"] = n / (time.perf_counter() - t0)
    return out


def _purge(url: str, queues: list[str]) -> None:
    from ..child import raw_connection
    from ..common import purge

    conn = raw_connection(url)
    purge(conn, queues)
    conn.close()


def job_profile(proto: Any, job: dict[str, Any]) -> dict[str, Any]:
    """Child job: profile and what-if rates of delayq's apply_async."""
    import celery_delayq

    from ..peers import make_peer

    peer = make_peer("delayq", job["url"], **job["opts"])
    peer.declare()
    app, task = peer.app()  # type: ignore[attr-defined]
    queues = peer.queues() + ["dqbench.delayq"]
    n = int(job["n"])
    _rates(app, task, 300)  # warm-up
    _purge(job["url"], queues)
    proto.ready()

    base_runs = []
    whatif_runs: dict[str, list[dict[str, float]]] = {name: [] for name, _d, _f in WHATIFS}
    for _round in range(int(job.get("rounds", 2))):  # A/B/A/B: baseline, then each cumulative what-if
        base_runs.append(_rates(app, task, n))
        _purge(job["url"], queues)
        undo = []
        for name, _desc, apply in WHATIFS if job.get("whatifs", True) else ():
            try:
                undo.append(apply())
            except Exception:  # noqa: BLE001 - the core changed; skip this what-if
                break
            whatif_runs[name].append(_rates(app, task, n))
            _purge(job["url"], queues)
        for u in reversed(undo):
            u()

    def mean(runs: list[dict[str, float]]) -> dict[str, float]:
        return {k: round(sum(r[k] for r in runs) / len(runs), 1) for k in runs[0]} if runs else {}

    baseline = mean(base_runs)
    whatifs = []
    for name, desc, _f in WHATIFS:
        m = mean(whatif_runs[name])
        if m:
            whatifs.append({"name": name, "change": desc, **m,
                            "batch_speedup": round(m["apply_async_batch"] / baseline["apply_async_batch"], 2),
                            "plain_speedup": round(m["apply_async"] / baseline["apply_async"], 2)})

    profiles = {}
    for label, batched in (("apply_async_batch", True), ("apply_async", False)):
        prof = cProfile.Profile()
        calls = n if batched else n // 3
        prof.enable()
        t0 = time.perf_counter()
        if batched:
            with celery_delayq.batch(app):
                for i in range(calls):
                    task.apply_async((0.0, i), countdown=600 + (i % 100) / 10)
        else:
            for i in range(calls):
                task.apply_async((0.0, i), countdown=600 + (i % 100) / 10)
        wall = time.perf_counter() - t0
        prof.disable()
        _purge(job["url"], queues)
        profiles[label] = _summarise(prof, calls, wall)
    return {"calls": n, "baseline": baseline, "whatifs": whatifs, "profiles": profiles}


def _summarise(prof: cProfile.Profile, calls: int, wall: float) -> dict[str, Any]:
    stats = pstats.Stats(prof)
    raw: dict[tuple[str, int, str], tuple[int, int, float, float, Any]] = stats.stats  # type: ignore[attr-defined]
    path = []
    for suffix, func in PATH:
        best = None
        for (fname, _line, name), (_cc, nc, tt, ct, _callers) in raw.items():
            if name == func and fname.endswith(suffix) and (best is None or ct > best[2]):
                best = (nc, tt, ct)
        if best:
            path.append({"function": f"{suffix}:{func}", "calls": best[0],
                         "cum_us_per_call": round(best[2] / calls * 1e6, 1),
                         "share_of_total": round(best[2] / max(1e-9, wall), 3)})
    top = sorted(((tt, nc, f"{fname.split('site-packages/')[-1].split('/work/main/')[-1]}:{name}")
                  for (fname, _l, name), (_cc, nc, tt, _ct, _c) in raw.items()), reverse=True)[:12]
    return {"calls": calls, "profiled_wall_s": round(wall, 3), "path": path,
            "top_self_time": [{"function": f, "calls": nc, "self_us_per_call": round(tt / calls * 1e6, 1)}
                              for tt, nc, f in top]}


def run(ctx: Ctx) -> dict[str, Any]:
    with vhost("prof") as vh:
        job = {"kind": "call", "handler": "benchmarks.scenarios.profile:job_profile", "url": vh.url,
               "opts": dict(DEFAULT_LADDER, prefix="dqprof"), "n": ctx.cfg.profile_calls,
               "rounds": ctx.cfg.profile_rounds, "whatifs": ctx.cfg.profile_whatifs}
        res = ctx.pool.run([job], timeout=900)[0]
    b = res["baseline"]
    ctx.log(f"  unprofiled: apply_async {b['apply_async']:.0f}/s, batch {b['apply_async_batch']:.0f}/s, "
            f"send_task {b['send_task_unconfirmed']:.0f}/s")
    for w in res["whatifs"]:
        ctx.log(f"  what-if {w['change']}: batch {w['apply_async_batch']:.0f}/s (x{w['batch_speedup']}), "
                f"plain {w['apply_async']:.0f}/s (x{w['plain_speedup']})")
    return res
