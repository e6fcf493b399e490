"""Read telemetry JSON Lines into a validated, cached DataFrame in one pass."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from pyspark import StorageLevel
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from celery_delayq.analytics.errors import NoValidEventsError
from celery_delayq.telemetry.files import EventsNotFoundError, local_path
from celery_delayq.analytics.schema import EVENT_COLUMNS, EVENT_SCHEMA, is_valid_event

__all__ = ["check_events_path", "in_window", "malformed_of", "parse_events", "read_events", "read_store"]

_VALID = "_valid"


def check_events_path(path: str | os.PathLike[str]) -> str:
    """The path as a string; a missing local one fails before any JVM starts (Spark checks remote ones)."""
    path = os.fspath(path)
    local = local_path(path)
    if local is not None and not os.path.exists(local):
        raise EventsNotFoundError(f"events directory not found: {path}")
    return path


def in_window(events: DataFrame, since: float | None, until: float | None) -> DataFrame:
    """The events with ``since <= ts < until`` (a bound that is None: no bound)."""
    if since is not None:
        events = events.where(F.col("ts") >= F.lit(float(since)))
    if until is not None:
        events = events.where(F.col("ts") < F.lit(float(until)))
    return events


def parse_events(spark: SparkSession, path: str | os.PathLike[str] | Sequence[str], *, since: float | None = None,
                 until: float | None = None) -> tuple[DataFrame, Observation]:
    """The lazy half of :func:`read_events`: valid events in ``[since, until)``, and the
    observation that counts valid and malformed lines when the frame is first computed."""
    if isinstance(path, (str, os.PathLike)):
        where: str | list[str] = check_events_path(path)
    else:
        where = [os.fspath(p) for p in path]
    try:
        # Spark's JSON source (docs/report.md); a line that is not a JSON object comes out all null.
        parsed = (spark.read.schema(EVENT_SCHEMA).option("mode", "PERMISSIVE").option("recursiveFileLookup", "true")
                  .json(where).select(*EVENT_COLUMNS).withColumn(_VALID, is_valid_event()))
    except AnalysisException as exc:
        if "PATH_NOT_FOUND" in str(exc) or "Path does not exist" in str(exc):
            raise EventsNotFoundError(f"events directory not found: {where}") from exc
        raise
    observation = Observation("celery_delayq_parse")
    # observe() also keeps the validity filter above the parse (else: a parse per referenced field).
    observed = parsed.observe(observation, F.count_if(F.col(_VALID)).alias("valid"),
                              F.count_if(~F.col(_VALID)).alias("malformed"))
    return in_window(observed.where(F.col(_VALID)).drop(_VALID), since, until), observation


def malformed_of(observation: Observation) -> int:
    """Malformed lines counted by a :func:`parse_events` observation (after its frame ran)."""
    return int(observation.get.get("malformed") or 0)


def read_events(spark: SparkSession, path: str | os.PathLike[str] | Sequence[str], *, since: float | None = None,
                until: float | None = None, allow_empty: bool = False) -> tuple[DataFrame, int]:
    """Parse every event file under ``path`` and split valid from malformed lines, reading the text once.

    ``path``: a directory (recursively; ``.``/``_`` names skipped, ``.gz`` decompressed) or a list
    of files. Valid events (:mod:`~celery_delayq.analytics.schema`) outside ``[since, until)`` are
    dropped, not malformed. Returns ``(valid, malformed)``: the valid events, **persisted** (release
    with ``valid.unpersist()``), and the exact number of malformed lines.

    Raises :class:`EventsNotFoundError` if ``path`` doesn't exist and, unless
    ``allow_empty``, :class:`NoValidEventsError` if it holds no valid event.
    """
    valid, observation = parse_events(spark, path, since=since, until=until)
    valid = valid.persist(StorageLevel.MEMORY_AND_DISK)
    n_valid = valid.count()  # materialises the cache; the observation fires with it
    malformed = malformed_of(observation)
    if n_valid == 0 and not allow_empty:
        valid.unpersist()
        detail = f"{malformed} malformed line(s)" if malformed else "no event lines"
        raise NoValidEventsError(f"no valid events under {path} ({detail})", malformed=malformed)
    return valid, malformed


def read_store(spark: SparkSession, store: Path, *, since: float | None = None, until: float | None = None) -> DataFrame:
    """The events an incremental run stored as Parquet (partitioned by ``hour``), in the window."""
    frame = spark.read.parquet(store.as_uri())
    if since is not None:
        frame = frame.where(F.col("hour") >= int(since // 3600))
    if until is not None:
        frame = frame.where(F.col("hour") <= int(until // 3600))
    return in_window(frame, since, until).select(*EVENT_COLUMNS)
