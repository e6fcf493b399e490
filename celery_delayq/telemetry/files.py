"""Which event files a reader reads: listing, time-window pruning, incremental state (pure Python, no JVM).

A window skips whole ``date=/hour=`` partitions; files in another layout are always read.
"""

from __future__ import annotations

import calendar
import json
import os
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

__all__ = ["EventFile", "EventsNotFoundError", "IncrementalState", "is_local", "list_event_files", "local_path",
           "split_sealed"]

_PARTITION = re.compile(r"date=(\d{4})-(\d{2})-(\d{2})[/\\]hour=(\d{2})(?:[/\\]|$)")
#: A file whose hour ended this long ago is complete: the recorder flushes every second.
SEAL_AFTER_S = 300.0


class EventsNotFoundError(FileNotFoundError):
    """The events directory does not exist (no recorder has written to it yet, or a wrong path)."""


def local_path(path: str) -> str | None:
    """The local filesystem path behind ``path``, or None for remote URIs."""
    parsed = urlparse(path)
    if parsed.scheme in ("", "file") or len(parsed.scheme) == 1:  # "C:\\..." on Windows
        return parsed.path if parsed.scheme == "file" else path
    return None


def is_local(path: str) -> bool:
    """Whether ``path`` is on the local filesystem (listing and incremental mode work)."""
    return local_path(path) is not None


@dataclass(frozen=True)
class EventFile:
    """One file of events."""

    path: str
    size: int
    mtime_ns: int
    #: ``[start, end)`` epoch seconds of its ``date=/hour=`` partition; None outside that layout.
    hour: tuple[float, float] | None

    def key(self) -> str:
        """Identity in the incremental state: the path and what it held when it was read."""
        return f"{self.path}\t{self.size}\t{self.mtime_ns}"


def _hour_of(relative: str) -> tuple[float, float] | None:
    match = _PARTITION.search(relative.replace(os.sep, "/"))
    if not match:
        return None
    year, month, day, hour = (int(g) for g in match.groups())
    start = float(calendar.timegm((year, month, day, hour, 0, 0, 0, 0, 0)))
    return start, start + 3600.0


def list_event_files(path: str, *, since: float | None = None, until: float | None = None) -> list[EventFile]:
    """Every non-empty event file under the local ``path`` that may hold events in ``[since, until)``.

    Skips ``.``/``_`` names as Spark does. Raises :class:`EventsNotFoundError` if ``path`` doesn't exist.
    """
    local = local_path(path)
    if local is None:
        raise ValueError(f"not a local path: {path}")
    root = Path(local)
    if not root.exists():
        raise EventsNotFoundError(f"events directory not found: {path}")
    candidates: Iterable[tuple[Path, str]] = [(root, root.name)] if root.is_file() else _walk(root)
    files = []
    for file, relative in candidates:
        try:
            st = file.stat()
        except OSError:  # vanished while listing
            continue
        if st.st_size == 0:
            continue
        hour = _hour_of(relative)
        if hour is not None and ((since is not None and hour[1] <= since) or (until is not None and hour[0] >= until)):
            continue
        files.append(EventFile(str(file), st.st_size, st.st_mtime_ns, hour))
    return sorted(files, key=lambda f: f.path)


def _walk(root: Path) -> Iterable[tuple[Path, str]]:
    for directory, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
        for name in sorted(names):
            if name.startswith((".", "_")):
                continue
            file = Path(directory) / name
            yield file, str(file.relative_to(root))


def split_sealed(files: Iterable[EventFile], now: float | None = None) -> tuple[list[EventFile], list[EventFile]]:
    """``(sealed, open)``: files whose hour ended (else last write) :data:`SEAL_AFTER_S` ago, and the others."""
    now = time.time() if now is None else now
    sealed: list[EventFile] = []
    still_open: list[EventFile] = []
    for f in files:
        ended = f.hour[1] if f.hour is not None else f.mtime_ns / 1e9
        (sealed if now - ended >= SEAL_AFTER_S else still_open).append(f)
    return sealed, still_open


class IncrementalState:
    """What earlier incremental runs folded into the report's event store (``<out>/_state.json``)."""

    VERSION = 1

    def __init__(self, out_dir: Path) -> None:
        self.path = out_dir / "_state.json"
        self.store = out_dir / "_events"
        self.files: set[str] = set()
        self.malformed = 0
        self.events_dir: str | None = None
        if self.path.exists():
            data: dict[str, Any] = json.loads(self.path.read_text(encoding="utf-8"))
            if data.get("version") == self.VERSION:
                self.files = set(data.get("files", ()))
                self.malformed = int(data.get("malformed", 0))
                self.events_dir = data.get("events_dir")

    def reset(self) -> None:
        """Forget everything and delete the store (another events directory)."""
        import shutil

        shutil.rmtree(self.store, ignore_errors=True)
        self.files, self.malformed, self.events_dir = set(), 0, None

    def new(self, files: Iterable[EventFile]) -> list[EventFile]:
        """The files not folded in yet."""
        return [f for f in files if f.key() not in self.files]

    def add(self, files: Iterable[EventFile], malformed: int) -> None:
        """Remember ``files`` (already written to the store) and their malformed lines."""
        self.files.update(f.key() for f in files)
        self.malformed += malformed

    def save(self, events_dir: str) -> None:
        """Write the state (atomically: a crash leaves the previous one)."""
        self.events_dir = events_dir
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({
            "version": self.VERSION, "events_dir": events_dir, "malformed": self.malformed,
            "files": sorted(self.files),
        }), encoding="utf-8")
        os.replace(tmp, self.path)
