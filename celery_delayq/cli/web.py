"""``celery -A APP delayq web``: serve the operator's page and JSON API (needs the ``web`` extra).

Binds to 127.0.0.1 unless ``--address``/``--host`` says otherwise, which needs authentication; an empty
address and a weak secret are refused before anything is served (docs/web.md). No option takes a secret: a
command line is visible to every user of the host.
"""

from __future__ import annotations

import click

from .base import app_context

__all__ = ["web", "DEFAULT_PORT"]

#: Not Flower's 5555, so both can run side by side.
DEFAULT_PORT = 5580


def _address(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """An address to bind; empty is refused: uvicorn reads it as every interface (an unset ``$HOST``)."""
    if not value.strip():
        raise click.BadParameter("empty; give 127.0.0.1 (this machine only), or 0.0.0.0 / :: (every "
                                 "interface, with authentication)", ctx=ctx, param=param)
    return value


@click.command(name="web")
@click.option("--address", "--host", "address", default="127.0.0.1", show_default=True, callback=_address,
              help="Address to listen on (--host is the same option, as uvicorn and Flower name it).")
@click.option("--port", type=click.IntRange(0, 65535), default=DEFAULT_PORT, show_default=True,
              help="Port to listen on.")
@click.option("--read-only", is_flag=True, help="Show everything, allow no action (the API refuses them too).")
@click.option("--root-path", default="", help="URL prefix when served behind a proxy under a sub-path.")
@click.pass_context
def web(ctx: click.Context, address: str, port: int, read_only: bool, root_path: str) -> None:
    """Serve the page and JSON API of delayed tasks, retries and parked messages."""
    try:
        import uvicorn

        from ..web import WebSettings, create_app
    except ImportError as exc:
        raise click.ClickException(f"the web page needs `pip install celery_delayq[web]` ({exc})") from None
    app = app_context(ctx).app
    settings = WebSettings.from_app(app, read_only=read_only)
    settings.check_binding(address)  # UnsafeBinding is a DelayqError: one line, exit 1
    how = "token" if settings.token else "basic auth" if settings.auth_required else "no authentication"
    click.echo(f"delayq web on http://{address}:{port}{root_path}/ ({how}{', read-only' if read_only else ''})")
    asgi = create_app(app, settings=settings)
    asgi.state.delayq.snapshot.forget(())  # read the index now, in the background, not on the first click
    uvicorn.run(asgi, host=address, port=port, root_path=root_path,
                log_level="warning", access_log=False)
