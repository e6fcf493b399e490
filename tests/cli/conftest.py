"""CLI fixtures (helpers to import live in ``cli_helpers``)."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import amqp
import pytest

from celery_delayq.ladder.spec import LadderSpec
from helpers import BROKER_HOST, delete_ladder, management_url


@pytest.fixture
def ladder_app(make_app: Callable[..., Any], uid: str, vhost: str) -> Iterator[Any]:
    """An app with a small ladder of this test's own (3 levels, 1 s unit), not declared; deleted after."""
    app = make_app(delayq_prefix=f"ro{uid}", delayq_levels=3, delayq_unit_ms=1000,
                   delayq_management_url=management_url())  # topology delete lists the broker through it
    yield app
    conn = amqp.Connection(BROKER_HOST, virtual_host=vhost)
    conn.connect()
    try:
        with contextlib.suppress(Exception):
            delete_ladder(conn, LadderSpec(prefix=f"ro{uid}", levels=3, unit_ms=1000))  # streams and parking too
    finally:
        conn.close()
