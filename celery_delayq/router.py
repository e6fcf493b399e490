"""Old home of the per-app ladder (0.1's ``Router``); kept so existing imports work.

The class is :class:`celery_delayq.glue.app_ladder.AppLadder` now: "router" read
as Celery's task router (``task_routes``), which it is not.
"""

from __future__ import annotations

from .glue.app_ladder import AppLadder, native_unwrap

__all__ = ["Router", "native_unwrap"]

#: Old name of :class:`~celery_delayq.glue.app_ladder.AppLadder`.
Router = AppLadder
