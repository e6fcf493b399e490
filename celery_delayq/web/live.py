"""What keeps an open page current: a cheap change signal (``/api/changes``) and the charts' series.

:class:`Live` computes the signal at most once per :data:`SIGNAL_TTL` per process from the kept waiting list and
the parking queue's ready count (kept, not trusted, while a consumer browses it: a browse is not a change).
:class:`SeriesCache` reads each chart window's files once per window per process. docs/web.md, "Live pages".
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field

from ..index.stream import IndexUnavailable
from ..rabbitmq.client import Connection, raw_connection
from ..rabbitmq.probe import queue_counts
from ..telemetry.series import COUNTED, WINDOWS, series

if TYPE_CHECKING:
    from .service import Service

__all__ = ["Changes", "ChartSeries", "Live", "SeriesCache", "SERIES", "live_of", "POLL_S", "SIGNAL_TTL", "SNAPSHOT_TTL",
           "WindowName"]

#: Seconds between two polls of a page (the script's period).
POLL_S = 1.0
#: Seconds one computed signal is reused, process-wide.
SIGNAL_TTL = 1.0
#: The kept waiting list is re-read in the background when older than this while pages poll.
SNAPSHOT_TTL = 1.0
#: The age the page promises at most for what it shows, when the index reads in well under a second.
REFRESH_S = 3.0

WindowName = Literal["1h", "24h", "7d"]


class Changes(BaseModel):
    """The change signal: compare ``changed_at`` with when the page was rendered."""

    version: str = Field(description="Digest of the waiting list and the parked count; changes with either.")
    changed_at: float = Field(description="Epoch seconds this process first saw this version.")
    read_at: float | None = Field(description="Epoch seconds the waiting list behind it was read (None: unreadable).")
    now: float = Field(description="The server's clock, to tell ages without trusting the browser's.")
    waiting: int | None = Field(description="Tasks waiting (None: the index cannot be read).")
    parked: int | None = Field(description="Messages parked (None: no parking queue, or the broker is down).")
    poll_s: float = Field(description="Seconds between two polls the page should make.")
    refresh_s: float = Field(description="The most a shown page should lag, in seconds.")
    error: str | None = Field(default=None, description="Why part of the signal could not be read.")


class ChartSeries(BaseModel):
    """One chart window of telemetry, oldest bucket first (from the files under ``delayq_telemetry_dir``)."""

    window: WindowName
    available: bool = Field(description="False when telemetry is off or its directory cannot be read here.")
    reason: str | None = None
    step_s: int = Field(description="Seconds per bucket.")
    t: list[float] = Field(default_factory=list, description="Each bucket's start, epoch seconds.")
    counts: dict[str, list[int]] = Field(default_factory=dict,
                                         description=f"Events per bucket: {', '.join(COUNTED)}.")
    lateness_p50_s: list[float | None] = Field(default_factory=list)
    lateness_p99_s: list[float | None] = Field(default_factory=list)
    files: int = 0
    truncated: bool = Field(default=False, description="Only the newest 64 MB of files were read.")
    generated_at: float = 0.0


class Live:
    """The process's change signal for one :class:`Service` (see the module docstring)."""

    def __init__(self, svc: Service) -> None:
        self.svc = svc
        self._lock = threading.Lock()
        self._signal: Changes | None = None
        self._at = 0.0
        self._digest: tuple[list[Any] | None, str] = (None, "")
        self._parked: int | None = None
        self._raw: Connection | None = None
        self._kombu: Any = None
        svc.snapshot.ttl = min(svc.snapshot.ttl, SNAPSHOT_TTL)

    def changes(self) -> Changes:
        """The signal, computed at most once per :data:`SIGNAL_TTL` seconds (callers meanwhile share it)."""
        with self._lock:
            if self._signal is not None and time.monotonic() - self._at < SIGNAL_TTL:
                return self._signal.model_copy(update={"now": time.time()})
            now = time.time()
            errors: list[str] = []
            waiting, read_at, digest = None, None, "-"
            try:
                items, read_s, age = self.svc.snapshot.get()
                waiting, read_at, digest = len(items), now - age, self._list_digest(items)
                # Re-read once the list is SNAPSHOT_TTL old, or as old as a read takes (100,000 tasks: ~4 s):
                # the background reads never take more than half the time, and clicks stay fast.
                self.svc.snapshot.ttl = max(SNAPSHOT_TTL, read_s)
            except (IndexUnavailable, OSError) as exc:
                errors.append(str(exc))
            except Exception as exc:  # noqa: BLE001 - a stream read that broke: the signal still answers
                errors.append(f"{type(exc).__name__}: {exc}")
            try:
                self._parked = self._parked_count()
            except Exception as exc:  # noqa: BLE001 - a broker gone away: reconnect next time
                self._drop_connection()
                errors.append(f"parking queue: {exc}")
            version = hashlib.sha1(f"{digest}|{self._parked}".encode()).hexdigest()[:16]
            # The first version this process sees is no news: a page drawn before it is taken as current
            # (otherwise every page open when the server starts would refresh at once).
            changed_at = 0.0 if self._signal is None else \
                self._signal.changed_at if self._signal.version == version else now
            self._signal = Changes(version=version, changed_at=changed_at, read_at=read_at, now=now,
                                   waiting=waiting, parked=self._parked, poll_s=POLL_S, refresh_s=REFRESH_S,
                                   error="; ".join(errors) or None)
            self._at = time.monotonic()
            return self._signal

    def _list_digest(self, items: list[Any]) -> str:
        """The digest of a kept list: its ids and due times, computed once per list the snapshot hands out."""
        kept, digest = self._digest
        if kept is not items:
            h = hashlib.sha1()
            for t in items:
                h.update(f"{t.task_id}\0{t.due}\n".encode())
            digest = h.hexdigest()
            self._digest = (items, digest)
        return digest

    def _parked_count(self) -> int | None:
        if self._raw is None:
            # No heartbeats: nothing services them between two looks; a connection the broker dropped
            # fails the next look, and the one after connects again.
            self._kombu = self.svc.context.dedicated_connection("web live").clone(heartbeat=0)
            self._raw = raw_connection(self._kombu)
        counts = queue_counts(self._raw, self.svc.context.config.parking_queue_name)
        if counts is None:
            return None
        ready, consumers = counts
        if not consumers or self._parked is None:
            self._parked = ready
        return self._parked

    def _drop_connection(self) -> None:
        with contextlib.suppress(Exception):
            if self._kombu is not None:
                self._kombu.release()
        self._raw = self._kombu = None

    def close(self) -> None:
        """Close the connection kept for the parking count."""
        with self._lock:
            self._drop_connection()


