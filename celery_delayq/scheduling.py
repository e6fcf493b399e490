"""The one place above every delay backend: build them, check the delay, send the signals, write the index.

A delayed publish owes the same things whichever backend holds it, and :class:`Scheduler` does them once: the
delay check (before anything is sent), ``before_schedule`` and, once confirmed, ``message_scheduled``, and the index
entry (through an :class:`~celery_delayq.index.writer.IndexWriter` of its own); inside ``batch()`` the last two
wait for the block's confirms and skip what a :class:`~celery_delayq.errors.PublishError` named. A backend only
places the message (:meth:`~celery_delayq.typing.DelayBackend.place`) and returns its receipt. The scheduler also
builds and chooses the backends (``delayq_backend``, ``delayq_queue_backends``, :func:`backend_named`); a batch is
per thread, not per scheduler. See docs/how-it-works.md, "Adding a delay backend".
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, Iterator, Mapping

from kombu.connection import Connection
from kombu.serialization import dumps
from kombu.utils.imports import symbol_by_name

from . import signals
from .config import BACKEND_ALIASES, DelayqConfig
from .errors import PublishError
from .index.writer import IndexWriter, index_writer_for
from .ladder import headers as H
from .ladder.delays import due_from
from .ladder.entries import new_entry
from .typing import BackendFactory, DelayBackend, Receipt, WorkerService

__all__ = ["Scheduler", "backend_named"]


def backend_named(name: str, connection: Connection, config: DelayqConfig) -> DelayBackend:
    """The process's backend called ``name`` (a :data:`~celery_delayq.config.BACKEND_ALIASES` name or
    ``"module:Class"``) for a broker and settings, from the class's ``for_connection``."""
    factory: BackendFactory[DelayqConfig] = symbol_by_name(BACKEND_ALIASES.get(name, name))
    return factory.for_connection(connection, config)


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

    ``default`` takes every destination not named in ``by_queue`` (queue name -> backend); ``index`` writes the
    entries of what they accepted (``None``: no index). Thread-safe (the backends and the writer are).
    """

    @classmethod
    def for_connection(cls, connection: Connection, config: DelayqConfig, *,
                       clock: Callable[[], float] = time.time) -> "Scheduler":
        """The scheduler of a broker and settings: ``delayq_backend``, each ``delayq_queue_backends``
        queue's backend, and the index writer (what an app's ladder and direct kombu users take)."""
        named = {name: backend_named(name, connection, config)  # each name built once
                 for name in {config.backend, *(name for _, name in config.queue_backends)}}
        return cls(config, named[config.backend], {queue: named[name] for queue, name in config.queue_backends},
                   index=index_writer_for(connection, config), clock=clock)

    def __init__(self, config: DelayqConfig, default: DelayBackend,
                 by_queue: Mapping[str, DelayBackend] | None = None, *, index: IndexWriter | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.default = default
        self.by_queue = dict(by_queue or {})
        self.index = index
        self.clock = clock

    @property
    def backends(self) -> list[DelayBackend]:
        """Every distinct backend in use, the default first (each once)."""
        return list({id(b): b for b in (self.default, *self.by_queue.values())}.values())

    def worker_services(self, connection_for: Callable[[str], Connection]) -> list[WorkerService]:
        """What each worker runs: the service of every backend in use that has one, each once."""
        services = (b.worker_service(connection_for, self) for b in self.backends)
        return [s for s in services if s is not None]

    def backend_for(self, exchange: str, routing_key: str, queue_hint: str | None) -> DelayBackend:
        """The backend of a destination: its queue's (``delayq_queue_backends``), else the app's."""
        if self.by_queue:
            queue = queue_hint if queue_hint is not None else routing_key if exchange == "" else None
            if queue is not None and queue in self.by_queue:
                return self.by_queue[queue]
        return self.default

    def schedule(self, body: bytes | str, *, due: float, delay: float, exchange: str, routing_key: str,
                 headers: dict[str, Any], content_type: str | None = None, content_encoding: str | None = None,
                 queue_hint: str | None = None, **properties: Any) -> Receipt:
        """Deliver ``body`` to ``exchange``/``routing_key`` at ``due`` (confirmed, mandatory).

        Raises:
            DelayTooLong: beyond ``delayq_max_delay`` or 100 years; nothing is sent.
            PublishError: the message (and, inside ``batch()``, every other one
                that may not be scheduled) is named in ``failed`` by task id.
        """
        self.config.check_delay(due - self.clock())  # the one check of a delayed publish
        backend = self.backend_for(exchange, routing_key, queue_hint)
        batch = _current()
        trace = headers.pop(H.LAST_TRACEBACK, None)
        try:
            receipt, hdrs = backend.place(body, entry=new_entry(), due=due, delay=delay, exchange=exchange,
                                          routing_key=routing_key, headers=headers, content_type=content_type,
                                          content_encoding=content_encoding, queue_hint=queue_hint, **properties)
        except PublishError as exc:
            if batch is not None:
                batch.reported.update(exc.entries)
            raise
        signals.before_schedule.send(sender=backend, plan=receipt, headers=hdrs)
        indexed = hdrs if trace is None else {**hdrs, H.LAST_TRACEBACK: trace}  # the entry keeps what no hop carries
        if batch is not None:  # from here on, only a PublishError naming it keeps it unannounced
            batch.placed.append((backend, receipt, indexed))
            return receipt
        if self.index is not None:
            self.index.add(receipt, indexed)
        signals.message_scheduled.send(sender=backend, plan=receipt, headers=hdrs)
        return receipt

    def schedule_body(self, body: object, *, delay: float | None = None, eta: datetime | str | float | None = None,
                      exchange: str = "", routing_key: str = "", queue: str | None = None, serializer: str = "json",
                      headers: Mapping[str, Any] | None = None, **properties: Any) -> Receipt | None:
        """Serialise ``body`` and schedule it with a delay, to an exchange and routing key or a queue.

        The plain-kombu entry point (Celery tasks reach :meth:`schedule` through the
        producer hook). Returns ``None`` (and publishes nothing) when the delay is zero
        or negative: the caller should then publish normally, as Celery does with a past eta.
        """
        if queue is not None:
            exchange, routing_key = "", queue
        due = due_from(delay, eta, now=self.clock())
        if due is None:
            return None
        content_type, content_encoding, payload = dumps(body, serializer=serializer)
        return self.schedule(payload, due=due, delay=delay if delay is not None else due - self.clock(),
                             exchange=exchange, routing_key=routing_key, headers=dict(headers or {}),
                             content_type=content_type, content_encoding=content_encoding, **properties)

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Pipeline confirms for every schedule in the block (same thread).

        On exit, waits for all of them; raises :class:`PublishError` naming (by task id) each one that was
        nacked, returned or lost with the connection. A failure found earlier is raised from the publish that
        found it, naming every message of the block it affects; nothing is named twice and nothing carries over
        into the next block. Nested blocks join the outer one. ``message_scheduled`` and the index entries of
        the confirmed messages follow when the block ends.
        """
        outer = _current()
        backends = self.backends
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
            done: list[tuple[Receipt, dict[str, Any]]] = []
            for backend, receipt, hdrs in b.placed:
                if receipt.entry not in b.reported:
                    signals.message_scheduled.send(sender=backend, plan=receipt, headers=hdrs)
                    done.append((receipt, hdrs))
            if self.index is not None:
                self.index.write(done)
