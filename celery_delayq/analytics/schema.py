"""The telemetry event schema as Spark sees it, and what makes a line valid.

The contract is :mod:`celery_delayq.telemetry.recorder`'s; here it becomes a Spark schema (no inference) and
a validity column (exact malformed counts): docs/report.md ("Malformed lines") has the rules in words. Text
fields take any JSON scalar as its text (no producer of ours writes other types).
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

from celery_delayq.telemetry.events import DELAY_EVENTS, EVENT_TYPES, FAILURE_EVENTS

__all__ = ["EVENT_COLUMNS", "EVENT_SCHEMA", "EVENT_TYPES", "STRICT_STRING_TYPES", "is_valid_event"]

#: The typed columns of a parsed event (what the valid-events frame holds), also the parse schema.
EVENT_SCHEMA = StructType([
    StructField(name, kind()) for name, kind in (
        ("event", StringType), ("task_id", StringType), ("task_name", StringType), ("queue", StringType),
        ("attempt", LongType), ("ts", DoubleType), ("delay_s", DoubleType), ("due_at", DoubleType),
        ("exception", StringType))
])
EVENT_COLUMNS: tuple[str, ...] = tuple(field.name for field in EVENT_SCHEMA.fields)

#: Whether text fields' JSON types are checked (no: see the module docstring).
STRICT_STRING_TYPES = False

_INF = float("inf")


def _finite(name: str) -> Column:
    # Spark orders NaN above +inf, so one comparison rejects null, NaN and +/-inf.
    return F.abs(F.col(name)) < F.lit(_INF)


def is_valid_event() -> Column:
    """Boolean column, never null: does the parsed row satisfy the event contract?"""
    event = F.col("event")
    # Null means missing, JSON null or the wrong JSON type.
    core = (event.isin(*EVENT_TYPES) & F.col("task_id").isNotNull() & F.col("task_name").isNotNull()
            & F.col("queue").isNotNull() & (F.col("attempt") >= 0) & _finite("ts"))
    per_event = (F.when(event.isin(*sorted(DELAY_EVENTS)), _finite("delay_s") & _finite("due_at"))
                 .when(event.isin(*sorted(FAILURE_EVENTS)), F.col("exception").isNotNull())
                 .otherwise(F.lit(True)))
    return F.coalesce(core & per_event, F.lit(False))
