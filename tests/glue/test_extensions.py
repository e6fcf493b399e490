"""The extensions install() assembles: their names, their state on the ladder, the setting that leaves one out.

No broker: install() and uninstall() hook the app and its worker blueprint and
connect to nothing; the hooks are called here as the glue calls them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest
from celery import Celery

from celery_delayq import install, ladder_for, uninstall
from celery_delayq.cancels.extension import CancelsExtension
from celery_delayq.cancels.worker import CancelStep, follower_for
from celery_delayq.glue.app_ladder import AppLadder
from celery_delayq.glue.extensions import EXTENSIONS, Extension, ExtensionMissing
from celery_delayq.glue.takeover import TakeoverStep
from celery_delayq.telemetry import attach, detach, subscription_for
from celery_delayq.telemetry.subscriber import TelemetryExtension


@pytest.fixture()
def app() -> Iterator[Celery]:
    app = Celery("extensions", broker="amqp://guest:guest@127.0.0.1:1//", set_as_current=False)
    yield app
    uninstall(app)


def test_install_assembles_the_named_extensions_in_order(app: Celery) -> None:
    ladder = install(app)
    assert ladder.extensions.names == list(EXTENSIONS) == ["takeover", "cancels", "parking", "telemetry", "metrics"]
    assert isinstance(ladder.extensions["cancels"], CancelsExtension)
    assert {TakeoverStep, CancelStep} <= set(app.steps["consumer"])
    assert install(app).extensions.names == list(EXTENSIONS)  # idempotent: no second set
    uninstall(app)
    assert not ladder.extensions and not ladder.installed
    assert not {TakeoverStep, CancelStep} & set(app.steps["consumer"])


def test_a_disabled_extension_is_left_out_with_its_worker_step(app: Celery) -> None:
    app.conf.delayq_disabled_extensions = ["takeover"]
    ladder = install(app)
    assert "takeover" not in ladder.extensions.names and "cancels" in ladder.extensions.names
    assert TakeoverStep not in app.steps["consumer"] and CancelStep in app.steps["consumer"]
    assert ladder.config.disabled_extensions == ("takeover",)


def test_a_misspelt_extension_name_is_refused(app: Celery) -> None:
    app.conf.delayq_disabled_extensions = ["takeovr"]
    with pytest.raises(ValueError, match="takeovr"):
        install(app)


def test_each_extension_says_what_it_does(app: Celery) -> None:
    ladder = install(app)
    lines = {name: ext.describe(ladder) for name, ext in ladder.extensions.items()}
    assert lines["telemetry"].startswith("off") and lines["metrics"].startswith("off")
    assert "delayq.parking" in lines["parking"]


def test_telemetry_keeps_its_subscription_on_the_ladder(app: Celery, tmp_path: Path) -> None:
    app.conf.delayq_telemetry_dir = str(tmp_path)
    ladder = install(app)
    extension = ladder.extensions["telemetry"]
    assert isinstance(extension, TelemetryExtension)
    assert extension.subscription is not None and subscription_for(app) is extension.subscription
    assert extension.describe(ladder) == f"recording events under {tmp_path}"  # the setting
    uninstall(app)
    assert extension.subscription is None and subscription_for(app) is None


def test_telemetry_attached_without_install_adds_its_extension(tmp_path: Path) -> None:
    app = Celery("attached", set_as_current=False)

    class Config:
        telemetry_dir = str(tmp_path)
        parking_queue_name = "delayq.parking"

    subscription = attach(app, Config())  # type: ignore[arg-type]
    try:
        assert ladder_for(app).extensions.names == ["telemetry"] and subscription_for(app) is subscription
        uninstall(app)  # not installed: the subscription stays findable
        assert subscription_for(app) is subscription
    finally:
        detach(app)
    assert subscription_for(app) is None


def test_the_cancel_follower_is_the_cancels_extensions_state(app: Celery) -> None:
    ladder = install(app)
    extension = ladder.extensions["cancels"]
    assert isinstance(extension, CancelsExtension) and follower_for(app) is None

    class Book:
        def cancelled(self, task_id: str) -> bool:
            return task_id == "gone"

    class Follower:
        book = Book()
        stopped = False

        def stop(self) -> None:
            self.stopped = True

    follower = Follower()
    extension.follower = follower  # type: ignore[assignment]
    assert follower_for(app) is follower
    assert ladder.extensions.cancelled(ladder, "gone") and not ladder.extensions.cancelled(ladder, "here")
    uninstall(app)
    assert follower.stopped and extension.follower is None


def test_a_request_is_dropped_when_an_extension_says_so(app: Celery) -> None:
    ladder = install(app)
    asked: list[Any] = []

    class Veto(Extension[AppLadder]):
        name = "veto"

        def request_revoked(self, ladder: AppLadder, request: Any) -> bool:
            asked.append(request)
            return request == "drop"

    ladder.extensions.add(Veto())
    assert ladder.extensions.request_revoked(ladder, "drop")
    assert not ladder.extensions.request_revoked(ladder, "keep")
    assert asked == ["drop", "keep"]  # cancels has no follower here: it passes


def test_parking_needs_the_parking_extension(app: Celery) -> None:
    app.conf.delayq_disabled_extensions = ["parking"]
    ladder = install(app)
    with pytest.raises(ExtensionMissing, match="delayq_park=False"):
        ladder.extensions.park(object(), object(), RuntimeError("x"), reason="exhausted",
                               options=None)  # type: ignore[arg-type]


def test_doctor_lists_the_extensions_installed_or_not(app: Celery) -> None:
    from celery_delayq.cli.doctor import extension_lines

    app.conf.delayq_disabled_extensions = "metrics"
    before = extension_lines(app)  # not installed in this process: what install() would build
    assert [line.split(":")[0] for line in before] == ["takeover", "cancels", "parking", "telemetry"]
    install(app)
    assert extension_lines(app) == before