class SeriesCache:
    """Each window's series, reused for a while (see the module docstring)."""

    KEEP_S: dict[str, float] = {"1h": 10.0, "24h": 60.0, "7d": 300.0}

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: dict[tuple[str, str], tuple[float, ChartSeries]] = {}

    def get(self, root: str | None, window: WindowName) -> ChartSeries:
        """The window under ``root`` (``delayq_telemetry_dir``; None: telemetry is off)."""
        step = WINDOWS[window][1]
        if not root:
            return ChartSeries(window=window, available=False, step_s=step,
                               reason="telemetry is off: set delayq_telemetry_dir")
        key = (root, window)
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None and time.monotonic() - kept[0] < self.KEEP_S[window]:
                return kept[1]
            found = series(root, window)
            doc = ChartSeries(window=window, available=False, step_s=step,
                              reason=f"no telemetry directory {root!r} readable from this process") \
                if found is None else ChartSeries.model_validate({**found.as_dict(), "available": True})
            self._kept[key] = (time.monotonic(), doc)
            return doc


_LIVE: "weakref.WeakKeyDictionary[Any, Live]" = weakref.WeakKeyDictionary()
_MADE = threading.Lock()
#: The process's kept chart series (keyed by telemetry directory and window).
SERIES = SeriesCache()


def close_live(svc: Service) -> None:
    """Close and forget this service's :class:`Live` signal, if it was made (the web app does on shutdown)."""
    with _MADE:
        live = _LIVE.pop(svc, None)
    if live is not None:
        live.close()


def live_of(svc: Service) -> Live:
    """The :class:`Live` signal of this service (one per service)."""
    with _MADE:
        if svc not in _LIVE:
            _LIVE[svc] = Live(svc)
        return _LIVE[svc]
