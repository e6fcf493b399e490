"""SparkSession creation with defaults tuned for a one-shot, single-box report."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from pyspark import SparkContext
from pyspark.sql import SparkSession

from celery_delayq.analytics.errors import AnalyticsError

__all__ = ["create_session", "default_conf", "session_scope"]

logger = logging.getLogger(__name__)

_GIB = 1024**3
_PARALLEL_GC = "-XX:+UseParallelGC"


def _default_driver_memory() -> str:
    """Half the machine's RAM, between 1g and 4g (the local driver holds the cached events)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return "2g"
    return f"{max(1, min(4, total // 2 // _GIB))}g"


def default_conf() -> dict[str, str]:
    """Spark settings applied when this package creates the session (why: docs/report.md)."""
    conf = {
        "spark.sql.shuffle.partitions": "8",  # the aggregates are tiny
        "spark.sql.adaptive.enabled": "true",
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.inMemoryColumnarStorage.compressed": "false",
    }
    if "SPARK_DRIVER_MEMORY" not in os.environ:  # an explicit one wins
        conf["spark.driver.memory"] = _default_driver_memory()
    conf["spark.driver.extraJavaOptions"] = _PARALLEL_GC
    conf["spark.executor.extraJavaOptions"] = _PARALLEL_GC
    return conf


@contextmanager
def _output_to(log: Path | None) -> Iterator[None]:
    """Send this process's file descriptors 1 and 2 to ``log`` meanwhile (restored on exit).

    The driver JVM started meanwhile inherits them: all it ever prints lands in ``log``.
    """
    if log is None:
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    target = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(target, 1)
        os.dup2(target, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, target):
            os.close(fd)


def create_session(master: str = "local[*]", conf: Mapping[str, str] | None = None,
                   app_name: str = "celery-delayq-report", *, log: Path | None = None) -> SparkSession:
    """Create (or reuse) a SparkSession with :func:`default_conf` and ``conf`` on top.

    JVM settings apply only if no JVM runs yet. With ``log``, the JVM's output goes there
    (:func:`_output_to`) and Spark logs errors only.
    """
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in {**default_conf(), **(conf or {})}.items():
        builder = builder.config(key, value)
    if log is not None and master.startswith("local") and "SPARK_LOCAL_IP" not in os.environ:
        # A local job talks to itself: no hostname lookup (nor its warning).
        os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    try:
        with _output_to(log):
            session = builder.getOrCreate()
    except Exception as exc:
        if log is None:
            raise
        # Its reason is in the log we hid it in: show the end of it.
        tail = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-15:] if log.exists() else []
        raise AnalyticsError("Spark did not start (is Java 17+ installed?): " + str(exc).strip()
                             + ("\n" + "\n".join(tail) if tail else "") + f"\n(full log: {log})") from exc
    if log is not None:
        session.sparkContext.setLogLevel("ERROR")
    return session


@contextmanager
def session_scope(master: str = "local[*]", spark: SparkSession | None = None,
                  conf: Mapping[str, str] | None = None, *, log: Path | None = None) -> Iterator[SparkSession]:
    """Yield ``spark`` if given, else a session that is stopped on exit (an active one is reused, left running)."""
    if spark is not None:
        yield spark
        return
    active = SparkSession.getActiveSession()
    if active is None and SparkContext._active_spark_context is not None:  # another thread's: not ours to stop
        active = SparkSession.builder.getOrCreate()
    if active is not None:
        logger.info("reusing the running SparkSession; master %s is ignored", master)
        yield active
        return
    created = create_session(master, conf, log=log)
    try:
        yield created
    finally:
        created.stop()
