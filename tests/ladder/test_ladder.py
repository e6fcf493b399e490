"""Property tests of the pure ladder arithmetic, checked against a simulated topic exchange."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from celery_delayq.errors import DelayTooLong, InvalidDelay, InvalidName
from celery_delayq.ladder.spec import MAX_NAME_BYTES, Binding, LadderSpec, check_name, destination_token

@st.composite
def specs(draw: st.DrawFn) -> LadderSpec:
    """Every valid ladder shape (the constructor rejects invalid ones)."""
    unit_ms = draw(st.sampled_from([1, 5, 10, 100]))
    radix = draw(st.sampled_from([2, 3, 4, 8, 16]))
    levels = draw(st.integers(min_value=1, max_value=20))
    assume((radix - 1) * radix ** (levels - 1) * unit_ms <= 2**32 - 1)
    return LadderSpec(prefix="p", unit_ms=unit_ms, levels=levels, radix=radix)


def topic_match(pattern: str, key: str) -> bool:
    """RabbitMQ topic semantics: ``*`` is exactly one word, ``#`` zero or more."""
    p, k = pattern.split("."), key.split(".")

    def m(i: int, j: int) -> bool:
        if i == len(p):
            return j == len(k)
        if p[i] == "#":
            return any(m(i + 1, jj) for jj in range(j, len(k) + 1))
        return j < len(k) and (p[i] == "*" or p[i] == k[j]) and m(i + 1, j + 1)

    return m(0, 0)


def simulate(spec: LadderSpec, units: int, token: str, shard: int = 0) -> tuple[list[str], int]:
    """Follow the declared bindings and dead-letter targets like the broker would.

    An entry exchange is a fanout: every binding of it matches, whatever the key (which the message keeps)."""
    key = spec.routing_key(units, token)
    bindings = spec.bindings()
    fanouts = set(spec.entry_exchanges())
    ttl = {name: spec.queue_ttl_ms(k, d) for k, d, name, _s in spec.level_queues()}
    dlx = {name: spec.dead_letter_target(k, s) for k, d, name, s in spec.level_queues()}
    exchange, path, waited = spec.entry_exchange(units, shard), [], 0
    for _ in range(4 * spec.levels + 4):
        if exchange == spec.delivery_exchange:
            assert topic_match(spec.exit_binding_key(token), key)
            return path, waited
        targets = [b for b in bindings if b.source == exchange and (exchange in fanouts or topic_match(b.routing_key, key))]
        assert len(targets) == 1, f"{exchange} routes {key} to {targets}"  # never duplicated, never lost
        b = targets[0]
        if b.destination_kind == "queue":
            path.append(b.destination)
            waited += ttl[b.destination]
            exchange = dlx[b.destination]
        else:
            exchange = b.destination
    raise AssertionError("routing loop")


@settings(max_examples=300)
@given(spec=specs(), data=st.data(), entries=st.sampled_from(["fanout", "topic"]))
def test_simulated_routing_waits_exactly_the_delay(spec: LadderSpec, data: st.DataObject, entries: str) -> None:
    """Through either entry (the queue's fanout, or its level's topic exchange as 1.0.0rc1 published), the same
    queues and the same wait: the key the fanout does not read routes every later hop."""
    spec = dataclasses.replace(spec, entries=entries)
    units = data.draw(st.integers(min_value=1, max_value=spec.max_units))
    token = destination_token("ex", "rk")
    path, waited = simulate(spec, units, token)
    assert waited == units * spec.unit_ms
    assert path == spec.path(units)
    assert spec.hops(units) == len(path) + 1
    assert len(path) == sum(1 for d in spec.digits(units) if d)


@given(spec=specs(), data=st.data())
def test_digits_round_trip_through_routing_key(spec: LadderSpec, data: st.DataObject) -> None:
    units = data.draw(st.integers(min_value=0, max_value=spec.max_units))
    key = spec.routing_key(units, "tok")
    assert spec.delay_of(key) == units
    assert len(spec.digits(units)) == spec.levels
    assert len(key.encode()) <= MAX_NAME_BYTES


@given(spec=specs(), delay=st.floats(min_value=0.000001, max_value=1e7, allow_nan=False))
def test_units_round_up_so_delivery_is_never_early(spec: LadderSpec, delay: float) -> None:
    assume(delay <= spec.max_delay_s)
    units = spec.units_for(delay)
    # never early (to the microsecond the rounding works at) and never a whole unit late
    assert units * spec.unit_ms * 1000 >= round(delay * 1_000_000)
    assert (units - 1) * spec.unit_ms * 1000 < round(delay * 1_000_000)


def test_binary_popcount_hops() -> None:
    spec = LadderSpec(levels=10, unit_ms=1, radix=2)
    assert spec.hops(0b1011) == 3 + 1
    assert spec.path(0b1011) == ["delayq.10x2.L03", "delayq.10x2.L01", "delayq.10x2.L00"]
    assert spec.entry_exchange(0b1011) == "delayq.10x2.L03.entry"  # level 3's queue's own fanout exchange
    assert dataclasses.replace(spec, entries="topic").entry_exchange(0b1011) == "delayq.10x2.L03"


