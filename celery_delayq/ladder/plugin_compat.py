"""Code written for the delayed-message-exchange plugin, delayed through the ladder. Pure.

A publish with an integer ``x-delay`` header (ms) waits in the ladder, then goes to the exchange and routing key
it names; an ``x-delayed-message`` exchange the publish declares is declared as its ``x-delayed-type`` instead
(the broker may not know the plugin's type). The plugin's history and what differs: docs/migration.md,
docs/limits.md.
"""

from __future__ import annotations

import copy
import math
from typing import Any, Iterable

from kombu import Exchange, Queue

from ..errors import InvalidDelay

__all__ = ["DELAY_HEADER", "PLUGIN_TYPE", "delay_of", "plain_entities"]

#: The plugin's per-message delay header, integer milliseconds.
DELAY_HEADER = "x-delay"
#: The plugin's exchange type.
PLUGIN_TYPE = "x-delayed-message"


def delay_of(headers: dict[str, Any]) -> float | None:
    """Seconds of the plugin's ``x-delay`` header, ``None`` without one.

    Raises:
        InvalidDelay: a header that is not a finite number of milliseconds.
    """
    value = headers.get(DELAY_HEADER)
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode()
    try:
        ms = float(value)
    except (TypeError, ValueError):
        raise InvalidDelay(f"{DELAY_HEADER} header must be a number of milliseconds, got {value!r}") from None
    if not math.isfinite(ms):
        raise InvalidDelay(f"{DELAY_HEADER} header must be finite, got {value!r}")
    return ms / 1000.0


def plain_exchange(exchange: Any) -> Any:
    """``exchange`` as its ``x-delayed-type`` if it is a plugin exchange, else unchanged."""
    if not isinstance(exchange, Exchange) or exchange.type != PLUGIN_TYPE:
        return exchange
    arguments = dict(getattr(exchange, "arguments", None) or {})  # set by kombu's attrs, not declared
    real_type = arguments.pop("x-delayed-type", None) or "direct"
    return Exchange(exchange.name, type=real_type, durable=exchange.durable,
                    auto_delete=exchange.auto_delete, arguments=arguments or None)


def plain_entities(entities: Iterable[Any]) -> list[Any]:
    """``declare`` entities with every plugin exchange (direct or of a queue) made plain."""
    out: list[Any] = []
    for entity in entities:
        if isinstance(entity, Queue) and isinstance(entity.exchange, Exchange) and entity.exchange.type == PLUGIN_TYPE:
            plain = copy.copy(entity)
            plain.exchange = plain_exchange(entity.exchange)
            out.append(plain)
        else:
            out.append(plain_exchange(entity))
    return out


def has_plugin_entities(entities: Iterable[Any]) -> bool:
    """Does ``declare`` name any plugin exchange (cheap check for the hot path)?"""
    for entity in entities:
        exchange = entity.exchange if isinstance(entity, Queue) else entity
        if isinstance(exchange, Exchange) and exchange.type == PLUGIN_TYPE:
            return True
    return False
