"""Every API route through FastAPI's TestClient over a fake Service (``app.dependency_overrides``): no broker.

Each route hands its validated input to one :class:`~celery_delayq.web.service.Service` method, with the
caller and ``via="api"`` for the audit line, and answers that method's result in its model; each of the
package's exceptions a method can raise is answered with its status (and that status is in the route's
OpenAPI ``responses``). The broker tests (test_actions, test_safe_input), schemathesis and the browser
test run the same routes over the real service.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("fastapi")
from celery import Celery  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from celery_delayq.cancels import CancelResult  # noqa: E402
from celery_delayq.cancels.reschedule import CannotReschedule, Rescheduled  # noqa: E402
from celery_delayq.doctor import Finding  # noqa: E402
from celery_delayq.errors import DelayTooLong, PublishError  # noqa: E402
from celery_delayq.inputs import BadInput  # noqa: E402
from celery_delayq.parking import ParkedFilter, ParkedMessage, ParkedMessageNotFound  # noqa: E402
from celery_delayq.parking.errors import UnsafeToBrowse  # noqa: E402
from celery_delayq.index import IndexUnavailable, TaskIdNotFound, TaskNotWaiting  # noqa: E402
from celery_delayq.pending.browse import Page, WaitingFilter  # noqa: E402
from celery_delayq.index.query import PendingTask  # noqa: E402
from celery_delayq.web import WebSettings, create_app  # noqa: E402
from celery_delayq.web.service import get_service  # noqa: E402
from celery_delayq.web.schemas import Bulk, DueSoon, Overview  # noqa: E402
from celery_delayq.inputs import SelectionChanged  # noqa: E402
from celery_delayq.web.service import ParkedPage, Service  # noqa: E402
from celery_delayq.error_groups import ErrorGroup, group_errors  # noqa: E402

TOKEN = "a-token-of-24-characters"
DUE = 4_000_000_000.0  # 2096: always in the future
TASK = PendingTask("t-1", "proj.job", "", "q", "q", DUE, 1, "e-1", "a" * 9000, "{}", "ValueError: no")
PARKED = ParkedMessage("p-1", 1.0, "exhausted", "proj.job", "t-1", 3, 1.0, 2.0, "ValueError", "no", "Traceback",
                       "", "q", headers={"h": b"v"}, properties={"priority": 0}, body=b"x" * 5000)
STATUS_DOC: dict[str, Any] = {
    "schema": 1, "observed_at": "2030-01-01T00:00:00Z", "broker": "amqp://127.0.0.1//",
    "ladder": {"namespace": "dq.2x4", "levels": 2, "radix": 4, "unit_ms": 100, "max_delay": "1.6s", "shards": 1},
    "exists": True, "complete": True, "missing": [], "levels": [], "parking": {}, "unroutable": {},
    "totals": {"waiting": 1, "parked": 1, "unroutable": 0, "held": None}, "next_due_by": None, "all_due_by": None}

LAST_HOUR = {"counts": {"delivered": 7}, "delivered_per_minute": [0] * 59 + [7], "lateness_p50_s": 0.5,
             "lateness_p95_s": 1.0, "lateness_max_s": 2.0, "files": 1, "truncated": False}


class FakeService:
    """What the routes call, recorded; ``fail`` (if set) is raised by every call instead."""

    def __init__(self) -> None:
        self.settings = WebSettings(token=TOKEN, body_max=100)
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.fail: Exception | None = None
        self.context = SimpleNamespace(config=SimpleNamespace(telemetry_dir="/telemetry"))

    def _call(self, name: str, *args: Any, **kwargs: Any) -> None:
        self.calls.append((name, args, kwargs))
        if self.fail is not None:
            raise self.fail

    # the filters are the real service's: pure, and what the routes must reach
    waiting_filter = Service.waiting_filter
    parked_filter = Service.parked_filter

    def overview(self) -> Overview:
        self._call("overview")
        return Overview.model_validate({**STATUS_DOC, "due_soon": DueSoon(next_minute=0, next_hour=1, retries=1),
                                        "last_hour": LAST_HOUR})

    def findings(self) -> list[Finding]:
        self._call("findings")
        return [Finding("broker", "ok", "reachable", "nothing to do", {"version": "4.3"})]

    def waiting(self, match: WaitingFilter, *, offset: int = 0, limit: int = 50) -> Page:
        self._call("waiting", match, offset=offset, limit=limit)
        return Page([TASK], 1, offset, limit, 0.01234)

    def detail(self, task_id: str) -> tuple[PendingTask, list[PendingTask]]:
        self._call("detail", task_id)
        return TASK, [TASK]

    def cancel(self, task_ids: list[str], *, who: str, via: str) -> list[CancelResult]:
        self._call("cancel", task_ids, who=who, via=via)
        return [CancelResult("t-1", DUE + 60, TASK)]

    def reschedule(self, task_id: str, due: str | None, *, who: str, via: str) -> Rescheduled:
        self._call("reschedule", task_id, due, who=who, via=via)
        return Rescheduled(TASK, None if due is None else DUE - 60)

    def cancel_matching(self, fields: dict[str, Any], **kwargs: Any) -> Bulk:
        self._call("cancel_matching", fields, **kwargs)
        return Bulk.of(["t-1"], 0, dry_run=True)

    def parked(self, match: ParkedFilter, *, offset: int = 0, limit: int = 50) -> ParkedPage:
        self._call("parked", match, offset=offset, limit=limit)
        return ParkedPage([PARKED], 1, 2, offset, limit, group_errors([("ValueError", "no")]))

    def error_groups(self, match: WaitingFilter) -> list[ErrorGroup]:
        self._call("error_groups", match)
        return group_errors([("ValueError", "no")])

    def move(self, task_ids: list[str], due: str | None, *, who: str, via: str) -> Bulk:
        self._call("move", task_ids, due, who=who, via=via)
        return Bulk.of(task_ids, len(task_ids), dry_run=False)

    def move_matching(self, fields: dict[str, Any], due: str | None, **kwargs: Any) -> Bulk:
        self._call("move_matching", fields, due, **kwargs)
        return Bulk.of(["t-1"], 0 if kwargs["dry_run"] else 1, dry_run=kwargs["dry_run"])

    def parked_one(self, parked_id: str) -> ParkedMessage:
        self._call("parked_one", parked_id)
        return PARKED

    def replay(self, fields: dict[str, Any], **kwargs: Any) -> Bulk:
        self._call("replay", fields, **kwargs)
        return Bulk.of(["p-1"], 1, dry_run=False)

    def delete_parked(self, fields: dict[str, Any], **kwargs: Any) -> Bulk:
        self._call("delete_parked", fields, **kwargs)
        return Bulk.of(["p-1"], 1, dry_run=False)


@pytest.fixture
def fake() -> FakeService:
    return FakeService()


@pytest.fixture
def api(fake: FakeService) -> TestClient:
    web = create_app(Celery("routes", broker="amqp://guest:guest@127.0.0.1:1//"), settings=fake.settings)
    web.dependency_overrides[get_service] = lambda: fake
    return TestClient(web, headers={"Authorization": f"Bearer {TOKEN}"}, raise_server_exceptions=False)


WHO = {"who": "token:", "via": "api"}  # the start of the fingerprint the audit line names

#: Each route, a request it takes, and the service call it makes.
ROUTES: list[tuple[str, str, dict[str, Any] | None, str]] = [
    ("get", "/api/overview", None, "overview"),
    ("get", "/api/doctor", None, "findings"),
    ("get", "/api/waiting?task=proj.*&retries=true&offset=5&limit=10", None, "waiting"),
    ("get", "/api/waiting/t-1", None, "detail"),
    ("post", "/api/waiting/cancel", {"task": "proj.*"}, "cancel_matching"),
    ("get", "/api/waiting/groups?task=proj.*", None, "error_groups"),
    ("post", "/api/waiting/move", {"error": "ValueError", "dry_run": False, "expect": 1, "due": "10m"}, "move_matching"),
    ("post", "/api/waiting/move-selected", {"ids": ["t-1", "t-2"]}, "move"),
    ("post", "/api/waiting/t-1/cancel", None, "cancel"),
    ("post", "/api/waiting/t-1/run-now", None, "reschedule"),
    ("post", "/api/waiting/t-1/reschedule", {"due": "10m"}, "reschedule"),
    ("get", "/api/parked?exception=*Error&limit=7", None, "parked"),
    ("get", "/api/parked/p-1", None, "parked_one"),
    ("post", "/api/parked/replay", {"all": True, "dry_run": False, "expect": 1, "delay": "5m"}, "replay"),
    ("post", "/api/parked/delete", {"ids": ["p-1"], "dry_run": False, "expect": 1}, "delete_parked"),
    ("delete", "/api/parked/p-1", None, "delete_parked"),
]


def _send(api: TestClient, method: str, path: str, body: dict[str, Any] | None) -> Any:
    return api.request(method.upper(), path, json=body)


#: What an open page polls and the overview's charts read (test_shell.py): not the service's.
LIVE_ROUTES = {("get", "/api/changes"), ("get", "/api/series")}


def test_every_route_is_listed_here(api: TestClient) -> None:
    doc = api.get("/api/openapi.json").json()
    listed = {(method, path.split("?")[0].replace("t-1", "{task_id}").replace("p-1", "{parked_id}"))
              for method, path, _, _ in ROUTES} | LIVE_ROUTES
    assert {(m, p) for p, ops in doc["paths"].items() for m in ops} == listed


def test_reads_answer_the_service_in_their_models(api: TestClient, fake: FakeService) -> None:
    over = api.get("/api/overview").json()
    assert over["schema"] == 1 and over["due_soon"] == {"next_minute": 0, "next_hour": 1, "retries": 1}
    assert api.get("/api/doctor").json() == [{"check": "broker", "status": "ok", "summary": "reachable",
                                              "next_step": "nothing to do", "details": {"version": "4.3"}}]
    page = api.get("/api/waiting", params={"task": "proj.*", "retries": "true", "offset": 5, "limit": 10}).json()
    assert (page["total"], page["offset"], page["limit"], page["read_s"]) == (1, 5, 10, 0.012)
    [item] = page["items"]
    assert item["task_id"] == "t-1" and item["retry"] is True and item["in_s"] > 0
    assert item["args"] == TASK.argsrepr[:100] + "…"  # cut at delayq_web_body_max
    name, (match,), kwargs = fake.calls[-1]
    assert name == "waiting" and kwargs == {"offset": 5, "limit": 10}
    assert match == WaitingFilter(task="proj.*", retries_only=True)
    assert api.get("/api/waiting/t-1").json()["task_id"] == "t-1"
    parked = api.get("/api/parked", params={"exception": "*Error", "limit": 7}).json()
    assert (parked["total"], parked["matched"], [p["parked_id"] for p in parked["items"]]) == (2, 1, ["p-1"])
    assert fake.calls[-1] == ("parked", (ParkedFilter(exception="*Error"),), {"offset": 0, "limit": 7})
    detail = api.get("/api/parked/p-1").json()
    assert detail["body"] == "x" * 100 and detail["body_truncated"] is True and detail["headers"] == {"h": "v"}


def test_actions_pass_the_input_the_caller_and_via(api: TestClient, fake: FakeService) -> None:
    moved = api.post("/api/waiting/t-1/reschedule", json={"due": "10m"}).json()
    assert moved["task_id"] == "t-1" and moved["run_now"] is False and moved["due"]
    assert api.post("/api/waiting/t-1/run-now").json()["run_now"] is True
    assert api.post("/api/waiting/t-1/cancel").json()["waiting"] is True
    bulk = api.post("/api/waiting/cancel", json={"task": "proj.*"}).json()
    assert bulk == {"matched": 1, "done": 0, "dry_run": True, "ids": ["t-1"]}
    assert api.post("/api/parked/replay", json={"all": True, "dry_run": False, "expect": 1, "delay": "5m"}
                    ).json()["done"] == 1
    assert api.delete("/api/parked/p-1").json()["done"] == 1
    calls = {name: (args, kwargs) for name, args, kwargs in fake.calls}
    for name, (_, kwargs) in calls.items():
        if "via" in kwargs:
            assert kwargs["via"] == "api" and kwargs["who"].startswith("token:"), (name, kwargs)
    assert calls["cancel_matching"] == (
        ({"task": "proj.*", "queue": None, "id": None, "args": None, "due_after": None, "due_before": None,
          "retries": False, "error": None, "message": None},),
        {"everything": False, "dry_run": True, "expect": None, "who": calls["cancel_matching"][1]["who"], "via": "api"})
    assert calls["replay"][1]["delay"] == "5m" and calls["replay"][1]["everything"] is True
    # one parked message by id: found first (a prefix names its whole id), then deleted exactly
    assert calls["delete_parked"][0] == ({"ids": ["p-1"]},) and calls["delete_parked"][1]["expect"] == 1


#: The package's exceptions and the status each is answered with.
REFUSALS: list[tuple[Exception, int]] = [
    (BadInput("due: empty"), 400),
    (TaskNotWaiting("no task 't-1' is waiting"), 404),
    (TaskIdNotFound(["t-1"], "the index"), 404),
    (ParkedMessageNotFound("no parked message 'p-1'"), 404),
    (SelectionChanged("the selection now matches 2, not the 1 confirmed"), 409),
    (CannotReschedule("its arguments are not in the index"), 409),
    (UnsafeToBrowse("a delivery limit"), 409),
    (DelayTooLong("beyond delayq_max_delay"), 422),
    (IndexUnavailable("no index stream"), 503),
    (PublishError("not confirmed"), 503),
    (ConnectionRefusedError("connection refused"), 503),
]


@pytest.mark.parametrize("exc,status", REFUSALS, ids=[type(e).__name__ for e, _ in REFUSALS])
@pytest.mark.parametrize("method,path,body,call", ROUTES, ids=[f"{m} {p.split('?')[0]}" for m, p, _, _ in ROUTES])
def test_each_exception_is_answered_with_its_status(api: TestClient, fake: FakeService, exc: Exception, status: int,
                                                     method: str, path: str, body: dict[str, Any] | None,
                                                     call: str) -> None:
    fake.fail = exc
    r = _send(api, method, path, body)
    assert r.status_code == status, r.text
    assert r.json() == {"error": (f"the broker or the index is not available: {exc}" if status == 503 else str(exc)),
                        "status": status}


def test_each_status_a_route_can_answer_is_in_its_openapi_responses(api: TestClient) -> None:
    """What each route's service call can raise (by what it does), and that the route documents it."""
    can_raise = {"overview": {503}, "findings": {503}, "waiting": {400, 503}, "detail": {400, 404, 503},
                 "cancel": {400, 404, 503}, "reschedule": {400, 404, 409, 422, 503},
                 "cancel_matching": {400, 409, 503}, "error_groups": {400, 503},
                 "move_matching": {400, 409, 422, 503}, "move": {400, 404, 409, 422, 503}, "parked": {400, 409, 503}, "parked_one": {400, 404, 409, 503},
                 "replay": {400, 409, 422, 503}, "delete_parked": {400, 404, 409, 503}}
    doc = api.get("/api/openapi.json").json()
    for method, path, _, call in ROUTES:
        template = path.split("?")[0].replace("t-1", "{task_id}").replace("p-1", "{parked_id}")
        answers = {int(code) for code in doc["paths"][template][method]["responses"]}
        assert can_raise[call] <= answers, (method, template, can_raise[call] - answers)


