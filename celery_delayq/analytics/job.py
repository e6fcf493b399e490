"""The report job: events directory in, summary + Parquet tables + charts + HTML out."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from celery_delayq.analytics.errors import NoValidEventsError
from celery_delayq.telemetry.files import EventFile, IncrementalState, is_local, list_event_files, split_sealed
from celery_delayq.analytics.plots import render_all
from celery_delayq.analytics.reader import (check_events_path, in_window, malformed_of, parse_events, read_events,
                                            read_store)
from celery_delayq.analytics.report import render_html
from celery_delayq.analytics.session import session_scope
from celery_delayq.analytics.storms import find_storms
from celery_delayq.analytics.summary import build_summary
from celery_delayq.analytics.tables import TABLE_NAMES, build_tables

__all__ = ["run_report"]

logger = logging.getLogger(__name__)


def _write_tables(tables: Mapping[str, Any], out: Path) -> None:
    for name, frame in tables.items():  # aggregates are small: one file each
        frame.coalesce(1).write.mode("overwrite").parquet((out / name).as_uri())


def _read_back(spark: SparkSession, out: Path) -> dict[str, list[dict[str, Any]]]:
    """The written tables as plain dicts (each aggregate computed once; JSON/HTML show what Parquet holds)."""
    return {name: [row.asDict() for row in spark.read.parquet((out / name).as_uri()).collect()]
            for name in TABLE_NAMES}


def _jvm_cpu_s(session: SparkSession) -> float | None:
    """CPU seconds the driver JVM used so far (Linux; None elsewhere): in local mode, the whole job's."""
    try:
        pid = session._jvm.java.lang.ProcessHandle.current().pid()  # type: ignore[union-attr]
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except Exception:
        return None


def _window_text(since: float | None, until: float | None) -> str:
    """`` between <since> and <until>`` (UTC) for an error about a ``--since/--until`` window; empty without one."""
    if since is None and until is None:
        return ""
    start = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(since)) if since is not None else "the start"
    end = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(until)) if until is not None else "now"
    return f" between {start} and {end}"


def _files_to_read(events_dir: str, since: float | None, until: float | None) -> list[EventFile] | None:
    """The local files to parse (None: a remote path, Spark lists it); none: NoValidEventsError before any JVM."""
    if not is_local(events_dir):
        return None
    files = list_event_files(events_dir, since=since, until=until)
    if not files:
        raise NoValidEventsError(f"no event files under {events_dir}" + _window_text(since, until))
    return files


def _incremental_events(session: SparkSession, events_dir: str, out: Path, since: float | None,
                        until: float | None) -> tuple[DataFrame, int, dict[str, Any]]:
    """Fold newly sealed files into the output's event store; events = store + open files (persisted).

    Sealed files (their hour is over) go once into ``<out>/_events`` (Parquet by hour), noted in
    ``<out>/_state.json``; files that may still grow are read on every run, never stored.
    """
    if not is_local(events_dir):
        raise ValueError("--incremental needs a local events directory")
    state = IncrementalState(out)
    if state.events_dir not in (None, events_dir):
        logger.info("events directory changed (%s -> %s): rebuilding the store", state.events_dir, events_dir)
        state.reset()
    every = list_event_files(events_dir)
    sealed, still_open = split_sealed(every)
    new: list[EventFile] = state.new(sealed)
    if new:
        parsed, malformed = read_events(session, [f.path for f in new], allow_empty=True)
        try:
            (parsed.withColumn("hour", (F.floor(F.col("ts") / 3600)).cast("long"))
             .write.mode("append").partitionBy("hour").parquet(state.store.as_uri()))
        finally:
            parsed.unpersist()
        state.add(new, malformed)
        state.save(events_dir)
    parts: list[DataFrame] = []
    malformed = state.malformed
    if state.store.exists():
        parts.append(read_store(session, state.store, since=since, until=until))
    open_files = [f.path for f in still_open
                  if not ((since is not None and f.hour and f.hour[1] <= since)
                          or (until is not None and f.hour and f.hour[0] >= until))]
    observation = None
    if open_files:  # lazy: parsed once, into the one cache below
        live, observation = parse_events(session, open_files)
        parts.append(live)
    if not parts:
        raise NoValidEventsError(f"no event files under {events_dir}")
    events = parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1])
    events = in_window(events, since, until).persist(StorageLevel.MEMORY_AND_DISK)
    n_events = events.count()  # the open files' observation fires with it
    if observation is not None:
        malformed += malformed_of(observation)
    if n_events == 0:
        events.unpersist()
        raise NoValidEventsError(f"no valid events under {events_dir}" + _window_text(since, until),
                                 malformed=malformed)
    info = {"files_new": len(new), "files_stored": len(state.files), "files_open": len(open_files)}
    return events, malformed, info


