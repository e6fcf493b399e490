"""Which delayed publishes of an app go through the ladder, and how they get there.

The router turns a Celery publish (exchange, routing key, headers with
``eta``) into a ladder publish towards the exchange and routing key an
undelayed publish would have used. It also undoes Celery's own native
delayed delivery when that is active, so a task passes through exactly one
ladder, once.
"""

from __future__ import annotations

import re
import time
from datetime import datetime, timezone
from typing import Any

from kombu import Exchange

from . import headers as H
from .config import DelayqConfig
from .delays import parse_eta
from .publisher import LadderPublisher, Scheduled, publisher_for
from .queue_delays import default_delay, queue_delays_of

__all__ = ["Router", "native_unwrap"]

#: Celery's native ladder: 28 levels, top exchange ``[prefix_]celery_delayed_27``.
_NATIVE_TOP = re.compile(r"^(?:(?P<prefix>.+)_)?celery_delayed_27$")
_NATIVE_BITS = 28

_AMQP_PROPERTIES = frozenset({
    "content_type", "content_encoding", "delivery_mode", "priority", "correlation_id",
    "reply_to", "expiration", "message_id", "timestamp", "type", "user_id", "app_id",
})


def native_unwrap(exchange: str, routing_key: str) -> tuple[str, str] | None:
    """``(native delivery exchange, original routing key)`` of a native-ladder publish, else None."""
    m = _NATIVE_TOP.match(exchange or "")
    if not m:
        return None
    words = (routing_key or "").split(".")
    if len(words) <= _NATIVE_BITS or any(w not in ("0", "1") for w in words[:_NATIVE_BITS]):
        return None
    prefix = m.group("prefix")
    delivery = f"{prefix}_celery_delayed_delivery" if prefix else "celery_delayed_delivery"
    return delivery, ".".join(words[_NATIVE_BITS:])


def _forget_pass(headers: dict[str, Any]) -> None:
    """Drop the headers that describe a previous ladder pass (a retry copies them)."""
    for name in (H.DUE, H.DELAY, H.ENTRY, H.HOPS):
        headers.pop(name, None)


def _maybe_declare_all(producer: Any, entities: list[Any]) -> None:
    """Declare Celery's destination queues exactly as kombu would, skipping cached ones cheaply.

    kombu's ``maybe_declare`` binds a copy of the entity before it looks at its
    declaration cache, which costs more than the rest of a ladder publish; the
    cache check comes first here, against the same per-connection cache.
    """
    declared = getattr(producer.connection, "declared_entities", None)
    for entity in entities:
        if declared is not None and entity.can_cache_declaration and hash(entity) in declared:
            continue
        producer.maybe_declare(entity)


