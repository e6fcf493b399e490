"""Prometheus metrics (docs/operations.md): what waits on the broker, and what this process saw happen.

:func:`serve` (``delayq metrics``, or a worker's ``delayq_metrics_port``) serves on ``127.0.0.1``
unless ``delayq_metrics_address`` says otherwise. Broker gauges come at scrape time from
``delayq status --json``'s document (passive declares; a broker that is down gives only
``delayq_broker_up 0``); counters and the lateness histogram count :mod:`celery_delayq.signals`
of this process.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .. import signals
from ..glue.app_ladder import AppLadder, ladder_for
from ..glue.extensions import Extension
from ..typing import CeleryApp

__all__ = ["BrokerCollector", "EventCounters", "MetricsServer", "MetricsExtension", "serve", "LATENESS_BUCKETS"]

log = logging.getLogger(__name__)

#: Lateness buckets (seconds): most deliveries fall below 100 ms; the tail shows a backlog.
LATENESS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class BrokerCollector(Collector):
    """Reads the ladder's queue depths from the broker at every scrape (passive declares only)."""

    def __init__(self, app: CeleryApp) -> None:
        self.ladder = ladder_for(app)

    def collect(self) -> Iterator[Metric]:
        """One ``delayq status --json`` document, as gauges."""
        from ..rabbitmq.status import ladder_status

        up = GaugeMetricFamily("delayq_broker_up", "1 when this scrape could read the ladder's broker.")
        try:
            with self.ladder.connected() as raw:
                doc = ladder_status(self.ladder, raw)
        except Exception as exc:  # a scrape must answer: report the broker as down
            log.warning("delayq metrics: cannot read the broker at %s: %s", self.ladder.uri, exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield _gauge("delayq_ladder_exists", "1 when any part of the app's ladder is on the broker.",
                     1 if doc["exists"] else 0)
        levels = GaugeMetricFamily("delayq_waiting_messages", "Ready messages waiting in a ladder level.",
                                   labels=["level"])
        for lv in doc["levels"]:
            levels.add_metric([str(lv["level"])], lv["messages"])
        yield levels
        totals = doc["totals"]
        yield _gauge("delayq_ladder_waiting_messages", "Ready messages waiting in the whole ladder.",
                     totals["waiting"])
        yield _gauge("delayq_parked_messages", "Messages in the app's parking queue.", totals["parked"])
        yield _gauge("delayq_unroutable_messages",
                     "Messages in <prefix>.unroutable: no exit queue for their destination.", totals["unroutable"])
        if totals.get("held") is not None:
            yield _gauge("delayq_held_messages", "Messages ladder queues hold in their dead-letter state and do "
                         "not pass on (after a broker restart, or an exit queue whose destination has no binding).",
                         totals["held"])


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc)
    g.add_metric([], value)
    return g


class EventCounters:
    """Counters and the lateness histogram, fed by :mod:`celery_delayq.signals` until :meth:`close`."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.scheduled = Counter("delayq_messages_scheduled", "Messages confirmed into the ladder.",
                                 registry=registry)
        self.delivered = Counter("delayq_messages_delivered", "Messages that left the ladder and reached a worker.",
                                 registry=registry)
        self.retried = Counter("delayq_retries_scheduled", "Retries scheduled through the ladder.",
                               registry=registry)
        self.parked = Counter("delayq_messages_parked", "Messages moved to a parking queue.", registry=registry)
        self.lateness = Histogram("delayq_delivery_lateness_seconds",
                                  "Seconds between a delivered message's due time and its arrival at a worker.",
                                  buckets=LATENESS_BUCKETS, registry=registry)
        self._receivers: list[tuple[Any, Callable[..., None]]] = [
            (signals.message_scheduled, lambda **_: self.scheduled.inc()),
            (signals.message_delivered, self._on_delivered),
            (signals.retry_scheduled, lambda **_: self.retried.inc()),
            (signals.message_parked, lambda **_: self.parked.inc()),
        ]
        for signal, receiver in self._receivers:
            signal.connect(receiver, weak=False)

    def _on_delivered(self, lateness: float | None = None, **_: Any) -> None:
        self.delivered.inc()
        if lateness is not None:
            self.lateness.observe(float(lateness))

    def close(self) -> None:
        """Stop counting."""
        for signal, receiver in self._receivers:
            signal.disconnect(receiver)


class MetricsServer:
    """A running exporter: its registry, its HTTP server and its event counters."""

    def __init__(self, registry: CollectorRegistry, counters: EventCounters, httpd: Any,
                 thread: threading.Thread) -> None:
        self.registry = registry
        self.counters = counters
        self.httpd = httpd
        self.thread = thread

    @property
    def port(self) -> int:
        """The port it listens on (useful when asked for port 0)."""
        return int(self.httpd.server_address[1])

    def close(self) -> None:
        """Stop serving and counting; frees the port."""
        self.counters.close()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


def serve(app: CeleryApp, port: int, addr: str | None = None) -> MetricsServer:
    """Serve the app's delayq metrics at ``http://addr:port/metrics`` from a daemon thread (``OSError``: port taken).

    ``addr`` defaults to the app's ``delayq_metrics_address`` (``127.0.0.1``).
    """
    if addr is None:
        from ..config import DelayqConfig

        addr = DelayqConfig.from_app(app).metrics_address
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(app))
    counters = EventCounters(registry)
    try:
        httpd, thread = start_http_server(port, addr, registry=registry)
    except Exception:
        counters.close()
        raise
    return MetricsServer(registry, counters, httpd, thread)


class MetricsExtension(Extension[AppLadder]):
    """The ``metrics`` extension: each worker's main process serves :func:`serve` on ``delayq_metrics_port``
    (counters kept across lost connections, closed at shutdown)."""

    name = "metrics"

    def __init__(self) -> None:
        #: The running exporter, in the worker's main process only.
        self.server: MetricsServer | None = None

    def worker_start(self, ladder: AppLadder, consumer: Any) -> None:
        """Serve the metrics when ``delayq_metrics_port`` is set (``OSError`` when the port is taken)."""
        config = ladder.config
        if self.server is None and config.metrics_port is not None:
            self.server = serve(ladder.app, int(config.metrics_port), config.metrics_address)
            log.info("delayq: metrics on %s port %s", config.metrics_address, self.server.port)

    def worker_shutdown(self, ladder: AppLadder, consumer: Any) -> None:
        """Close the exporter (frees the port)."""
        if self.server is not None:
            self.server.close()
            self.server = None

    def describe(self, ladder: AppLadder) -> str:
        """Where the metrics are served."""
        port = ladder.config.metrics_port
        if port is None:
            return "off (delayq_metrics_port is not set)"
        return f"workers serve /metrics on {ladder.config.metrics_address} port {port}"