def test_a_publish_enters_through_its_first_queues_fanout_and_keeps_every_digit_in_its_key() -> None:
    spec = LadderSpec(levels=5, unit_ms=10)
    units = 3 * 4**3 + 2 * 4**1 + 1  # digits 0,3,0,2,1: first waits in L03.d3
    entry, key, hops = spec.route(units, "t0ken")
    assert entry == spec.entry_exchange_of(3, 3) == "delayq.5x4.L03.d3.entry"
    assert key == "0.3.0.2.1.t0ken" and hops == 4
    assert [b for b in spec.bindings() if b.source == entry] == [
        Binding(entry, "delayq.5x4.L03.d3", "queue", "")]  # bound to that queue alone
    assert spec.route(0, "t0ken")[0] == spec.delivery_exchange  # nothing to wait: straight to delivery
    assert spec == dataclasses.replace(spec, entries="topic")  # how it is entered is not the ladder's identity


def test_entries_must_be_fanout_or_topic() -> None:
    with pytest.raises(ValueError, match="entries must be 'fanout' or 'topic', got 'direct'"):
        LadderSpec(entries="direct")  # type: ignore[arg-type]


def test_radix_four_digits_pick_queues_by_value() -> None:
    spec = LadderSpec(levels=5, unit_ms=10)  # the default radix, 4
    units = 3 * 4**3 + 2 * 4**1 + 1  # digits 0,3,0,2,1
    assert spec.digits(units) == (0, 3, 0, 2, 1)
    assert spec.path(units) == ["delayq.5x4.L03.d3", "delayq.5x4.L01.d2", "delayq.5x4.L00.d1"]
    assert spec.queue_ttl_ms(3, 3) == 3 * 64 * 10


def test_reshaped_ladders_never_share_exchanges() -> None:
    a, b, c = LadderSpec(levels=14, radix=4), LadderSpec(levels=13, radix=4), LadderSpec(levels=29, radix=2)
    names = [{s.level_exchange(k) for k in range(s.levels)} | {s.delivery_exchange} | set(s.entry_exchanges())
             for s in (a, b, c)]
    assert not (names[0] & names[1]) and not (names[0] & names[2]) and not (names[1] & names[2])


def test_bindings_are_linear_in_levels() -> None:
    for levels, radix in ((5, 2), (29, 2), (5, 4), (15, 4), (10, 8)):
        spec = LadderSpec(levels=levels, radix=radix, unit_ms=1)
        # per level: radix - 1 queues and the pass-through on the level exchange, radix - 1 entries
        assert len(spec.bindings()) == levels * (2 * radix - 1)
        assert len(list(spec.level_queues())) == levels * (radix - 1)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, "5", None, True])
def test_invalid_delays_are_rejected(bad: object) -> None:
    with pytest.raises(InvalidDelay):
        LadderSpec().units_for(bad)  # type: ignore[arg-type]


def test_zero_and_negative_delay_mean_now() -> None:
    assert LadderSpec().units_for(0) == 0
    assert LadderSpec().units_for(-3.5) == 0


def test_delay_beyond_maximum_is_an_error_not_truncated() -> None:
    spec = LadderSpec(levels=10, unit_ms=10)
    assert spec.units_for(spec.max_delay_s) == spec.max_units
    with pytest.raises(DelayTooLong, match="never truncates"):
        spec.units_for(spec.max_delay_s + 0.011)
    with pytest.raises(DelayTooLong):
        spec.units_for(1e30)


def test_default_ladder_reaches_a_month_within_erlang_timer_limit() -> None:
    spec = LadderSpec()
    assert spec.max_delay_s > 31 * 86400
    assert spec.max_ttl_ms <= 2**32 - 1
    assert LadderSpec(radix=2, levels=29).max_delay_s > 62 * 86400  # binary reaches two months
    with pytest.raises(ValueError, match="timers"):
        LadderSpec(levels=15)


def test_prefix_may_not_clash_with_celery_native_ladder() -> None:
    with pytest.raises(ValueError, match="celery_delayed"):
        LadderSpec(prefix="celery_delayed")


def test_too_long_names_are_rejected_clearly() -> None:
    with pytest.raises(InvalidName, match="255 bytes"):
        check_name("queue name", "q" * 256)
    with pytest.raises(ValueError):
        LadderSpec(prefix="p" * 250)


def test_destination_token_has_no_wildcards_and_fixed_size() -> None:
    t = destination_token("ex.*", "a.#.b")
    assert len(t) == 16 and all(c in "0123456789abcdef" for c in t)
    assert destination_token("a", "b") != destination_token("a.b", "")


