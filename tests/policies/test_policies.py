"""Retry policies in isolation: strategies, state across processes, Retry-After, option resolution. Pure."""

from __future__ import annotations

import random
import time
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime
from types import SimpleNamespace

import pytest
import tenacity
from celery.utils.time import get_exponential_backoff_interval
from hypothesis import given, strategies as st
from tenacity import (
    retry_if_exception_type, stop_after_attempt, stop_after_delay, stop_before_delay, wait_exponential,
    wait_fixed, wait_random,
)

from celery_delayq.config import DelayqConfig
from celery_delayq.errors import InvalidDelay
from celery_delayq.policies import (
    RetryAfter, RetryPolicy, call_state, parse_retry_after, resolve_options, retry_if_celery_autoretry,
    split_call_options, stop_after_retries, wait_celery_backoff,
)


def state(attempt: int = 1, *, since: float = 0.0, exc: BaseException | None = None):
    now = time.time()
    return call_state(attempt_number=attempt, first_attempt=now - since, exception=exc or IOError("x"), now=now)


# -- state across processes ------------------------------------------------------
def test_state_measures_time_since_the_wallclock_first_attempt() -> None:
    s = call_state(attempt_number=3, first_attempt=1_000.0, exception=KeyError("k"), now=1_042.5)
    assert s.attempt_number == 3
    assert s.seconds_since_start == pytest.approx(42.5)
    assert s.outcome is not None and s.outcome.failed and isinstance(s.outcome.exception(), KeyError)


def test_tenacity_stop_after_delay_holds_across_processes() -> None:
    rule = stop_after_delay(3600)
    assert not rule(state(2, since=3599))
    assert rule(state(2, since=3601))  # an hour after the first attempt, whichever process asks


def test_state_rejects_an_attempt_number_below_one() -> None:
    with pytest.raises(ValueError, match="starts at 1"):
        call_state(attempt_number=0, first_attempt=0.0)


# -- Celery's rules as strategies ---------------------------------------------------
@given(factor=st.integers(1, 50), maximum=st.integers(0, 5000), attempt=st.integers(1, 30))
def test_celery_backoff_matches_celery_without_jitter(factor: int, maximum: int, attempt: int) -> None:
    wait = wait_celery_backoff(factor=factor, maximum=maximum, jitter=False)
    expected = get_exponential_backoff_interval(factor=factor, retries=attempt - 1, maximum=maximum)
    assert wait(state(attempt)) == expected


@given(seed=st.integers(0, 2**32), attempt=st.integers(1, 12))
def test_celery_backoff_jitter_draws_exactly_what_celery_draws(seed: int, attempt: int) -> None:
    wait = wait_celery_backoff(factor=3, maximum=100, jitter=True)
    random.seed(seed)
    ours = wait(state(attempt))
    random.seed(seed)
    celery = get_exponential_backoff_interval(factor=3, retries=attempt - 1, maximum=100, full_jitter=True)
    assert ours == celery
    assert 0 <= ours <= min(100, 3 * 2 ** (attempt - 1))


def test_celery_backoff_coerces_like_celery_autoretry() -> None:
    # autoretry uses int(max(1.0, retry_backoff)): True and 0.5 both mean factor 1
    assert wait_celery_backoff(factor=True, jitter=False)(state(3)) == 4
    assert wait_celery_backoff(factor=0.5, jitter=False)(state(3)) == 4


def test_stop_after_retries_is_celerys_max_retries() -> None:
    rule = stop_after_retries(3)
    assert [rule(state(n)) for n in (1, 2, 3, 4)] == [False, False, False, True]
    assert not stop_after_retries(None)(state(10_000))


def test_retry_if_celery_autoretry() -> None:
    rule = retry_if_celery_autoretry((OSError,), (FileNotFoundError,))
    assert rule(state(exc=ConnectionError()))
    assert not rule(state(exc=FileNotFoundError()))
    assert not rule(state(exc=KeyError()))


def test_our_strategies_compose_print_and_compare_like_values() -> None:
    combined = wait_celery_backoff(2, jitter=False) + wait_fixed(1)
    assert combined(state(2)) == 5
    either = stop_after_retries(5) | stop_after_delay(10)
    assert either(state(2, since=11)) and not either(state(2, since=1))
    assert wait_celery_backoff(2) == wait_celery_backoff(2) != wait_celery_backoff(3)
    assert repr(stop_after_retries(4)) == "stop_after_retries(max_retries=4)"


# -- RetryPolicy ----------------------------------------------------------------------------
def test_policy_decides_in_tenacitys_order() -> None:
    policy = RetryPolicy(wait=wait_exponential(multiplier=0.5, max=60), stop=stop_after_attempt(3),
                         retry=retry_if_exception_type(IOError))
    assert policy.decide(state(1)).delay == 0.5
    assert policy.decide(state(2)).delay == 1.0
    assert policy.decide(state(3)).action == "stop"
    assert policy.decide(state(1, exc=KeyError("k"))).action == "fail"
    # a task asking for the retry itself skips the predicate; an explicit delay replaces the wait
    decision = policy.decide(state(1, exc=KeyError("k")), delay=7.0, check_retry=False)
    assert decision.retry and decision.delay == 7.0


def test_stop_before_delay_sees_the_upcoming_wait() -> None:
    policy = RetryPolicy(wait=wait_fixed(30), stop=stop_before_delay(100))
    assert policy.decide(state(2, since=60)).retry
    assert policy.decide(state(2, since=80)).action == "stop"  # 80 + 30 would pass 100


