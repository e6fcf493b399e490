"""Prometheus metrics: what waits on the broker, and what this process saw happen.

Two kinds of numbers, served together by :func:`serve` (``celery -A APP
delayq metrics``, or inside a worker with ``delayq_metrics_port``), on
``127.0.0.1`` unless ``delayq_metrics_address`` (or ``--addr``) names
another address: serving the network is an explicit choice.

* **Broker state**, read at scrape time with passive declares through the
  same function as ``delayq status --json``
  (:func:`celery_delayq.rabbitmq.status.ladder_status`), so the two never
  disagree and a scrape creates nothing:

  ``delayq_waiting_messages{level="K"}``
      Ready messages in ladder level K's queues.
  ``delayq_ladder_waiting_messages``
      All of them (the sum over levels, for alerts that need no ``sum()``).
  ``delayq_parked_messages``, ``delayq_unroutable_messages``
      Messages in the parking and ``<prefix>.unroutable`` queues.
  ``delayq_held_messages``
      Messages ladder queues hold in their dead-letter state, not passed on
      (``status``'s ``held``; served only when the management API can tell).
  ``delayq_ladder_exists``, ``delayq_broker_up``
      1/0: the ladder is on the broker / the scrape could read the broker.
      When the broker is down only ``delayq_broker_up 0`` is served: a
      scrape must answer, and a stale count would mislead.

* **Events of this process**, counted from :mod:`celery_delayq.signals`:

  ``delayq_messages_scheduled_total``
      Messages the broker confirmed into the ladder (``message_scheduled``).
  ``delayq_messages_delivered_total``, ``delayq_delivery_lateness_seconds``
      Messages that left the ladder and reached a worker, and how late
      after their due time (``message_delivered``; a histogram).
  ``delayq_retries_scheduled_total``, ``delayq_messages_parked_total``
      Retries sent through the ladder, messages moved to a parking queue.

  Counters count what happens *in this process*. A standalone ``delayq
  metrics`` publishes and consumes nothing, so there they stay at 0: run the
  exporter inside the workers for them. With the prefork pool the exporter
  runs in the worker's main process (children cannot all bind one port):
  deliveries and lateness are seen there (the consumer receives every
  message), but retries and parks happen in the children and are not
  counted; use the solo or threads pool, or prometheus_client's
  multiprocess mode (not wired here), when those counters matter.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .. import signals
from ..glue.app_ladder import AppLadder, ladder_for
from ..glue.extensions import Extension
from ..typing import CeleryApp

__all__ = ["BrokerCollector", "EventCounters", "MetricsServer", "MetricsExtension", "serve", "LATENESS_BUCKETS"]

log = logging.getLogger(__name__)

#: Lateness buckets (seconds): the ladder's unit is ~10 ms and a hop costs a few
#: ms, so most deliveries fall below 100 ms; the tail shows a backlog.
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
    """Counters and the lateness histogram, fed by :mod:`celery_delayq.signals` while connected.

    Receivers are held strongly by this object and disconnected by
    :meth:`close`, so several exporters in one process (tests) count apart.
    """

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
        self._receivers = [
            (signals.message_scheduled, self._on_scheduled),
            (signals.message_delivered, self._on_delivered),
            (signals.retry_scheduled, self._on_retry),
            (signals.message_parked, self._on_parked),
        ]
        for signal, receiver in self._receivers:
            signal.connect(receiver, weak=False)

    def _on_scheduled(self, **_: Any) -> None:
        self.scheduled.inc()

    def _on_delivered(self, lateness: float | None = None, **_: Any) -> None:
        self.delivered.inc()
        if lateness is not None:
            self.lateness.observe(float(lateness))

    def _on_retry(self, **_: Any) -> None:
        self.retried.inc()

    def _on_parked(self, **_: Any) -> None:
        self.parked.inc()

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
    """Serve the app's delayq metrics at ``http://addr:port/metrics`` from a daemon thread.

    ``addr`` defaults to the app's ``delayq_metrics_address`` (``127.0.0.1``).

    Raises ``OSError`` when the port is taken, as binding does.
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
    """The ``metrics`` extension: each worker's main process serves :func:`serve` on ``delayq_metrics_port``.

    The exporter starts once the delay backend's worker service runs, keeps its
    counters across lost broker connections, and closes at worker shutdown.
    """

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
