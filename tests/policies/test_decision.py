"""``decide_retry``: one decision per retry() call. Pure: no broker, no worker."""

from __future__ import annotations

import pytest
from tenacity import stop_after_attempt, wait_fixed

from celery_delayq.policies import RetryAfter, RetryPolicy, call_state
from celery_delayq.policies.decision import decide_retry
from celery_delayq.policies.resolve import RetryOptions

NOW = 1_800_000_000.0


def options(policy: RetryPolicy | None = None, park_on: tuple[type[BaseException], ...] = ()) -> RetryOptions:
    return RetryOptions(policy=policy, max_delay=60.0, park=True, park_on=park_on, parking_queue="p", dedup=False)


def decide(opts: RetryOptions, outcome: BaseException | None, attempt: int, **kw: object):
    kw.setdefault("countdown", None)
    kw.setdefault("eta", None)
    kw.setdefault("max_retries", None)
    kw.setdefault("task_max_retries", 3)
    state = call_state(attempt_number=attempt, first_attempt=NOW - 10, exception=outcome, now=NOW)
    return decide_retry(opts, outcome=outcome, exc=outcome, attempt=attempt, state=state, now=NOW, **kw)  # type: ignore[arg-type]


def test_without_a_policy_celery_decides_exactly_as_celery() -> None:
    assert decide(options(), ValueError(), 3).action == "retry"
    d = decide(options(), ValueError(), 4)
    assert d.action == "give_up" and d.max_retries is None  # Celery raises by its own count
    assert decide(options(), ValueError(), 4, max_retries=10).action == "retry"
    assert decide(options(), ValueError(), 2, countdown=7).countdown == 7


def test_retry_after_names_its_delay_capped_and_reports_its_cause() -> None:
    cause = KeyError("rate")
    d = decide(options(), RetryAfter(500, exc=cause), 1)
    assert d.action == "retry" and d.countdown == 60.0 and d.exc is cause


def test_park_on_is_never_retried() -> None:
    d = decide(options(park_on=(LookupError,)), KeyError("x"), 1)
    assert d.action == "park_now"


def test_policy_wait_and_stop_with_celery_max_retries_aligned() -> None:
    policy = RetryPolicy(wait=wait_fixed(5), stop=stop_after_attempt(3))
    d = decide(options(policy), ValueError(), 2)
    assert (d.action, d.countdown, d.max_retries) == ("retry", 5.0, 2)
    d = decide(options(policy), ValueError(), 3)
    assert (d.action, d.max_retries) == ("give_up", 2)  # Celery gives up on this very call


@pytest.mark.parametrize("countdown,eta,expected", [(9, None, 9), (None, NOW + 4, None)])
def test_explicit_countdown_or_eta_wins_over_the_policys_wait(countdown, eta, expected) -> None:
    policy = RetryPolicy(wait=wait_fixed(5), stop=stop_after_attempt(10))
    d = decide(options(policy), ValueError(), 1, countdown=countdown, eta=eta)
    assert d.action == "retry" and d.countdown == expected and d.eta == eta


def test_the_decision_carries_the_delay_it_chose() -> None:
    """``retry_scheduled`` reports this delay as it is: nobody computes it a second time."""
    assert decide(options(), ValueError(), 1, countdown=7).delay == 7.0
    assert decide(options(), ValueError(), 1, eta=NOW + 12).delay == pytest.approx(12.0)
    assert decide(options(), ValueError(), 1).delay == 180.0  # Celery's default_retry_delay
    assert decide(options(RetryPolicy(wait=wait_fixed(5))), ValueError(), 1).delay == 5.0
    assert decide(options(), RetryAfter(500), 1).delay == 60.0  # capped by max_delay


def test_an_escaped_exception_is_decided_by_the_pure_rule_too() -> None:
    from tenacity import retry_if_exception_type

    from celery_delayq.policies.decision import decide_failure

    def state():
        return call_state(attempt_number=1, first_attempt=NOW, exception=KeyError(), now=NOW)

    assert decide_failure(options(), RetryAfter(5), state) == "retry"
    assert decide_failure(options(park_on=(KeyError,)), KeyError(), state) == "park"
    assert decide_failure(options(), KeyError(), state) == "raise"
    keys = RetryPolicy(retry=retry_if_exception_type(KeyError))
    assert decide_failure(options(keys), KeyError(), state) == "retry"
