"""Click command for the report job (``python -m celery_delayq.analytics``).

Kept importable on its own so another CLI (``celery delayq report``) can
mount :data:`report_command` as a subcommand.
"""

from __future__ import annotations

import logging
from pathlib import Path

import click

from celery_delayq.analytics.errors import AnalyticsError

__all__ = ["main", "report_command"]


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


@click.command(name="report")
@click.option(
    "--events",
    "events_dir",
    required=True,
    type=click.Path(file_okay=True, dir_okay=True, path_type=str),
    help="Telemetry directory (read recursively, e.g. the recorder's root).",
)
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False, dir_okay=True, writable=True, path_type=Path),
    help="Output directory for summary.json, Parquet tables, PNGs and report.html.",
)
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
def report_command(
    events_dir: str, out_dir: Path, master: str, conf: dict[str, str], verbose: bool
) -> None:
    """Summarise delayed-task telemetry: lateness, retries, exceptions, attempts."""
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        # Imported here so --help works (and is fast) without pyspark.
        from celery_delayq.analytics.job import run_report
    except ImportError as exc:
        raise click.ClickException(
            f"pyspark is required: pip install 'celery_delayq[analytics]' ({exc})"
        ) from exc
    try:
        summary = run_report(events_dir, out_dir, master=master, conf=conf)
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
            for k in ("scheduled", "delivered", "succeeded", "retried", "exhausted")
        )
        + f"; malformed lines: {summary['malformed']}"
    )
    click.echo(
        f"lateness: p50 {ms(overall['lateness_p50_ms'])}, p99 {ms(overall['lateness_p99_ms'])}"
    )


def main() -> None:
    """Entry point for ``python -m celery_delayq.analytics``."""
    report_command(prog_name="python -m celery_delayq.analytics")