def test_an_unmapped_error_is_a_500_not_a_refusal(api: TestClient, fake: FakeService) -> None:
    """Only the package's own refusals are 4xx: a ValueError from a bug is not "bad input"."""
    fake.fail = ValueError("a bug")
    assert api.get("/api/waiting/t-1").status_code == 500
    fake.fail = KeyError("a bug")
    assert api.post("/api/waiting/t-1/cancel").status_code == 500


def test_input_is_checked_before_the_service_acts(api: TestClient, fake: FakeService) -> None:
    assert api.get("/api/waiting", params={"due_after": "soonish"}).status_code == 400  # the real filter builder
    assert api.get("/api/waiting", params={"limit": 501}).json()["error"].startswith("limit: 501 is more than")
    assert api.get("/api/parked", params={"limit": 0}).status_code == 422
    assert api.post("/api/waiting/cancel", json={"dry_run": "false"}).status_code == 422  # strict booleans
    assert api.post("/api/parked/delete", json={"nope": 1}).status_code == 422
    assert [name for name, _, _ in fake.calls] == []


def test_the_pages_show_the_same_service(api: TestClient, fake: FakeService) -> None:
    """The HTML views take the service through the same dependency (the overview shows the API's document)."""
    text = api.get("/").text
    assert "Delivered 7" in text and "peak 7/min" in text and "reachable" in text
    assert "proj.job" in api.get("/waiting", params={"task": "proj.*"}).text
    assert fake.calls[-1][1] == (WaitingFilter(task="proj.*"),)
    assert "not a time" in api.get("/retries", params={"due_after": "soonish"}).text  # the red line, not a 400
    assert "p-1" in api.get("/parked", params={"exception": "*Error"}).text
