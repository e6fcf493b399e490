"""The common interface of the compared systems ("peers").

A peer knows how to declare what it needs on the broker, how to publish a
delayed message due at an absolute time, and which queue a raw consumer
reads to see the message arrive. Every message carries its due time and a
sequence number, so lateness and loss are measured the same way for all.

Publishing uses an absolute due time (``eta``), never a countdown, so the
due time the benchmark records is exactly the one the system was given.
"""

from __future__ import annotations

import contextlib
import json
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Iterator


class Publisher(ABC):
    """Publishes delayed messages of one peer in one mode (confirmed unless the mode says not)."""

    @abstractmethod
    def send(self, due: float, seq: int) -> None:
        """Publish one message due at epoch ``due`` carrying ``seq``."""

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Group sends; pipelined modes wait for every confirm when the block ends."""
        yield

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections (after waiting for outstanding confirms)."""


class Peer(ABC):
    """One compared system, bound to a broker vhost URL."""

    #: Short identifier used on the command line and in JSON.
    name: ClassVar[str]
    #: Human-readable name used in the Markdown report.
    title: ClassVar[str]
    #: Publish modes this peer supports; the first is the default.
    modes: ClassVar[tuple[str, ...]]
    #: ``system`` understood by :mod:`benchmarks.peers.apps` for a Celery worker, if any.
    worker_system: ClassVar[str | None] = None

    def __init__(self, url: str, **opts: Any) -> None:
        self.url = url
        self.opts = opts

    @property
    @abstractmethod
    def dest_queue(self) -> str:
        """Queue where due messages arrive (what a raw consumer or the worker reads)."""

    @abstractmethod
    def declare(self) -> None:
        """Declare everything a publisher and a raw consumer need (idempotent)."""

    @abstractmethod
    def publisher(self, mode: str) -> Publisher:
        """A connected publisher for ``mode`` (one of :attr:`modes`)."""

    def queues(self) -> list[str]:
        """Every queue that may hold this peer's messages (purged between runs)."""
        return [self.dest_queue]

    def expected_hops(self, delay_s: float) -> float:
        """Queues a message with this delay waits in (broker dead-letter operations)."""
        return 0.0

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release whatever :meth:`declare` opened (Celery apps are kept per process)."""


def raw_body(due: float, seq: int) -> bytes:
    """Body of a non-Celery benchmark message."""
    return json.dumps({"due": due, "seq": seq}).encode()


def decode_body(body: bytes | str) -> tuple[float, int]:
    """``(due, seq)`` of a benchmark message: raw JSON or a Celery protocol-2 task body."""
    data = json.loads(body)
    if isinstance(data, dict):
        return float(data["due"]), int(data["seq"])
    args = data[0]  # Celery protocol 2: [args, kwargs, embed]
    return float(args[0]), int(args[1])
