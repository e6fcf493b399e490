"""``CheckedTaskMessage`` (``app.amqp.create_task_message`` of an app with the ladder): a countdown becomes the
eta Celery itself would write, from one clock reading, in the app's time zone. Pure: building a message sends
nothing."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from celery import Celery

from celery_delayq.errors import InvalidDelay
from celery_delayq.glue.app_ladder import ladder_for
from celery_delayq.glue.message_check import CheckedTaskMessage

NOW = 1_800_000_000.123456  # 2027-01-15, a winter day: Berlin is UTC+1


def _app(**conf: Any) -> Celery:
    app = Celery("mc", broker="amqp://guest:guest@127.0.0.1:1//", set_as_current=False)
    app.conf.update(delayq_enabled=True, **conf)
    return app


def _celery_eta(app: Celery, countdown: float) -> str:
    """The eta Celery's own protocol writes for ``countdown`` at :data:`NOW` (its ``now`` argument)."""
    build = app.amqp.task_protocols[app.conf.task_protocol]
    now = datetime.fromtimestamp(NOW, tz=app.timezone)
    return str(build("id", "t.job", (), {}, countdown, None, now=now).headers["eta"])


@pytest.mark.parametrize("conf", [{}, {"timezone": "Europe/Berlin"}, {"timezone": "America/New_York", "enable_utc": False},
                                  {"timezone": "Asia/Kolkata"}])
@pytest.mark.parametrize("countdown", [30, 0.5, 86_400 * 400, -5])
def test_a_countdown_becomes_the_eta_celery_writes(conf: dict[str, Any], countdown: float) -> None:
    app = _app(**conf)
    checked = CheckedTaskMessage(app.amqp, ladder_for(app), clock=lambda: NOW)
    ours = checked("id", "t.job", (), {}, countdown=countdown).headers["eta"]
    assert ours == _celery_eta(app, countdown)
    assert datetime.fromisoformat(ours).utcoffset() == datetime.fromtimestamp(NOW, tz=app.timezone).utcoffset()


def test_an_eta_given_with_a_countdown_loses_to_it_as_in_celery() -> None:
    app = _app()
    checked = CheckedTaskMessage(app.amqp, ladder_for(app), clock=lambda: NOW)
    eta = datetime.fromtimestamp(NOW, tz=app.timezone) + timedelta(hours=5)
    assert checked("id", "t.job", (), {}, countdown=30, eta=eta).headers["eta"] == _celery_eta(app, 30)


def test_no_countdown_or_zero_leaves_the_message_undelayed() -> None:
    app = _app()
    checked = CheckedTaskMessage(app.amqp, ladder_for(app), clock=lambda: NOW)
    assert checked("id", "t.job", (), {}).headers["eta"] is None
    assert checked("id", "t.job", (), {}, countdown=0).headers["eta"] is None


@pytest.mark.parametrize("countdown", [float("nan"), "30", True])
def test_a_countdown_that_is_not_seconds_is_refused_before_a_message_exists(countdown: Any) -> None:
    app = _app()
    checked = CheckedTaskMessage(app.amqp, ladder_for(app), clock=lambda: NOW)
    with pytest.raises(InvalidDelay):
        checked("id", "t.job", (), {}, countdown=countdown)
