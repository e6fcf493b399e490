"""Celery countdown/eta semantics of due-time resolution (pure)."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

import pytest

from celery_delayq.ladder.delays import due_from, parse_eta
from celery_delayq.errors import InvalidDelay

NOW = 1_700_000_000.0


def test_countdown_adds_to_now() -> None:
    assert due_from(1.5, None, now=NOW) == NOW + 1.5


def test_eta_wins_over_countdown_as_in_celery() -> None:
    eta = datetime.fromtimestamp(NOW + 10, tz=timezone.utc)
    assert due_from(3, eta, now=NOW) == pytest.approx(NOW + 10)


@pytest.mark.parametrize("countdown", [0, -1, -0.001])
def test_zero_or_negative_countdown_runs_now(countdown: float) -> None:
    assert due_from(countdown, None, now=NOW) is None


def test_past_eta_runs_now() -> None:
    assert due_from(None, datetime.fromtimestamp(NOW - 5, tz=timezone.utc), now=NOW) is None


def test_naive_eta_is_utc_and_strings_parse() -> None:
    naive = datetime(2030, 1, 1, 0, 0, 0)
    assert parse_eta(naive) == datetime(2030, 1, 1, tzinfo=timezone.utc).timestamp()
    assert parse_eta("2030-01-01T00:00:00+00:00") == parse_eta(naive)
    aware = datetime(2030, 1, 1, 1, 0, 0, tzinfo=timezone(timedelta(hours=1)))
    assert parse_eta(aware) == parse_eta(naive)


@pytest.mark.parametrize("bad", [math.nan, math.inf, "soon", [1]])
def test_bad_countdowns_raise_specific_error(bad: object) -> None:
    with pytest.raises(InvalidDelay):
        due_from(bad, None, now=NOW)


def test_bad_eta_string_raises_specific_error() -> None:
    with pytest.raises(InvalidDelay, match="ISO-8601"):
        due_from(None, "next tuesday", now=NOW)
