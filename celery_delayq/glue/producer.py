"""The kombu-level hook: a ``Producer`` that sends delayed publishes to the ladder.

Every Celery publish goes through the app's producer pool or ``app.amqp.Producer`` (beat), both
pointed at :class:`LadderProducer` for that app only. It asks
:meth:`~celery_delayq.typing.DelayRouting.divert` once per publish: undelayed ones take kombu's
path unchanged, delayed ones are serialised as kombu would and handed to the delay backend.
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
        if declare and has_plugin_entities(declare):  # the plugin's type may not exist: its x-delayed-type
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
        if declare and kwargs.get("retry"):  # as kombu's publish: the retry policy bounds a down broker's wait
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
        # ``expiration`` goes on: the backend knows what a per-message TTL would do there.
        for name in ("content_type", "content_encoding"):
            props.pop(name, None)
        return self.routing.scheduler.schedule(
            payload, due=diversion.due, delay=diversion.delay,
            exchange=diversion.exchange, routing_key=diversion.routing_key, headers=headers,
            content_type=content_type, content_encoding=content_encoding,
            queue_hint=diversion.queue_hint, **props)

    def _undeclared(self, entities: Any) -> list[Any]:
        """The entities not yet in the connection's declaration cache (checked first: ``maybe_declare`` is costly)."""
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
