"""``python -m celery_delayq.analytics`` and ``celery -A APP delayq report``: the telemetry report's command.

One click command, which the CLI registers as ``delayq report``. It imports neither the CLI (the value types of
:mod:`celery_delayq.options` are shared) nor pyspark until the job runs: ``--help`` is fast, and an empty or
missing events directory is answered before any JVM starts. The events directory defaults to the app's
``delayq_telemetry_dir``; with the app, the report opens with what the broker holds now (``delayq status``).
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import click

from ..glue.app_ladder import AppLadder, ladder_for
from ..options import Moment
from ..typing import CeleryApp

__all__ = ["report_command", "live_state", "main"]


#: Report windows look back: ``--since 6h`` is six hours ago.
_WINDOW = Moment("ago")


def _operator_name(ctx: click.Context, app: Any) -> str:
    """How the operator names the app: ``celery``'s ``-A`` when run under it, else the app's ``main``, else APP."""
    given = ctx.find_root().params.get("app")
    main = getattr(app, "main", None)
    return given.strip() if isinstance(given, str) and given.strip() else main if main and main != "__main__" else "APP"


def _parse_conf(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, str]:
    conf: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", ctx=ctx, param=param)
        conf[key.strip()] = value
    return conf


def _app_of(ctx: click.Context, app_name: str | None) -> Any:
    """The Celery app: ``-A`` here, else the one ``celery -A`` gave the parent command (None if neither)."""
    if app_name:
        from celery.app.utils import find_app

        try:
            return find_app(app_name)
        except Exception as exc:  # ModuleNotFoundError, AttributeError, ...
            raise click.BadParameter(f"cannot load the app {app_name!r}: {exc}", param_hint="-A/--app") from exc
    found: click.Context | None = ctx
    while found is not None:
        app = getattr(found.obj, "app", None)
        if app is not None:
            return app
        found = found.parent
    return None


def live_state(app: CeleryApp, name: str = "APP") -> dict[str, Any]:
    """What the broker holds now for ``app``'s ladder: ``delayq status --json``'s document, or why not.

    ``name`` is how the operator names the app (``-A``), for the report's hints
    (the document's ``app``). Never raises: the history is worth writing even
    when the broker is down; the report then says so instead of showing stale numbers.
    """
    from ..rabbitmq.status import ladder_status

    context = ladder_for(app)
    try:
        with context.connected() as raw:
            doc = ladder_status(context, raw)
    except Exception as exc:  # broker down, refused, not AMQP: say it in the report
        return {"error": f"{type(exc).__name__}: {exc}", "broker": _safe_uri(context), "app": name}
    return {**doc, "app": name}


def _safe_uri(context: AppLadder) -> str:
    try:
        return context.uri
    except Exception:
        return "the app's broker"


@click.command(name="report")
@click.option("--events", "events_dir", default=None, type=click.Path(path_type=str),
              help="Telemetry directory (read recursively). Default: the app's delayq_telemetry_dir.")
@click.option("-A", "--app", "app_name", default=None, metavar="MODULE:APP",
              help="Celery app whose delayq_telemetry_dir to read (when not run as `celery -A APP`).")
@click.option("--out", "out_dir", default="delayq-report", show_default=True,
              type=click.Path(file_okay=False, dir_okay=True, writable=True, path_type=Path),
              help="Output directory for summary.json, Parquet tables, PNGs and report.html.")
@click.option("--since", metavar="WHEN", type=_WINDOW, default=None, help=_WINDOW.help("Only events at or after"))
@click.option("--until", metavar="WHEN", type=_WINDOW, default=None, help=_WINDOW.help("Only events before"))
@click.option("--incremental", is_flag=True,
              help="Parse each JSON file once: finished hours are kept as Parquet in --out "
              "and later runs read only the new files (for cron).")
@click.option("--live/--no-live", default=True, show_default=True,
              help="Open the report with what the broker holds now (needs the app; skipped if unreachable).")
@click.option("--master", default="local[*]", show_default=True, help="Spark master URL.")
@click.option("--conf", "conf", multiple=True, metavar="KEY=VALUE", callback=_parse_conf,
              help="Extra Spark setting (repeatable); overrides the job's defaults, "
              "e.g. --conf spark.sql.shuffle.partitions=32.")
@click.option("-v", "--verbose", is_flag=True, help="Log job timings and show Spark's own log on stderr.")
@click.pass_context
def report_command(ctx: click.Context, events_dir: str | None, app_name: str | None, out_dir: Path,
                   since: float | None, until: float | None, incremental: bool, live: bool, master: str,
                   conf: dict[str, str], verbose: bool) -> None:
    """Summarise delayed-task telemetry: what is held now, failures, parked, backlog, lateness, retries."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    app = _app_of(ctx, app_name)
    if events_dir is None:
        if app is None:
            raise click.UsageError("no events directory: give --events DIR, or -A MODULE:APP "
                                   "(or run it as `celery -A APP delayq report`) to read the "
                                   "app's delayq_telemetry_dir")
        from ..config import DelayqConfig

        events_dir = DelayqConfig.from_app(app).telemetry_dir
        if not events_dir:
            raise click.UsageError("the app has no delayq_telemetry_dir (telemetry is off): "
                                   "set it, or give --events DIR")
    if since is not None and until is not None and since >= until:
        raise click.BadParameter("--since must be before --until", param_hint="--since")

    # Answer "nothing there" before pyspark is even imported.
    from ..analytics.errors import AnalyticsError
    from ..telemetry.files import EventsNotFoundError, is_local, list_event_files

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
        from ..analytics.job import run_report
    except ImportError as exc:
        raise click.ClickException(f"the report needs pyspark: pip install 'celery_delayq[analytics]' ({exc})") from exc
    started = time.perf_counter()
    name = app_name or _operator_name(ctx, app)
    now = live_state(app, name) if (live and app is not None) else None
    live_s = time.perf_counter() - started
    try:
        summary = run_report(events_dir, out_dir, master=master, conf=conf, since=since, until=until,
                             incremental=incremental, live=now, quiet=not verbose)
    except (AnalyticsError, EventsNotFoundError) as exc:
        raise click.ClickException(str(exc)) from exc
    _echo_summary(name, summary, out_dir, live_s if now is not None else None)


def _echo_summary(name: str, summary: dict[str, Any], out_dir: Path, live_s: float | None) -> None:
    overall = summary["overall"]

    def ms(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.1f} ms"

    click.echo(f"report: {out_dir / 'report.html'}")
    now = summary.get("live")
    if now and "error" not in now:
        totals = now["totals"]
        click.echo(f"now: waiting {totals['waiting']:,}, held {_n(totals.get('held'))}, parked {totals['parked']:,}, "
                   f"unroutable {totals['unroutable']:,} (from {now['broker']})")
    elif now:
        click.echo(f"now: not shown, the broker did not answer ({now['error']})".replace("celery -A APP ",
                                                                                         f"celery -A {name} "))
    click.echo("events: " + ", ".join(
        f"{k}={overall[k]}" for k in ("scheduled", "delivered", "succeeded", "retried", "failed", "parked",
                                      "exhausted", "replayed", "cancelled"))
        + f"; malformed lines: {summary['malformed']}")
    failures = int(overall.get("failed") or 0) + int(overall.get("parked") or 0)
    if failures:
        click.echo(f"FAILURE (Celery): {failures} ({overall['parked']} parked, {overall['failed']} failed, not parked)")
    click.echo(f"lateness: p50 {ms(overall['lateness_p50_ms'])}, p99 {ms(overall['lateness_p99_ms'])}")
    for storm in summary["retry_storms"]:
        start = datetime.fromtimestamp(storm["start_s"], tz=timezone.utc).strftime("%Y-%m-%d %H:%M")
        click.echo(f"retry storm: {storm['task_name']} from {start} UTC, "
                   f"peak {storm['peak_per_minute']}/min (normal {storm['baseline_per_minute']:g}/min)")
    stages = dict(summary.get("timings_s", {}))
    if live_s is not None:
        stages = {"broker now": live_s, **stages}
    if stages:
        click.echo("took: " + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in stages.items()))


def _n(value: int | None) -> str:
    return "unknown (no management API)" if value is None else f"{value:,}"


def main() -> None:
    """Entry point for ``python -m celery_delayq.analytics``."""
    report_command(prog_name="python -m celery_delayq.analytics")
