"""The kombu-level hook: a ``Producer`` that sends delayed publishes to the ladder.

Celery publishes every task (``apply_async``, ``send_task``, ``retry``,
canvas, worker-lost retries) through ``kombu.Producer.publish``, taken from
the app's producer pool; celery beat builds its producer from
``app.amqp.Producer``. :func:`celery_delayq.install` points both of *that
app's* seams at :class:`LadderProducer` (kombu's own ``ProducerPool(Producer=...)``
seam); no other app, pool or producer in the process changes.

A :class:`LadderProducer` asks its :class:`~celery_delayq.typing.DelayRouting`
one question per publish (:meth:`~celery_delayq.typing.DelayRouting.divert`):
undelayed publishes then take the unchanged kombu path; delayed ones are
serialised here, exactly as kombu would, and handed to the routing's
:class:`~celery_delayq.typing.DelayBackend`. Nothing calls back into the producer.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from kombu import Producer
from kombu.pools import ProducerPool

from ..ladder.plugin_compat import PLUGIN_TYPE, has_plugin_entities, plain_entities, plain_exchange
from ..typing import DelayRouting, Diversion

__all__ = ["LadderProducer", "LadderProducerPool", "producer_factory"]

#: AMQP basic properties a publish may carry into the ladder (the rest are kombu options).
_AMQP_PROPERTIES = frozenset({
    "content_type", "content_encoding", "delivery_mode", "priority", "correlation_id",
    "reply_to", "expiration", "message_id", "timestamp", "type", "user_id", "app_id",
})


class LadderProducer(Producer):
    """``kombu.Producer`` whose delayed publishes wait in the ladder instead of in a worker."""

    def __init__(self, channel: Any, *args: Any, routing: DelayRouting, **kwargs: Any) -> None:
        self.routing = routing
        if args:
            args = (plain_exchange(args[0]), *args[1:])
        elif kwargs.get("exchange") is not None:
            kwargs["exchange"] = plain_exchange(kwargs["exchange"])
        super().__init__(channel, *args, **kwargs)

    def publish(self, body: Any, routing_key: Any = None, *args: Any, **kwargs: Any) -> Any:  # noqa: D102
        headers = kwargs.get("headers")
        if args or not headers:  # Celery always sends headers and keywords only
            return super().publish(body, routing_key, *args, **kwargs)
        exchange = kwargs.get("exchange")
        declare = kwargs.get("declare")
        if declare and has_plugin_entities(declare):
            # The delayed-message plugin's exchange type may not exist on this broker:
            # declare its x-delayed-type instead (plugin_compat).
            kwargs["declare"] = plain_entities(declare)
        if exchange is not None and getattr(exchange, "type", None) == PLUGIN_TYPE:
            kwargs["exchange"] = exchange = plain_exchange(exchange)
        diversion = self.routing.divert(
            headers, self.exchange if exchange is None else exchange,
            self.routing_key if routing_key is None else routing_key, kwargs.get("declare") or ())
        if diversion is None:
            return super().publish(body, routing_key, **kwargs)
        if diversion.due is None:  # due already, but Celery's native ladder was unwrapped
            return super().publish(body, diversion.routing_key, **dict(kwargs, exchange=diversion.exchange))
        return self._schedule(body, diversion, kwargs)

    def _schedule(self, body: Any, diversion: Diversion, kwargs: dict[str, Any]) -> Any:
        """Serialise like kombu's ``publish`` would, then hand the message to the delay backend."""
        assert diversion.due is not None
        headers: dict[str, Any] = kwargs["headers"]
        declare = self._undeclared(kwargs.get("declare") or ())
        if declare and kwargs.get("retry"):
            # Exactly as kombu's own publish does: the task's retry policy (also put into
            # the connection's transport options, which its first channel reads) bounds
            # the wait for a broker that is down: ~0.6 s with Celery's, not 6 s.
            retry_policy = kwargs.get("retry_policy") or {}
            self.connection.transport_options.update(retry_policy)
            self.connection.ensure(self, self._declare_destination, **retry_policy)(declare)
        elif declare:
            self._declare_destination(declare)
        payload, content_type, content_encoding = self._prepare(
            body, kwargs.get("serializer"), kwargs.get("content_type"), kwargs.get("content_encoding"),
            kwargs.get("compression", self.compression), headers)
        _, delivery_mode = self._delivery_details(kwargs.get("exchange") or self.exchange,
                                                  kwargs.get("delivery_mode"))
        props = {k: v for k, v in kwargs.items() if k in _AMQP_PROPERTIES and v is not None}
        props["delivery_mode"] = delivery_mode
        if not props.get("priority"):
            props.pop("priority", None)
        reply_to = props.get("reply_to")
        if reply_to is not None and not isinstance(reply_to, str):
            props["reply_to"] = reply_to.name
        # ``expiration`` goes on to the backend, which alone knows what a per-message TTL
        # would do there (the ladder drops it: it would expire the message inside a level).
        for name in ("content_type", "content_encoding"):
            props.pop(name, None)
        return self.routing.scheduler.schedule(
            payload, due=diversion.due, delay=diversion.delay,
            exchange=diversion.exchange, routing_key=diversion.routing_key, headers=headers,
            content_type=content_type, content_encoding=content_encoding,
            queue_hint=diversion.queue_hint, **props)

    def _undeclared(self, entities: Any) -> list[Any]:
        """The entities not yet in the connection's declaration cache (most publishes: none).

        kombu's ``maybe_declare`` binds a copy of the entity before it looks at its
        declaration cache, and wrapping the declare in ``connection.ensure`` builds a
        retry closure: together more than the rest of a ladder publish. The cache
        check comes first, against the same per-connection cache.
        """
        if not entities:
            return []
        declared = getattr(self.connection, "declared_entities", None)
        if declared is None:
            return list(entities)
        return [e for e in entities if not (e.can_cache_declaration and hash(e) in declared)]

    def _declare_destination(self, entities: Any) -> None:
        """Declare Celery's destination queues exactly as kombu would."""
        for entity in entities:
            self.maybe_declare(entity)


def producer_factory(routing: DelayRouting) -> Callable[..., LadderProducer]:
    """A ``Producer(channel, ...)`` callable bound to ``routing`` (for ``app.amqp.Producer``)."""
    return functools.partial(LadderProducer, routing=routing)


class LadderProducerPool(ProducerPool):
    """kombu's ``ProducerPool`` building :class:`LadderProducer` for one app's routing."""

    def __init__(self, connections: Any, *args: Any, routing: DelayRouting, **kwargs: Any) -> None:
        self.routing = routing
        super().__init__(connections, *args, Producer=producer_factory(routing), **kwargs)
