"""The one place above every delay backend: check the delay, send the signals, write the index.

A delayed publish owes the same things whichever backend holds it: the delay
is checked once (``DelayTooLong``, before anything is sent); ``before_schedule``
is sent just before the publish, ``message_scheduled`` once the broker
confirmed it; the index of waiting tasks gets its entry (``delayq pending``,
``cancel``); inside ``batch()`` those last two wait for the block's confirms
and skip every message a :class:`~celery_delayq.errors.PublishError` named.
:class:`Scheduler` does all of it, so a backend only places a serialised
message at a due time for a destination (:meth:`~celery_delayq.typing.DelayBackend.place`).

It also chooses the backend: the app's (``delayq_backend``) or the destination
queue's (``delayq_queue_backends``), by the queue Celery names (``queue_hint``)
or, on the default exchange, the routing key.

A batch is per thread, not per scheduler: a block opened on one app's
scheduler (or on a publisher's own) collects the receipts of every schedule
the thread makes inside it, so none is announced before its confirm.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

from .. import signals
from ..config import DelayqConfig
from ..errors import PublishError
from ..typing import DelayBackend, Receipt

__all__ = ["Scheduler"]


@dataclass(eq=False)
class _Batch:
    """The receipts of one thread's ``batch()`` block, announced when it ends."""

    placed: list[tuple[DelayBackend, Receipt, dict[str, Any]]] = field(default_factory=list)
    #: Entry ids named by a PublishError: not (known to be) scheduled.
    reported: set[str] = field(default_factory=set)


_LOCAL = threading.local()


def _current() -> _Batch | None:
    batch: _Batch | None = getattr(_LOCAL, "batch", None)
    return batch


class Scheduler:
    """Schedules delayed messages through the chosen :class:`~celery_delayq.typing.DelayBackend`.

    ``default`` takes every destination not named in ``by_queue`` (queue name ->
    backend). Thread-safe (the backends are).
    """

    def __init__(self, config: DelayqConfig, default: DelayBackend,
                 by_queue: Mapping[str, DelayBackend] | None = None, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.default = default
        self.by_queue = dict(by_queue or {})
        self.clock = clock

    def backend_for(self, exchange: str, routing_key: str, queue_hint: str | None) -> DelayBackend:
        """The backend of a destination: its queue's (``delayq_queue_backends``), else the app's."""
        if self.by_queue:
            queue = queue_hint if queue_hint is not None else routing_key if exchange == "" else None
            if queue is not None and queue in self.by_queue:
                return self.by_queue[queue]
        return self.default

    def schedule(self, body: bytes | str, *, due: float, delay: float, exchange: str, routing_key: str,
                 headers: dict[str, Any], content_type: str | None = None,
                 content_encoding: str | None = None, queue_hint: str | None = None,
                 **properties: Any) -> Receipt:
        """Deliver ``body`` to ``exchange``/``routing_key`` at ``due`` (confirmed, mandatory).

        Raises:
            DelayTooLong: beyond ``delayq_max_delay`` or 100 years; nothing is sent.
            PublishError: the message (and, inside ``batch()``, every other one
                that may not be scheduled) is named in ``failed`` by task id.
        """
        self.config.check_delay(due - self.clock())  # the one check of a delayed publish
        backend = self.backend_for(exchange, routing_key, queue_hint)
        batch = _current()

        def announce(receipt: Receipt, hdrs: dict[str, Any]) -> None:
            signals.before_schedule.send(sender=backend, plan=receipt, headers=hdrs)
            if batch is not None:  # from here on, only a PublishError naming it keeps it unannounced
                batch.placed.append((backend, receipt, hdrs))

        entry = uuid.uuid4().hex
        try:
            receipt, hdrs = backend.place(body, entry=entry, due=due, delay=delay, exchange=exchange,
                                          routing_key=routing_key, headers=headers, announce=announce,
                                          content_type=content_type, content_encoding=content_encoding,
                                          queue_hint=queue_hint, **properties)
        except PublishError as exc:
            if batch is not None:
                batch.reported.update(exc.entries)
            raise
        except BaseException:
            if batch is not None:
                batch.reported.add(entry)
            raise
        if batch is None:
            backend.write_index([(receipt, hdrs)], buffered=True)
            signals.message_scheduled.send(sender=backend, plan=receipt, headers=hdrs)
        return receipt

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Pipeline confirms for every schedule in the block (same thread).

        On exit, waits for all of them; raises :class:`PublishError` naming (by
        task id) each one that was nacked, returned or lost with the
        connection. A failure found earlier is raised from the publish that
        found it, naming every message of the block it affects; nothing is
        named twice and nothing carries over into the next block. Nested
        blocks join the outer one. ``message_scheduled`` and the index entries
        of the confirmed messages follow when the block ends.
        """
        outer = _current()
        backends = list({id(b): b for b in (self.default, *self.by_queue.values())}.values())
        if outer is not None:
            with contextlib.ExitStack() as stack:
                for backend in backends:
                    stack.enter_context(backend.confirming())  # joins a block it is already in
                yield
            return
        b = _LOCAL.batch = _Batch()
        try:
            with contextlib.ExitStack() as stack:
                for backend in backends:
                    stack.enter_context(backend.confirming())
                try:
                    yield
                except PublishError as exc:
                    b.reported.update(exc.entries)
                    raise
        except PublishError as exc:
            b.reported.update(exc.entries)
            raise
        finally:
            _LOCAL.batch = None
            done: dict[int, tuple[DelayBackend, list[tuple[Receipt, dict[str, Any]]]]] = {}
            for backend, receipt, hdrs in b.placed:
                if receipt.entry not in b.reported:
                    signals.message_scheduled.send(sender=backend, plan=receipt, headers=hdrs)
                    done.setdefault(id(backend), (backend, []))[1].append((receipt, hdrs))
            for backend, pairs in done.values():
                backend.write_index(pairs, buffered=False)
