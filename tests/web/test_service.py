"""The service's lookups by id (:mod:`celery_delayq.web.service`; pure: the index functions are replaced)."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from celery_delayq.index.priority import urgent_now
from celery_delayq.index.query import PendingTask
from celery_delayq.web import service as service_module
from celery_delayq.web.service import Service
from celery_delayq.web.settings import WebSettings

TASK = PendingTask("t-1", "proj.job", "", "q", "q", 1e10, 0, "e-1")


@pytest.fixture
def svc() -> Service:
    return Service(Celery("svc", broker="amqp://guest:guest@127.0.0.1:1//", set_as_current=False),
                   WebSettings(token="t" * 32))


def test_the_detail_is_one_lookup_and_goes_before_the_background_read(svc: Service,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The detail (page and API) was find_waiting then read_passes: the id's shard read twice, five connections,
    and both starved by the kept list's whole-index read. Now one call, run urgent() (that read pauses)."""
    calls: list[tuple[str, int]] = []

    def waiting_with_passes(connection: Any, layout: Any, task_id: str, *, now: float) -> Any:
        calls.append((task_id, urgent_now()))
        return TASK, [TASK]

    monkeypatch.setattr(service_module, "waiting_with_passes", waiting_with_passes)
    assert svc.detail(" t-1 ".strip()) == (TASK, [TASK])
    assert calls == [("t-1", 1)] and urgent_now() == 0


def test_the_actions_on_chosen_ids_look_them_up_urgent(svc: Service, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, int] = {}

    def find_waiting(connection: Any, layout: Any, ids: Any, *, now: float) -> Any:
        seen["move"] = urgent_now()
        return {i: TASK for i in ids}

    monkeypatch.setattr(service_module, "find_waiting", find_waiting)
    monkeypatch.setattr(service_module, "cancel", lambda app, *ids, **kw: seen.setdefault("cancel", urgent_now()) and [])
    monkeypatch.setattr(service_module, "reschedule",
                        lambda app, task_id, **kw: seen.setdefault("reschedule", urgent_now()))
    monkeypatch.setattr(service_module, "reschedule_many", lambda app, tasks, **kw: [])
    monkeypatch.setattr(service_module, "arguments_of", lambda t: None)
    monkeypatch.setattr(Service, "_acting", lambda self: None)
    monkeypatch.setattr(service_module, "audit", lambda *a, **kw: None)
    svc.cancel(["t-1"], who="me", via="api")
    svc.reschedule("t-1", None, who="me", via="api")
    svc.move(["t-1"], None, who="me", via="api")
    assert seen == {"cancel": 1, "reschedule": 1, "move": 1} and urgent_now() == 0


def test_a_due_time_is_read_once_so_a_slow_index_read_cannot_make_a_move_past_due(
        svc: Service, monkeypatch: pytest.MonkeyPatch) -> None:
    """"3s" is 3 s after the click: the moves check it against that moment. It was read again after the index
    read, which on a busy broker took longer, and the page refused the move as "in the past"."""
    import time

    from celery_delayq.cancels.reschedule import _when

    given: dict[str, Any] = {}

    def slow_find(connection: Any, layout: Any, ids: Any, *, now: float) -> Any:
        time.sleep(1.2)  # the index read on a busy broker
        return {i: TASK for i in ids}

    monkeypatch.setattr(service_module, "find_waiting", slow_find)
    monkeypatch.setattr(service_module, "index_of", lambda app: (None, None))
    monkeypatch.setattr(service_module, "arguments_of", lambda t: None)
    monkeypatch.setattr(service_module, "reschedule_many", lambda app, tasks, **kw: given.update(kw) or [])
    monkeypatch.setattr(Service, "_acting", lambda self: None)
    monkeypatch.setattr(service_module, "audit", lambda *a, **kw: None)
    clicked = time.time()
    svc.move(["t-1"], "1s", who="me", via="page")
    assert clicked <= given["now"] < given["due"] <= given["now"] + 1.001
    assert given["due"] < time.time()  # past by the time the moves run ...
    assert _when(svc.app, given["due"], given["now"]) == given["due"]  # ... and still accepted: it runs at once


def test_the_kept_list_is_read_by_the_reader_process_which_ends_with_the_app() -> None:
    """The whole-index reads run in a child process (the GIL stays the requests'); the server's shutdown
    (FastAPI's lifespan) ends it."""
    import os

    from fastapi.testclient import TestClient

    from celery_delayq.web import create_app

    web = create_app(Celery("svc", broker="amqp://guest:guest@127.0.0.1:1//", set_as_current=False),
                     settings=WebSettings(token="t" * 32))
    svc: Service = web.state.delayq
    assert svc.snapshot._reader is svc.reader and svc.reader.pid is None  # started by the first read only
    with TestClient(web):
        svc.reader._started()
        pid = svc.reader.pid
        assert pid is not None
    assert svc.reader.pid is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
