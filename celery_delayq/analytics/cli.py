"""Click command for the report job (``python -m celery_delayq.analytics``, ``celery delayq report``).

Kept importable without pyspark, so ``--help`` is fast and an empty or
missing events directory is answered before any JVM starts.  The events
directory defaults to the app's ``delayq_telemetry_dir``: ``celery -A APP
delayq report`` hands its app over (``ctx.obj.app``); standalone, give
``-A module:app``.
"""

from __future__ import annotations

import logging
import re
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import click

from celery_delayq.analytics.errors import AnalyticsError, EventsNotFoundError, NoValidEventsError

__all__ = ["TimeParam", "main", "report_command"]

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|min|h|d|w)\s*$", re.IGNORECASE)
_UNIT_S = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 604800}


class TimeParam(click.ParamType):
    """A moment: ISO 8601 (UTC unless it says otherwise), epoch seconds, or a
    duration before now (``90m``, ``6h``, ``2d``)."""

    name = "time"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, (int, float)):
            return float(value)
        text = str(value).strip()
        match = _DURATION.match(text)
        if match:
            return time.time() - float(match.group(1)) * _UNIT_S[match.group(2).lower()]
        try:
            return float(text)
        except ValueError:
            pass
        try:
            moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            self.fail(f"{value!r} is not a time: use ISO 8601 (2026-11-23T06:00), epoch seconds "
                      "or a duration before now (90m, 6h, 2d)", param, ctx)
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=timezone.utc)
        return moment.timestamp()


def _parse_conf(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> dict[str, str]:
    conf: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", ctx=ctx, param=param)
        conf[key.strip()] = value
    return conf


def _app_of(ctx: click.Context, app_name: str | None) -> Any:
    """The Celery app: ``-A`` here, else the one ``celery -A`` gave the parent command."""
    if app_name:
        from celery.app.utils import find_app

        try:
            return find_app(app_name)
        except Exception as exc:  # ModuleNotFoundError, AttributeError, ...
            raise click.BadParameter(f"cannot load the app {app_name!r}: {exc}",
                                     param_hint="-A/--app") from exc
    while ctx is not None:
        app = getattr(ctx.obj, "app", None)
        if app is not None:
            return app
        ctx = ctx.parent  # type: ignore[assignment]
    return None


def _telemetry_dir(app: Any) -> str | None:
    from celery_delayq.config import DelayqConfig

    return DelayqConfig.from_app(app).telemetry_dir


@click.command(name="report")
@click.option(
    "--events",
    "events_dir",
    default=None,
    type=click.Path(file_okay=True, dir_okay=True, path_type=str),
    help="Telemetry directory (read recursively). Default: the app's delayq_telemetry_dir.",
)
@click.option("-A", "--app", "app_name", default=None, metavar="MODULE:APP",
              help="Celery app whose delayq_telemetry_dir to read (when not run as `celery -A APP`).")
@click.option(
    "--out",
    "out_dir",
    default="delayq-report",
    show_default=True,
    type=click.Path(file_okay=False, dir_okay=True, writable=True, path_type=Path),
    help="Output directory for summary.json, Parquet tables, PNGs and report.html.",
)
@click.option("--since", type=TimeParam(), default=None,
              help="Only events at or after this time (ISO 8601, epoch s, or e.g. 6h = 6 hours ago).")
@click.option("--until", type=TimeParam(), default=None, help="Only events before this time.")
@click.option("--incremental", is_flag=True,
              help="Parse each JSON file once: finished hours are kept as Parquet in --out "
              "and later runs read only the new files (for cron).")
@click.option("--master", default="local[*]", show_default=True, help="Spark master URL.")
@click.option(
    "--conf",
    "conf",
    multiple=True,
    metavar="KEY=VALUE",
    callback=_parse_conf,
    help="Extra Spark setting (repeatable); overrides the job's defaults, "
    "e.g. --conf spark.sql.shuffle.partitions=32.",
)
@click.option("-v", "--verbose", is_flag=True, help="Log job timings.")
@click.pass_context
def report_command(
    ctx: click.Context,
    events_dir: str | None,
    app_name: str | None,
    out_dir: Path,
    since: float | None,
    until: float | None,
    incremental: bool,
    master: str,
    conf: dict[str, str],
    verbose: bool,
) -> None:
    """Summarise delayed-task telemetry: failures, parked, backlog, lateness, retries."""
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if events_dir is None:
        app = _app_of(ctx, app_name)
        if app is None:
            raise click.UsageError("no events directory: give --events DIR, or -A MODULE:APP "
                                   "(or run it as `celery -A APP delayq report`) to read the "
                                   "app's delayq_telemetry_dir")
        events_dir = _telemetry_dir(app)
        if not events_dir:
            raise click.UsageError("the app has no delayq_telemetry_dir (telemetry is off): "
                                   "set it, or give --events DIR")
    if since is not None and until is not None and since >= until:
        raise click.BadParameter("--since must be before --until", param_hint="--since")

    # Answer "nothing there" before pyspark is even imported.
    from celery_delayq.analytics.files import is_local, list_event_files

    if is_local(events_dir) and not incremental:
        try:
            if not list_event_files(events_dir, since=since, until=until):
                raise click.ClickException(f"no telemetry events under {events_dir}"
                                           + (" in that time window" if since or until else "")
                                           + ": nothing to report")
        except EventsNotFoundError as exc:
            raise click.ClickException(f"{exc} (is delayq_telemetry_dir right, and has a "
                                       "worker or publisher written to it yet?)") from exc
    try:
        # Imported here so --help works (and is fast) without pyspark.
        from celery_delayq.analytics.job import run_report
    except ImportError as exc:
        raise click.ClickException(
            f"pyspark is required: pip install 'celery_delayq[analytics]' ({exc})"
        ) from exc
    try:
        summary = run_report(events_dir, out_dir, master=master, conf=conf, since=since,
                             until=until, incremental=incremental)
    except NoValidEventsError as exc:
        raise click.ClickException(str(exc)) from exc
    except AnalyticsError as exc:
        raise click.ClickException(str(exc)) from exc

    overall = summary["overall"]

    def ms(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.1f} ms"

    click.echo(f"report: {out_dir / 'report.html'}")
    click.echo(
        "events: "
        + ", ".join(
            f"{k}={overall[k]}"
            for k in ("scheduled", "delivered", "succeeded", "retried", "failed", "parked",
                      "exhausted", "replayed", "cancelled")
        )
        + f"; malformed lines: {summary['malformed']}"
    )
    click.echo(
        f"lateness: p50 {ms(overall['lateness_p50_ms'])}, p99 {ms(overall['lateness_p99_ms'])}"
    )
    for storm in summary["retry_storms"]:
        start = datetime.fromtimestamp(storm["start_s"], tz=timezone.utc).strftime("%Y-%m-%d %H:%M")
        click.echo(f"retry storm: {storm['task_name']} from {start} UTC, "
                   f"peak {storm['peak_per_minute']}/min (normal {storm['baseline_per_minute']:g}/min)")


def main() -> None:
    """Entry point for ``python -m celery_delayq.analytics``."""
    report_command(prog_name="python -m celery_delayq.analytics")
