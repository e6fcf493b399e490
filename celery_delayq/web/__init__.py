"""``celery -A proj delayq web``: the operator's page and JSON API for delayed work, retries and parked tasks.

FastAPI (typed parameters give request validation and the OpenAPI document at ``/api/openapi.json``), Jinja2
pages, static files from the package (no CDN). :func:`create_app` is the ASGI app, to serve with uvicorn or to
mount behind a deployment's own auth. Layout and modules: docs/web.md.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, AsyncIterator

from .settings import BadWebSetting, UnsafeBinding, WeakSecret, WebSettings
from ..typing import CeleryApp

if TYPE_CHECKING:
    from fastapi import FastAPI

__all__ = ["create_app", "WebSettings", "UnsafeBinding", "WeakSecret", "BadWebSetting"]


def create_app(celery_app: CeleryApp, *, settings: WebSettings | None = None, read_only: bool = False) -> FastAPI:
    """The ASGI application of the page and API for ``celery_app``'s ladder.

    Args:
        celery_app: The Celery app (its ``delayq_*`` settings name the ladder and its broker).
        settings: Authentication and limits (default: :meth:`WebSettings.from_app`).
        read_only: Hide every action and refuse every state-changing request.

    Raises:
        WeakSecret: a token or password shorter than 16 characters (from :meth:`WebSettings.from_app`).
        BadWebSetting: a ``delayq_web_*`` number that is not a positive whole number.
    """
    from fastapi import FastAPI, Security
    from fastapi.security import HTTPBasic, HTTPBearer
    from fastapi.staticfiles import StaticFiles

    from . import pages
    from .api import live, overview, parked, waiting
    from .errors import install_errors
    from .security import BodyLimit, SecurityMiddleware
    from .service import Service
    from .live import close_live
    from .session import Sessions

    settings = settings or WebSettings.from_app(celery_app, read_only=read_only)
    svc = Service(celery_app, settings)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            svc.close()  # the reader process goes with the server
            close_live(svc)  # and the connection kept for the parking count

    app = FastAPI(title="celery_delayq", summary="Delayed Celery tasks, retries and parked messages in the ladder",
                  version="1", openapi_url="/api/openapi.json", docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.delayq = svc
    app.state.delayq_settings = settings
    app.state.delayq_sessions = sessions = Sessions(settings)
    install_errors(app)
    # The configured authentication, named in the OpenAPI document (SecurityMiddleware checks it).
    named = [Security(scheme) for scheme, on in ((HTTPBearer(scheme_name="bearer", auto_error=False), settings.token),
             (HTTPBasic(scheme_name="basic", auto_error=False), settings.username and settings.password)) if on]
    for routes in (overview.router, waiting.router, parked.router, live.router):
        app.include_router(routes, dependencies=named)
    app.include_router(pages.router)
    app.mount("/static", StaticFiles(directory=str(Path(__file__).parent / "static")), name="static")
    app.add_middleware(SecurityMiddleware, settings=settings, sessions=sessions)
    app.add_middleware(BodyLimit, limit=settings.body_limit)  # outermost: nothing reads a body over the limit
    return app

