"""Fixtures the backends' tests share."""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from celery_delayq import signals


@pytest.fixture
def placed() -> Iterator[list[tuple[Any, dict[str, Any]]]]:
    """``(receipt, headers)`` of every message scheduled in the test (``message_scheduled``)."""
    got: list[tuple[Any, dict[str, Any]]] = []

    def on(sender: Any = None, plan: Any = None, headers: Any = None, **_: Any) -> None:
        got.append((plan, dict(headers)))

    signals.message_scheduled.connect(on, weak=False)
    yield got
    signals.message_scheduled.disconnect(on)
