"""The report job: events directory in, summary + Parquet tables + HTML out."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from celery_delayq.analytics.plots import render_all
from celery_delayq.analytics.reader import check_events_path, read_events
from celery_delayq.analytics.report import render_html
from celery_delayq.analytics.session import session_scope
from celery_delayq.analytics.summary import build_summary
from celery_delayq.analytics.tables import TABLE_NAMES, build_tables

__all__ = ["run_report"]

logger = logging.getLogger(__name__)


def _write_tables(tables: Mapping[str, Any], out: Path) -> None:
    for name, frame in tables.items():
        # Aggregates are small: one file per table is easier to consume and
        # avoids a pile of tiny part files.
        frame.coalesce(1).write.mode("overwrite").parquet((out / name).as_uri())


def _read_back(spark: SparkSession, out: Path) -> dict[str, list[dict[str, Any]]]:
    """Collect the written tables (small) as plain dicts for JSON/plots/HTML.

    Reading the Parquet back instead of collecting the lazy frames means each
    aggregate is computed exactly once, and the JSON/HTML show exactly what
    the Parquet holds.
    """
    rows: dict[str, list[dict[str, Any]]] = {}
    for name in TABLE_NAMES:
        frame = spark.read.parquet((out / name).as_uri())
        if name == "retries_per_minute":
            # Epoch seconds: Python datetimes from collect() depend on the local zone.
            frame = frame.select("task_name", F.unix_seconds("minute").alias("minute_s"), "retries")
        rows[name] = [row.asDict() for row in frame.collect()]
    return rows


def run_report(
    events_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    master: str = "local[*]",
    spark: SparkSession | None = None,
    *,
    conf: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Analyse the telemetry under ``events_dir`` and write the report to ``out_dir``.

    Writes ``summary.json``, one Parquet directory per table (see
    :func:`~celery_delayq.analytics.tables.build_tables`), the three chart
    PNGs and a self-contained ``report.html``.  ``out_dir`` is a local
    directory (created if needed); ``events_dir`` may be any path Spark can
    read.

    Uses ``spark`` if given (left running, its settings untouched); otherwise
    creates a session on ``master`` with the tuned defaults of
    :func:`~celery_delayq.analytics.session.default_conf` plus ``conf``, and
    stops it at the end.

    Returns the summary dict (also written as ``summary.json``).  Raises
    :class:`~celery_delayq.analytics.errors.EventsNotFoundError` or
    :class:`~celery_delayq.analytics.errors.NoValidEventsError`.
    """
    events_dir = check_events_path(events_dir)
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with session_scope(master, spark, conf) as session:
        valid, malformed = read_events(session, events_dir)
        parsed_at = time.perf_counter()
        try:
            _write_tables(build_tables(session, valid), out)
        finally:
            valid.unpersist()
        aggregated_at = time.perf_counter()
        tables = _read_back(session, out)

    summary = build_summary(tables["task_summary"], malformed)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    images = render_all(tables)
    for name, png in images.items():
        (out / name).write_bytes(png)
    (out / "report.html").write_text(
        render_html(summary, tables, images, events_dir=events_dir), encoding="utf-8"
    )
    logger.info(
        "report written to %s: parse+cache %.1fs, aggregates %.1fs, total %.1fs",
        out,
        parsed_at - started,
        aggregated_at - parsed_at,
        time.perf_counter() - started,
    )
    return summary