def run_report(events_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str], master: str = "local[*]",
               spark: SparkSession | None = None, *, conf: Mapping[str, str] | None = None,
               since: float | None = None, until: float | None = None, incremental: bool = False,
               live: Mapping[str, Any] | None = None, quiet: bool = False) -> dict[str, Any]:
    """Analyse the telemetry under ``events_dir`` and write the report to ``out_dir``.

    Writes ``summary.json``, one Parquet directory per table
    (:func:`~celery_delayq.analytics.tables.build_tables`), the chart PNGs and a self-contained
    ``report.html`` into local ``out_dir``; ``events_dir`` may be any path Spark reads.
    ``since``/``until`` (epoch s) keep ``since <= ts < until`` (other partitions are not opened).
    ``incremental`` parses each JSON file once (:func:`_incremental_events`).

    Uses ``spark`` if given (left running); else a session on ``master`` with
    :func:`~celery_delayq.analytics.session.default_conf` plus ``conf``, stopped at the end.
    ``live``: ``delayq status --json``'s document (or ``{"error": ...}``), the first section.
    ``quiet``: the JVM's output goes to ``<out>/spark.log``.

    Returns the summary dict (with ``timings_s`` per stage). Raises
    :class:`~celery_delayq.telemetry.files.EventsNotFoundError` or
    :class:`~celery_delayq.analytics.errors.NoValidEventsError`, locally before any JVM starts.
    """
    events_dir = check_events_path(events_dir)
    out = Path(out_dir).resolve()
    listed = None if incremental else _files_to_read(events_dir, since, until)
    files = [f.path for f in listed] if listed is not None else None
    out.mkdir(parents=True, exist_ok=True)
    clock = _Stages()
    info: dict[str, Any] = {}
    with session_scope(master, spark, conf, log=out / "spark.log" if quiet else None) as session:
        clock.lap("start Spark")
        cpu_start = _jvm_cpu_s(session)
        if incremental:
            events, malformed, info = _incremental_events(session, events_dir, out, since, until)
        else:
            events, malformed = read_events(session, files or events_dir, since=since, until=until)
        clock.lap("parse")
        try:
            _write_tables(build_tables(session, events), out)
        finally:
            events.unpersist()
        clock.lap("aggregate")
        tables = _read_back(session, out)
        cpu_end = _jvm_cpu_s(session)
    clock.lap("read back")

    storms = [s.to_dict() for s in find_storms(tables["retries_per_minute"])]
    window = {"since": since, "until": until, "files": len(files) if files is not None else None,
              "incremental": incremental, **info}
    summary = build_summary(tables["task_summary"], malformed, queues=tables["queue_summary"],
                            storms=storms, window=window)
    images = render_all(tables, storms)
    clock.lap("charts")
    summary["live"] = dict(live) if live is not None else None
    summary["timings_s"] = clock.stages
    for name, png in images.items():
        (out / name).write_bytes(png)
    (out / "report.html").write_text(render_html(summary, tables, images, events_dir=events_dir), encoding="utf-8")
    clock.lap("html")  # summary["timings_s"] is clock.stages: the html stage is in summary.json too
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    logger.info("report written to %s: %s; total %.1fs, driver jvm cpu %s", out,
                ", ".join(f"{name} {secs:.1f}s" for name, secs in clock.stages.items()), clock.total(),
                f"{cpu_end - cpu_start:.1f}s" if cpu_start is not None and cpu_end is not None else "n/a")
    return summary


class _Stages:
    """Wall-clock seconds of each stage of a report run, in order."""

    def __init__(self) -> None:
        self.started = self.last = time.perf_counter()
        self.stages: dict[str, float] = {}

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.stages[name] = round(now - self.last, 2)
        self.last = now

    def total(self) -> float:
        return time.perf_counter() - self.started
