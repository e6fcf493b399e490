"""The API's answers besides 200, each from one of the package's own exceptions (:data:`STATUS`).

Bad input is a 4xx with ``{"error": ..., "status": ...}`` (:class:`~.schemas.Error`) and changes
nothing; every route declares what it can answer (:data:`READ`, :data:`READ_ONE`, :data:`WRITE`), so
the OpenAPI document is the contract a fuzzer checks. docs/web.md ("API") has the table of statuses;
any other exception is a bug, and a 500.
"""

from __future__ import annotations

from typing import Any, Mapping

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.routing import Route

from ..cancels.reschedule import CannotReschedule
from ..errors import DelayTooLong, FormatTooNew, PublishError, TopologyError
from ..inputs import BadInput, SelectionChanged
from ..parking.errors import ParkedMessageNotFound, UnsafeToBrowse
from ..index import AmbiguousTaskId, TaskIdNotFound, TaskNotWaiting
from ..index.stream import StreamReadError
from .schemas import Error

__all__ = ["install_errors", "READ", "READ_ONE", "PARKED_READ", "PARKED_READ_ONE", "WRITE", "STATUS"]

#: The status of each of the package's refusals (Starlette answers an exception by the nearest class in its MRO).
STATUS: dict[type[Exception], int] = {
    BadInput: 400,
    TaskNotWaiting: 404, TaskIdNotFound: 404, ParkedMessageNotFound: 404,
    SelectionChanged: 409, CannotReschedule: 409, AmbiguousTaskId: 409, UnsafeToBrowse: 409,
    DelayTooLong: 422,
    FormatTooNew: 503,  # written by a newer release: this server cannot read it until upgraded
}


def _answers(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {code: {"model": Error} for code in codes}


#: What a read can answer besides 200.
READ = _answers(400, 401, 405, 422, 503)
#: ... a read of one id.
READ_ONE = _answers(400, 401, 404, 405, 422, 503)
#: ... a read of the parking queue (which may not be safe to read: 409).
PARKED_READ = _answers(400, 401, 405, 409, 422, 503)
PARKED_READ_ONE = _answers(400, 401, 404, 405, 409, 422, 503)
#: What an action can answer besides 200.
WRITE = _answers(400, 401, 403, 404, 405, 409, 413, 422, 503)


def _json(status: int, message: str, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message, "status": status}, status_code=status, headers=headers)


def _allowed(request: Request) -> str:
    """Every method of the path a 405 answers (Starlette names only the first route's: GET, not GET and DELETE)."""
    path = request.scope.get("path", "")
    routes = [r for r in request.app.routes if isinstance(r, Route) and r.path_regex.match(path)]
    if not routes:
        return ""
    first = routes[0].path  # the route the router would pick, and its siblings of the same path
    methods = {m for r in routes if r.path == first for m in (r.methods or ())}
    return ", ".join(sorted(methods))


def install_errors(app: FastAPI) -> None:
    """Map bad input and the package's errors to 4xx JSON (and a broker that is down to 503)."""
    from ..rabbitmq.client import CONNECTION_ERRORS, AMQPError

    def answer(status: int) -> Any:
        async def handler(_: Request, exc: Exception) -> JSONResponse:
            return _json(status, str(exc))
        return handler

    async def invalid(_: Request, exc: Exception) -> JSONResponse:
        errors: list[dict[str, Any]] = getattr(exc, "errors", lambda: [])()
        text = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in errors)
        return _json(422, text or "invalid request")

    async def http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = _allowed(request)
        return _json(exc.status_code, str(exc.detail), headers)

    async def unavailable(_: Request, exc: Exception) -> JSONResponse:
        return _json(503, f"the broker or the index is not available: {exc}")

    for refusal, status in STATUS.items():
        app.add_exception_handler(refusal, answer(status))
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(HTTPException, http)
    # IndexUnavailable is a TopologyError.
    for down in (TopologyError, PublishError, StreamReadError, *CONNECTION_ERRORS, AMQPError):
        app.add_exception_handler(down, unavailable)
