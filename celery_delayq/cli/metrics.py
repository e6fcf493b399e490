"""``delayq metrics --port N [--addr A]``: serve Prometheus metrics until interrupted (docs/operations.md).

The broker gauges are read at each scrape (:mod:`celery_delayq.telemetry.metrics`); the event counters of
a standalone exporter stay at 0: ``delayq_metrics_port`` runs the exporter inside each worker for those.
"""

from __future__ import annotations

import threading

import click

from ..telemetry.metrics import serve
from .base import app_context, console

__all__ = ["metrics"]


@click.command()
@click.option("--port", type=click.IntRange(0, 65535), required=True, help="TCP port to serve /metrics on.")
@click.option("--addr", default=None,
              help="Address to bind (default: delayq_metrics_address, 127.0.0.1; 0.0.0.0 serves every interface).")
@click.pass_context
def metrics(ctx: click.Context, port: int, addr: str | None) -> None:
    """Serve the ladder's Prometheus metrics (waiting per level, parked, unroutable) until Ctrl-C."""
    app = app_context(ctx)
    addr = addr or app.config.metrics_address
    try:
        server = serve(app.app, port, addr)
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {addr}:{port}: {exc.strerror or exc}; "
                                   "pick a free port with --port") from None
    console(ctx).print(f"delayq metrics for {app.uri} on http://{addr}:{server.port}/metrics (Ctrl-C stops)")
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
