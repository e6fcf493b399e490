"""An app's ladder as seen from outside its workers: its settings, its broker, its management API.

:class:`AppContext` gives the commands, the metrics endpoint and the web page
the settings and a connection without installing the ladder hook, so what
only reads cannot write. It builds the app's :class:`~.topology.Topology` as
the broker would have it (nothing is declared).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Iterator

import amqp
import kombu

from ..config import DelayqConfig
from ..errors import UnsupportedTransport
from ..ladder.index_layout import index_layout
from ..ladder.spec import LadderSpec
from ..typing import CeleryApp
from .budget import BudgetCheck
from .management import ManagementAPI
from .placement import LeaderPlacement
from .topology import Topology, broker_version, resolve_queue_type

__all__ = ["AppContext"]


class AppContext:
    """The Celery app of a CLI run, its ``delayq_*`` settings and its ladder broker."""

    def __init__(self, app: CeleryApp) -> None:
        self.app = app

    @functools.cached_property
    def config(self) -> DelayqConfig:
        """The resolved settings (warns once about unknown ``delayq_*`` keys)."""
        return DelayqConfig.from_app(self.app)

    @property
    def spec(self) -> LadderSpec:
        """The ladder these settings describe."""
        return self.config.spec

    def connection(self) -> kombu.Connection:
        """A new, unconnected kombu connection to the ladder's broker."""
        if self.config.broker_url:
            return self.app.connection_for_write(self.config.broker_url)
        return self.app.connection_for_write()

    @functools.cached_property
    def uri(self) -> str:
        """The broker URL with the password masked, for messages."""
        return str(self.connection().as_uri())

    @property
    def parking_queue(self) -> str:
        """The app's parking queue name (``delayq_parking_queue``, else ``<prefix>.parking``)."""
        return self.config.parking_queue or f"{self.config.prefix}.parking"

    @contextlib.contextmanager
    def connected(self) -> Iterator[amqp.Connection]:
        """A connected py-amqp connection, closed afterwards.

        One attempt, no retry loop: an operator at a prompt wants to know at
        once that the broker is down, not after kombu's back-off.
        """
        conn = self.connection()
        if conn.transport.driver_type != "amqp":
            raise UnsupportedTransport(
                f"the delay ladder lives on RabbitMQ (AMQP 0-9-1), but the broker transport is "
                f"{conn.transport.driver_type!r}; use an amqp:// broker_url or set delayq_broker_url")
        try:
            conn.ensure_connection(max_retries=0)
            yield conn.connection
        finally:
            with contextlib.suppress(Exception):
                conn.release()

    def topology(self, raw: amqp.Connection) -> Topology:
        """The app's ladder as the broker behind ``raw`` would have it (nothing is declared).

        A :meth:`Topology.declare` of a new ladder spreads its leaders (``delayq_leader_placement``).
        """
        version = broker_version(raw)
        topo = Topology(self.spec, resolve_queue_type(self.config.queue_type, version),
                        index=index_layout(self.spec, index=self.config.index, version=version))
        api = self.api(raw)
        if api is not None and self.config.leader_placement == "spread":
            topo.placement = LeaderPlacement(api, self.connection()).place
        # An operator's command is the explicit way to create a ladder the budget check cannot see.
        topo.budget = BudgetCheck(version, api, spread=self.config.leader_placement == "spread", explicit=True)
        return topo

    def api(self, raw: amqp.Connection) -> ManagementAPI | None:
        """The management API of the broker behind ``raw`` (``None`` when switched off)."""
        return ManagementAPI.for_broker(self.connection(), raw, self.config.management_url)