class Router:
    """Ladder routing for one Celery app (and its broker)."""

    def __init__(self, app: Any, config: DelayqConfig | None = None, *, clock: Any = time.time) -> None:
        self.app = app
        self._config = config
        self.clock = clock
        #: Names of tasks routed through the ladder even when the app-wide switch is off.
        self.tasks: set[str] = set()
        self._key: str | None = None
        self._publisher: LadderPublisher | None = None
        self._queue_delays: dict[str, float] | None = None

    @property
    def config(self) -> DelayqConfig:
        """Settings, read from ``app.conf`` on first use (so Django settings are loaded)."""
        if self._config is None:
            self._config = DelayqConfig.from_app(self.app)
        return self._config

    def connection(self) -> Any:
        """A (not yet connected) kombu connection to the ladder's broker."""
        if self.config.broker_url:
            return self.app.connection_for_write(self.config.broker_url)
        return self.app.connection_for_write()

    def connection_key(self) -> str:
        """Identity of the app's write broker, matched against producers' connections."""
        if self._key is None:
            self._key = self.app.connection_for_write().as_uri(include_password=True)
        return self._key

    @property
    def publisher(self) -> LadderPublisher:
        """The process-wide ladder publisher for this app's broker and settings."""
        if self._publisher is None:
            self._publisher = publisher_for(self.connection(), self.config)
        return self._publisher

    @property
    def queue_delays(self) -> dict[str, float]:
        """Queue name -> default delay (``delayq_queue_delays`` and ``DelayedQueue``s); often empty."""
        if self._queue_delays is None:
            self._queue_delays = queue_delays_of(self.app, self.config.queue_delays)
        return self._queue_delays

    def queue_default_due(self, producer: Any, routing_key: Any, kwargs: dict[str, Any]) -> float | None:
        """Due time for an undelayed publish to a queue with a default delay, else ``None``."""
        delays = self.queue_delays
        if not delays:
            return None
        exchange = kwargs.get("exchange")
        if exchange is None:
            exchange = producer.exchange
        exchange_name = exchange.name if isinstance(exchange, Exchange) else (exchange or "")
        routing_key = producer.routing_key if routing_key is None else routing_key
        delay = default_delay(delays, exchange_name, routing_key, kwargs.get("declare"))
        return None if delay is None else self.clock() + delay

    def wants(self, headers: dict[str, Any]) -> bool:
        """Does this publish belong in the ladder (app-wide switch, or a ladder task)?"""
        return self.config.enabled or headers.get("task") in self.tasks

    # -- the hook ------------------------------------------------------------------
    def publish(self, producer: Any, body: Any, routing_key: Any, kwargs: dict[str, Any],
                *, queue_default: bool = False) -> Any:
        """Publish through the ladder if delayed and wanted, else the unchanged kombu way.

        ``queue_default`` marks a publish delayed by its queue's default delay:
        that applies to every task of the app, ladder task or not.
        """
        headers: dict[str, Any] = kwargs["headers"]
        if not queue_default and not self.wants(headers):
            _forget_pass(headers)
            return producer.publish_undelayed(body, routing_key, kwargs)
        exchange = kwargs.get("exchange")
        if exchange is None:
            exchange = producer.exchange
        exchange_name = exchange.name if isinstance(exchange, Exchange) else (exchange or "")
        routing_key = producer.routing_key if routing_key is None else routing_key

        native = native_unwrap(exchange_name, routing_key)
        if native is not None:
            exchange_name, routing_key = self._native_destination(*native, native_key=routing_key)

        # Celery's eta wins: a retry may still carry the previous pass's x-delayq-due.
        eta = headers.get("eta")
        due = parse_eta(eta) if eta is not None else float(headers[H.DUE])
        now = self.clock()
        if due <= now:
            _forget_pass(headers)
            if native is None:
                return producer.publish_undelayed(body, routing_key, kwargs)
            kwargs = dict(kwargs, exchange=exchange_name)
            return producer.publish_undelayed(body, routing_key, kwargs)
        if headers.get("eta") is None:
            # Keep Celery's own eta, so request.eta is right and a worker would hold an
            # early arrival rather than run it (belt and braces: the ladder rounds up).
            headers["eta"] = datetime.fromtimestamp(due, tz=timezone.utc).isoformat()
        return self._schedule(producer, body, routing_key, exchange_name, due, now, kwargs)

    def _schedule(self, producer: Any, body: Any, routing_key: str, exchange_name: str,
                  due: float, now: float, kwargs: dict[str, Any]) -> Scheduled:
        headers = kwargs["headers"]
        declare = list(kwargs.get("declare") or [])
        _maybe_declare_all(producer, declare)
        queue_hint = next((getattr(e, "name", None) for e in declare if hasattr(e, "queue_arguments")), None)
        payload, content_type, content_encoding = producer._prepare(
            body, kwargs.get("serializer"), kwargs.get("content_type"), kwargs.get("content_encoding"),
            kwargs.get("compression", producer.compression), headers)
        _, delivery_mode = producer._delivery_details(kwargs.get("exchange") or producer.exchange,
                                                      kwargs.get("delivery_mode"))
        props = {k: v for k, v in kwargs.items() if k in _AMQP_PROPERTIES and v is not None}
        props["delivery_mode"] = delivery_mode
        if kwargs.get("priority"):
            props["priority"] = kwargs["priority"]
        reply_to = props.get("reply_to")
        if reply_to is not None and not isinstance(reply_to, str):
            props["reply_to"] = reply_to.name
        if "expiration" in props:
            headers["x-delayq-expiration"] = props.pop("expiration")
        props.pop("content_type", None)
        props.pop("content_encoding", None)
        return self.publisher.schedule(
            payload, due=due, delay=due - now,
            exchange=exchange_name, routing_key=routing_key, headers=headers,
            content_type=content_type, content_encoding=content_encoding,
            queue_hint=queue_hint, **props)

    def _native_destination(self, delivery_exchange: str, original_key: str, *, native_key: str) -> tuple[str, str]:
        """Where an undelayed publish of a native-ladder task would have gone.

        Celery replaced the task's exchange with its ladder's; the task's queue
        in ``task_queues`` tells the original exchange. If that is ambiguous,
        deliver through Celery's native delivery exchange, which its workers
        bind to the same queues.
        """
        exchanges = {
            q.exchange.name for q in self.app.amqp.queues.values()
            if q.routing_key == original_key and q.exchange is not None and q.exchange.type != "direct"
        }
        if len(exchanges) == 1:
            return exchanges.pop(), original_key
        return delivery_exchange, native_key
