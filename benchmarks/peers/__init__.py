"""The compared systems: (a) celery_delayq, (b) Celery native, (c) classic ETA, (d) naive TTL.

Plus ``baseline``, the machine's own limits, behind the same interface.
Peers are imported lazily so a child process measuring a baseline never
imports celery_delayq (which swaps kombu's producer class).
"""

from __future__ import annotations

import importlib
from typing import Any

from .base import Peer, Publisher, decode_body, raw_body

_REGISTRY = {
    "delayq": ("benchmarks.peers.delayq", "DelayqPeer"),
    "native": ("benchmarks.peers.native", "NativePeer"),
    "classic": ("benchmarks.peers.classic_eta", "ClassicEtaPeer"),
    "naive": ("benchmarks.peers.naive_ttl", "NaiveTtlPeer"),
    "baseline": ("benchmarks.peers.baseline", "BaselinePeer"),
}

TITLES = {
    "delayq": "(a) celery_delayq",
    "native": "(b) Celery native delayed delivery",
    "classic": "(c) Celery classic ETA",
    "naive": "(d) naive per-message TTL",
    "baseline": "machine limit",
}


def peer_class(name: str) -> type[Peer]:
    """The :class:`Peer` subclass registered as ``name``."""
    module, attr = _REGISTRY[name]
    return getattr(importlib.import_module(module), attr)


def make_peer(name: str, url: str, **opts: Any) -> Peer:
    """Instantiate peer ``name`` on broker ``url``."""
    return peer_class(name)(url, **opts)


__all__ = ["Peer", "Publisher", "make_peer", "peer_class", "decode_body", "raw_body", "TITLES"]
