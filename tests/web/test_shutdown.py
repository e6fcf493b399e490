"""What `delayq web` keeps open ends with the server (real broker): the kept list's reader process and the
connection the live signal keeps for the parking count."""

from __future__ import annotations

import os
from typing import Any

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from celery_delayq.web import WebSettings, create_app  # noqa: E402
from celery_delayq.web.live import _LIVE  # noqa: E402

TOKEN = "s" * 32


def test_the_reader_process_and_the_live_connection_end_with_the_server(make_app: Any, uid: str) -> None:
    import celery_delayq

    app = make_app(delayq_enabled=True, delayq_parking_queue=f"park.{uid}")
    celery_delayq.install(app).publisher.declare()
    web = create_app(app, settings=WebSettings(token=TOKEN))
    svc = web.state.delayq
    with TestClient(web, headers={"Authorization": f"Bearer {TOKEN}"}) as client:
        assert client.get("/api/changes").status_code == 200  # the live signal: the kept list and the parked count
        live = _LIVE[svc]
        raw, pid = live._raw, svc.reader.pid
        assert raw is not None and raw.connected and pid is not None
    assert svc not in _LIVE and live._raw is None and not raw.connected
    assert svc.reader.pid is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
