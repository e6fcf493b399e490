"""The telemetry event schema as Spark sees it, and what makes a line valid.

The contract is defined by :mod:`celery_delayq.telemetry.recorder`; this
module only translates it into a Spark schema and a boolean validity column,
so that parsing never depends on schema inference (slow, and ANSI mode makes
inferred types brittle) and malformed counting is exact.

A line is **valid** when it is a JSON object whose

* ``event`` is one of the event names (:data:`EVENT_TYPES`),
* ``task_id``, ``task_name``, ``queue`` are present and not null,
* ``attempt`` is a JSON integer >= 0,
* ``ts`` is a finite JSON number,
* ``delay_s`` and ``due_at`` are finite numbers for ``scheduled``/``delivered``,
* ``exception`` is present for ``retried``/``exhausted``/``parked``/``failed``.

Anything else (not JSON, not an object, a required field missing or null,
``"attempt": "3"``, ``"ts": "1.5"``, a fractional attempt, ``"NaN"``...) is
malformed.  Numeric fields get their strictness from the typed parse.  Text
fields take any JSON scalar as its text (``"task_id": 42`` is task ``"42"``):
Spark's JSON source reads them as strings, and no producer of ours writes
other types.  VARIANT fields in the schema could check the JSON type again:
back to back on 10M events the earlier VARIANT parse cost no more than this
one (an isolated experiment that said 3.7 times was wrong).  Fields a given event
doesn't need are not checked, and unknown fields are ignored.  Blank lines are
not events and are skipped, not counted.
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import (
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from celery_delayq.telemetry.events import DELAY_EVENTS, EVENT_TYPES, FAILURE_EVENTS

__all__ = [
    "EVENT_COLUMNS",
    "EVENT_SCHEMA",
    "EVENT_TYPES",
    "PARSE_SCHEMA",
    "STRICT_STRING_TYPES",
    "is_valid_event",
    "typed_columns",
]

#: The typed columns of a parsed event (what the valid-events frame holds).
EVENT_SCHEMA = StructType(
    [
        StructField("event", StringType()),
        StructField("task_id", StringType()),
        StructField("task_name", StringType()),
        StructField("queue", StringType()),
        StructField("attempt", LongType()),
        StructField("ts", DoubleType()),
        StructField("delay_s", DoubleType()),
        StructField("due_at", DoubleType()),
        StructField("exception", StringType()),
    ]
)
EVENT_COLUMNS: tuple[str, ...] = tuple(field.name for field in EVENT_SCHEMA.fields)

#: Whether text fields' JSON types are checked (no: see the module docstring).
STRICT_STRING_TYPES = False

#: Schema handed to ``from_json``.
PARSE_SCHEMA = EVENT_SCHEMA


def typed_columns(struct: str) -> list[Column]:
    """Columns of :data:`EVENT_SCHEMA` from a ``from_json(..., PARSE_SCHEMA)`` struct."""
    return [F.col(f"{struct}.{name}").alias(name) for name in EVENT_COLUMNS]


_INF = float("inf")


def _finite(name: str) -> Column:
    # Spark orders NaN above +inf, so one comparison rejects null, NaN and +/-inf.
    return F.abs(F.col(name)) < F.lit(_INF)


def is_valid_event() -> Column:
    """Boolean column: does the parsed row satisfy the event contract?

    Never null (null inputs evaluate to ``False``), so it can be both
    filtered on and counted.
    """
    event = F.col("event")
    core = (
        event.isin(*EVENT_TYPES)
        # Null here means missing, JSON null or the wrong JSON type.
        & F.col("task_id").isNotNull()
        & F.col("task_name").isNotNull()
        & F.col("queue").isNotNull()
        & (F.col("attempt") >= 0)
        & _finite("ts")
    )
    needs_delay = event.isin(*sorted(DELAY_EVENTS))
    needs_exception = event.isin(*sorted(FAILURE_EVENTS))
    per_event = (
        F.when(needs_delay, _finite("delay_s") & _finite("due_at"))
        .when(needs_exception, F.col("exception").isNotNull())
        .otherwise(F.lit(True))
    )
    return F.coalesce(core & per_event, F.lit(False))