def test_random_wait_stays_within_its_bounds() -> None:
    policy = RetryPolicy(wait=wait_exponential(multiplier=0.5, max=60) + wait_random(0, 1))
    delays = [policy.decide(state(4)).delay for _ in range(200)]
    assert all(4.0 <= d <= 5.0 for d in delays)
    assert max(delays) - min(delays) > 0.5  # it is random, not a constant


def test_policy_from_tenacity_retrying_and_repr() -> None:
    retrying = tenacity.Retrying(wait=wait_fixed(2), stop=stop_after_attempt(8) | stop_after_delay(3600),
                                 retry=retry_if_exception_type(IOError))
    policy = RetryPolicy.from_tenacity(retrying)
    assert policy.wait is retrying.wait and policy.stop is retrying.stop
    text = repr(policy)
    assert "wait_fixed(wait_fixed=2.0)" in text and "stop_after_attempt(max_attempt_number=8)" in text
    assert "exception_types=OSError" in text
    with pytest.raises(TypeError, match="RetryPolicy or a tenacity.Retrying"):
        RetryPolicy.coerce("fast")


def celery_task(**attrs):
    base = dict(name="t", max_retries=3, default_retry_delay=180)
    base.update(attrs)
    return SimpleNamespace(**base)


def test_policy_from_celery_options_reproduces_celery() -> None:
    policy = RetryPolicy.from_celery(celery_task(retry_backoff=2, retry_backoff_max=10, retry_jitter=False,
                                                 autoretry_for=(IOError,), max_retries=4))
    assert [policy.decide(state(n)).delay for n in (1, 2, 3, 4)] == [
        get_exponential_backoff_interval(2, n - 1, 10) for n in (1, 2, 3, 4)]
    assert policy.decide(state(5)).action == "stop"
    assert policy.decide(state(1, exc=KeyError())).action == "fail"
    plain = RetryPolicy.from_celery(celery_task(default_retry_delay=7, retry_kwargs={"max_retries": 1}))
    assert plain.decide(state(1)).delay == 7 and plain.decide(state(2)).action == "stop"


# -- RetryAfter ---------------------------------------------------------------------------
def test_parse_retry_after_seconds_and_http_dates() -> None:
    now = 1_700_000_000.0
    assert parse_retry_after("120", now=now) == 120
    assert parse_retry_after(b" 5 ", now=now) == 5
    http_date = format_datetime(datetime.fromtimestamp(now + 90, tz=timezone.utc), usegmt=True)
    assert parse_retry_after(http_date, now=now) == pytest.approx(90)
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=now) == 0  # past: now
    assert parse_retry_after(timedelta(minutes=2), now=now) == 120
    assert parse_retry_after(2.5) == 2.5
    for junk in ("soon", "-5", float("nan"), None):
        with pytest.raises(InvalidDelay):
            parse_retry_after(junk, now=now)


def test_retry_after_carries_delay_and_cause_and_pickles() -> None:
    import pickle

    cause = ConnectionError("429 Too Many Requests")
    err = RetryAfter.from_header("30", exc=cause)
    assert err.delay == 30 and err.exc is cause and "retry after 30 s" in str(err)
    again = pickle.loads(pickle.dumps(err))
    assert again.delay == 30 and isinstance(again.exc, ConnectionError)


# -- option resolution ------------------------------------------------------------------------
def test_options_resolve_call_then_task_then_app() -> None:
    config = DelayqConfig(prefix="px", max_delay=50.0, park_on=("builtins.ValueError",),
                          retry_policy=RetryPolicy(wait=wait_fixed(9), stop=stop_after_attempt(2)))
    task = celery_task(delayq_stop=stop_after_attempt(5), delayq_parking_queue="task.park")
    opts = resolve_options(task, config)
    assert opts.max_delay == 50.0 and opts.parking_queue == "task.park" and opts.park_on == (ValueError,)
    assert opts.policy is not None
    assert opts.policy.decide(state(1)).delay == 9  # wait from the app's policy
    assert opts.policy.decide(state(4)).retry  # stop from the task (5), not the app (2)
    call = resolve_options(task, config, {"delayq_stop": stop_after_attempt(1), "delayq_max_delay": 3})
    assert call.policy is not None and call.policy.decide(state(1)).action == "stop" and call.max_delay == 3


def test_no_policy_anywhere_means_celery_decides() -> None:
    opts = resolve_options(celery_task(retry_backoff_max=42), DelayqConfig(prefix="px"))
    assert opts.policy is None
    assert opts.max_delay == 42  # RetryAfter is capped like Celery caps its backoff
    assert opts.parking_queue == "px.parking" and opts.park and not opts.dedup


def test_unset_policy_slots_fall_back_to_the_tasks_celery_options() -> None:
    task = celery_task(delayq_stop=stop_after_delay(3600), default_retry_delay=11)
    opts = resolve_options(task, DelayqConfig(prefix="px"))
    assert opts.policy is not None and opts.policy.decide(state(1)).delay == 11


def test_bad_options_say_what_is_accepted() -> None:
    with pytest.raises(TypeError, match="delayq_policy"):
        split_call_options({"delayq_polcy": 1})
    with pytest.raises(TypeError, match="exception classes"):
        resolve_options(celery_task(delayq_park_on=(42,)), DelayqConfig(prefix="px"))
    options = {"countdown": 1, "delayq_max_delay": 2}
    assert split_call_options(options) == {"delayq_max_delay": 2} and options == {"countdown": 1}