@settings(max_examples=300)
@given(specs(), st.data())
def test_route_is_entry_exchange_routing_key_and_hops_in_one_pass(spec: LadderSpec, data: st.DataObject) -> None:
    units = data.draw(st.integers(min_value=0, max_value=spec.max_units))
    token = "t" * 16
    assert spec.route(units, token) == (spec.entry_exchange(units), spec.routing_key(units, token), spec.hops(units))


# -- shards -------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(spec=specs(), shards=st.integers(min_value=1, max_value=5), data=st.data())
def test_every_shard_waits_exactly_the_delay_in_its_own_queues(spec: LadderSpec, shards: int,
                                                              data: st.DataObject) -> None:
    sharded = LadderSpec(prefix=spec.prefix, unit_ms=spec.unit_ms, levels=spec.levels, radix=spec.radix, shards=shards)
    shard = data.draw(st.integers(min_value=0, max_value=shards - 1))
    units = data.draw(st.integers(min_value=0, max_value=sharded.max_units))
    path, waited = simulate(sharded, units, destination_token("", "q"), shard)
    assert waited == units * sharded.unit_ms
    assert path == sharded.path(units, shard)
    mine = {name for _k, _d, name, s in sharded.level_queues() if s == shard}
    assert set(path) <= mine  # a message never crosses into another shard


def test_shard_zero_keeps_the_unsharded_names_and_bindings() -> None:
    plain, sharded = LadderSpec(prefix="p"), LadderSpec(prefix="p", shards=3)
    assert [q.name for q in sharded.level_queues() if q.shard == 0] == [q.name for q in plain.level_queues()]
    assert set(plain.bindings()) <= set(sharded.bindings())
    assert len(sharded.bindings()) == 3 * len(plain.bindings())
    assert len(sharded.level_exchanges()) == 3 * plain.levels
    assert sharded.level_queue(3, 2, 1) == "p.14x4.s1.L03.d2"
    assert sharded.delivery_exchange == plain.delivery_exchange  # all shards deliver through one exchange


def test_shard_of_is_stable_and_spreads_ids() -> None:
    spec = LadderSpec(prefix="p", shards=4)
    ids = [f"task-{i}" for i in range(4000)]
    picked = [spec.shard_of(i) for i in ids]
    assert picked == [LadderSpec(prefix="p", shards=4).shard_of(i) for i in ids]  # same id, same shard, any process
    counts = [picked.count(s) for s in range(4)]
    assert min(counts) > 800, counts  # within 20 % of an even 1,000 each
    assert {LadderSpec(prefix="p").shard_of(i) for i in ids} == {0}


@pytest.mark.parametrize("bad", [0, -1, 65, 2.0, True, "4"])
def test_invalid_shard_counts_are_rejected(bad: object) -> None:
    with pytest.raises(ValueError, match="shards must be an integer from 1 to 64"):
        LadderSpec(prefix="p", shards=bad)  # type: ignore[arg-type]


def test_a_shard_outside_the_ladder_is_an_error() -> None:
    with pytest.raises(ValueError, match="shard 2 is outside 0..1"):
        LadderSpec(prefix="p", shards=2).level_queue(0, 1, 2)


def _shape_of(spec: LadderSpec) -> dict[str, object]:
    return {"levels": spec.levels, "radix": spec.radix, "unit_ms": spec.unit_ms, "prefix": spec.prefix,
            "queues": {q.name: spec.queue_ttl_ms(q.level, q.digit) for q in spec.level_queues()},
            "exchanges": [spec.level_exchange(k) for k in range(spec.levels)] + [spec.delivery_exchange],
            "bindings": sorted([b.source, b.destination, b.routing_key] for b in spec.bindings())}


def test_the_default_shape_is_the_one_every_release_shipped() -> None:
    """An app that sets no shape gets, after an upgrade, the very queues, TTLs and bindings 0.1.0 declared (plus
    each queue's entry exchange, bound to it alone).

    ``tests/data/shape-0.1.0.json`` was written by 0.1.0's own code (287afbb); a new default shape
    must come with a migration, not by changing what an unconfigured app declares.
    """
    from celery import Celery

    from celery_delayq.config import DelayqConfig

    shipped = json.loads((Path(__file__).parents[1] / "data" / "shape-0.1.0.json").read_text())
    spec = DelayqConfig.from_app(Celery("x", set_as_current=False)).spec
    now = _shape_of(spec)
    # Every binding 0.1.0 declared is still there, so its processes route as they did; what 1.0.0 adds is one
    # binding per queue from the queue's own entry exchange, and nothing else.
    added = [b for b in now.pop("bindings") if b not in shipped["bindings"]]
    assert sorted(shipped.pop("bindings")) == sorted(
        [b.source, b.destination, b.routing_key] for b in spec.bindings() if b.source not in set(spec.entry_exchanges()))
    assert added == sorted([spec.entry_exchange_of(q.level, q.digit), q.name, ""] for q in spec.level_queues())
    assert now == shipped
