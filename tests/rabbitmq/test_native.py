"""``delayq_backend = "native"``: refused, by name and version, on brokers that would deliver at once."""

from __future__ import annotations

import re

import kombu
import pytest

from celery_delayq.config import DelayqConfig
from celery_delayq.errors import BrokerTooOld
from celery_delayq.rabbitmq.native import NATIVE_DELAY_VERSION, NativeDelays
from celery_delayq.scheduling import Scheduler


def test_native_is_a_backend_name_the_settings_accept() -> None:
    assert DelayqConfig(backend="native").backend == "native"
    assert DelayqConfig(queue_backends={"emails": "native"}).queue_backends == (("emails", "native"),)


def test_a_broker_without_per_message_delays_is_refused_naming_its_version_and_the_alternatives(
        broker_url: str, amqp_conn) -> None:
    version = amqp_conn.server_properties["version"]
    version = version.decode() if isinstance(version, bytes) else version
    assert tuple(int(x) for x in re.findall(r"\d+", version)[:2]) < NATIVE_DELAY_VERSION  # 3.10 and 4.3 here
    with pytest.raises(BrokerTooOld) as info:
        NativeDelays.for_connection(kombu.Connection(broker_url), DelayqConfig())
    text = str(info.value)
    assert f"this broker is {'.'.join(version.split('.')[:3])}" in text
    assert "x-opt-delivery-time" in text and "'ladder'" in text and "'fixed'" in text


def test_the_scheduler_refuses_a_queue_backend_named_native_when_it_is_built(broker_url: str) -> None:
    config = DelayqConfig(queue_backends={"emails": "native"})
    with pytest.raises(BrokerTooOld, match="delayq backend 'native' needs RabbitMQ"):
        Scheduler.for_connection(kombu.Connection(broker_url), config)
