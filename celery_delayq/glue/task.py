"""``DelayedRetryTask``: the base class users put on their tasks (the glue; decisions live in
:mod:`celery_delayq.policies`, parking in :mod:`celery_delayq.parking`, reached as the app's
``parking`` extension)."""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from functools import cached_property
from typing import Any, Iterable, Iterator

import tenacity
from celery import Task
from celery.exceptions import Ignore, Retry, Reject, TaskPredicate

from ..ladder import headers as H
from .. import signals
from .attempts import begin_attempt, current_attempt, end_attempt, first_attempt_time, state_for
from .dedup import DuplicateGuard, delivery_key, guard_for
from ..ladder.delays import due_from
from .integration import install, ladder_for
from ..policies.decision import RetryDecision, decide_failure, decide_retry
from ..policies.policy import RetryPolicy, Strategy
from ..policies.resolve import RetryOptions, resolve_options, split_call_options

__all__ = ["DelayedRetryTask"]

log = logging.getLogger(__name__)
_MISSING = object()


class DelayedRetryTask(Task):
    """Celery task whose delays and retries wait in the ladder, not in worker memory.

    Task options (``@app.task(base=DelayedRetryTask, delayq_stop=...)``), each
    overridable per ``self.retry(..., delayq_<name>=...)`` call and defaulting
    to the app's ``delayq_<name>`` setting (see :mod:`celery_delayq.policies.resolve`):

    * ``delayq_policy``: a :class:`~celery_delayq.policies.RetryPolicy` or ``tenacity.Retrying``;
    * ``delayq_wait`` / ``delayq_stop`` / ``delayq_retry``: single tenacity strategies;
    * ``delayq_max_delay``: cap on :class:`~celery_delayq.policies.RetryAfter` delays;
    * ``delayq_park``, ``delayq_park_on``, ``delayq_parking_queue``: parking;
    * ``delayq_dedup``: the duplicate-delivery guard.
    """

    #: Runs a due ladder delivery at once, and hands the raw message to the task for parking.
    Request = "celery_delayq.glue.request:CapturingRequest"

    delayq_policy: RetryPolicy | tenacity.BaseRetrying | None = None
    delayq_wait: Strategy | None = None
    delayq_stop: Strategy | None = None
    delayq_retry: Strategy | None = None
    delayq_max_delay: float | None = None
    delayq_park: bool | None = None
    delayq_park_on: type[BaseException] | str | Iterable[type[BaseException] | str] | None = None
    delayq_parking_queue: str | None = None
    delayq_dedup: bool | None = None

    @classmethod
    def on_bound(cls, app: Any) -> None:
        """Celery calls this when the task class is bound to an app: install the hook."""
        install(app).tasks.add(cls.name)

    # -- options -------------------------------------------------------------------
    def delayq_options(self, **call: Any) -> RetryOptions:
        """This task's retry options; ``call`` holds ``delayq_*`` overrides of one retry."""
        return resolve_options(self, ladder_for(self._get_app()).config, call)

    @cached_property
    def delayq_captures(self) -> bool:
        """Does the worker pass this task its raw message (needed to park it)?"""
        options = self.delayq_options()
        return options.park or bool(options.park_on)

    @cached_property
    def delayq_guard(self) -> DuplicateGuard | None:
        """The duplicate guard, when ``delayq_dedup`` is on for this task."""
        config = ladder_for(self._get_app()).config
        if not self.delayq_options().dedup:
            return None
        return guard_for(config.dedup_url, ttl=config.dedup_ttl, namespace=f"delayq:{config.prefix}")

    # -- running -------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run one attempt: skip a duplicate delivery, and retry or park when it fails."""
        request = self.request
        if request.called_directly or request.is_eager:
            return super().__call__(*args, **kwargs)
        attempt, outer = begin_attempt(request)
        try:
            guard = self.delayq_guard
            if guard is not None:
                redelivered = bool((request.delivery_info or {}).get("redelivered"))
                if not guard.begin(delivery_key(request), redelivered=redelivered):
                    log.warning("delayq: skipped duplicate delivery of %s[%s] (attempt %s)",
                                self.name, request.id, request.retries)
                    raise Ignore()
                attempt.delivery = delivery_key(request)
            try:
                # Not Task.__call__: the tracer pushed the request already; a second push would
                # read as "called directly" (and on Celery 5.3 retry() then just re-raises).
                return self.run(*args, **kwargs)
            except TaskPredicate:  # Retry, Ignore, Reject: Celery's control flow, already decided
                raise
            except Exception as exc:
                self._delayq_failed(exc)
                raise
            finally:
                if guard is not None and attempt.delivery is not None:
                    guard.finish(attempt.delivery)
        finally:
            end_attempt(outer)

    def _delayq_failed(self, exc: Exception) -> None:
        """An exception escaped the task body: retry it, park it, or let it fail (the caller re-raises)."""
        if current_attempt(self.request).settled:
            return  # retry() gave up on this attempt already; this is its re-raise
        options = self.delayq_options()
        action = decide_failure(options, exc, lambda: state_for(self.request, exc))
        if action == "retry":
            raise self.retry(exc=exc)
        if action == "park":
            park(self, self.request, exc, reason="park_on", options=options)

    def retry(self, args: Any = None, kwargs: Any = None, exc: Any = None, throw: bool = True,
              eta: Any = None, countdown: Any = None, max_retries: int | None = None, **options: Any) -> Any:
        """Celery's ``retry``, through the ladder, with the task's policy, ``RetryAfter`` and parking.

        :func:`~celery_delayq.policies.decision.decide_retry` decides; exhausted retries park the
        message first, then Celery raises as always (FAILURE, ``task_failure``).
        """
        request = self.request
        call = split_call_options(options)
        if request.called_directly or request.is_eager:
            return super().retry(args, kwargs, exc, throw, eta, countdown, max_retries, **options)
        opts = self.delayq_options(**call)
        outcome = exc if exc is not None else sys.exc_info()[1]
        attempt_no = int(request.retries or 0) + 1
        decision = decide_retry(opts, outcome=outcome, exc=exc, attempt=attempt_no, countdown=countdown,
                                eta=eta, max_retries=max_retries, task_max_retries=self.max_retries,
                                state=state_for(request, outcome), now=time.time(),
                                default_delay=self.default_retry_delay)
        if decision.action == "park_now":
            assert outcome is not None
            current_attempt(request).settled = True
            park(self, request, outcome, reason="park_on", options=opts)
            raise outcome
        if decision.action == "give_up":
            current_attempt(request).settled = True
            # One exception for both events: the report's "Top exceptions" files the give-up and the
            # parked run under the same name (a retry() without exc gives up with MaxRetriesExceededError).
            reason = decision.exc if isinstance(decision.exc, BaseException) else \
                self.MaxRetriesExceededError(f"{self.name} gave up after {attempt_no} attempt(s)")
            signals.retry_exhausted.send(sender=self, request=request, exc=reason, attempt=attempt_no)
            if opts.park:
                park(self, request, reason, reason="exhausted", options=opts)
        with _celery_max_retries_kept(self, opts.policy is not None):
            try:
                ret = super().retry(args, kwargs, decision.exc, throw, decision.eta, decision.countdown,
                                    decision.max_retries,
                                    headers=self._retry_headers(options.pop("headers", _MISSING),
                                                               decision.exc if decision.exc is not None else outcome,
                                                               waits=decision.delay > 0),
                                    **options)
            except Retry:
                self._retry_scheduled(decision)
                raise
            except Reject as rejected:  # Celery could not publish the retry
                if opts.park and isinstance(rejected.reason, BaseException):
                    park(self, request, rejected.reason, reason="retry-failed", options=opts)
                raise
        self._retry_scheduled(decision)
        return ret

    def _retry_headers(self, given: Any, exc: Any = None, waits: bool = False) -> dict[str, Any]:
        """The retry's headers: Celery's (or the caller's), the first attempt's wall-clock time and the
        exception it retries after (short, for ``delayq pending`` and the web page)."""
        request = self.request
        # Passing headers bypasses Celery's own x-death filter, so strip them here.
        headers = H.strip_broker_headers(request.headers or {} if given is _MISSING else given or {})
        if not request.retries or H.FIRST_ATTEMPT not in headers:
            # The first attempt's start, not the time of the publish that scheduled it.
            headers[H.FIRST_ATTEMPT] = first_attempt_time(request)
        headers.pop(H.LAST_TRACEBACK, None)
        if exc is not None:
            headers[H.LAST_ERROR] = H.last_error(exc)
            trace = H.last_traceback(exc) if waits else None  # a retry that runs now is never listed
            if trace is not None:  # for the index entry only: the scheduler keeps it out of the message
                headers[H.LAST_TRACEBACK] = trace
        else:
            headers.pop(H.LAST_ERROR, None)  # an earlier attempt's error is not this retry's
        return headers

    def _retry_scheduled(self, decision: RetryDecision) -> None:
        """Report the retry with the delay the decision chose (:attr:`RetryDecision.delay`)."""
        signals.retry_scheduled.send(sender=self, request=self.request, exc=decision.exc, countdown=decision.delay,
                                     attempt=decision.attempt)

    # -- publishing ----------------------------------------------------------------
    def apply_async(self, args: Any = None, kwargs: Any = None, task_id: str | None = None, producer: Any = None,
                    link: Any = None, link_error: Any = None, shadow: str | None = None, **options: Any) -> Any:
        """Like :meth:`celery.Task.apply_async`; delays are validated and sent to the ladder."""
        countdown, eta = options.get("countdown"), options.get("eta")
        if countdown is not None or eta is not None:
            now = time.time()
            due = due_from(countdown, eta, now=now)  # InvalidDelay for NaN, inf, junk
            router = ladder_for(self._get_app())
            if due is not None:  # its length is checked once, by the app's scheduler
                if router.native_delayed_delivery:
                    # Celery's native path truncates with int() and fails sub-second: hand our hook the due time.
                    options.pop("countdown", None)
                    options.pop("eta", None)
                    options["headers"] = {**(options.get("headers") or {}), H.DUE: due}
            elif router.queue_delays:  # countdown=0 must win over a queue's default delay
                options["headers"] = {**(options.get("headers") or {}), H.DUE: now}
        return super().apply_async(args, kwargs, task_id=task_id, producer=producer, link=link,
                                   link_error=link_error, shadow=shadow, **options)


@contextlib.contextmanager
def _celery_max_retries_kept(task: Any, restore: bool) -> Iterator[None]:
    """Put back the task's own ``max_retries``, which Celery's ``retry()`` overwrote with this call's."""
    saved = task.__dict__.get("override_max_retries", _MISSING)
    try:
        yield
    finally:
        if restore:
            if saved is _MISSING:
                task.__dict__.pop("override_max_retries", None)
            else:
                task.override_max_retries = saved


def park(task: Any, request: Any, exc: BaseException, *, reason: str, options: RetryOptions) -> None:
    """Park the attempt's message through the app's ``parking`` extension (:mod:`celery_delayq.parking`)."""
    ladder = ladder_for(task._get_app())
    ladder.extensions.park(task, request, exc, reason=reason, options=options)
