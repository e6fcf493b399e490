"""The API's OpenAPI document: every endpoint, its answers and response models (schemathesis runs against it
in test_schemathesis.py)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("fastapi")

from celery_delayq.web import WebSettings, create_app  # noqa: E402

TOKEN = "a-token-of-24-characters"


@pytest.fixture
def api(make_app: Any) -> Any:
    import celery_delayq

    app = make_app(delayq_enabled=True)
    celery_delayq.install(app).publisher.declare()
    # read-only: the fuzzer may not cancel or replay anything, and every write must still answer 4xx
    return create_app(app, settings=WebSettings(token=TOKEN, read_only=True))


def test_openapi_document_lists_every_endpoint(api: Any) -> None:
    from fastapi.testclient import TestClient

    doc = TestClient(api, headers={"Authorization": "Bearer " + TOKEN}).get("/api/openapi.json").json()
    paths = set(doc["paths"])
    assert {"/api/overview", "/api/waiting", "/api/waiting/{task_id}", "/api/waiting/{task_id}/run-now",
            "/api/waiting/{task_id}/reschedule", "/api/waiting/cancel", "/api/parked", "/api/parked/{parked_id}",
            "/api/parked/replay", "/api/parked/delete"} <= paths
    assert not any(p.startswith("/actions") or p == "/" for p in paths)  # the HTML forms are not the API
    for path, methods in doc["paths"].items():
        for method, op in methods.items():
            answers = set(op["responses"])
            assert {"200", "400", "401", "405", "422", "503"} <= answers, (method, path, answers)
            if method != "get":
                assert {"403", "404", "409", "413"} <= answers, (method, path, answers)
            assert "$ref" in str(op["responses"]["200"]) or "items" in str(op["responses"]["200"]), (method, path)
            assert op["responses"]["400"]["content"]["application/json"]["schema"]["$ref"].endswith("/Error")
    assert doc["components"]["securitySchemes"] == {"bearer": {"type": "http", "scheme": "bearer"}}
    cancel = doc["components"]["schemas"]["CancelFilter"]["properties"]
    assert cancel["dry_run"]["type"] == "boolean" and cancel["all"]["type"] == "boolean" and "expect" in cancel


#: What this module checks does not differ between RabbitMQ lines: the 3.10 leg runs it, the 4.3 leg skips it.
pytestmark = pytest.mark.one_broker
