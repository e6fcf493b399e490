"""Ladder queues stuck after a broker restart on RabbitMQ before 4.3, found and set moving again.

Before 4.3 a vhost recovers its queues before its exchanges, and a quorum queue's dead-letter worker that finds
no target holds its messages (``messages`` above ready + unacked) until a 180 s timer. Any policy change makes
it look again at once, so the remedy is a *policy touch* (set and delete a harmless policy) through the
management API: workers run it every 30 s and after a reconnect (:class:`HeldWatcher`), operators with
``delayq topology recover``. It cannot move what a worker sent and lost a confirm for (only ``advanced.config``
shortens that). Measurements: docs/operations.md, docs/clusters.md.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping

if TYPE_CHECKING:  # pragma: no cover
    from .management import ManagementAPI

__all__ = ["held", "ladder_held", "held_on_two_looks", "touch_pattern", "Recovery", "HeldWatcher", "TOUCH_POLICY",
           "HELD_FOR_S", "SETTLE_S"]

log = logging.getLogger(__name__)

#: Name of the short-lived policy (``-<prefix>`` is added).
TOUCH_POLICY = "delayq-recover"
#: Management API timeout for the looks and the touch.
API_TIMEOUT_S = 60.0
#: How long a queue must keep holding messages before it counts as stuck.
HELD_FOR_S = 2.0
#: How long after a touch the queues are looked at again (their dead-letter workers re-send at once).
SETTLE_S = 3.0


def held(rows: Iterable[Mapping[str, Any]], names: Iterable[str]) -> dict[str, int]:
    """Messages each queue holds in its dead-letter state (``messages`` beyond ready and unacked; pure)."""
    wanted = set(names)
    found: dict[str, int] = {}
    for row in rows:
        if row.get("name") not in wanted:
            continue
        extra = int(row.get("messages") or 0) - int(row.get("messages_ready") or 0) \
            - int(row.get("messages_unacknowledged") or 0)
        if extra > 0:
            found[str(row["name"])] = extra
    return found


def ladder_held(rows: Iterable[Mapping[str, Any]], prefix: str) -> dict[str, int]:
    """:func:`held`, for every queue of ``rows`` named ``<prefix>.*`` (pure)."""
    rows = list(rows)
    return held(rows, [name for name in (str(r.get("name")) for r in rows) if name.startswith(f"{prefix}.")])


def held_on_two_looks(api: ManagementAPI, prefix: str, *, held_for: float = HELD_FOR_S,
                      first: list[dict[str, Any]] | None = None) -> dict[str, int] | None:
    """Ladder queues holding messages on one look and still ``held_for`` seconds later (``None``: cannot tell).

    Two looks: dead-lettering holds messages for a moment. ``first``: rows of a look already made.
    """
    rows = api.queues() if first is None else first
    if rows is None:
        return None
    before = ladder_held(rows, prefix)
    if not before:
        return before
    time.sleep(held_for)
    again = api.queues()
    if again is None:
        return None
    return {name: n for name, n in ladder_held(again, prefix).items() if name in before}


def touch_pattern(prefix: str) -> str:
    """The policy pattern: the ladder's level queues (every shard's) and exit queues, not its (slow) streams (pure)."""
    return rf"^{re.escape(prefix)}\.([0-9]+x[0-9]+\.(s[0-9]+\.)?L[0-9]|exit\.)"


@dataclass
class Recovery:
    """Finds ladder queues that hold dead-letter messages, and touches their policy.

    Attributes:
        api: The broker's :class:`~celery_delayq.rabbitmq.management.ManagementAPI`.
        prefix: ``delayq_prefix``: every queue named ``<prefix>.*`` is looked at.
    """

    api: Any
    prefix: str

    _in_vain: set[str] = field(default_factory=set, repr=False)

    def __post_init__(self) -> None:  # right after a restart a policy can take over 10 s to set
        if getattr(self.api, "timeout", API_TIMEOUT_S) < API_TIMEOUT_S:
            self.api = dataclasses.replace(self.api, timeout=API_TIMEOUT_S)

    def stuck(self, *, held_for: float = HELD_FOR_S) -> dict[str, int] | None:
        """Queues holding messages now and still ``held_for`` seconds later (:func:`held_on_two_looks`)."""
        return held_on_two_looks(self.api, self.prefix, held_for=held_for)

    def still_held(self, stuck: Mapping[str, int]) -> dict[str, int]:
        """Of the ``stuck`` queues, those holding as many or more :data:`SETTLE_S` after a touch (fewer: moving)."""
        time.sleep(SETTLE_S)
        rows = self.api.queues()
        now = ladder_held(rows, self.prefix) if rows is not None else {}
        return {name: n for name, n in now.items() if name in stuck and n >= stuck[name]}

    def touch(self) -> bool:
        """Set, then delete, a harmless policy on the ladder's queues; whether the broker took it."""
        name = f"{TOUCH_POLICY}-{self.prefix}"
        body = {"pattern": touch_pattern(self.prefix), "apply-to": "queues", "priority": 999,
                "definition": {"queue-leader-locator": "client-local"}}
        try:
            taken = bool(self.api.put_policy(name, body))
            time.sleep(0.5)
        finally:  # a PUT that timed out may still have been applied: never leave the policy behind
            self.api.delete_policy(name)
        return taken

    def run(self, *, held_for: float = HELD_FOR_S) -> dict[str, int] | None:
        """Touch when queues are stuck; returns what was stuck (``{}``: nothing; ``None``: cannot tell).

        Queues a touch did not move are not touched again while they stay held.
        """
        stuck = self.stuck(held_for=held_for)
        if stuck and set(stuck) <= self._in_vain:
            return stuck
        self._in_vain &= set(stuck or ())
        if stuck:
            if self.touch():
                log.warning("delayq: %d message(s) were held in %d ladder queue(s) after a broker restart; "
                            "touched their policy so that each dead-letter worker looks its targets up again "
                            "(what waits for a confirm lost with a node still waits for RabbitMQ's own 180 s "
                            "retry)", sum(stuck.values()), len(stuck))
                still = set(self.still_held(stuck))
                if still:
                    self._in_vain |= still
                    log.warning("delayq: still held after the touch, not touched again while they stay so: %s "
                                "(an exit queue holds for good what its destination cannot take; a level "
                                "queue's dead-letter worker re-sends what a target rejected or did not confirm "
                                "only after dead_letter_worker_publisher_confirm_timeout, 180 s by default: "
                                "`delayq doctor` names the advanced.config setting)", ", ".join(sorted(still)))
            else:
                log.error("delayq: %d message(s) are held in ladder queue(s) %s, and the policy touch that "
                          "moves them failed (the management API refused it or did not answer; its user needs "
                          "the 'policymaker' tag). They move on RabbitMQ's own retry, up to 3 minutes late; run `celery -A APP delayq "
                          "topology recover` as an administrator.", sum(stuck.values()), ", ".join(sorted(stuck)))
        return stuck


