"""``human_duration`` and ``describe_ladder``: what people read in logs and the CLI."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, strategies as st

from celery_delayq.ladder.humanize import describe_ladder, human_duration
from celery_delayq.ladder.spec import LadderSpec


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0 s"),
    (0.0004, "0.4 ms"),
    (0.01, "10 ms"),
    (0.999, "999 ms"),
    (0.9996, "1 s"),
    (1.3, "1.3 s"),
    (42, "42 s"),
    (59.4, "59 s"),
    (59.96, "1 min"),
    (240, "4 min"),
    (270, "4.5 min"),
    (9000, "2.5 h"),
    (86399, "1 day"),
    (1.5 * 86400, "1.5 days"),
    (2684354.55, "31 days"),
    (-3.2, "-3.2 s"),
    (math.inf, "forever"),
    (math.nan, "unknown"),
])
def test_reads_like_a_person_would_say_it(seconds: float, text: str) -> None:
    assert human_duration(seconds) == text


@given(st.floats(min_value=1e-4, max_value=1e9))
def test_never_shows_more_than_the_next_unit_up(seconds: float) -> None:
    # "60 s", "60 min", "24 h" and "1000 ms" all have a shorter spelling one unit up
    number, unit = human_duration(seconds).split(" ")
    limit = {"ms": 1000, "s": 60, "min": 60, "h": 24}.get(unit)
    assert limit is None or float(number) < limit
    assert float(number) > 0


def test_describes_the_default_ladder_in_one_line() -> None:
    assert describe_ladder(LadderSpec(), "quorum") == \
        "ladder 'delayq': radix 4, 14 levels, unit 10 ms, one pass 31 days (longer delays lap), quorum"
    assert describe_ladder(LadderSpec(prefix="x", radix=2, levels=29, unit_ms=1)) == \
        "ladder 'x': radix 2, 29 levels, unit 1 ms, one pass 6.2 days (longer delays lap)"
