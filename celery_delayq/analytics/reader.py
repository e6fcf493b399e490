"""Read telemetry JSON Lines into a validated, cached DataFrame in one pass."""

from __future__ import annotations

import os
from urllib.parse import urlparse

from pyspark import StorageLevel
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from celery_delayq.analytics.errors import EventsNotFoundError, NoValidEventsError
from celery_delayq.analytics.schema import PARSE_SCHEMA, is_valid_event, typed_columns

__all__ = ["check_events_path", "read_events"]

_VALID = "_valid"


def _local_path(path: str) -> str | None:
    """The local filesystem path behind ``path``, or None for remote URIs."""
    parsed = urlparse(path)
    if parsed.scheme in ("", "file") or len(parsed.scheme) == 1:  # "C:\..." on Windows
        return parsed.path if parsed.scheme == "file" else path
    return None


def check_events_path(path: str | os.PathLike[str]) -> str:
    """Fail fast (before any JVM starts) if a local events path is missing.

    Returns the path as a string.  Remote URIs are left for Spark to check.
    """
    path = os.fspath(path)
    local = _local_path(path)
    if local is not None and not os.path.exists(local):
        raise EventsNotFoundError(f"events directory not found: {path}")
    return path


def read_events(spark: SparkSession, path: str | os.PathLike[str]) -> tuple[DataFrame, int]:
    """Parse every event file under ``path`` and split valid from malformed lines.

    Files are found recursively (any layout, e.g. the recorder's
    ``date=/hour=`` partitions; names starting with ``.`` or ``_`` are
    skipped, ``.gz`` files are decompressed).  Each line is parsed with an
    explicit schema and checked by :func:`~celery_delayq.analytics.schema.is_valid_event`.

    Returns ``(valid, malformed)``: the valid events (columns
    :data:`~celery_delayq.analytics.schema.EVENT_COLUMNS`, see
    :mod:`~celery_delayq.analytics.schema` for what "valid" means), **persisted** because every
    aggregate reads them again (release with ``valid.unpersist()``), and the
    exact number of malformed lines.  Counting rides along with building the
    cache (``observe``), so the raw text is read only once.

    Raises :class:`EventsNotFoundError` if ``path`` doesn't exist and
    :class:`NoValidEventsError` if it holds no valid event.
    """
    path = check_events_path(path)
    try:
        lines = spark.read.option("recursiveFileLookup", "true").text(path)
    except AnalysisException as exc:
        if "PATH_NOT_FOUND" in str(exc) or "Path does not exist" in str(exc):
            raise EventsNotFoundError(f"events directory not found: {path}") from exc
        raise

    parsed = (
        lines.where(F.trim("value") != "")
        .select(F.from_json("value", PARSE_SCHEMA).alias("e"))
        .select(*typed_columns("e"))
        .withColumn(_VALID, is_valid_event())
    )
    observation = Observation("celery_delayq_parse")
    # observe() also keeps the optimizer from pushing the validity filter
    # below the parse, which would re-parse the JSON once per referenced field.
    observed = parsed.observe(
        observation,
        F.count_if(F.col(_VALID)).alias("valid"),
        F.count_if(~F.col(_VALID)).alias("malformed"),
    )
    valid = observed.where(F.col(_VALID)).drop(_VALID).persist(StorageLevel.MEMORY_AND_DISK)
    n_valid = valid.count()  # materialises the cache; the observation fires with it
    malformed = int(observation.get.get("malformed") or 0)
    if n_valid == 0:
        valid.unpersist()
        detail = f"{malformed} malformed line(s)" if malformed else "no event lines"
        raise NoValidEventsError(f"no valid events under {path} ({detail})", malformed=malformed)
    return valid, malformed
