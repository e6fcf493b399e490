"""The API's OpenAPI document, and a property-based fuzzer (schemathesis) against it: never a 5xx."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("fastapi")
schemathesis = pytest.importorskip("schemathesis")

from celery_delayq.web import WebSettings, create_app  # noqa: E402


@pytest.fixture
def api(make_app: Any) -> Any:
    import celery_delayq

    app = make_app(delayq_enabled=True)
    celery_delayq.install(app).publisher.declare()
    # read-only: the fuzzer may not cancel or replay anything, and every write must still answer 4xx
    return create_app(app, settings=WebSettings(token="tok", read_only=True))


def test_openapi_document_lists_every_endpoint(api: Any) -> None:
    from fastapi.testclient import TestClient

    doc = TestClient(api, headers={"Authorization": "Bearer tok"}).get("/api/openapi.json").json()
    paths = set(doc["paths"])
    assert {"/api/overview", "/api/waiting", "/api/waiting/{task_id}", "/api/waiting/{task_id}/run-now",
            "/api/waiting/{task_id}/reschedule", "/api/waiting/cancel", "/api/parked", "/api/parked/{parked_id}",
            "/api/parked/replay", "/api/parked/delete"} <= paths
    assert not any(p.startswith("/actions") or p == "/" for p in paths)  # the HTML forms are not the API


def test_fuzzed_requests_never_get_a_server_error(api: Any) -> None:
    from hypothesis import HealthCheck, given, settings

    schema = schemathesis.openapi.from_asgi("/api/openapi.json", api, headers={"Authorization": "Bearer tok"})
    failures: list[str] = []
    for operation in schema.get_all_operations():
        op = operation.ok()

        @settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(case=op.as_strategy())
        def check(case: Any) -> None:
            response = case.call(headers={"Authorization": "Bearer tok"})
            if response.status_code >= 500:
                failures.append(f"{case.method} {case.formatted_path}: {response.status_code} {response.text[:200]}")
            assert response.status_code < 500
            if response.status_code >= 400:
                assert "error" in response.json()

        check()
    assert not failures


#: What this module checks does not differ between RabbitMQ lines: the 3.10 leg runs it, the 4.3 leg skips it.
pytestmark = pytest.mark.one_broker
