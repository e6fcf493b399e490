"""``batch(app)``: pipeline the publisher confirms of many delayed publishes.

Inside the block, ``apply_async(countdown=...)`` returns as soon as the
message is written; confirms are collected in the background of the same
connection and awaited when the block ends, which raises
:class:`~celery_delayq.errors.PublishError` if any message was refused.
Confirms are never switched off, only awaited together.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from .app_ladder import ladder_for
from ..typing import CeleryApp

__all__ = ["batch"]


@contextlib.contextmanager
def batch(app: CeleryApp) -> Iterator[None]:
    """Pipeline the confirms of the delayed publishes of ``app`` in this block (its backend's ``batch()``)."""
    with ladder_for(app).scheduler.batch():
        yield