class HeldWatcher:
    """A worker's daemon thread: looks for held ladder queues every ``every`` seconds, and soon after a reconnect.

    Periodic too: another node of a cluster restarting causes no reconnect here.
    """

    def __init__(self, recovery: Recovery, *, every: float = 30.0, soon: float = 3.0) -> None:
        self.recovery, self.every, self.soon = recovery, every, soon
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="delayq-recovery", daemon=True)

    def start(self) -> "HeldWatcher":
        """Start watching; the first looks come soon (a worker often starts right after its broker)."""
        self._wake.set()
        self._thread.start()
        return self

    def poke(self) -> None:
        """The broker connection came back: look within ``soon`` seconds, a few times."""
        log.info("delayq: broker connection back; looking for ladder queues that hold messages (RabbitMQ < 4.3)")
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def _loop(self) -> None:
        burst = 0
        while not self._stop.is_set():
            woken = self._wake.wait(self.soon if burst else self.every)
            if self._stop.is_set():
                return
            if woken:
                self._wake.clear()
                time.sleep(self.soon)
                burst = 4  # a node's queues come back one by one: look a few times
            burst = max(burst - 1, 0)
            try:
                self.recovery.run()
            except Exception:  # noqa: BLE001 - a failed look must not end the worker
                log.debug("delayq: recovery look failed", exc_info=True)
